"""The reduce atom (SPEC §3): sum over one axis, which is removed (reduce@2: atoms/reduce2.py).

The order of summation is part of the contract: every backend accumulates sequentially in
index order, starting from element 0 (not pairwise, not in parallel along the axis), so the
result is deterministic and the backends agree up to the rounding of the same additions.
"""
from __future__ import annotations

import math
from collections.abc import Callable, Sequence

import numpy as np
from numba import njit, prange

from runtime.plugins.atomspec import AtomSpec, InferContext, Linear, Node, every_axis
from runtime.plugins.kernel import (FLAT_OUTPUT, CompiledCall, Counts, Kernel, KernelRequest, const_int, flat_input,
                                    plain_kernel)
from runtime.core import settings
from runtime.toolkit import Twins, check_dtypes
from runtime.core.types import TensorType, accumulation_dtype, numpy_dtype

from ._refs import refs_for

DEVICE_DTYPES = ("float32", "float64", "int64")


def infer_reduce(ctx: InferContext) -> TensorType:
    axis = ctx.axis_of("axis", 0)
    ctx.attr_str("mode", ("sum",))
    ctx.accumulation()
    t = ctx.operands[0]
    if t.dtype == "boolean":
        ctx.mismatch("value must be numeric, got boolean", 0)
    keep = [k for k, a in enumerate(t.axes) if a != axis]
    return ctx.output([t.axes[k] for k in keep], [t.sizes[k] for k in keep])


def sum_in_order(value: np.ndarray, position: int, acc: np.dtype) -> np.ndarray:
    """Sequential sum along ``position`` in index order, accumulated in ``acc``."""
    moved = np.moveaxis(np.asarray(value), position, 0)
    total = np.array(moved[0], dtype=acc, copy=True)
    with np.errstate(all="ignore"):
        for k in range(1, moved.shape[0]):
            np.add(total, moved[k], out=total, casting="unsafe")
    return total


def _reference(request: KernelRequest) -> Kernel:
    node = request.node
    t = node.input_types[0]
    position = t.axes.index(node.attributes["axis"])
    acc = numpy_dtype(accumulation_dtype(t.dtype, node.attributes["accumulation_dtype"]))

    def run(inputs: Sequence[np.ndarray], out: np.ndarray) -> None:
        with np.errstate(over="ignore"):  # the cast back may overflow to inf, as specified
            out[...] = sum_in_order(inputs[0], position, acc)
    return plain_kernel(run)


def _check_device(node: Node, backend: str) -> None:
    check_dtypes(node, backend, DEVICE_DTYPES, node.input_types[:1])


def _cuda_layout(node: Node) -> tuple[int, int, bool]:
    """(axis position, rank of the kernel's value, whether a leading unit axis is added so a
    rank-1 value still has a non-empty index space)."""
    t = node.input_types[0]
    position = t.axes.index(node.attributes["axis"])
    lead = t.rank == 1
    return position + lead, t.rank + lead, lead


def _body(position: int, space_rank: int, wrap) -> list[str]:
    names = [f"i{k}" for k in range(space_rank)]

    def at(k: str) -> str:
        idx = names[:position] + [wrap(k)] + names[position:]
        return ", ".join(idx)
    return [f"s = v[{at('0')}]",
            f"for k in range(1, v.shape[{position}]):",
            f"    s += v[{at('k')}]",
            f"out[{', '.join(names)}] = s"]


# --- cpu ---------------------------------------------------------------------------------------
# The value is viewed as ``[outer, K, inner]`` (K: the reduced axis) and each output element
# is still one sequential sum over K: the kernels only choose which sums run side by side.
SIDE_BY_SIDE_ROWS = 8  # inner == 1: 8 rows' sums interleaved, 8 addition chains hiding the
#                        latency of each addition, which one chain alone waits for
INNER_BLOCK = 1024  # inner > 1: accumulators per tile (fewer when tiles are too few for the
#                     threads); rows of K added to them in order, vectorised
MIN_INNER_BLOCK = 256
PARALLEL_MIN_WORK = settings.REDUCE_PARALLEL_MIN.read()  # elements read
TASKS_PER_THREAD = 4


# the kernels' Numba options (the reduce@2 kernels take the same)
JIT_OPTIONS = dict(cache=True, nogil=True, error_model="numpy")


def parallel_at(work: int) -> bool:
    """Whether a call reading ``work`` elements runs on the parallel twin (reduce and reduce@2)."""
    return work >= PARALLEL_MIN_WORK


@njit(**JIT_OPTIONS)
def _sum_task(x, out, outer, k, inner, block, t, ntask):
    """Task ``t`` of ``ntask`` (about equal shares) of ``out[o, i] = x[o, 0, i] + x[o, 1, i] + ...``
    in index order, for flat C-order ``x`` ``[outer, k, inner]`` and ``out`` ``[outer, inner]``
    (``inner > 1``: tiles of ``block`` accumulators). Unsigned indices: no negative-index wraparound in the loops."""
    uk, uin = np.uint64(k), np.uint64(inner)
    if inner == 1:
        nblk = (outer + 7) // 8
        for b in range(t * nblk // ntask, (t + 1) * nblk // ntask):
            r = np.uint64(b * 8)
            if r + np.uint64(8) <= np.uint64(outer):
                p0, p1, p2, p3 = r * uk, (r + np.uint64(1)) * uk, (r + np.uint64(2)) * uk, (r + np.uint64(3)) * uk
                p4, p5, p6, p7 = (r + np.uint64(4)) * uk, (r + np.uint64(5)) * uk, (r + np.uint64(6)) * uk, (r + np.uint64(7)) * uk
                s0, s1, s2, s3 = x[p0], x[p1], x[p2], x[p3]
                s4, s5, s6, s7 = x[p4], x[p5], x[p6], x[p7]
                for j in range(np.uint64(1), uk):
                    s0 += x[p0 + j]
                    s1 += x[p1 + j]
                    s2 += x[p2 + j]
                    s3 += x[p3 + j]
                    s4 += x[p4 + j]
                    s5 += x[p5 + j]
                    s6 += x[p6 + j]
                    s7 += x[p7 + j]
                out[r] = s0
                out[r + np.uint64(1)] = s1
                out[r + np.uint64(2)] = s2
                out[r + np.uint64(3)] = s3
                out[r + np.uint64(4)] = s4
                out[r + np.uint64(5)] = s5
                out[r + np.uint64(6)] = s6
                out[r + np.uint64(7)] = s7
            else:
                for q in range(r, np.uint64(outer)):
                    s = x[q * uk]
                    for j in range(np.uint64(1), uk):
                        s += x[q * uk + j]
                    out[q] = s
    else:
        nib = (inner + block - 1) // block
        ntiles = outer * nib
        for tile in range(t * ntiles // ntask, (t + 1) * ntiles // ntask):
            o = tile // nib
            i0 = np.uint64((tile - o * nib) * block)
            i1 = min(i0 + np.uint64(block), uin)
            ob = np.uint64(o) * uin
            xb = np.uint64(o) * uk * uin
            for i in range(i0, i1):
                out[ob + i] = x[xb + i]
            for j in range(np.uint64(1), uk):
                xr = xb + j * uin
                for i in range(i0, i1):
                    out[ob + i] += x[xr + i]


@njit(**JIT_OPTIONS)
def sum_serial(x, out, outer, k, inner, block, ntask):
    for t in range(ntask):
        _sum_task(x, out, outer, k, inner, block, t, ntask)


@njit(parallel=True, **JIT_OPTIONS)
def sum_parallel(x, out, outer, k, inner, block, ntask):
    for w in prange(ntask):
        _sum_task(x, out, outer, k, inner, block, np.int64(w), ntask)  # (a prange index may be unsigned)


SUM = Twins(sum_serial, sum_parallel)


def split_axis(node: Node) -> tuple[int, int, int]:
    """The value as ``[outer, K, inner]`` around the reduced axis K."""
    shape = node.input_types[0].shape
    position = node.input_types[0].axes.index(node.attributes["axis"])
    return math.prod(shape[:position]), shape[position], math.prod(shape[position + 1:])


def cpu_sum(request: KernelRequest) -> Kernel:
    """Asked to count the value (``count_inputs == (0,)``), the kernel returns 1 when it holds
    a NaN or ±inf, found through the sums: every element is a term of one of them, and a NaN
    or ±inf term makes its sum NaN or ±inf (an overflowing sum of finite values also counts;
    the executor then finds the value finite and goes on). The same scan of the sums serves
    the output check (``check_outputs``)."""
    node = request.node
    checked = request.count_inputs
    from runtime.toolkit.cpu import simd
    from runtime.toolkit import cpu as cg

    _check_device(node, "cpu")
    cg.numba_type(node.input_types[0].dtype, node.path, "reduce")
    outer, k, inner = split_axis(node)
    parallel = parallel_at(outer * k * inner)
    kernel = SUM.pick(parallel)
    block, ntask = INNER_BLOCK, 1
    if parallel:
        import numba

        threads = numba.get_num_threads()
        if inner > 1 and outer * -(-inner // block) < threads:  # smaller tiles, one per thread
            block = max(MIN_INNER_BLOCK, -(-inner // -(-threads // outer)))
        units = -(-outer // SIDE_BY_SIDE_ROWS) if inner == 1 else outer * -(-inner // block)
        ntask = max(1, min(units, threads * TASKS_PER_THREAD))

    counts = Counts(inputs=(0,) if 0 in checked else (), outputs=request.check_outputs)
    scan = (simd.nonfinite_f32 if node.input_types[0].dtype == "float32" else simd.nonfinite_f64) \
        if counts.any else None  # the sums are the output: one scan serves both
    size = outer * inner

    def run(inputs: Sequence[np.ndarray], out: np.ndarray) -> int:
        x = cg.contiguous(inputs[0])
        flat = out.reshape(-1)
        kernel(x.reshape(-1), flat, outer, k, inner, block, ntask)
        return scan(flat, 0, size) if scan is not None else 0
    compiled = None if counts.any else CompiledCall(
        kernel, (flat_input(0), FLAT_OUTPUT, *map(const_int, (outer, k, inner, block, ntask))))
    return plain_kernel(run, counts, warm=SUM.warm, compiled=compiled)


def cuda_kernel(node: Node, name: str, what: str, body: Callable[[int, int], list[str]]) -> Kernel:
    """The CUDA kernel of a reduction over the node's axis (reduce and reduce@2): a thread per
    output element runs ``body(axis position, rank of the thread space)``."""
    from runtime.toolkit import cuda as cg

    position, rank, lead = _cuda_layout(node)
    space = [k for k in range(rank) if k != position]
    source = cg.render(f"{what} axis {position} of rank {rank}", ["v", "out"],
                       [f"v.shape[{k}]" for k in space], body(position, len(space)))
    kernel = cg.SpaceKernel(name, source)
    shape = node.input_types[0].shape
    n = max(1, node.output_type.elements)

    def run(inputs, out) -> None:
        v = inputs[0]
        if lead:
            v, out = v.reshape((1,) + shape), out.reshape((1,))
        kernel([v, out], n)
    return plain_kernel(run)


def _cuda(request: KernelRequest) -> Kernel:
    node = request.node
    _check_device(node, "cuda")
    return cuda_kernel(node, "cureduce", "reduce sum", lambda position, rank: _body(position, rank, lambda k: k))


def linear_reduce(node: Node) -> Linear | None:
    """sum: a sum over its axis; mean: linear (a sum scaled by a constant), not a sum;
    amax, logsumexp: not linear."""
    mode = node.attributes["mode"]
    if mode == "sum":
        return Linear((0,), True, (((0, node.attributes["axis"]),),))
    return Linear((0,), True) if mode == "mean" else None


SPECS = [
    AtomSpec(name="reduce", refs=refs_for("reduce"), inputs=("value",),
             dtypes={"value": "numeric"},
             attributes=frozenset({"axis", "mode", "accumulation_dtype"}), infer=infer_reduce,
             kernels={"reference": _reference, "cpu": cpu_sum, "cuda": _cuda},
             free_axes=every_axis, linear=linear_reduce,
             summary="sum over one axis in index order (deterministic); the axis is removed"),
]
