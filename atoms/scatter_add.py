"""scatter@2 (SPEC §3b): base plus updates added at indexed positions, repeated indices
accumulating. Its kernels walk rows of the updates along ``index_axis`` (one row per
coordinate of the other axes, ``atoms._rows``), each row owning distinct base elements, so
rows run in parallel and additions within a row run in order. Index values are checked on the
host first (``atoms.indexing.check_range``), and the kernels guard every index anyway.
"""
from __future__ import annotations

from collections.abc import Sequence

import numpy as np
from numba import njit, prange

from runtime.core.errors import fail
from runtime.core.types import TensorType, is_float
from runtime.toolkit import KERNEL_FLOATS, Twins, align_to, check_dtypes
from runtime.plugins.atomspec import AtomSpec, InferContext, Linear, Node, axes_except
from runtime.plugins.kernel import Kernel, KernelRequest, plain_kernel

from . import _rows
from ._refs import refs_for
from .indexing import check_gather, gather_type
from .layout import _i64, c_strides, device_bits, flat_view


def infer_scatter_add(ctx: InferContext) -> TensorType:
    ctx.attr_str("mode", ("add",))
    ctx.accumulation()
    ctx.require_dtype(0, "floating")
    expected = gather_type(ctx, version=2)
    tb, tu = ctx.operands[0], ctx.operands[2]
    if tu.axes != expected.axes:
        ctx.mismatch(f"updates must have axes {list(expected.axes)} (the gather of base by indices), "
                     f"got {list(tu.axes)}", 2)
    if ctx.planning and tb.dtype != tu.dtype and is_float(tb.dtype) and is_float(tu.dtype):
        fail("binding_dtype", f"{ctx.path}.input_slots[2]",
             f"scatter: base is bound as {tb.dtype} but updates as {tu.dtype}; floating operands "
             f"that must agree need one float dtype")
    if tu.dtype != expected.dtype:  # exactly: `floating` beside a concrete float dtype is no match
        ctx.mismatch(f"updates must have exactly the type gather(base, indices) gives: dtype "
                     f"{expected.dtype}, got {tu.dtype}", 2)
    ctx.require_same_dtype_domain(0, 2)
    for a, want, got in zip(tu.axes, expected.sizes, tu.sizes):
        ctx.require_extent(got, want, f"updates axis {a!r} against gather(base, indices)", 2)
    return ctx.output(tb.axes, tb.sizes)


def compute_dtype(dtype: str) -> np.dtype:
    """The dtype scatter@2 and segment add in: float64 for float64, else float32 (§3b.1: this
    runtime accumulates half operands in float32 under either accumulation policy)."""
    return np.dtype(np.float64 if dtype == "float64" else np.float32)


def float_kernel_dtype(node: Node, backend: str) -> np.dtype:
    """float32/float64 (half operands reach these kernels widened by the planner, §3b.1)."""
    check_dtypes(node, backend, KERNEL_FLOATS, (node.output_type,))
    return np.dtype(node.output_type.dtype)


def scatter_rows(node: Node, idx_strides: Sequence[int],
                 upd_strides: Sequence[int]) -> tuple[_rows.Rows, tuple[int, int, int]]:
    """Rows of the updates along index_axis: (rows over updates/indices/out, their strides along
    it). Rows address distinct base elements, so they may run in parallel."""
    tb, ti, tu = node.input_types
    axis, ia = node.attributes["axis"], node.attributes["index_axis"]
    names = [a for a in tu.axes if a != ia]
    out_strides = c_strides(tb.shape)
    r = _rows.rows(tu, ia, [(tu, names, upd_strides), (ti, names, idx_strides), (tb, names, out_strides)])
    return r, (_rows.along(tu, ia, upd_strides), _rows.along(ti, ia, idx_strides),
               out_strides[tb.axes.index(axis)])


@njit(inline="always", nogil=True)
def _scatter_add_row(upd, idx, out, shape, st, base, uj, ij, oax, n, bound, r):
    off = _rows.row_offsets(r, shape, st, base)
    bad = 0
    for j in range(n):
        v = idx[off[1] + j * ij]
        if v >= 0 and v < bound:
            out[off[2] + v * oax] += upd[off[0] + j * uj]
        else:
            bad += 1
    return bad


@njit(cache=True, nogil=True)
def scatter_add_serial(upd, idx, out, shape, st, base, uj, ij, oax, n, bound, count):
    bad = 0
    for r in range(count):
        bad += _scatter_add_row(upd, idx, out, shape, st, base, uj, ij, oax, n, bound, r)
    return bad


@njit(cache=True, nogil=True, parallel=True)
def scatter_add_parallel(upd, idx, out, shape, st, base, uj, ij, oax, n, bound, count):
    bad = 0
    for r in prange(count):
        bad += _scatter_add_row(upd, idx, out, shape, st, base, uj, ij, oax, n, bound, r)
    return bad


SCATTER_ADD = Twins(scatter_add_serial, scatter_add_parallel)

# columns of a block of inner rows (below): a worker's share of a row of the base, in cache
INNER_BLOCK = 256


@njit(inline="always", nogil=True)
def _scatter_add_block(upd, idx, out, uoff, ioff, uj, ij, oax, n, bound, inner, b):
    lo = b * INNER_BLOCK
    hi = min(inner, lo + INNER_BLOCK)
    bad = 0
    for j in range(n):
        v = idx[ioff + j * ij]
        if v >= 0 and v < bound:
            src = uoff + j * uj
            dst = v * oax
            for c in range(lo, hi):
                out[dst + c] += upd[src + c]
        else:
            bad += 1
    return bad


@njit(cache=True, nogil=True)
def scatter_add_inner_serial(upd, idx, out, uoff, ioff, uj, ij, oax, n, bound, inner):
    bad = 0
    for b in range((inner + INNER_BLOCK - 1) // INNER_BLOCK):
        bad += _scatter_add_block(upd, idx, out, uoff, ioff, uj, ij, oax, n, bound, inner, b)
    return bad


@njit(cache=True, nogil=True, parallel=True)
def scatter_add_inner_parallel(upd, idx, out, uoff, ioff, uj, ij, oax, n, bound, inner):
    bad = 0
    for b in prange((inner + INNER_BLOCK - 1) // INNER_BLOCK):
        bad += _scatter_add_block(upd, idx, out, uoff, ioff, uj, ij, oax, n, bound, inner, b)
    return bad


# rows that are one contiguous run of the base and of the updates, the same index for all of
# them (an embedding's gradient, [V, D] from [rows, D]): taken a block of rows at a time, each
# index's update added along the block contiguously, where a row at a time walked the index
# axis down a column, a cache line per addition (each element still adds its updates in index
# order, so the result is the row kernel's bit for bit)
SCATTER_ADD_INNER = Twins(scatter_add_inner_serial, scatter_add_inner_parallel)


def inner_rows(r: _rows.Rows) -> bool:
    """Whether rows ``r`` (over updates, indices, out) are the inner contiguous run of updates
    and out (row k at offset k in both) and read one index per position (index strides 0)."""
    compact = np.array(c_strides(tuple(int(v) for v in r.shape)), np.int64)
    return r.shape.size > 0 and (r.strides[0] == compact).all() and (r.strides[2] == compact).all() \
        and not r.strides[1].any()


def _cpu_scatter_add(request: KernelRequest) -> Kernel:
    node = request.node
    dt = float_kernel_dtype(node, "cpu")
    tu = node.input_types[2]
    ia = node.attributes["index_axis"]
    n, bound = tu.size_of(ia), node.input_types[0].size_of(node.attributes["axis"])
    prepared: dict[tuple, tuple] = {}

    def run(inputs: Sequence[np.ndarray], out: np.ndarray) -> None:
        if inputs[0] is not out:  # (the planner computes it in place over its base: AtomSpec.inplace)
            np.copyto(out, inputs[0])
        upd, uoff, ust = flat_view(inputs[2])
        idx, ioff, ist = flat_view(inputs[1])
        key = (ust, ist)
        args = prepared.get(key)
        if args is None:
            r, (uj, ij, oax) = scatter_rows(node, ist, ust)
            inner = inner_rows(r)
            blocks = -(-r.count // INNER_BLOCK) if inner else r.count
            kernel = (SCATTER_ADD_INNER if inner else SCATTER_ADD).pick(_rows.parallel_rows(blocks, tu.elements))
            args = prepared[key] = (kernel, r, uj, ij, oax, inner)
        kernel, r, uj, ij, oax, inner = args
        if inner:
            bad = kernel(upd.view(dt), idx.view(np.int64), out.reshape(-1), uoff, ioff, uj, ij, oax, n, bound,
                         r.count)
        else:
            bad = kernel(upd.view(dt), idx.view(np.int64), out.reshape(-1), r.shape, r.strides,
                         _i64([uoff, ioff, 0]), uj, ij, oax, n, bound, r.count)
        if bad:  # only reachable when check_values was skipped: re-run it for the precise error
            check_gather(node, [None, inputs[1]])

    def warm() -> None:
        SCATTER_ADD.warm()
        SCATTER_ADD_INNER.warm()
    return plain_kernel(run, warm=warm)


def _cuda_scatter_add(request: KernelRequest) -> Kernel:
    from numba import cuda

    from atoms.cuda import scatter_add as device  # numba.cuda loads with the first cuda kernel
    from runtime.toolkit.cuda import SpaceKernel

    node = request.node
    float_kernel_dtype(node, "cuda")
    tb, ti, tu = node.input_types
    kernel = SpaceKernel.of(device.scatter_add)
    r, (uj, ij, oax) = scatter_rows(node, c_strides(ti.shape), c_strides(tu.shape))
    shape, st = cuda.to_device(r.shape), cuda.to_device(r.strides)
    n, bound = tu.size_of(node.attributes["index_axis"]), tb.size_of(node.attributes["axis"])

    def run(inputs, out) -> None:
        flat = out.reshape((max(1, tb.elements),))
        if inputs[0] is not out:  # (in place over its base: AtomSpec.inplace)
            flat.copy_to_device(device_bits(inputs[0]).view(out.dtype))
        kernel([device_bits(inputs[2]).view(out.dtype), device_bits(inputs[1]).view(np.int64), flat,
                shape, st, uj, ij, oax, n, bound, r.count], r.count)
    return plain_kernel(run)


def _ref_scatter_add(request: KernelRequest) -> Kernel:
    node = request.node
    tb, ti, tu = node.input_types
    p = tb.axes.index(node.attributes["axis"])
    c = compute_dtype(tb.dtype)

    def run(inputs, out):
        check_gather(node, inputs)
        acc = np.array(inputs[0], dtype=c)
        where = list(np.indices(tu.shape, sparse=True))
        where[p] = align_to(np.asarray(inputs[1]), ti, tu)
        np.add.at(acc, tuple(where), np.asarray(inputs[2]).astype(c))
        out[...] = acc.astype(out.dtype)
    return plain_kernel(run)


def linear_scatter_add(node: Node) -> Linear:
    """base + Σ over index_axis of each update added at its index: linear in base and updates
    together (indices fixed), a sum over index_axis."""
    axis = node.attributes["index_axis"]
    return Linear((0, 2), True, (((1, axis), (2, axis)),))


SPECS = [
    AtomSpec(name="scatter", refs=refs_for("scatter", 2), inputs=("base", "indices", "updates"),
             dtypes={"base": "floating", "indices": "int64", "updates": "floating"},
             attributes=frozenset({"axis", "index_axis", "mode", "accumulation_dtype"}),
             infer=infer_scatter_add,
             kernels={"reference": _ref_scatter_add, "cpu": _cpu_scatter_add, "cuda": _cuda_scatter_add},
             check_values=check_gather, checked_inputs=(1,), inplace=0,
             free_axes=axes_except("axis"), linear=linear_scatter_add,
             summary="base plus updates added at indexed positions (repeated indices accumulate)"),
]
