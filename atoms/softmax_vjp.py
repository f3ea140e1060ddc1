"""masked-softmax-vjp@1 (SPEC §3c): y ⊙ (ȳ − Σ_axis ȳ⊙y) of a masked-softmax output y, a
row kernel in the style of atoms/window.py (a row is one coordinate of the other axes,
atoms/_rows.py): serial and parallel ``@njit`` twins on the CPU, one thread per row on CUDA.
Rows that are contiguous in all three arrays (the softmax axis last, C order: attention's
[B, H, S, K]) take explicit vectors (``simd.ops``), the hidden entries zeroed by a
select: a branch per element kept the loop scalar, and a product there would be inf·0."""
from __future__ import annotations

from collections.abc import Sequence

import numpy as np
from numba import njit, prange

from runtime.core.types import TensorType
from runtime.plugins.atomspec import AtomSpec, InferContext, Node, axes_except
from runtime.plugins.kernel import (FLAT_OUTPUT, CompiledCall, Kernel, KernelRequest, const_array, const_int,
                                    flat_input, plain_kernel)
from runtime.toolkit.cpu import simd
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


def _vector_row(dt: str):
    """One contiguous row of ``n`` in ``dt``'s vectors (inlined into its callers): lanes summed
    in a fixed order (each lane in K order, then the lanes pairwise), so a row's result does not
    depend on the thread that computes it. The output may be ȳ's memory (``inplace``): each
    element of ȳ is read before it is written."""
    o = simd.ops(dt, wide=True)
    vload, vstore, vbcast, vzero, vhsum = o["load"], o["store"], o["bcast"], o["zero"], o["hsum"]
    vadd, vsub, vmul, vnzsel = o["add"], o["sub"], o["mul"], o["nzsel"]
    lanes = simd.lanes(dt, wide=True)
    zero = np.dtype(dt).type(0)

    @njit(inline="always", nogil=True)
    def row(y, g, dst, oy, og, od, n):
        acc = vzero()
        k = 0
        while k + lanes <= n:
            yv = vload(y, oy + k)
            acc = vadd(acc, vnzsel(yv, vmul(yv, vload(g, og + k))))
            k += lanes
        s = vhsum(acc)
        for t in range(k, n):
            v = y[oy + t]
            if v != 0:
                s += v * g[og + t]
        sv = vbcast(s)
        k = 0
        while k + lanes <= n:
            yv = vload(y, oy + k)
            vstore(dst, od + k, vnzsel(yv, vmul(yv, vsub(vload(g, og + k), sv))))
            k += lanes
        for t in range(k, n):
            v = y[oy + t]
            dst[od + t] = v * (g[og + t] - s) if v != 0 else zero

    return row


_vector_row_f32, _vector_row_f64 = _vector_row("float32"), _vector_row("float64")


# Twins over ``count`` contiguous rows of ``n`` (row r at ``oy + r * n``, ``og + r * n`` and
# ``r * n``). Module-level functions naming their row kernel as a global (a compiled driver
# imports them by these names too): Numba's disk cache keys a function by its code and the
# pickled values it closes over, and a closure over a dispatcher pickles differently in every
# process, so closures compiled again in each one.
@njit(cache=True, nogil=True)
def vector_rows_f32_serial(y, g, dst, oy, og, n, count):
    for r in range(count):
        _vector_row_f32(y, g, dst, oy + r * n, og + r * n, r * n, n)


@njit(cache=True, nogil=True, parallel=True)
def vector_rows_f32_parallel(y, g, dst, oy, og, n, count):
    for r in prange(count):
        _vector_row_f32(y, g, dst, oy + r * n, og + r * n, r * n, n)


@njit(cache=True, nogil=True)
def vector_rows_f64_serial(y, g, dst, oy, og, n, count):
    for r in range(count):
        _vector_row_f64(y, g, dst, oy + r * n, og + r * n, r * n, n)


@njit(cache=True, nogil=True, parallel=True)
def vector_rows_f64_parallel(y, g, dst, oy, og, n, count):
    for r in prange(count):
        _vector_row_f64(y, g, dst, oy + r * n, og + r * n, r * n, n)


VECTOR_ROWS = {"float32": Twins(vector_rows_f32_serial, vector_rows_f32_parallel),
               "float64": Twins(vector_rows_f64_serial, vector_rows_f64_parallel)}


def _msv_rows(node: Node, ystr: Sequence[int], gstr: Sequence[int]):
    t, axis = node.input_types[0], node.attributes["axis"]
    ostr = c_strides(t.shape)
    r = _row_space(t, axis, [(t, ystr), (t, gstr), (t, ostr)])
    return r, (_rows.along(t, axis, ystr), _rows.along(t, axis, gstr), _rows.along(t, axis, ostr))


def _contiguous_rows(node: Node, ystr: Sequence[int], gstr: Sequence[int]) -> bool:
    """Whether y, ȳ (with these element strides) and the C-order output all hold each row
    contiguously, row r at r * n: the softmax axis last, every array C-ordered."""
    t, axis = node.input_types[0], node.attributes["axis"]
    c = tuple(c_strides(t.shape))
    return t.axes[-1] == axis and all(tuple(st) == c or t.elements <= 1 for st in (ystr, gstr))


def _cpu_masked_softmax_vjp(request: KernelRequest) -> Kernel:
    node = request.node
    _float_kernel_dtype(node, "cpu")
    n = node.input_types[0].size_of(node.attributes["axis"])
    dt = node.input_types[0].dtype
    # vectors where the rows are contiguous and the sum is kept in the operands' dtype (the
    # scalar rows add in float64 whatever the operands)
    vector = VECTOR_ROWS.get(dt) if _acc(node) == np.dtype(dt) and node.input_types[1].dtype == dt else None
    prepared: dict[tuple, tuple] = {}

    def run(inputs: Sequence[np.ndarray], out: np.ndarray) -> None:
        (y, yo, ystr), (g, go, gstr) = _flat(inputs[0]), _flat(inputs[1])
        args = prepared.get((ystr, gstr))
        if args is None:
            r, along = _msv_rows(node, ystr, gstr)
            parallel = _rows.parallel_rows(r.count, node.output_type.elements)
            if vector is not None and _contiguous_rows(node, ystr, gstr):
                args = prepared[(ystr, gstr)] = (vector.pick(parallel), None, r.count)
            else:
                args = prepared[(ystr, gstr)] = (MASKED_SOFTMAX_VJP.pick(parallel), r, along)
        kernel, r, along = args
        if r is None:
            kernel(y, g, _flat_out(out), yo, go, n, along)
            return
        ys, gs, os = along
        kernel(y, g, _flat_out(out), r.shape, r.strides, _i64([yo, go, 0]), ys, gs, os, n, r.count)
    compiled = None
    if _compilable(*node.input_types, node.output_type):  # C-contiguous operands: their C strides
        strides = c_strides(node.input_types[0].shape)
        r, along = _msv_rows(node, strides, strides)
        parallel = _rows.parallel_rows(r.count, node.output_type.elements)
        if vector is not None and _contiguous_rows(node, strides, strides):
            compiled = CompiledCall(vector.pick(parallel), (flat_input(0), flat_input(1), FLAT_OUTPUT,
                                                            *map(const_int, (0, 0, n, r.count))))
        else:
            compiled = CompiledCall(MASKED_SOFTMAX_VJP.pick(parallel), (
                flat_input(0), flat_input(1), FLAT_OUTPUT, const_array(r.shape), const_array(r.strides),
                const_array(_i64([0, 0, 0])), *map(const_int, (*along, n, r.count))))

    def warm() -> None:
        for twins in (MASKED_SOFTMAX_VJP, vector) if vector is not None else (MASKED_SOFTMAX_VJP,):
            twins.warm()
    return plain_kernel(run, warm=warm, compiled=compiled)


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
