"""The plugin's gradient rules against float64 finite differences, torch.autograd (when torch
is installed), on cpu like the reference, and differentiated twice."""
from __future__ import annotations

import numpy as np
import pytest

import runtime
from runtime.build import ProgramBuilder
from runtime.testing import assert_backends_agree, check_gradients

REF = "formula-norms/formula-atom-{}@1"


def _program(atom, attributes, dtype="float64"):
    b = ProgramBuilder(dtype)
    x = b.input("x", {"T": 3, "D": 5})
    w = b.bank("w", {"D": 5})
    y = b.op(atom, [x], attributes, ref=REF.format(atom))
    z = b.op("scale", [y, w], {"factor_axes": ["D"], "accumulation_dtype": "float32"})
    return b.build([z])


def _torch(atom, attributes):
    torch = pytest.importorskip("torch")

    def norm(x, w):
        if atom == "rms-norm":
            y = x / torch.sqrt((x * x).mean(-1, keepdim=True) + attributes["epsilon"])
        elif atom == "layer-norm":
            y = torch.nn.functional.layer_norm(x, (5,), eps=attributes["epsilon"])
        elif attributes["mode"] == "softplus":
            y = torch.nn.functional.softplus(x)
        else:
            y = torch.nn.functional.gelu(x, approximate="tanh")
        return {"%1": y * w}
    return norm


CASES = [("rms-norm", {"axis": "D", "epsilon": 1e-5, "accumulation_dtype": "float32"}),
         ("layer-norm", {"axis": "D", "epsilon": 1e-5, "accumulation_dtype": "float32"}),
         ("scalar-map-ext", {"mode": "gelu-tanh"}), ("scalar-map-ext", {"mode": "softplus"})]


@pytest.mark.parametrize("atom, attributes", CASES, ids=lambda c: str(c))
def test_rules_match_finite_differences_and_torch(atom, attributes):
    rng = np.random.default_rng(3)
    values = {"x": rng.standard_normal((3, 5)) * 2, "w": rng.standard_normal(5)}
    program = _program(atom, attributes)
    torch_fn = None
    try:
        import torch  # noqa: F401

        torch_fn = _torch(atom, attributes)
    except ImportError:
        pass
    check_gradients(program, ["x"], {"x": values["x"]}, {"w": values["w"]}, torch_fn=torch_fn)


@pytest.mark.parametrize("atom, attributes", CASES[:3], ids=lambda c: str(c))
def test_gradients_of_gradients_and_cpu(atom, attributes):
    rng = np.random.default_rng(4)
    program = _program(atom, attributes)
    g = runtime.vjp(program, ["x", "w"])
    inputs = {"x": rng.standard_normal((3, 5)), g.cotangents["%1"]: rng.standard_normal((3, 5))}
    banks = {"w": rng.standard_normal(5)}
    check_gradients(g.program, ["x"], inputs, banks)
    assert_backends_agree(g.program, inputs, banks)
