"""The window atoms' CUDA kernels (atoms.window): sliding windows, one thread per output element;
the axis index 0, 1, ..., n-1."""
from numba import cuda

from atoms.cuda.rows import row_offset


@cuda.jit(cache=True)
def window(src, dst, shape, st, vs, op, ok, n, p, k, s, d, left, total):
    t = cuda.grid(1)
    step = cuda.gridsize(1)
    while t < total:
        j = t % k
        i = (t // k) % p
        r = t // (k * p)
        v = row_offset(r, shape, st, 0)
        o = row_offset(r, shape, st, 1)
        x = i * s - left + j * d
        if x >= 0 and x < n:
            dst[o + i * op + j * ok] = src[v + x * vs]
        else:
            dst[o + i * op + j * ok] = 0
        t += step


@cuda.jit(cache=True)
def axis_index(out, n):
    t = cuda.grid(1)
    step = cuda.gridsize(1)
    while t < n:
        out[t] = t
        t += step
