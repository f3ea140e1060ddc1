"""Layout atoms (SPEC §3): reshape, permute, broadcast, slice, concat.

They only move data, so the cpu and cuda kernels share one primitive: a strided copy that
reads an affine view of an operand and writes (a part of) the output. Each atom describes
its output as :class:`Move` records (pure index arithmetic on element strides), and a
backend runs them. Elements move as raw bits (uint8/16/32/64 views), so every dtype works,
bfloat16 included, and each backend compiles one kernel per item size, not per dtype or
rank. The reference kernels are written with NumPy directly and serve as the oracle.
The strided-copy machinery is also used by the indexing family (atoms/indexing.py).
"""
from __future__ import annotations

import math
from collections import Counter
from collections.abc import Callable, Sequence

import attrs
import numpy as np

from runtime.plugins.atomspec import AtomSpec, InferContext, Node, axes_except, every_axis, linear_in
from runtime.plugins.kernel import (CompiledCall, Counts, Kernel, KernelRequest, const_array, const_int, const_scalar,
                                    flat_input, flat_output, plain_kernel)
from runtime.core.errors import fail
from runtime.toolkit import align_to, span_view
from runtime.core.types import HALF_DTYPES, NAME_RE, Size, TensorType

from . import _copy
from ._refs import refs_for

BITS = {1: np.uint8, 2: np.uint16, 4: np.uint32, 8: np.uint64}


# --- attribute helpers (shared with atoms/indexing.py) -------------------------------------

def axes_attr(ctx: InferContext, key: str) -> tuple[str, ...]:
    """A list of unique axis names that match the axis pattern."""
    axes = ctx.attr_axes(key)
    for k, a in enumerate(axes):
        if not NAME_RE.match(a):
            fail("invalid_name", f"{ctx.attr_path(key)}[{k}]",
                 f"{ctx.atom.name}: axis name {a!r} does not match {NAME_RE.pattern}")
    return axes


def sizes_attr(ctx: InferContext, key: str, count: int) -> tuple[Size, ...]:
    """``count`` extents (positive ints or symbols), symbols known in ``ctx.dims`` resolved."""
    v = ctx.attributes[key]
    if not isinstance(v, list):
        ctx.bad_attr(key, "expected a list of sizes (positive integers or symbols)")
    if len(v) != count:
        ctx.bad_attr(key, f"has {len(v)} sizes but output_axes names {count} axes")
    out: list[Size] = []
    for k, s in enumerate(v):
        path = f"{ctx.attr_path(key)}[{k}]"
        if isinstance(s, str):
            if not NAME_RE.match(s):
                fail("invalid_name", path, f"{ctx.atom.name}: size symbol {s!r} does not match {NAME_RE.pattern}")
            out.append(ctx.dims.get(s, s))
        elif isinstance(s, bool) or not isinstance(s, int) or s < 1:
            fail("atom_attributes", path, f"{ctx.atom.name}: a size must be a positive integer or a "
                                          f"symbol, got {s!r}")
        else:
            out.append(s)
    return tuple(out)


# --- infer ---------------------------------------------------------------------------------

def infer_reshape(ctx: InferContext) -> TensorType:
    """Element counts must agree. Symbols common to both sides cancel; what remains is
    checked when it is decidable. On concrete operand types (``ctx.planning``)
    one output symbol still unresolved is inferred from the element count."""
    t = ctx.operands[0]
    axes = axes_attr(ctx, "output_axes")
    sizes = list(sizes_attr(ctx, "output_sizes", len(axes)))
    unresolved = [k for k, s in enumerate(sizes) if isinstance(s, str)]
    in_static = math.prod(s for s in t.sizes if isinstance(s, int))
    out_static = math.prod(s for s in sizes if isinstance(s, int))
    what = f"value {t.describe()} cannot be reshaped to {dict(zip(axes, sizes))}"
    if t.is_static and (ctx.planning or ctx.dims) and unresolved:
        if len(unresolved) > 1:
            fail("type_mismatch", ctx.attr_path("output_sizes"),
                 f"reshape: output sizes {[sizes[k] for k in unresolved]} are unresolved; at most "
                 "one output size can be inferred from the element count")
        if in_static % out_static:
            ctx.mismatch(f"{what}: {in_static} elements are not a multiple of {out_static}", 0)
        sizes[unresolved[0]] = in_static // out_static
        return ctx.output(axes, sizes)
    in_syms = Counter(s for s in t.sizes if isinstance(s, str))
    out_syms = Counter(sizes[k] for k in unresolved)
    rest_in, rest_out = in_syms - out_syms, out_syms - in_syms
    if not rest_in and not rest_out and in_static != out_static:
        ctx.mismatch(f"{what}: element counts differ ({in_static} vs {out_static})", 0)
    if not rest_in and rest_out and in_static % out_static:
        ctx.mismatch(f"{what}: {in_static} elements are not a multiple of {out_static}", 0)
    if rest_in and not rest_out and out_static % in_static:
        ctx.mismatch(f"{what}: {out_static} elements are not a multiple of {in_static}", 0)
    return ctx.output(axes, sizes)


def infer_permute(ctx: InferContext) -> TensorType:
    t = ctx.operands[0]
    axes = ctx.attr_axes("output_axes")
    if sorted(axes) != sorted(t.axes):
        ctx.bad_attr("output_axes", f"{list(axes)} is not a permutation of the value's axes {list(t.axes)}")
    return ctx.output(axes, [t.size_of(a) for a in axes])


def infer_broadcast(ctx: InferContext) -> TensorType:
    """Output axes in any order; each value axis kept with its extent or expanded from 1."""
    t = ctx.operands[0]
    axes = axes_attr(ctx, "output_axes")
    sizes = sizes_attr(ctx, "output_sizes", len(axes))
    missing = [a for a in t.axes if a not in axes]
    if missing:
        ctx.bad_attr("output_axes", f"{list(axes)} drops value axes {missing}; broadcast keeps every axis")
    for a, s in zip(t.axes, t.sizes):
        if s != 1:
            ctx.require_extent(s, sizes[axes.index(a)], f"value axis {a!r} (only extent 1 expands)", 0)
    return ctx.output(axes, sizes)


def slice_extent(n: int, start: int, stop: int | None, step: int) -> int:
    return len(range(n)[start:stop:step])


def infer_slice(ctx: InferContext) -> TensorType:
    t = ctx.operands[0]
    axis = ctx.axis_of("axis", 0)
    start = ctx.attr_int("start", minimum=0)
    stop = ctx.attr_int("stop", minimum=0, nullable=True)
    step = ctx.attr_int("step", minimum=1)
    n = t.size_of(axis)
    sizes = list(t.sizes)
    if isinstance(n, str):
        for key, full in (("start", 0), ("stop", None), ("step", 1)):
            if ctx.attributes[key] != full:
                ctx.bad_attr(key, f"axis {axis!r} has symbolic extent {n!r}; only the full slice "
                                  "(start 0, stop null, step 1) is allowed")
        return ctx.output(t.axes, sizes)
    extent = slice_extent(n, start, stop, step)
    if extent == 0:
        key = "start" if start >= n else "stop"
        ctx.bad_attr(key, f"slice [{start}:{stop}:{step}] of axis {axis!r} (extent {n}) is empty")
    sizes[t.axes.index(axis)] = extent
    return ctx.output(t.axes, sizes)


def infer_concat(ctx: InferContext) -> TensorType:
    axis = ctx.axis_of("axis", 0)
    tl, tr = ctx.operands
    if tl.axes != tr.axes:
        ctx.mismatch(f"left has axes {list(tl.axes)} but right has {list(tr.axes)}; they must be identical", 1)
    ctx.require_same_dtype_domain(0, 1)
    p = tl.axes.index(axis)
    a, b = tl.sizes[p], tr.sizes[p]
    if not (isinstance(a, int) and isinstance(b, int)):
        ctx.mismatch(f"concat axis {axis!r} must be static in both operands, got extents {a} and {b}",
                     0 if isinstance(b, int) else 1)
    for k, (x, y) in enumerate(zip(tl.sizes, tr.sizes)):
        if k != p:
            ctx.require_extent(x, y, f"axis {tl.axes[k]!r} of left and right", 1)
    sizes = list(tl.sizes)
    sizes[p] = a + b
    return ctx.output(tl.axes, sizes)


# --- moves: the kernels' index arithmetic ---------------------------------------------------

@attrs.frozen
class Move:
    """``dst[doff + Σ i·dstr] = operand[src][soff + Σ i·sstr]`` for every index i of ``shape``;
    offsets and strides count elements from the operand's (or output's) first element."""

    src: int
    shape: tuple[int, ...]
    sstr: tuple[int, ...]
    soff: int
    dstr: tuple[int, ...]
    doff: int = 0


def c_strides(shape: Sequence[int]) -> tuple[int, ...]:
    out, acc = [], 1
    for n in reversed(shape):
        out.append(acc if n > 1 else 0)
        acc *= n
    return tuple(reversed(out))


def coalesce(shape: Sequence[int], *strides: Sequence[int]) -> tuple[list[int], list[list[int]]]:
    """Drop unit axes and merge neighbours whose strides chain in every vector, so the kernel's
    inner loop runs as long as possible (a contiguous copy becomes one flat loop). Rank >= 1."""
    dims = [(n, [s[k] for s in strides]) for k, n in enumerate(shape) if n > 1]
    merged: list[tuple[int, list[int]]] = []
    for n, st in dims:
        if merged:
            pn, pst = merged[-1]
            if all(ps == s * n for ps, s in zip(pst, st)):
                merged[-1] = (pn * n, st)
                continue
        merged.append((n, st))
    if not merged:
        merged = [(1, [0] * len(strides))]
    return [n for n, _ in merged], [[st[j] for _, st in merged] for j in range(len(strides))]


def moves_reshape(node: Node, strides: Sequence[tuple[int, ...]]) -> list[Move]:
    shape = node.input_types[0].shape
    return [Move(0, shape, strides[0], 0, c_strides(shape))]


def moves_permute(node: Node, strides: Sequence[tuple[int, ...]]) -> list[Move]:
    t, o = node.input_types[0], node.output_type
    sstr = tuple(strides[0][t.axes.index(a)] for a in o.axes)
    return [Move(0, o.shape, sstr, 0, c_strides(o.shape))]


def moves_broadcast(node: Node, strides: Sequence[tuple[int, ...]]) -> list[Move]:
    t, o = node.input_types[0], node.output_type
    sstr = tuple(strides[0][t.axes.index(a)] if a in t.axes and t.size_of(a) == n else 0
                 for a, n in zip(o.axes, o.shape))
    return [Move(0, o.shape, sstr, 0, c_strides(o.shape))]


def moves_slice(node: Node, strides: Sequence[tuple[int, ...]]) -> list[Move]:
    t, o, at = node.input_types[0], node.output_type, node.attributes
    p = t.axes.index(at["axis"])
    sstr = list(strides[0])
    soff = at["start"] * sstr[p]
    sstr[p] *= at["step"]
    return [Move(0, o.shape, tuple(sstr), soff, c_strides(o.shape))]


def moves_concat(node: Node, strides: Sequence[tuple[int, ...]]) -> list[Move]:
    tl, tr, o = *node.input_types, node.output_type
    p = tl.axes.index(node.attributes["axis"])
    ostr = tuple(math.prod(o.shape[k + 1:]) for k in range(o.rank))  # true strides: offsets use them
    return [Move(0, tl.shape, strides[0], 0, ostr),
            Move(1, tr.shape, strides[1], 0, ostr, tl.shape[p] * ostr[p])]


# --- cpu -------------------------------------------------------------------------------------

def flat_view(x: np.ndarray) -> tuple[np.ndarray, int, tuple[int, ...]]:
    """(1-D read-only bits view spanning ``x``'s memory, offset of ``x[0, ...]`` in it, element
    strides of ``x``): any strided or negative-stride view, never a copy unless its byte
    strides are not multiples of the item size."""
    x = np.asarray(x)
    item = x.itemsize
    if any(s % item for s in x.strides):
        x = np.ascontiguousarray(x)
    strides = tuple(s // item if n > 1 else 0 for s, n in zip(x.strides, x.shape))
    if any(s < 0 for s in strides):
        x = x[tuple(slice(None, None, -1) if s < 0 else slice(None) for s in strides)]
    origin = sum((n - 1) * -s for n, s in zip(x.shape, strides) if s < 0)
    if x.size == 0:  # (a one-element span, as before: never read)
        flat = np.lib.stride_tricks.as_strided(x, shape=(1,), strides=(item,), writeable=False)
    else:
        flat = span_view(x)
    return flat.view(BITS[item]), origin, strides


def out_bits(out) -> object:
    """The output buffer as a flat bits array (host or device; ``out`` is C-contiguous)."""
    return out.reshape((max(1, math.prod(out.shape)),)).view(BITS[out.dtype.itemsize])


def _i64(v: Sequence[int]) -> np.ndarray:
    return np.array(v, dtype=np.int64)


def mover_cpu(make_moves: Callable[[Node, Sequence[tuple[int, ...]]], list[Move]], reads_all: bool = True):
    """A cpu kernel factory running ``make_moves`` with the operands' actual strides. With
    ``reads_all`` (the moves read every element of every operand), the kernel counts the NaN
    and ±inf values of the operands the request asks for, by exponent bits, in the copy's
    own pass."""
    def factory(request: KernelRequest) -> Kernel:
        node = request.node
        checked = request.count_inputs if reads_all else ()
        item = _itemsize(node.output_type)
        masks = [_copy.exponent_mask(t.dtype, item) if k in checked else _copy.exponent_mask("", item)
                 for k, t in enumerate(node.input_types)]
        prepared: dict[tuple, list] = {}  # operand strides -> ready kernel arguments

        def run(inputs: Sequence[np.ndarray], out: np.ndarray) -> int:
            views = [flat_view(x) for x in inputs]
            key = tuple(v[2] for v in views)
            calls = prepared.get(key)
            if calls is None:
                calls = []
                for m in make_moves(node, key):
                    shape, (sstr, dstr) = coalesce(m.shape, m.sstr, m.dstr)
                    parallel, ntask = _copy.tasks(shape, math.prod(shape))
                    calls.append((_copy.kernel("strided", item, parallel), m.src, m.soff, _i64(sstr), m.doff,
                                  _i64(dstr), _i64(shape), masks[m.src], ntask))
                prepared[key] = calls
            dst = out_bits(out)
            found = 0
            for kernel, src, soff, sstr, doff, dstr, shape, mask, ntask in calls:
                flat, origin, _ = views[src]
                found += kernel(flat, origin + soff, sstr, dst, doff, dstr, shape, mask, ntask)
            return found
        return plain_kernel(run, Counts(inputs=tuple(checked)), warm=lambda: _copy.warm("strided", item),
                            compiled=_compiled_move(make_moves, node, masks, item))
    return factory


def compiled_copies(node: Node) -> bool:
    """Whether compiled code can run ``node``'s copies: static, non-empty operands of a dtype
    Numba types (no half: their bits are moved as the Python launch views them)."""
    return all(t.is_static and t.elements and t.dtype not in HALF_DTYPES for t in (*node.input_types, node.output_type))


def _compiled_move(make_moves, node: Node, masks, item: int) -> CompiledCall | None:
    """How compiled code runs the copy for C-contiguous operands (as ``flat_view`` sees them:
    stride 0 on axes of extent 1), when it is one move over non-empty operands."""
    if not compiled_copies(node):
        return None
    moves = make_moves(node, [c_strides(t.shape) for t in node.input_types])
    if len(moves) != 1:
        return None
    m = moves[0]
    shape, (sstr, dstr) = coalesce(m.shape, m.sstr, m.dstr)
    parallel, ntask = _copy.tasks(shape, math.prod(shape))
    bits = BITS[item].__name__
    return CompiledCall(lambda: _copy.kernel("strided", item, parallel),
                        (flat_input(m.src, view=bits, unaligned=True), const_int(m.soff), const_array(_i64(sstr)),
                         flat_output(view=bits, unaligned=True), const_int(m.doff), const_array(_i64(dstr)),
                         const_array(_i64(shape)), const_scalar(masks[m.src]), const_int(ntask)))


def _itemsize(t: TensorType) -> int:
    from runtime.core.types import numpy_dtype

    return numpy_dtype(t.dtype).itemsize


# --- cuda ------------------------------------------------------------------------------------


def device_bits(x):
    """A C-contiguous device operand as flat bits (a strided one is made contiguous first)."""
    if not x.is_c_contiguous():
        from numba import cuda

        x = cuda.to_device(np.ascontiguousarray(x.copy_to_host()))
    return x.reshape((max(1, math.prod(x.shape)),)).view(BITS[x.dtype.itemsize])


def mover_cuda(make_moves: Callable[[Node, Sequence[tuple[int, ...]]], list[Move]]):
    """A cuda kernel factory: moves fixed at plan time for C-contiguous device operands."""
    def factory(request: KernelRequest) -> Kernel:
        from numba import cuda

        from atoms.cuda import layout as device  # numba.cuda loads with the first cuda kernel
        from runtime.toolkit.cuda import SpaceKernel

        kernel = SpaceKernel.of(device.copy)
        calls = []
        node = request.node
        for m in make_moves(node, [c_strides(t.shape) for t in node.input_types]):
            shape, (sstr, dstr) = coalesce(m.shape, m.sstr, m.dstr)
            meta = cuda.to_device(np.array([shape, sstr, dstr], dtype=np.int64))
            calls.append((m.src, m.soff, m.doff, meta, math.prod(shape)))

        def run(inputs, out) -> None:
            srcs = [device_bits(x) for x in inputs]
            dst = out_bits(out)
            for src, soff, doff, meta, n in calls:
                kernel([srcs[src], soff, dst, doff, meta, n], n)
        return plain_kernel(run)
    return factory


# --- reference ---------------------------------------------------------------------------------

def _ref_reshape(request: KernelRequest) -> Kernel:
    def run(inputs, out):
        out[...] = np.reshape(np.asarray(inputs[0]), out.shape)
    return plain_kernel(run)


def _ref_permute(request: KernelRequest) -> Kernel:
    node = request.node
    t = node.input_types[0]
    perm = [t.axes.index(a) for a in node.output_type.axes]

    def run(inputs, out):
        out[...] = np.transpose(np.asarray(inputs[0]), perm)
    return plain_kernel(run)


def _ref_broadcast(request: KernelRequest) -> Kernel:
    node = request.node
    def run(inputs, out):
        out[...] = align_to(np.asarray(inputs[0]), node.input_types[0], node.output_type)
    return plain_kernel(run)


def _ref_slice(request: KernelRequest) -> Kernel:
    node = request.node
    t, at = node.input_types[0], node.attributes
    p = t.axes.index(at["axis"])
    index = tuple(slice(at["start"], at["stop"], at["step"]) if k == p else slice(None)
                  for k in range(t.rank))

    def run(inputs, out):
        out[...] = np.asarray(inputs[0])[index]
    return plain_kernel(run)


def _ref_concat(request: KernelRequest) -> Kernel:
    node = request.node
    p = node.input_types[0].axes.index(node.attributes["axis"])

    def run(inputs, out):
        out[...] = np.concatenate([np.asarray(inputs[0]), np.asarray(inputs[1])], axis=p)
    return plain_kernel(run)


def free_reshape(node: Node) -> frozenset[str]:
    """A C-order reshape keeps the leading axes that agree in name and extent on both sides."""
    t, o = node.input_types[0], node.output_type
    kept = []
    for a, s, b, z in zip(t.axes, t.sizes, o.axes, o.sizes):
        if (a, s) != (b, z):
            break
        kept.append(a)
    return frozenset(kept)


def _spec(name, inputs, attributes, infer, reference, moves, summary, free, reads_all=True,
          view=False, role=None) -> AtomSpec:
    """``reads_all``: the moves read every element of every operand (all but slice), so the
    cpu kernel can take over their finiteness check. ``view``: see ``AtomSpec.view``."""
    return AtomSpec(name=name, refs=refs_for(name), inputs=inputs, attributes=frozenset(attributes),
                    dtypes={operand: "any" for operand in inputs},
                    infer=infer, kernels={"reference": reference, "cpu": mover_cpu(moves, reads_all),
                                          "cuda": mover_cuda(moves)},
                    summary=summary, free_axes=free, view=view, role=role,
                    linear=linear_in(*range(len(inputs))))  # moves: linear in their operands together


SPECS = [
    _spec("reshape", ("value",), {"output_axes", "output_sizes"}, infer_reshape, _ref_reshape,
          moves_reshape, "C-order reshape; one unresolved output symbol is inferred at run time", free_reshape,
          view=True),
    _spec("permute", ("value",), {"output_axes"}, infer_permute, _ref_permute, moves_permute,
          "axes reordered", every_axis),
    _spec("broadcast", ("value",), {"output_axes", "output_sizes"}, infer_broadcast,
          _ref_broadcast, moves_broadcast, "extent-1 axes expanded and new axes added", every_axis,
          role="broadcast"),
    _spec("slice", ("value",), {"axis", "start", "stop", "step"}, infer_slice, _ref_slice,
          moves_slice, "Python slice (start, stop, step > 0) of one axis; never empty", axes_except("axis"),
          reads_all=False),
    _spec("concat", ("left", "right"), {"axis"}, infer_concat, _ref_concat, moves_concat,
          "left then right along one static axis", axes_except("axis")),
]
