"""formula-norms atoms in whole programs: the same backend-equivalence checks as built-ins,
fusion of scalar-map-ext as an epilogue, runtime.execute, and `formula run`."""
from __future__ import annotations

import numpy as np
import pytest

pytest.importorskip("formula_norms", reason="formula-norms is not installed "
                    "(pip install ./plugins/formula-norms; CI installs it)")

import runtime  # noqa: E402
from runtime.testing import ProgramBuilder, assert_backends_agree, random_values  # noqa: E402

RMS = "formula-norms/formula-atom-rms-norm@1"
LN = "formula-norms/formula-atom-layer-norm@1"
EXT = "formula-norms/formula-atom-scalar-map-ext@1"


def rms_gelu_program(dtype="float32"):
    """y = gelu_tanh(rms_norm(x, D) * w): a norm, then a fusable scale + activation chain."""
    b = ProgramBuilder(dtype=dtype)
    x = b.input("x", {"T": "T", "D": 8})
    w = b.input("w", {"D": 8})
    n = b.op(RMS, [x], {"axis": "D", "epsilon": 1e-6, "accumulation_dtype": "float32"})
    s = b.op("scale", [n, w], {"factor_axes": ["D"], "accumulation_dtype": "float32"})
    y = b.op(EXT, [s], {"mode": "gelu-tanh"})
    return b.build(outputs=[y])


def layer_softplus_program(dtype="float64"):
    """softplus(layer_norm(x, S)) with the normalised axis in the middle."""
    b = ProgramBuilder(dtype=dtype)
    x = b.input("x", {"B": "B", "S": 5, "D": 3})
    n = b.op(LN, [x], {"axis": "S", "epsilon": 1e-5, "accumulation_dtype": "activation"})
    y = b.op(EXT, [n], {"mode": "softplus"})
    return b.build(outputs=[y])


def expected_rms_gelu(x, w):
    x64 = x.astype(np.float64)
    n = x64 / np.sqrt((x64 * x64).mean(-1, keepdims=True) + 1e-6) * w
    return 0.5 * n * (1 + np.tanh(np.sqrt(2 / np.pi) * (n + 0.044715 * n**3)))


@pytest.mark.parametrize("make,dims", [(rms_gelu_program, {"T": 3}),
                                       (layer_softplus_program, {"B": 2})])
def test_backends_agree_with_the_reference(make, dims):
    program = make()
    inputs, banks = random_values(program, dims, seed=7)
    assert_backends_agree(program, inputs, banks, backends=("cpu", "cuda"))


def test_execute_matches_hand_computation_and_leaves_inputs_alone():
    program = rms_gelu_program()
    rng = np.random.default_rng(3)
    x = np.asfortranarray(rng.standard_normal((4, 8)).astype(np.float32))
    w = rng.standard_normal(8).astype(np.float32)
    x_before, w_before = x.copy(), w.copy()
    out = runtime.execute(program, inputs={"x": x, "w": w})["%2"]
    assert out.dtype == np.float32 and out.shape == (4, 8)
    np.testing.assert_allclose(out, expected_rms_gelu(x, w), rtol=2e-5, atol=2e-6)
    np.testing.assert_array_equal(x, x_before)
    np.testing.assert_array_equal(w, w_before)


def test_scalar_map_ext_is_fused_as_an_epilogue():
    plan = runtime.compile(rms_gelu_program(), "cpu").plan({"T": 2})
    fused = [[n.atom.name for n in g.nodes] for g in plan.groups]
    assert fused == [["rms-norm"], ["scale", "scalar-map-ext"]]


def test_formula_run_cli(tmp_path, capsys):
    import json

    from runtime.cli import main

    path = tmp_path / "rms.program.json"
    path.write_text(json.dumps(rms_gelu_program()))
    out = tmp_path / "out.npz"
    assert main(["run", str(path), "--random", "--dim", "T=2", "--out", str(out)]) == 0
    printed = capsys.readouterr().out
    assert "%2  float32[2, 8]" in printed
    inputs, _ = random_values(rms_gelu_program(), {"T": 2}, seed=0)  # what --random --seed 0 makes
    with np.load(out) as result:
        np.testing.assert_allclose(result["%2"], expected_rms_gelu(inputs["x"], inputs["w"]),
                                   rtol=2e-5, atol=2e-6)
