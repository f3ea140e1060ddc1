"""BLAS from njit code for the contract kernels: scipy's gemm/gemv as external functions
(named symbols, so kernels hold no dynamic globals and cache to disk), operand layouts, and
the single-threaded-BLAS guard.

CPU threading (see PERFORMANCE-FACTS "the trap"): the kernels run BLAS *inside* ``prange``,
one row tile per call, so BLAS itself must stay on the calling thread. scipy's OpenBLAS (a
pthreads build) has only a process-wide thread count (``openblas_set_num_threads_local`` is
global there too), so :class:`SingleThreadedBlas` switches it to 1 for exactly the duration
of our calls (reference-counted across concurrent runs) and restores the caller's setting:
OpenBLAS' pool is then never woken under Numba's threads.
"""
from __future__ import annotations

import ctypes
import functools
import threading

import numpy as np

_blas_ready = False


def register_blas() -> None:
    """Make scipy's BLAS gemm and OpenBLAS' per-thread thread count callable by name from
    njit code (ExternalFunction), so the kernels hold no dynamic globals and cache to disk."""
    global _blas_ready
    if _blas_ready:
        return
    import llvmlite.binding as ll
    from numba.extending import get_cython_function_address

    for name in ("sgemm", "dgemm", "sgemv", "dgemv"):
        ll.add_symbol(f"formula_contract_{name}",
                      get_cython_function_address("scipy.linalg.cython_blas", name))
    _blas_ready = True


class SingleThreadedBlas:
    """Context manager: scipy's OpenBLAS runs on one thread while any of our kernels is
    inside; the first entrant saves the caller's setting, the last one restores it. A no-op
    when that BLAS has no ``openblas_set_num_threads_local`` (not OpenBLAS, or too old)."""

    def __init__(self):
        self._lock = threading.Lock()
        self._depth = 0
        self._saved = 0
        self._set = _find_openblas_setter()

    def __enter__(self):
        if self._set is not None:
            with self._lock:
                if self._depth == 0:
                    self._saved = self._set(1)
                self._depth += 1
        return self

    def __exit__(self, *exc):
        if self._set is not None:
            with self._lock:
                self._depth -= 1
                if self._depth == 0 and self._saved > 1:
                    self._set(self._saved)
        return False


def _find_openblas_setter():
    """``openblas_set_num_threads_local`` (sets, returns the previous count) of the library
    behind scipy's cython_blas, found through the address of its sgemm."""
    from numba.extending import get_cython_function_address

    class DlInfo(ctypes.Structure):
        _fields_ = [("fname", ctypes.c_char_p), ("fbase", ctypes.c_void_p),
                    ("sname", ctypes.c_char_p), ("saddr", ctypes.c_void_p)]
    try:
        addr = get_cython_function_address("scipy.linalg.cython_blas", "sgemm")
        info = DlInfo()
        if not ctypes.CDLL(None).dladdr(ctypes.c_void_p(addr), ctypes.byref(info)):
            return None
        fn = getattr(ctypes.CDLL(info.fname.decode()), "openblas_set_num_threads_local", None)
    except (OSError, AttributeError, ValueError):
        return None
    if fn is not None:
        fn.restype, fn.argtypes = ctypes.c_int, [ctypes.c_int]
    return fn


_single_blas: SingleThreadedBlas | None = None


def single_threaded_blas() -> SingleThreadedBlas:
    global _single_blas
    if _single_blas is None:
        _single_blas = SingleThreadedBlas()
    return _single_blas


@functools.lru_cache(maxsize=512)
def blas_layout(shape: tuple[int, int, int], strides: tuple[int, ...], item: int) -> tuple[int, int, int] | None:
    """(trans, ld, batch stride) making every batch of an ``[nb, r, c]`` operand a BLAS
    matrix: trans=0 for a unit column stride (row-major, ld = row stride), 1 for a unit row
    stride (ld = column stride); None when neither holds (or strides are not whole elements).
    Strides in, and results out, in elements."""
    nb, r, c = shape
    sb, sr, sc = strides
    if sb % item or sr % item or sc % item:
        return None
    sb, sr, sc = sb // item, sr // item, sc // item
    sb = sb if nb > 1 else 0
    if (c == 1 or sc == 1) and (r == 1 or sr >= c):
        return 0, (sr if r > 1 else c), sb
    if (r == 1 or sr == 1) and (c == 1 or sc >= r):
        return 1, (sc if c > 1 else r), sb
    return None


def blas_operand(x3: np.ndarray) -> tuple[np.ndarray, tuple[int, int, int]]:
    """``x3`` (copied only when no BLAS layout fits) and its :func:`blas_layout`."""
    layout = blas_layout(x3.shape, x3.strides, x3.itemsize) if x3.flags.aligned else None
    if layout is None:
        x3 = np.ascontiguousarray(x3)
        nb, r, c = x3.shape
        layout = (0, c, r * c)
    return x3, layout


def flat_operand(x3: np.ndarray) -> tuple[np.ndarray, bool, bool]:
    """(flat, c_order, whole): ``x3``'s memory as a 1-D array from its first element, for a
    kernel that takes BLAS's address from it. ``whole``: it holds the whole operand (in memory
    order; C order when ``c_order``), which a contiguous operand allows; else it is a
    one-element view, good for the address only."""
    flags = x3.flags
    if flags.c_contiguous or flags.f_contiguous:
        return x3.ravel(order="K"), flags.c_contiguous, True
    return np.lib.stride_tricks.as_strided(x3, shape=(1,), strides=(x3.itemsize,)), False, False


def c_contiguous_layout(shape: tuple[int, ...], view, dtype):
    """What :func:`blas_operand` and :func:`flat_operand` give for ``view`` of a C-contiguous,
    aligned array of ``shape``, worked out without memory: ((trans, ld, batch stride), c_order,
    whole), or None when the view would copy or no BLAS layout fits (compiled code, which
    passes the array itself flat, cannot do either)."""
    item = np.dtype(dtype).itemsize
    strides = [item] * len(shape)
    for i in range(len(shape) - 2, -1, -1):
        strides[i] = strides[i + 1] * shape[i + 1]
    probe = np.lib.stride_tricks.as_strided(np.zeros(1, dtype), shape=shape, strides=strides,
                                            writeable=False)  # strides only: never read
    try:
        x3 = view(probe)
    except (ValueError, TypeError):  # would copy (or NumPy < 2.1: no copy=False)
        return None
    layout = blas_layout(x3.shape, x3.strides, item)
    if layout is None:
        return None
    flags = x3.flags
    return layout, flags.c_contiguous, flags.c_contiguous or flags.f_contiguous


def _declare_externals():
    from numba import types

    i64 = types.int64
    gemm = types.void(*([i64] * 13))
    gemv = types.void(*([i64] * 11))
    return (types.ExternalFunction("formula_contract_sgemm", gemm),
            types.ExternalFunction("formula_contract_dgemm", gemm),
            types.ExternalFunction("formula_contract_sgemv", gemv),
            types.ExternalFunction("formula_contract_dgemv", gemv))


ext_sgemm, ext_dgemm, ext_sgemv, ext_dgemv = _declare_externals()
