"""Half precision on cpu and cuda (SPEC §3b.1): the bit conversions against NumPy/ml_dtypes,
and the planner's rewrite (widen once, compute in float32, round once) against reference."""
import ml_dtypes
import numpy as np
import pytest

import runtime
from runtime.kernels import halfconv, halfconv_cpu
from runtime.plan import halves
from runtime.testing import ProgramBuilder, assert_backends_agree

BF16 = np.dtype(ml_dtypes.bfloat16)
HALVES = {"float16": (np.dtype(np.float16), halfconv.F16_TO_F32, halfconv.F32_TO_F16),
          "bfloat16": (BF16, halfconv.BF16_TO_F32, halfconv.F32_TO_BF16)}


def _float32_sweep() -> np.ndarray:
    """Random float32 bit patterns, both halves' exact ties, and the edges: the largest half,
    the overflow threshold 65520, subnormals and their ties, ±0, ±inf, NaNs with payloads."""
    rng = np.random.default_rng(7)
    bits16 = np.arange(1 << 16, dtype=np.uint32)
    f16 = bits16.astype(np.uint16).view(np.float16).astype(np.float64)
    finite = np.isfinite(f16)
    with np.errstate(invalid="ignore"):
        ties16 = ((f16[:-1] + f16[1:]) / 2)[finite[:-1] & finite[1:]].astype(np.float32)
    ties_bf = ((bits16 << 16) | 0x8000).view(np.float32)
    edges = np.array([65504, 65519.996, 65520, 65536, -65520, 2.0 ** -24, 2.0 ** -25,
                      2.0 ** -25 * 1.0000001, 3 * 2.0 ** -25, 2.0 ** -14, 0.0, -0.0, np.inf, -np.inf,
                      3.3895314e38, np.finfo(np.float32).max], np.float32)
    nans = np.array([0x7F800001, 0x7FC00000, 0xFF800001, 0x7FA00000, 0x7FFFFFFF, 0x7F802000],
                    np.uint32).view(np.float32)
    random = rng.integers(0, 1 << 32, size=1 << 18, dtype=np.uint64).astype(np.uint32).view(np.float32)
    return np.concatenate([random, ties16, ties_bf, edges, -edges, nans])


@pytest.mark.parametrize("name", HALVES)
def test_every_half_bit_pattern_widens_exactly(name):
    dtype, widen, _ = HALVES[name]
    src = np.arange(1 << 16, dtype=np.uint16).view(dtype)
    got = np.empty(src.shape, np.float32)
    halfconv_cpu.convert_host(src, got, widen)
    np.testing.assert_array_equal(got.view(np.uint32), src.astype(np.float32).view(np.uint32))


@pytest.mark.parametrize("name", HALVES)
def test_narrowing_matches_astype_bit_for_bit(name):
    dtype, _, narrow = HALVES[name]
    x = _float32_sweep()
    got = np.empty(x.shape, dtype)
    halfconv_cpu.convert_host(x, got, narrow)  # above PARALLEL_MIN: the parallel kernel
    with np.errstate(all="ignore"):
        want = x.astype(dtype)
    np.testing.assert_array_equal(got.view(np.uint16), want.view(np.uint16))
    small = np.empty(1000, dtype)  # the serial kernel
    halfconv_cpu.convert_host(x[-1000:], small, narrow)
    np.testing.assert_array_equal(small.view(np.uint16), want[-1000:].view(np.uint16))


def test_float16_overflow_and_subnormal_edges():
    x = np.array([65504, 65519.99, 65520, -70000, 2.0 ** -24, 2.0 ** -25, 1.5 * 2.0 ** -24], np.float32)
    got = np.empty(x.shape, np.float16)
    halfconv_cpu.convert_host(x, got, halfconv.F32_TO_F16)
    np.testing.assert_array_equal(got, np.array([65504, 65504, np.inf, -np.inf, 2.0 ** -24, 0, 2.0 ** -23],
                                                np.float16))


@pytest.mark.parametrize("name", HALVES)
def test_strided_operands_convert_in_place_of_their_elements(name):
    dtype, widen, narrow = HALVES[name]
    x = np.linspace(-3, 3, 60, dtype=np.float32).reshape(6, 10)[:, ::3]  # not contiguous
    out = np.empty((x.shape[1], x.shape[0]), dtype).T  # a Fortran-ordered destination
    halfconv_cpu.convert_host(x, out, narrow)
    np.testing.assert_array_equal(out.view(np.uint16), x.astype(dtype).view(np.uint16))
    back = np.empty((x.shape[1], x.shape[0]), np.float32).T  # strided destination
    halfconv_cpu.convert_host(out, back, widen)
    np.testing.assert_array_equal(back, out.astype(np.float32))


@pytest.mark.parametrize("name", HALVES)
def test_cuda_conversions_agree_with_the_host(name):
    from numba import cuda

    from runtime.kernels import halfconv_cuda

    dtype, widen, narrow = HALVES[name]
    x = np.concatenate([_float32_sweep()[-300:], np.linspace(-7, 7, 212, dtype=np.float32)])
    dev_half = cuda.device_array(x.shape, dtype=dtype)
    halfconv_cuda.convert_device(cuda.to_device(x), dev_half, narrow)
    with np.errstate(all="ignore"):
        want = x.astype(dtype)
    np.testing.assert_array_equal(dev_half.copy_to_host().view(np.uint16), want.view(np.uint16))
    dev_wide = cuda.device_array(x.shape, dtype=np.float32)
    halfconv_cuda.convert_device(dev_half, dev_wide, widen)
    np.testing.assert_array_equal(dev_wide.copy_to_host().view(np.uint32), want.astype(np.float32).view(np.uint32))


def _mlp(dtype: str):
    """x·Wᵀ + b -> silu -> ·gain: a contraction with a fused epilogue, all in ``dtype``; ``x``
    is read twice (by the contraction and a second add) and ``h`` is both output and read."""
    b = ProgramBuilder(dtype=dtype)
    x = b.input("x", {"T": "T", "D": 8})
    w = b.bank("w", {"R": 6, "D": 8})
    bias = b.input("bias", {"T": "T", "R": 6})
    h = b.op("contract", [x, w], {"reduce_axes": [["D", "D"]], "output_axes": ["T", "R"],
                                  "accumulation_dtype": "float32"})
    h = b.op("add", [h, bias], {"accumulation_dtype": "activation"})
    y = b.op("scalar-map", [h], {"mode": "silu"})
    z = b.op("scale", [y, bias], {"factor_axes": ["T", "R"], "accumulation_dtype": "activation"})
    return b.build(outputs=[y, z])


def _values(dtype, t=5, seed=0):
    rng = np.random.default_rng(seed)
    dt = HALVES[dtype][0]
    return ({"x": rng.standard_normal((t, 8)).astype(dt), "bias": rng.standard_normal((t, 6)).astype(dt)},
            {"w": rng.standard_normal((6, 8)).astype(dt)})


@pytest.mark.parametrize("dtype", list(HALVES))
@pytest.mark.parametrize("backend", ["cpu", "cuda"])
def test_half_programs_match_reference(dtype, backend):
    inputs, banks = _values(dtype)
    got = runtime.execute(_mlp(dtype), inputs=inputs, banks=banks, backend=backend)
    assert all(v.dtype == HALVES[dtype][0] for v in got.values())
    assert_backends_agree(_mlp(dtype), inputs, banks, backends=[backend])


def test_the_plan_widens_each_half_value_once_and_rounds_fused_chains_once():
    plan = runtime.compile(_mlp("float16"), backend="cpu").plan({"T": 5})
    atoms = [g.nodes[0].atom.name if len(g.nodes) == 1 else "+".join(n.atom.name for n in g.nodes)
             for g in plan.groups]
    widened = [g.nodes[0].input_slots[0] for g in plan.groups if g.nodes[0].atom is halves.WIDEN]
    assert sorted(widened) == ["bias", "w", "x"]  # bias is read twice, widened once
    assert "contract+add+scalar-map" in atoms  # the contraction keeps its float32 epilogue
    narrowed = sorted(g.output_slot for g in plan.groups if g.nodes[0].atom is halves.NARROW)
    assert narrowed == ["%2", "%3"]  # the two outputs; the fused intermediates are never rounded
    temps = {s: b for s, b in plan.buffers.items() if b.kind == "temporary"}
    assert set(temps) >= {"x~f32", "w~f32", "bias~f32", "%2~f32", "%3~f32"}
    assert temps["x~f32"].nbytes == 5 * 8 * 4  # float32 temporaries count in the working set
    assert plan.arena_bytes >= max(b.nbytes for b in temps.values())


def test_half_temporaries_count_in_the_memory_preflight():
    prog = _mlp("float16")
    need = runtime.compile(prog, backend="cpu").plan({"T": 5}).working_bytes
    prog["limits"]["max_working_bytes"] = need - 1
    with pytest.raises(runtime.FormulaError) as info:
        runtime.compile(prog, backend="cpu").plan({"T": 5})
    assert info.value.code == "limit_exceeded"
    ref = runtime.compile(prog, backend="reference").plan({"T": 5})
    assert ref.working_bytes < need  # reference computes half itself: no float32 copies


def test_float16_results_round_to_inf_like_the_reference():
    b = ProgramBuilder(dtype="float16")
    x = b.input("x", {"N": 3})
    y = b.op("add", [x, x], {"accumulation_dtype": "activation"})
    prog = b.build(outputs=[y])
    x = np.array([40000, -40000, 1.5], np.float16)
    for backend in ("reference", "cpu"):
        np.testing.assert_array_equal(runtime.execute(prog, inputs={"x": x}, backend=backend)[y],
                                      np.array([np.inf, -np.inf, 3], np.float16))


def test_bfloat16_without_ml_dtypes_names_the_extra(monkeypatch):
    import sys

    monkeypatch.setitem(sys.modules, "ml_dtypes", None)
    from runtime.core.types import numpy_dtype

    with pytest.raises(runtime.FormulaError) as info:
        numpy_dtype("bfloat16")
    assert info.value.code == "backend_unavailable" and "formula-runtime[bfloat16]" in str(info.value)
