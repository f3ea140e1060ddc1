"""reshape, permute, broadcast, slice, concat: infer rules and errors, reference values by hand,
cpu and cuda (simulator) against the reference on generated shapes, layouts and dtypes."""
from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

from atoms.layout import SPECS, coalesce, flat_view
from runtime.plugins.atomspec import InferContext, bind_node
from runtime.plugins.kernel import KernelRequest
from runtime.core.errors import FormulaError
from runtime.core.types import TensorType, numpy_dtype

SPEC = {s.name: s for s in SPECS}
INS = "$.instructions[3]"
DTYPES = ("float32", "float64", "int64", "boolean")


def T(axes, sizes, dtype="float32", domain="d"):
    return TensorType(tuple(axes), tuple(sizes), dtype, domain)


def infer(name, attributes, *types, dims=None):
    ctx = InferContext(SPEC[name], INS, attributes, types, [f"s{k}" for k in range(len(types))], dims)
    return SPEC[name].infer(ctx)


def expect(code, path, fn, *args, needle="", **kw):
    with pytest.raises(FormulaError) as info:
        fn(*args, **kw)
    assert info.value.code == code, info.value
    assert info.value.path == path, info.value
    assert needle in info.value.message, info.value
    return info.value


def run(name, attributes, types, values, backend="reference"):
    node = bind_node(SPEC[name], attributes, types)
    out = np.empty(node.output_type.shape, dtype=numpy_dtype(node.output_type.dtype))
    if backend == "cuda":
        from numba import cuda

        dev = cuda.device_array(out.shape, dtype=out.dtype)
        node.atom.kernels["cuda"](KernelRequest(node))([cuda.to_device(np.ascontiguousarray(v)) for v in values], (), dev)
        return dev.copy_to_host()
    out.fill(0)
    node.atom.kernels[backend](KernelRequest(node))(values, (), out)
    return out


def values_of(t: TensorType, seed: int = 0) -> np.ndarray:
    rng = np.random.default_rng(seed)
    shape = t.shape
    if t.dtype == "boolean":
        return np.asarray(rng.random(shape) < 0.5)
    if t.dtype == "int64":
        return np.asarray(rng.integers(-50, 50, shape), dtype=np.int64)
    return np.asarray(rng.standard_normal(shape), dtype=numpy_dtype(t.dtype))


# --- infer ------------------------------------------------------------------------------------

def test_reshape_infer_static_and_symbolic():
    assert infer("reshape", {"output_axes": ["P", "Q"], "output_sizes": [3, 2]}, T("NM", [2, 3])) \
        == T("PQ", [3, 2])
    v = T("BSD", ["B", "S", 8], "floating")
    # load time: undecidable, accepted with the symbol as declared
    assert infer("reshape", {"output_axes": ["T", "D"], "output_sizes": ["T", 8]}, v).sizes == ("T", 8)
    # common symbols cancel, so the rest is checked at load
    assert infer("reshape", {"output_axes": ["B", "S", "H", "E"], "output_sizes": ["B", "S", 2, 4]},
                 v).sizes == ("B", "S", 2, 4)
    # planning: concrete operand, known symbols resolve, the one unknown is inferred
    r = T("BSD", [2, 3, 8])
    assert infer("reshape", {"output_axes": ["T", "D"], "output_sizes": ["T", 8]}, r,
                 dims={"B": 2, "S": 3}).sizes == (6, 8)
    assert infer("reshape", {"output_axes": ["B", "X"], "output_sizes": ["B", "X"]}, r,
                 dims={"B": 2, "S": 3}).sizes == (2, 24)
    assert infer("reshape", {"output_axes": [], "output_sizes": []}, T("A", [1])).sizes == ()
    assert infer("reshape", {"output_axes": ["A"], "output_sizes": [1]}, T("", [])).sizes == (1,)


@pytest.mark.parametrize("attributes, types, dims, code, path, needle", [
    ({"output_axes": ["P"], "output_sizes": [5]}, [T("NM", [2, 3])], None,
     "type_mismatch", ".input_slots[0]", "6 vs 5"),
    ({"output_axes": ["B", "S", "E"], "output_sizes": ["B", "S", 4]}, [T("BSD", ["B", "S", 6])], None,
     "type_mismatch", ".input_slots[0]", "6 vs 4"),
    ({"output_axes": ["X", "E"], "output_sizes": ["X", 4]}, [T("ND", [2, 3])], None,
     "type_mismatch", ".input_slots[0]", "not a multiple of 4"),
    ({"output_axes": ["X"], "output_sizes": [4]}, [T("NM", ["N", 3])], None,
     "type_mismatch", ".input_slots[0]", "not a multiple of 3"),
    ({"output_axes": ["X", "Y"], "output_sizes": ["X", "Y"]}, [T("NM", [2, 3])], {"N": 2},
     "type_mismatch", ".attributes.output_sizes", "at most one"),
    ({"output_axes": ["X", "Y"], "output_sizes": ["X", 4]}, [T("NM", [2, 3])], {"N": 2},
     "type_mismatch", ".input_slots[0]", "not a multiple of 4"),
    ({"output_axes": ["X", "Y"], "output_sizes": [3, "N"]}, [T("NM", [2, 3])], {"N": 3},
     "type_mismatch", ".input_slots[0]", "6 vs 9"),
    ({"output_axes": ["P", "Q"], "output_sizes": [6]}, [T("NM", [2, 3])], None,
     "atom_attributes", ".attributes.output_sizes", "2 axes"),
    ({"output_axes": ["P", "Q"], "output_sizes": [6, 0]}, [T("NM", [2, 3])], None,
     "atom_attributes", ".attributes.output_sizes[1]", "positive"),
    ({"output_axes": ["P", "Q"], "output_sizes": [6, True]}, [T("NM", [2, 3])], None,
     "atom_attributes", ".attributes.output_sizes[1]", "True"),
    ({"output_axes": ["P"], "output_sizes": ["6x"]}, [T("NM", [2, 3])], None,
     "invalid_name", ".attributes.output_sizes[0]", "6x"),
    ({"output_axes": ["P", "1Q"], "output_sizes": [6, 1]}, [T("NM", [2, 3])], None,
     "invalid_name", ".attributes.output_axes[1]", "1Q"),
    ({"output_axes": ["P", "P"], "output_sizes": [6, 1]}, [T("NM", [2, 3])], None,
     "atom_attributes", ".attributes.output_axes", "repeat"),
    ({"output_axes": "P", "output_sizes": [6]}, [T("NM", [2, 3])], None,
     "atom_attributes", ".attributes.output_axes", "list"),
    ({"output_axes": ["P"], "output_sizes": 6}, [T("NM", [2, 3])], None,
     "atom_attributes", ".attributes.output_sizes", "list"),
])
def test_reshape_errors(attributes, types, dims, code, path, needle):
    expect(code, INS + path, infer, "reshape", attributes, *types, dims=dims, needle=needle)


def test_permute_broadcast_infer():
    assert infer("permute", {"output_axes": ["M", "N"]}, T("NM", ["N", 3])) == T("MN", [3, "N"])
    assert infer("broadcast", {"output_axes": ["P", "N", "M"], "output_sizes": [2, 4, 3]},
                 T("NM", [1, 3])) == T("PNM", [2, 4, 3])
    # axes by name: reordering is allowed; symbols may be expanded to or kept
    assert infer("broadcast", {"output_axes": ["M", "B", "N"], "output_sizes": [3, "B", "N"]},
                 T("NM", ["N", 3])).sizes == (3, "B", "N")
    assert infer("broadcast", {"output_axes": ["N"], "output_sizes": [5]}, T("N", ["S"])).sizes == (5,)


@pytest.mark.parametrize("name, attributes, types, code, path, needle", [
    ("permute", {"output_axes": ["M"]}, [T("NM", [2, 3])], "atom_attributes", ".attributes.output_axes",
     "permutation"),
    ("permute", {"output_axes": ["M", "Z"]}, [T("NM", [2, 3])], "atom_attributes",
     ".attributes.output_axes", "'Z'"),
    ("permute", {"output_axes": ["M", "M"]}, [T("NM", [2, 3])], "atom_attributes",
     ".attributes.output_axes", "repeat"),
    ("broadcast", {"output_axes": ["N"], "output_sizes": [4]}, [T("N", [2])], "type_mismatch",
     ".input_slots[0]", "only extent 1"),
    ("broadcast", {"output_axes": ["N"], "output_sizes": [4]}, [T("NM", [1, 3])], "atom_attributes",
     ".attributes.output_axes", "['M']"),
    ("broadcast", {"output_axes": ["N"], "output_sizes": [2]}, [T("N", [3])], "type_mismatch",
     ".input_slots[0]", "3 and 2"),
])
def test_permute_broadcast_errors(name, attributes, types, code, path, needle):
    expect(code, INS + path, infer, name, attributes, *types, needle=needle)


def test_broadcast_symbolic_extent_checked_when_resolved():
    at = {"output_axes": ["N"], "output_sizes": [4]}
    infer("broadcast", at, T("N", ["S"]))  # S may be 4 or 1
    assert infer("broadcast", at, T("N", [1]), dims={"S": 1}).sizes == (4,)
    expect("type_mismatch", INS + ".input_slots[0]", infer, "broadcast", at, T("N", [3]), dims={"S": 3})


@pytest.mark.parametrize("start, stop, step, extent", [
    (0, None, 1, 5), (1, 4, 2, 2), (2, None, 1, 3), (1, 9, 1, 4), (4, None, 3, 1), (0, 5, 2, 3),
    (0, 1, 7, 1), (3, 4, 1, 1),
])
def test_slice_extents(start, stop, step, extent):
    at = {"axis": "N", "start": start, "stop": stop, "step": step}
    assert infer("slice", at, T("MN", [2, 5])) == T("MN", [2, extent])
    assert extent == len(range(5)[start:stop:step])


def test_slice_symbolic_axis_only_full():
    at = {"axis": "N", "start": 0, "stop": None, "step": 1}
    assert infer("slice", at, T("N", ["N"])) == T("N", ["N"])
    for key, value in (("start", 1), ("stop", 3), ("step", 2)):
        expect("atom_attributes", f"{INS}.attributes.{key}", infer, "slice", {**at, key: value},
               T("N", ["N"]), needle="full slice")


@pytest.mark.parametrize("start, stop, step, key, needle", [
    (0, 2, 0, "step", ">= 1"), (3, 0, -1, "step", ">= 1"), (-2, None, 1, "start", ">= 0"),
    (0, -1, 1, "stop", ">= 0"), (3, 3, 1, "stop", "empty"), (7, None, 1, "start", "empty"),
    (5, 9, 1, "start", "empty"), (0.5, 2, 1, "start", "integer"), (True, 2, 1, "start", "boolean"),
    (0, "2", 1, "stop", "string"), (0, 2, 1.0, "step", "number"),
])
def test_slice_errors(start, stop, step, key, needle):
    expect("atom_attributes", f"{INS}.attributes.{key}", infer, "slice",
           {"axis": "N", "start": start, "stop": stop, "step": step}, T("N", [5]), needle=needle)


def test_slice_axis_lacking():
    expect("atom_attributes", f"{INS}.attributes.axis", infer, "slice",
           {"axis": "Z", "start": 0, "stop": 1, "step": 1}, T("N", [5]), needle="'Z'")


def test_concat_infer_and_errors():
    assert infer("concat", {"axis": "N"}, T("NM", [2, "M"]), T("NM", [1, 3])) == T("NM", [3, "M"])
    cases = [
        ({"axis": "Z"}, T("N", [2]), T("N", [3]), "atom_attributes", ".attributes.axis", "'Z'"),
        ({"axis": 1}, T("N", [2]), T("N", [3]), "atom_attributes", ".attributes.axis", "axis name"),
        ({"axis": "N"}, T("NM", [2, 3]), T("NP", [1, 3]), "type_mismatch", ".input_slots[1]", "identical"),
        ({"axis": "N"}, T("NM", [2, 3]), T("MN", [3, 1]), "type_mismatch", ".input_slots[1]", "identical"),
        ({"axis": "N"}, T("NM", [2, 3]), T("NM", [1, 2]), "type_mismatch", ".input_slots[1]", "'M'"),
        ({"axis": "N"}, T("N", ["N"]), T("N", [1]), "type_mismatch", ".input_slots[0]", "static"),
        ({"axis": "N"}, T("N", [2]), T("N", ["K"]), "type_mismatch", ".input_slots[1]", "static"),
        ({"axis": "N"}, T("N", [2]), T("N", [1], "float64"), "type_mismatch", ".input_slots[1]", "float64"),
        ({"axis": "N"}, T("N", [2]), T("N", [1], domain="e"), "type_mismatch", ".input_slots[1]", "domain"),
    ]
    for at, a, b, code, path, needle in cases:
        expect(code, INS + path, infer, "concat", at, a, b, needle=needle)


# --- reference by hand ------------------------------------------------------------------------

X23 = np.array([[0, 1, 2], [3, 4, 5]], np.float32)


def test_reference_by_hand():
    r = run("reshape", {"output_axes": ["P", "Q"], "output_sizes": [3, 2]}, [T("NM", [2, 3])], [X23])
    np.testing.assert_array_equal(r, [[0, 1], [2, 3], [4, 5]])
    r = run("reshape", {"output_axes": ["P"], "output_sizes": [6]}, [T("NM", [2, 3])], [X23.T.copy().T])
    np.testing.assert_array_equal(r, [0, 1, 2, 3, 4, 5])  # C order of the logical value
    r = run("permute", {"output_axes": ["M", "N"]}, [T("NM", [2, 3])], [X23])
    np.testing.assert_array_equal(r, [[0, 3], [1, 4], [2, 5]])
    r = run("broadcast", {"output_axes": ["M", "P", "N"], "output_sizes": [3, 2, 2]},
            [T("NM", [1, 3])], [X23[:1]])
    np.testing.assert_array_equal(r, [[[0, 0], [0, 0]], [[1, 1], [1, 1]], [[2, 2], [2, 2]]])
    r = run("slice", {"axis": "M", "start": 0, "stop": None, "step": 2}, [T("NM", [2, 3])], [X23])
    np.testing.assert_array_equal(r, [[0, 2], [3, 5]])
    r = run("slice", {"axis": "N", "start": 1, "stop": 7, "step": 1}, [T("NM", [2, 3])], [X23])
    np.testing.assert_array_equal(r, [[3, 4, 5]])
    r = run("concat", {"axis": "M"}, [T("NM", [2, 3]), T("NM", [2, 1])],
            [X23, np.array([[9], [8]], np.float32)])
    np.testing.assert_array_equal(r, [[0, 1, 2, 9], [3, 4, 5, 8]])
    b = np.array([[True, False, True]])
    r = run("concat", {"axis": "N"}, [T("NM", [1, 3], "boolean")] * 2, [b, ~b])
    np.testing.assert_array_equal(r, [[True, False, True], [False, True, False]])
    r = run("reshape", {"output_axes": [], "output_sizes": []}, [T("A", [1], "int64")],
            [np.array([7], np.int64)])
    assert r.shape == () and r == 7


@pytest.mark.parametrize("backend", ["cpu", "cuda"])
def test_backends_by_hand(backend):
    """The hand cases once more on the compiled kernels (float32 only: one compile)."""
    r = run("permute", {"output_axes": ["M", "N"]}, [T("NM", [2, 3])], [X23], backend)
    np.testing.assert_array_equal(r, X23.T)
    r = run("concat", {"axis": "M"}, [T("NM", [2, 3]), T("NM", [2, 1])],
            [X23, np.array([[9], [8]], np.float32)], backend)
    np.testing.assert_array_equal(r, [[0, 1, 2, 9], [3, 4, 5, 8]])
    r = run("broadcast", {"output_axes": ["P"], "output_sizes": [3]}, [T("", [])],
            [np.array(2.5, np.float32)], backend)
    np.testing.assert_array_equal(r, [2.5, 2.5, 2.5])


# --- generated cases: cpu and cuda against the reference ---------------------------------------

AXES = "ABCD"


@st.composite
def layout_cases(draw, dtypes=DTYPES):
    """(atom, attributes, operand types) for a random valid instance of one layout atom."""
    name = draw(st.sampled_from(sorted(SPEC)))
    dtype = draw(st.sampled_from(dtypes))
    rank = draw(st.integers(0 if name in ("reshape", "permute", "broadcast") else 1, 3))
    shape = draw(st.lists(st.integers(1, 4), min_size=rank, max_size=rank))
    axes = list(AXES[:rank])
    t = T(axes, shape, dtype)
    if name == "reshape":
        n = int(np.prod(shape))
        sizes = [d for d in (1, 2, 3, 4, 6, 8) if n % d == 0]
        first = draw(st.sampled_from(sizes))
        out = [first, n // first] if draw(st.booleans()) else [n]
        return name, {"output_axes": ["P", "Q"][:len(out)], "output_sizes": out}, [t]
    if name == "permute":
        return name, {"output_axes": draw(st.permutations(axes))}, [t]
    if name == "broadcast":
        small = T(axes, [1 if draw(st.booleans()) else s for s in shape], dtype)
        new = draw(st.lists(st.sampled_from("XYZ"), unique=True, max_size=2))
        out_axes = draw(st.permutations(axes + new))
        sizes = [shape[axes.index(a)] if a in axes else draw(st.integers(1, 3)) for a in out_axes]
        return name, {"output_axes": list(out_axes), "output_sizes": sizes}, [small]
    axis = draw(st.sampled_from(axes))
    if name == "slice":
        n = shape[axes.index(axis)]
        start = draw(st.integers(0, n - 1))
        stop = draw(st.one_of(st.none(), st.integers(start + 1, n + 2)))
        return name, {"axis": axis, "start": start, "stop": stop, "step": draw(st.integers(1, 3))}, [t]
    other = list(shape)
    other[axes.index(axis)] = draw(st.integers(1, 3))
    return name, {"axis": axis}, [t, T(axes, other, dtype)]


@st.composite
def laid_out(draw, x: np.ndarray):
    """``x`` as a caller might pass it: C, Fortran, a negative-stride or strided view, read-only."""
    kind = draw(st.sampled_from(["c", "fortran", "reversed", "strided", "broadcast"]))
    if kind == "fortran" and x.ndim:
        y = np.asfortranarray(x)
    elif kind == "reversed" and x.ndim:
        y = np.flip(np.flip(x, 0).copy(), 0)
    elif kind == "strided" and x.ndim:
        big = np.zeros((2 * x.shape[0],) + x.shape[1:], x.dtype)
        big[::2] = x
        y = big[::2]
    elif kind == "broadcast" and x.ndim and x.shape[0] > 1 and (x == x[:1]).all():
        y = np.broadcast_to(x[:1], x.shape)
    else:
        y = x.copy()
    if draw(st.booleans()):
        y = y.view()
        y.flags.writeable = False
    assert np.array_equal(y, x)
    return y


def _check_against_reference(data, backend, dtypes=DTYPES):
    name, attributes, types = data.draw(layout_cases(dtypes))
    values = [values_of(t, k) for k, t in enumerate(types)]
    if backend == "cpu":
        values = [data.draw(laid_out(v)) for v in values]
    before = [v.copy() for v in values]
    want = run(name, attributes, types, values)
    got = run(name, attributes, types, values, backend)
    assert got.dtype == want.dtype
    np.testing.assert_array_equal(got, want)
    for v, b in zip(values, before):
        np.testing.assert_array_equal(v, b)


@settings(deadline=None, max_examples=120)
@given(st.data())
def test_cpu_matches_reference(data):
    _check_against_reference(data, "cpu")


@settings(deadline=None, max_examples=60)
@given(st.data())
def test_cpu_parallel_copy_matches_reference(data):
    """Every case on the parallel kernel: tasks of consecutive rows, each finding its first
    row's offsets by division and stepping on from there."""
    from unittest import mock

    import atoms._copy as copy

    with mock.patch.object(copy, "PARALLEL_MIN_ELEMENTS", 1):
        _check_against_reference(data, "cpu")


@settings(deadline=None, max_examples=12)
@given(st.data())
def test_cuda_matches_reference(data):
    _check_against_reference(data, "cuda", ("float32", "int64", "boolean"))


def test_cpu_broadcast_input_view_and_float16():
    """A stride-0 caller view, and a dtype that only the bit-level kernels can move."""
    base = np.arange(3, dtype=np.float16)
    view = np.broadcast_to(base, (4, 3))
    types = [T("NM", [4, 3], "float16")]
    at = {"output_axes": ["M", "N"]}
    np.testing.assert_array_equal(run("permute", at, types, [view], "cpu"), view.T)


def test_flat_view_and_coalesce():
    x = np.arange(24, dtype=np.float64).reshape(2, 3, 4)[:, ::-1, ::2]
    flat, origin, strides = flat_view(x)
    assert strides == (12, -4, 2) and flat.dtype == np.uint64
    idx = np.indices(x.shape).reshape(3, -1).T
    got = [flat.view(np.float64)[origin + int(np.dot(i, strides))] for i in idx]
    np.testing.assert_array_equal(got, x.ravel())
    assert coalesce((2, 3, 4), (12, 4, 1), (12, 4, 1)) == ([24], [[1], [1]])
    assert coalesce((2, 1, 4), (4, 0, 1), (1, 0, 2)) == ([2, 4], [[4, 1], [1, 2]])
    assert coalesce((1, 1), (0, 0)) == ([1], [[0]])


@pytest.mark.parametrize("parallel", [False, True])
@pytest.mark.parametrize("dtype", ["float16", "float32", "float64", "int64"])
def test_cpu_copies_count_nan_and_inf_of_checked_operands(monkeypatch, parallel, dtype):
    """Asked to count (``KernelRequest.count_inputs``), the copy counts, by exponent bits, the rows of a checked
    operand that hold a NaN or ±inf; it copies exactly as without counting."""
    import atoms._copy as copy

    monkeypatch.setattr(copy, "PARALLEL_MIN_ELEMENTS", 1 if parallel else 1 << 40)
    cases = [("permute", {"output_axes": ["C", "A", "B"]}, [T("ABC", [3, 5, 7], dtype)]),
             ("concat", {"axis": "B"}, [T("AB", [4, 6], dtype), T("AB", [4, 3], dtype)]),
             ("broadcast", {"output_axes": ["A", "B"], "output_sizes": [5, 6]}, [T("AB", [1, 6], dtype)]),
             ("reshape", {"output_axes": ["P"], "output_sizes": [12]}, [T("AB", [3, 4], dtype)])]
    rng = np.random.default_rng(0)
    for name, attributes, types in cases:
        node = bind_node(SPEC[name], attributes, types)
        values = [values_of(t, k) for k, t in enumerate(types)]
        counting = SPEC[name].kernels["cpu"](KernelRequest(node, count_inputs=tuple(range(len(types)))))
        assert counting.counts.inputs == tuple(range(len(types))), name
        out = np.empty(node.output_type.shape, numpy_dtype(node.output_type.dtype))
        assert counting(values, (), out) == 0, name
        np.testing.assert_array_equal(out, run(name, attributes, types, values))
        if dtype == "int64":
            continue
        for k, v in enumerate(values):
            for bad in (np.nan, np.inf, -np.inf):
                spoiled = [x.copy() for x in values]
                spoiled[k][tuple(rng.integers(0, n) for n in v.shape)] = bad
                assert counting(spoiled, (), out) > 0, (name, k, bad)
                only_other = SPEC[name].kernels["cpu"](
                    KernelRequest(node, count_inputs=tuple(j for j in range(len(types)) if j != k)))
                assert not only_other(spoiled, (), out), (name, k)
    sliced = bind_node(SPEC["slice"], {"axis": "A", "start": 0, "stop": 2, "step": 1}, [T("AB", [3, 4], "float32")])
    assert not SPEC["slice"].kernels["cpu"](KernelRequest(sliced, count_inputs=(0,))).counts.any  # reads part only
