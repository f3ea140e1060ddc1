"""The finiteness check's CUDA kernel (imported only by :func:`runtime.kernels.finite.
device_all_finite`, so numba.cuda loads with the first device check). A module of its own so
that ``cuda`` is a module global, which Numba's simulator swaps."""
from __future__ import annotations

from numba import cuda


@cuda.jit
def count_nonfinite(flat, flag):
    i = cuda.grid(1)
    stride = cuda.gridsize(1)
    while i < flat.size:
        v = flat[i]
        if not (v - v == 0):  # NaN and ±inf give NaN
            flag[0] = 1
        i += stride
