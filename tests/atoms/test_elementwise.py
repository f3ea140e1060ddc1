"""scalar-map, scale, add, select: infer errors, reference values, cpu/cuda vs reference."""
from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

from atoms.elementwise import SCALAR_EXPRS, SPECS
from runtime.plugins.atomspec import InferContext, bind_node
from runtime.plugins.kernel import KernelRequest
from runtime.core.errors import FormulaError
from runtime.testing import real_cuda, run_kernel
from runtime.core.types import TensorType

SPEC = {s.name: s for s in SPECS if s.ref.endswith("@1")}  # the @2 scalar-map: test_elementwise_v2
ACT = {"accumulation_dtype": "activation"}


def T(axes, sizes, dtype="float32", domain="d"):
    return TensorType(tuple(axes), tuple(sizes), dtype, domain)


def infer(name, attributes, *types):
    ctx = InferContext(SPEC[name], "$.instructions[3]", attributes, types, [f"s{k}" for k in range(len(types))])
    return SPEC[name].infer(ctx)


def run(name, attributes, types, values, backend="reference"):
    return run_kernel(SPEC[name], attributes, types, values, backend)


def expect_error(code, path, fn, *args):
    with pytest.raises(FormulaError) as info:
        fn(*args)
    assert info.value.code == code, info.value
    assert info.value.path == path, info.value
    return info.value


# --- infer --------------------------------------------------------------------------------

def test_infer_types_and_symbols():
    v = T("BSD", ["B", "S", 8], "floating")
    assert infer("scalar-map", {"mode": "silu"}, v) == v
    f = T("D", [8], "floating")
    assert infer("scale", {"factor_axes": ["D"], **ACT}, v, f).same_as(v)
    assert infer("add", ACT, v, T("BSD", [2, "S", 8], "float32")).sizes == ("B", "S", 8)
    m = T("SB", [1, "B"], "boolean")
    assert infer("select", {}, m, v, v).same_as(v)


@pytest.mark.parametrize("name, attributes, types, code, path, needle", [
    ("scalar-map", {"mode": "swish"}, [T("A", [2])], "atom_attributes", ".attributes.mode", "swish"),
    ("scalar-map", {"mode": 3}, [T("A", [2])], "atom_attributes", ".attributes.mode", "string"),
    ("scalar-map", {"mode": "relu"}, [T("A", [2], "int64")], "type_mismatch", ".input_slots[0]", "floating"),
    ("scale", {"factor_axes": ["D"], "accumulation_dtype": "float16"}, [T("AD", [2, 3]), T("D", [3])],
     "atom_attributes", ".attributes.accumulation_dtype", "float16"),
    ("scale", {"factor_axes": ["A", "D"], **ACT}, [T("AD", [2, 3]), T("DA", [3, 2])],
     "atom_attributes", ".attributes.factor_axes", "exactly"),
    ("scale", {"factor_axes": "D", **ACT}, [T("AD", [2, 3]), T("D", [3])],
     "atom_attributes", ".attributes.factor_axes", "list"),
    ("scale", {"factor_axes": ["E"], **ACT}, [T("AD", [2, 3]), T("E", [3])],
     "atom_attributes", ".attributes.factor_axes", "'E'"),
    ("scale", {"factor_axes": ["D"], **ACT}, [T("AD", [2, 3]), T("D", [4])],
     "type_mismatch", ".input_slots[1]", "differ"),
    ("scale", {"factor_axes": ["D"], **ACT}, [T("AD", [2, 3]), T("D", [1])],
     "type_mismatch", ".input_slots[1]", "differ"),
    ("scale", {"factor_axes": ["D"], **ACT}, [T("AD", [2, 3]), T("D", [3], "float64")],
     "type_mismatch", ".input_slots[1]", "float64"),
    ("scale", {"factor_axes": ["D"], **ACT}, [T("AD", [2, 3]), T("D", [3], domain="e")],
     "type_mismatch", ".input_slots[1]", "domain"),
    ("add", ACT, [T("AD", [2, 3]), T("DA", [3, 2])], "type_mismatch", ".input_slots[1]", "axes"),
    ("add", ACT, [T("AD", [2, 3]), T("AD", [2, 4])], "type_mismatch", ".input_slots[1]", "'D'"),
    ("add", ACT, [T("A", [2], "boolean"), T("A", [2], "boolean")], "type_mismatch", ".input_slots[0]", "numeric"),
    ("select", {}, [T("A", [2]), T("A", [2]), T("A", [2])], "type_mismatch", ".input_slots[0]", "boolean"),
    ("select", {}, [T("E", [2], "boolean"), T("A", [2]), T("A", [2])], "type_mismatch", ".input_slots[0]", "'E'"),
    ("select", {}, [T("A", [3], "boolean"), T("A", [2]), T("A", [2])], "type_mismatch", ".input_slots[0]", "1 or equal"),
    ("select", {}, [T("A", [2], "boolean"), T("A", [2]), T("A", [2], "float64")], "type_mismatch", ".input_slots[2]", "float64"),
])
def test_infer_errors(name, attributes, types, code, path, needle):
    err = expect_error(code, "$.instructions[3]" + path, infer, name, attributes, *types)
    assert needle in err.message and name in err.message


# --- reference against hand-computed values ------------------------------------------------

def test_scalar_map_reference_values():
    x = np.array([-100.0, -3.0, -0.0, 0.0, 0.5, 100.0])
    t = T("A", [6], "float64")
    r = {m: run("scalar-map", {"mode": m}, [t], [x]) for m in SCALAR_EXPRS}
    gelu = [0.5 * v * (1 + math.erf(v / math.sqrt(2))) for v in x]
    np.testing.assert_allclose(r["gelu"], gelu, rtol=1e-15, atol=1e-300)
    assert r["gelu"][1] == pytest.approx(-3 * 0.0013498980316301, rel=1e-12)  # -3·Φ(-3): exact erf gelu
    np.testing.assert_array_equal(r["relu"], [0, 0, 0, 0, 0.5, 100])
    assert not np.signbit(r["relu"][2])  # relu(-0.0) = +0.0 as np.maximum(x, 0)
    np.testing.assert_allclose(r["rsqrt"][2:], [-np.inf, np.inf, math.sqrt(2), 0.1], rtol=1e-15)
    assert np.isnan(r["rsqrt"][:2]).all()
    assert r["sigmoid"][0] == pytest.approx(math.exp(-100), rel=1e-12) and r["sigmoid"][-1] == 1.0
    assert r["silu"][0] == pytest.approx(-100 * math.exp(-100), rel=1e-12) and r["silu"][-1] == 100.0
    assert r["sigmoid"][3] == 0.5
    np.testing.assert_allclose(r["tanh"], np.tanh(x))


def test_sigmoid_silu_float32_extremes_have_no_nan():
    x = np.array([-100.0, -88.0, 88.0, 100.0, 3e38, -3e38], dtype=np.float32)
    t = T("A", [6])
    for backend in ("reference", "cpu"):
        s = run("scalar-map", {"mode": "sigmoid"}, [t], [x], backend)
        z = run("scalar-map", {"mode": "silu"}, [t], [x], backend)
        assert np.isfinite(s).all() and np.isfinite(z).all(), backend
        np.testing.assert_array_equal(s[[2, 3, 4]], [1, 1, 1])
        np.testing.assert_array_equal(z[[3, 4]], x[[3, 4]])


def test_scale_broadcasts_by_name_and_keeps_caller_arrays():
    v = np.arange(6, dtype=np.float64).reshape(2, 3)
    f = np.array([10.0, 100.0])
    v.flags.writeable = False
    for backend in ("reference", "cpu"):
        out = run("scale", {"factor_axes": ["A"], **ACT}, [T("AD", [2, 3], "float64"), T("A", [2], "float64")],
                  [v, f], backend)
        np.testing.assert_array_equal(out, [[0, 10, 20], [300, 400, 500]])
    np.testing.assert_array_equal(f, [10, 100])


def test_add_size_one_axes_and_accumulation():
    a = np.array([[1.5]], dtype=np.float16)
    t = T("AB", [1, 1], "float16")
    out = run("add", {"accumulation_dtype": "float32"}, [t, t], [a, a])
    assert out.dtype == np.float16 and out[0, 0] == 3.0
    big = np.full((1, 1), 60000, dtype=np.float16)  # the sum overflows float16 only on the cast
    assert np.isinf(run("add", {"accumulation_dtype": "float32"}, [t, t], [big, big]))[0, 0]


def test_select_mask_broadcast_values():
    mask = np.array([[True], [False]])
    t = np.arange(6, dtype=np.float32).reshape(2, 3)
    types = [T("AB", [2, 1], "boolean"), T("AB", [2, 3]), T("AB", [2, 3])]
    for backend in ("reference", "cpu"):
        np.testing.assert_array_equal(run("select", {}, types, [mask, t, -t], backend),
                                      [[0, 1, 2], [-3, -4, -5]])


def test_half_precision_has_no_compiled_kernel():
    node = bind_node(SPEC["add"], ACT, [T("A", [2], "float16")] * 2)
    for backend in ("cpu", "cuda"):
        with pytest.raises(FormulaError) as info:
            node.atom.kernels[backend](KernelRequest(node))
        assert info.value.code == "backend_unavailable" and info.value.path == node.path
        assert "float16" in info.value.message and "reference" in info.value.message


def test_int64_and_boolean_move_through_select_on_cpu():
    mask = np.array([True, False, True])
    for dtype, kind in ((np.int64, "int64"), (np.bool_, "boolean")):
        a, b = np.array([1, 2, 3]).astype(dtype), np.array([0, 0, 0]).astype(dtype)
        types = [T("A", [3], "boolean"), T("A", [3], kind), T("A", [3], kind)]
        np.testing.assert_array_equal(run("select", {}, types, [mask, a, b], "cpu"), np.where(mask, a, b))


# --- cpu and cuda against the reference ---------------------------------------------------

ORDERS = st.permutations(["A", "B", "C"])
EXTENTS = st.tuples(*[st.integers(2, 5)] * 3)


def _case(data, orders_value, extents, dtype):
    rng = np.random.default_rng(data)
    sizes = dict(zip("ABC", extents))
    vt = T(orders_value, [sizes[a] for a in orders_value], dtype)
    x = (rng.standard_normal(vt.shape) * 3).astype(dtype)
    return rng, sizes, vt, x


@settings(deadline=None, max_examples=12)
@given(seed=st.integers(0, 2**16), order=ORDERS, extents=EXTENTS,
       mode=st.sampled_from(sorted(SCALAR_EXPRS)), transposed=st.booleans())
def test_cpu_matches_reference_hypothesis(seed, order, extents, mode, transposed):
    rng, sizes, vt, x = _case(seed, order, extents, "float32")
    if transposed:  # a non-contiguous, read-only caller view
        x = np.ascontiguousarray(x.T).T
        x.flags.writeable = False
    if mode == "rsqrt":
        x = np.abs(x) + 0.5
    ft = T(["C", "A"], [sizes["C"], sizes["A"]])
    f = rng.standard_normal(ft.shape).astype(np.float32)
    mt = T(["B"], [sizes["B"]], "boolean")
    m = rng.random(mt.shape) < 0.5
    cases = [("scalar-map", {"mode": mode}, [vt], [x]),
             ("scale", {"factor_axes": ["C", "A"], **ACT}, [vt, ft], [x, f]),
             ("add", ACT, [vt, vt], [x, x * 2]),
             ("select", {}, [mt, vt, vt], [m, x, -x])]
    for name, attributes, types, values in cases:
        want = run(name, attributes, types, values)
        got = run(name, attributes, types, values, "cpu")
        np.testing.assert_allclose(got, want, rtol=2e-6, atol=1e-6, err_msg=name)


@settings(deadline=None, max_examples=25 if real_cuda() else 3)
@given(seed=st.integers(0, 2**16), order=ORDERS,
       extents=st.tuples(*[st.integers(2, 60 if real_cuda() else 3)] * 3),
       mode=st.sampled_from(["gelu", "silu", "rsqrt"]))
def test_cuda_matches_reference_hypothesis(seed, order, extents, mode):
    rng, sizes, vt, x = _case(seed, order, extents, "float64")
    x = np.abs(x) + 0.5 if mode == "rsqrt" else x
    ft = T(["C", "A"], [sizes["C"], sizes["A"]], "float64")
    f = rng.standard_normal(ft.shape)
    mt = T(["B"], [sizes["B"]], "boolean")
    m = rng.random(mt.shape) < 0.5
    for name, attributes, types, values in [
            ("scalar-map", {"mode": mode}, [vt], [x]),
            ("scale", {"factor_axes": ["C", "A"], **ACT}, [vt, ft], [x, f]),
            ("select", {}, [mt, vt, vt], [m, x, -x])]:
        want = run(name, attributes, types, values)
        np.testing.assert_allclose(run(name, attributes, types, values, "cuda"), want,
                                   rtol=1e-12, atol=1e-14, err_msg=name)


def test_rank0_add_on_all_backends():
    t = T([], [], "float64")
    a = np.array(1.25)
    for backend in ("reference", "cpu", "cuda"):
        assert run("add", ACT, [t, t], [a, a], backend)[()] == 2.5
