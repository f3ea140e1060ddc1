"""The contract atom's type inference: every rule of the atom (SPEC §3), each failure with the
path of the offending attribute element."""
from __future__ import annotations

from runtime.core.types import TensorType
from runtime.plugins.atomspec import InferContext

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
    from runtime.core.errors import json_kind

    return json_kind(v)
