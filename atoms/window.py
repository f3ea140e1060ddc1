"""window@1 and axis-index@1 (SPEC §3b): sliding windows along one axis, and an axis's positions.

window moves raw bits (any dtype, half included) with one row kernel per item size: a row is
one coordinate of the value's other axes, and for each (p, k) the source index is
``p·S − L + k·D``; an index outside [0, N) stores zero bits (0 for numbers, false for boolean),
so padding needs no padded copy and no scratch.
"""
from __future__ import annotations

from collections.abc import Sequence

import numpy as np
from numba import njit, prange

from runtime.plugins.atomspec import AtomSpec, InferContext, Node, axes_except, no_axis
from runtime.toolkit import Twins
from runtime.plugins.kernel import Kernel, KernelRequest, plain_kernel
from runtime.core.errors import fail, json_kind
from runtime.core.types import NAME_RE, TensorType

from . import _rows
from ._refs import refs_for
from .layout import _i64, c_strides, device_bits, flat_view, out_bits

HALF_NATIVE = frozenset({"cpu", "cuda"})  # data movement: half values are copied as bits


# --- infer -------------------------------------------------------------------------------------

def window_extent(n: int, k: int, s: int, d: int, pad: tuple[int, int]) -> int:
    """P = floor((N + L + R - D·(K-1) - 1) / S) + 1 (may be < 1: no window fits)."""
    return (n + pad[0] + pad[1] - d * (k - 1) - 1) // s + 1


def _new_axis(ctx: InferContext, key: str) -> str:
    name = ctx.attributes[key]
    if not isinstance(name, str) or not NAME_RE.match(name):
        ctx.bad_attr(key, f"expected an axis name matching {NAME_RE.pattern}, got {name!r}")
    if name in ctx.operands[0].axes:
        ctx.bad_attr(key, f"{name!r} is already an axis of {ctx.atom.inputs[0]} "
                          f"(axes {list(ctx.operands[0].axes)}); it must be a new name")
    return name


# Integer attributes that kernels receive as int64 must stay far from its range (any larger
# value would only describe tensors no limit admits).
MAX_INT_ATTRIBUTE = 1 << 48


def bounded_int(ctx: InferContext, key: str, minimum: int) -> int:
    v = ctx.attr_int(key, minimum=minimum)
    if v > MAX_INT_ATTRIBUTE:
        ctx.bad_attr(key, f"{v} exceeds the supported maximum {MAX_INT_ATTRIBUTE}")
    return v


def window_params(ctx: InferContext) -> tuple[int, int, int, tuple[int, int]]:
    k = bounded_int(ctx, "kernel_size", 1)
    s = bounded_int(ctx, "stride", 1)
    d = bounded_int(ctx, "dilation", 1)
    pad = ctx.attributes["padding"]
    if (not isinstance(pad, list) or len(pad) != 2
            or any(isinstance(p, bool) or not isinstance(p, int) or not 0 <= p <= MAX_INT_ATTRIBUTE for p in pad)):
        ctx.bad_attr("padding", f"expected [L, R], two integers in [0, {MAX_INT_ATTRIBUTE}], got {pad!r}")
    return k, s, d, (pad[0], pad[1])


def infer_window(ctx: InferContext) -> TensorType:
    t = ctx.operands[0]
    axis = ctx.axis_of("axis", 0)
    out_axis, win_axis = _new_axis(ctx, "output_axis"), _new_axis(ctx, "window_axis")
    if out_axis == win_axis:
        ctx.bad_attr("window_axis", f"output_axis and window_axis are both {out_axis!r}")
    k, s, d, pad = window_params(ctx)
    size = ctx.attributes["output_size"]
    if isinstance(size, bool) or not (size is None or isinstance(size, (int, str))):
        ctx.bad_attr("output_size", f"expected an integer, a symbol or null, got {json_kind(size)}")
    if isinstance(size, str) and not NAME_RE.match(size):
        ctx.bad_attr("output_size", f"symbol {size!r} does not match {NAME_RE.pattern}")
    if isinstance(size, int) and size < 1:
        ctx.bad_attr("output_size", f"expected an integer >= 1, got {size}")
    n = t.size_of(axis)
    where = ctx.attr_path("output_size")
    if isinstance(n, int):
        p = window_extent(n, k, s, d, pad)
        if ctx.planning and size is not None:  # N was symbolic at load: its run-time checks
            if p < 1 or (isinstance(size, int) and size != p):
                fail("binding_shape", where,
                     f"window: axis {axis!r} has extent {n}, which gives {p} windows "
                     f"(kernel_size {k}, stride {s}, dilation {d}, padding {list(pad)}); "
                     f"output_size is {size}")
            if isinstance(size, str) and ctx.dims.get(size, p) != p:
                fail("symbol_conflict", where,
                     f"window: output_size symbol {size!r} is bound to {ctx.dims[size]} but axis "
                     f"{axis!r} (extent {n}) gives {p} windows")
        elif p < 1:
            ctx.bad_attr("kernel_size", f"no window fits: axis {axis!r} has extent {n}, kernel_size {k}, "
                                        f"dilation {d}, padding {list(pad)} give {p} windows")
        elif isinstance(size, int) and size != p:
            ctx.mismatch(f"output_size {size} differs from the {p} windows axis {axis!r} (extent {n}) gives")
        extent = size if isinstance(size, str) and not ctx.planning else p
    elif size is None:
        ctx.bad_attr("output_size", f"axis {axis!r} is symbolic ({n!r}): output_size must be an "
                                    f"integer or a symbol, not null")
    else:
        extent = size
    axes, sizes = [], []
    for a, z in zip(t.axes, t.sizes):
        axes.extend([out_axis, win_axis] if a == axis else [a])
        sizes.extend([extent, k] if a == axis else [z])
    return ctx.output(axes, sizes)


def infer_axis_index(ctx: InferContext) -> TensorType:
    t = ctx.operands[0]
    axis = ctx.axis_of("axis", 0)
    return TensorType((axis,), (t.size_of(axis),), "int64", t.domain)


# --- window kernels ------------------------------------------------------------------------------

def window_rows(node: Node, strides: Sequence[int]) -> tuple[_rows.Rows, tuple[int, int, int]]:
    """Rows of the value along ``axis``: (rows over value and out, strides along the value axis,
    the output axis and the window axis)."""
    t, o = node.input_types[0], node.output_type
    a = node.attributes
    names = [x for x in t.axes if x != a["axis"]]
    ostr = c_strides(o.shape)
    r = _rows.rows(t, a["axis"], [(t, names, strides), (o, names, ostr)])
    return r, (_rows.along(t, a["axis"], strides), ostr[o.axes.index(a["output_axis"])],
               ostr[o.axes.index(a["window_axis"])])


@njit(inline="always", nogil=True)
def _window_row(src, dst, shape, st, base, vs, op, ok, n, p, k, s, d, left, r):
    off = _rows.row_offsets(r, shape, st, base)
    zero = dst.dtype.type(0)
    for i in range(p):
        for j in range(k):
            x = i * s - left + j * d
            dst[off[1] + i * op + j * ok] = src[off[0] + x * vs] if 0 <= x < n else zero


@njit(cache=True, nogil=True)
def window_serial(src, dst, shape, st, base, vs, op, ok, n, p, k, s, d, left, count):
    for r in range(count):
        _window_row(src, dst, shape, st, base, vs, op, ok, n, p, k, s, d, left, r)


@njit(cache=True, nogil=True, parallel=True)
def window_parallel(src, dst, shape, st, base, vs, op, ok, n, p, k, s, d, left, count):
    for r in prange(count):
        _window_row(src, dst, shape, st, base, vs, op, ok, n, p, k, s, d, left, r)


WINDOW = Twins(window_serial, window_parallel)


def _geometry(node: Node) -> tuple[int, int, int, int, int, int]:
    a, t = node.attributes, node.input_types[0]
    return (t.size_of(a["axis"]), node.output_type.size_of(a["output_axis"]), a["kernel_size"], a["stride"],
            a["dilation"], a["padding"][0])


def _cpu_window(request: KernelRequest) -> Kernel:
    node = request.node
    geometry = _geometry(node)
    prepared: dict[tuple, tuple] = {}

    def run(inputs: Sequence[np.ndarray], out: np.ndarray) -> None:
        src, off, strides = flat_view(inputs[0])
        args = prepared.get(strides)
        if args is None:
            r, along = window_rows(node, strides)
            kernel = WINDOW.pick(_rows.parallel_rows(r.count, node.output_type.elements))
            args = prepared[strides] = (kernel, r, along)
        kernel, r, (vs, op, ok) = args
        kernel(src, out_bits(out), r.shape, r.strides, _i64([off, 0]), vs, op, ok, *geometry, r.count)
    return plain_kernel(run, warm=WINDOW.warm)


def _cuda_window(request: KernelRequest) -> Kernel:
    from numba import cuda

    from atoms.cuda import window as device  # numba.cuda loads with the first cuda kernel
    from runtime.toolkit.cuda import SpaceKernel

    node = request.node
    kernel = SpaceKernel.of(device.window)
    r, (vs, op, ok) = window_rows(node, c_strides(node.input_types[0].shape))
    shape, st = cuda.to_device(r.shape), cuda.to_device(r.strides)
    geometry = _geometry(node)
    total = node.output_type.elements

    def run(inputs, out) -> None:
        kernel([device_bits(inputs[0]), out_bits(out), shape, st, vs, op, ok, *geometry, total], total)
    return plain_kernel(run)


def _ref_window(request: KernelRequest) -> Kernel:
    node = request.node
    t = node.input_types[0]
    q = t.axes.index(node.attributes["axis"])
    n, p, k, s, d, left = _geometry(node)
    where = np.arange(p)[:, None] * s - left + np.arange(k)[None, :] * d  # (P, K) source indices
    inside = (where >= 0) & (where < n)

    def run(inputs, out):
        taken = np.take(np.asarray(inputs[0]), np.clip(where, 0, n - 1), axis=q)
        keep = inside.reshape((1,) * q + (p, k) + (1,) * (t.rank - q - 1))
        out[...] = np.where(keep, taken, np.zeros((), taken.dtype))
    return plain_kernel(run)


# --- axis-index kernels ---------------------------------------------------------------------------

@njit(cache=True, nogil=True)
def fill_positions(out):
    for i in range(out.shape[0]):
        out[i] = i


def _cpu_axis_index(request: KernelRequest) -> Kernel:
    def run(inputs, out) -> None:
        fill_positions(out)
    return plain_kernel(run)


def _cuda_axis_index(request: KernelRequest) -> Kernel:
    from atoms.cuda import window as device  # numba.cuda loads with the first cuda kernel
    from runtime.toolkit.cuda import SpaceKernel

    node = request.node
    kernel = SpaceKernel.of(device.axis_index)
    n = node.output_type.elements

    def run(inputs, out) -> None:
        kernel([out, n], n)
    return plain_kernel(run)


def _ref_axis_index(request: KernelRequest) -> Kernel:
    def run(inputs, out):
        out[...] = np.arange(out.shape[0], dtype=np.int64)
    return plain_kernel(run)


SPECS = [
    AtomSpec(name="window", refs=refs_for("window"), inputs=("value",),
             dtypes={"value": "any"},
             attributes=frozenset({"axis", "output_axis", "window_axis", "kernel_size", "stride", "dilation",
                                   "padding", "output_size"}),
             infer=infer_window, kernels={"reference": _ref_window, "cpu": _cpu_window, "cuda": _cuda_window},
             half_native=HALF_NATIVE,
             free_axes=axes_except("output_axis", "window_axis"),
             summary="sliding windows along one axis (kernel, stride, dilation, zero padding)"),
    AtomSpec(name="axis-index", refs=refs_for("axis-index"), inputs=("reference",),
             dtypes={"reference": "any"},
             attributes=frozenset({"axis"}), infer=infer_axis_index,
             kernels={"reference": _ref_axis_index, "cpu": _cpu_axis_index, "cuda": _cuda_axis_index},
             half_native=HALF_NATIVE,
             free_axes=no_axis,
             summary="the positions 0..n-1 of one axis of the reference (int64)"),
]
