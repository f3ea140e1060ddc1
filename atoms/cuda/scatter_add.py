"""The scatter-add atom's CUDA kernel (atoms.scatter_add): one thread per row along the index
axis."""
from numba import cuda

from atoms.cuda.rows import row_offset


@cuda.jit(cache=True)
def scatter_add(upd, idx, out, shape, st, uj, ij, oax, n, bound, count):
    t = cuda.grid(1)
    step = cuda.gridsize(1)
    while t < count:
        u = row_offset(t, shape, st, 0)
        x = row_offset(t, shape, st, 1)
        o = row_offset(t, shape, st, 2)
        for j in range(n):
            v = idx[x + j * ij]
            if v >= 0 and v < bound:
                out[o + v * oax] += upd[u + j * uj]
        t += step
