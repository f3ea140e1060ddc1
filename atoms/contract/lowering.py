"""How a named-axis contraction maps onto a batched GEMM ``[nb, m, k] x [nb, k, n]``: batch
axes, left's kept axes (M), right's kept axes (N), reduced pairs (K). Operands are viewed,
not copied, whenever their strides give each batch a matrix with one unit stride. The output
and the epilogue operands are addressed through per-group offsets (affine strides, or tables
when a group's axes are interleaved), so any output axis order is written in place.
"""
from __future__ import annotations

import math
from collections.abc import Sequence

import attrs
import numpy as np

from runtime.core.types import TensorType
from runtime.toolkit import Epilogue, KERNEL_DTYPES, c_strides, no_kernel
from runtime.plugins.atomspec import Node

_NUMBA_FLOATS = {"float32": "float32", "float64": "float64"}


@attrs.frozen
class Lowering:
    """How a contract node maps onto ``[nb, m, k] x [nb, k, n] -> [nb, m, n]``."""

    batch: tuple[str, ...]
    m_axes: tuple[str, ...]
    n_axes: tuple[str, ...]
    k_left: tuple[str, ...]
    k_right: tuple[str, ...]
    extents: dict  # axis name -> extent (left's names for reduced pairs)
    left_order: tuple[int, ...]  # left axes permuted to (batch, M, K)
    right_order: tuple[int, ...]  # right axes permuted to (batch, K, N)

    def size(self, axes: Sequence[str]) -> int:
        return math.prod(self.extents[a] for a in axes)

    @property
    def dims(self) -> tuple[int, int, int, int]:
        return (self.size(self.batch), self.size(self.m_axes), self.size(self.n_axes),
                self.size(self.k_left))


def lower(left: TensorType, right: TensorType, pairs: Sequence[Sequence[str]]) -> Lowering:
    k_left = tuple(p[0] for p in pairs)
    k_right = tuple(p[1] for p in pairs)
    batch = tuple(a for a in left.axes if a in right.axes and a not in k_left and a not in k_right)
    m_axes = tuple(a for a in left.axes if a not in k_left and a not in batch)
    n_axes = tuple(a for a in right.axes if a not in k_right and a not in batch)
    extents = dict(zip(right.axes, right.sizes))
    extents.update(zip(left.axes, left.sizes))
    left_order = tuple(left.axes.index(a) for a in batch + m_axes + k_left)
    right_order = tuple(right.axes.index(a) for a in batch + k_right + n_axes)
    return Lowering(batch, m_axes, n_axes, k_left, k_right, extents, left_order, right_order)


def batched_view(order: Sequence[int], shape3: tuple[int, int, int], copy: bool | None = None):
    """:func:`as_batched` with ``order`` and ``shape3`` fixed, for the per-run path
    (``copy=False``: never a copy, ValueError instead)."""
    order = tuple(order)
    if copy is not None:  # (NumPy >= 2.1; older ones raise TypeError)
        return lambda x: x.transpose(order).reshape(shape3, copy=copy)
    if order == tuple(range(len(order))):
        return lambda x: x.reshape(shape3)
    return lambda x: x.transpose(order).reshape(shape3)


def as_batched(x: np.ndarray, order: Sequence[int], shape3: tuple[int, int, int]) -> np.ndarray:
    """``x`` transposed and reshaped to ``shape3``: a view whenever NumPy can make one."""
    return np.asarray(x).transpose(order).reshape(shape3)


def group_offsets(axes: Sequence[str], group: Sequence[str], shape: Sequence[int],
                  strides: Sequence[int]) -> np.ndarray:
    """Element offsets of every C-order index of the axes ``group`` in an array with ``axes``."""
    pos = {a: i for i, a in enumerate(axes)}
    offs = np.zeros(1, np.int64)
    for a in group:
        i = pos.get(a)
        ext, st = (shape[i], strides[i]) if i is not None else (1, 0)
        offs = (offs[:, None] + np.arange(ext, dtype=np.int64)[None, :] * st).reshape(-1)
    return offs


@attrs.frozen
class Addressing:
    """Offsets of (batch, M, N) groups in one flat array: kinds, strides and tables."""

    kinds: tuple[str, str, str]
    strides: tuple[int, int, int]
    tables: tuple[np.ndarray | None, np.ndarray | None, np.ndarray | None]


def group_kind(axes: Sequence[str], group: Sequence[str], shape: Sequence[int],
               strides: Sequence[int]) -> tuple[str, int]:
    """The cheapest way to address :func:`group_offsets`, ``('zero'|'unit'|'affine'|'table',
    step)``, worked out from the extents and strides alone (no offsets made: a plan at a new
    extent builds its addressing in time independent of the extents). The offsets are
    ``arange(n) * step`` exactly when each axis of the group (extent 1 aside) steps over the
    whole of the axes after it."""
    pos = {a: i for i, a in enumerate(axes)}
    dims = [(shape[pos[a]], strides[pos[a]]) for a in group if a in pos and shape[pos[a]] != 1]
    if not dims or not any(st for _, st in dims):
        return "zero", 0
    step = dims[-1][1]
    for (_, outer), (ext, inner) in zip(dims, dims[1:]):
        if outer != inner * ext:
            return "table", 0
    if step == 0:  # (a broadcast fastest axis under a strided one: offsets repeat)
        return "table", 0
    return ("unit" if step == 1 else "affine"), step


def addressing(axes: Sequence[str], shape: Sequence[int], strides: Sequence[int],
               low: Lowering) -> Addressing:
    kinds, steps, tables = [], [], []
    for group in (low.batch, low.m_axes, low.n_axes):
        kind, step = group_kind(axes, group, shape, strides)
        kinds.append(kind)
        steps.append(step)
        tables.append(group_offsets(axes, group, shape, strides) if kind == "table" else None)
    return Addressing(tuple(kinds), tuple(steps), tuple(tables))


_GENERALITY = {"zero": 0, "unit": 1, "affine": 2, "table": 3}


def stable_addressing(axes: Sequence[str], shape: Sequence[int], strides: Sequence[int],
                      probe_shape: Sequence[int], probe_strides: Sequence[int], low: Lowering) -> Addressing:
    """``addressing`` whose kinds do not depend on an axis having extent 1: the kinds are the
    more general of the real ones and those at ``probe_shape`` (every extent 1 made 2), so a
    symbolic axis bound to 1 (one token) uses the kernel of every other extent. Steps and
    tables stay the real ones (a group of one element is only ever read at offset 0)."""
    kinds, steps, tables = [], [], []
    for group in (low.batch, low.m_axes, low.n_axes):
        real, step = group_kind(axes, group, shape, strides)
        probe, _ = group_kind(axes, group, probe_shape, probe_strides)
        kind = max(real, probe, key=_GENERALITY.get)  # (unit only when the real kind is: step 1)
        kinds.append(kind)
        steps.append(step if real in ("unit", "affine") else 0)
        tables.append(group_offsets(axes, group, shape, strides) if kind == "table" else None)
    return Addressing(tuple(kinds), tuple(steps), tuple(tables))


def out_addressing(out_type: TensorType, low: Lowering) -> Addressing:
    shape = out_type.shape
    probe = [2 if e == 1 else e for e in shape]
    return stable_addressing(out_type.axes, shape, c_strides(shape), probe, c_strides(probe), low)


def keepdims_addressing(t: TensorType, out_type: TensorType, low: Lowering) -> Addressing:
    """Addressing of an epilogue operand compacted to out's rank (extent 1 where broadcast)."""
    probe = [2 if e == 1 else e for e in out_type.shape]
    return stable_addressing(out_type.axes, out_type.shape, keepdims_strides(t, out_type),
                             probe, keepdims_strides(t, out_type, probe=True), low)


def keepdims_strides(t: TensorType, out_type: TensorType, probe: bool = False) -> list[int]:
    """Element strides, per axis of out, of ``t`` in keepdims form (0 where broadcast).
    ``probe``: for an out shape whose extents 1 are made 2, where ``t`` has that axis of
    extent 1 too (present, not broadcast)."""
    present = dict(zip(t.axes, t.sizes))
    shape = []
    for a, oe in zip(out_type.axes, out_type.shape):
        e = present.get(a, 1)
        shape.append(2 if probe and a in present and e == 1 and oe == 1 else e)
    return [0 if e == 1 else s for e, s in zip(shape, c_strides(shape))]


def numba_float(dtype: str, node, backend: str) -> str:
    try:
        return _NUMBA_FLOATS[dtype]
    except KeyError:
        raise no_kernel("contract", backend, dtype, node.path) from None


def anchor_dtype(node, epilogue: Epilogue, backend: str) -> str:
    """The numba float type of an anchor's operands, once its epilogue operands are known to
    be of dtypes the generated kernels handle (``backend_unavailable`` otherwise)."""
    for t in epilogue.extra_types:
        if t.dtype not in KERNEL_DTYPES:
            raise no_kernel("contract epilogue", backend, t.dtype, node.path)
    return numba_float(node.input_types[0].dtype, node, backend)



def node_lowering(node: Node) -> Lowering:
    """The lowering of a contract node, from its operand types and ``reduce_axes``."""
    lt, rt = node.input_types
    return lower(lt, rt, [tuple(p) for p in node.attributes["reduce_axes"]])


def keepdims_flattener(t: TensorType, out_type: TensorType):
    """A function giving an epilogue operand as the flat C-order array of its keepdims form.
    Takes keepdims form (the executor's) or a full broadcast view of out's shape, whose
    broadcast axes are cut to extent 1 first, so stride-0 views are never copied."""
    present = dict(zip(t.axes, t.sizes))
    keep = [a in present and present[a] != 1 for a in out_type.axes]
    keep_shape = tuple(e if k else 1 for e, k in zip(out_type.shape, keep))
    cut = tuple(slice(None) if k else slice(0, 1) for k in keep)

    def flat(x: np.ndarray) -> np.ndarray:
        if x.shape != keep_shape:
            x = x[cut]
        if not x.flags.c_contiguous:
            x = np.ascontiguousarray(x)
        return x.reshape(-1)
    return flat
