"""The atoms for gradients (SPEC §3c): fill@1, scalar-map-vjp@1, masked-softmax-vjp@1, slice-vjp@1,
window-vjp@1. Load-time errors at their codes and paths, values against NumPy formulas, float64
finite differences and adjoint identities, cpu and cuda (simulator) against the reference on
generated shapes, half dtypes, fusion, and ``formula atoms``."""
from __future__ import annotations

import json
import math

import ml_dtypes
import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

import runtime
from atoms import all_specs
from atoms._grad import FILL_REF, MASKED_SOFTMAX_VJP_REF, SCALAR_MAP_VJP_REF, SLICE_VJP_REF, WINDOW_VJP_REF
from atoms.elementwise import MODES_V2
from atoms.scalar_map_vjp import VJP_EXPRS, scalar_map_vjp_numpy
from runtime.core.errors import FormulaError
from runtime.core.types import TensorType, numpy_dtype
from runtime.plugins.atomspec import InferContext
from runtime.testing import TOLERANCES, ProgramBuilder, assert_backends_agree, real_cuda, run_kernel

SPEC = {ref: s for s in all_specs() for ref in s.refs}
INS = "$.instructions[0]"
F32 = {"accumulation_dtype": "float32"}
WIN = {"axis": "N", "output_axis": "P", "window_axis": "K", "kernel_size": 2, "stride": 1, "dilation": 1,
       "padding": [0, 0], "output_size": None}
SLICE = {"axis": "N", "start": 1, "stop": None, "step": 2}
BACKENDS = ("reference", "cpu", "cuda")
INF = math.inf


def T(axes, sizes, dtype="float32", domain="d"):
    return TensorType(tuple(axes), tuple(sizes), dtype, domain)


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
    return run_kernel(SPEC[ref], attributes, types, values, backend)


def execute(prog, inputs, backend):
    return runtime.execute(prog, inputs=inputs, backend=backend)


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


# --- fill ---------------------------------------------------------------------------------------

def fill_program(reference_dtype, attributes, axes=("B", "N"), extents=(2, 3), then=None):
    b = ProgramBuilder(dtype=reference_dtype)
    r = b.input("r", dict(zip(axes, extents)))
    y = b.op("fill", [r], attributes, ref=FILL_REF)
    if then is not None:
        y = then(b, r, y)
    return b.build(outputs=[y]), y, {"r": np.zeros(extents, numpy_dtype(reference_dtype))}


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("dtype, value, want", [
    ("float32", 0.1, np.float32(0.1)),
    ("float64", 0.1, 0.1),
    ("float16", 1e6, np.float16(INF)),  # beyond float16's range: +inf (rounded once, as cast@1)
    ("float16", -65520.0, np.float16(-INF)),
    ("float16", 65519.0, np.float16(65504)),
    ("bfloat16", 1 + 2 ** -8 + 2 ** -30, ml_dtypes.bfloat16(1 + 2 ** -7)),  # one rounding from the double
    ("bfloat16", 1e300, ml_dtypes.bfloat16(INF)),
    ("float32", 1e300, np.float32(INF)),
    ("float32", -7, np.float32(-7)),
    ("int64", -(1 << 63), np.int64(-(1 << 63))),
    ("int64", (1 << 63) - 1, np.int64((1 << 63) - 1)),
    ("boolean", True, True),
    ("boolean", False, False),
])
def test_fill_values(backend, dtype, value, want):
    for axes in (["B", "N"], ["N", "B"], ["N"], []):  # the reference's own axes (a chain on cpu/cuda) or not
        prog, y, inputs = fill_program("float32", {"axes": axes, "dtype": dtype, "value": value})
        got = execute(prog, inputs, backend)[y]
        assert got.dtype == numpy_dtype(dtype)
        assert got.shape == tuple({"B": 2, "N": 3}[a] for a in axes)
        w = np.asarray(want, numpy_dtype(dtype)).reshape(1)
        np.testing.assert_array_equal(got.reshape(-1).view(np.uint8), np.tile(w.view(np.uint8), got.size),
                                      err_msg=f"{axes} {backend}")  # the very bits


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("reference", ["float16", "bfloat16", "float64", "int64", "boolean"])
def test_fill_floating_takes_the_reference_float_dtype(backend, reference):
    prog, y, inputs = fill_program(reference, {"axes": ["N", "B"], "dtype": "floating", "value": -2.5})
    got = execute(prog, inputs, backend)[y]
    assert got.dtype == numpy_dtype(reference if reference.startswith(("float", "bfloat")) else "float32")
    assert got.shape == (3, 2) and np.all(got.astype(np.float64) == -2.5)


def test_fill_fuses_into_its_reader_as_a_constant():
    """fill over the reference's own axes is a chain step: with its one reader (an add whose
    other operand has no producer in a chain) it runs as one kernel and is never stored."""
    def then(b, r, f):
        return b.op("add", [f, r], F32)
    prog, y, _ = fill_program("float32", {"axes": ["B", "N"], "dtype": "float32", "value": 3.0}, then=then)
    for backend in ("cpu", "cuda"):
        groups = runtime.compile(prog, backend=backend).plan().groups
        assert len(groups) == 1 and [n.atom.name for n in groups[0].nodes] == ["fill", "add"], backend
    r = np.arange(6, dtype=np.float32).reshape(2, 3)
    for backend in BACKENDS:
        np.testing.assert_array_equal(execute(prog, {"r": r}, backend)[y], r + 3)


def test_fill_of_a_half_reference_reads_nothing_and_is_not_widened():
    prog, y, _ = fill_program("float16", {"axes": ["N"], "dtype": "float32", "value": 1.5})
    for backend in ("cpu", "cuda"):
        names = [n.atom.name for g in runtime.compile(prog, backend=backend).plan().groups for n in g.nodes]
        assert names == ["fill"], names
    r = np.full((2, 3), np.float16(65504))
    for backend in BACKENDS:
        np.testing.assert_array_equal(execute(prog, {"r": r}, backend)[y], np.full(3, 1.5, np.float32))


# --- scalar-map-vjp ------------------------------------------------------------------------------

def _forward(mode: str, x: np.ndarray) -> np.ndarray:
    from atoms.elementwise import scalar_map_numpy

    return scalar_map_numpy(mode, x)


# points away from each mode's kinks, domain edges and the softplus threshold
FD_POINTS = {
    "rsqrt": [0.05, 0.3, 1.0, 2.5, 40.0], "log": [0.05, 0.3, 1.0, 2.5, 40.0],
    "log1p": [-0.9, -0.3, 0.0, 1.5, 30.0], "reciprocal": [-3.0, -0.2, 0.1, 0.7, 5.0],
    "softplus": [-30.0, -2.0, 0.0, 3.0, 19.0, 21.0],
}
DEFAULT_POINTS = [-6.0, -2.5, -0.7, -0.1, 0.2, 0.9, 2.0, 5.5]


@pytest.mark.parametrize("mode", MODES_V2)
def test_scalar_map_vjp_is_the_derivative_float64(mode):
    """Central finite differences of scalar-map@2's own formula, in float64, with ȳ ≠ 1."""
    x = np.array(FD_POINTS.get(mode, DEFAULT_POINTS), np.float64)
    g = np.linspace(-2.0, 3.0, x.size)
    h = 1e-6 * np.maximum(1.0, np.abs(x))
    fd = g * (_forward(mode, x + h) - _forward(mode, x - h)) / (2 * h)
    np.testing.assert_allclose(scalar_map_vjp_numpy(mode, x, g), fd, rtol=1e-6, atol=1e-8)
    for backend in BACKENDS:
        got = _vjp(mode, "float64", x, g, backend)
        np.testing.assert_allclose(got, fd, rtol=1e-6, atol=1e-8, err_msg=backend)


def _vjp(mode, dtype, x, g, backend, acc="float32"):
    b = ProgramBuilder(dtype=dtype)
    xs, gs = b.input("x", {"N": len(x)}), b.input("g", {"N": len(x)})
    y = b.op("scalar-map-vjp", [xs, gs], {"mode": mode, "accumulation_dtype": acc}, ref=SCALAR_MAP_VJP_REF)
    dt = numpy_dtype(dtype)
    return execute(b.build(outputs=[y]), {"x": np.asarray(x, dt), "g": np.asarray(g, dt)}, backend)[y]


KINKS = {  # mode: (x, ȳ, ȳ·f′(x)) at the conventions of SPEC §3c and IEEE edges; exact in every dtype
    "relu": ([0.0, -0.0, -1.0, 2.0], [3.0, 3.0, 3.0, 3.0], [0.0, 0.0, 0.0, 3.0]),
    "abs": ([0.0, -0.0, -1.0, 2.0], [3.0, 3.0, 3.0, 3.0], [0.0, 0.0, -3.0, 3.0]),
    "softplus": ([21.0, 20.5, 0.0, 30.0], [2.0, 2.0, 2.0, -1.0], [2.0, 2.0, 1.0, -1.0]),
    "rsqrt": ([0.0, -0.0, -1.0, 4.0], [1.0, 1.0, 1.0, 1.0], [-INF, INF, math.nan, -1 / 16]),
    "log": ([0.0, -0.0, -2.0, 4.0], [1.0, 1.0, 1.0, 2.0], [INF, -INF, -0.5, 0.5]),
    "log1p": ([-1.0, 0.0, 1.0, -2.0], [1.0, 1.0, 2.0, 1.0], [INF, 1.0, 1.0, -1.0]),
    "reciprocal": ([0.0, -0.0, 2.0, -0.5], [1.0, 1.0, 1.0, 1.0], [-INF, -INF, -0.25, -4.0]),
    "exp": ([0.0, -1000.0, 1000.0, 1.0], [2.0, 1.0, 1.0, 1.0], [2.0, 0.0, INF, math.e]),
    "expm1": ([0.0, -1000.0, 1000.0, 1.0], [2.0, 1.0, 1.0, 1.0], [2.0, 0.0, INF, math.e]),
    "sigmoid": ([0.0, 1000.0, -1000.0, 0.0], [4.0, 1.0, 1.0, -2.0], [1.0, 0.0, 0.0, -0.5]),
    "silu": ([0.0, 1000.0, -1000.0, 0.0], [2.0, 1.0, 1.0, 1.0], [1.0, 1.0, 0.0, 0.5]),
    "tanh": ([0.0, 30.0, -30.0, 0.0], [2.0, 1.0, 1.0, -1.0], [2.0, 0.0, 0.0, -1.0]),
    "gelu": ([0.0, 50.0, -50.0, 0.0], [2.0, 1.0, 1.0, -1.0], [1.0, 1.0, 0.0, -0.5]),
    "sin": ([0.0, math.pi, 0.0, 0.0], [2.0, 1.0, 1.0, 1.0], [2.0, -1.0, 1.0, 1.0]),
    "cos": ([0.0, 0.5 * math.pi, 0.0, 0.0], [2.0, 1.0, 1.0, 1.0], [-0.0, -1.0, -0.0, -0.0]),
}


@pytest.mark.parametrize("dtype", ["float16", "float32", "float64"])
@pytest.mark.parametrize("mode", sorted(KINKS))
def test_scalar_map_vjp_conventions_and_ieee_edges(mode, dtype):
    x, g, want = KINKS[mode]
    want = np.array(want, np.float64)
    for backend in BACKENDS:
        got = _vjp(mode, dtype, x, g, backend).astype(np.float64)
        np.testing.assert_allclose(got, want, rtol=2e-3 if dtype == "float16" else 1e-6, atol=1e-6,
                                   err_msg=f"{mode} {dtype} {backend}")


def test_scalar_map_vjp_softplus_threshold_is_strict():
    """softplus′(x) = 1 only for x > 20: at 20 itself it is sigmoid(20) < 1 (float64)."""
    got = _vjp("softplus", "float64", [20.0, np.nextafter(20.0, 21.0)], [1.0, 1.0], "cpu")
    assert got[0] == 1 / (1 + math.exp(-20.0)) and got[1] == 1.0


def test_scalar_map_vjp_expressions_never_raise_in_plain_python():
    """The chain code runs as plain Python in the simulator and the tiers: no input may raise."""
    values = [0.0, -0.0, 1e-320, -1e-320, 1e-160, 1.0, -1.0, 20.0, 709.9, -709.9, 1e308, -1e308, INF, -INF,
              math.nan]
    for mode, expr in VJP_EXPRS.items():
        for x in values:
            for g in (0.0, 1.0, -INF, 1e308):
                eval(expr.format("x", "g"), {"math": math, "np": np}, {"x": x, "g": g})  # noqa: S307


@settings(deadline=None, max_examples=10)
@given(seed=st.integers(0, 2 ** 16), mode=st.sampled_from(MODES_V2),
       dtype=st.sampled_from(["float16", "bfloat16", "float32", "float64"]),
       acc=st.sampled_from(["float32", "activation"]), order=st.permutations("ABC"),
       extents=st.tuples(*[st.integers(1, 4)] * 3))
def test_scalar_map_vjp_cpu_matches_reference(seed, mode, dtype, acc, order, extents):
    rng = np.random.default_rng(seed)
    dt = numpy_dtype(dtype)
    x = rng.standard_normal(extents) * 3
    if mode in ("rsqrt", "log"):
        x = np.abs(x) + 0.1
    if mode in ("reciprocal",):
        x = np.where(np.abs(x) < 0.1, 0.5, x)
    b = ProgramBuilder(dtype=dtype)
    axes = dict(zip(order, extents))
    xs, gs = b.input("x", axes), b.input("g", axes)
    y = b.op("scalar-map-vjp", [xs, gs], {"mode": mode, "accumulation_dtype": acc}, ref=SCALAR_MAP_VJP_REF)
    rtol, atol = TOLERANCES[dtype]
    assert_backends_agree(b.build(outputs=[y]), {"x": x.astype(dt), "g": rng.standard_normal(extents).astype(dt)},
                          backends=["cpu"], rtol=rtol, atol=atol)


@settings(deadline=None, max_examples=25 if real_cuda() else 3)
@given(seed=st.integers(0, 2 ** 16), mode=st.sampled_from(MODES_V2))
def test_scalar_map_vjp_cuda_matches_reference(seed, mode):
    rng = np.random.default_rng(seed)
    x = np.abs(rng.standard_normal(6)) + 0.2
    g = rng.standard_normal(6)
    want = _vjp(mode, "float32", x, g, "reference")
    np.testing.assert_allclose(_vjp(mode, "float32", x, g, "cuda"), want, rtol=2e-4, atol=2e-5)


@pytest.mark.parametrize("dtype", ["float32", "float16"])
def test_scalar_map_vjp_joins_the_epilogue_of_the_contraction_producing_the_cotangent(dtype):
    b = ProgramBuilder(dtype=dtype)
    x = b.input("x", {"T": 4, "R": 3})
    u = b.input("u", {"T": 4, "D": 8})
    w = b.input("w", {"R": 3, "D": 8})
    g = b.op("contract", [u, w], {"reduce_axes": [["D", "D"]], "output_axes": ["T", "R"], **F32})
    y = b.op("scalar-map-vjp", [x, g], {"mode": "silu", **F32}, ref=SCALAR_MAP_VJP_REF)
    prog = b.build(outputs=[y])
    for backend in ("cpu", "cuda"):
        groups = runtime.compile(prog, backend=backend).plan().groups
        fused = [grp for grp in groups if grp.anchor is not None and grp.anchor.atom.name == "contract"]
        assert [n.atom.name for n in fused[0].nodes] == ["contract", "scalar-map-vjp"], backend
    rng = np.random.default_rng(2)
    dt = np.dtype(dtype)
    inputs = {k: rng.standard_normal(s).astype(dt) for k, s in (("x", (4, 3)), ("u", (4, 8)), ("w", (3, 8)))}
    rtol, atol = TOLERANCES[dtype]
    assert_backends_agree(prog, inputs, backends=["cpu", "cuda"], rtol=rtol, atol=atol)


# --- masked-softmax-vjp -----------------------------------------------------------------------------

def _softmax(logits, mask, axis):
    from atoms.softmax import masked_softmax_numpy

    return masked_softmax_numpy(logits, mask, axis)


def test_masked_softmax_vjp_is_the_jacobian_transpose_and_zero_where_hidden():
    rng = np.random.default_rng(0)
    logits = rng.standard_normal((3, 5))
    mask = np.array([[1, 1, 0, 1, 1], [0, 0, 0, 0, 0], [1, 0, 0, 0, 0]], bool)  # a fully masked row, a lone one
    y = _softmax(logits, mask, 1)
    g = rng.standard_normal((3, 5))
    want = np.stack([(np.diag(r) - np.outer(r, r)) @ c for r, c in zip(y, g)])  # Jᵀȳ (J symmetric)
    for backend in BACKENDS:
        got = run(MASKED_SOFTMAX_VJP_REF, {"axis": "N", **F32}, [T("BN", (3, 5), "float64")] * 2, [y, g], backend)
        np.testing.assert_allclose(got, want, rtol=1e-12, atol=1e-14, err_msg=backend)
        assert np.all(got[~mask] == 0) and not np.signbit(got[~mask]).any(), backend


@pytest.mark.parametrize("backend", BACKENDS)
def test_masked_softmax_vjp_hidden_entries_stay_zero_whatever_their_cotangent(backend):
    """Where y = 0, the result is exactly 0 and adds nothing to the row's sum, even for a huge ȳ
    (inf·0 would be NaN)."""
    y = np.array([[0.25, 0.0, 0.75], [0.0, 0.0, 0.0]], np.float32)
    g = np.array([[1.0, 3e38, 2.0], [3e38, -3e38, 1.0]], np.float32)
    got = run(MASKED_SOFTMAX_VJP_REF, {"axis": "N", **F32}, [T("BN", (2, 3))] * 2, [y, g], backend)
    s = 0.25 * 1.0 + 0.75 * 2.0
    np.testing.assert_allclose(got, [[0.25 * (1 - s), 0.0, 0.75 * (2 - s)], [0, 0, 0]], rtol=1e-6)
    assert got[0, 1] == 0 and np.all(got[1] == 0)


@pytest.mark.parametrize("backend", BACKENDS)
def test_masked_softmax_vjp_after_masked_softmax_in_a_program(backend):
    b = ProgramBuilder()
    lg = b.input("l", {"H": 2, "K": 4, "Q": 3})
    m = b.input("m", {"K": 4, "Q": 3}, "boolean")
    g = b.input("g", {"H": 2, "K": 4, "Q": 3})
    y = b.op("masked-softmax", [lg, m], {"axis": "K", **F32})
    d = b.op("masked-softmax-vjp", [y, g], {"axis": "K", **F32}, ref=MASKED_SOFTMAX_VJP_REF)
    prog = b.build(outputs=[d])
    rng = np.random.default_rng(3)
    mask = rng.random((4, 3)) < 0.6
    mask[:, 0] = False
    inputs = {"l": rng.standard_normal((2, 4, 3)).astype(np.float32), "m": mask,
              "g": rng.standard_normal((2, 4, 3)).astype(np.float32)}
    want = assert_backends_agree(prog, inputs, backends=[backend])[d]
    assert np.all(want[:, ~mask] == 0)


# --- slice-vjp -----------------------------------------------------------------------------------

@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("dtype", ["float16", "bfloat16", "float32", "float64"])
def test_slice_vjp_places_the_cotangent_in_zeros(backend, dtype):
    dt = numpy_dtype(dtype)
    g = np.array([[1.5, -0.0], [2.5, -3.0]], dt)  # axes B, N: positions 1 and 3 of N
    got = run(SLICE_VJP_REF, SLICE, [T("BN", (2, 2), dtype), T("BN", (2, 5), dtype)],
              [g, np.full((2, 5), np.nan, dt)], backend)
    want = np.zeros((2, 5), dt)
    want[:, 1::2] = g
    assert got.dtype == dt
    np.testing.assert_array_equal(got.view(np.uint8), want.view(np.uint8))  # bits: -0.0 stays -0.0


@pytest.mark.parametrize("backend", BACKENDS)
def test_slice_vjp_is_the_adjoint_of_slice(backend):
    rng = np.random.default_rng(4)
    for axis, start, stop, step in (("N", 0, None, 1), ("N", 2, 4, 1), ("B", 1, None, 2), ("C", 0, 9, 3)):
        a = {"axis": axis, "start": start, "stop": stop, "step": step}
        vt = T("BNC", (3, 5, 4), "float64")
        v = rng.standard_normal(vt.shape)
        s = run("arti/formula-atom-slice@1", a, [vt], [v])
        g = rng.standard_normal(s.shape)
        back = run(SLICE_VJP_REF, a, [T("BNC", s.shape, "float64"), vt], [g, v], backend)
        assert math.isclose(float(np.sum(s * g)), float(np.sum(v * back)), rel_tol=1e-12)


# --- window-vjp ----------------------------------------------------------------------------------

def _window_attrs(k, s, d, pad, axis="N"):
    return {**WIN, "axis": axis, "kernel_size": k, "stride": s, "dilation": d, "padding": list(pad)}


@pytest.mark.parametrize("backend", BACKENDS)
def test_window_vjp_sums_overlapping_taps_and_drops_padding(backend):
    a = _window_attrs(3, 2, 1, (1, 1))  # N = 5: P = (5+2-2-1)//2 + 1 = 3, taps p·2 − 1 + k
    g = np.arange(1.0, 10.0, dtype=np.float32).reshape(3, 3)  # [p, k]
    got = run(WINDOW_VJP_REF, a, [T("PK", (3, 3)), T("N", (5,))], [g, np.zeros(5, np.float32)], backend)
    # n=0: (0,1); n=1: (0,2),(1,0); n=2: (1,1); n=3: (1,2),(2,0); n=4: (2,1); (0,0) and (2,2) in the padding
    np.testing.assert_array_equal(got, [2.0, 3 + 4, 5.0, 6 + 7, 8.0])


@pytest.mark.parametrize("backend", BACKENDS)
def test_window_vjp_is_the_adjoint_of_window(backend):
    rng = np.random.default_rng(5)
    for k, s, d, pad in ((1, 1, 1, (0, 0)), (3, 1, 1, (1, 1)), (2, 3, 2, (2, 0)), (4, 2, 3, (3, 4)), (2, 1, 1, (0, 0))):
        a = _window_attrs(k, s, d, pad)
        vt = T("BN", (2, 7), "float64")
        v = rng.standard_normal(vt.shape)
        w = run("arti/formula-atom-window@1", a, [vt], [v])
        g = rng.standard_normal(w.shape)
        back = run(WINDOW_VJP_REF, a, [T("BPK", w.shape, "float64"), vt], [g, v], backend)
        assert math.isclose(float(np.sum(w * g)), float(np.sum(v * back)), rel_tol=1e-12), (k, s, d, pad)


@pytest.mark.parametrize("backend", ["cpu", "cuda"])
def test_window_vjp_gives_the_reference_bits(backend):
    """Taps added in ascending (p, k) in float32 on every backend: the very same bits."""
    rng = np.random.default_rng(6)
    a = _window_attrs(5, 1, 1, (2, 2), axis="N")
    g = (rng.standard_normal((3, 6, 5)) * 1e3).astype(np.float32)
    types = [T("BPK", (3, 6, 5)), T("BN", (3, 6))]
    want = run(WINDOW_VJP_REF, a, types, [g, np.zeros((3, 6), np.float32)])
    got = run(WINDOW_VJP_REF, a, types, [g, np.zeros((3, 6), np.float32)], backend)
    np.testing.assert_array_equal(got.view(np.uint32), want.view(np.uint32))


@pytest.mark.parametrize("backend", BACKENDS)
def test_window_vjp_symbolic_extent_checks_at_run_time(backend):
    b = ProgramBuilder()
    v = b.input("v", {"N": "S"})
    g = b.input("g", {"P": "W", "K": 2})
    y = b.op("window-vjp", [g, v], {**WIN, "output_size": "W"}, ref=WINDOW_VJP_REF)
    exe = runtime.compile(b.build(outputs=[y]), backend=backend)
    out = exe.run(inputs={"v": np.zeros(4, np.float32), "g": np.ones((3, 2), np.float32)})[y]
    np.testing.assert_array_equal(out, [1, 2, 2, 1])
    expect("symbol_conflict", f"{INS}.attributes.output_size", exe.run,
           inputs={"v": np.zeros(5, np.float32), "g": np.ones((3, 2), np.float32)})
    b = ProgramBuilder()
    v = b.input("v", {"N": "S"})
    g = b.input("g", {"P": 3, "K": 2})
    y = b.op("window-vjp", [g, v], {**WIN, "output_size": 3}, ref=WINDOW_VJP_REF)
    expect("binding_shape", f"{INS}.attributes.output_size", execute, b.build(outputs=[y]),
           {"v": np.zeros(5, np.float32), "g": np.ones((3, 2), np.float32)}, backend)


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
    w = b.op("window", [m], _window_attrs(3, 2, 1, (1, 1)))
    wv = b.op("window-vjp", [w, x], _window_attrs(3, 2, 1, (1, 1)), ref=WINDOW_VJP_REF)
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
        y = _softmax(ref_value, rng.random(shape) < 0.7, q).astype(dtype)
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
    a = _window_attrs(k, s, d, pad, axis)
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
    from runtime.execution.compiled import DRIVER_AFTER_RUNS

    b = ProgramBuilder()
    x = b.input("x", {"B": 3, "N": 7})
    g = b.input("g", {"B": 3, "N": 7})
    a = _window_attrs(3, 2, 2, (2, 1))  # P = 3
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
    for _ in range(DRIVER_AFTER_RUNS):
        exe.run(inputs=inputs)
    assert exe.wait_compiled()
    compiled = next(iter(exe._plans.values()))
    assert compiled.driver_error is None
    assert all(launch.kernel.compiled is not None for launch in compiled.launches), \
        [launch.nodes[0].atom.name for launch in compiled.launches if launch.kernel.compiled is None]
    driver = compiled.driver()
    assert driver is not None and len(driver.parts) == 1 and not isinstance(driver.parts[0], int)
    got = exe.run(inputs=inputs)[y].copy()
    np.testing.assert_array_equal(got, exe.run(inputs=inputs, trace=True)[y])
    np.testing.assert_allclose(got, runtime.execute(prog, inputs=inputs, backend="reference")[y], rtol=1e-5,
                               atol=1e-6)
