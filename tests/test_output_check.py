"""The optional output check (SPEC §3b.3 item 2): ``check_outputs=True`` raises ``nonfinite``
at the path of the instruction whose output first holds a NaN or ±inf, checked inside the
kernels that produce the values (fused chains and contraction epilogues included), on every
backend; off by default, when IEEE values propagate as before."""
from __future__ import annotations

import numpy as np
import pytest

import runtime
from runtime.core.errors import FormulaError
from runtime.testing import ProgramBuilder

# these programs make NaN and ±inf on purpose: NumPy (and the CUDA simulator's NumPy scalars) warn
pytestmark = pytest.mark.filterwarnings("ignore::RuntimeWarning")
BACKENDS = ["reference", "cpu", "cuda"]
MAP2 = "arti/formula-atom-scalar-map@2"
F32 = {"accumulation_dtype": "float32"}


def map2(b, x, mode):
    return b.op("scalar-map", [x], {"mode": mode, **F32}, ref=MAP2)


def contract(b, x, w):
    return b.op("contract", [x, w], {"reduce_axes": [["D", "D"]], "output_axes": ["T", "R"],
                                      "accumulation_dtype": "activation"})


def fails_at(program, inputs, backend, index, compare=True, **run):
    """The run with the check raises nonfinite at instruction ``index``; without it, it
    raises nothing and (``compare``) returns what the reference returns, non-finite values
    included."""
    exe = runtime.compile(program, backend)
    with pytest.raises(FormulaError) as err:
        exe.run(inputs=inputs, check_outputs=True, **run)
    assert err.value.code == "nonfinite", err.value
    assert err.value.path == f"$.instructions[{index}]", err.value
    assert program["instructions"][index]["instruction_id"] in err.value.message
    got = exe.run(inputs=inputs, **run)  # off by default: no error, the same values
    want = runtime.execute(program, inputs=inputs, backend="reference")
    for slot in program["outputs"] if compare else ():
        np.testing.assert_allclose(np.asarray(got[slot], np.float64), np.asarray(want[slot], np.float64),
                                   rtol=1e-3, atol=1e-5)
    return exe


def mid_program():
    """x·2 (finite) -> log (NaN where x < 0) -> contract with w: the NaN reaches the output."""
    b = ProgramBuilder()
    x, g, w = b.input("x", {"T": 3, "D": 4}), b.input("g", {"D": 4}), b.input("w", {"R": 2, "D": 4})
    a = b.op("scale", [x, g], {"factor_axes": ["D"], "accumulation_dtype": "float32"})
    y = map2(b, a, "log")
    return b.build(outputs=[contract(b, y, w)])


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_nan_produced_mid_program_names_its_instruction(backend):
    x = np.full((3, 4), 2.0, np.float32)
    x[1, 2] = -1.0
    inputs = {"x": x, "g": np.full(4, 2.0, np.float32), "w": np.ones((2, 4), np.float32)}
    fails_at(mid_program(), inputs, backend, 1)
    x[1, 2] = 3.0
    exe = runtime.compile(mid_program(), backend)
    got = exe.run(inputs={**inputs, "x": x}, check_outputs=True)  # finite: runs as without
    want = runtime.execute(mid_program(), inputs={**inputs, "x": x}, backend="reference")
    np.testing.assert_allclose(got["%2"], want["%2"], rtol=1e-5)


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_value_that_vanishes_inside_a_fused_chain_is_still_caught(backend):
    """log(0) = -inf at i0, relu(-inf) = 0 at i1: the output is finite, the intermediate is not."""
    b = ProgramBuilder()
    x = b.input("x", {"T": 2, "D": 8})
    y = map2(b, x, "log")
    prog = b.build(outputs=[b.op("scalar-map", [y], {"mode": "relu"})])
    x = np.ones((2, 8), np.float32)
    x[1, 5] = 0.0
    exe = fails_at(prog, {"x": x}, backend, 0)
    if backend != "reference":
        groups = exe.plan().groups
        assert len(groups) == 1 and len(groups[0].nodes) == 2  # one fused kernel checked both


@pytest.mark.parametrize("backend", BACKENDS)
def test_contraction_epilogue_names_the_contraction_or_the_step(backend):
    """contract overflows to inf (i0), reciprocal turns it into 0 (i1): i0 is named; a NaN made
    by the epilogue's own step (log of a negative sum) names that step."""
    b = ProgramBuilder()
    x, w = b.input("x", {"T": 3, "D": 4}), b.input("w", {"R": 2, "D": 4})
    y = contract(b, x, w)
    prog = b.build(outputs=[map2(b, y, "reciprocal")])
    x = np.ones((3, 4), np.float32)
    x[2, 1] = 3e38
    w = np.full((2, 4), 10.0, np.float32)
    exe = fails_at(prog, {"x": x, "w": w}, backend, 0)
    if backend == "cpu":
        groups = exe.plan().groups
        assert len(groups) == 1 and groups[0].anchor is not None and not groups[0].epilogue.empty
    b = ProgramBuilder()
    x, w = b.input("x", {"T": 3, "D": 4}), b.input("w", {"R": 2, "D": 4})
    prog = b.build(outputs=[map2(b, contract(b, x, w), "log")])
    x = np.ones((3, 4), np.float32)
    x[0] = -1.0
    fails_at(prog, {"x": x, "w": np.ones((2, 4), np.float32)}, backend, 1)


@pytest.mark.parametrize("backend", BACKENDS)
def test_masked_softmax_of_an_overflowed_value_names_the_overflow(backend):
    b = ProgramBuilder()
    x, m = b.input("x", {"T": 2, "E": 5}), b.input("m", {"E": 5}, "boolean")
    e = map2(b, x, "exp")
    s = b.op("masked-softmax", [e, m], {"axis": "E", "accumulation_dtype": "float32"})
    prog = b.build(outputs=[s])
    x = np.zeros((2, 5), np.float32)
    x[0, 3] = 100.0  # exp(100) overflows float32
    # (the backends differ on a softmax of +inf, which the check exists to keep out)
    fails_at(prog, {"x": x, "m": np.array([True, True, False, True, True])}, backend, 0, compare=False)


@pytest.mark.parametrize("backend", BACKENDS)
def test_masked_softmax_itself_is_checked(backend):
    """The softmax's own output is checked (here it is finite, so nothing is raised)."""
    b = ProgramBuilder()
    x, m = b.input("x", {"T": 2, "E": 5}), b.input("m", {"E": 5}, "boolean")
    s = b.op("masked-softmax", [x, m], {"axis": "E", "accumulation_dtype": "float32"})
    prog = b.build(outputs=[s])
    inputs = {"x": np.arange(10, dtype=np.float32).reshape(2, 5), "m": np.array([True, False] * 2 + [True])}
    got = runtime.compile(prog, backend).run(inputs=inputs, check_outputs=True, trace=True)
    assert all("checks_output" in rec for rec in got.trace)
    np.testing.assert_allclose(np.asarray(got["%0"]).sum(axis=1), 1.0, rtol=1e-5)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_half_dtypes_overflow_when_rounded(backend, dtype):
    """exp(12) = 162755 fits float32 but not float16: the rounded output is inf. bfloat16
    reaches inf only beyond 3.4e38: cast@1 of a float32 3e38 * 10 = inf names the scale."""
    if dtype == "bfloat16":
        pytest.importorskip("ml_dtypes")
    b = ProgramBuilder()
    x = b.input("x", {"D": 4}, dtype)
    y = map2(b, x, "exp")
    prog = b.build(outputs=[y])
    x = np.zeros(4, np.float32)
    x[2] = 12.0 if dtype == "float16" else 100.0
    from runtime.core.types import numpy_dtype
    fails_at(prog, {"x": x.astype(numpy_dtype(dtype))}, backend, 0)


@pytest.mark.parametrize("backend", BACKENDS)
def test_cast_to_float16_overflow_names_the_cast(backend):
    b = ProgramBuilder()
    x = b.input("x", {"D": 4})
    h = b.op("cast", [x], {"dtype": "float16"})
    prog = b.build(outputs=[b.op("cast", [h], {"dtype": "float32"})])
    fails_at(prog, {"x": np.array([1.0, 70000.0, 2.0, 3.0], np.float32)}, backend, 0)


@pytest.mark.parametrize("backend", BACKENDS)
def test_off_by_default_and_nonfloat_outputs_are_not_checked(backend):
    b = ProgramBuilder()
    x = b.input("x", {"D": 3})
    y = map2(b, x, "log")
    c = b.op("compare", [y, y], {"mode": "ne"})  # NaN != NaN: a boolean output is never checked
    prog = b.build(outputs=[y, c])
    x = np.array([1.0, -1.0, 0.0], np.float32)
    got = runtime.execute(prog, inputs={"x": x}, backend=backend)  # default: IEEE values
    assert np.isnan(got["%0"][1]) and np.isneginf(got["%0"][2])
    np.testing.assert_array_equal(got["%1"], [False, True, False])
    with pytest.raises(FormulaError) as err:
        runtime.execute(prog, inputs={"x": x}, backend=backend, check_outputs=True)
    assert err.value.code == "nonfinite" and err.value.path == "$.instructions[0]"


def test_the_check_is_inside_the_fused_kernels_on_cpu_and_a_scan_elsewhere():
    exe = runtime.compile(mid_program(), "cpu")
    inputs = {"x": np.ones((3, 4), np.float32), "g": np.ones(4, np.float32), "w": np.ones((2, 4), np.float32)}
    trace = exe.run(inputs=inputs, check_outputs=True, trace=True).trace
    assert [rec["checks_output"] for rec in trace] == ["kernel", "kernel"]
    trace = runtime.execute(mid_program(), inputs=inputs, backend="reference", check_outputs=True,
                            trace=True).trace
    assert {rec["checks_output"] for rec in trace} == {"scan"}
    assert "checks_output" not in exe.run(inputs=inputs, trace=True).trace[0]  # off: nothing


def test_cli_check_outputs(tmp_path, capsys):
    import json

    from runtime.cli import main

    b = ProgramBuilder()
    x = b.input("x", {"D": 3})
    path = tmp_path / "p.json"
    path.write_text(json.dumps(b.build(outputs=[map2(b, x, "log")])))
    values = tmp_path / "x.npz"
    np.savez(values, x=np.array([1.0, 0.0, 2.0], np.float32))
    assert main(["run", str(path), "--inputs", str(values)]) == 0
    assert main(["run", str(path), "--inputs", str(values), "--check-outputs"]) == 1
    assert "nonfinite" in capsys.readouterr().err


@pytest.mark.parametrize("backend", ["cpu", "cuda"])
def test_out_arrays_are_written_only_once_every_output_passed(backend):
    inputs = {"x": np.full((3, 4), 2.0, np.float32), "g": np.ones(4, np.float32), "w": np.ones((2, 4), np.float32)}
    exe = runtime.compile(mid_program(), backend)
    y = np.full((3, 2), 7.0, np.float32)
    bad = {**inputs, "x": inputs["x"].copy()}
    bad["x"][0, 0] = -1.0
    with pytest.raises(FormulaError):
        exe.run(inputs=bad, out={"%2": y}, check_outputs=True)
    assert (y == 7.0).all()
    got = exe.run(inputs=inputs, out={"%2": y}, check_outputs=True)
    assert got["%2"] is y
    np.testing.assert_allclose(y, np.full((3, 2), 4 * np.log(2.0)), rtol=1e-5)


def test_fused_kernels_count_their_values_on_cuda_too():
    inputs = {"x": np.ones((3, 4), np.float32), "g": np.ones(4, np.float32), "w": np.ones((2, 4), np.float32)}
    trace = runtime.execute(mid_program(), inputs=inputs, backend="cuda", check_outputs=True, trace=True).trace
    assert [rec["checks_output"] for rec in trace] == ["kernel", "kernel"]
