"""CUDA half conversions (imported only by CUDA plans): one thread per element, grid-stride.

A module of its own so that ``cuda`` is a module global, which Numba's simulator swaps."""
from __future__ import annotations

from numba import cuda

from .halves import scalar_conversion

_one = scalar_conversion(cuda.jit(device=True))


@cuda.jit
def convert(src, dst, kind):
    i = cuda.grid(1)
    step = cuda.gridsize(1)
    while i < src.size:
        dst[i] = _one(src[i], kind)
        i += step
