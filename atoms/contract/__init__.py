"""The contract atom (SPEC §3): a sum over reduced axis pairs, by axis name.

``infer`` checks every rule of the atom with the path of the offending attribute element.
The reference kernel is ``np.einsum`` in the accumulation dtype (the oracle); the cpu and
cuda kernels lower any axis layout to a batched GEMM (atoms._gemm) and are the anchors of
fused groups: the plain kernel is the anchor with the empty epilogue.
"""
from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from runtime.plugins.atomspec import AtomSpec, InferContext, Linear, Node
from runtime.plugins.kernel import Kernel, KernelRequest, node_kernel
from runtime.core.types import TensorType, accumulation_dtype, numpy_dtype
from runtime.kernels.tiers import first_tier

from . import _gemm, _gemm_cuda
from ._refs import refs_for


# --- infer -------------------------------------------------------------------------------

def _pairs(ctx: InferContext) -> list[tuple[str, str]]:
    """reduce_axes: a non-empty list of [left_axis, right_axis], each axis once per side."""
    key = "reduce_axes"
    raw = ctx.attributes[key]
    left, right = ctx.operands
    if not isinstance(raw, list) or not raw:
        ctx.bad_attr(key, "expected a non-empty list of [left_axis, right_axis] pairs, got "
                          + ("an empty list" if isinstance(raw, list) else _kind(raw)))
    pairs, seen = [], ({}, {})
    for p, pair in enumerate(raw):
        where = f"{key}[{p}]"
        if not isinstance(pair, list) or len(pair) != 2:
            ctx.bad_attr(where, f"expected a [left_axis, right_axis] pair, got {_kind(pair)}")
        for side, (axis, t) in enumerate(zip(pair, (left, right))):
            at = f"{where}[{side}]"
            name = ctx.atom.inputs[side]
            if not isinstance(axis, str):
                ctx.bad_attr(at, f"expected an axis name, got {_kind(axis)}")
            if axis not in t.axes:
                ctx.bad_attr(at, f"{name} has no axis {axis!r} (axes {list(t.axes)})")
            if axis in seen[side]:
                ctx.bad_attr(at, f"{name} axis {axis!r} is already reduced by reduce_axes[{seen[side][axis]}]")
            seen[side][axis] = p
        pairs.append((pair[0], pair[1]))
    for p, (a, b) in enumerate(pairs):
        if a == b:
            continue
        if a in right.axes and a not in seen[1]:
            ctx.bad_attr(f"{key}[{p}][0]", f"left axis {a!r} is reduced against right axis {b!r} "
                                           f"but right keeps an axis {a!r}: the names would alias")
        if b in left.axes and b not in seen[0]:
            ctx.bad_attr(f"{key}[{p}][1]", f"right axis {b!r} is reduced against left axis {a!r} "
                                           f"but left keeps an axis {b!r}: the names would alias")
    return pairs


def infer_contract(ctx: InferContext) -> TensorType:
    left, right = ctx.operands
    ctx.accumulation()
    pairs = _pairs(ctx)
    reduced_l = {a for a, _ in pairs}
    reduced_r = {b for _, b in pairs}
    natural = [a for a in left.axes if a not in reduced_l]
    natural += [a for a in right.axes if a not in reduced_r and a not in natural]
    out_axes = ctx.attr_axes("output_axes")
    if sorted(out_axes) != sorted(natural):
        missing = [a for a in natural if a not in out_axes]
        extra = [a for a in out_axes if a not in natural]
        detail = "; ".join(filter(None, [missing and f"missing {missing}", extra and f"not kept {extra}"]))
        ctx.bad_attr("output_axes", f"must be a permutation of the kept axes {natural}, got "
                                    f"{list(out_axes)} ({detail})")
    if "boolean" in (left.dtype, right.dtype):
        ctx.mismatch(f"operands must be numeric, got {left.dtype} and {right.dtype}",
                     0 if left.dtype == "boolean" else 1)
    ctx.require_same_dtype_domain(0, 1)
    for a, b in pairs:
        ctx.require_extent(left.size_of(a), right.size_of(b), f"reduced pair [{a!r}, {b!r}]", 1)
    for a in natural:
        if a in left.axes and a in right.axes:
            ctx.require_extent(left.size_of(a), right.size_of(a), f"batch axis {a!r}", 1)
    sizes = {**dict(zip(right.axes, right.sizes)), **dict(zip(left.axes, left.sizes))}
    return ctx.output(out_axes, [sizes[a] for a in out_axes])


def _kind(v) -> str:
    from runtime.plugins.atomspec import _json_kind

    return _json_kind(v)


# --- reference ---------------------------------------------------------------------------

def _acc(node: Node) -> np.dtype:
    t = node.input_types[0]
    return numpy_dtype(accumulation_dtype(t.dtype, node.attributes["accumulation_dtype"]))


def _ref(node: Node):
    """np.einsum in the accumulation dtype, cast back: the oracle. Subscripts are integer
    labels per axis name (a reduced pair shares its left axis' label)."""
    lt, rt = node.input_types
    pairs = [tuple(p) for p in node.attributes["reduce_axes"]]
    labels: dict[str, int] = {}
    for a in lt.axes:
        labels.setdefault(a, len(labels))
    right_of = {b: a for a, b in pairs}
    for b in rt.axes:
        if b not in right_of:
            labels.setdefault(b, len(labels))
    sub_l = [labels[a] for a in lt.axes]
    sub_r = [labels[right_of.get(b, b)] if b in right_of else labels[b] for b in rt.axes]
    sub_o = [labels[a] for a in node.output_type.axes]
    acc = _acc(node)
    einsum_ok = len(labels) <= 52
    low = _gemm.lower(lt, rt, pairs)
    nb, m, n, k = low.dims
    natural = low.batch + low.m_axes + low.n_axes
    in_place = tuple(node.output_type.axes) == natural  # the output is the product's [nb, m, n]

    def run(inputs: Sequence[np.ndarray], out: np.ndarray) -> None:
        left = np.asarray(inputs[0]).astype(acc, copy=False)
        right = np.asarray(inputs[1]).astype(acc, copy=False)
        if einsum_ok and not (nb == 1 and first_tier()):
            value = np.einsum(left, sub_l, right, sub_r, sub_o)
        else:  # einsum has 52 labels; the same sum as a matmul (BLAS: the first tier's, unbatched)
            a = _gemm.as_batched(left, low.left_order, (nb, m, k))
            b = _gemm.as_batched(right, low.right_order, (nb, k, n))
            if in_place and out.dtype == acc and out.flags.c_contiguous:
                np.matmul(a, b, out=out.reshape(nb, m, n))  # (no temporary as large as the output)
                return
            c = np.matmul(a, b).reshape([low.extents[x] for x in natural])
            value = c.transpose([natural.index(x) for x in node.output_type.axes])
        out[...] = value
    return run


# --- cpu / cuda --------------------------------------------------------------------------

def _lowering(node: Node) -> _gemm.Lowering:
    lt, rt = node.input_types
    return _gemm.lower(lt, rt, [tuple(p) for p in node.attributes["reduce_axes"]])


def cpu_anchor(request: KernelRequest) -> Kernel:
    node = request.node
    whole = _lowering(node.whole).dims if node.whole is not None else None
    return _gemm.cpu_anchor(request, _lowering(node), whole)


def cuda_anchor(request: KernelRequest) -> Kernel:
    return _gemm_cuda.cuda_anchor(request, _lowering(request.node))


def free_contract(node: Node) -> frozenset[str]:
    """The kept axes (batch and either side's own); a name reduced on either side is tied."""
    reduced = {a for pair in node.attributes["reduce_axes"] for a in pair}
    return frozenset(node.output_type.axes) - reduced


def linear_contract(node: Node) -> Linear:
    """Linear in each operand alone; a sum over each reduce pair."""
    return Linear((0, 1), False, tuple(((0, left), (1, right)) for left, right in node.attributes["reduce_axes"]))


SPECS = [
    AtomSpec(name="contract", refs=refs_for("contract"), inputs=("left", "right"),
             dtypes={"left": "numeric", "right": "numeric"},
             attributes=frozenset({"reduce_axes", "output_axes", "accumulation_dtype"}),
             infer=infer_contract,
             kernels={"reference": node_kernel(_ref), "cpu": cpu_anchor, "cuda": cuda_anchor},
             anchors=frozenset({"cpu", "cuda"}), free_axes=free_contract, role="contraction",
             linear=linear_contract,
             summary="sum over reduced axis pairs by name (batched GEMM; anchors epilogues)"),
]
