"""segment@1 (SPEC §3b): sum, mean, amax and softmax over groups of entries along one axis.

Groups are formed per coordinate of the value's other axes (a row). Entry i of a row is active
when the mask is true there and then belongs to group ids[i]; inactive entries are ignored
whatever their id. Active ids are range-checked on the host before any kernel runs
(``check_values``), and kernels skip out-of-range ids anyway, so nothing writes out of bounds.

Kernels work a row at a time with per-group scratch (sums, counts, maxima); the cpu kernel
keeps one scratch set per task, the cuda kernel one per row. Both are declared to the §5
preflight through ``AtomSpec.scratch_bytes`` (§3b.3 item 7).
"""
from __future__ import annotations

from collections.abc import Sequence

import numpy as np
from numba import njit, prange

from runtime.plugins.atomspec import AtomSpec, InferContext, Node, axes_except
from runtime.toolkit import Twins, align_to
from runtime.plugins.kernel import Kernel, KernelRequest, plain_kernel
from runtime.core.errors import fail
from runtime.core.types import TensorType

from . import _rows
from ._refs import refs_for
from .elementwise import require_mask
from .scatter_add import compute_dtype, float_kernel_dtype
from .layout import _i64, c_strides, device_bits, flat_view
from .window import _new_axis, bounded_int

MODES = ("sum", "mean", "amax", "softmax")
TASKS_PER_THREAD = 4


# --- infer -------------------------------------------------------------------------------------

def infer_segment(ctx: InferContext) -> TensorType:
    tv, ti = ctx.operands[0], ctx.operands[1]
    axis = ctx.axis_of("axis", 0)
    seg = _new_axis(ctx, "segment_axis")
    count = bounded_int(ctx, "num_segments", 1)
    mode = ctx.attr_str("mode", MODES)
    ctx.accumulation()
    ctx.require_dtype(0, "floating")
    if ti.dtype != "int64":
        ctx.mismatch(f"ids must be int64, got {ti.dtype}", 1)
    if ti.domain != tv.domain:
        ctx.mismatch(f"ids are in domain {ti.domain!r} but value is in {tv.domain!r}", 1)
    if axis not in ti.axes:
        ctx.mismatch(f"ids must have the segmented axis {axis!r} (ids axes {list(ti.axes)})", 1)
    for a, size in zip(ti.axes, ti.sizes):
        if a not in tv.axes:
            ctx.mismatch(f"ids axis {a!r} is not an axis of value (axes {list(tv.axes)})", 1)
        if a == axis:
            if size != tv.size_of(a):
                ctx.mismatch(f"ids axis {a!r} has extent {size} but value's is {tv.size_of(a)}; "
                             f"the segmented axis must have the same declared extent", 1)
        elif size != 1:
            ctx.require_extent(size, tv.size_of(a), f"ids axis {a!r} (must be 1 or equal)", 1)
    require_mask(ctx, 2, 0)
    if mode == "softmax":
        return ctx.output(tv.axes, tv.sizes)
    return ctx.output([seg if a == axis else a for a in tv.axes],
                      [count if a == axis else s for a, s in zip(tv.axes, tv.sizes)])


# --- value check -------------------------------------------------------------------------------

def check_segment_ids(node: Node, host: Sequence) -> None:
    """index_range for an active id outside [0, num_segments); inactive ids are not looked at."""
    tv, ti, tm = node.input_types
    count = node.attributes["num_segments"]
    union = [a for a in tv.axes if a in ti.axes or a in tm.axes]
    space = TensorType(tuple(union), tuple(tv.size_of(a) for a in union), "int64", tv.domain)
    ids = align_to(np.asarray(host[1]), ti, space)
    bad = align_to(np.asarray(host[2]), tm, space) & ((ids < 0) | (ids >= count))
    if not bad.any():
        return
    where = np.unravel_index(int(np.argmax(bad)), bad.shape)
    at = ", ".join(f"{a}={int(w)}" for a, w in zip(union, where))
    fail("index_range", f"{node.path}.input_slots[1]",
         f"segment: the active entry at {at} has id {int(ids[where])}, outside [0, {count}) "
         f"(num_segments); only entries whose mask is false may have such ids")


# --- reference ---------------------------------------------------------------------------------

def _ref_segment(request: KernelRequest) -> Kernel:
    node = request.node
    tv, ti, tm = node.input_types
    p = tv.axes.index(node.attributes["axis"])
    count, mode = node.attributes["num_segments"], node.attributes["mode"]
    c = compute_dtype(tv.dtype)

    def run(inputs, out):
        check_segment_ids(node, inputs)
        n = tv.shape[p]
        x = np.moveaxis(np.asarray(inputs[0]).astype(c), p, -1)
        lead = x.shape[:-1]
        x = x.reshape(-1, n)
        ids = np.moveaxis(align_to(np.asarray(inputs[1]), ti, tv), p, -1).reshape(-1, n)
        act = np.moveaxis(align_to(np.asarray(inputs[2]), tm, tv), p, -1).reshape(-1, n)
        group = np.where(act, ids, 0) + np.arange(x.shape[0])[:, None] * count  # row-major (row, id)
        members = np.bincount(group[act], minlength=x.shape[0] * count)
        if mode in ("amax", "softmax"):
            m = np.full(x.shape[0] * count, -np.inf, c)
            np.maximum.at(m, group[act], x[act])
        if mode == "softmax":
            e = np.exp(x[act] - m[group[act]])  # inactive entries are never exponentiated
            s = np.zeros(x.shape[0] * count, c)
            np.add.at(s, group[act], e)
            y = np.zeros(x.shape, c)
            y[act] = e / s[group[act]]
            y = y.reshape(lead + (n,))
        else:
            if mode == "amax":
                g = np.where(members > 0, m, 0)
            else:
                g = np.zeros(x.shape[0] * count, c)
                np.add.at(g, group[act], x[act])
                if mode == "mean":
                    g = np.where(members > 0, g / np.maximum(members, 1), 0)
            y = g.reshape(lead + (count,))
        out[...] = np.moveaxis(y, -1, p).astype(out.dtype)
    return plain_kernel(run)


# --- cpu ----------------------------------------------------------------------------------------

MODE_CODE = {m: k for k, m in enumerate(MODES)}


def segment_rows(node: Node, strides: Sequence[Sequence[int]]) -> tuple[_rows.Rows, tuple[int, ...]]:
    """Rows of the value along ``axis`` over value, ids, mask and out, and their strides along
    it (out's along segment_axis, or along axis for softmax)."""
    tv, ti, tm = node.input_types
    o, axis = node.output_type, node.attributes["axis"]
    names = [a for a in tv.axes if a != axis]
    ostr = c_strides(o.shape)
    out_axis = axis if node.attributes["mode"] == "softmax" else node.attributes["segment_axis"]
    r = _rows.rows(tv, axis, [(tv, names, strides[0]), (ti, names, strides[1]), (tm, names, strides[2]),
                              (o, names, ostr)])
    return r, (_rows.along(tv, axis, strides[0]), _rows.along(ti, axis, strides[1]),
               _rows.along(tm, axis, strides[2]), ostr[o.axes.index(out_axis)])


@njit(inline="always", nogil=True)
def _segment_row(x, ids, mask, out, shape, st, base, vs, js, ms, os, n, count, mode, acc, cnt, mx, r):
    off = _rows.row_offsets(r, shape, st, base)
    for g in range(count):
        acc[g] = 0
        cnt[g] = 0
        mx[g] = -np.inf
    if mode >= 2:  # amax, softmax: group maxima (NaN propagates)
        for j in range(n):
            if mask[off[2] + j * ms] != 0:
                g = ids[off[1] + j * js]
                if g >= 0 and g < count:
                    v = x[off[0] + j * vs]
                    cnt[g] += 1
                    if v > mx[g] or v != v:
                        mx[g] = v
    else:
        for j in range(n):
            if mask[off[2] + j * ms] != 0:
                g = ids[off[1] + j * js]
                if g >= 0 and g < count:
                    cnt[g] += 1
                    acc[g] += x[off[0] + j * vs]
    if mode == 3:  # softmax: exponentials into out, then divide by their group's sum
        for j in range(n):
            e = out.dtype.type(0)
            if mask[off[2] + j * ms] != 0:
                g = ids[off[1] + j * js]
                if g >= 0 and g < count:
                    e = np.exp(x[off[0] + j * vs] - mx[g])
                    acc[g] += e
            out[off[3] + j * os] = e
        for j in range(n):
            if mask[off[2] + j * ms] != 0:
                g = ids[off[1] + j * js]
                if g >= 0 and g < count:
                    out[off[3] + j * os] /= acc[g]
        return
    for g in range(count):
        if cnt[g] == 0:  # an empty group gives +0
            out[off[3] + g * os] = 0
        elif mode == 0:
            out[off[3] + g * os] = acc[g]
        elif mode == 1:
            out[off[3] + g * os] = acc[g] / cnt[g]
        else:
            out[off[3] + g * os] = mx[g]


@njit(inline="always", nogil=True)
def _segment_task(x, ids, mask, out, shape, st, base, vs, js, ms, os, n, count, mode, rows, t, ntask):
    acc = np.empty(count, out.dtype)
    mx = np.empty(count, out.dtype)
    cnt = np.empty(count, np.int64)
    for r in range(t * rows // ntask, (t + 1) * rows // ntask):
        _segment_row(x, ids, mask, out, shape, st, base, vs, js, ms, os, n, count, mode, acc, cnt, mx, r)


@njit(cache=True, nogil=True)
def segment_serial(x, ids, mask, out, shape, st, base, vs, js, ms, os, n, count, mode, rows, ntask):
    for t in range(ntask):
        _segment_task(x, ids, mask, out, shape, st, base, vs, js, ms, os, n, count, mode, rows, t, ntask)


@njit(cache=True, nogil=True, parallel=True)
def segment_parallel(x, ids, mask, out, shape, st, base, vs, js, ms, os, n, count, mode, rows, ntask):
    for t in prange(ntask):
        _segment_task(x, ids, mask, out, shape, st, base, vs, js, ms, os, n, count, mode, rows, t, ntask)


SEGMENT = Twins(segment_serial, segment_parallel)


def cpu_tasks(node: Node) -> tuple[bool, int, int]:
    """(parallel, tasks, rows): rows split into tasks, each with its own scratch."""
    tv = node.input_types[0]
    rows = max(1, tv.elements // tv.size_of(node.attributes["axis"]))
    if not _rows.parallel_rows(rows, tv.elements):
        return False, 1, rows
    return True, min(rows, _rows.threads() * TASKS_PER_THREAD), rows


def _cpu_segment(request: KernelRequest) -> Kernel:
    node = request.node
    dt = float_kernel_dtype(node, "cpu")
    parallel, ntask, rows = cpu_tasks(node)
    kernel = SEGMENT.pick(parallel)
    n = node.input_types[0].size_of(node.attributes["axis"])
    count, mode = node.attributes["num_segments"], MODE_CODE[node.attributes["mode"]]
    prepared: dict[tuple, tuple] = {}

    def run(inputs: Sequence[np.ndarray], out: np.ndarray) -> None:
        views = [flat_view(x) for x in inputs]
        key = tuple(v[2] for v in views)
        args = prepared.get(key)
        if args is None:
            args = prepared[key] = segment_rows(node, key)
        r, along = args
        kernel(views[0][0].view(dt), views[1][0].view(np.int64), views[2][0], out.reshape(-1), r.shape,
               r.strides, _i64([views[0][1], views[1][1], views[2][1], 0]), *along, n, count, mode, rows, ntask)
    return plain_kernel(run, warm=SEGMENT.warm)


# --- cuda ---------------------------------------------------------------------------------------


def _cuda_segment(request: KernelRequest) -> Kernel:
    from numba import cuda

    from atoms.cuda import segment as device  # numba.cuda loads with the first cuda kernel
    from runtime.toolkit.cuda import SpaceKernel

    node = request.node
    dt = float_kernel_dtype(node, "cuda")
    kernel = SpaceKernel.of(device.segment)
    r, along = segment_rows(node, [c_strides(t.shape) for t in node.input_types])
    shape, st = cuda.to_device(r.shape), cuda.to_device(r.strides)
    n = node.input_types[0].size_of(node.attributes["axis"])
    count, mode = node.attributes["num_segments"], MODE_CODE[node.attributes["mode"]]
    rows = r.count
    scratch = rows * count
    acc, mx = cuda.device_array(scratch, dt), cuda.device_array(scratch, dt)
    cnt = cuda.device_array(scratch, np.int64)

    def run(inputs, out) -> None:
        kernel([device_bits(inputs[0]).view(dt), device_bits(inputs[1]).view(np.int64), device_bits(inputs[2]),
                out.reshape((max(1, node.output_type.elements),)), shape, st, *along, n, count, mode,
                acc, cnt, mx, rows], rows)
    return plain_kernel(run)


def scratch_bytes(node: Node, backend: str) -> int:
    """Bytes of per-group scratch (sum, maximum, count: 8 bytes each at most): one set per
    thread on cpu, one per row elsewhere (cuda threads; the reference's vectorised groups)."""
    count = node.attributes["num_segments"]
    if backend == "cpu":
        parallel, _, _ = cpu_tasks(node)
        return (_rows.threads() if parallel else 1) * count * 24
    tv = node.input_types[0]
    return max(1, tv.elements // tv.size_of(node.attributes["axis"])) * count * 24


SPECS = [
    AtomSpec(name="segment", refs=refs_for("segment"), inputs=("value", "ids", "mask"),
             dtypes={"value": "floating", "ids": "int64", "mask": "boolean"},
             attributes=frozenset({"axis", "segment_axis", "num_segments", "mode", "accumulation_dtype"}),
             infer=infer_segment,
             kernels={"reference": _ref_segment, "cpu": _cpu_segment, "cuda": _cuda_segment},
             check_values=check_segment_ids, checked_inputs=(1, 2), scratch_bytes=scratch_bytes,
             free_axes=axes_except("axis", "segment_axis"),
             summary="sum, mean, amax or softmax over id groups along one axis (masked entries ignored)"),
]
