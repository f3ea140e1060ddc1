"""runtime.autodiff.simplify: a gradient's scale by a 0-d factor moved past the contractions
that alone read it (one pass over the backward's largest value less), and kept where it must
stay."""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

import runtime
from runtime.build import ProgramBuilder
from runtime.testing import check_gradients

SEED = json.loads((Path(__file__).resolve().parent.parent / "examples" / "seed-lora-silu.program.json").read_text())


def _added(g):
    ids = {i.instruction_id for i in g.forward.instructions}
    return [i for i in g.program["instructions"] if i["instruction_id"] not in ids]


def _atom(ins):
    return ins["atom_ref"].split("/")[-1].split("@")[0].removeprefix("formula-atom-")


def test_the_seed_gradient_scales_its_contractions_not_the_cotangent():
    g = runtime.vjp(SEED, wrt=["lora.A", "lora.B"])
    (cotangent,) = g.cotangents.values()
    added = _added(g)
    scales = [i for i in added if _atom(i) == "scale"]
    assert scales and all(i["input_slots"][1] == "lora.gain" for i in scales)
    assert all(cotangent not in i["input_slots"] for i in scales)  # no pass over ȳ·gain
    producers = {i["output_slot"]: i for i in added}
    assert all(_atom(producers[i["input_slots"][0]]) == "contract" for i in scales)
    steps = {i["output_slot"]: i["step"] for i in g.program["instructions"]}
    assert all(i["step"] > steps.get(s, 0) for i in added for s in i["input_slots"])
    runtime.load_program(g.program)  # (a valid program: slots, producers, limits)


def test_the_seed_gradient_is_still_the_gradient():
    rng = np.random.default_rng(3)
    inputs = {"x": rng.standard_normal((1, 6, 1024)), "base": rng.standard_normal((1, 6, 1024)),
              "lora.gain": np.float64(0.37)}
    banks = {"lora.A": rng.standard_normal((32, 1024)) / 32, "lora.B": rng.standard_normal((1024, 32)) / 32}
    for backend in ("reference", "cpu"):  # (cpu: the moved scales fused into the contractions)
        check_gradients(SEED, ["lora.A", "lora.B", "x"], inputs, banks, backend=backend)


def _program(factor_axes, also_added: bool):
    b = ProgramBuilder("float64")
    x = b.input("x", {"T": 4, "D": 3})
    w = b.bank("w", {"O": 2, "D": 3})
    f = b.input("f", {"T": 4} if factor_axes else {})
    h = b.op("contract", [x, w], {"reduce_axes": [["D", "D"]], "output_axes": ["T", "O"],
                                  "accumulation_dtype": "float32"})
    y = b.op("scale", [h, f], {"factor_axes": factor_axes, "accumulation_dtype": "float32"})
    if also_added:
        y = b.op("add", [y, h], {"accumulation_dtype": "float32"})
    return b.build([y])


@pytest.mark.parametrize("factor_axes, also_added, moved", [([], False, True), (["T"], False, False),
                                                               ([], True, False)])
def test_only_scalar_scales_that_only_contractions_read_move(factor_axes, also_added, moved):
    """A factor with axes does not commute with the contraction's sum over them; a scaled
    value that an add also reads must exist anyway."""
    g = runtime.vjp(_program(factor_axes, also_added), wrt=["x", "w"])
    (cotangent,) = g.cotangents.values()
    reads_cotangent = [_atom(i) for i in _added(g) if cotangent in i["input_slots"]]
    assert (reads_cotangent == ["contract", "contract"]) == moved
    rng = np.random.default_rng(4)
    check_gradients(_program(factor_axes, also_added), ["x", "w"], {"x": rng.standard_normal((4, 3)),
                                 "f": rng.standard_normal(4) if factor_axes else np.float64(-1.3)},
                    {"w": rng.standard_normal((2, 3))})
