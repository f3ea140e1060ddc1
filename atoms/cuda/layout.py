"""The layout atoms' CUDA kernel (atoms.layout): a strided copy, one thread per element
(grid-stride)."""
from numba import cuda


@cuda.jit(cache=True)
def copy(src, soff, dst, doff, meta, n):
    rank = meta.shape[1]
    t = cuda.grid(1)
    step = cuda.gridsize(1)
    while t < n:
        r = t
        s = soff
        d = doff
        for k in range(rank - 1, -1, -1):
            e = meta[0, k]
            q = r // e
            i = r - q * e
            r = q
            s += i * meta[1, k]
            d += i * meta[2, k]
        dst[d] = src[s]
        t += step
