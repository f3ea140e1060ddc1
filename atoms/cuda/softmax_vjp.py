"""The masked-softmax-vjp atom's CUDA kernel (atoms.softmax_vjp): one thread per row."""
from numba import cuda

from atoms.cuda.rows import row_offset


@cuda.jit(cache=True)
def masked_softmax_vjp(y, g, dst, shape, st, ys, gs, os, n, count):
    r = cuda.grid(1)
    step = cuda.gridsize(1)
    while r < count:
        a = row_offset(r, shape, st, 0)
        b = row_offset(r, shape, st, 1)
        o = row_offset(r, shape, st, 2)
        s = 0.0
        for k in range(n):
            v = y[a + k * ys]
            if v != 0.0:
                s += v * g[b + k * gs]
        for k in range(n):
            v = y[a + k * ys]
            if v != 0.0:
                dst[o + k * os] = v * (g[b + k * gs] - s)
            else:
                dst[o + k * os] = 0.0
        r += step
