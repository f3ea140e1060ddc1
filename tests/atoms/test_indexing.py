"""gather, scatter, lookup: infer rules and errors, value checks (index_range, duplicate_index),
reference values by hand, cpu and cuda (simulator) against the reference on generated cases."""
from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

from atoms.indexing import SPECS
from runtime.plugins.atomspec import InferContext, bind_node
from runtime.plugins.kernel import KernelRequest
from runtime.core.errors import FormulaError
from runtime.core.types import TensorType, numpy_dtype

SPEC = {s.name: s for s in SPECS}
INS = "$.instructions[3]"
G = {"axis": "N", "index_axis": "J"}
SC = {**G, "mode": "replace"}


def T(axes, sizes, dtype="float32", domain="d"):
    return TensorType(tuple(axes), tuple(sizes), dtype, domain)


def I(axes, sizes):  # noqa: E743
    return T(axes, sizes, "int64")


def infer(name, attributes, *types, dims=None):
    ctx = InferContext(SPEC[name], INS, attributes, types, [f"s{k}" for k in range(len(types))], dims)
    return SPEC[name].infer(ctx)


def expect(code, path, fn, *args, needle=""):
    with pytest.raises(FormulaError) as info:
        fn(*args)
    assert info.value.code == code, info.value
    assert info.value.path == path, info.value
    assert needle in info.value.message, info.value
    return info.value


def run(name, attributes, types, values, backend="reference", check=True):
    node = bind_node(SPEC[name], attributes, types, index=3)
    if check:
        node.atom.check_values(node, [v if k in node.atom.checked_inputs else None
                                      for k, v in enumerate(values)])
    out = np.zeros(node.output_type.shape, dtype=numpy_dtype(node.output_type.dtype))
    if backend == "cuda":
        from numba import cuda

        dev = cuda.to_device(out)
        node.atom.kernels["cuda"](KernelRequest(node))([cuda.to_device(np.ascontiguousarray(v)) for v in values], (), dev)
        return dev.copy_to_host()
    node.atom.kernels[backend](KernelRequest(node))(values, (), out)
    return out


# --- infer ------------------------------------------------------------------------------------

def test_infer_types():
    assert infer("gather", G, T("ND", [4, 2]), I("J", [3])) == T("JD", [3, 2])
    assert infer("gather", G, T("BN", [2, 3]), I("BJ", [2, 2])) == T("BJ", [2, 2])
    assert infer("gather", G, T("BND", ["B", 7, 2], "floating"), I("JB", [5, "B"])) \
        == T("BJD", ["B", 5, 2], "floating")
    assert infer("gather", G, T("N", [4], "boolean"), I("J", [1])) == T("J", [1], "boolean")
    assert infer("scatter", SC, T("ND", [4, 2]), I("J", [2]), T("JD", [2, 2])) == T("ND", [4, 2])
    at = {"table_axis": "V", "output_axes": ["D", "B", "S"]}
    assert infer("lookup", at, T("VD", [5, 2]), I("BS", ["B", 3])) == T("DBS", [2, "B", 3])
    assert infer("lookup", {"table_axis": "V", "output_axes": ["D"]}, T("VD", [5, 2]), I("", [])) \
        == T("D", [2])
    # indices may reuse the table axis' name: it names an index axis then
    assert infer("lookup", {"table_axis": "V", "output_axes": ["V", "D"]}, T("VD", [5, 2]),
                 I("V", [3])) == T("VD", [3, 2])


@pytest.mark.parametrize("name, attributes, types, code, path, needle", [
    ("gather", {**G, "axis": "Z"}, [T("ND", [4, 2]), I("J", [3])], "atom_attributes",
     ".attributes.axis", "'Z'"),
    ("gather", {**G, "index_axis": 3}, [T("ND", [4, 2]), I("J", [3])], "atom_attributes",
     ".attributes.index_axis", "axis name"),
    ("gather", {**G, "index_axis": "K"}, [T("ND", [4, 2]), I("J", [3])], "atom_attributes",
     ".attributes.index_axis", "no axis 'K'"),
    ("gather", {**G, "index_axis": "D"}, [T("ND", [4, 2]), I("D", [2])], "atom_attributes",
     ".attributes.index_axis", "lacks"),
    ("gather", G, [T("N", [4]), T("J", [3])], "type_mismatch", ".input_slots[1]", "int64"),
    ("gather", G, [T("N", [4], "int64"), I("J", [3])], "type_mismatch", ".input_slots[0]", "int64"),
    ("gather", G, [T("N", [4]), T("J", [3], "int64", "e")], "type_mismatch", ".input_slots[1]", "domain"),
    ("gather", G, [T("N", [4]), I("PJ", [2, 2])], "type_mismatch", ".input_slots[1]", "'P'"),
    ("gather", G, [T("N", [4]), I("NJ", [4, 2])], "type_mismatch", ".input_slots[1]", "'N'"),
    ("gather", G, [T("BN", [2, 4]), I("BJ", [3, 2])], "type_mismatch", ".input_slots[1]", "3 and 2"),
    ("scatter", {**SC, "mode": "add"}, [T("ND", [4, 2]), I("J", [2]), T("JD", [2, 2])],
     "atom_attributes", ".attributes.mode", "'add'"),
    ("scatter", SC, [T("ND", [4, 2]), I("J", [2]), T("JD", [2, 3])], "type_mismatch",
     ".input_slots[2]", "differ"),
    ("scatter", SC, [T("ND", [4, 2]), I("J", [2]), T("DJ", [2, 2])], "type_mismatch",
     ".input_slots[2]", "['J', 'D']"),
    ("scatter", SC, [T("ND", [4, 2]), I("J", [2]), T("JD", [2, 2], "float64")], "type_mismatch",
     ".input_slots[2]", "float64"),
    ("scatter", SC, [T("ND", [4, 2], "int64"), I("J", [2]), T("JD", [2, 2], "int64")], "type_mismatch",
     ".input_slots[0]", "int64"),
    ("lookup", {"table_axis": "Z", "output_axes": ["B", "D"]}, [T("VD", [5, 2]), I("B", [3])],
     "atom_attributes", ".attributes.table_axis", "'Z'"),
    ("lookup", {"table_axis": "V", "output_axes": ["B", "V"]}, [T("VD", [5, 2]), I("B", [3])],
     "atom_attributes", ".attributes.output_axes", "permutation"),
    ("lookup", {"table_axis": "V", "output_axes": ["B", "B"]}, [T("VD", [5, 2]), I("B", [3])],
     "atom_attributes", ".attributes.output_axes", "repeat"),
    ("lookup", {"table_axis": "V", "output_axes": ["B", "D"]}, [T("VD", [5, 2], "int64"), I("B", [3])],
     "type_mismatch", ".input_slots[0]", "floating"),
    ("lookup", {"table_axis": "V", "output_axes": ["B", "D"]}, [T("VD", [5, 2], "boolean"), I("B", [3])],
     "type_mismatch", ".input_slots[0]", "floating"),
    ("lookup", {"table_axis": "V", "output_axes": ["B", "D"]}, [T("VD", [5, 2]), T("B", [3])],
     "type_mismatch", ".input_slots[1]", "int64"),
    ("lookup", {"table_axis": "V", "output_axes": ["D"]}, [T("VD", [5, 2]), I("D", [2])],
     "type_mismatch", ".input_slots[1]", "disjoint"),
])
def test_infer_errors(name, attributes, types, code, path, needle):
    expect(code, INS + path, infer, name, attributes, *types, needle=needle)


# --- value checks -------------------------------------------------------------------------------

V42 = (np.arange(8, dtype=np.float32) + 1).reshape(4, 2)


@pytest.mark.parametrize("backend", ["reference", "cpu"])
@pytest.mark.parametrize("bad, needle", [(-1, "= -1 is outside [0, 4)"), (4, "= 4 is outside [0, 4)")])
def test_index_range(backend, bad, needle):
    types = [T("ND", [4, 2]), I("J", [3])]
    idx = np.array([0, bad, 1], np.int64)
    e = expect("index_range", INS + ".input_slots[1]", run, "gather", G, types, [V42, idx], needle=needle)
    assert "indices[J=1]" in e.message and "'N'" in e.message
    # the kernel alone (check skipped) still refuses, and never reads out of bounds
    expect("index_range", INS + ".input_slots[1]", run, "gather", G, types, [V42, idx], backend,
           False, needle=needle)
    lk = {"table_axis": "N", "output_axes": ["J", "D"]}
    expect("index_range", INS + ".input_slots[1]", run, "lookup", lk, types, [V42, idx], backend,
           backend == "reference", needle=needle)
    sc = [T("ND", [4, 2]), I("J", [3]), T("JD", [3, 2])]
    expect("index_range", INS + ".input_slots[1]", run, "scatter", SC, sc,
           [V42, idx, np.zeros((3, 2), np.float32)], backend, backend == "reference", needle=needle)


def test_duplicate_index():
    sc = [T("BN", [2, 4]), I("JB", [3, 2]), T("BJ", [2, 3])]
    upd = np.zeros((2, 3), np.float32)
    base = np.ones((2, 4), np.float32)
    ok = np.array([[0, 3], [1, 2], [3, 0]], np.int64)  # 3 repeats, but at different B
    np.testing.assert_array_equal(run("scatter", SC, sc, [base, ok, upd]),
                                  [[0, 0, 1, 0], [0, 1, 0, 0]])
    dup = np.array([[0, 3], [1, 2], [2, 3]], np.int64)
    e = expect("duplicate_index", INS + ".input_slots[1]", run, "scatter", SC, sc, [base, dup, upd],
               needle="repeat 3 at J=0 and J=2, B=1")
    assert "unique along 'J'" in e.message
    # indices broadcast over a base axis they lack: unique along J is all that is needed
    sc1 = [T("BN", [2, 4]), I("J", [2]), T("BJ", [2, 2])]
    expect("duplicate_index", INS + ".input_slots[1]", run, "scatter", SC, sc1,
           [base, np.array([1, 1], np.int64), np.zeros((2, 2), np.float32)], needle="J=0 and J=1")


# --- reference by hand --------------------------------------------------------------------------

def test_reference_by_hand():
    r = run("gather", G, [T("ND", [4, 2]), I("J", [3])], [V42, np.array([3, 0, 3])])
    np.testing.assert_array_equal(r, [[7, 8], [1, 2], [7, 8]])
    x23 = (np.arange(6, dtype=np.float64) + 1).reshape(2, 3)
    r = run("gather", G, [T("BN", [2, 3], "float64"), I("BJ", [2, 2])],
            [x23, np.array([[2, 0], [1, 1]])])
    np.testing.assert_array_equal(r, [[3, 1], [5, 5]])
    # indices lacking the batch axis are broadcast over it; size-1 axes
    r = run("gather", G, [T("BN", [2, 3], "float64"), I("J", [1])], [x23, np.array([2])])
    np.testing.assert_array_equal(r, [[3], [6]])
    r = run("gather", G, [T("N", [1], "boolean"), I("J", [2])], [np.array([True]), np.array([0, 0])])
    np.testing.assert_array_equal(r, [True, True])
    upd = np.array([[-1, -2], [-3, -4]], np.float32)
    r = run("scatter", SC, [T("ND", [4, 2]), I("J", [2]), T("JD", [2, 2])], [V42, np.array([2, 0]), upd])
    np.testing.assert_array_equal(r, [[-3, -4], [3, 4], [-1, -2], [7, 8]])
    table = (np.arange(10, dtype=np.float32)).reshape(5, 2)
    li = np.array([[4, 0, 1], [1, 1, 3]])
    r = run("lookup", {"table_axis": "V", "output_axes": ["B", "T", "D"]}, [T("VD", [5, 2]), I("BT", [2, 3])],
            [table, li])
    np.testing.assert_array_equal(r, [[[8, 9], [0, 1], [2, 3]], [[2, 3], [2, 3], [6, 7]]])
    r = run("lookup", {"table_axis": "V", "output_axes": ["D", "B", "T"]}, [T("VD", [5, 2]), I("BT", [2, 3])],
            [table, li])
    np.testing.assert_array_equal(r[1], [[9, 1, 3], [3, 3, 7]])
    r = run("lookup", {"table_axis": "V", "output_axes": ["D"]}, [T("DV", [2, 5]), I("", [])],
            [table.T, np.array(3)])
    np.testing.assert_array_equal(r, [6, 7])


@pytest.mark.parametrize("backend", ["cpu", "cuda"])
def test_backends_by_hand(backend):
    r = run("gather", G, [T("ND", [4, 2]), I("J", [3])], [V42, np.array([3, 0, 3])], backend)
    np.testing.assert_array_equal(r, [[7, 8], [1, 2], [7, 8]])
    upd = np.array([[-1, -2], [-3, -4]], np.float32)
    r = run("scatter", SC, [T("ND", [4, 2]), I("J", [2]), T("JD", [2, 2])],
            [V42, np.array([2, 0]), upd], backend)
    np.testing.assert_array_equal(r, [[-3, -4], [3, 4], [-1, -2], [7, 8]])
    r = run("lookup", {"table_axis": "V", "output_axes": ["D"]}, [T("DV", [2, 4]), I("", [])],
            [V42.T.copy(), np.array(3)], backend)
    np.testing.assert_array_equal(r, [7, 8])


# --- generated cases ------------------------------------------------------------------------------

@st.composite
def indexing_cases(draw, dtypes):
    """(atom, attributes, types, values) of a random valid gather, scatter or lookup."""
    name = draw(st.sampled_from(["gather", "scatter", "lookup"]))
    dtype = draw(st.sampled_from(dtypes if name == "gather" else [d for d in dtypes if d != "boolean"]))
    rank = draw(st.integers(1, 3))
    shape = draw(st.lists(st.integers(1, 4), min_size=rank, max_size=rank))
    axes = list("ABC"[:rank])
    rng = np.random.default_rng(draw(st.integers(0, 2**16)))
    value_type = T(axes, shape, dtype)
    value = rng.standard_normal(shape).astype(numpy_dtype(dtype)) if dtype != "boolean" \
        else rng.random(shape) < 0.5
    axis = draw(st.sampled_from(axes))
    n = shape[axes.index(axis)]
    if name == "lookup":
        iaxes = draw(st.lists(st.sampled_from("XY"), unique=True, max_size=2))
        ishape = [draw(st.integers(1, 3)) for _ in iaxes]
        idx = rng.integers(0, n, ishape).astype(np.int64)
        others = [a for a in axes if a != axis]
        out_axes = list(draw(st.permutations(iaxes + others)))
        return name, {"table_axis": axis, "output_axes": out_axes}, [value_type, I(iaxes, ishape)], [value, idx]
    kept = [a for a in axes if a != axis and draw(st.booleans())]
    iaxes = list(draw(st.permutations(kept + ["J"])))
    j = draw(st.integers(1, n if name == "scatter" else 4))
    ishape = [j if a == "J" else shape[axes.index(a)] for a in iaxes]
    if name == "gather":
        idx = rng.integers(0, n, ishape).astype(np.int64)
        return name, {"axis": axis, "index_axis": "J"}, [value_type, I(iaxes, ishape)], [value, idx]
    p = iaxes.index("J")
    rows = int(np.prod(ishape)) // j
    perms = np.stack([rng.permutation(n)[:j] for _ in range(rows)])  # unique along J per row
    moved = [ishape[k] for k in range(len(ishape)) if k != p] + [j]
    idx = np.moveaxis(perms.reshape(moved), -1, p).astype(np.int64)
    out_axes = ["J" if a == axis else a for a in axes]
    out_shape = [j if a == "J" else shape[axes.index(a)] for a in out_axes]
    updates = rng.standard_normal(out_shape).astype(numpy_dtype(dtype))
    return (name, {"axis": axis, "index_axis": "J", "mode": "replace"},
            [value_type, I(iaxes, ishape), T(out_axes, out_shape, dtype)], [value, idx, updates])


def _strided(draw, x):
    kind = draw(st.sampled_from(["c", "fortran", "reversed", "readonly"]))
    if x.ndim == 0:
        kind = "readonly" if kind != "c" else kind
    if kind == "fortran":
        return np.asfortranarray(x)
    if kind == "reversed":
        return np.flip(np.flip(x, 0).copy(), 0)
    y = x.copy()
    y.flags.writeable = kind != "readonly"
    return y


def _check(data, backend, dtypes):
    name, attributes, types, values = data.draw(indexing_cases(dtypes))
    if backend == "cpu":
        values = [_strided(data.draw, v) for v in values]
    before = [v.copy() for v in values]
    want = run(name, attributes, types, values)
    got = run(name, attributes, types, values, backend)
    np.testing.assert_array_equal(got, want)
    for v, b in zip(values, before):
        np.testing.assert_array_equal(v, b)


@settings(deadline=None, max_examples=120)
@given(st.data())
def test_cpu_matches_reference(data):
    _check(data, "cpu", ("float32", "float64", "boolean"))


@settings(deadline=None, max_examples=12)
@given(st.data())
def test_cuda_matches_reference(data):
    _check(data, "cuda", ("float32", "boolean"))


@settings(deadline=None, max_examples=60)
@given(st.data())
def test_cpu_parallel_kernel_matches_reference(data):
    from unittest import mock

    import atoms._copy as copy

    with mock.patch.object(copy, "PARALLEL_MIN_ELEMENTS", 1):  # every case on the prange kernel
        _check(data, "cpu", ("float32", "float64", "boolean"))


@pytest.mark.parametrize("layout", ["c", "table transposed"])
def test_large_lookup_gather_scatter_take_the_row_copy_and_parallel_paths(layout):
    from atoms._copy import PARALLEL_MIN_ELEMENTS

    rng = np.random.default_rng(3)
    table = rng.standard_normal((300, 512)).astype(np.float32)
    if layout != "c":
        table = np.asfortranarray(table)  # rows are no longer unit-stride: the strided row loop
    ids = rng.integers(0, 300, (2, 200))
    types = [T("VD", [300, 512]), I("XY", [2, 200])]
    attrs_ = {"table_axis": "V", "output_axes": ["X", "Y", "D"]}
    got = run("lookup", attrs_, types, [table, ids], "cpu")
    assert got.size >= PARALLEL_MIN_ELEMENTS
    np.testing.assert_array_equal(got, table[ids])
    idx = rng.integers(0, 512, (300, 400))  # the index varies along the innermost axis
    got = run("gather", {"axis": "D", "index_axis": "J"}, [T("VD", [300, 512]), I("VJ", [300, 400])],
              [table, idx], "cpu")
    np.testing.assert_array_equal(got, np.take_along_axis(table, idx, axis=1))
    rows = np.stack([rng.permutation(300)[:200] for _ in range(512)], axis=1)  # unique per column
    upd = rng.standard_normal((200, 512)).astype(np.float32)
    got = run("scatter", SC | {"axis": "V"}, [T("VD", [300, 512]), I("JD", [200, 512]), T("JD", [200, 512])],
              [table, rows, upd], "cpu")
    want = table.copy()
    np.put_along_axis(want, rows, upd, axis=0)
    np.testing.assert_array_equal(got, want)
