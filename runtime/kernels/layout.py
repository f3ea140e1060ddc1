"""Aligning an operand with another type's axes by name: a view, never a copy."""
from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from runtime.core.types import TensorType


def align_to(value, value_type: TensorType, target: TensorType, xp=np):
    """View ``value`` (axes of ``value_type``) with ``target``'s axes and shape.

    Axes the value lacks, or has with extent 1, are broadcast (stride 0). Raises ValueError
    when an axis of the value is missing from the target or extents are incompatible.
    """
    order, keep_shape = keepdims_order(value_type, target, value.shape)
    moved = value.transpose(order) if value_type.rank > 1 else value
    return np.broadcast_to(moved.reshape(keep_shape), target.shape)


def c_strides(shape) -> list[int]:
    """Element strides of a C-contiguous array of ``shape``."""
    strides, step = [], 1
    for n in reversed(shape):
        strides.append(step)
        step *= n
    return strides[::-1]


def span_view(x: np.ndarray) -> np.ndarray:
    """A read-only 1-D view of the memory ``x`` spans, from its first element (``x``: a
    non-empty array whose strides are non-negative multiples of its item size). A C-contiguous
    array takes a plain reshape, a fraction of ``as_strided``'s cost on every kernel launch."""
    if x.flags.c_contiguous:
        view = x.reshape(-1).view()
    else:
        span = 1 + sum((n - 1) * s for n, s in zip(x.shape, x.strides)) // x.itemsize
        view = np.lib.stride_tricks.as_strided(x, shape=(span,), strides=(x.itemsize,))
    view.flags.writeable = False
    return view


def keepdims_order(value_type: TensorType, target: TensorType,
                   shape: tuple[int, ...] | None = None) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """(axis permutation, shape) that put a value of ``value_type`` (extents ``shape``, by
    default the type's) in the *keepdims form* of ``target``: target's rank and axis order,
    extent 1 where the value is broadcast."""
    missing = [a for a in value_type.axes if a not in target.axes]
    if missing:
        raise ValueError(f"axes {missing} are not in the target type {target}")
    order = tuple(sorted(range(value_type.rank), key=lambda i: target.axes.index(value_type.axes[i])))
    present = dict(zip(value_type.axes, value_type.shape if shape is None else shape))
    return order, tuple(present.get(a, 1) for a in target.axes)


def keepdims_is_reshape(value_type: TensorType, target: TensorType) -> bool:
    """Whether the keepdims form of ``target`` is a reshape of a C-order ``value_type`` value
    (its axes in target's order): then its flat buffer, reshaped, is that form."""
    order, _ = keepdims_order(value_type, target)
    return order == tuple(sorted(order))


def keepdims_aligner(value_type: TensorType, target: TensorType) -> Callable[[Any], Any]:
    """A function viewing a value in the keepdims form of ``target``; the permutation and
    shape are worked out once, since kernels run this for every operand of every run."""
    order, shape = keepdims_order(value_type, target)
    if order == tuple(sorted(order)):
        return lambda value: value if value.shape == shape else value.reshape(shape)
    return lambda value: value.transpose(order).reshape(shape)
