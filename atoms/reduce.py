"""The reduce atom (SPEC §3): sum over one axis, which is removed.

The order of summation is part of the contract: every backend accumulates sequentially in
index order, starting from element 0 (not pairwise, not in parallel along the axis), so the
result is deterministic and the backends agree up to the rounding of the same additions.
"""
from __future__ import annotations

import math
from collections.abc import Sequence

import attrs
import numpy as np
from numba import njit, prange

from runtime.plugins.atomspec import AtomSpec, InferContext, Linear, Node, every_axis
from runtime.plugins.kernel import (FLAT_OUTPUT, CompiledCall, Counts, Kernel, KernelRequest, const_array, const_int,
                                    flat_input, node_kernel, plain_kernel)
from runtime.core import settings
from runtime.core.errors import fail
from runtime.kernels.codegen import warm_twins
from runtime.core.types import TensorType, accumulation_dtype, numpy_dtype
from runtime.kernels.vmath import vexp

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


def _reference(node: Node):
    t = node.input_types[0]
    position = t.axes.index(node.attributes["axis"])
    acc = numpy_dtype(accumulation_dtype(t.dtype, node.attributes["accumulation_dtype"]))

    def run(inputs: Sequence[np.ndarray], out: np.ndarray) -> None:
        with np.errstate(over="ignore"):  # the cast back may overflow to inf, as specified
            out[...] = sum_in_order(inputs[0], position, acc)
    return run


def _check_device(node: Node, backend: str) -> None:
    dtype = node.input_types[0].dtype
    if dtype not in DEVICE_DTYPES:
        fail("backend_unavailable", node.path,
             f"reduce has no {backend} kernel for {dtype}; use backend='reference'")


def _layout(node: Node) -> tuple[int, int, bool]:
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


def _sum_serial(x, out, outer, k, inner, block, ntask):
    for t in range(ntask):
        _sum_task_jit(x, out, outer, k, inner, block, t, ntask)


def _sum_parallel(x, out, outer, k, inner, block, ntask):
    for w in prange(ntask):
        _sum_task_jit(x, out, outer, k, inner, block, np.int64(w), ntask)  # (a prange index may be unsigned)


_sum_task_jit = None  # _sum_task compiled: a global the two wrappers resolve when compiled
_jitted: dict[str, object] = {}


def _compile_variants(cache: dict[str, object], task, serial, parallel, task_global: str,
                      fastmath=False) -> dict[str, object]:
    """The task and its serial and parallel drivers, compiled once (per dtype on first use,
    cached on disk); ``task_global`` names the module global the drivers call the task by. The
    drivers are distinct functions: Numba's disk cache tells functions apart by name and line,
    not by their ``parallel`` flag, so one function compiled both ways would load one variant's
    machine code for the other."""
    if not cache:
        from numba import njit

        from runtime.kernels.codegen import configure_numba_cache

        configure_numba_cache()
        options = dict(cache=True, nogil=True, error_model="numpy")
        globals()[task_global] = njit(fastmath=fastmath, **options)(task)
        cache["serial"] = njit(**options)(serial)
        cache["parallel"] = njit(parallel=True, **options)(parallel)
        for variant, fn in (("serial", serial), ("parallel", parallel)):  # (compiled code imports them)
            globals()[f"{fn.__name__}_jit"] = cache[variant]
    return cache


def _cpu_kernels() -> tuple[object, object]:
    """The serial and parallel sum drivers."""
    variants = _compile_variants(_jitted, _sum_task, _sum_serial, _sum_parallel, "_sum_task_jit")
    return variants["serial"], variants["parallel"]


def _cpu_kernel(parallel: bool):
    return _cpu_kernels()[parallel]


def _split(node: Node) -> tuple[int, int, int]:
    """The value as ``[outer, K, inner]`` around the reduced axis K."""
    shape = node.input_types[0].shape
    position = node.input_types[0].axes.index(node.attributes["axis"])
    return math.prod(shape[:position]), shape[position], math.prod(shape[position + 1:])


def _cpu(request: KernelRequest) -> Kernel:
    """Asked to count the value (``count_inputs == (0,)``), the kernel returns 1 when it holds
    a NaN or ±inf, found through the sums: every element is a term of one of them, and a NaN
    or ±inf term makes its sum NaN or ±inf (an overflowing sum of finite values also counts;
    the executor then finds the value finite and goes on). The same scan of the sums serves
    the output check (``check_outputs``)."""
    node = request.node
    checked = request.count_inputs
    from runtime.kernels import simd
    from runtime.backends import cpu_codegen as cg

    _check_device(node, "cpu")
    cg.numba_type(node.input_types[0].dtype, node.path, "reduce")
    outer, k, inner = _split(node)
    parallel = outer * k * inner >= PARALLEL_MIN_WORK
    kernel = _cpu_kernel(parallel)
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
    return plain_kernel(run, counts, warm=lambda: warm_twins(*_cpu_kernels()), compiled=compiled)


def _cuda(node: Node):
    from runtime.backends import cuda_codegen as cg

    _check_device(node, "cuda")
    position, rank, lead = _layout(node)
    space = [k for k in range(rank) if k != position]
    body = _body(position, len(space), lambda k: k)
    source = cg.render(f"reduce sum axis {position} of rank {rank}", ["v", "out"],
                       [f"v.shape[{k}]" for k in space], body)
    kernel = cg.SpaceKernel("cureduce", source)
    shape = node.input_types[0].shape
    n = max(1, node.output_type.elements)

    def run(inputs, out) -> None:
        v = inputs[0]
        if lead:
            v, out = v.reshape((1,) + shape), out.reshape((1,))
        kernel([v, out], n)
    return run


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
             kernels={"reference": node_kernel(_reference), "cpu": _cpu, "cuda": node_kernel(_cuda)},
             free_axes=every_axis, linear=linear_reduce,
             summary="sum over one axis in index order (deterministic); the axis is removed"),
]


# --- reduce@2 (SPEC §3b): sum, mean, amax, logsumexp in c(acc, d), rounded once ---------------

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


def _reference2(node: Node):
    t = node.input_types[0]
    position = t.axes.index(node.attributes["axis"])
    mode = node.attributes["mode"]
    c = compute_dtype(t.dtype)

    def run(inputs: Sequence[np.ndarray], out: np.ndarray) -> None:
        with np.errstate(over="ignore"):  # rounding to a half dtype may overflow to inf
            out[...] = reduce2_numpy(np.asarray(inputs[0]).astype(c), position, mode)
    return run


def _check_device2(node: Node, backend: str) -> None:
    dtype = node.input_types[0].dtype
    if dtype not in FLOAT_KERNEL_DTYPES:
        fail("backend_unavailable", node.path,
             f"reduce@2 has no {backend} kernel for {dtype} operands; use backend='reference'")


# amax over contiguous rows: LANES running maxima, updated lane-wise (a vector select), then
# combined; columns (inner > 1): runs of at most EXTREME_CHUNK of them updated row by row
EXTREME_LANES = 16
EXTREME_CHUNK = 256


@njit(inline="always")
def _nan_max(m, v):
    """``v`` when it is larger than ``m`` or NaN: a NaN, once taken, stays (as ``np.max``)."""
    return v if (v > m or v != v) else m


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


def _extreme_serial(x, out, outer, k, inner, logsumexp, ntask):
    for t in range(ntask):
        _extreme_task_jit(x, out, outer, k, inner, logsumexp, t, ntask)


def _extreme_parallel(x, out, outer, k, inner, logsumexp, ntask):
    for w in prange(ntask):
        _extreme_task_jit(x, out, outer, k, inner, logsumexp, np.int64(w), ntask)


_extreme_task_jit = None
_jitted2: dict[str, object] = {}


def _extreme_kernel(parallel: bool):
    # reassociation lets the exponential sums vectorise (reduce@2 fixes no summation order)
    variants = _compile_variants(_jitted2, _extreme_task, _extreme_serial, _extreme_parallel,
                                 "_extreme_task_jit", fastmath={"reassoc"})
    return variants["parallel" if parallel else "serial"]


def _mean_serial(x, out, outer, k, inner, block, ntask, divisor):
    _sum_serial_jit(x, out, outer, k, inner, block, ntask)
    for i in range(out.size):
        out[i] = out[i] / divisor[0]  # (in out's dtype, as NumPy divides)


def _mean_parallel(x, out, outer, k, inner, block, ntask, divisor):
    _sum_parallel_jit(x, out, outer, k, inner, block, ntask)
    for i in range(out.size):
        out[i] = out[i] / divisor[0]


_sum_serial_jit = _sum_parallel_jit = None  # set by _compile_variants
_jitted_mean: dict[str, object] = {}


def _mean_kernel(parallel: bool):
    """reduce@1's sum kernel, then each sum divided by the count."""
    if not _jitted_mean:
        from numba import njit

        _cpu_kernels()  # (the sum kernels the mean calls)
        options = dict(cache=True, nogil=True, error_model="numpy")
        globals()["_mean_serial_jit"] = _jitted_mean["serial"] = njit(**options)(_mean_serial)
        globals()["_mean_parallel_jit"] = _jitted_mean["parallel"] = njit(**options)(_mean_parallel)
    return _jitted_mean["parallel" if parallel else "serial"]


def _cpu2(request: KernelRequest) -> Kernel:
    """sum and mean run reduce@1's parallel sum kernel (any order is allowed here, and index
    order is one), mean then divides; amax and logsumexp run a kernel of column tasks."""
    from runtime.backends import cpu_codegen as cg

    node = request.node
    _check_device2(node, "cpu")
    mode = node.attributes["mode"]
    outer, k, inner = _split(node)
    if mode in ("sum", "mean"):
        node1 = attrs.evolve(node, attributes={"axis": node.attributes["axis"], "mode": "sum",
                                               "accumulation_dtype": "activation"})
        summed = _cpu(KernelRequest(node1))
        if mode == "sum":
            return summed
        # the sum kernel's own arguments, then the count in the output's dtype
        sum_args = summed.compiled.params[2:]
        kernel = _mean_kernel(summed.compiled.kernel is _cpu_kernel(True))
        divisor = np.array([k], compute_dtype(node.output_type.dtype))  # (half values run widened)

        def run_mean(inputs: Sequence[np.ndarray], out: np.ndarray) -> None:
            kernel(cg.contiguous(inputs[0]).reshape(-1), out.reshape(-1), *(p.value for p in sum_args), divisor)
        compiled = CompiledCall(kernel, (flat_input(0), FLAT_OUTPUT, *sum_args, const_array(divisor)))
        return plain_kernel(run_mean, compiled=compiled,
                            warm=lambda: warm_twins(_mean_kernel(False), _mean_kernel(True)))
    parallel = outer * k * inner >= PARALLEL_MIN_WORK
    kernel = _extreme_kernel(parallel)
    ntask = 1
    if parallel:
        import numba

        ntask = max(1, min(outer * inner, numba.get_num_threads() * TASKS_PER_THREAD))
    logsumexp = int(mode == "logsumexp")

    def run(inputs: Sequence[np.ndarray], out: np.ndarray) -> None:
        x = cg.contiguous(inputs[0])
        kernel(x.reshape(-1), out.reshape(-1), outer, k, inner, logsumexp, ntask)
    compiled = CompiledCall(kernel, (flat_input(0), FLAT_OUTPUT, *map(const_int, (outer, k, inner, logsumexp, ntask))))
    return plain_kernel(run, compiled=compiled,
                        warm=lambda: warm_twins(_extreme_kernel(False), _extreme_kernel(True)))


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


def _cuda2(node: Node):
    from runtime.backends import cuda_codegen as cg

    _check_device2(node, "cuda")
    position, rank, lead = _layout(node)
    space = [k for k in range(rank) if k != position]
    mode = node.attributes["mode"]
    source = cg.render(f"reduce@2 {mode} axis {position} of rank {rank}", ["v", "out"],
                       [f"v.shape[{k}]" for k in space], _body2(position, len(space), mode))
    kernel = cg.SpaceKernel("cureduce2", source)
    shape = node.input_types[0].shape
    n = max(1, node.output_type.elements)

    def run(inputs, out) -> None:
        v = inputs[0]
        if lead:
            v, out = v.reshape((1,) + shape), out.reshape((1,))
        kernel([v, out], n)
    return run


SPECS.append(
    AtomSpec(name="reduce@2", refs=refs_for("reduce", 2), inputs=("value",),
             dtypes={"value": "floating"},
             attributes=frozenset({"axis", "mode", "accumulation_dtype"}), infer=infer_reduce2,
             kernels={"reference": node_kernel(_reference2), "cpu": _cpu2, "cuda": node_kernel(_cuda2)},
             free_axes=every_axis, linear=linear_reduce,
             summary="sum, mean, amax or logsumexp (stable) over one axis; the axis is removed"))
