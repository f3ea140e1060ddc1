"""The slice-vjp atom's CUDA kernel (atoms.slice_vjp): one thread per output element."""
from numba import cuda

from atoms.cuda.rows import row_offset


@cuda.jit(cache=True)
def slice_vjp(src, dst, shape, st, gs, os, n, m, start, step, total):
    t = cuda.grid(1)
    step_t = cuda.gridsize(1)
    while t < total:
        i = t % n
        r = t // n
        o = row_offset(r, shape, st, 1) + i * os
        j = i - start
        if j >= 0 and j % step == 0 and j // step < m:
            dst[o] = src[row_offset(r, shape, st, 0) + (j // step) * gs]
        else:
            dst[o] = 0
        t += step_t
