"""§3b indexing atoms: gather@2, scatter@2, segment@1, window@1, axis-index@1 and the legacy
arti/fold@2, arti/unfold@2. Hand-computed values and edge cases, every §3b.2 error code at its
path, and cpu and cuda (simulator) against the reference on generated shapes."""
from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

import runtime
from atoms import all_specs
from runtime.plugins.atomspec import InferContext, bind_node
from runtime.core.errors import FormulaError
from runtime.testing import assert_backends_agree, run_kernel
from runtime.core.types import TensorType, numpy_dtype

from tests.spec.atom_cases import one

SPEC = {ref: s for s in all_specs() for ref in s.refs}
GATHER, SCATTER = "arti/formula-atom-gather@2", "arti/formula-atom-scatter@2"
SEGMENT, WINDOW, AXIS_INDEX = ("arti/formula-atom-segment@1", "arti/formula-atom-window@1",
                               "arti/formula-atom-axis-index@1")
FOLD, UNFOLD = "arti/fold@2", "arti/unfold@2"
INS = "$.instructions[0]"
G = {"axis": "N", "index_axis": "J"}
SA = {**G, "mode": "add", "accumulation_dtype": "float32"}
SEG = {"axis": "N", "segment_axis": "G", "num_segments": 3, "mode": "sum", "accumulation_dtype": "float32"}
WIN = {"axis": "N", "output_axis": "P", "window_axis": "K", "kernel_size": 2, "stride": 1, "dilation": 1,
       "padding": [0, 0], "output_size": None}
FOLD_ATTRS = {**G, "record_schema_ref": "arti/fold-record@1", "state_schema_ref": "arti/fold-state@1"}
UNFOLD_ATTRS = {**G, "mode": "replace", "record_schema_ref": "arti/fold-record@1"}
BACKENDS = ("reference", "cpu", "cuda")
HALF_TOL = {"float16": (2e-3, 1e-3), "float32": (1e-6, 1e-6), "float64": (1e-12, 1e-12)}


def T(axes, sizes, dtype="float32", domain="d"):
    return TensorType(tuple(axes), tuple(sizes), dtype, domain)


def I(axes, sizes):  # noqa: E743
    return T(axes, sizes, "int64")


def B(axes, sizes):
    return T(axes, sizes, "boolean")


def infer(ref, attributes, *types, dims=None, planning=False):
    ctx = InferContext(SPEC[ref], INS, attributes, types, [f"s{k}" for k in range(len(types))], dims,
                       planning=planning)
    return SPEC[ref].infer(ctx)


def expect(code, path, fn, *args, needle="", **kw):
    with pytest.raises(FormulaError) as info:
        fn(*args, **kw)
    assert (info.value.code, info.value.path) == (code, path), info.value
    assert needle in info.value.message, info.value
    return info.value


def run(ref, attributes, types, values, backend="reference"):
    node = bind_node(SPEC[ref], attributes, types)
    if node.atom.check_values is not None:
        node.atom.check_values(node, [v if k in node.atom.checked_inputs else None for k, v in enumerate(values)])
    return run_kernel(SPEC[ref], attributes, types, values, backend)


# --- gather@2 -------------------------------------------------------------------------------------

@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("dtype", ["int64", "boolean", "float16", "float64"])
def test_gather2_payloads_with_repeats(backend, dtype):
    v = (np.arange(8).reshape(4, 2) % 3).astype(numpy_dtype(dtype))
    idx = np.array([3, 3, 0, 3], np.int64)
    got = run(GATHER, G, [T("NM", (4, 2), dtype), I("J", (4,))], [v, idx], backend)
    assert got.dtype == v.dtype
    np.testing.assert_array_equal(got, v[idx])


def test_gather2_types_and_errors():
    assert infer(GATHER, G, T("NM", (4, 2), "int64"), I("J", (3,))) == T("JM", (3, 2), "int64")
    expect("type_mismatch", f"{INS}.input_slots[1]", infer, GATHER, G, T("NM", (4, 2)), I("N", (3,)),
           needle="index_axis")
    expect("type_mismatch", f"{INS}.input_slots[1]", infer, GATHER, {**G, "index_axis": "M"},
           T("NM", (4, 2)), I("J", (3,)), needle="index_axis")
    expect("atom_attributes", f"{INS}.attributes.axis", infer, GATHER, {**G, "axis": "Q"},
           T("NM", (4, 2)), I("J", (3,)))
    expect("type_mismatch", f"{INS}.input_slots[1]", infer, GATHER, G, T("NM", (4, 2)), T("J", (3,)))


@pytest.mark.parametrize("backend", BACKENDS)
def test_gather2_index_range_before_output(backend):
    prog = one("gather@2", [("v", ["N"], [4], "int64"), ("i", ["J"], [2], "int64")], G, ["J"], [2], "int64")
    err = expect("index_range", "$.instructions[0].input_slots[1]", runtime.execute, prog,
                 inputs={"v": np.arange(4), "i": np.array([1, 4])}, banks={}, backend=backend)
    assert "i[J=1] = 4" in err.message or "indices[J=1] = 4" in err.message


# --- scatter@2 ------------------------------------------------------------------------------------

@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("dtype", ["float16", "float32", "float64"])
def test_scatter_add_repeats_accumulate(backend, dtype):
    nd = numpy_dtype(dtype)
    base = np.arange(8).reshape(2, 4).astype(nd)
    idx = np.array([[1, 1, 3], [0, 0, 0]], np.int64)
    upd = np.array([[1, 2, 4], [0.5, 0.25, 0.125]], nd)
    prog = one("scatter@2", [("b", ["B", "N"], [2, 4], dtype), ("i", ["B", "J"], [2, 3], "int64"),
                             ("u", ["B", "J"], [2, 3], dtype)], SA, ["B", "N"], [2, 4], dtype)
    got = execute(prog, {"b": base, "i": idx, "u": upd}, backend)
    assert got.dtype == nd
    want = np.array([[0, 1 + 3, 2, 3 + 4], [4 + 0.875, 5, 6, 7]])
    np.testing.assert_allclose(got.astype(np.float64), want, rtol=HALF_TOL[dtype][0])


def test_scatter_add_half_accumulates_in_float32():
    """2048 + 1 in float16 stays 2048 when every addition rounds; one rounding at the end gives 2050."""
    base = np.zeros(1, np.float16)
    upd = np.ones(2050, np.float16)
    got = run(SCATTER, {**SA, "accumulation_dtype": "activation"},
              [T("N", (1,), "float16"), I("J", (2050,)), T("J", (2050,), "float16")],
              [base, np.zeros(2050, np.int64), upd])
    assert float(got[0]) == 2050.0


def test_scatter_add_errors():
    b, i, u = T("NM", (4, 2)), I("J", (3,)), T("JM", (3, 2))
    expect("atom_attributes", f"{INS}.attributes.mode", infer, SCATTER, {**SA, "mode": "replace"}, b, i, u)
    expect("atom_attributes", f"{INS}.attributes.accumulation_dtype", infer, SCATTER,
           {**SA, "accumulation_dtype": "float16"}, b, i, u)
    expect("type_mismatch", f"{INS}.input_slots[0]", infer, SCATTER, SA, T("NM", (4, 2), "int64"), i,
           T("JM", (3, 2), "int64"))
    expect("type_mismatch", f"{INS}.input_slots[2]", infer, SCATTER, SA, b, i, T("JM", (3, 2), "float64"))
    expect("type_mismatch", f"{INS}.input_slots[2]", infer, SCATTER, SA, b, i, T("JM", (3, 2), domain="e"))
    expect("type_mismatch", f"{INS}.input_slots[2]", infer, SCATTER, SA, b, i, T("MJ", (2, 3)))
    expect("type_mismatch", f"{INS}.input_slots[2]", infer, SCATTER, SA, b, i, T("JM", (2, 2)))
    expect("type_mismatch", f"{INS}.input_slots[1]", infer, SCATTER, SA, b, I("N", (3,)), u)


def test_scatter_add_floating_bindings_of_two_dtypes():
    prog = one("scatter@2", [("b", ["N"], [2], "floating"), ("i", ["J"], [1], "int64"),
                             ("u", ["J"], [1], "floating")], SA, ["N"], [2], "floating")
    ok = runtime.execute(prog, inputs={"b": np.zeros(2), "i": np.array([1]), "u": np.ones(1)}, banks={},
                         backend="reference")
    np.testing.assert_array_equal(ok["%0"], [0.0, 1.0])
    expect("binding_dtype", "$.instructions[0].input_slots[2]", runtime.execute, prog,
           inputs={"b": np.zeros(2, np.float32), "i": np.array([1]), "u": np.ones(1)}, banks={},
           backend="reference")


@pytest.mark.parametrize("base, updates", [("float64", "floating"), ("floating", "float32"),
                                           ("float16", "floating")])
def test_scatter_add_floating_beside_a_float_dtype_is_refused_at_load(base, updates):
    """§3b: updates have exactly the type gather(base, indices) gives; `floating` beside a
    concrete float dtype loaded, then failed at run time (or ran, with the other binding)."""
    prog = one("scatter@2", [("b", ["N"], [2], base), ("i", ["J"], [1], "int64"),
                             ("u", ["J"], [1], updates)], SA, ["N"], [2], base)
    err = expect("type_mismatch", "$.instructions[0].input_slots[2]", runtime.load_program, prog,
                 needle="exactly the type gather(base, indices) gives")
    assert f"dtype {base}, got {updates}" in err.message
    expect("type_mismatch", f"{INS}.input_slots[2]", infer, SCATTER, SA, T("N", (2,), base), I("J", (1,)),
           T("J", (1,), updates))


@pytest.mark.parametrize("dtype", ["float32", "float64"])
@pytest.mark.parametrize("shape", [(50, 300), (40, 3, 7), (9, 1)])
def test_scatter_add_embedding_rows_are_the_reference_bit_for_bit(dtype, shape):
    """An embedding's gradient: base [N, ...], updates [J, ...] with the same trailing axes,
    many repeated indices. cpu takes blocks of contiguous rows (atoms.scatter_add.inner_rows),
    serial and parallel, and adds each element's updates in index order as the reference does;
    a program wider than a block (300 > INNER_BLOCK columns) splits across workers."""
    from atoms import scatter_add

    nd = numpy_dtype(dtype)
    rng = np.random.default_rng(len(shape))
    n, rest = shape[0], list(shape[1:])
    j = 700
    base = rng.standard_normal(shape).astype(nd)
    idx = rng.integers(0, n, j)
    idx[::3] = 4  # a hot row: hundreds of additions in one place
    upd = rng.standard_normal((j, *rest)).astype(nd)
    axes = ["M", "E"][:len(rest)]
    prog = one("scatter@2", [("b", ["N", *axes], list(shape), dtype), ("i", ["J"], [j], "int64"),
                             ("u", ["J", *axes], [j, *rest], dtype)], SA, ["N", *axes], list(shape), dtype)
    want = execute(prog, {"b": base, "i": idx, "u": upd}, "reference")
    taken = []
    for threshold in (1 << 30, 1):  # serial, then parallel twins
        with pytest.MonkeyPatch.context() as mp:
            mp.setattr("atoms._rows.PARALLEL_MIN_ELEMENTS", threshold)
            mp.setattr(scatter_add, "inner_rows", lambda r, inner=scatter_add.inner_rows: taken.append(inner(r))
                       or taken[-1])
            got = execute(prog, {"b": base, "i": idx, "u": upd}, "cpu")
        np.testing.assert_array_equal(got, want)
    assert taken == [True, True]


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("width", [None, 3])  # (rows of width 3: cpu's blocks of contiguous rows)
def test_scatter_add_index_range(backend, width):
    extra = [] if width is None else ["M"]
    sizes = [] if width is None else [width]
    prog = one("scatter@2", [("b", ["N", *extra], [2, *sizes], "float32"), ("i", ["J"], [2], "int64"),
                             ("u", ["J", *extra], [2, *sizes], "float32")], SA, ["N", *extra], [2, *sizes])
    for bad in (-1, 2):
        expect("index_range", "$.instructions[0].input_slots[1]", runtime.execute, prog,
               inputs={"b": np.zeros((2, *sizes), np.float32), "i": np.array([0, bad]),
                       "u": np.ones((2, *sizes), np.float32)}, banks={}, backend=backend)


# --- fold / unfold --------------------------------------------------------------------------------

@pytest.mark.parametrize("backend", BACKENDS)
def test_fold_unfold_are_gather_and_scatter(backend):
    v = np.arange(8, dtype=np.float32).reshape(4, 2)
    idx = np.array([2, 0], np.int64)
    np.testing.assert_array_equal(run(FOLD, FOLD_ATTRS, [T("NM", (4, 2)), I("J", (2,))], [v, idx], backend),
                                  v[idx])
    u = -np.ones((2, 2), np.float32)
    want = v.copy()
    want[idx] = u
    got = run(UNFOLD, UNFOLD_ATTRS, [T("NM", (4, 2)), I("J", (2,)), T("JM", (2, 2))], [v, idx, u], backend)
    np.testing.assert_array_equal(got, want)


def test_fold_unfold_errors():
    v, i = T("NM", (4, 2)), I("J", (2,))
    for key in ("record_schema_ref", "state_schema_ref"):
        expect("atom_attributes", f"{INS}.attributes.{key}", infer, FOLD, {**FOLD_ATTRS, key: "arti/x@1"}, v, i)
    expect("type_mismatch", f"{INS}.input_slots[0]", infer, FOLD, FOLD_ATTRS, T("NM", (4, 2), "int64"), i)
    expect("atom_attributes", f"{INS}.attributes.mode", infer, UNFOLD, {**UNFOLD_ATTRS, "mode": "add"}, v, i,
           T("JM", (2, 2)))
    node = bind_node(SPEC[UNFOLD], UNFOLD_ATTRS, [v, i, T("JM", (2, 2))])
    expect("duplicate_index", "$.instructions[0].input_slots[1]", node.atom.check_values, node,
           [None, np.array([1, 1]), None])


# --- segment@1 ------------------------------------------------------------------------------------

SEG_V = np.array([[1.0, 2.0, 3.0, 4.0, 5.0], [6.0, -7.0, 8.0, 9.0, 10.0]])
SEG_IDS = np.array([0, 2, 0, -7, 99], np.int64)  # the last two are inactive: their ids are ignored
SEG_MASK = np.array([True, True, True, False, False])
SEG_WANT = {"sum": [[4, 0, 2], [14, 0, -7]], "mean": [[2, 0, 2], [7, 0, -7]], "amax": [[3, 0, 2], [8, 0, -7]]}


def execute(prog, inputs, backend):
    """The one output of ``runtime.execute`` on ``backend``."""
    (out,) = runtime.execute(prog, inputs=inputs, banks={}, backend=backend).values()
    return out


def _segment(mode, dtype, backend):
    out = (["B", "N"], [2, 5]) if mode == "softmax" else (["B", "G"], [2, 3])
    prog = one("segment", [("v", ["B", "N"], [2, 5], dtype), ("s", ["N"], [5], "int64"),
                           ("m", ["N"], [5], "boolean")], {**SEG, "mode": mode}, *out, dtype)
    inputs = {"v": SEG_V.astype(numpy_dtype(dtype)), "s": SEG_IDS, "m": SEG_MASK}
    got = execute(prog, inputs, backend)
    assert got.dtype == numpy_dtype(dtype)
    return got


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("dtype", ["float16", "float32", "float64"])
@pytest.mark.parametrize("mode", ["sum", "mean", "amax", "softmax"])
def test_segment_values_empty_groups_inactive_ids(mode, dtype, backend):
    got = _segment(mode, dtype, backend).astype(np.float64)
    if mode == "softmax":
        e = np.exp([[1 - 3, 3 - 3], [6 - 8, 8 - 8]])
        want = np.zeros((2, 5))
        want[:, [0, 2]] = e / e.sum(axis=1, keepdims=True)
        want[:, 1] = 1.0
    else:
        want = np.array(SEG_WANT[mode], np.float64)
    np.testing.assert_allclose(got, want, rtol=HALF_TOL[dtype][0], atol=HALF_TOL[dtype][1])
    if mode != "softmax":
        assert not np.signbit(got[:, 1]).any()  # an empty group is +0


@pytest.mark.parametrize("backend", BACKENDS)
def test_segment_active_id_out_of_range(backend):
    prog = one("segment", [("v", ["N"], [3], "float32"), ("s", ["N"], [3], "int64"), ("m", ["N"], [3], "boolean")],
               SEG, ["G"], [3])
    ok = {"v": np.ones(3, np.float32), "s": np.array([0, 5, 1]), "m": np.array([True, False, True])}
    np.testing.assert_array_equal(runtime.execute(prog, inputs=ok, banks={}, backend=backend)["%0"], [1, 1, 0])
    err = expect("index_range", "$.instructions[0].input_slots[1]", runtime.execute, prog,
                 inputs={**ok, "m": np.array([True, True, True])}, banks={}, backend=backend)
    assert "N=1" in err.message and "5" in err.message


def test_segment_types_and_errors():
    v, s, m = T("BN", (2, 5)), I("N", (5,)), B("N", (5,))
    assert infer(SEGMENT, SEG, v, s, m) == T("BG", (2, 3))
    assert infer(SEGMENT, {**SEG, "mode": "softmax"}, v, I("BN", (1, 5)), B("B", (2,))) == v
    at = lambda k: f"{INS}.attributes.{k}"  # noqa: E731
    expect("atom_attributes", at("axis"), infer, SEGMENT, {**SEG, "axis": "Q"}, v, s, m)
    expect("atom_attributes", at("segment_axis"), infer, SEGMENT, {**SEG, "segment_axis": "B"}, v, s, m)
    expect("atom_attributes", at("segment_axis"), infer, SEGMENT, {**SEG, "segment_axis": "1x"}, v, s, m)
    expect("atom_attributes", at("num_segments"), infer, SEGMENT, {**SEG, "num_segments": 0}, v, s, m)
    expect("atom_attributes", at("num_segments"), infer, SEGMENT, {**SEG, "num_segments": True}, v, s, m)
    expect("atom_attributes", at("num_segments"), infer, SEGMENT, {**SEG, "num_segments": 1 << 70}, v, s, m)
    expect("atom_attributes", at("mode"), infer, SEGMENT, {**SEG, "mode": "max"}, v, s, m)
    expect("atom_attributes", at("accumulation_dtype"), infer, SEGMENT, {**SEG, "accumulation_dtype": 1}, v, s, m)
    slot = lambda k: f"{INS}.input_slots[{k}]"  # noqa: E731
    expect("type_mismatch", slot(0), infer, SEGMENT, SEG, T("BN", (2, 5), "int64"), s, m)
    expect("type_mismatch", slot(1), infer, SEGMENT, SEG, v, T("N", (5,)), m)
    expect("type_mismatch", slot(1), infer, SEGMENT, SEG, v, I("B", (2,)), m, needle="segmented axis")
    expect("type_mismatch", slot(1), infer, SEGMENT, SEG, v, I("N", (1,)), m, needle="same declared extent")
    expect("type_mismatch", slot(1), infer, SEGMENT, SEG, v, I("NQ", (5, 1)), m)
    expect("type_mismatch", slot(1), infer, SEGMENT, SEG, v, I("BN", (3, 5)), m)
    expect("type_mismatch", slot(2), infer, SEGMENT, SEG, v, s, T("N", (5,)))
    expect("type_mismatch", slot(2), infer, SEGMENT, SEG, v, s, B("N", (4,)))


def test_segment_scratch_in_working_set():
    prog = one("segment", [("v", ["N"], [3], "float32"), ("s", ["N"], [3], "int64"), ("m", ["N"], [3], "boolean")],
               {**SEG, "num_segments": 1000}, ["G"], [1000])
    plan = runtime.compile(prog, backend="cpu").plan({})
    assert plan.scratch_bytes >= 1000 * 8 * 2
    assert plan.working_bytes == plan.binding_bytes + plan.arena_bytes + plan.output_bytes + plan.scratch_bytes


# --- window@1 -------------------------------------------------------------------------------------

@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("dtype", ["float16", "float32", "float64", "int64", "boolean"])
def test_window_padding_dilation_stride(backend, dtype):
    v = np.array([[1, 2, 3, 4, 5], [1, 0, 1, 0, 1]]).T.astype(numpy_dtype(dtype))  # axes N, B
    attrs = {**WIN, "stride": 2, "dilation": 2, "padding": [1, 1]}  # P = (5+2-2-1)//2 + 1 = 3
    got = run(WINDOW, attrs, [T("NB", (5, 2), dtype)], [v], backend)
    assert got.shape == (3, 2, 2) and got.dtype == v.dtype
    src = [[-1, 1], [1, 3], [3, 5]]  # p·S − L + k·D
    want = np.array([[[v[i, b] if 0 <= i < 5 else 0 for b in range(2)] for i in row] for row in src])
    np.testing.assert_array_equal(got, want.astype(v.dtype))


def test_window_types_and_errors():
    v = T("BN", (2, 5))
    assert infer(WINDOW, WIN, v) == T(("B", "P", "K"), (2, 4, 2))
    assert infer(WINDOW, {**WIN, "output_size": 4}, v).sizes == (2, 4, 2)
    assert infer(WINDOW, {**WIN, "output_size": "W"}, v).sizes == (2, "W", 2)
    assert infer(WINDOW, {**WIN, "output_size": "W"}, T("BN", (2, "S"))).sizes == (2, "W", 2)
    at = lambda k: f"{INS}.attributes.{k}"  # noqa: E731
    for key, bad in (("output_axis", "B"), ("window_axis", "N"), ("window_axis", "P"), ("output_axis", 3),
                     ("kernel_size", 0), ("stride", 1.0), ("dilation", True), ("padding", [1]),
                     ("padding", [0, -1]), ("padding", [True, 0]), ("padding", [1 << 70, 0]),
                     ("stride", 1 << 70), ("output_size", 2.5), ("output_size", True),
                     ("output_size", "9a"), ("output_size", 0), ("axis", "Q")):
        expect("atom_attributes", at(key), infer, WINDOW, {**WIN, key: bad}, v)
    expect("atom_attributes", at("kernel_size"), infer, WINDOW, {**WIN, "kernel_size": 6}, v, needle="no window")
    expect("type_mismatch", INS, infer, WINDOW, {**WIN, "output_size": 3}, v)
    expect("atom_attributes", at("output_size"), infer, WINDOW, WIN, T("BN", (2, "S")))


@pytest.mark.parametrize("backend", BACKENDS)
def test_window_symbolic_extent_at_run_time(backend):
    prog = one("window", [("v", ["N"], ["S"], "float32")], {**WIN, "output_size": "W"}, ["P", "K"], ["W", 2])
    exe = runtime.compile(prog, backend=backend)
    out = exe.run(inputs={"v": np.arange(4, dtype=np.float32)}, banks={})["%0"]
    np.testing.assert_array_equal(out, [[0, 1], [1, 2], [2, 3]])
    expect("binding_shape", "$.instructions[0].attributes.output_size", exe.run,
           inputs={"v": np.arange(1, dtype=np.float32)}, banks={})
    fixed = one("window", [("v", ["N"], ["S"], "float32")], {**WIN, "output_size": 3}, ["P", "K"], [3, 2])
    expect("binding_shape", "$.instructions[0].attributes.output_size", runtime.execute, fixed,
           inputs={"v": np.arange(5, dtype=np.float32)}, banks={}, backend=backend)
    # W is also the extent of input u: one symbol, two extents
    from tests.spec.builders import ProgramBuilder

    b = ProgramBuilder()
    b.input("v", ["N"], ["S"])
    b.input("u", ["P"], ["W"])
    b.op("window", ["v"], {**WIN, "output_size": "W"}, ["P", "K"], ["W", 2])
    expect("symbol_conflict", "$.instructions[0].attributes.output_size", runtime.execute, b.build(),
           inputs={"v": np.arange(5, dtype=np.float32), "u": np.zeros(3, np.float32)}, banks={},
           backend=backend)


# --- axis-index@1 ---------------------------------------------------------------------------------

@pytest.mark.parametrize("backend", BACKENDS)
def test_axis_index(backend):
    got = run(AXIS_INDEX, {"axis": "N"}, [T("BN", (2, 5), "boolean")], [np.zeros((2, 5), bool)], backend)
    assert got.dtype == np.int64
    np.testing.assert_array_equal(got, np.arange(5))
    assert infer(AXIS_INDEX, {"axis": "N"}, T("BN", (2, "S"), "float16", "e")) == T("N", ("S",), "int64", "e")
    expect("atom_attributes", f"{INS}.attributes.axis", infer, AXIS_INDEX, {"axis": "Q"}, T("N", (2,)))


# --- backends agree on generated shapes -------------------------------------------------------------

@st.composite
def cases(draw, dtypes):
    """A random §3b indexing instruction over 1-3 axes of extents 1-4."""
    rng = np.random.default_rng(draw(st.integers(0, 2 ** 16)))
    rank = draw(st.integers(1, 3))
    axes = list("ABC"[:rank])
    shape = [draw(st.integers(1, 4)) for _ in axes]
    axis = draw(st.sampled_from(axes))
    n = shape[axes.index(axis)]
    kind = draw(st.sampled_from(["gather", "scatter", "segment", "window"]))
    dtype = draw(st.sampled_from(dtypes if kind in ("gather", "window") else
                                 [d for d in dtypes if d.startswith("float")] or ["float32"]))
    value = rng.standard_normal(shape).astype(numpy_dtype(dtype))
    vt = T(axes, shape, dtype)
    others = [a for a in axes if a != axis]
    if kind in ("gather", "scatter"):
        keep = [a for a in others if draw(st.booleans())]
        iaxes = keep + ["J"]
        j = draw(st.integers(1, 4))
        ishape = [shape[axes.index(a)] for a in keep] + [j]
        idx = rng.integers(0, n, ishape).astype(np.int64)
        if kind == "gather":
            return GATHER, G | {"axis": axis}, [vt, I(iaxes, ishape)], [value, idx]
        ut = T(["J" if a == axis else a for a in axes], [j if a == axis else s for a, s in zip(axes, shape)], dtype)
        upd = rng.standard_normal(ut.shape).astype(value.dtype)
        return SCATTER, SA | {"axis": axis}, [vt, I(iaxes, ishape), ut], [value, idx, upd]
    if kind == "segment":
        count = draw(st.integers(1, 3))
        iaxes = [a for a in axes if a == axis or draw(st.booleans())]
        maxes = [a for a in axes if draw(st.booleans())]
        ids = rng.integers(-1, count + 1, [shape[axes.index(a)] for a in iaxes]).astype(np.int64)
        mask = np.asarray(rng.random([shape[axes.index(a)] for a in maxes]) < 0.7)
        full_ids = np.broadcast_to(np.moveaxis(ids.reshape([shape[axes.index(a)] if a in iaxes else 1
                                                            for a in axes]), 0, 0), shape)
        mask_full = np.broadcast_to(mask.reshape([shape[axes.index(a)] if a in maxes else 1 for a in axes]), shape)
        ids = np.where(mask_full & ((full_ids < 0) | (full_ids >= count)), 0, full_ids)  # keep active ids valid
        ids = np.ascontiguousarray(ids)
        mode = draw(st.sampled_from(["sum", "mean", "amax", "softmax"]))
        attrs = SEG | {"axis": axis, "num_segments": count, "mode": mode}
        return SEGMENT, attrs, [vt, I(axes, shape), B(maxes, mask.shape)], [value, ids, mask]
    k, s, d = draw(st.integers(1, 3)), draw(st.integers(1, 3)), draw(st.integers(1, 2))
    pad = [draw(st.integers(0, 2)), draw(st.integers(0, 2))]
    if (n + sum(pad) - d * (k - 1) - 1) // s + 1 < 1:
        k, d = 1, 1
    attrs = WIN | {"axis": axis, "kernel_size": k, "stride": s, "dilation": d, "padding": pad}
    return WINDOW, attrs, [vt], [value]


def _layout(draw, x):
    """The same values as a Fortran-ordered, reversed-stride or read-only array (cpu kernels
    take any strides)."""
    kind = draw(st.sampled_from(["c", "fortran", "reversed", "readonly"]))
    if kind == "fortran":
        return np.asfortranarray(x)
    if kind == "reversed" and x.ndim:
        return np.flip(np.flip(x, 0).copy(), 0)
    y = np.array(x)
    y.flags.writeable = kind != "readonly"
    return y


def _check(data, backend, dtypes):
    ref, attrs, types, values = data.draw(cases(dtypes))
    if backend == "cpu":
        values = [_layout(data.draw, v) for v in values]
    before = [v.copy() for v in values]
    want = run(ref, attrs, types, values)
    got = run(ref, attrs, types, values, backend)
    if want.dtype.kind == "f":
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)
    else:
        np.testing.assert_array_equal(got, want)
    for v, b in zip(values, before):
        np.testing.assert_array_equal(v, b)


@settings(deadline=None, max_examples=60)
@given(st.data())
def test_cpu_matches_reference(data):
    _check(data, "cpu", ("float32", "float64", "int64", "boolean"))


@settings(deadline=None, max_examples=60)
@given(st.data())
def test_cpu_parallel_kernels_match_reference(data):
    from unittest import mock

    import atoms._rows as rows

    with mock.patch.object(rows, "PARALLEL_MIN_ELEMENTS", 1):
        _check(data, "cpu", ("float32", "float64"))


@settings(deadline=None, max_examples=12)
@given(st.data())
def test_cuda_matches_reference(data):
    _check(data, "cuda", ("float32", "boolean"))


@pytest.mark.parametrize("backend", ["cpu", "cuda"])
def test_programs_agree_with_reference(backend):
    from tests.spec.atom_cases import VALID

    for case_id, make, inputs, _ in VALID:
        if case_id.split("-")[0] in ("gather@2", "scatter@2", "segment", "window"):
            assert_backends_agree(make(), inputs, {}, backends=(backend,))


@pytest.mark.parametrize("backend", BACKENDS)
def test_half_data_movement_in_programs(backend):
    """gather@2 then window on float16: half-native kernels move the bits unchanged."""
    from tests.spec.builders import ProgramBuilder

    b = ProgramBuilder()
    b.input("v", ["N"], [4], "float16")
    b.input("i", ["J"], [3], "int64")
    g = b.op("gather@2", ["v", "i"], G, ["J"], [3], "float16")
    b.op("window", [g], {**WIN, "axis": "J", "padding": [1, 0]}, ["P", "K"], [3, 2], "float16")
    v = np.array([0.1, 65504, -2.5e-5, 3], np.float16)
    got = execute(b.build(), {"v": v, "i": np.array([1, 2, 1])}, backend)
    assert got.dtype == np.float16
    np.testing.assert_array_equal(got.view(np.uint16), np.array([[0, v[1]], [v[1], v[2]], [v[2], v[1]]],
                                                                np.float16).view(np.uint16))
