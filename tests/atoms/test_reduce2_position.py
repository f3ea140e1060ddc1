"""reduce@2 and the position atoms (SPEC §3b): infer errors, hand-computed values, cpu/cuda vs reference."""
from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

from atoms.position import SPECS as POSITION
from atoms.reduce2 import SPECS as REDUCE
from runtime.plugins.atomspec import InferContext
from runtime.core.errors import FormulaError
from runtime.testing import run_kernel
from runtime.core.types import TensorType

SPEC = {s.name: s for s in REDUCE + POSITION}
BACKENDS = ("reference", "cpu", "cuda")


def T(axes, sizes, dtype="float32", domain="d"):
    return TensorType(tuple(axes), tuple(sizes), dtype, domain)


def R(axis, mode, acc="float32"):
    return {"axis": axis, "mode": mode, "accumulation_dtype": acc}


def SIN(axis="F", size=4, dtype="floating", base=10000.0):
    return {"feature_axis": axis, "feature_size": size, "dtype": dtype, "base": base}


def ROT(axis="F", base=10000.0):
    return {"feature_axis": axis, "base": base}


def infer(name, attributes, *types):
    ctx = InferContext(SPEC[name], "$.instructions[1]", attributes, types, [f"s{k}" for k in range(len(types))])
    return SPEC[name].infer(ctx)


def run(name, attributes, types, values, backend="reference"):
    return run_kernel(SPEC[name], attributes, types, values, backend)


# --- type inference ----------------------------------------------------------------------

def test_infer_output_types():
    v = T("BSD", ["B", "S", 4], "floating")
    assert infer("reduce@2", R("S", "logsumexp"), v) == T("BD", ["B", 4], "floating")
    c = T("BS", ["B", "S"], "int64", "pos")
    assert infer("position-sinusoidal", SIN(size=5), c) == T("BSF", ["B", "S", 5], "floating", "pos")
    assert infer("position-sinusoidal", SIN(dtype="float16"), c).dtype == "float16"
    rel = infer("position-relative", {}, T("IB", [3, 2], "int64"), T("JB", [4, 2], "int64"))
    assert rel == T("IBJ", [3, 2, 4], "int64")
    assert infer("position-rotary", ROT(), T("BFS", [2, 4, "S"], "floating"), T("S", ["S"])).dtype == "floating"


@pytest.mark.parametrize("name, attributes, types, code, path, needle", [
    ("reduce@2", R("E", "sum"), [T("AD", [2, 3])], "atom_attributes", ".attributes.axis", "'E'"),
    ("reduce@2", R(1, "sum"), [T("AD", [2, 3])], "atom_attributes", ".attributes.axis", "axis name"),
    ("reduce@2", R("A", "max"), [T("AD", [2, 3])], "atom_attributes", ".attributes.mode", "'max'"),
    ("reduce@2", R("A", "sum", "float16"), [T("AD", [2, 3])], "atom_attributes",
     ".attributes.accumulation_dtype", "float16"),
    ("reduce@2", R("A", "mean"), [T("AD", [2, 3], "int64")], "type_mismatch", ".input_slots[0]", "int64"),
    ("reduce@2", R("A", "amax"), [T("AD", [2, 3], "boolean")], "type_mismatch", ".input_slots[0]", "boolean"),
    # sinusoidal
    ("position-sinusoidal", SIN(axis=3), [T("S", [4], "int64")], "atom_attributes", ".attributes.feature_axis", "axis name"),
    ("position-sinusoidal", SIN(axis="1F"), [T("S", [4], "int64")], "atom_attributes", ".attributes.feature_axis", "'1F'"),
    ("position-sinusoidal", SIN(axis="S"), [T("S", [4], "int64")], "atom_attributes", ".attributes.feature_axis", "already"),
    ("position-sinusoidal", SIN(size=0), [T("S", [4], "int64")], "atom_attributes", ".attributes.feature_size", ">= 1"),
    ("position-sinusoidal", SIN(size=True), [T("S", [4], "int64")], "atom_attributes", ".attributes.feature_size", "integer"),
    ("position-sinusoidal", SIN(dtype="int64"), [T("S", [4], "int64")], "atom_attributes", ".attributes.dtype", "'int64'"),
    ("position-sinusoidal", SIN(base=1.0), [T("S", [4], "int64")], "atom_attributes", ".attributes.base", "> 1"),
    ("position-sinusoidal", SIN(base=True), [T("S", [4], "int64")], "atom_attributes", ".attributes.base", "number"),
    ("position-sinusoidal", SIN(base=math.inf), [T("S", [4], "int64")], "atom_attributes", ".attributes.base", "finite"),
    ("position-sinusoidal", SIN(base="1e4"), [T("S", [4], "int64")], "atom_attributes", ".attributes.base", "number"),
    ("position-sinusoidal", SIN(), [T("S", [4], "boolean")], "type_mismatch", ".input_slots[0]", "boolean"),
    ("position-sinusoidal", SIN(), [T("S", [4], "floating")], "type_mismatch", ".input_slots[0]", "floating"),
    # relative
    ("position-relative", {}, [T("I", [2], "int64"), T("J", [2], "float32")], "type_mismatch", ".input_slots[1]", "float32"),
    ("position-relative", {}, [T("I", [2], "int64"), T("J", [2], "int64", "e")], "type_mismatch", ".input_slots[1]", "domain"),
    ("position-relative", {}, [T("I", [2], "int64"), T("I", [3], "int64")], "type_mismatch", ".input_slots[1]", "'I'"),
    ("position-relative", {}, [T("I", [2], "boolean"), T("J", [2], "boolean")], "type_mismatch", ".input_slots[0]", "boolean"),
    # rotary
    ("position-rotary", ROT(axis="G"), [T("SF", [3, 4]), T("S", [3])], "atom_attributes", ".attributes.feature_axis", "'G'"),
    ("position-rotary", ROT(axis=None), [T("SF", [3, 4]), T("S", [3])], "atom_attributes", ".attributes.feature_axis", "axis name"),
    ("position-rotary", ROT(base=0.5), [T("SF", [3, 4]), T("S", [3])], "atom_attributes", ".attributes.base", "> 1"),
    ("position-rotary", ROT(), [T("SF", [3, 4], "int64"), T("S", [3])], "type_mismatch", ".input_slots[0]", "floating"),
    ("position-rotary", ROT(), [T("SF", [3, 4]), T("S", [3], "boolean")], "type_mismatch", ".input_slots[1]", "boolean"),
    ("position-rotary", ROT(), [T("SF", [3, 4]), T("S", [3], "float32", "e")], "type_mismatch", ".input_slots[1]", "domain"),
    ("position-rotary", ROT(), [T("SF", [3, 5]), T("S", [3])], "type_mismatch", ".input_slots[0]", "even"),
    ("position-rotary", ROT(), [T("SF", [3, "W"]), T("S", [3])], "type_mismatch", ".input_slots[0]", "even"),
    ("position-rotary", ROT(), [T("SF", [3, 4]), T("SF", [3, 4])], "type_mismatch", ".input_slots[1]", "'F'"),
    ("position-rotary", ROT(), [T("SF", [3, 4]), T("B", [3])], "type_mismatch", ".input_slots[1]", "'B'"),
    ("position-rotary", ROT(), [T("SF", [3, 4]), T("S", [1])], "type_mismatch", ".input_slots[1]", "extent 1"),
    ("position-rotary", ROT(), [T("SF", ["S", 4]), T("S", ["N"])], "type_mismatch", ".input_slots[1]", "extent N"),
])
def test_infer_errors(name, attributes, types, code, path, needle):
    with pytest.raises(FormulaError) as info:
        infer(name, attributes, *types)
    assert (info.value.code, info.value.path) == (code, "$.instructions[1]" + path), info.value
    assert needle in info.value.message


# --- reduce@2 values ---------------------------------------------------------------------

@pytest.mark.parametrize("backend", BACKENDS)
def test_reduce2_hand_values_and_large_magnitudes(backend):
    x = np.array([[1e4, -1e4, 1e4], [-1e4, -1e4, -1e4], [1.0, 2.0, 3.0]], np.float32)
    t = [T("AB", [3, 3])]
    np.testing.assert_allclose(run("reduce@2", R("B", "sum"), t, [x], backend), [1e4, -3e4, 6])
    np.testing.assert_allclose(run("reduce@2", R("B", "mean"), t, [x], backend), [1e4 / 3, -1e4, 2], rtol=1e-6)
    np.testing.assert_array_equal(run("reduce@2", R("B", "amax"), t, [x], backend), [1e4, -1e4, 3])
    lse = run("reduce@2", R("B", "logsumexp", "activation"), t, [x], backend)
    want = [1e4 + math.log(2), -1e4 + math.log(3), 3 + math.log(1 + math.exp(-1) + math.exp(-2))]
    assert np.all(np.isfinite(lse))
    np.testing.assert_allclose(lse, want, rtol=1e-6)
    # along the first axis (columns of a C-order array)
    np.testing.assert_allclose(run("reduce@2", R("A", "logsumexp"), t, [x.T.copy()], backend), want, rtol=1e-6)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("mode", ["sum", "mean", "amax", "logsumexp"])
def test_reduce2_n1_returns_x_exactly(backend, mode):
    x = np.array([[1e4], [-0.1], [3.3e-5]], np.float64)
    got = run("reduce@2", R("B", mode), [T("AB", [3, 1], "float64")], [x], backend)
    np.testing.assert_array_equal(got, x[:, 0])


@pytest.mark.parametrize("backend", BACKENDS)
def test_reduce2_logsumexp_of_infinite_maxima(backend):
    # intermediates may be ±inf (an earlier instruction's overflow): the shift is 0 then
    x = np.array([[-np.inf, -np.inf], [np.inf, 1.0], [np.nan, 1.0]])
    got = run("reduce@2", R("B", "logsumexp"), [T("AB", [3, 2], "float64")], [x], backend)
    assert got[0] == -np.inf and got[1] == np.inf and np.isnan(got[2])


def test_reduce2_half_rounds_once_on_reference():
    # 2048 + 1 + 1 + 1 + 1 in float16 steps stays 2048; computed in float32 and rounded once: 2052
    y = np.array([2048, 1, 1, 1, 1], np.float16)
    for acc in ("activation", "float32"):
        assert run("reduce@2", R("A", "sum", acc), [T("A", [5], "float16")], [y]) == 2052
    x = np.array([1e4, 1e4], np.float16)  # exp(1e4) overflows anything; the shift keeps it finite
    assert run("reduce@2", R("A", "logsumexp"), [T("A", [2], "float16")], [x]) == np.float16(1e4 + math.log(2))


@pytest.mark.parametrize("parallel", [False, True])
@settings(deadline=None, max_examples=8)
@given(seed=st.integers(0, 2**16), extents=st.lists(st.integers(1, 9), min_size=1, max_size=3),
       data=st.data(), dtype=st.sampled_from(["float32", "float64"]),
       mode=st.sampled_from(["sum", "mean", "amax", "logsumexp"]))
def test_reduce2_cpu_matches_reference(parallel, seed, extents, data, dtype, mode):
    import atoms.reduce as reduce_module

    axes = "ABC"[:len(extents)]
    axis = data.draw(st.sampled_from(axes))
    t = T(axes, extents, dtype)
    x = (np.random.default_rng(seed).standard_normal(t.shape) * 30).astype(dtype)
    want = run("reduce@2", R(axis, mode), [t], [x])
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(reduce_module, "PARALLEL_MIN_WORK", 0 if parallel else 1 << 62)
        got = run("reduce@2", R(axis, mode), [t], [x], "cpu")
    np.testing.assert_allclose(got, want, rtol=1e-5 if dtype == "float32" else 1e-12, atol=1e-4)


@settings(deadline=None, max_examples=4)
@given(seed=st.integers(0, 2**16), order=st.permutations("ABC"), axis=st.sampled_from("ABC"),
       mode=st.sampled_from(["sum", "mean", "amax", "logsumexp"]))
def test_reduce2_cuda_matches_reference(seed, order, axis, mode):
    sizes = {"A": 2, "B": 3, "C": 4}
    t = T(order, [sizes[a] for a in order], "float64")
    x = np.random.default_rng(seed).standard_normal(t.shape) * 30
    np.testing.assert_allclose(run("reduce@2", R(axis, mode), [t], [x], "cuda"),
                               run("reduce@2", R(axis, mode), [t], [x]), rtol=1e-12)


# --- position values ---------------------------------------------------------------------

def _sinusoid(p, width, base):
    out = []
    for k in range(width):
        w = math.exp(-math.log(base) * 2 * (k // 2) / width)
        out.append(math.sin(p * w) if k % 2 == 0 else math.cos(p * w))
    return out


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("width", [1, 4, 5])
def test_sinusoidal_hand_values_odd_width(backend, width):
    c = np.array([[0, 3], [-2, 7]], np.int64)
    got = run("position-sinusoidal", SIN(size=width, base=100.0), [T("AB", [2, 2], "int64")], [c], backend)
    assert got.dtype == np.float32 and got.shape == (2, 2, width)  # floating from int64: float32
    want = [[_sinusoid(p, width, 100.0) for p in row] for row in c.tolist()]
    np.testing.assert_allclose(got, want, rtol=2e-6, atol=2e-6)
    f64 = run("position-sinusoidal", SIN(size=width, base=100.0), [T("AB", [2, 2], "float64")],
              [c.astype(np.float64)], backend)
    assert f64.dtype == np.float64
    np.testing.assert_allclose(f64, want, rtol=1e-13, atol=1e-13)


def test_sinusoidal_scalar_coordinate_and_half_result():
    got = run("position-sinusoidal", SIN(size=3, dtype="float16"), [T("", [], "float32")], [np.float32(1.5)])
    assert got.dtype == np.float16
    np.testing.assert_array_equal(got, np.array(_sinusoid(1.5, 3, 1e4), np.float32).astype(np.float16))


@pytest.mark.parametrize("backend", BACKENDS)
def test_relative_outer_difference(backend):
    left = np.array([[1, 5], [2, -9]], np.int64)  # [I, B]
    right = np.array([[0, 2, 2**40], [7, 1, 1]], np.int64)  # [B, J]
    got = run("position-relative", {}, [T("IB", [2, 2], "int64"), T("BJ", [2, 3], "int64")],
              [left, right], backend)
    assert got.dtype == np.int64
    np.testing.assert_array_equal(got, left[:, :, None] - right[None, :, :])
    lf = np.array([0.5, 1.0], np.float32)
    got = run("position-relative", {}, [T("I", [2]), T("J", [2])], [lf, lf], backend)
    np.testing.assert_array_equal(got, lf[:, None] - lf[None, :])


def test_relative_half_is_one_rounding():
    a = np.array([1000.0, 0.1], np.float16)
    b = np.array([0.3], np.float16)
    got = run("position-relative", {}, [T("I", [2], "float16"), T("J", [1], "float16")], [a, b])
    np.testing.assert_array_equal(got[:, 0], (a.astype(np.float32) - b.astype(np.float32)).astype(np.float16))


def _rotate(x, p, base):
    y = x.astype(np.float64).copy()
    width = x.shape[-1]
    for i in range(width // 2):
        th = p * math.exp(-math.log(base) * 2 * i / width)
        y[..., 2 * i] = x[..., 2 * i] * math.cos(th) - x[..., 2 * i + 1] * math.sin(th)
        y[..., 2 * i + 1] = x[..., 2 * i] * math.sin(th) + x[..., 2 * i + 1] * math.cos(th)
    return y


@pytest.mark.parametrize("backend", BACKENDS)
def test_rotary_adjacent_pairs_feature_axis_not_last(backend):
    rng = np.random.default_rng(3)
    x = rng.standard_normal((2, 4, 3)).astype(np.float32)  # [B, F, S]: the feature axis in the middle
    p = np.array([0, 1, 7], np.int64)  # [S], broadcast over B
    got = run("position-rotary", ROT(base=50.0), [T("BFS", [2, 4, 3]), T("S", [3], "int64")], [x, p], backend)
    np.testing.assert_array_equal(got[:, :, 0], x[:, :, 0])  # p = 0 returns x
    for s in range(3):
        np.testing.assert_allclose(got[:, :, s], _rotate(x[:, :, s], p[s], 50.0), rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("backend", BACKENDS)
def test_rotary_scalar_coordinates_float64(backend):
    x = np.array([1.0, 0.0, 0.5, -2.0])
    got = run("position-rotary", ROT(base=10.0), [T("F", [4], "float64"), T("", [], "float32")],
              [x, np.float32(2.5)], backend)
    np.testing.assert_allclose(got, _rotate(x, 2.5, 10.0), rtol=1e-14, atol=1e-14)


@settings(deadline=None, max_examples=6)
@given(seed=st.integers(0, 2**16), order=st.permutations("BHF"), pairs=st.integers(1, 4),
       coord_axes=st.sampled_from(["", "B", "H", "BH", "HB"]), big=st.booleans(),
       cdtype=st.sampled_from(["int64", "float32", "float64"]))
def test_rotary_and_sinusoidal_cpu_match_reference(seed, order, pairs, coord_axes, big, cdtype):
    import runtime.backends.cpu_codegen as cg

    rng = np.random.default_rng(seed)
    sizes = {"B": 3, "H": 2, "F": 2 * pairs}
    vt = T(order, [sizes[a] for a in order])
    ct = T(coord_axes, [sizes[a] for a in coord_axes], cdtype)
    x = rng.standard_normal(vt.shape).astype(np.float32)
    c = (rng.integers(-50, 50, ct.shape) if cdtype == "int64" else rng.standard_normal(ct.shape) * 20).astype(cdtype)
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(cg, "PARALLEL_MIN_ELEMENTS", 0 if big else 1 << 62)
        for name, attributes, types, values in [
                ("position-rotary", ROT(), [vt, ct], [x, c]),
                ("position-sinusoidal", SIN(size=2 * pairs + big), [ct], [c])]:
            np.testing.assert_allclose(run(name, attributes, types, values, "cpu"),
                                       run(name, attributes, types, values), rtol=2e-5, atol=2e-5)


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_half_programs_on_devices_match_reference(dtype):
    """Half operands through the planner (widened to float32, rounded once): every device agrees."""
    import ml_dtypes  # noqa: F401  (bfloat16 arrays)

    from runtime.testing import assert_backends_agree
    from runtime.core.types import numpy_dtype
    from tests.spec.atom_cases import one

    half = numpy_dtype(dtype)
    x = np.array([[1e2, -1e2, 3.0, 0.5], [1.0, 2.0, 3.0, 4.0]], np.float32).astype(half)
    for program, inputs in [
            (one("reduce@2", [("v", ["S", "F"], [2, 4], dtype)], R("F", "logsumexp"), ["S"], [2], dtype),
             {"v": x}),
            (one("position-rotary", [("v", ["S", "F"], [2, 4], dtype), ("p", ["S"], [2], "int64")],
                 ROT(), ["S", "F"], [2, 4], dtype), {"v": x, "p": np.array([0, 3])}),
            (one("position-sinusoidal", [("p", ["S"], [2], dtype)], SIN(size=3, dtype=dtype), ["S", "F"], [2, 3], dtype),
             {"p": x[:, 0].copy()})]:
        assert_backends_agree(program, inputs, backends=("cpu", "cuda"))


def test_rotary_cpu_tables_are_declared_scratch():
    from runtime.plugins.atomspec import bind_node

    node = bind_node(SPEC["position-rotary"], ROT(), [T("SHF", [3, 5, 8]), T("S", [3], "int64")])
    # cos and sin per (coordinate, pair): 3 x 4 each, shared by the 5 heads; the coordinates in c
    assert SPEC["position-rotary"].scratch_bytes(node, "cpu") == (2 * 3 * 4 + 3) * 4
    assert SPEC["position-rotary"].scratch_bytes(node, "cuda") == 4 * 4  # its frequencies on the device
    assert SPEC["position-rotary"].scratch_bytes(node, "reference") == 0


@pytest.mark.parametrize("parallel", [False, True])
@pytest.mark.parametrize("outer, k, inner", [(5, 31, 1), (3, 32, 1), (7, 33, 1), (4, 100, 1), (2, 700, 1),
                                             (3, 5, 300), (2, 40, 600), (3, 1, 257)])
@pytest.mark.parametrize("mode", ["amax", "logsumexp"])
def test_reduce2_extremes_past_the_vector_paths(parallel, outer, k, inner, mode):
    # rows long enough for the lane-wise maxima (k >= 2 x EXTREME_LANES) and column runs longer
    # than EXTREME_CHUNK, each with a NaN, +inf or -inf planted at the start, in the lanes, in
    # the tail and in the combined lanes; amax is exact (np.max), logsumexp the reference's
    import atoms.reduce as reduce_module

    rng = np.random.default_rng(k * inner)
    for dtype in ("float32", "float64"):
        x = (rng.standard_normal((outer, k, inner)) * 30).astype(dtype)
        specials = [np.nan, np.inf, -np.inf]
        for o in range(outer):
            for where in (0, k // 2, k - 1):
                if rng.random() < 0.4:
                    x[o, where, rng.integers(inner)] = specials[rng.integers(3)]
        t = T("ABC", [outer, k, inner], dtype)
        with pytest.MonkeyPatch.context() as mp:
            mp.setattr(reduce_module, "PARALLEL_MIN_WORK", 0 if parallel else 1 << 62)
            got = run("reduce@2", R("B", mode), [t], [x], "cpu")
        want = run("reduce@2", R("B", mode), [t], [x])
        if mode == "amax":
            np.testing.assert_array_equal(got, x.max(axis=1))
        np.testing.assert_allclose(got, want, rtol=1e-5 if dtype == "float32" else 1e-12)
