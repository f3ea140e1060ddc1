"""The reduce atom (SPEC §3): sum over one axis, which is removed.

The order of summation is part of the contract: every backend accumulates sequentially in
index order, starting from element 0 (not pairwise, not in parallel along the axis), so the
result is deterministic and the backends agree up to the rounding of the same additions.
"""
from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from runtime.atomspec import AtomSpec, InferContext, Node
from runtime.errors import fail
from runtime.types import TensorType, accumulation_dtype, numpy_dtype

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


def _cpu(node: Node):
    from runtime.backends import cpu_codegen as cg

    _check_device(node, "cpu")
    position, rank, lead = _layout(node)
    dt = cg.numba_type(node.input_types[0].dtype, node.path, "reduce")
    space = [k for k in range(rank) if k != position]
    dims = [f"v.shape[{k}]" for k in space]
    body = _body(position, len(space), lambda k: f"_u({k})")
    args = [("v", dt, rank, False), ("out", dt, rank - 1, True)]
    label = f"reduce sum axis {position} of rank {rank} {dt}"
    kernel = cg.NestKernel("reduce", lambda par: cg.render(label, args, cg.loop_nest(dims, body, par), par))
    shape = node.input_types[0].shape
    space_shape = tuple(((1,) + shape)[k] if lead else shape[k] for k in space)

    def run(inputs: Sequence[np.ndarray], out: np.ndarray) -> None:
        v = cg.contiguous(inputs[0])
        if lead:
            v, o = v.reshape((1,) + shape), out.reshape((1,))
        else:
            o = out
        kernel([v, o], space_shape)
    return run


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


SPECS = [
    AtomSpec(name="reduce", refs=refs_for("reduce"), inputs=("value",),
             attributes=frozenset({"axis", "mode", "accumulation_dtype"}), infer=infer_reduce,
             kernels={"reference": _reference, "cpu": _cpu, "cuda": _cuda},
             summary="sum over one axis in index order (deterministic); the axis is removed"),
]
