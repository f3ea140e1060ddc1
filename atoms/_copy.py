"""CPU kernels that move raw bits for the layout and indexing families.

Two copies, each over an iteration space whose last axis is a row: the strided copy
``dst[Σ i·dstr] = src[Σ i·sstr]`` (layout atoms) and the index-driven one, which displaces
the source or the destination by ``v·ax`` for an index ``v`` read from ``idx`` (gather,
lookup, scatter). A call is cut into tasks of consecutive rows; a task finds its first row's
offsets by division once and then steps from row to row like an odometer (the kernel
before it divided by every axis's extent for every row). A unit-stride row is one ``memcpy``.

Each comes as serial and parallel twins (``runtime.kernels.twins``), two distinct functions:
Numba's disk cache tells functions apart by name and line, not by their ``parallel`` flag, so
one function compiled both ways would load one variant's machine code for the other. Each
twin has one module-level dispatcher per item size (elements move as uint8/16/32/64),
compiled on first use for its one signature (:func:`kernel`).
"""
from __future__ import annotations

import threading
from collections.abc import Callable

import numpy as np
from numba import njit, prange, types

from runtime.core import settings
from runtime.toolkit import Twins

# Below this many elements a copy runs on one thread (waking the other costs more than it
# saves); above it, ROW_TASKS_PER_THREAD tasks per thread.
PARALLEL_MIN_ELEMENTS = settings.COPY_PARALLEL_MIN.read()  # FORMULA_COPY_PARALLEL_MIN
ROW_TASKS_PER_THREAD = 4


_OPTIONS = dict(cache=True, nogil=True)


@njit(inline="always", nogil=True)
def copy_row(src, s, dst, d, n):
    """``dst[d:d+n] = src[s:s+n]`` for non-negative offsets. Unsigned indices skip Numba's
    negative-index wraparound, so LLVM makes it a memcpy (4x faster than signed ones here)."""
    us, ud = np.uint64(s), np.uint64(d)
    for j in range(np.uint64(n)):
        dst[ud + j] = src[us + j]


@njit(**_OPTIONS)
def _rows(shape) -> int:
    rows = 1
    for k in range(shape.shape[0] - 1):
        rows *= shape[k]
    return rows


@njit(**_OPTIONS)
def _strided_rows(src, soff, sstr, dst, doff, dstr, shape, mask, r0, r1):
    """Rows ``[r0, r1)`` of the strided copy. With a non-zero ``mask`` (a float type's
    exponent bits) it also counts the rows holding a value whose exponent bits are all set:
    NaN or ±inf."""
    rank = shape.shape[0]
    inner, si, di = shape[rank - 1], sstr[rank - 1], dstr[rank - 1]
    at = np.zeros(rank, np.int64)  # the row's index (all axes but the last)
    s, d, rem = soff, doff, r0
    for k in range(rank - 2, -1, -1):
        q = rem // shape[k]
        at[k] = rem - q * shape[k]
        rem = q
        s += at[k] * sstr[k]
        d += at[k] * dstr[k]
    bad = 0
    for _ in range(r0, r1):
        if mask != 0:
            found = False
            if si == 1 and di == 1:
                us, ud = np.uint64(s), np.uint64(d)
                for j in range(np.uint64(inner)):
                    v = src[us + j]
                    dst[ud + j] = v
                    found |= (v & mask) == mask
            else:
                for j in range(inner):
                    v = src[s + j * si]
                    dst[d + j * di] = v
                    found |= (v & mask) == mask
            bad += found
        elif si == 1 and di == 1:
            copy_row(src, s, dst, d, inner)
        else:
            for j in range(inner):
                dst[d + j * di] = src[s + j * si]
        k = rank - 2
        while k >= 0:  # the next row
            at[k] += 1
            s += sstr[k]
            d += dstr[k]
            if at[k] < shape[k]:
                break
            at[k] = 0
            s -= shape[k] * sstr[k]
            d -= shape[k] * dstr[k]
            k -= 1
    return bad


@njit(**_OPTIONS)
def _indexed_rows(src, soff, sstr, sax, idx, ioff, istr, bound, dst, doff, dstr, dax, shape, r0, r1):
    """Rows ``[r0, r1)`` of the index-driven copy; returns how many indices were out of range
    (those elements are skipped). When the index is constant along the row (lookup or gather
    of rows) it is read and checked once per row."""
    rank = shape.shape[0]
    inner, si, ii, di = shape[rank - 1], sstr[rank - 1], istr[rank - 1], dstr[rank - 1]
    at = np.zeros(rank, np.int64)
    s, x, d, rem = soff, ioff, doff, r0
    for k in range(rank - 2, -1, -1):
        q = rem // shape[k]
        at[k] = rem - q * shape[k]
        rem = q
        s += at[k] * sstr[k]
        x += at[k] * istr[k]
        d += at[k] * dstr[k]
    bad = 0
    for _ in range(r0, r1):
        if ii == 0:
            v = idx[x]
            if v < 0 or v >= bound:
                bad += inner
            elif si == 1 and di == 1:
                copy_row(src, s + v * sax, dst, d + v * dax, inner)
            else:
                for j in range(inner):
                    dst[d + v * dax + j * di] = src[s + v * sax + j * si]
        else:
            for j in range(inner):
                v = idx[x + j * ii]
                if v < 0 or v >= bound:
                    bad += 1
                else:
                    dst[d + j * di + v * dax] = src[s + j * si + v * sax]
        k = rank - 2
        while k >= 0:
            at[k] += 1
            s += sstr[k]
            x += istr[k]
            d += dstr[k]
            if at[k] < shape[k]:
                break
            at[k] = 0
            s -= shape[k] * sstr[k]
            x -= shape[k] * istr[k]
            d -= shape[k] * dstr[k]
            k -= 1
    return bad


def _strided_serial(src, soff, sstr, dst, doff, dstr, shape, mask, ntask):
    return _strided_rows(src, soff, sstr, dst, doff, dstr, shape, mask, 0, _rows(shape))


def _strided_parallel(src, soff, sstr, dst, doff, dstr, shape, mask, ntask):
    rows = _rows(shape)
    bad = np.zeros(ntask, np.int64)
    for w in prange(ntask):
        t = np.int64(w)  # (a prange index may be unsigned)
        bad[t] = _strided_rows(src, soff, sstr, dst, doff, dstr, shape, mask,
                               t * rows // ntask, (t + 1) * rows // ntask)
    return bad.sum()


def _indexed_serial(src, soff, sstr, sax, idx, ioff, istr, bound, dst, doff, dstr, dax, shape, ntask):
    return _indexed_rows(src, soff, sstr, sax, idx, ioff, istr, bound, dst, doff, dstr, dax, shape,
                         0, _rows(shape))


def _indexed_parallel(src, soff, sstr, sax, idx, ioff, istr, bound, dst, doff, dstr, dax, shape, ntask):
    rows = _rows(shape)
    bad = np.zeros(ntask, np.int64)
    for w in prange(ntask):
        t = np.int64(w)
        bad[t] = _indexed_rows(src, soff, sstr, sax, idx, ioff, istr, bound, dst, doff, dstr, dax, shape,
                               t * rows // ntask, (t + 1) * rows // ntask)
    return bad.sum()


ITEM_SIZES = (1, 2, 4, 8)


def _per_item_size(fn, parallel: bool) -> tuple:
    """One lazy dispatcher of ``fn`` per item size in ``ITEM_SIZES`` (compiled by :func:`kernel`)."""
    return tuple(njit(parallel=parallel, **_OPTIONS)(fn) for _ in ITEM_SIZES)


# module globals, so that compiled callers import them by name (runtime.execution.driver)
strided_serial_u8, strided_serial_u16, strided_serial_u32, strided_serial_u64 = \
    STRIDED_SERIAL = _per_item_size(_strided_serial, False)
strided_parallel_u8, strided_parallel_u16, strided_parallel_u32, strided_parallel_u64 = \
    STRIDED_PARALLEL = _per_item_size(_strided_parallel, True)
indexed_serial_u8, indexed_serial_u16, indexed_serial_u32, indexed_serial_u64 = \
    INDEXED_SERIAL = _per_item_size(_indexed_serial, False)
indexed_parallel_u8, indexed_parallel_u16, indexed_parallel_u32, indexed_parallel_u64 = \
    INDEXED_PARALLEL = _per_item_size(_indexed_parallel, True)
TWINS = {**{("strided", n): Twins(s, p) for n, s, p in zip(ITEM_SIZES, STRIDED_SERIAL, STRIDED_PARALLEL)},
         **{("indexed", n): Twins(s, p) for n, s, p in zip(ITEM_SIZES, INDEXED_SERIAL, INDEXED_PARALLEL)}}
_BITS = {1: types.uint8, 2: types.uint16, 4: types.uint32, 8: types.uint64}
_ready: set[tuple[str, int, bool]] = set()
_compiling = threading.Lock()


def _signature(kind: str, itemsize: int):
    bits = _BITS[itemsize]
    i64, n = types.Array(types.int64, 1, "C"), types.int64
    source = types.Array(bits, 1, "C", readonly=True, aligned=False)
    target = types.Array(bits, 1, "C", aligned=False)
    if kind == "strided":
        return types.int64(source, n, i64, target, n, i64, i64, bits, n)
    indices = types.Array(types.int64, 1, "C", readonly=True, aligned=False)
    return types.int64(source, n, i64, n, indices, n, i64, n, target, n, i64, n, i64, n)


def kernel(kind: str, itemsize: int, parallel: bool) -> Callable:
    """The ``"strided"`` or ``"indexed"`` copy for one item size; its last argument is the
    number of tasks (see :func:`tasks`). The strided copy takes an exponent ``mask`` before it
    (:func:`exponent_mask`, or 0) and returns how many of its rows held a NaN or ±inf."""
    found = TWINS[kind, itemsize].pick(parallel)
    key = (kind, itemsize, parallel)
    if key not in _ready:
        with _compiling:  # (a second thread must not find compilation disabled mid-way)
            if key not in _ready:
                found.compile(_signature(kind, itemsize))
                # its one signature: a call converts its arrays to it (writable or not, aligned or not)
                found.disable_compile()
                _ready.add(key)
    return found


def warm(kind: str, itemsize: int) -> None:
    """Build both variants of a copy (``Kernel.warm``): extents choose between them per call."""
    kernel(kind, itemsize, False)
    kernel(kind, itemsize, True)


EXPONENT_BITS = {"float16": 0x7C00, "bfloat16": 0x7F80, "float32": 0x7F800000, "float64": 0x7FF0000000000000}


def exponent_mask(dtype: str, itemsize: int):
    """The bits of ``dtype``'s exponent as the copy's unsigned item type (NaN and ±inf are
    the values with all of them set); 0 for a dtype that is not a float."""
    return np.dtype(f"uint{8 * itemsize}").type(EXPONENT_BITS.get(dtype, 0))


def tasks(shape, elements: int) -> tuple[bool, int]:
    """(parallel, number of tasks) for a copy of ``elements`` over ``shape`` (its last axis
    the row)."""
    rows = 1
    for n in shape[:-1]:
        rows *= n
    if elements < PARALLEL_MIN_ELEMENTS or rows < 2:
        return False, 1
    import numba

    return True, min(rows, numba.get_num_threads() * ROW_TASKS_PER_THREAD)
