"""CUDA half conversions (imported only by CUDA plans): one thread per element, grid-stride.

A module of its own so that ``cuda`` is a module global, which Numba's simulator swaps."""
from __future__ import annotations

from numba import cuda

from runtime.kernels.halfconv import _views, scalar_conversion

_one = scalar_conversion(cuda.jit(device=True))


@cuda.jit
def convert(src, dst, kind):
    i = cuda.grid(1)
    step = cuda.gridsize(1)
    while i < src.size:
        dst[i] = _one(src[i], kind)
        i += step


CUDA_THREADS = 256
CUDA_MAX_BLOCKS = 1024


def convert_device(src, dst, kind: int) -> None:
    """Widen or narrow device array ``src`` into ``dst`` (C-contiguous, same shape)."""
    s, d = _views(src, dst, kind)
    s, d = s.reshape(s.size), d.reshape(d.size)
    blocks = max(1, min(CUDA_MAX_BLOCKS, -(-s.size // CUDA_THREADS)))
    convert[blocks, CUDA_THREADS](s, d, kind)
