"""The fill atom's CUDA kernel (atoms.fill): one thread per element (grid-stride)."""
from numba import cuda


@cuda.jit(cache=True)
def fill(dst, bits, n):
    t = cuda.grid(1)
    step = cuda.gridsize(1)
    while t < n:
        dst[t] = bits[0]
        t += step
