"""CPU half conversions (imported only by CPU plans) over integer views: serial and parallel
twins for C-contiguous 1-D views, a strided kernel for any layout, element by element, each
running runtime.kernels.halfconv's scalar conversion."""
from __future__ import annotations

import numpy as np
from numba import njit, prange

from runtime.kernels.halfconv import BF16_TO_F32, F16_TO_F32, _views, scalar_conversion
from runtime.kernels.twins import Twins

PARALLEL_MIN = 1 << 16  # elements: below this one thread is cheaper than waking the others

_one = scalar_conversion(njit(inline="always", cache=True))


@njit(cache=True)
def convert_serial(src, dst, kind):
    for i in range(src.size):
        dst[i] = _one(src[i], kind)


@njit(cache=True, parallel=True)
def convert_parallel(src, dst, kind):
    for i in prange(src.size):
        dst[i] = _one(src[i], kind)


@njit(cache=True)
def convert_strided(src, dst, kind):
    for idx in np.ndindex(src.shape):
        dst[idx] = _one(src[idx], kind)


CONVERT = Twins(convert_serial, convert_parallel)


def warm_host(kind: int) -> None:
    """Compile (or load) the serial and the parallel conversion of ``kind`` for contiguous
    operands, which a call picks by size: a later extent then compiles nothing."""
    widen = kind in (F16_TO_F32, BF16_TO_F32)
    src = np.zeros(1, np.uint16 if widen else np.uint32)
    dst = np.zeros(1, np.uint32 if widen else np.uint16)
    CONVERT.serial(src, dst, kind)
    CONVERT.parallel(src, dst, kind)


def convert_host(src: np.ndarray, dst: np.ndarray, kind: int) -> None:
    """Widen or narrow ``src`` into ``dst`` (same shape) on the CPU."""
    s, d = _views(src, dst, kind)
    if s.flags.c_contiguous and d.flags.c_contiguous:
        CONVERT.pick(s.size >= PARALLEL_MIN)(s.reshape(-1), d.reshape(-1), kind)
    else:
        convert_strided(s, d, kind)
