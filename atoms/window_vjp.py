"""window-vjp@1 (SPEC §3c): the reference's type, each position's window taps of the
cotangent summed in ascending (p, k), in c(float32, d); padding taps dropped. It gathers the
≤ K taps of each output element, so it needs no atomics and gives the same bits on every
backend: serial and parallel twins on the CPU, one thread per output element on CUDA."""
from __future__ import annotations

from collections.abc import Sequence

import numpy as np
from numba import njit, prange

from runtime.core.types import TensorType
from runtime.plugins.atomspec import AtomSpec, InferContext, Node, axes_except
from runtime.plugins.kernel import (FLAT_OUTPUT, CompiledCall, Kernel, KernelRequest, const_array, const_int,
                                    flat_input, plain_kernel)
from runtime.toolkit import Twins

from . import _rows
from ._grad import (WINDOW_VJP_REF, _compilable, _device_flat, _flat, _flat_out, _float_kernel_dtype,
                    _kernels, _on, require_cotangent)
from .layout import _i64, c_strides
from .window import infer_window

WINDOW_KEYS = frozenset({"axis", "output_axis", "window_axis", "kernel_size", "stride", "dilation",
                         "padding", "output_size"})

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


def _ref_window_vjp(request: KernelRequest) -> Kernel:
    node = request.node
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
    return plain_kernel(run)


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


def _cpu_window_vjp(request: KernelRequest) -> Kernel:
    node = request.node
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
    compiled = None
    if _compilable(*node.input_types, node.output_type):
        r, along = _window_vjp_rows(node, c_strides(node.input_types[0].shape))
        kernel = WINDOW_VJP.pick(_rows.parallel_rows(r.count, node.output_type.elements))
        compiled = CompiledCall(kernel, (flat_input(0), FLAT_OUTPUT, const_array(r.shape), const_array(r.strides),
                                         const_array(_i64([0, 0])), *map(const_int, (*along, *geometry, r.count))))
    return plain_kernel(run, warm=WINDOW_VJP.warm, compiled=compiled)


def _cuda_window_vjp(request: KernelRequest) -> Kernel:
    from numba import cuda

    from atoms.cuda import window_vjp as device  # numba.cuda loads with the first cuda kernel
    from runtime.toolkit.cuda import SpaceKernel

    node = request.node
    _float_kernel_dtype(node, "cuda")
    kernel = SpaceKernel.of(device.window_vjp)
    zero = np.dtype(node.output_type.dtype).type(0)  # the accumulator's start, of the output's dtype
    r, (gp, gk, os) = _window_vjp_rows(node, c_strides(node.input_types[0].shape))
    shape, st = cuda.to_device(r.shape), cuda.to_device(r.strides)
    geometry = _window_geometry(node)
    total = node.output_type.elements

    def run(inputs, out) -> None:
        kernel([_device_flat(inputs[0]), _device_flat(out), shape, st, gp, gk, os, *geometry, total, zero], total)
    return plain_kernel(run)


SPECS = [
    AtomSpec(name="window-vjp", refs=(WINDOW_VJP_REF,), inputs=("cotangent", "reference"),
             dtypes={"cotangent": "floating", "reference": "floating"},
             attributes=WINDOW_KEYS, infer=infer_window_vjp,
             kernels=_kernels(_ref_window_vjp, _cpu_window_vjp, _cuda_window_vjp),
             inplace=1, free_axes=axes_except("axis"),
             summary="the reference's type: each position's window taps of the cotangent summed in "
                     "ascending (p, k), in c(float32, d); padding taps dropped"),
]
