"""Rows along one axis, for kernels that work a whole axis at a time (scatter@2, segment, window).

A row is one coordinate of every other axis of an iteration space; each operand is described
by its element strides over those other axes (0 where it lacks an axis or broadcasts it) and
its stride along the row's axis. Kernels find a row's offsets by division, so one compiled
kernel serves every rank, and rows are independent units of parallel work.
"""
from __future__ import annotations

import math
from collections.abc import Sequence

import attrs
import numpy as np
from numba import njit

from runtime.core import settings
from runtime.core.types import TensorType

# Below this many elements a row kernel runs serially (a parallel launch costs more).
PARALLEL_MIN_ELEMENTS = settings.ROWS_PARALLEL_MIN.read()  # FORMULA_ROWS_PARALLEL_MIN


@attrs.frozen
class Rows:
    """``shape``: extents of the row axes; ``strides[k]``: operand k's strides over them."""

    shape: np.ndarray  # int64[rank - 1]
    strides: np.ndarray  # int64[operands, rank - 1]

    @property
    def count(self) -> int:
        return int(math.prod(int(n) for n in self.shape))


def strides_by_name(axes: Sequence[str], t: TensorType, strides: Sequence[int]) -> list[int]:
    """``t``'s element strides over ``axes`` (0 where ``t`` lacks the axis or has extent 1)."""
    own = {a: (s if n > 1 else 0) for a, n, s in zip(t.axes, t.shape, strides)}
    return [own.get(a, 0) for a in axes]


def rows(space: TensorType, axis: str, members: Sequence[tuple[TensorType, Sequence[str], Sequence[int]]]) -> Rows:
    """Rows of ``space`` along ``axis``; a member is (its type, its axis names for the row axes
    of ``space``, in order, its element strides)."""
    others = [(a, n) for a, n in zip(space.axes, space.shape) if a != axis]
    shape = np.array([n for _, n in others], dtype=np.int64)
    st = np.array([strides_by_name(names, t, s) for t, names, s in members], dtype=np.int64)
    return Rows(shape, st.reshape(len(members), len(others)))


def along(t: TensorType, axis: str, strides: Sequence[int]) -> int:
    """``t``'s stride along ``axis`` (0 if it lacks it or broadcasts it)."""
    return strides_by_name([axis], t, strides)[0]


@njit(nogil=True, cache=True)
def row_offsets(r, shape, strides, base):
    """Every operand's offset of row ``r`` (``base``: their offsets of row 0). Not inlined:
    inlined into a prange body, the division loop reads as an overwrite of the loop index."""
    off = base.copy()
    rem = r
    for d in range(shape.shape[0] - 1, -1, -1):
        q = rem // shape[d]
        i = rem - q * shape[d]
        rem = q
        for k in range(strides.shape[0]):
            off[k] += i * strides[k, d]
    return off


def parallel_rows(count: int, elements: int) -> bool:
    return count > 1 and elements >= PARALLEL_MIN_ELEMENTS


def threads() -> int:
    import numba

    return numba.get_num_threads()
