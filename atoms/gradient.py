"""Atoms for gradients (SPEC §3c): fill@1, scalar-map-vjp@1, masked-softmax-vjp@1, slice-vjp@1
and window-vjp@1, registered as ``formula-runtime/formula-atom-<name>@1``.

The gradient rules (runtime.autodiff) emit them; they are ordinary atoms otherwise.

- **fill** reads no value of its reference. When its axes are the reference's, in order, it is
  a constant :class:`ScalarOp`, so the planner fuses it into its reader's chain and it never
  reaches memory; otherwise its own kernel stores the constant's bits (every dtype, half
  included, with no conversion).
- **scalar-map-vjp** is ȳ·f′(x) as a two-operand :class:`ScalarOp` (it joins the epilogue of
  the contraction producing ȳ). As scalar-map@2's expressions, the expressions never raise in
  plain Python or under Numba's Python error model: every division and every ``math`` call
  that could raise is guarded.
- **masked-softmax-vjp**, **slice-vjp** and **window-vjp** are row kernels in the style of
  atoms/window.py: a row is one coordinate of the other axes (atoms/_rows.py), plain ``@njit``
  row functions with serial and parallel twins on the CPU, one thread per row or element on
  CUDA. slice-vjp moves raw bits (half-native); window-vjp gathers the ≤ K taps of each output
  element in ascending (p, k), so it needs no atomics and gives the same bits on every backend.
"""
from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np
from numba import njit, prange

from runtime.core.errors import fail, json_kind
from runtime.core.types import HALF_DTYPES, TensorType, dtypes_compatible, is_float, numpy_dtype
from runtime.kernels.twins import Twins
from runtime.plugins.atomspec import (AtomSpec, InferContext, Linear, Node, ScalarOp, axes_except, every_axis)
from runtime.plugins.kernel import (FLAT_OUTPUT, CompiledCall, const_array, const_int, flat_input, flat_output,
                                    node_kernel)

from . import _rows
from .elementwise import MODES_V2, _acc, _cpu as _elementwise_cpu, _cuda as _elementwise_cuda, require_identical
from .layout import BITS, _i64, c_strides, device_bits, flat_view, infer_slice, out_bits, slice_extent
from .window import infer_window

OWNER = "formula-runtime"


def gradient_ref(name: str) -> str:
    """``formula-runtime/formula-atom-<name>@1`` (SPEC §3c)."""
    return f"{OWNER}/formula-atom-{name}@1"


FILL_REF = gradient_ref("fill")
SCALAR_MAP_VJP_REF = gradient_ref("scalar-map-vjp")
MASKED_SOFTMAX_VJP_REF = gradient_ref("masked-softmax-vjp")
SLICE_VJP_REF = gradient_ref("slice-vjp")
WINDOW_VJP_REF = gradient_ref("window-vjp")

HALF_NATIVE = frozenset({"cpu", "cuda"})  # kernels that store raw bits: no widening needed
FILL_DTYPES = ("floating", "float16", "bfloat16", "float32", "float64", "int64", "boolean")
INT64_MIN, INT64_MAX = -(1 << 63), (1 << 63) - 1
SLICE_KEYS = frozenset({"axis", "start", "stop", "step"})
WINDOW_KEYS = frozenset({"axis", "output_axis", "window_axis", "kernel_size", "stride", "dilation",
                         "padding", "output_size"})


# --- shared checks ------------------------------------------------------------------------------

def require_cotangent(ctx: InferContext, operand: int, want: TensorType, what: str) -> None:
    """SPEC §3c: a cotangent is floating and of exactly ``want``'s type (axes in order, extents,
    dtype, domain). Two float dtypes that differ only once ``floating`` bindings are bound are
    the caller's binding: ``binding_dtype`` (§3b.2)."""
    t = ctx.operands[operand]
    name = ctx.atom.inputs[operand]
    ctx.require_dtype(operand, "floating")
    if t.axes != want.axes:
        ctx.mismatch(f"{name} must have the axes of {what}, {list(want.axes)}, got {list(t.axes)}", operand)
    for axis, got, expected in zip(t.axes, t.sizes, want.sizes):
        ctx.require_extent(got, expected, f"{name} axis {axis!r} against {what}", operand)
    require_same_float(ctx, operand, t.dtype, want.dtype, what)
    if t.domain != want.domain:
        ctx.mismatch(f"{name} is in domain {t.domain!r} but {what} is in {want.domain!r}", operand)


def require_same_float(ctx: InferContext, operand: int, got: str, want: str, what: str) -> None:
    name = ctx.atom.inputs[operand]
    if ctx.planning and got != want and is_float(got) and is_float(want):
        fail("binding_dtype", f"{ctx.path}.input_slots[{operand}]",
             f"{ctx.atom.name}: {name} is bound as {got} but {what} as {want}; floating operands "
             "that must agree need one float dtype")
    if not dtypes_compatible(got, want):
        ctx.mismatch(f"{name} is {got} but {what} is {want}", operand)


def require_pair(ctx: InferContext) -> TensorType:
    """Operands 0 and 1 floating and identical (x and ȳ, y and ȳ); returns operand 0's type."""
    ctx.require_dtype(0, "floating")
    ctx.require_dtype(1, "floating")
    t, g = ctx.operands
    require_same_float(ctx, 1, g.dtype, t.dtype, ctx.atom.inputs[0])
    require_identical(ctx, 0, 1)
    return t


def _on(ctx: InferContext, shim: AtomSpec, operand: int) -> InferContext:
    """``ctx`` seen by an atom whose one operand is ``operand`` (the forward atom's input),
    so the forward's own ``infer`` checks the shared attributes with the same codes and paths."""
    return InferContext(shim, ctx.path, ctx.attributes, (ctx.operands[operand],),
                        (ctx.operand_slots[operand],), ctx.dims, planning=ctx.planning)


# --- fill@1 -------------------------------------------------------------------------------------

def fill_dtype(dtype: str, reference: str) -> str:
    """SPEC §3c: ``floating`` is the reference's float dtype, or float32 for another reference."""
    if dtype != "floating":
        return dtype
    return reference if is_float(reference) else "float32"


def _shown(v: int | float) -> str:
    """``v`` for a message: a huge integer by its size (its digits could be thousands, and
    Python refuses to print more than 4300)."""
    return f"an integer of {v.bit_length()} bits" if isinstance(v, int) and abs(v) >= 1 << 80 else repr(v)


def _fill_value(ctx: InferContext, dtype: str) -> None:
    v = ctx.attributes["value"]
    if dtype == "boolean":
        if not isinstance(v, bool):
            ctx.bad_attr("value", f"a boolean fill takes a JSON bool, got {json_kind(v)}")
        return
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        ctx.bad_attr("value", f"expected a number, got {json_kind(v)}")
    if dtype == "int64":
        if not isinstance(v, int):
            ctx.bad_attr("value", f"an int64 fill takes a JSON integer, got {v!r}")
        if not INT64_MIN <= v <= INT64_MAX:
            ctx.bad_attr("value", f"{_shown(v)} is outside int64's range")
        return
    try:
        finite = math.isfinite(float(v))
    except OverflowError:  # an integer beyond every double: JSON would give inf
        finite = False
    if not finite:
        ctx.bad_attr("value", f"expected a finite number, got {_shown(v)}")


def infer_fill(ctx: InferContext) -> TensorType:
    t = ctx.operands[0]
    axes = ctx.attr_axes("axes")
    for axis in axes:
        if axis not in t.axes:
            ctx.bad_attr("axes", f"reference has no axis {axis!r} (axes {list(t.axes)})")
    dtype = ctx.attr_str("dtype", FILL_DTYPES)
    _fill_value(ctx, dtype)
    return ctx.output(axes, [t.size_of(a) for a in axes], dtype=fill_dtype(dtype, t.dtype))


def fill_constant(node: Node) -> np.ndarray:
    """The value rounded once to the output dtype (a 0-d array): the JSON double, overflowing to
    ±inf as cast@1 does; an int64 or a bool as it is."""
    dt = numpy_dtype(node.output_type.dtype)
    v = node.attributes["value"]
    if dt.kind == "f":
        with np.errstate(over="ignore"):
            return np.array(float(v), np.float64).astype(dt)
    return np.array(v, dt)


def _literal(node: Node) -> str:
    """The constant as an expression every backend's chain code compiles, exactly."""
    c = fill_constant(node)
    dtype = node.output_type.dtype
    if dtype == "boolean":
        return "True" if bool(c) else "False"
    if dtype == "int64":
        v = int(c)  # the most negative int64 has no positive literal of its own type
        return f"np.int64({v})" if v > INT64_MIN else "(np.int64(-9223372036854775807) - np.int64(1))"
    f = float(c)
    if math.isinf(f):
        return "math.inf" if f > 0 else "(-math.inf)"
    return f"np.{dtype}({f!r})"


def fill_op(node: Node) -> ScalarOp | None:
    """A constant chain step when the output has the reference's axes and extents in order (the
    chain then reads the reference at the output's index, and fuses into its reader); None
    otherwise, and for half types, which chains never hold (fill runs its own kernel then)."""
    t, o = node.input_types[0], node.output_type
    if t.axes != o.axes or t.shape != o.shape or "float16" in (t.dtype, o.dtype) or \
            "bfloat16" in (t.dtype, o.dtype):
        return None
    return ScalarOp(_literal(node))


def _ref_fill(node: Node):
    c = fill_constant(node)

    def run(inputs: Sequence[np.ndarray], out: np.ndarray) -> None:
        out[...] = c
    return run


def _fill_bits(node: Node) -> np.ndarray:
    c = fill_constant(node).reshape(1)
    return c.view(BITS[c.itemsize])


@njit(cache=True, nogil=True)
def fill_serial(dst, bits):
    value = bits[0]
    for i in range(dst.shape[0]):
        dst[i] = value


@njit(cache=True, nogil=True, parallel=True)
def fill_parallel(dst, bits):
    value = bits[0]
    for i in prange(dst.shape[0]):
        dst[i] = value


FILL = Twins(fill_serial, fill_parallel)


def _cpu_fill(node: Node):
    bits = _fill_bits(node)
    kernel = FILL.pick(node.output_type.elements >= _rows.PARALLEL_MIN_ELEMENTS)

    def run(inputs: Sequence[np.ndarray], out: np.ndarray) -> None:
        kernel(out_bits(out), bits)
    run.warm = FILL.warm
    if _compilable(node.output_type):  # the reference is no parameter: its type does not matter
        run.compiled = CompiledCall(kernel, (flat_output(view=bits.dtype.name), const_array(bits)))
    return run


CUDA_FILL_SOURCE = '''"""Generated by atoms.gradient: fill, one thread per element (grid-stride)."""
from numba import cuda


@cuda.jit(cache=True)
def kernel(dst, bits, n):
    t = cuda.grid(1)
    step = cuda.gridsize(1)
    while t < n:
        dst[t] = bits[0]
        t += step
'''


def _cuda_fill(node: Node):
    from numba import cuda

    from runtime.backends.cuda_codegen import SpaceKernel

    kernel = SpaceKernel("cufill", CUDA_FILL_SOURCE)
    bits = cuda.to_device(_fill_bits(node))
    n = max(1, node.output_type.elements)

    def run(inputs, out) -> None:
        kernel([out_bits(out), bits, n], n)
    return run


# --- scalar-map-vjp@1 ---------------------------------------------------------------------------

# {0} is x, {1} is ȳ. exp(-|x|) <= 1 never overflows; sigmoid and 1 - sigmoid from it alone.
_E = "math.exp(-abs({0}))"
_SIGMOID = "((1.0 if {0} >= 0.0 else " + _E + ") / (1.0 + " + _E + "))"
_ONE_MINUS_SIGMOID = "((" + _E + " if {0} >= 0.0 else 1.0) / (1.0 + " + _E + "))"
_INV_SQRT = "(1.0 / math.sqrt({0}))"
VJP_EXPRS = {
    # Φ(x) + x·φ(x), Φ as ½(1 + erf) as torch's gelu backward: erf and exp vectorise on cpu
    # (vmath; erfc would keep the whole loop scalar); x·φ(x) is 0 beyond |x| = 40 (where x·x
    # would only make inf·0 of an infinite x)
    "gelu": "({1} * (0.5 * (1.0 + math.erf(0.7071067811865476 * {0})) + "
            "(({0} * 0.3989422804014327 * math.exp(-0.5 * {0} * {0})) if abs({0}) < 40.0 else 0.0)))",
    # relu′(0) = abs′(0) = 0: a select (ȳ = ±inf still gives 0 there); x - x keeps a NaN x NaN
    "relu": "({1} if {0} > 0.0 else ({0} - {0}))",
    "abs": "({1} if {0} > 0.0 else ((-{1}) if {0} < 0.0 else ({0} - {0})))",
    # -½·x^(-3/2) as (1/√x)³ (x·√x could underflow to 0); ±0 gives ∓inf·ȳ as torch's
    # -½·ȳ·rsqrt(x)³ does, x < 0 NaN
    "rsqrt": "((-0.5 * {1} * (" + _INV_SQRT + " * " + _INV_SQRT + " * " + _INV_SQRT + ")) if {0} > 0.0 else "
             "(((-{1}) * math.copysign(math.inf, {0})) if {0} == 0.0 else math.nan))",
    "sigmoid": "({1} * (" + _E + " / ((1.0 + " + _E + ") * (1.0 + " + _E + "))))",
    "silu": "({1} * (" + _SIGMOID + " * (1.0 + {0} * " + _ONE_MINUS_SIGMOID + ")))",
    "tanh": "({1} * (1.0 - math.tanh({0}) * math.tanh({0})))",
    "exp": "({1} * (math.inf if {0} > 709.78 else math.exp({0})))",
    "expm1": "({1} * (math.inf if {0} > 709.78 else math.exp({0})))",
    "log": "(({1} / {0}) if {0} != 0.0 else ({1} * math.copysign(math.inf, {0})))",
    "log1p": "(({1} / (1.0 + {0})) if (1.0 + {0}) != 0.0 else ({1} * math.inf))",
    "softplus": "({1} if {0} > 20.0 else ({1} * " + _SIGMOID + "))",
    "reciprocal": "(((-{1}) / ({0} * {0})) if ({0} * {0}) != 0.0 else ((-{1}) * math.inf))",
    "sin": "({1} * (math.cos({0}) if math.isfinite({0}) else math.nan))",
    "cos": "((-{1}) * (math.sin({0}) if math.isfinite({0}) else math.nan))",
}
assert set(VJP_EXPRS) == set(MODES_V2)


def infer_scalar_map_vjp(ctx: InferContext) -> TensorType:
    ctx.attr_str("mode", MODES_V2)
    ctx.accumulation()
    t = require_pair(ctx)
    return ctx.output(t.axes, t.sizes)


def _erfc(x: np.ndarray) -> np.ndarray:
    from scipy.special import erfc  # scipy is a hard dependency (numba's BLAS needs it)

    return erfc(x)


def scalar_map_vjp_numpy(mode: str, x: np.ndarray, g: np.ndarray) -> np.ndarray:
    """ȳ·f′(x) in x's dtype, with SPEC §3c's conventions, written like the ScalarOps it checks."""
    with np.errstate(all="ignore"):
        if mode == "gelu":
            tail = np.where(np.abs(x) < 40, x * 0.3989422804014327 * np.exp(-0.5 * x * x), 0)
            return g * (0.5 * _erfc(-0.7071067811865476 * x) + tail)
        if mode == "relu":
            return np.where(x > 0, g, x - x)
        if mode == "abs":
            return np.where(x > 0, g, np.where(x < 0, -g, x - x))
        if mode == "rsqrt":
            r = 1 / np.sqrt(x)
            return np.where(x > 0, -0.5 * g * (r * r * r),
                            np.where(x == 0, -g * np.copysign(np.inf, x).astype(x.dtype), np.nan))
        if mode == "tanh":
            t = np.tanh(x)
            return g * (1 - t * t)
        if mode in ("exp", "expm1"):
            return g * np.exp(x)
        if mode == "log":
            return np.where(x != 0, g / x, g * np.copysign(np.inf, x).astype(x.dtype))
        if mode == "log1p":
            d = 1 + x
            return np.where(d != 0, g / d, g * np.inf)
        if mode == "reciprocal":
            s = x * x
            return np.where(s != 0, -g / s, -g * np.inf)
        if mode == "sin":
            return g * np.cos(x)
        if mode == "cos":
            return -g * np.sin(x)
        e = np.exp(-np.abs(x))
        sigmoid = np.where(x >= 0, 1, e) / (1 + e)
        if mode == "sigmoid":
            return g * (e / ((1 + e) * (1 + e)))
        if mode == "silu":
            return g * (sigmoid * (1 + x * (np.where(x >= 0, e, 1) / (1 + e))))
        if mode == "softplus":
            return np.where(x > 20, g, g * sigmoid)
    raise ValueError(mode)


def _ref_scalar_map_vjp(node: Node):
    mode, acc = node.attributes["mode"], _acc(node)

    def run(inputs: Sequence[np.ndarray], out: np.ndarray) -> None:
        x, g = (np.asarray(v).astype(acc) for v in inputs)
        with np.errstate(all="ignore"):  # overflow in the final rounding gives ±inf
            out[...] = scalar_map_vjp_numpy(mode, x, g)
    return run


# --- row helpers ----------------------------------------------------------------------------------

def _float_kernel_dtype(node: Node, backend: str) -> None:
    """Row kernels that compute take float32 or float64 (the planner widens half operands)."""
    for t in node.input_types + (node.output_type,):
        if t.dtype not in ("float32", "float64"):
            fail("backend_unavailable", node.path,
                 f"{node.atom.name} has no {backend} kernel for {t.dtype}; use backend='reference'")


def _compilable(*types: TensorType) -> bool:
    """Whether compiled code (runtime.execution.driver) can call a kernel over these types:
    static and non-empty, of a dtype Numba has (no half)."""
    return all(t.is_static and t.elements and t.dtype not in HALF_DTYPES for t in types)


def _flat(x: np.ndarray) -> tuple[np.ndarray, int, tuple[int, ...]]:
    """``flat_view`` in the array's own dtype (a read-only 1-D view, its origin and strides)."""
    x = np.asarray(x)
    bits, origin, strides = flat_view(x)
    return bits.view(x.dtype), origin, strides


def _flat_out(out: np.ndarray) -> np.ndarray:
    return out.reshape((max(1, out.size),))


def _device_flat(x):
    """A device operand as a flat C-order array of its own dtype (a strided one copied first)."""
    if not x.is_c_contiguous():
        from numba import cuda

        x = cuda.to_device(np.ascontiguousarray(x.copy_to_host()))
    return x.reshape((max(1, math.prod(x.shape)),))


def _row_space(space: TensorType, axis: str, members) -> _rows.Rows:
    names = [a for a in space.axes if a != axis]
    return _rows.rows(space, axis, [(t, names, strides) for t, strides in members])


# --- masked-softmax-vjp@1 ---------------------------------------------------------------------------

def infer_masked_softmax_vjp(ctx: InferContext) -> TensorType:
    ctx.axis_of("axis", 0)
    ctx.accumulation()
    t = require_pair(ctx)
    return ctx.output(t.axes, t.sizes)


def masked_softmax_vjp_numpy(y: np.ndarray, g: np.ndarray, position: int) -> np.ndarray:
    """y ⊙ (ȳ − Σ ȳ⊙y) along ``position``; where y = 0 exactly 0 (hidden entries, fully masked
    rows), and such entries add nothing to the sum whatever their ȳ (inf·0 would be NaN)."""
    with np.errstate(all="ignore"):
        visible = y != 0
        s = np.where(visible, y * g, 0).sum(axis=position, keepdims=True)
        return np.where(visible, y * (g - s), 0)


def _ref_masked_softmax_vjp(node: Node):
    position = node.input_types[0].axes.index(node.attributes["axis"])
    acc = _acc(node)

    def run(inputs: Sequence[np.ndarray], out: np.ndarray) -> None:
        y, g = (np.asarray(v).astype(acc) for v in inputs)
        out[...] = masked_softmax_vjp_numpy(y, g, position)
    return run


@njit(inline="always", nogil=True)
def _msv_row(y, g, dst, shape, st, base, ys, gs, os, n, r):
    off = _rows.row_offsets(r, shape, st, base)
    s = 0.0
    for k in range(n):
        v = y[off[0] + k * ys]
        if v != 0.0:
            s += v * g[off[1] + k * gs]
    for k in range(n):
        v = y[off[0] + k * ys]
        if v != 0.0:
            dst[off[2] + k * os] = v * (g[off[1] + k * gs] - s)
        else:
            dst[off[2] + k * os] = 0.0


@njit(cache=True, nogil=True)
def masked_softmax_vjp_serial(y, g, dst, shape, st, base, ys, gs, os, n, count):
    for r in range(count):
        _msv_row(y, g, dst, shape, st, base, ys, gs, os, n, r)


@njit(cache=True, nogil=True, parallel=True)
def masked_softmax_vjp_parallel(y, g, dst, shape, st, base, ys, gs, os, n, count):
    for r in prange(count):
        _msv_row(y, g, dst, shape, st, base, ys, gs, os, n, r)


MASKED_SOFTMAX_VJP = Twins(masked_softmax_vjp_serial, masked_softmax_vjp_parallel)


def _msv_rows(node: Node, ystr: Sequence[int], gstr: Sequence[int]):
    t, axis = node.input_types[0], node.attributes["axis"]
    ostr = c_strides(t.shape)
    r = _row_space(t, axis, [(t, ystr), (t, gstr), (t, ostr)])
    return r, (_rows.along(t, axis, ystr), _rows.along(t, axis, gstr), _rows.along(t, axis, ostr))


def _cpu_masked_softmax_vjp(node: Node):
    _float_kernel_dtype(node, "cpu")
    n = node.input_types[0].size_of(node.attributes["axis"])
    prepared: dict[tuple, tuple] = {}

    def run(inputs: Sequence[np.ndarray], out: np.ndarray) -> None:
        (y, yo, ystr), (g, go, gstr) = _flat(inputs[0]), _flat(inputs[1])
        args = prepared.get((ystr, gstr))
        if args is None:
            r, along = _msv_rows(node, ystr, gstr)
            parallel = _rows.parallel_rows(r.count, node.output_type.elements)
            kernel = MASKED_SOFTMAX_VJP.pick(parallel)
            args = prepared[(ystr, gstr)] = (kernel, r, along)
        kernel, r, (ys, gs, os) = args
        kernel(y, g, _flat_out(out), r.shape, r.strides, _i64([yo, go, 0]), ys, gs, os, n, r.count)
    run.warm = MASKED_SOFTMAX_VJP.warm
    if _compilable(*node.input_types, node.output_type):  # C-contiguous operands: their C strides
        strides = c_strides(node.input_types[0].shape)
        r, along = _msv_rows(node, strides, strides)
        kernel = MASKED_SOFTMAX_VJP.pick(_rows.parallel_rows(r.count, node.output_type.elements))
        run.compiled = CompiledCall(kernel, (flat_input(0), flat_input(1), FLAT_OUTPUT, const_array(r.shape),
                                             const_array(r.strides), const_array(_i64([0, 0, 0])),
                                             *map(const_int, (*along, n, r.count))))
    return run


CUDA_MSV_SOURCE = '''"""Generated by atoms.gradient: masked-softmax-vjp, one thread per row."""
from numba import cuda

from atoms._rows_cuda import row_offset


@cuda.jit(cache=True)
def kernel(y, g, dst, shape, st, ys, gs, os, n, count):
    r = cuda.grid(1)
    step = cuda.gridsize(1)
    while r < count:
        a = row_offset(r, shape, st, 0)
        b = row_offset(r, shape, st, 1)
        o = row_offset(r, shape, st, 2)
        s = 0.0
        for k in range(n):
            v = y[a + k * ys]
            if v != 0.0:
                s += v * g[b + k * gs]
        for k in range(n):
            v = y[a + k * ys]
            if v != 0.0:
                dst[o + k * os] = v * (g[b + k * gs] - s)
            else:
                dst[o + k * os] = 0.0
        r += step
'''


def _cuda_masked_softmax_vjp(node: Node):
    from numba import cuda

    from runtime.backends.cuda_codegen import SpaceKernel

    _float_kernel_dtype(node, "cuda")
    kernel = SpaceKernel("cumsvjp", CUDA_MSV_SOURCE)
    t = node.input_types[0]
    strides = c_strides(t.shape)
    r, (ys, gs, os) = _msv_rows(node, strides, strides)
    shape, st = cuda.to_device(r.shape), cuda.to_device(r.strides)
    n = t.size_of(node.attributes["axis"])

    def run(inputs, out) -> None:
        y, g = (_device_flat(x) for x in inputs)
        kernel([y, g, _device_flat(out), shape, st, ys, gs, os, n, r.count], r.count)
    return run


# --- slice-vjp@1 ----------------------------------------------------------------------------------

_SLICE_SHIM = AtomSpec(name="slice-vjp", refs=(SLICE_VJP_REF,), inputs=("reference",), attributes=SLICE_KEYS,
                       infer=infer_slice)


def infer_slice_vjp(ctx: InferContext) -> TensorType:
    want = infer_slice(_on(ctx, _SLICE_SHIM, 1))  # the attributes, checked as slice checks them
    require_cotangent(ctx, 0, want, "slice(reference)")
    ref = ctx.operands[1]
    return ctx.output(ref.axes, ref.sizes, like=1)


def _ref_slice_vjp(node: Node):
    t, a = node.input_types[1], node.attributes
    p = t.axes.index(a["axis"])
    index = tuple(slice(a["start"], a["stop"], a["step"]) if k == p else slice(None) for k in range(t.rank))

    def run(inputs: Sequence[np.ndarray], out: np.ndarray) -> None:
        out[...] = 0
        out[index] = np.asarray(inputs[0])  # a copy: the cotangent's bits, -0.0 included
    return run


@njit(inline="always", nogil=True)
def _slice_vjp_row(src, dst, shape, st, base, gs, os, n, m, start, step, r):
    off = _rows.row_offsets(r, shape, st, base)
    zero = dst.dtype.type(0)
    for i in range(n):
        dst[off[1] + i * os] = zero
    for j in range(m):
        dst[off[1] + (start + j * step) * os] = src[off[0] + j * gs]


@njit(cache=True, nogil=True)
def slice_vjp_serial(src, dst, shape, st, base, gs, os, n, m, start, step, count):
    for r in range(count):
        _slice_vjp_row(src, dst, shape, st, base, gs, os, n, m, start, step, r)


@njit(cache=True, nogil=True, parallel=True)
def slice_vjp_parallel(src, dst, shape, st, base, gs, os, n, m, start, step, count):
    for r in prange(count):
        _slice_vjp_row(src, dst, shape, st, base, gs, os, n, m, start, step, r)


SLICE_VJP = Twins(slice_vjp_serial, slice_vjp_parallel)


def _slice_geometry(node: Node) -> tuple[int, int, int, int]:
    """(n, m, start, step): the reference's extent along the axis, the cotangent's, the slice."""
    a, t = node.attributes, node.input_types[1]
    n = t.size_of(a["axis"])
    return n, slice_extent(n, a["start"], a["stop"], a["step"]), a["start"], a["step"]


def _slice_vjp_rows(node: Node, gstr: Sequence[int]):
    g, t, axis = node.input_types[0], node.output_type, node.attributes["axis"]
    ostr = c_strides(t.shape)
    r = _row_space(t, axis, [(g, gstr), (t, ostr)])
    return r, (_rows.along(g, axis, gstr), _rows.along(t, axis, ostr))


def _cpu_slice_vjp(node: Node):
    geometry = _slice_geometry(node)
    prepared: dict[tuple, tuple] = {}

    def run(inputs: Sequence[np.ndarray], out: np.ndarray) -> None:
        src, off, strides = flat_view(inputs[0])
        args = prepared.get(strides)
        if args is None:
            r, along = _slice_vjp_rows(node, strides)
            kernel = SLICE_VJP.pick(_rows.parallel_rows(r.count, node.output_type.elements))
            args = prepared[strides] = (kernel, r, along)
        kernel, r, (gs, os) = args
        kernel(src, out_bits(out), r.shape, r.strides, _i64([off, 0]), gs, os, *geometry, r.count)
    run.warm = SLICE_VJP.warm
    if _compilable(*node.input_types, node.output_type):
        r, along = _slice_vjp_rows(node, c_strides(node.input_types[0].shape))
        kernel = SLICE_VJP.pick(_rows.parallel_rows(r.count, node.output_type.elements))
        bits = BITS[numpy_dtype(node.output_type.dtype).itemsize].__name__
        run.compiled = CompiledCall(kernel, (flat_input(0, view=bits), flat_output(view=bits), const_array(r.shape),
                                             const_array(r.strides), const_array(_i64([0, 0])),
                                             *map(const_int, (*along, *geometry, r.count))))
    return run


CUDA_SLICE_VJP_SOURCE = '''"""Generated by atoms.gradient: slice-vjp, one thread per output element."""
from numba import cuda

from atoms._rows_cuda import row_offset


@cuda.jit(cache=True)
def kernel(src, dst, shape, st, gs, os, n, m, start, step, total):
    t = cuda.grid(1)
    step_t = cuda.gridsize(1)
    while t < total:
        i = t % n
        r = t // n
        o = row_offset(r, shape, st, 1) + i * os
        j = i - start
        if j >= 0 and j % step == 0 and j // step < m:
            dst[o] = src[row_offset(r, shape, st, 0) + (j // step) * gs]
        else:
            dst[o] = 0
        t += step_t
'''


def _cuda_slice_vjp(node: Node):
    from numba import cuda

    from runtime.backends.cuda_codegen import SpaceKernel

    kernel = SpaceKernel("cuslicevjp", CUDA_SLICE_VJP_SOURCE)
    r, (gs, os) = _slice_vjp_rows(node, c_strides(node.input_types[0].shape))
    shape, st = cuda.to_device(r.shape), cuda.to_device(r.strides)
    geometry = _slice_geometry(node)
    total = node.output_type.elements

    def run(inputs, out) -> None:
        kernel([device_bits(inputs[0]), out_bits(out), shape, st, gs, os, *geometry, total], total)
    return run


# --- window-vjp@1 ---------------------------------------------------------------------------------

_WINDOW_SHIM = AtomSpec(name="window-vjp", refs=(WINDOW_VJP_REF,), inputs=("reference",), attributes=WINDOW_KEYS,
                        infer=infer_window)


def infer_window_vjp(ctx: InferContext) -> TensorType:
    want = infer_window(_on(ctx, _WINDOW_SHIM, 1))  # window's attribute and run-time checks
    require_cotangent(ctx, 0, want, "window(reference)")
    ref = ctx.operands[1]
    return ctx.output(ref.axes, ref.sizes, like=1)


def _window_geometry(node: Node) -> tuple[int, int, int, int, int, int]:
    """(N, P, K, S, D, L)."""
    a = node.attributes
    return (node.output_type.size_of(a["axis"]), node.input_types[0].size_of(a["output_axis"]),
            a["kernel_size"], a["stride"], a["dilation"], a["padding"][0])


def window_compute_dtype(dtype: str) -> np.dtype:
    """c(float32, d): float64 for float64, float32 otherwise."""
    return np.dtype(np.float64 if dtype == "float64" else np.float32)


def _ref_window_vjp(node: Node):
    t = node.output_type
    q = t.axes.index(node.attributes["axis"])
    n, p, k, s, d, left = _window_geometry(node)
    acc = window_compute_dtype(t.dtype)

    def run(inputs: Sequence[np.ndarray], out: np.ndarray) -> None:
        g = np.moveaxis(np.asarray(inputs[0]), (q, q + 1), (-2, -1))  # (..., P, K)
        total = np.zeros(g.shape[:-2] + (n,), acc)
        for i in range(p):  # ascending p, and for one p each target n once: ascending (p, k)
            x = i * s - left + np.arange(k) * d
            inside = (x >= 0) & (x < n)
            total[..., x[inside]] += g[..., i, :][..., inside].astype(acc)
        out[...] = np.moveaxis(total, -1, q)  # rounded once
    return run


@njit(inline="always", nogil=True)
def _window_vjp_row(src, dst, shape, st, base, gp, gk, os, n, p, k, s, d, left, r):
    off = _rows.row_offsets(r, shape, st, base)
    for x in range(n):
        acc = dst.dtype.type(0)
        u0 = x + left  # = p·S + k·D for every tap of x
        hi = min(u0 // s, p - 1)
        lo = u0 - (k - 1) * d
        lo = 0 if lo <= 0 else (lo + s - 1) // s
        for i in range(lo, hi + 1):
            u = u0 - i * s
            if u % d == 0:
                acc += src[off[0] + i * gp + (u // d) * gk]
        dst[off[1] + x * os] = acc


@njit(cache=True, nogil=True)
def window_vjp_serial(src, dst, shape, st, base, gp, gk, os, n, p, k, s, d, left, count):
    for r in range(count):
        _window_vjp_row(src, dst, shape, st, base, gp, gk, os, n, p, k, s, d, left, r)


@njit(cache=True, nogil=True, parallel=True)
def window_vjp_parallel(src, dst, shape, st, base, gp, gk, os, n, p, k, s, d, left, count):
    for r in prange(count):
        _window_vjp_row(src, dst, shape, st, base, gp, gk, os, n, p, k, s, d, left, r)


WINDOW_VJP = Twins(window_vjp_serial, window_vjp_parallel)


def _window_vjp_rows(node: Node, gstr: Sequence[int]):
    g, t, a = node.input_types[0], node.output_type, node.attributes
    ostr = c_strides(t.shape)
    names = [x for x in t.axes if x != a["axis"]]
    r = _rows.rows(t, a["axis"], [(g, names, gstr), (t, names, ostr)])
    return r, (_rows.along(g, a["output_axis"], gstr), _rows.along(g, a["window_axis"], gstr),
               _rows.along(t, a["axis"], ostr))


def _cpu_window_vjp(node: Node):
    _float_kernel_dtype(node, "cpu")
    geometry = _window_geometry(node)
    prepared: dict[tuple, tuple] = {}

    def run(inputs: Sequence[np.ndarray], out: np.ndarray) -> None:
        src, off, strides = _flat(inputs[0])
        args = prepared.get(strides)
        if args is None:
            r, along = _window_vjp_rows(node, strides)
            kernel = WINDOW_VJP.pick(_rows.parallel_rows(r.count, node.output_type.elements))
            args = prepared[strides] = (kernel, r, along)
        kernel, r, (gp, gk, os) = args
        kernel(src, _flat_out(out), r.shape, r.strides, _i64([off, 0]), gp, gk, os, *geometry, r.count)
    run.warm = WINDOW_VJP.warm
    if _compilable(*node.input_types, node.output_type):
        r, along = _window_vjp_rows(node, c_strides(node.input_types[0].shape))
        kernel = WINDOW_VJP.pick(_rows.parallel_rows(r.count, node.output_type.elements))
        run.compiled = CompiledCall(kernel, (flat_input(0), FLAT_OUTPUT, const_array(r.shape), const_array(r.strides),
                                             const_array(_i64([0, 0])), *map(const_int, (*along, *geometry, r.count))))
    return run


CUDA_WINDOW_VJP_SOURCE = '''"""Generated by atoms.gradient: window-vjp ({dtype}), one thread per output element,
the taps of each gathered in ascending (p, k)."""
import numpy as np
from numba import cuda

from atoms._rows_cuda import row_offset


@cuda.jit(cache=True)
def kernel(src, dst, shape, st, gp, gk, os, n, p, k, s, d, left, total):
    t = cuda.grid(1)
    step = cuda.gridsize(1)
    while t < total:
        x = t % n
        r = t // n
        a = row_offset(r, shape, st, 0)
        u0 = x + left
        hi = min(u0 // s, p - 1)
        lo = u0 - (k - 1) * d
        if lo <= 0:
            lo = 0
        else:
            lo = (lo + s - 1) // s
        acc = np.{dtype}(0)
        for i in range(lo, hi + 1):
            u = u0 - i * s
            if u % d == 0:
                acc += src[a + i * gp + (u // d) * gk]
        dst[row_offset(r, shape, st, 1) + x * os] = acc
        t += step
'''


def _cuda_window_vjp(node: Node):
    from numba import cuda

    from runtime.backends.cuda_codegen import SpaceKernel

    _float_kernel_dtype(node, "cuda")
    kernel = SpaceKernel("cuwindowvjp", CUDA_WINDOW_VJP_SOURCE.replace("{dtype}", node.output_type.dtype))
    r, (gp, gk, os) = _window_vjp_rows(node, c_strides(node.input_types[0].shape))
    shape, st = cuda.to_device(r.shape), cuda.to_device(r.strides)
    geometry = _window_geometry(node)
    total = node.output_type.elements

    def run(inputs, out) -> None:
        kernel([_device_flat(inputs[0]), _device_flat(out), shape, st, gp, gk, os, *geometry, total], total)
    return run


# --- the specs --------------------------------------------------------------------------------------

def _kernels(reference, cpu, cuda) -> dict:
    return {"reference": node_kernel(reference), "cpu": node_kernel(cpu), "cuda": node_kernel(cuda)}


def linear_fill(node: Node) -> Linear | None:
    """A fill of 0 is linear in no operand (a sum over any free axis: scatter-add's zero base)."""
    value = node.attributes["value"]
    return Linear((), True) if value == 0 and not isinstance(value, bool) else None


SPECS = [
    AtomSpec(name="fill", refs=(FILL_REF,), inputs=("reference",), dtypes={"reference": "any"},
             attributes=frozenset({"axes", "dtype", "value"}), infer=infer_fill,
             kernels=_kernels(_ref_fill, _cpu_fill, _cuda_fill), elementwise=fill_op,
             half_native=HALF_NATIVE, inplace=0, free_axes=every_axis, types_only=(0,), linear=linear_fill,
             summary="a constant over some of the reference's axes (its values are never read)"),
    AtomSpec(name="scalar-map-vjp", refs=(SCALAR_MAP_VJP_REF,), inputs=("value", "cotangent"),
             dtypes={"value": "floating", "cotangent": "floating"},
             attributes=frozenset({"mode", "accumulation_dtype"}), infer=infer_scalar_map_vjp,
             kernels={"reference": node_kernel(_ref_scalar_map_vjp), "cpu": _elementwise_cpu,
                      "cuda": _elementwise_cuda},
             elementwise=lambda node: ScalarOp(VJP_EXPRS[node.attributes["mode"]]), inplace=1,
             free_axes=every_axis,
             summary="ȳ·f′(x) for every scalar-map@2 mode, elementwise; in c(acc, d), rounded once"),
    AtomSpec(name="masked-softmax-vjp", refs=(MASKED_SOFTMAX_VJP_REF,), inputs=("y", "cotangent"),
             dtypes={"y": "floating", "cotangent": "floating"},
             attributes=frozenset({"axis", "accumulation_dtype"}), infer=infer_masked_softmax_vjp,
             kernels=_kernels(_ref_masked_softmax_vjp, _cpu_masked_softmax_vjp, _cuda_masked_softmax_vjp),
             inplace=1, free_axes=axes_except("axis"),
             summary="y ⊙ (ȳ − Σ_axis ȳ⊙y) of a masked-softmax output y; exactly 0 where y = 0"),
    AtomSpec(name="slice-vjp", refs=(SLICE_VJP_REF,), inputs=("cotangent", "reference"),
             dtypes={"cotangent": "floating", "reference": "floating"},
             attributes=SLICE_KEYS, infer=infer_slice_vjp,
             kernels=_kernels(_ref_slice_vjp, _cpu_slice_vjp, _cuda_slice_vjp),
             half_native=HALF_NATIVE, inplace=1, free_axes=axes_except("axis"),
             summary="zeros of the reference's type with the cotangent at the positions a slice selects"),
    AtomSpec(name="window-vjp", refs=(WINDOW_VJP_REF,), inputs=("cotangent", "reference"),
             dtypes={"cotangent": "floating", "reference": "floating"},
             attributes=WINDOW_KEYS, infer=infer_window_vjp,
             kernels=_kernels(_ref_window_vjp, _cpu_window_vjp, _cuda_window_vjp),
             inplace=1, free_axes=axes_except("axis"),
             summary="the reference's type: each position's window taps of the cotangent summed in "
                     "ascending (p, k), in c(float32, d); padding taps dropped"),
]
