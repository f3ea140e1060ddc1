"""The reduce@2 atom (SPEC §3b): sum, mean, amax or logsumexp over one axis, which is removed,
computed in c(acc, d) and rounded once.

sum and mean run reduce@1's sum kernel (atoms/reduce.py: any order is allowed here, and index
order is one), mean then divides; amax and logsumexp run a kernel of column tasks.
"""
from __future__ import annotations

import math
from collections.abc import Sequence

import attrs
import numpy as np
from numba import njit, prange

from runtime.plugins.atomspec import AtomSpec, InferContext, Node, every_axis
from runtime.plugins.kernel import (FLAT_OUTPUT, CompiledCall, Kernel, KernelRequest, const_array, const_int,
                                    flat_input, plain_kernel)
from runtime.toolkit import Twins, check_dtypes
from runtime.core.types import TensorType
from runtime.toolkit.cpu import vmath

from ._refs import refs_for
from .reduce import (JIT_OPTIONS, SUM, TASKS_PER_THREAD, cpu_sum, cuda_kernel, linear_reduce, parallel_at, split_axis,
                     sum_parallel, sum_serial)

vexp = vmath.vexp  # (called by the kernels below)

MODES_V2 = ("sum", "mean", "amax", "logsumexp")
FLOAT_KERNEL_DTYPES = ("float32", "float64")  # half operands arrive widened (SPEC §3b.1)


def infer_reduce2(ctx: InferContext) -> TensorType:
    axis = ctx.axis_of("axis", 0)
    ctx.attr_str("mode", MODES_V2)
    ctx.accumulation()
    ctx.require_dtype(0, "floating")
    t = ctx.operands[0]
    keep = [k for k, a in enumerate(t.axes) if a != axis]
    return ctx.output([t.axes[k] for k in keep], [t.sizes[k] for k in keep])


def compute_dtype(dtype: str) -> np.dtype:
    """The dtype reduce@2 computes in: float64 for float64, float32 otherwise. For half
    operands under ``activation`` this is also arti's (torch sums and exps half in float32)."""
    return np.dtype(np.float64 if dtype == "float64" else np.float32)


def reduce2_numpy(x: np.ndarray, position: int, mode: str) -> np.ndarray:
    """The oracle: ``mode`` over axis ``position`` of ``x`` (already in the compute dtype)."""
    with np.errstate(all="ignore"):
        if mode == "sum":
            return x.sum(axis=position)
        if mode == "mean":
            return x.sum(axis=position) / x.dtype.type(x.shape[position])
        m = x.max(axis=position)
        if mode == "amax":
            return m
        shift = np.where(np.isinf(m), x.dtype.type(0), m)  # ±inf maxima: shift by 0 (SPEC)
        s = np.exp(x - np.expand_dims(shift, position)).sum(axis=position)
        return shift + np.log(s)


def _reference2(request: KernelRequest) -> Kernel:
    node = request.node
    t = node.input_types[0]
    position = t.axes.index(node.attributes["axis"])
    mode = node.attributes["mode"]
    c = compute_dtype(t.dtype)

    def run(inputs: Sequence[np.ndarray], out: np.ndarray) -> None:
        with np.errstate(over="ignore"):  # rounding to a half dtype may overflow to inf
            out[...] = reduce2_numpy(np.asarray(inputs[0]).astype(c), position, mode)
    return plain_kernel(run)


def _check_device2(node: Node, backend: str) -> None:
    check_dtypes(node, backend, FLOAT_KERNEL_DTYPES, node.input_types[:1])


# amax over contiguous rows: LANES running maxima, updated lane-wise (a vector select), then
# combined; columns (inner > 1): runs of at most EXTREME_CHUNK of them updated row by row
EXTREME_LANES = 16
EXTREME_CHUNK = 256


@njit(inline="always")
def _nan_max(m, v):
    """``v`` when it is larger than ``m`` or NaN: a NaN, once taken, stays (as ``np.max``)."""
    return v if (v > m or v != v) else m


# reassociation lets the exponential sums vectorise (reduce@2 fixes no summation order)
@njit(fastmath={"reassoc"}, **JIT_OPTIONS)
def _extreme_task(x, out, outer, k, inner, logsumexp, t, ntask):
    """Task ``t`` of ``ntask``: amax (or, with ``logsumexp``, m + log Σ exp(x − m)) of each
    column of flat C-order ``x`` ``[outer, k, inner]`` into ``out`` ``[outer, inner]``. A ±inf
    maximum is already the logsumexp (SPEC's shift by 0 gives the same), NaN stays NaN (every
    update takes :func:`_nan_max`'s choice).
    Unsigned indices: no negative-index wraparound in the loops, which then vectorise."""
    ncol = outer * inner
    uk, lanes = np.uint64(k), np.uint64(EXTREME_LANES)
    c0, c1 = np.uint64(t * ncol // ntask), np.uint64((t + 1) * ncol // ntask)
    if inner == 1:
        acc = np.empty(EXTREME_LANES, x.dtype)
        for col in range(c0, c1):
            base = col * uk
            m = x[base]
            j = np.uint64(1)
            if k >= 2 * EXTREME_LANES:
                for i in range(lanes):
                    acc[i] = x[base + i]
                j = lanes
                while j + lanes <= uk:
                    xb = base + j
                    for i in range(lanes):  # (_nan_max spelled out: through it, this loop ran slower)
                        v, a = x[xb + i], acc[i]
                        acc[i] = v if (v > a or v != v) else a
                    j += lanes
                m = acc[0]
                for i in range(np.uint64(1), lanes):
                    m = _nan_max(m, acc[i])
            for i in range(j, uk):
                m = _nan_max(m, x[base + i])
            if logsumexp and math.isfinite(m):
                s = m - m  # 0 in the compute dtype
                for i in range(uk):
                    s += vexp(x[base + i] - m)
                m = m + math.log(s)
            out[col] = m
        return
    uin = np.uint64(inner)
    sums = np.empty(EXTREME_CHUNK, x.dtype)
    c = c0
    while c < c1:
        o = c // uin
        i0 = c - o * uin
        n = min(c1 - c, uin - i0, np.uint64(EXTREME_CHUNK))
        xb = o * uk * uin + i0
        for i in range(n):
            out[c + i] = x[xb + i]
        for j in range(np.uint64(1), uk):
            xr = xb + j * uin
            for i in range(n):  # (_nan_max spelled out, as above)
                v, a = x[xr + i], out[c + i]
                out[c + i] = v if (v > a or v != v) else a
        if logsumexp:
            for i in range(n):
                sums[i] = 0
            for j in range(uk):
                xr = xb + j * uin
                for i in range(n):
                    m = out[c + i]
                    shift = m if math.isfinite(m) else m - m  # (a non-finite maximum is kept below)
                    sums[i] += vexp(x[xr + i] - shift)
            for i in range(n):
                m = out[c + i]
                if math.isfinite(m):
                    out[c + i] = m + math.log(sums[i])
        c += n


@njit(**JIT_OPTIONS)
def extreme_serial(x, out, outer, k, inner, logsumexp, ntask):
    for t in range(ntask):
        _extreme_task(x, out, outer, k, inner, logsumexp, t, ntask)


@njit(parallel=True, **JIT_OPTIONS)
def extreme_parallel(x, out, outer, k, inner, logsumexp, ntask):
    for w in prange(ntask):
        _extreme_task(x, out, outer, k, inner, logsumexp, np.int64(w), ntask)


EXTREME = Twins(extreme_serial, extreme_parallel)


@njit(**JIT_OPTIONS)
def mean_serial(x, out, outer, k, inner, block, ntask, divisor):
    """reduce@1's sum kernel, then each sum divided by the count."""
    sum_serial(x, out, outer, k, inner, block, ntask)
    for i in range(out.size):
        out[i] = out[i] / divisor[0]  # (in out's dtype, as NumPy divides)


@njit(**JIT_OPTIONS)
def mean_parallel(x, out, outer, k, inner, block, ntask, divisor):
    sum_parallel(x, out, outer, k, inner, block, ntask)
    for i in range(out.size):
        out[i] = out[i] / divisor[0]


MEAN = Twins(mean_serial, mean_parallel)


def _cpu2(request: KernelRequest) -> Kernel:
    """sum and mean: reduce@1's kernel (mean then divides); amax and logsumexp: column tasks."""
    from runtime.toolkit import cpu as cg

    node = request.node
    _check_device2(node, "cpu")
    mode = node.attributes["mode"]
    outer, k, inner = split_axis(node)
    if mode in ("sum", "mean"):
        node1 = attrs.evolve(node, attributes={"axis": node.attributes["axis"], "mode": "sum",
                                               "accumulation_dtype": "activation"})
        summed = cpu_sum(KernelRequest(node1))
        if mode == "sum":
            return summed
        # the sum kernel's own arguments, then the count in the output's dtype
        sum_args = summed.compiled.params[2:]
        kernel = MEAN.pick(summed.compiled.kernel is SUM.parallel)
        divisor = np.array([k], compute_dtype(node.output_type.dtype))  # (half values run widened)

        def run_mean(inputs: Sequence[np.ndarray], out: np.ndarray) -> None:
            kernel(cg.contiguous(inputs[0]).reshape(-1), out.reshape(-1), *(p.value for p in sum_args), divisor)
        compiled = CompiledCall(kernel, (flat_input(0), FLAT_OUTPUT, *sum_args, const_array(divisor)))
        return plain_kernel(run_mean, compiled=compiled, warm=MEAN.warm)
    parallel = parallel_at(outer * k * inner)
    kernel = EXTREME.pick(parallel)
    ntask = 1
    if parallel:
        import numba

        ntask = max(1, min(outer * inner, numba.get_num_threads() * TASKS_PER_THREAD))
    logsumexp = int(mode == "logsumexp")

    def run(inputs: Sequence[np.ndarray], out: np.ndarray) -> None:
        x = cg.contiguous(inputs[0])
        kernel(x.reshape(-1), out.reshape(-1), outer, k, inner, logsumexp, ntask)
    compiled = CompiledCall(kernel, (flat_input(0), FLAT_OUTPUT, *map(const_int, (outer, k, inner, logsumexp, ntask))))
    return plain_kernel(run, compiled=compiled, warm=EXTREME.warm)


def _body2(position: int, space_rank: int, mode: str) -> list[str]:
    names = [f"i{k}" for k in range(space_rank)]

    def at(k: str) -> str:
        return ", ".join(names[:position] + [k] + names[position:])
    n = f"v.shape[{position}]"
    if mode in ("sum", "mean"):
        lines = [f"s = v[{at('0')}]", f"for k in range(1, {n}):", f"    s += v[{at('k')}]"]
        result = "s / " + n if mode == "mean" else "s"
    else:
        lines = [f"m = v[{at('0')}]", f"for k in range(1, {n}):", f"    x = v[{at('k')}]",
                 "    if x > m or x != x:", "        m = x"]
        result = "m"
        if mode == "logsumexp":
            lines += ["if math.isfinite(m):", "    s = m - m",
                      f"    for k in range({n}):", f"        s += math.exp(v[{at('k')}] - m)",
                      "    m = m + math.log(s)"]
    return lines + [f"out[{', '.join(names)}] = {result}"]


def _cuda2(request: KernelRequest) -> Kernel:
    node = request.node
    _check_device2(node, "cuda")
    mode = node.attributes["mode"]
    return cuda_kernel(node, "cureduce2", f"reduce@2 {mode}", lambda position, rank: _body2(position, rank, mode))


SPECS = [
    AtomSpec(name="reduce@2", refs=refs_for("reduce", 2), inputs=("value",),
             dtypes={"value": "floating"},
             attributes=frozenset({"axis", "mode", "accumulation_dtype"}), infer=infer_reduce2,
             kernels={"reference": _reference2, "cpu": _cpu2, "cuda": _cuda2},
             free_axes=every_axis, linear=linear_reduce,
             summary="sum, mean, amax or logsumexp (stable) over one axis; the axis is removed"),
]
