"""The RMS-norm rewrite (runtime.plan.rmsnorm): arti's five or six instructions become one row
kernel on cpu, which computes what the reference does, wherever the pattern is safe."""
from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

import runtime
from runtime.build import ProgramBuilder
from runtime.execution.compiled import DRIVER_AFTER_RUNS
from runtime.plan import rmsnorm
from runtime.plan.resolve import resolve_nodes
from runtime.testing import TOLERANCES

FUSED = "fused-rms-norm"


def program(rows=(2, 5), d=37, dtype="float32", gain=True, eps="broadcast", outputs=("y",), extra_reader=None,
            axis_last=True):
    """arti's RMS norm of x [B, S, D] (or [D, B, S] with ``axis_last=False``): ``eps`` "broadcast"
    (a 0-d input broadcast to [B, S], as arti emits it) or "rows" (an input of one value per row). ``outputs``: "y" and any of "sq", "m", "e", "r", "n" (the
    unscaled rows when there is a gain); ``extra_reader``: one more instruction reading that one."""
    b = ProgramBuilder(dtype)
    acc = {"accumulation_dtype": "activation" if dtype == "float64" else "float32"}
    row_axes = {"B": rows[0], "S": rows[1]}
    x_axes = {**row_axes, "D": d} if axis_last else {"D": d, **row_axes}
    x = b.input("x", x_axes)
    if eps == "rows":
        c = b.input("eps", row_axes)
    else:
        c = b.op("broadcast", [b.input("eps", {})], {"output_axes": ["B", "S"], "output_sizes": list(rows)})
    sq = b.op("scale", [x, x], {"factor_axes": list(x_axes), **acc})
    m = b.op("reduce@2", [sq], {"axis": "D", "mode": "mean", **acc})
    e = b.op("add", [m, c], acc)
    r = b.op("scalar-map@2", [e], {"mode": "rsqrt", **acc})
    n = b.op("scale", [x, r], {"factor_axes": ["B", "S"], **acc})
    y = b.op("scale", [n, b.input("gain", {"D": d})], {"factor_axes": ["D"], **acc}) if gain else n
    named = {"y": y, "sq": sq, "m": m, "e": e, "r": r, "n": n}
    outs = [named[o] for o in outputs]
    if extra_reader is not None:
        outs.append(b.op("scalar-map", [named[extra_reader]], {"mode": "silu"}))
    return b.build(outputs=outs)


def values(prog, seed=0):
    rng = np.random.default_rng(seed)
    out = {}
    for bnd in runtime.load_program(prog).bindings:
        t = bnd.value_type
        dt = "float32" if t.dtype == "floating" else t.dtype
        v = rng.standard_normal(t.shape).astype(dt)
        out[bnd.name] = np.abs(v) * 1e-3 if bnd.name == "eps" else v
    return out


def kinds(exe, dims=None):
    return [g.kind for g in exe.plan(dims or {}).groups]


def check(prog, inputs, fused=True, equal=False):
    exe = runtime.compile(prog, "cpu", tiered=False)
    assert (FUSED in kinds(exe)) == fused
    want = runtime.compile(prog, "reference").run(inputs)
    got = exe.run(inputs)
    for slot, w in want.items():
        assert got[slot].dtype == w.dtype and got[slot].shape == w.shape
        if equal:
            np.testing.assert_array_equal(got[slot], w, err_msg=slot)
        else:
            rtol, atol = TOLERANCES[w.dtype.name]
            np.testing.assert_allclose(got[slot], w, rtol=rtol, atol=atol, err_msg=slot)
    return exe, got


@pytest.mark.parametrize("dtype", ["float32", "float64"])
@pytest.mark.parametrize("gain", [True, False])
@pytest.mark.parametrize("eps", ["broadcast", "rows"])
def test_the_fused_rows_equal_the_reference(dtype, gain, eps):
    prog = program(dtype=dtype, gain=gain, eps=eps)
    check(prog, values(prog))


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(b=st.integers(1, 3), s=st.integers(1, 70), d=st.integers(1, 80), gain=st.booleans(),
       eps=st.sampled_from(["broadcast", "rows"]), seed=st.integers(0, 9))
def test_property_equal_to_the_reference(b, s, d, gain, eps, seed):
    prog = program((b, s), d, gain=gain, eps=eps)
    check(prog, values(prog, seed))


def test_the_parallel_rows_equal_the_serial_ones(monkeypatch):
    from runtime.kernels import rmsnorm as rk

    prog = program((4, 300), 96)  # 115200 elements: the parallel twin
    inputs = values(prog)
    assert rk.parallel_rows(4 * 300, 4 * 300 * 96)
    _, parallel = check(prog, inputs)
    monkeypatch.setattr(rk, "PARALLEL_MIN_ELEMENTS", 1 << 40)
    _, serial = check(prog, inputs)
    for slot in parallel:
        np.testing.assert_array_equal(parallel[slot], serial[slot])  # each row computed alike


def test_rows_that_make_non_finite_values_follow_the_reference():
    """Inputs are finite (SPEC §4), but a row's values may not stay so: squares that overflow
    (rsqrt(inf) = 0), a zero row with ε = 0 (rsqrt(0) = inf, then 0 · inf = NaN), a negative ε
    (rsqrt of a negative: NaN)."""
    prog = program((1, 6), 20, eps="rows")
    inputs = values(prog)
    x, eps = inputs["x"], inputs["eps"]
    x[0, 2, :] = 0
    eps[0, 2] = 0
    eps[0, 3] = -1e3
    x[0, 4, :] = 1e30
    x[0, 5, 3] = -3e38
    exe = runtime.compile(prog, "cpu", tiered=False)
    assert FUSED in kinds(exe)
    got, want = exe.run(inputs)["%5"], runtime.compile(prog, "reference").run(inputs)["%5"]
    assert np.isnan(want).any() and (want == 0).any()
    np.testing.assert_array_equal(np.isnan(got), np.isnan(want))
    np.testing.assert_allclose(np.nan_to_num(got), np.nan_to_num(want), rtol=1e-5, atol=1e-6)


def test_a_chunked_run_gives_the_whole_runs_bits():
    prog = program((3, "S"), 64, eps="rows")
    inputs = values(program((3, 40), 64, eps="rows"))
    exe = runtime.compile(prog, "cpu", tiered=False)
    assert FUSED in kinds(exe, {"S": 40})
    whole = exe.run(inputs)
    for chunks in (7, 16):
        np.testing.assert_array_equal(exe.run(inputs, chunks=chunks)[exe.program.outputs[0]],
                                      whole[exe.program.outputs[0]])


def test_the_compiled_driver_calls_the_fused_kernel_and_gets_the_same_bits():
    from runtime.execution.driver import Segment
    from runtime.testing import warm_drivers

    b = ProgramBuilder()
    acc = {"accumulation_dtype": "float32"}
    h = b.op("scalar-map", [b.input("x", {"B": 2, "S": 8, "D": 48})], {"mode": "silu"})
    sq = b.op("scale", [h, h], {"factor_axes": ["B", "S", "D"], **acc})
    m = b.op("reduce@2", [sq], {"axis": "D", "mode": "mean", **acc})
    eps = b.op("broadcast", [b.input("eps", {})], {"output_axes": ["B", "S"], "output_sizes": [2, 8]})
    r = b.op("scalar-map@2", [b.op("add", [m, eps], acc)], {"mode": "rsqrt", **acc})
    n = b.op("scale", [h, r], {"factor_axes": ["B", "S"], **acc})
    y = b.op("contract", [n, b.input("w", {"F": 16, "D": 48})], {"reduce_axes": [["D", "D"]],
                                                                  "output_axes": ["B", "S", "F"], **acc})
    prog = b.build([y])
    inputs = values(prog)
    exe, first = check(prog, inputs)
    (compiled,) = warm_drivers(exe, inputs)
    fused = [g.kind for g in compiled.plan.kernel_groups].index(FUSED)  # (a launch per kernel group)
    segments = [p for p in compiled.driver().parts if isinstance(p, Segment)]
    assert any(fused in s.launches for s in segments)  # called from compiled code
    np.testing.assert_array_equal(exe.run(inputs)[y], first[y])


# --- when the rewrite applies ---------------------------------------------------------------

def test_no_rewrite_when_an_intermediate_is_an_output_or_read_twice():
    inputs = values(program())
    for slot in ("sq", "m", "e", "r"):
        check(program(outputs=("y", slot)), inputs, fused=False)
        check(program(extra_reader=slot), inputs, fused=False)
    for how in ({"outputs": ("y", "n")}, {"extra_reader": "n"}):  # the norm fuses; its gain scales after
        exe, _ = check(program(**how), inputs, fused=True)
        assert [g.kind for g in exe.plan().groups].count("elementwise chain") >= 1
    check(program(outputs=("y",)), inputs, fused=True)


def test_no_rewrite_when_the_axis_is_not_last_or_outside_cpu_or_switched_off(monkeypatch):
    prog = program(axis_last=False)
    inputs = values(prog)
    check(prog, inputs, fused=False)
    prog = program()
    exe = runtime.compile(prog, "cpu", tiered=False)
    binding_types = exe._builder.binding_types({}, {})
    nodes = resolve_nodes(exe.program, exe.specs, binding_types, {})[0]
    assert rmsnorm.find(nodes, exe.program.outputs, "cpu")
    assert rmsnorm.find(nodes, exe.program.outputs, "reference") == []
    assert rmsnorm.find(nodes, exe.program.outputs, "cuda") == []
    monkeypatch.setenv("FORMULA_FUSED_NORMS", "0")
    check(prog, values(prog), fused=False)


def test_no_rewrite_when_outputs_are_checked_so_the_error_names_the_instruction():
    prog = program((1, 3), 8, eps="rows")
    exe = runtime.compile(prog, "cpu", tiered=False)
    inputs = values(prog)
    inputs["eps"][0, 1] = -1e3  # rsqrt of a negative: NaN, first made by the scalar-map
    with pytest.raises(runtime.FormulaError) as err:
        exe.run(inputs, check_outputs=True)
    assert err.value.code == "nonfinite" and "i3" in str(err.value)


def test_half_rows_follow_the_reference():
    prog = program(dtype="float16")  # (halves compute in float32 and round at each step)
    inputs = values(prog)
    inputs = {k: v.astype(np.float16) for k, v in inputs.items()}
    exe = runtime.compile(prog, "cpu", tiered=False)
    want = runtime.compile(prog, "reference").run(inputs)
    got = exe.run(inputs)
    for slot, w in want.items():
        rtol, atol = TOLERANCES[w.dtype.name]
        np.testing.assert_allclose(got[slot].astype(np.float32), w.astype(np.float32), rtol=rtol, atol=atol)


CACHED = """
import json, sys
import numpy as np
from runtime.kernels import codegen
codegen.configure_numba_cache()
from runtime.kernels import rmsnorm
from atoms import softmax_vjp
x = np.ones(8 * 40, np.float32)
got = {}
for name, twins, args in (
        ("rms", rmsnorm.ROWS["float32"], (x, np.ones(8, np.float32), np.ones(40, np.float32), 1, np.empty_like(x), 40, 8)),
        ("vjp", softmax_vjp.VECTOR_ROWS["float32"], (x, x, np.empty_like(x), 0, 0, 40, 8))):
    for which in ("serial", "parallel"):
        kernel = getattr(twins, which)
        kernel(*args)
        got[f"{name} {which}"] = [sum(kernel.stats.cache_hits.values()), sum(kernel.stats.cache_misses.values())]
print(json.dumps(got))
"""


def test_the_vector_row_kernels_load_from_the_disk_cache_in_a_new_process(tmp_path):
    """Their callers are module-level functions: a closure over a dispatcher pickles differently
    in every process, and Numba's cache, which keys a function by what it closes over, missed."""
    import json
    import os
    import subprocess
    import sys
    from pathlib import Path

    env = {**os.environ, "FORMULA_CACHE_DIR": str(tmp_path)}
    env.pop("NUMBA_CACHE_DIR", None)
    root = Path(__file__).resolve().parents[1]

    def run() -> dict:
        done = subprocess.run([sys.executable, "-c", CACHED], cwd=root, env=env, capture_output=True, text=True,
                              check=True)
        return json.loads(done.stdout.splitlines()[-1])

    first, second = run(), run()
    assert all(misses == 1 for _, misses in first.values()), first  # compiled and saved
    assert all(hits == 1 and misses == 0 for hits, misses in second.values()), second
