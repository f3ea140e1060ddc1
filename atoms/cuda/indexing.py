"""The indexing atoms' CUDA kernel (atoms.indexing): an index-driven strided copy, one thread
per element."""
from numba import cuda


@cuda.jit(cache=True)
def indexed(src, sax, idx, dst, dax, bound, meta, n):
    rank = meta.shape[1]
    t = cuda.grid(1)
    step = cuda.gridsize(1)
    while t < n:
        r = t
        s = 0
        x = 0
        d = 0
        for k in range(rank - 1, -1, -1):
            e = meta[0, k]
            q = r // e
            i = r - q * e
            r = q
            s += i * meta[1, k]
            x += i * meta[2, k]
            d += i * meta[3, k]
        v = idx[x]
        if v >= 0 and v < bound:
            dst[d + v * dax] = src[s + v * sax]
        t += step
