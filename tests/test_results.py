"""Result memory: ``out=`` arrays, and reuse of results only once the caller let go of them."""
import gc
import weakref
from pathlib import Path

import numpy as np
import pytest

import runtime
from runtime.execution.outputs import device_bytes, may_overlap
from runtime.testing import ProgramBuilder, random_values

SEED = Path(__file__).resolve().parents[1] / "examples" / "seed-lora-silu.program.json"
OUT = "%4"


def seed_values(T=4, seed=0):
    return random_values(SEED, {"B": 1, "S": T}, seed=seed)


def expected(inputs, banks):
    h = inputs["x"] @ banks["lora.A"].T
    return inputs["base"] + inputs["lora.gain"] * ((h / (1 + np.exp(-h))) @ banks["lora.B"].T)


def address(a):
    return a.__array_interface__["data"][0]


@pytest.fixture(params=["cpu", "reference"])
def exe(request):
    return runtime.compile(SEED, request.param)


def test_a_dropped_result_is_reused_and_holds_the_new_values(exe):
    inputs, banks = seed_values(seed=1)
    first = exe.run(inputs=inputs, banks=banks)[OUT]
    where = address(first)
    del first
    gc.collect()
    i2, b2 = seed_values(seed=2)
    again = exe.run(inputs=i2, banks=b2)[OUT]
    assert address(again) == where
    np.testing.assert_allclose(again, expected(i2, b2), rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("hold", ["array", "view", "result", "weakref", "container", "memoryview"])
def test_a_result_the_caller_can_still_reach_is_never_overwritten(exe, hold):
    inputs, banks = seed_values(seed=1)
    res = exe.run(inputs=inputs, banks=banks)
    keep = res[OUT].copy()
    held = {"array": lambda r: r[OUT], "view": lambda r: r[OUT][0, 1:],
            "result": lambda r: r, "weakref": lambda r: weakref.ref(r[OUT]),
            "container": lambda r: [r[OUT]], "memoryview": lambda r: memoryview(r[OUT])}[hold](res)
    del res
    gc.collect()
    for seed in (2, 3, 4):  # more runs than the pool keeps per slot
        exe.run(inputs=seed_values(seed=seed)[0], banks=banks)
    reach = {"array": lambda h: h, "view": lambda h: h, "result": lambda h: h[OUT],
             "weakref": lambda h: h(), "container": lambda h: h[0], "memoryview": np.asarray}[hold]
    np.testing.assert_array_equal(reach(held), keep[0, 1:] if hold == "view" else keep)


def test_rebinding_in_a_loop_settles_on_two_buffers(exe):
    inputs, banks = seed_values()
    seen = set()
    y = None
    for _ in range(8):
        y = exe.run(inputs=inputs, banks=banks)[OUT]  # the previous y is alive during the run
        seen.add(address(y))
    assert len(seen) <= 3


def test_out_arrays_receive_the_results(exe):
    inputs, banks = seed_values(seed=5)
    target = np.full((1, 4, 1024), np.nan, np.float32)
    res = exe.run(inputs=inputs, banks=banks, out={OUT: target})
    assert res[OUT] is target
    np.testing.assert_allclose(target, expected(inputs, banks), rtol=1e-4, atol=1e-4)
    res2 = exe.run(inputs=inputs, banks=banks, out={OUT: None})  # None: a result array as usual
    assert res2[OUT] is not target
    np.testing.assert_array_equal(res2[OUT], target)


def _bad_out_cases(inputs):
    good = np.zeros((1, 4, 1024), np.float32)
    readonly = good.copy()
    readonly.flags.writeable = False
    return {
        "not a mapping": ([good], "schema", "$.out"),
        "unknown slot": ({"%9": good}, "binding_keys", "$.out.%9"),
        "wrong shape": ({OUT: np.zeros((1, 5, 1024), np.float32)}, "binding_shape", "$.out.%4"),
        "wrong dtype": ({OUT: np.zeros((1, 4, 1024), np.float64)}, "binding_dtype", "$.out.%4"),
        "not contiguous": ({OUT: np.zeros((1, 4, 2048), np.float32)[..., ::2]}, "out_buffer", "$.out.%4"),
        "read-only": ({OUT: readonly}, "out_buffer", "$.out.%4"),
        "not an array": ({OUT: [[0.0]]}, "out_buffer", "$.out.%4"),
        "overlaps an input": ({OUT: inputs["base"]}, "out_buffer", "$.out.%4"),
    }


@pytest.mark.parametrize("case", list(_bad_out_cases(seed_values()[0])))
def test_bad_out_arrays_are_rejected_before_anything_runs(exe, case):
    inputs, banks = seed_values()
    base_before = inputs["base"].copy()
    out, code, path = _bad_out_cases(inputs)[case]
    with pytest.raises(runtime.FormulaError) as err:
        exe.run(inputs=inputs, banks=banks, out=out)
    assert (err.value.code, err.value.path) == (code, path), err.value
    np.testing.assert_array_equal(inputs["base"], base_before)


def test_two_outputs_may_not_share_one_out_array():
    b = ProgramBuilder()
    x = b.input("x", {"N": 8})
    y = b.op("scalar-map", [x], {"mode": "silu"})
    z = b.op("scalar-map", [x], {"mode": "tanh"})
    exe = runtime.compile(b.build(outputs=[y, z]), "cpu")
    shared = np.zeros(8, np.float32)
    with pytest.raises(runtime.FormulaError) as err:
        exe.run(inputs={"x": np.ones(8, np.float32)}, out={y: shared, z: shared})
    assert err.value.code == "out_buffer" and "overlaps" in err.value.message


def _silu_program():
    b = ProgramBuilder()
    y = b.op("scalar-map", [b.input("x", {"N": 8})], {"mode": "silu"})
    return b.build(outputs=[y]), y


@pytest.mark.cuda
def test_cuda_out_arrays_host_and_device():
    from numba import cuda

    program, y = _silu_program()
    x = np.linspace(-3, 3, 8, dtype=np.float32)
    want = x / (1 + np.exp(-x))
    exe = runtime.compile(program, "cuda")
    host_out = np.zeros(8, np.float32)
    assert exe.run(inputs={"x": x}, out={y: host_out})[y] is host_out
    np.testing.assert_allclose(host_out, want, rtol=1e-5, atol=1e-6)
    dev_out = cuda.device_array(8, np.float32)
    assert exe.run(inputs={"x": cuda.to_device(x)}, out={y: dev_out})[y] is dev_out
    np.testing.assert_allclose(dev_out.copy_to_host(), want, rtol=1e-5, atol=1e-6)
    with pytest.raises(runtime.FormulaError) as err:  # device results, host array
        exe.run(inputs={"x": cuda.to_device(x)}, out={y: host_out})
    assert err.value.code == "out_buffer" and "device array" in err.value.message
    both = cuda.to_device(np.concatenate([x, x]))
    dx = both[:8]
    for overlapping in (dx, both[4:12]):  # the input itself, a view that overlaps it
        with pytest.raises(runtime.FormulaError) as err:
            exe.run(inputs={"x": dx}, out={y: overlapping})
        assert err.value.code == "out_buffer" and err.value.path == f"$.out.{y}"
        assert "overlaps the memory of 'x'" in err.value.message
    np.testing.assert_array_equal(dx.copy_to_host(), x)  # not written


class _DeviceView:
    """A device array as other libraries hand one over: only ``__cuda_array_interface__``."""

    def __init__(self, ptr, shape, strides=None, typestr="<f4"):
        self.__cuda_array_interface__ = {"data": (ptr, False), "shape": shape, "strides": strides,
                                         "typestr": typestr, "version": 3}


def test_device_overlap_is_decided_on_the_byte_ranges_of_device_pointers():
    whole = _DeviceView(4096, (4, 8))  # 128 bytes from 4096
    assert device_bytes(whole) == (4096, 4224)
    assert device_bytes(_DeviceView(4096, (4, 0))) == (4096, 4096)
    column = _DeviceView(4096 + 4, (4,), (32,))  # column 1: 4100 .. 4100 + 3*32 + 4
    assert device_bytes(column) == (4100, 4200)
    reversed_rows = _DeviceView(4096 + 96, (4, 8), (-32, 4))  # rows in reverse order
    assert device_bytes(reversed_rows) == (4096, 4224)
    assert may_overlap(whole, column) and may_overlap(column, reversed_rows)
    assert not may_overlap(whole, _DeviceView(4224, (8,)))  # starts where `whole` ends
    assert not may_overlap(whole, _DeviceView(0, (1024,)))  # ends at 4096
    assert not may_overlap(_DeviceView(4096, (0,)), whole)  # an empty array overlaps nothing
    host = np.zeros(4, np.float32)
    assert not may_overlap(host, whole) and may_overlap(host, host[1:])


def test_release_memory_drops_idle_arenas_and_pooled_results_but_keeps_the_plans(exe):
    inputs, banks = seed_values(seed=1)
    exe.run(inputs=inputs, banks=banks)
    compiled = next(iter(exe._plans.values()))
    assert compiled._free_arenas and compiled.results._lent
    exe.release_memory()
    assert not compiled._free_arenas and not compiled.results._lent
    again = exe.run(inputs=inputs, banks=banks)[OUT]  # same compiled plan, fresh memory
    assert next(iter(exe._plans.values())) is compiled
    np.testing.assert_allclose(again, expected(inputs, banks), rtol=1e-4, atol=1e-4)
