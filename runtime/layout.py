"""Aligning an operand with another type's axes by name: a view, never a copy."""
from __future__ import annotations

import numpy as np

from .types import TensorType


def align_to(value, value_type: TensorType, target: TensorType, xp=np):
    """View ``value`` (axes of ``value_type``) with ``target``'s axes and shape.

    Axes the value lacks, or has with extent 1, are broadcast (stride 0). Raises ValueError
    when an axis of the value is missing from the target or extents are incompatible.
    """
    missing = [a for a in value_type.axes if a not in target.axes]
    if missing:
        raise ValueError(f"axes {missing} are not in the target type {target}")
    order = sorted(range(value_type.rank), key=lambda i: target.axes.index(value_type.axes[i]))
    moved = value.transpose(order) if value_type.rank > 1 else value
    present = {value_type.axes[i]: value.shape[i] for i in range(value_type.rank)}
    keep_shape = tuple(present.get(a, 1) for a in target.axes)
    return np.broadcast_to(moved.reshape(keep_shape), target.shape)
