"""slice-vjp@1 (SPEC §3c): zeros of the reference's type with the cotangent at the positions a
slice selects; rows of raw bits (half-native), serial and parallel twins on the CPU, one
thread per output element on CUDA."""
from __future__ import annotations

from collections.abc import Sequence

import numpy as np
from numba import njit, prange

from runtime.core.types import TensorType, numpy_dtype
from runtime.plugins.atomspec import AtomSpec, InferContext, Node, axes_except
from runtime.plugins.kernel import (CompiledCall, Kernel, KernelRequest, const_array, const_int, flat_input,
                                    flat_output, plain_kernel)
from runtime.toolkit import Twins

from . import _rows
from ._grad import HALF_NATIVE, SLICE_VJP_REF, _compilable, _kernels, _on, _row_space, require_cotangent
from .layout import BITS, _i64, c_strides, device_bits, flat_view, infer_slice, out_bits, slice_extent

SLICE_KEYS = frozenset({"axis", "start", "stop", "step"})

_SLICE_SHIM = AtomSpec(name="slice-vjp", refs=(SLICE_VJP_REF,), inputs=("reference",), attributes=SLICE_KEYS,
                       infer=infer_slice)


def infer_slice_vjp(ctx: InferContext) -> TensorType:
    want = infer_slice(_on(ctx, _SLICE_SHIM, 1))  # the attributes, checked as slice checks them
    require_cotangent(ctx, 0, want, "slice(reference)")
    ref = ctx.operands[1]
    return ctx.output(ref.axes, ref.sizes, like=1)


def _ref_slice_vjp(request: KernelRequest) -> Kernel:
    node = request.node
    t, a = node.input_types[1], node.attributes
    p = t.axes.index(a["axis"])
    index = tuple(slice(a["start"], a["stop"], a["step"]) if k == p else slice(None) for k in range(t.rank))

    def run(inputs: Sequence[np.ndarray], out: np.ndarray) -> None:
        out[...] = 0
        out[index] = np.asarray(inputs[0])  # a copy: the cotangent's bits, -0.0 included
    return plain_kernel(run)


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


def _cpu_slice_vjp(request: KernelRequest) -> Kernel:
    node = request.node
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
    compiled = None
    if _compilable(*node.input_types, node.output_type):
        r, along = _slice_vjp_rows(node, c_strides(node.input_types[0].shape))
        kernel = SLICE_VJP.pick(_rows.parallel_rows(r.count, node.output_type.elements))
        bits = BITS[numpy_dtype(node.output_type.dtype).itemsize].__name__
        compiled = CompiledCall(kernel, (flat_input(0, view=bits), flat_output(view=bits), const_array(r.shape),
                                         const_array(r.strides), const_array(_i64([0, 0])),
                                         *map(const_int, (*along, *geometry, r.count))))
    return plain_kernel(run, warm=SLICE_VJP.warm, compiled=compiled)


def _cuda_slice_vjp(request: KernelRequest) -> Kernel:
    from numba import cuda

    from atoms.cuda import slice_vjp as device  # numba.cuda loads with the first cuda kernel
    from runtime.toolkit.cuda import SpaceKernel

    node = request.node
    kernel = SpaceKernel.of(device.slice_vjp)
    r, (gs, os) = _slice_vjp_rows(node, c_strides(node.input_types[0].shape))
    shape, st = cuda.to_device(r.shape), cuda.to_device(r.strides)
    geometry = _slice_geometry(node)
    total = node.output_type.elements

    def run(inputs, out) -> None:
        kernel([device_bits(inputs[0]), out_bits(out), shape, st, gs, os, *geometry, total], total)
    return plain_kernel(run)


SPECS = [
    AtomSpec(name="slice-vjp", refs=(SLICE_VJP_REF,), inputs=("cotangent", "reference"),
             dtypes={"cotangent": "floating", "reference": "floating"},
             attributes=SLICE_KEYS, infer=infer_slice_vjp,
             kernels=_kernels(_ref_slice_vjp, _cpu_slice_vjp, _cuda_slice_vjp),
             half_native=HALF_NATIVE, inplace=1, free_axes=axes_except("axis"),
             summary="zeros of the reference's type with the cotangent at the positions a slice selects"),
]
