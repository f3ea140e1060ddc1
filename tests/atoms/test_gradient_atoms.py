"""The gradient atoms as a family (SPEC §3c): load-time errors at their codes and paths, half
dtypes in programs, cpu and cuda (simulator) against the reference on generated shapes,
``formula atoms``, one compiled call. Each atom module's own tests: tests/atoms/test_<module>.py."""
from __future__ import annotations

import json
import math

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

import runtime
from atoms._grad import FILL_REF, MASKED_SOFTMAX_VJP_REF, SCALAR_MAP_VJP_REF, SLICE_VJP_REF, WINDOW_VJP_REF
from runtime.core.errors import FormulaError
from runtime.core.types import numpy_dtype
from runtime.testing import ProgramBuilder, TOLERANCES, assert_backends_agree, real_cuda, warm_drivers
from tests.atoms.gradient_helpers import (F32, INF, INS, SLICE, SPEC, T, WIN, execute, expect, infer, run, softmax,
                                          window_attrs)


# --- load-time errors ---------------------------------------------------------------------------

FILL = {"axes": ["N"], "dtype": "float32", "value": 1.0}
V = T("BN", (2, 5))
G = T("BN", (2, 5))
AT = f"{INS}.attributes."
SLOT0, SLOT1 = f"{INS}.input_slots[0]", f"{INS}.input_slots[1]"


@pytest.mark.parametrize("ref, attributes, types, code, path, needle", [
    # fill: axes, dtype and value (SPEC §3c)
    (FILL_REF, {**FILL, "axes": ["Q"]}, [V], "atom_attributes", AT + "axes", "'Q'"),
    (FILL_REF, {**FILL, "axes": ["N", "N"]}, [V], "atom_attributes", AT + "axes", "repeat"),
    (FILL_REF, {**FILL, "axes": "N"}, [V], "atom_attributes", AT + "axes", ""),
    (FILL_REF, {**FILL, "axes": [1]}, [V], "atom_attributes", AT + "axes", ""),
    (FILL_REF, {**FILL, "dtype": "int32"}, [V], "atom_attributes", AT + "dtype", "int32"),
    (FILL_REF, {**FILL, "dtype": None}, [V], "atom_attributes", AT + "dtype", ""),
    (FILL_REF, {**FILL, "value": True}, [V], "atom_attributes", AT + "value", "bool"),
    (FILL_REF, {**FILL, "value": "1"}, [V], "atom_attributes", AT + "value", "string"),
    (FILL_REF, {**FILL, "value": None}, [V], "atom_attributes", AT + "value", ""),
    (FILL_REF, {**FILL, "value": INF}, [V], "atom_attributes", AT + "value", "finite"),
    (FILL_REF, {**FILL, "value": math.nan}, [V], "atom_attributes", AT + "value", "finite"),
    (FILL_REF, {**FILL, "value": 10 ** 400}, [V], "atom_attributes", AT + "value", "finite"),
    (FILL_REF, {**FILL, "value": -(10 ** 5000)}, [V], "atom_attributes", AT + "value", "bits"),
    (FILL_REF, {**FILL, "dtype": "int64", "value": 10 ** 5000}, [V], "atom_attributes", AT + "value", "range"),
    (FILL_REF, {**FILL, "dtype": "int64", "value": 1.5}, [V], "atom_attributes", AT + "value", "integer"),
    (FILL_REF, {**FILL, "dtype": "int64", "value": 1.0}, [V], "atom_attributes", AT + "value", "integer"),
    (FILL_REF, {**FILL, "dtype": "int64", "value": 1 << 63}, [V], "atom_attributes", AT + "value", "range"),
    (FILL_REF, {**FILL, "dtype": "int64", "value": False}, [V], "atom_attributes", AT + "value", ""),
    (FILL_REF, {**FILL, "dtype": "boolean", "value": 1}, [V], "atom_attributes", AT + "value", "bool"),
    # scalar-map-vjp
    (SCALAR_MAP_VJP_REF, {"mode": "swish", **F32}, [V, G], "atom_attributes", AT + "mode", "swish"),
    (SCALAR_MAP_VJP_REF, {"mode": "exp", "accumulation_dtype": "float64"}, [V, G], "atom_attributes",
     AT + "accumulation_dtype", "float64"),
    (SCALAR_MAP_VJP_REF, {"mode": "exp", **F32}, [T("BN", (2, 5), "int64"), G], "type_mismatch", SLOT0, "floating"),
    (SCALAR_MAP_VJP_REF, {"mode": "exp", **F32}, [V, T("BN", (2, 5), "boolean")], "type_mismatch", SLOT1,
     "floating"),
    (SCALAR_MAP_VJP_REF, {"mode": "exp", **F32}, [V, T("NB", (5, 2))], "type_mismatch", SLOT1, "axes"),
    (SCALAR_MAP_VJP_REF, {"mode": "exp", **F32}, [V, T("BN", (2, 4))], "type_mismatch", SLOT1, "'N'"),
    (SCALAR_MAP_VJP_REF, {"mode": "exp", **F32}, [V, T("BN", (2, 5), "float64")], "type_mismatch", SLOT1,
     "float64"),
    (SCALAR_MAP_VJP_REF, {"mode": "exp", **F32}, [V, T("BN", (2, 5), domain="e")], "type_mismatch", SLOT1,
     "domain"),
    # masked-softmax-vjp
    (MASKED_SOFTMAX_VJP_REF, {"axis": "Q", **F32}, [V, G], "atom_attributes", AT + "axis", "'Q'"),
    (MASKED_SOFTMAX_VJP_REF, {"axis": 3, **F32}, [V, G], "atom_attributes", AT + "axis", ""),
    (MASKED_SOFTMAX_VJP_REF, {"axis": "N", "accumulation_dtype": "half"}, [V, G], "atom_attributes",
     AT + "accumulation_dtype", "half"),
    (MASKED_SOFTMAX_VJP_REF, {"axis": "N", **F32}, [T("BN", (2, 5), "int64"), G], "type_mismatch", SLOT0,
     "floating"),
    (MASKED_SOFTMAX_VJP_REF, {"axis": "N", **F32}, [V, T("BN", (2, 6))], "type_mismatch", SLOT1, "'N'"),
    (MASKED_SOFTMAX_VJP_REF, {"axis": "N", **F32}, [V, T("BN", (2, 5), "float16")], "type_mismatch", SLOT1,
     "float16"),
    # slice-vjp: slice's attribute checks on the reference, then the cotangent's exact type
    (SLICE_VJP_REF, {**SLICE, "axis": "Q"}, [T("BN", (2, 2)), V], "atom_attributes", AT + "axis", "reference"),
    (SLICE_VJP_REF, {**SLICE, "step": 0}, [T("BN", (2, 2)), V], "atom_attributes", AT + "step", ""),
    (SLICE_VJP_REF, {**SLICE, "start": -1}, [T("BN", (2, 2)), V], "atom_attributes", AT + "start", ""),
    (SLICE_VJP_REF, {**SLICE, "stop": True}, [T("BN", (2, 2)), V], "atom_attributes", AT + "stop", ""),
    (SLICE_VJP_REF, {**SLICE, "start": 5}, [T("BN", (2, 2)), V], "atom_attributes", AT + "start", "empty"),
    (SLICE_VJP_REF, SLICE, [T("BN", (2, "S")), T("BN", (2, "S"))], "atom_attributes", AT + "start", "symbolic"),
    (SLICE_VJP_REF, SLICE, [T("BN", (2, 3)), V], "type_mismatch", SLOT0, "'N'"),
    (SLICE_VJP_REF, SLICE, [T("NB", (2, 2)), V], "type_mismatch", SLOT0, "axes"),
    (SLICE_VJP_REF, SLICE, [T("BN", (2, 2), "int64"), T("BN", (2, 5), "int64")], "type_mismatch", SLOT0,
     "floating"),
    (SLICE_VJP_REF, SLICE, [T("BN", (2, 2)), T("BN", (2, 5), "int64")], "type_mismatch", SLOT0, "int64"),
    (SLICE_VJP_REF, SLICE, [T("BN", (2, 2), domain="e"), V], "type_mismatch", SLOT0, "domain"),
    # window-vjp: window's attribute checks on the reference, then the cotangent's exact type
    (WINDOW_VJP_REF, {**WIN, "axis": "Q"}, [T("BPK", (2, 4, 2)), V], "atom_attributes", AT + "axis", ""),
    (WINDOW_VJP_REF, {**WIN, "output_axis": "B"}, [T("BPK", (2, 4, 2)), V], "atom_attributes",
     AT + "output_axis", "new name"),
    (WINDOW_VJP_REF, {**WIN, "window_axis": "P"}, [T("BPK", (2, 4, 2)), V], "atom_attributes",
     AT + "window_axis", ""),
    (WINDOW_VJP_REF, {**WIN, "kernel_size": 0}, [T("BPK", (2, 4, 2)), V], "atom_attributes",
     AT + "kernel_size", ""),
    (WINDOW_VJP_REF, {**WIN, "kernel_size": 9}, [T("BPK", (2, 4, 2)), V], "atom_attributes",
     AT + "kernel_size", "no window"),
    (WINDOW_VJP_REF, {**WIN, "padding": [1]}, [T("BPK", (2, 4, 2)), V], "atom_attributes", AT + "padding", ""),
    (WINDOW_VJP_REF, {**WIN, "stride": True}, [T("BPK", (2, 4, 2)), V], "atom_attributes", AT + "stride", ""),
    (WINDOW_VJP_REF, {**WIN, "output_size": 2.5}, [T("BPK", (2, 4, 2)), V], "atom_attributes",
     AT + "output_size", ""),
    (WINDOW_VJP_REF, WIN, [T("BPK", (2, 4, 2)), T("BN", (2, "S"))], "atom_attributes", AT + "output_size",
     "null"),
    (WINDOW_VJP_REF, {**WIN, "output_size": 3}, [T("BPK", (2, 3, 2)), V], "type_mismatch", INS, "differs"),
    (WINDOW_VJP_REF, WIN, [T("BPK", (2, 3, 2)), V], "type_mismatch", SLOT0, "'P'"),
    (WINDOW_VJP_REF, WIN, [T("BKP", (2, 2, 4)), V], "type_mismatch", SLOT0, "axes"),
    (WINDOW_VJP_REF, WIN, [T("BPK", (2, 4, 2), "float64"), V], "type_mismatch", SLOT0, "float64"),
    (WINDOW_VJP_REF, WIN, [T("BPK", (2, 4, 2), "boolean"), T("BN", (2, 5), "boolean")], "type_mismatch",
     SLOT0, "floating"),
])
def test_infer_errors(ref, attributes, types, code, path, needle):
    expect(code, path, infer, ref, attributes, *types, needle=needle)


def test_infer_types():
    f = T("BN", ("B", 5), "floating", "e")
    assert infer(FILL_REF, {**FILL, "axes": ["N", "B"]}, f) == T("NB", (5, "B"), "float32", "e")
    assert infer(FILL_REF, {**FILL, "axes": [], "dtype": "floating"}, f) == T("", (), "floating", "e")
    assert infer(FILL_REF, {**FILL, "dtype": "floating"}, T("BN", (2, 5), "bfloat16")).dtype == "bfloat16"
    for dtype in ("int64", "boolean"):  # floating of a reference that is no float: float32
        assert infer(FILL_REF, {**FILL, "dtype": "floating"}, T("BN", (2, 5), dtype)).dtype == "float32"
    assert infer(FILL_REF, {**FILL, "dtype": "boolean", "value": False}, V).dtype == "boolean"
    assert infer(FILL_REF, {**FILL, "dtype": "int64", "value": -(1 << 63)}, V).dtype == "int64"
    assert infer(FILL_REF, {**FILL, "value": 10 ** 30}, V) == T("N", (5,))  # finite as a double
    assert infer(SCALAR_MAP_VJP_REF, {"mode": "silu", **F32}, f, T("BN", ("B", 5), "float16", "e")) == f
    assert infer(MASKED_SOFTMAX_VJP_REF, {"axis": "N", "accumulation_dtype": "activation"}, f, f) == f
    assert infer(SLICE_VJP_REF, SLICE, T("BN", (2, 2)), V) == V
    assert infer(SLICE_VJP_REF, {**SLICE, "start": 0, "step": 1}, f, f) == f  # a full symbolic slice
    assert infer(WINDOW_VJP_REF, WIN, T("BPK", (2, 4, 2)), V) == V
    assert infer(WINDOW_VJP_REF, {**WIN, "output_size": "W"}, T("BPK", (2, "W", 2)), T("BN", (2, "S"))) == \
        T("BN", (2, "S"))


def test_operands_bound_to_two_float_dtypes_are_binding_dtype():
    """Checked again when planned: x and ȳ typed `floating`, bound to float32 and float64."""
    for ref, attributes, types in ((SCALAR_MAP_VJP_REF, {"mode": "exp", **F32}, (V, T("BN", (2, 5), "float64"))),
                                   (MASKED_SOFTMAX_VJP_REF, {"axis": "N", **F32}, (V, T("BN", (2, 5), "float64"))),
                                   (SLICE_VJP_REF, SLICE, (T("BN", (2, 2), "float64"), V)),
                                   (WINDOW_VJP_REF, WIN, (T("BPK", (2, 4, 2), "float64"), V))):
        assert infer(ref, attributes, *(t.evolve(dtype="floating") for t in types)).dtype == "floating"
        expect("binding_dtype", SLOT1 if ref in (SCALAR_MAP_VJP_REF, MASKED_SOFTMAX_VJP_REF) else SLOT0, infer,
               ref, attributes, *types, planning=True)
    b = ProgramBuilder(dtype="floating")
    x, g = b.input("x", {"N": 3}), b.input("g", {"N": 3})
    y = b.op("scalar-map-vjp", [x, g], {"mode": "tanh", **F32}, ref=SCALAR_MAP_VJP_REF)
    prog = b.build(outputs=[y])
    expect("binding_dtype", SLOT1, execute, prog, {"x": np.ones(3, np.float32), "g": np.ones(3)}, "cpu")


def test_every_key_is_required():
    b = ProgramBuilder()
    x = b.input("x", {"N": 2})
    for ref, attributes in ((FILL_REF, {"axes": ["N"], "dtype": "float32"}),
                            (SCALAR_MAP_VJP_REF, {"mode": "exp"}),
                            (MASKED_SOFTMAX_VJP_REF, {"axis": "N", **F32, "mode": "sum"}),
                            (SLICE_VJP_REF, {"axis": "N", "start": 0, "stop": None}),
                            (WINDOW_VJP_REF, {k: v for k, v in WIN.items() if k != "padding"})):
        inputs = [x] if ref == FILL_REF else [x, x]
        expect("atom_signature", f"{INS}.attributes", b.op, "gradient", inputs, attributes, ref=ref)
    with pytest.raises(FormulaError) as info:  # arity
        b.op("gradient", [x, x], FILL, ref=FILL_REF)
    assert info.value.code == "atom_signature" and info.value.path.startswith(INS)


# --- halves in programs ---------------------------------------------------------------------------

@pytest.mark.parametrize("backend", ["cpu", "cuda"])
@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_half_dtypes_in_programs(backend, dtype):
    """Every gradient atom on half operands: cpu/cuda widen once (or move bits) and round once."""
    b = ProgramBuilder(dtype=dtype)
    x = b.input("x", {"B": 2, "N": 6})
    g = b.input("g", {"B": 2, "N": 6})
    s = b.op("scalar-map-vjp", [x, g], {"mode": "tanh", **F32}, ref=SCALAR_MAP_VJP_REF)
    y = b.op("masked-softmax", [x, b.input("m", {"N": 6}, "boolean")], {"axis": "N", **F32})
    m = b.op("masked-softmax-vjp", [y, g], {"axis": "N", **F32}, ref=MASKED_SOFTMAX_VJP_REF)
    sl = b.op("slice", [s], SLICE)
    sv = b.op("slice-vjp", [sl, x], SLICE, ref=SLICE_VJP_REF)
    w = b.op("window", [m], window_attrs(3, 2, 1, (1, 1)))
    wv = b.op("window-vjp", [w, x], window_attrs(3, 2, 1, (1, 1)), ref=WINDOW_VJP_REF)
    f = b.op("fill", [x], {"axes": ["N"], "dtype": "floating", "value": 0.3}, ref=FILL_REF)
    prog = b.build(outputs=[s, m, sv, wv, f])
    rng = np.random.default_rng(7)
    dt = numpy_dtype(dtype)
    inputs = {"x": rng.standard_normal((2, 6)).astype(dt), "g": rng.standard_normal((2, 6)).astype(dt),
              "m": np.array([1, 1, 0, 1, 0, 1], bool)}
    rtol, atol = TOLERANCES[dtype]
    want = assert_backends_agree(prog, inputs, backends=[backend], rtol=rtol, atol=atol)
    assert all(v.dtype == dt for v in want.values())
    np.testing.assert_array_equal(want[f], np.full(6, dt.type(0.3)))


# --- backends agree on generated shapes ------------------------------------------------------------

@st.composite
def cases(draw):
    """A random masked-softmax-vjp, slice-vjp or window-vjp over 1-3 axes of extents 1-5."""
    rng = np.random.default_rng(draw(st.integers(0, 2 ** 16)))
    rank = draw(st.integers(1, 3))
    axes = list("ABC"[:rank])
    shape = [draw(st.integers(1, 5)) for _ in axes]
    axis = draw(st.sampled_from(axes))
    q = axes.index(axis)
    n = shape[q]
    dtype = draw(st.sampled_from(["float32", "float64"]))
    rt = T(axes, shape, dtype)
    ref_value = rng.standard_normal(shape).astype(dtype)
    kind = draw(st.sampled_from(["masked-softmax-vjp", "slice-vjp", "window-vjp"]))
    if kind == "masked-softmax-vjp":
        y = softmax(ref_value, rng.random(shape) < 0.7, q).astype(dtype)
        g = rng.standard_normal(shape).astype(dtype)
        acc = draw(st.sampled_from(["float32", "activation"]))
        return MASKED_SOFTMAX_VJP_REF, {"axis": axis, "accumulation_dtype": acc}, [rt, rt], [y, g]
    if kind == "slice-vjp":
        start = draw(st.integers(0, n - 1))
        stop = draw(st.one_of(st.none(), st.integers(start + 1, n + 2)))
        step = draw(st.integers(1, 3))
        a = {"axis": axis, "start": start, "stop": stop, "step": step}
        gshape = list(shape)
        gshape[q] = len(range(n)[start:stop:step])
        return SLICE_VJP_REF, a, [T(axes, gshape, dtype), rt], [rng.standard_normal(gshape).astype(dtype),
                                                                ref_value]
    k, s, d = draw(st.integers(1, 3)), draw(st.integers(1, 3)), draw(st.integers(1, 2))
    pad = (draw(st.integers(0, 2)), draw(st.integers(0, 2)))
    if (n + sum(pad) - d * (k - 1) - 1) // s + 1 < 1:
        k, d = 1, 1
    p = (n + sum(pad) - d * (k - 1) - 1) // s + 1
    a = window_attrs(k, s, d, pad, axis)
    gaxes = axes[:q] + ["P", "K"] + axes[q + 1:]
    gshape = shape[:q] + [p, k] + shape[q + 1:]
    return WINDOW_VJP_REF, a, [T(gaxes, gshape, dtype), rt], [rng.standard_normal(gshape).astype(dtype), ref_value]


def _layout(draw, x):
    """The same values as a Fortran-ordered, reversed-stride or read-only array."""
    kind = draw(st.sampled_from(["c", "fortran", "reversed", "readonly"]))
    if kind == "fortran":
        return np.asfortranarray(x)
    if kind == "reversed" and x.ndim:
        return np.flip(np.flip(x, 0).copy(), 0)
    y = np.array(x)
    y.flags.writeable = kind != "readonly"
    return y


def _check(data, backend):
    ref, attributes, types, values = data.draw(cases())
    if backend == "cpu":
        values = [_layout(data.draw, v) for v in values]
    before = [v.copy() for v in values]
    want = run(ref, attributes, types, values)
    got = run(ref, attributes, types, values, backend)
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)
    for v, b in zip(values, before):
        np.testing.assert_array_equal(v, b)


@settings(deadline=None, max_examples=40)
@given(st.data())
def test_cpu_matches_reference(data):
    _check(data, "cpu")


@settings(deadline=None, max_examples=25)
@given(st.data())
def test_cpu_parallel_kernels_match_reference(data):
    from unittest import mock

    import atoms._rows as rows

    with mock.patch.object(rows, "PARALLEL_MIN_ELEMENTS", 1):
        _check(data, "cpu")


@settings(deadline=None, max_examples=40 if real_cuda() else 8)
@given(st.data())
def test_cuda_matches_reference(data):
    _check(data, "cuda")


# --- listed and documented -----------------------------------------------------------------------

def test_formula_atoms_lists_them(capsys):
    from runtime.cli import main

    assert main(["atoms", "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    listed = json.dumps(doc)
    for ref in (FILL_REF, SCALAR_MAP_VJP_REF, MASKED_SOFTMAX_VJP_REF, SLICE_VJP_REF, WINDOW_VJP_REF):
        assert ref in listed and ref in SPEC


def test_a_gradient_program_runs_as_one_compiled_call():
    """The cpu kernels of fill, masked-softmax-vjp, slice-vjp and window-vjp say how compiled
    code calls them: a plan of them is one driver segment, equal to its Python launches."""
    b = ProgramBuilder()
    x = b.input("x", {"B": 3, "N": 7})
    g = b.input("g", {"B": 3, "N": 7})
    a = window_attrs(3, 2, 2, (2, 1))  # P = 3
    c = b.input("c", {"B": 3, "P": 3, "K": 3})
    m = b.op("masked-softmax-vjp", [x, g], {"axis": "N", **F32}, ref=MASKED_SOFTMAX_VJP_REF)
    s = b.op("slice-vjp", [b.op("slice", [m], SLICE), x], SLICE, ref=SLICE_VJP_REF)
    w = b.op("window-vjp", [c, s], a, ref=WINDOW_VJP_REF)
    f = b.op("fill", [x], {"axes": ["N"], "dtype": "float32", "value": 2.0}, ref=FILL_REF)
    y = b.op("scale", [b.op("add", [w, s], F32), f], {"factor_axes": ["N"], **F32})
    prog = b.build(outputs=[y])
    rng = np.random.default_rng(8)
    inputs = {k: rng.standard_normal(v).astype(np.float32) for k, v in (("x", (3, 7)), ("g", (3, 7)),
                                                                        ("c", (3, 3, 3)))}
    exe = runtime.compile(prog, "cpu", tiered=False)
    (compiled,) = warm_drivers(exe, inputs)
    assert all(launch.kernel.compiled is not None for launch in compiled.launches), \
        [launch.nodes[0].atom.name for launch in compiled.launches if launch.kernel.compiled is None]
    driver = compiled.driver()
    assert driver is not None and len(driver.parts) == 1 and not isinstance(driver.parts[0], int)
    got = exe.run(inputs=inputs)[y].copy()
    np.testing.assert_array_equal(got, exe.run(inputs=inputs, trace=True)[y])
    np.testing.assert_allclose(got, runtime.execute(prog, inputs=inputs, backend="reference")[y], rtol=1e-5,
                               atol=1e-6)
