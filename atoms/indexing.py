"""Indexing atoms whose kernels are index-driven copies: gather, scatter, lookup (SPEC §3);
gather@2 and the legacy arti/fold@2, arti/unfold@2 (§3b), with the index checks they share with
scatter@2 (its adding kernels are in ``atoms.scatter_add``).

gather@2, fold and unfold reuse the bit-moving kernels below (gather@2 for any payload dtype).

Index values are checked on the host before any kernel runs (``check_values``: vectorised
NumPy, ``index_range`` and ``duplicate_index``), and the kernels guard every index anyway,
so no backend ever reads or writes out of bounds. Like the layout family, the cpu and cuda
kernels move raw bits with one index-driven strided copy per item size:
``dst[d(i) + v·dax] = src[s(i) + v·sax]`` with ``v = indices[x(i)]`` over an iteration space i,
where exactly one of ``sax`` (gather, lookup) and ``dax`` (scatter) is non-zero.

scatter's uniqueness rule: indices broadcast over the base axes they lack, so two updates
write the same base element exactly when, at one fixed position of the indices' other axes,
two entries along ``index_axis`` are equal. That is what ``duplicate_index`` rejects; equal
values at different positions of the other axes are allowed (they address different rows).
"""
from __future__ import annotations

import math
from collections.abc import Sequence

import attrs
import numpy as np

from runtime.plugins.atomspec import AtomSpec, InferContext, Node, axes_except, every_axis
from runtime.plugins.kernel import (CompiledCall, Kernel, KernelRequest, const_array, const_int, flat_input,
                                    flat_output, plain_kernel)
from runtime.core.errors import fail
from runtime.toolkit import align_to, c_strides as true_strides  # (every axis, extent 1 too)
from runtime.core.types import TensorType

from ._refs import refs_for
from . import _copy
from .layout import BITS, _i64, _itemsize, c_strides, coalesce, compiled_copies, device_bits, flat_view, out_bits


# --- infer -----------------------------------------------------------------------------------

def gather_type(ctx: InferContext, value: int = 0, indices: int = 1, version: int = 1) -> TensorType:
    """The type gather(value, indices) gives, after checking the SPEC rules (scatter reuses it).

    ``version`` 2 (§3b: gather@2, scatter@2) takes a value of any dtype and reports index_axis
    rules as operand errors (type_mismatch); version 1 as attribute errors."""
    tv, ti = ctx.operands[value], ctx.operands[indices]
    vname, iname = ctx.atom.inputs[value], ctx.atom.inputs[indices]
    axis = ctx.axis_of("axis", value)
    ia = ctx.attributes["index_axis"]
    if not isinstance(ia, str):
        ctx.bad_attr("index_axis", f"expected an axis name, got {ia!r}")

    def bad_index_axis(message: str):
        if version == 1:
            ctx.bad_attr("index_axis", message)
        ctx.mismatch(f"index_axis: {message}", indices)

    if ia not in ti.axes:
        bad_index_axis(f"{iname} has no axis {ia!r} (axes {list(ti.axes)})")
    if ia in tv.axes:
        bad_index_axis(f"{ia!r} is an axis of {vname}; the index axis must be the "
                       f"one axis of {iname} that {vname} lacks")
    if ti.dtype != "int64":
        ctx.mismatch(f"{iname} must be int64, got {ti.dtype}", indices)
    if version == 1 and tv.dtype == "int64":
        ctx.mismatch(f"{vname} must not be int64 (it would be confused with indices)", value)
    if ti.domain != tv.domain:
        ctx.mismatch(f"{iname} is in domain {ti.domain!r} but {vname} is in {tv.domain!r}", indices)
    for a, s in zip(ti.axes, ti.sizes):
        if a == ia:
            continue
        if a == axis or a not in tv.axes:
            ctx.mismatch(f"{iname} axis {a!r}: besides {ia!r}, {iname} may only have axes of {vname} "
                         f"other than {axis!r} (axes {list(tv.axes)})", indices)
        ctx.require_extent(s, tv.size_of(a), f"axis {a!r} of {iname} and {vname}", indices)
    n = ti.size_of(ia)
    return ctx.output([ia if a == axis else a for a in tv.axes],
                      [n if a == axis else s for a, s in zip(tv.axes, tv.sizes)], like=value)


def infer_gather(ctx: InferContext) -> TensorType:
    return gather_type(ctx)


def infer_scatter(ctx: InferContext) -> TensorType:
    ctx.attr_str("mode", ("replace",))
    expected = gather_type(ctx)
    tb, tu = ctx.operands[0], ctx.operands[2]
    if tu.axes != expected.axes:
        ctx.mismatch(f"updates must have axes {list(expected.axes)} (the gather of base by indices), "
                     f"got {list(tu.axes)}", 2)
    ctx.require_same_dtype_domain(0, 2)
    for a, want, got in zip(tu.axes, expected.sizes, tu.sizes):
        ctx.require_extent(got, want, f"updates axis {a!r} against gather(base, indices)", 2)
    return ctx.output(tb.axes, tb.sizes)


def infer_gather2(ctx: InferContext) -> TensorType:
    return gather_type(ctx, version=2)


FOLD_REFS = {"record_schema_ref": "arti/fold-record@1", "state_schema_ref": "arti/fold-state@1"}


def _check_fold_refs(ctx: InferContext) -> None:
    for key, want in FOLD_REFS.items():
        if key in ctx.attributes:
            ctx.attr_str(key, (want,))


def infer_fold(ctx: InferContext) -> TensorType:
    _check_fold_refs(ctx)
    return gather_type(ctx)


def infer_unfold(ctx: InferContext) -> TensorType:
    _check_fold_refs(ctx)
    return infer_scatter(ctx)


def infer_lookup(ctx: InferContext) -> TensorType:
    tt, ti = ctx.operands
    ta = ctx.axis_of("table_axis", 0)
    out_axes = ctx.attr_axes("output_axes")
    ctx.require_dtype(0, "floating")
    if ti.dtype != "int64":
        ctx.mismatch(f"indices must be int64, got {ti.dtype}", 1)
    if ti.domain != tt.domain:
        ctx.mismatch(f"indices are in domain {ti.domain!r} but table is in {tt.domain!r}", 1)
    others = [a for a in tt.axes if a != ta]
    overlap = [a for a in ti.axes if a in others]
    if overlap:
        ctx.mismatch(f"index axes {overlap} are also table axes; the index axes and the table's "
                     f"axes other than {ta!r} must be disjoint", 1)
    expected = list(ti.axes) + others
    if sorted(out_axes) != sorted(expected):
        ctx.bad_attr("output_axes", f"{list(out_axes)} is not a permutation of the index axes "
                                    f"{list(ti.axes)} and the table axes {others}")
    sizes = [ti.size_of(a) if a in ti.axes else tt.size_of(a) for a in out_axes]
    return ctx.output(out_axes, sizes)


# --- value checks ------------------------------------------------------------------------------

def check_range(node: Node, indices: np.ndarray, k: int, extent: int, axis: str) -> None:
    """index_range unless every index lies in [0, extent); names the first offender."""
    idx = np.asarray(indices)
    # one reduction, not two: seen unsigned, a negative index is larger than any extent
    unsigned = idx.view(f"u{idx.dtype.itemsize}") if idx.dtype.kind == "i" and idx.ndim else idx
    if idx.size == 0 or (unsigned.max() < extent and (unsigned is not idx or idx.min() >= 0)):
        return
    bad = (idx < 0) | (idx >= extent)
    where = np.unravel_index(int(np.argmax(bad)), idx.shape)
    axes = node.input_types[k].axes
    at = ", ".join(f"{a}={int(w)}" for a, w in zip(axes, where))
    fail("index_range", f"{node.path}.input_slots[{k}]",
         f"{node.atom.name}: {node.atom.inputs[k]}[{at}] = {int(idx[where])} is outside [0, {extent}) "
         f"of axis {axis!r}")


def check_unique(node: Node, indices: np.ndarray, k: int, index_axis: str) -> None:
    """duplicate_index when one position of the other axes repeats a value along index_axis."""
    t = node.input_types[k]
    p = t.axes.index(index_axis)
    rows = np.moveaxis(np.asarray(indices), p, -1).reshape(-1, t.shape[p])
    if rows.shape[1] < 2:
        return
    ordered = np.sort(rows, axis=1)
    dup = ordered[:, 1:] == ordered[:, :-1]
    if not dup.any():
        return
    r, c = np.unravel_index(int(np.argmax(dup)), dup.shape)
    value = ordered[r, c]
    first, second = np.flatnonzero(rows[r] == value)[:2]
    others = [a for a in t.axes if a != index_axis]
    where = np.unravel_index(int(r), tuple(t.size_of(a) for a in others)) if others else ()
    at = "".join(f", {a}={int(w)}" for a, w in zip(others, where))
    fail("duplicate_index", f"{node.path}.input_slots[{k}]",
         f"scatter: indices repeat {int(value)} at {index_axis}={int(first)} and "
         f"{index_axis}={int(second)}{at}; scatter indices must be unique along {index_axis!r}")


def check_gather(node: Node, host: Sequence) -> None:
    axis = node.attributes["axis"]
    check_range(node, host[1], 1, node.input_types[0].size_of(axis), axis)


def _check_scatter(node: Node, host: Sequence) -> None:
    check_gather(node, host)
    check_unique(node, host[1], 1, node.attributes["index_axis"])


def _check_lookup(node: Node, host: Sequence) -> None:
    axis = node.attributes["table_axis"]
    check_range(node, host[1], 1, node.input_types[0].size_of(axis), axis)


# --- index arithmetic ----------------------------------------------------------------------------

@attrs.frozen
class IndexedMove:
    """Over ``shape`` (axes ``space``): v = idx[Σ i·istr]; dst[Σ i·dstr + v·dax] = src[Σ i·sstr + v·sax]."""

    shape: tuple[int, ...]
    sstr: tuple[int, ...]
    sax: int
    istr: tuple[int, ...]
    dstr: tuple[int, ...]
    dax: int
    bound: int


def _strides_over(space: Sequence[str], t: TensorType, strides: Sequence[int],
                  skip: str | None = None) -> tuple[int, ...]:
    """``t``'s strides along the axes of ``space`` (0 where ``t`` lacks the axis or for ``skip``)."""
    own = dict(zip(t.axes, strides))
    return tuple(0 if a == skip else own.get(a, 0) for a in space)


def moves_gather(node: Node, src_strides, idx_strides) -> IndexedMove:
    tv, ti = node.input_types[:2]
    o, axis, ia = node.output_type, node.attributes["axis"], node.attributes["index_axis"]
    return IndexedMove(o.shape, _strides_over(o.axes, tv, src_strides, skip=ia),
                       src_strides[tv.axes.index(axis)], _strides_over(o.axes, ti, idx_strides),
                       c_strides(o.shape), 0, tv.size_of(axis))


def moves_lookup(node: Node, src_strides, idx_strides) -> IndexedMove:
    tt, ti = node.input_types
    o, ta = node.output_type, node.attributes["table_axis"]
    return IndexedMove(o.shape, _strides_over(o.axes, tt, src_strides, skip=ta),
                       src_strides[tt.axes.index(ta)], _strides_over(o.axes, ti, idx_strides),
                       c_strides(o.shape), 0, tt.size_of(ta))


def moves_scatter(node: Node, src_strides, idx_strides) -> IndexedMove:
    """Iterates the updates (``src``); writes the output, which has base's C layout."""
    tb, ti, tu = node.input_types
    axis, ia = node.attributes["axis"], node.attributes["index_axis"]
    ostr = true_strides(tb.shape)
    return IndexedMove(tu.shape, tuple(src_strides), 0, _strides_over(tu.axes, ti, idx_strides),
                       _strides_over(tu.axes, tb, ostr, skip=ia), ostr[tb.axes.index(axis)],
                       tb.size_of(axis))


# operand positions per atom: (source of the moved values, indices, base copied first or None)
OPERANDS = {"gather": (0, 1, None), "lookup": (0, 1, None), "scatter": (2, 1, 0), "fold": (0, 1, None),
            "unfold": (2, 1, 0)}
MOVES = {"gather": moves_gather, "lookup": moves_lookup, "scatter": moves_scatter, "fold": moves_gather,
         "unfold": moves_scatter}


def _prepare(m: IndexedMove):
    shape, (sstr, istr, dstr) = coalesce(m.shape, m.sstr, m.istr, m.dstr)
    return shape, sstr, istr, dstr


# --- cpu -------------------------------------------------------------------------------------------

def _cpu(request: KernelRequest) -> Kernel:
    node = request.node
    name = node.atom.name
    src_k, idx_k, base_k = OPERANDS[name]
    item = _itemsize(node.output_type)
    space = node.input_types[src_k].shape if base_k is not None else node.output_type.shape
    parallel, ntask = _copy.tasks(space or (1,), math.prod(space))
    kernel = _copy.kernel("indexed", item, parallel)
    no_mask = _copy.exponent_mask("", item)
    prepared: dict[tuple, tuple] = {}

    def run(inputs: Sequence[np.ndarray], out: np.ndarray) -> None:
        src, soff, sst = flat_view(inputs[src_k])
        idx, ioff, ist = flat_view(inputs[idx_k])
        key = (sst, ist)
        args = prepared.get(key)
        if args is None:
            m = MOVES[name](node, sst, ist)
            shape, sstr, istr, dstr = _prepare(m)
            args = prepared[key] = (_i64(sstr), m.sax, _i64(istr), m.bound, _i64(dstr), m.dax, _i64(shape))
        sstr, sax, istr, bound, dstr, dax, shape = args
        dst = out_bits(out)
        if base_k is not None:
            base, boff, bst = flat_view(inputs[base_k])
            bshape, (bs, bd) = coalesce(node.output_type.shape, bst, c_strides(node.output_type.shape))
            copy_parallel, copy_tasks = _copy.tasks(bshape, math.prod(bshape))
            _copy.kernel("strided", item, copy_parallel)(base, boff, _i64(bs), dst, 0, _i64(bd), _i64(bshape),
                                                          no_mask, copy_tasks)
        bad = kernel(src, soff, sstr, sax, idx.view(np.int64), ioff, istr, bound, dst, 0, dstr, dax, shape, ntask)
        if bad:  # only reachable when check_values was skipped: re-run it for the precise error
            CHECKS[name](node, [inputs[k] if k == idx_k else None for k in range(len(inputs))])

    def warm() -> None:
        _copy.warm("indexed", item)
        if base_k is not None:
            _copy.warm("strided", item)
    compiled = _compiled_indexed(node, item, parallel, ntask) if base_k is None else None
    return plain_kernel(run, warm=warm, compiled=compiled)


def _compiled_indexed(node: Node, item: int, parallel: bool, ntask: int) -> CompiledCall | None:
    """How compiled code runs the copy for C-contiguous operands (``flat_view``'s strides:
    0 on axes of extent 1). Its count of indices out of range is not needed there: the
    executor checks every index before the kernel reads it (``check_values``)."""
    name = node.atom.name
    src_k, idx_k, _ = OPERANDS[name]
    if not compiled_copies(node):
        return None
    m = MOVES[name](node, c_strides(node.input_types[src_k].shape), c_strides(node.input_types[idx_k].shape))
    shape, sstr, istr, dstr = _prepare(m)
    bits = BITS[item].__name__
    return CompiledCall(lambda: _copy.kernel("indexed", item, parallel),
                        (flat_input(src_k, view=bits, unaligned=True), const_int(0), const_array(_i64(sstr)),
                         const_int(m.sax), flat_input(idx_k, view="int64", unaligned=True), const_int(0),
                         const_array(_i64(istr)), const_int(m.bound), flat_output(view=bits, unaligned=True),
                         const_int(0), const_array(_i64(dstr)), const_int(m.dax), const_array(_i64(shape)),
                         const_int(ntask)))


# --- cuda ------------------------------------------------------------------------------------------


def _cuda(request: KernelRequest) -> Kernel:
    from numba import cuda

    from atoms.cuda import indexing as device  # numba.cuda loads with the first cuda kernel
    from runtime.toolkit.cuda import SpaceKernel

    node = request.node
    name = node.atom.name
    src_k, idx_k, base_k = OPERANDS[name]
    kernel = SpaceKernel.of(device.indexed)
    types = node.input_types
    m = MOVES[name](node, c_strides(types[src_k].shape), c_strides(types[idx_k].shape))
    shape, sstr, istr, dstr = _prepare(m)
    meta = cuda.to_device(np.array([shape, sstr, istr, dstr], dtype=np.int64))
    n = math.prod(shape)

    def run(inputs, out) -> None:
        src = device_bits(inputs[src_k])
        idx = device_bits(inputs[idx_k]).view(np.int64)
        dst = out_bits(out)
        if base_k is not None:
            dst.copy_to_device(device_bits(inputs[base_k]))
        kernel([src, m.sax, idx, dst, m.dax, m.bound, meta, n], n)
    return plain_kernel(run)


# --- reference ---------------------------------------------------------------------------------------

def _ref_gather(request: KernelRequest) -> Kernel:
    node = request.node
    tv, ti = node.input_types
    p = tv.axes.index(node.attributes["axis"])

    def run(inputs, out):
        check_gather(node, inputs)
        full = align_to(np.asarray(inputs[1]), ti, node.output_type)
        out[...] = np.take_along_axis(np.asarray(inputs[0]), full, axis=p)
    return plain_kernel(run)


def _ref_scatter(request: KernelRequest) -> Kernel:
    node = request.node
    tb, ti, tu = node.input_types
    p = tb.axes.index(node.attributes["axis"])

    def run(inputs, out):
        _check_scatter(node, inputs)
        out[...] = inputs[0]
        full = align_to(np.asarray(inputs[1]), ti, tu)
        np.put_along_axis(out, full, np.asarray(inputs[2]), axis=p)
    return plain_kernel(run)


def _ref_lookup(request: KernelRequest) -> Kernel:
    node = request.node
    tt, ti = node.input_types
    q = tt.axes.index(node.attributes["table_axis"])
    taken = tt.axes[:q] + ti.axes + tt.axes[q + 1:]
    perm = [taken.index(a) for a in node.output_type.axes]

    def run(inputs, out):
        _check_lookup(node, inputs)
        out[...] = np.transpose(np.take(np.asarray(inputs[0]), np.asarray(inputs[1]), axis=q), perm)
    return plain_kernel(run)


CHECKS = {"gather": check_gather, "scatter": _check_scatter, "lookup": _check_lookup, "fold": check_gather,
          "unfold": _check_scatter}

GATHER_HALF_NATIVE = frozenset({"cpu", "cuda"})  # copies by item size: half values move as bits (also unfold)

SPECS = [
    AtomSpec(name="gather", refs=refs_for("gather", 2), inputs=("value", "indices"),
             dtypes={"value": "any", "indices": "int64"},
             attributes=frozenset({"axis", "index_axis"}), infer=infer_gather2,
             kernels={"reference": _ref_gather, "cpu": _cpu, "cuda": _cuda},
             check_values=check_gather, checked_inputs=(1,), half_native=GATHER_HALF_NATIVE,
             free_axes=every_axis,
             summary="value entries (any dtype) along one axis picked by int64 indices, repeats allowed"),
    AtomSpec(name="fold", refs=("arti/fold@2",), inputs=("value", "indices"),
             dtypes={"value": "floating|boolean", "indices": "int64"},
             attributes=frozenset({"axis", "index_axis", *FOLD_REFS}), infer=infer_fold,
             kernels={"reference": _ref_gather, "cpu": _cpu, "cuda": _cuda},
             check_values=check_gather, checked_inputs=(1,), half_native=GATHER_HALF_NATIVE,
             free_axes=every_axis,
             summary="legacy arti fold: gather of SPEC §3"),
    AtomSpec(name="unfold", refs=("arti/unfold@2",), inputs=("base", "indices", "updates"),
             dtypes={"base": "floating|boolean", "indices": "int64", "updates": "floating|boolean"},
             attributes=frozenset({"axis", "index_axis", "mode", "record_schema_ref"}), infer=infer_unfold,
             kernels={"reference": _ref_scatter, "cpu": _cpu, "cuda": _cuda},
             check_values=_check_scatter, checked_inputs=(1,), half_native=GATHER_HALF_NATIVE,
             free_axes=axes_except("axis"),
             summary="legacy arti unfold: scatter of SPEC §3 (unique indices)"),
    AtomSpec(name="gather", refs=refs_for("gather"), inputs=("value", "indices"),
             dtypes={"value": "floating|boolean", "indices": "int64"},
             attributes=frozenset({"axis", "index_axis"}), infer=infer_gather,
             kernels={"reference": _ref_gather, "cpu": _cpu, "cuda": _cuda},
             check_values=check_gather, checked_inputs=(1,),
             free_axes=every_axis,
             summary="value entries along one axis picked by int64 indices (range-checked)"),
    AtomSpec(name="scatter", refs=refs_for("scatter"), inputs=("base", "indices", "updates"),
             dtypes={"base": "floating|boolean", "indices": "int64", "updates": "floating|boolean"},
             attributes=frozenset({"axis", "index_axis", "mode"}), infer=infer_scatter,
             kernels={"reference": _ref_scatter, "cpu": _cpu, "cuda": _cuda},
             check_values=_check_scatter, checked_inputs=(1,),
             free_axes=axes_except("axis"),
             summary="copy of base with indexed positions replaced by updates (unique indices)"),
    AtomSpec(name="lookup", refs=refs_for("lookup"), inputs=("table", "indices"),
             dtypes={"table": "floating", "indices": "int64"},
             attributes=frozenset({"table_axis", "output_axes"}), infer=infer_lookup,
             kernels={"reference": _ref_lookup, "cpu": _cpu, "cuda": _cuda},
             check_values=_check_lookup, checked_inputs=(1,),
             free_axes=every_axis,
             summary="rows of a floating table picked by int64 indices of any rank"),
]
