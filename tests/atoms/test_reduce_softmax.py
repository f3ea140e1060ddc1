"""reduce and masked-softmax: infer errors, reference values, cpu/cuda vs reference."""
from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

from atoms.reduce import SPECS as REDUCE
from atoms.softmax import SPECS as SOFTMAX
from runtime.plugins.atomspec import InferContext, bind_node
from runtime.plugins.kernel import KernelRequest
from runtime.core.errors import FormulaError
from runtime.testing import real_cuda, run_kernel
from runtime.core.types import TensorType

SPEC = {s.name: s for s in REDUCE + SOFTMAX}
SUM = {"mode": "sum", "accumulation_dtype": "float32"}


def T(axes, sizes, dtype="float32", domain="d"):
    return TensorType(tuple(axes), tuple(sizes), dtype, domain)


def infer(name, attributes, *types):
    ctx = InferContext(SPEC[name], "$.instructions[1]", attributes, types, [f"s{k}" for k in range(len(types))])
    return SPEC[name].infer(ctx)


def run(name, attributes, types, values, backend="reference"):
    return run_kernel(SPEC[name], attributes, types, values, backend)


def test_infer_output_types():
    v = T("BSD", ["B", "S", 4], "floating")
    assert infer("reduce", {"axis": "S", **SUM}, v).axes == ("B", "D")
    assert infer("reduce", {"axis": "D", **SUM}, T("D", [4])).axes == ()
    m = T("SB", [1, "B"], "boolean")
    assert infer("masked-softmax", {"axis": "S", "accumulation_dtype": "activation"}, v, m).same_as(v)


@pytest.mark.parametrize("name, attributes, types, code, path, needle", [
    ("reduce", {"axis": "E", **SUM}, [T("AD", [2, 3])], "atom_attributes", ".attributes.axis", "'E'"),
    ("reduce", {"axis": 0, **SUM}, [T("AD", [2, 3])], "atom_attributes", ".attributes.axis", "axis name"),
    ("reduce", {"axis": "A", "mode": "max", "accumulation_dtype": "float32"}, [T("AD", [2, 3])],
     "atom_attributes", ".attributes.mode", "'max'"),
    ("reduce", {"axis": "A", "mode": "sum", "accumulation_dtype": "int8"}, [T("AD", [2, 3])],
     "atom_attributes", ".attributes.accumulation_dtype", "int8"),
    ("reduce", {"axis": "A", **SUM}, [T("A", [2], "boolean")], "type_mismatch", ".input_slots[0]", "boolean"),
    ("masked-softmax", {"axis": "Q", "accumulation_dtype": "activation"},
     [T("AD", [2, 3]), T("D", [3], "boolean")], "atom_attributes", ".attributes.axis", "'Q'"),
    ("masked-softmax", {"axis": "D", "accumulation_dtype": "activation"},
     [T("AD", [2, 3], "int64"), T("D", [3], "boolean")], "type_mismatch", ".input_slots[0]", "floating"),
    ("masked-softmax", {"axis": "D", "accumulation_dtype": "activation"},
     [T("AD", [2, 3]), T("D", [3], "float32")], "type_mismatch", ".input_slots[1]", "boolean"),
    ("masked-softmax", {"axis": "D", "accumulation_dtype": "activation"},
     [T("AD", [2, 3]), T("D", [2], "boolean")], "type_mismatch", ".input_slots[1]", "1 or equal"),
    ("masked-softmax", {"axis": "D", "accumulation_dtype": "activation"},
     [T("AD", [2, 3]), T("E", [3], "boolean")], "type_mismatch", ".input_slots[1]", "'E'"),
    ("masked-softmax", {"axis": "D", "accumulation_dtype": "activation"},
     [T("AD", [2, 3]), T("D", [3], "boolean", "other")], "type_mismatch", ".input_slots[1]", "domain"),
])
def test_infer_errors(name, attributes, types, code, path, needle):
    with pytest.raises(FormulaError) as info:
        infer(name, attributes, *types)
    assert (info.value.code, info.value.path) == (code, "$.instructions[1]" + path), info.value
    assert needle in info.value.message


def test_reduce_symbolic_extent_checked_at_plan_time():
    v = T("BD", ["B", 3])
    assert bind_node(SPEC["reduce"], {"axis": "B", **SUM}, [v.resolve({"B": 5})]).output_type.sizes == (3,)


# --- reference against hand-computed values ------------------------------------------------

def test_reduce_is_sequential_in_index_order():
    # in index order the first +1 is absorbed by 1e16 (ulp 2, ties to even): ((1e16+1)-1e16)+1 = 1
    x = np.array([1e16, 1.0, -1e16, 1.0])
    for backend in ("reference", "cpu", "cuda"):
        assert run("reduce", {"axis": "A", **SUM}, [T("A", [4], "float64")], [x], backend)[()] == 1.0
    x32 = np.array([[1.0, 2.0], [3.0, 4.0], [5.0, 6.0]], dtype=np.float32)
    np.testing.assert_array_equal(run("reduce", {"axis": "A", **SUM}, [T("AB", [3, 2])], [x32]), [9, 12])
    np.testing.assert_array_equal(run("reduce", {"axis": "B", **SUM}, [T("AB", [3, 2])], [x32]), [3, 7, 11])
    one = run("reduce", {"axis": "A", **SUM}, [T("AB", [1, 2])], [x32[:1]])
    np.testing.assert_array_equal(one, [1, 2])


def test_reduce_float32_accumulation_of_half():
    x = np.full((4,), 30000, dtype=np.float16)  # 120000 > float16 max: inf only if summed in float16
    t = T("A", [4], "float16")
    assert np.isinf(run("reduce", {"axis": "A", "mode": "sum", "accumulation_dtype": "activation"}, [t], [x]))
    assert np.isinf(run("reduce", {"axis": "A", **SUM}, [t], [x]))  # cast back overflows too
    y = np.array([2048, 1, 1, 1, 1], dtype=np.float16)  # 2048 + 1 rounds to 2048 in float16
    t = T("A", [5], "float16")
    assert run("reduce", {"axis": "A", "mode": "sum", "accumulation_dtype": "activation"}, [t], [y]) == 2048
    assert run("reduce", {"axis": "A", **SUM}, [t], [y]) == 2052


def test_masked_softmax_values_and_fully_masked_rows():
    x = np.array([[1.0, 2.0, 3.0], [1000.0, -1000.0, 5.0]])
    mask = np.array([[True, False, True], [False, False, False]])
    types = [T("AD", [2, 3], "float64"), T("AD", [2, 3], "boolean")]
    for backend in ("reference", "cpu", "cuda"):
        out = run("masked-softmax", {"axis": "D", "accumulation_dtype": "activation"}, types, [x, mask], backend)
        e = np.exp(-2.0)
        np.testing.assert_allclose(out[0], [e / (1 + e), 0, 1 / (1 + e)], rtol=1e-14)
        np.testing.assert_array_equal(out[1], [0, 0, 0])


@pytest.mark.parametrize("axis", ["S", "T"])
def test_masked_softmax_cpu_visible_spans_match_reference(axis):
    """The cpu kernel computes only each row's visible span: causal and anti-causal masks,
    holes inside the span, a lone visible entry at either end, fully hidden rows; hidden
    entries (huge, -inf or NaN) outside and inside the span give 0. Along T, the row is a
    strided column."""
    n = 37
    rng = np.random.default_rng(3)
    x = rng.standard_normal((n, n)).astype(np.float32) * 4
    causal = np.tril(np.ones((n, n), bool))
    mask = np.concatenate([causal, causal[::-1], causal & (rng.random((n, n)) < 0.7)])
    mask[0] = False
    mask[1, :] = False
    mask[1, -1] = True
    mask[2, :] = False
    mask[2, 0] = True
    logits = np.concatenate([x, x, x])
    logits[~mask & (rng.random(mask.shape) < 0.3)] = 1e30  # would dominate if it were visible
    logits[3, -1], logits[4, -2] = -np.inf, np.nan
    assert not mask[3, -1] and not mask[4, -2]
    if axis == "T":
        logits, mask = np.ascontiguousarray(logits.T), np.ascontiguousarray(mask.T)
    types = [T("TS", logits.shape), T("TS", mask.shape, "boolean")]
    attrs_ = {"axis": axis, "accumulation_dtype": "float32"}
    want = run("masked-softmax", attrs_, types, [logits, mask])
    got = run("masked-softmax", attrs_, types, [logits, mask], "cpu")
    np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-7)
    np.testing.assert_array_equal(got[~mask], 0.0)


@pytest.mark.parametrize("dtype", ["float32", "float64"])
@pytest.mark.parametrize("axis", ["A", "D"])
def test_masked_softmax_reference_propagates_non_finite_visible_logits_as_cpu(axis, dtype):
    """SPEC §3b: non-finite values follow IEEE. A NaN, +inf or an all -inf row among the
    visible logits makes the row's visible entries NaN on both backends (the oracle gave 0:
    ``s > 0`` is false for NaN); hidden entries stay 0, a hidden NaN changes nothing."""
    inf, nan = np.inf, np.nan
    x = np.array([[1, nan, 2, 0], [inf, 1, 2, 0], [-inf, -inf, -inf, 0], [-inf, 1, 2, 0],
                  [nan, 1, 2, 5], [1, 2, 3, nan], [nan, nan, 1, 2]], dtype)
    mask = np.array([[1, 1, 1, 0]] * 4 + [[0, 1, 1, 1], [1, 1, 1, 1], [0, 0, 0, 0]], bool)
    if axis == "A":
        x, mask = np.ascontiguousarray(x.T), np.ascontiguousarray(mask.T)
    types = [T("AD", x.shape, dtype), T("AD", mask.shape, "boolean")]
    attrs_ = {"axis": axis, "accumulation_dtype": "float32"}
    want = run("masked-softmax", attrs_, types, [x, mask])
    got = run("masked-softmax", attrs_, types, [x, mask], "cpu")
    np.testing.assert_array_equal(np.isnan(want), np.isnan(got))
    np.testing.assert_allclose(got, want, rtol=1e-6)
    rows = want if axis == "D" else want.T
    assert np.isnan(rows[[0, 1, 2, 5]][:, :3]).all() and np.isnan(rows[5, 3])
    assert not np.isnan(rows[[3, 4, 6]]).any()
    np.testing.assert_array_equal(want[~mask], 0.0)


def test_masked_softmax_is_stable_and_broadcasts_the_mask():
    x = np.array([[1000.0, 1000.0], [-1000.0, 0.0]], dtype=np.float32)  # naive exp overflows
    mask = np.array([True, True])  # only along D: broadcast over A
    types = [T("AD", [2, 2]), T("D", [2], "boolean")]
    for backend in ("reference", "cpu"):
        out = run("masked-softmax", {"axis": "D", "accumulation_dtype": "float32"}, types, [x, mask], backend)
        np.testing.assert_allclose(out, [[0.5, 0.5], [0, 1]], atol=1e-30)
    # softmax along A with a mask of extent 1 on A: a single visible entry per column gets 1
    mask1 = np.array([[True, False]])
    out = run("masked-softmax", {"axis": "A", "accumulation_dtype": "activation"},
              [T("AD", [2, 2]), T("AD", [1, 2], "boolean")], [x, mask1], "cpu")
    np.testing.assert_allclose(out, [[1, 0], [0, 0]], atol=1e-30)


def test_rank1_softmax_and_half_unavailable():
    x = np.array([0.0, np.log(3.0)])
    out = run("masked-softmax", {"axis": "A", "accumulation_dtype": "activation"},
              [T("A", [2], "float64"), T("A", [2], "boolean")], [x, np.array([True, True])], "cpu")
    np.testing.assert_allclose(out, [0.25, 0.75])
    node = bind_node(SPEC["masked-softmax"], {"axis": "A", "accumulation_dtype": "float32"},
                     [T("A", [2], "float16"), T("A", [2], "boolean")])
    with pytest.raises(FormulaError) as info:
        node.atom.kernels["cpu"](KernelRequest(node))
    assert info.value.code == "backend_unavailable" and "float16" in info.value.message


# --- cpu and cuda against the reference ---------------------------------------------------

@settings(deadline=None, max_examples=10)
@given(seed=st.integers(0, 2**16), order=st.permutations(["A", "B", "C"]),
       extents=st.tuples(*[st.integers(2, 6)] * 3), axis=st.sampled_from("ABC"),
       strided=st.booleans())
def test_cpu_matches_reference_hypothesis(seed, order, extents, axis, strided):
    rng = np.random.default_rng(seed)
    sizes = dict(zip("ABC", extents))
    vt = T(order, [sizes[a] for a in order])
    x = rng.standard_normal(vt.shape).astype(np.float32)
    if strided:  # a read-only Fortran-ordered caller array
        x = np.asfortranarray(x)
        x.flags.writeable = False
    mt = T(["C", "B"], [sizes["C"], sizes["B"]], "boolean")
    m = rng.random(mt.shape) < 0.6
    for name, attributes, types, values in [
            ("reduce", {"axis": axis, **SUM}, [vt], [x]),
            ("masked-softmax", {"axis": axis, "accumulation_dtype": "activation"}, [vt, mt], [x, m])]:
        want = run(name, attributes, types, values)
        np.testing.assert_allclose(run(name, attributes, types, values, "cpu"), want,
                                   rtol=1e-5, atol=1e-6, err_msg=name)


@pytest.mark.parametrize("parallel", [False, True])
@settings(deadline=None, max_examples=12)
@given(seed=st.integers(0, 2**16), extents=st.lists(st.integers(1, 40), min_size=1, max_size=4),
       data=st.data(), dtype=st.sampled_from(["float32", "float64", "int64"]))
def test_cpu_reduce_is_bitwise_the_sequential_sum(parallel, seed, extents, data, dtype):
    """The cpu kernel sums several rows side by side (8 at a time when the reduced axis is
    innermost, tiles of accumulators otherwise), in tasks on several threads: every output
    element must still be the same additions in index order as the reference, bit for bit."""
    import atoms.reduce as reduce_module

    axes = "ABCD"[:len(extents)]
    axis = data.draw(st.sampled_from(axes))
    rng = np.random.default_rng(seed)
    t = T(axes, extents, dtype)
    x = (rng.standard_normal(t.shape) * 1e3).astype(dtype) if dtype != "int64" else \
        rng.integers(-2**62, 2**62, t.shape, dtype=np.int64)  # wraps around, as specified
    attributes = {"axis": axis, **SUM}
    with np.errstate(over="ignore"):
        want = run("reduce", attributes, [t], [x])
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(reduce_module, "PARALLEL_MIN_WORK", 0 if parallel else 1 << 62)
        mp.setattr(reduce_module, "MIN_INNER_BLOCK", 3)  # tiles split inside short rows too
        got = run("reduce", attributes, [t], [x], "cpu")
    np.testing.assert_array_equal(got, want)


@settings(deadline=None, max_examples=25 if real_cuda() else 3)
@given(seed=st.integers(0, 2**16), order=st.permutations(["A", "B", "C"]),
       extents=st.tuples(*[st.integers(2, 60 if real_cuda() else 3)] * 3),
       axis=st.sampled_from("ABC"))
def test_cuda_matches_reference_hypothesis(seed, order, extents, axis):
    rng = np.random.default_rng(seed)
    sizes = dict(zip("ABC", extents))
    vt = T(order, [sizes[a] for a in order], "float64")
    x = rng.standard_normal(vt.shape)
    mt = T(["C", "B"], [sizes["C"], sizes["B"]], "boolean")
    m = rng.random(mt.shape) < 0.6
    for name, attributes, types, values in [
            ("reduce", {"axis": axis, **SUM}, [vt], [x]),
            ("masked-softmax", {"axis": axis, "accumulation_dtype": "activation"}, [vt, mt], [x, m])]:
        want = run(name, attributes, types, values)
        np.testing.assert_allclose(run(name, attributes, types, values, "cuda"), want,
                                   rtol=1e-12, atol=1e-14, err_msg=name)


def test_cpu_softmax_goes_parallel_by_elements_read_not_rows(monkeypatch):
    """A softmax point reads a whole row: 4 rows of 300 are 1200 elements of work."""
    from runtime.backends import cpu_codegen as cg

    used = []
    plain = cg.NestKernel.parallel

    def spy(self):
        used.append(self._prefix)
        return plain(self)
    monkeypatch.setattr(cg.NestKernel, "parallel", spy)
    monkeypatch.setattr(cg, "PARALLEL_MIN_ELEMENTS", 1000)
    rng = np.random.default_rng(0)
    x = rng.standard_normal((4, 300)).astype(np.float32)
    m = rng.random((4, 300)) < 0.7
    types = [T("AD", [4, 300]), T("AD", [4, 300], "boolean")]
    attributes = {"axis": "D", "accumulation_dtype": "float32"}
    got = run("masked-softmax", attributes, types, [x, m], "cpu")
    assert used == ["softmax"]
    np.testing.assert_allclose(got, run("masked-softmax", attributes, types, [x, m]), rtol=1e-5, atol=1e-7)
