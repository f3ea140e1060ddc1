"""masked-softmax-vjp@1 (SPEC §3c): y ⊙ (ȳ − Σ_axis ȳ⊙y) of a masked-softmax output y, a
row kernel in the style of atoms/window.py (a row is one coordinate of the other axes,
atoms/_rows.py): serial and parallel ``@njit`` twins on the CPU, one thread per row on CUDA."""
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
from ._grad import (MASKED_SOFTMAX_VJP_REF, _compilable, _device_flat, _flat, _flat_out, _float_kernel_dtype,
                    _kernels, _row_space, require_pair)
from .elementwise import _acc
from .layout import _i64, c_strides

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


def _ref_masked_softmax_vjp(request: KernelRequest) -> Kernel:
    node = request.node
    position = node.input_types[0].axes.index(node.attributes["axis"])
    acc = _acc(node)

    def run(inputs: Sequence[np.ndarray], out: np.ndarray) -> None:
        y, g = (np.asarray(v).astype(acc) for v in inputs)
        out[...] = masked_softmax_vjp_numpy(y, g, position)
    return plain_kernel(run)


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


def _cpu_masked_softmax_vjp(request: KernelRequest) -> Kernel:
    node = request.node
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
    compiled = None
    if _compilable(*node.input_types, node.output_type):  # C-contiguous operands: their C strides
        strides = c_strides(node.input_types[0].shape)
        r, along = _msv_rows(node, strides, strides)
        kernel = MASKED_SOFTMAX_VJP.pick(_rows.parallel_rows(r.count, node.output_type.elements))
        compiled = CompiledCall(kernel, (flat_input(0), flat_input(1), FLAT_OUTPUT, const_array(r.shape),
                                         const_array(r.strides), const_array(_i64([0, 0, 0])),
                                         *map(const_int, (*along, n, r.count))))
    return plain_kernel(run, warm=MASKED_SOFTMAX_VJP.warm, compiled=compiled)


def _cuda_masked_softmax_vjp(request: KernelRequest) -> Kernel:
    from numba import cuda

    from atoms.cuda import softmax_vjp as device  # numba.cuda loads with the first cuda kernel
    from runtime.toolkit.cuda import SpaceKernel

    node = request.node
    _float_kernel_dtype(node, "cuda")
    kernel = SpaceKernel.of(device.masked_softmax_vjp)
    t = node.input_types[0]
    strides = c_strides(t.shape)
    r, (ys, gs, os) = _msv_rows(node, strides, strides)
    shape, st = cuda.to_device(r.shape), cuda.to_device(r.strides)
    n = t.size_of(node.attributes["axis"])

    def run(inputs, out) -> None:
        y, g = (_device_flat(x) for x in inputs)
        kernel([y, g, _device_flat(out), shape, st, ys, gs, os, n, r.count], r.count)
    return plain_kernel(run)


SPECS = [
    AtomSpec(name="masked-softmax-vjp", refs=(MASKED_SOFTMAX_VJP_REF,), inputs=("y", "cotangent"),
             dtypes={"y": "floating", "cotangent": "floating"},
             attributes=frozenset({"axis", "accumulation_dtype"}), infer=infer_masked_softmax_vjp,
             kernels=_kernels(_ref_masked_softmax_vjp, _cpu_masked_softmax_vjp, _cuda_masked_softmax_vjp),
             inplace=1, free_axes=axes_except("axis"),
             summary="y ⊙ (ȳ − Σ_axis ȳ⊙y) of a masked-softmax output y; exactly 0 where y = 0"),
]
