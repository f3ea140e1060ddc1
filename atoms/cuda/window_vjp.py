"""The window-vjp atom's CUDA kernel (atoms.window_vjp): one thread per output element, the taps
of each gathered in ascending (p, k). ``zero`` is a 0 of the output's dtype, the accumulator's
start, so one source serves every float dtype (Numba specialises on its type)."""
from numba import cuda

from atoms.cuda.rows import row_offset


@cuda.jit(cache=True)
def window_vjp(src, dst, shape, st, gp, gk, os, n, p, k, s, d, left, total, zero):
    t = cuda.grid(1)
    step = cuda.gridsize(1)
    while t < total:
        x = t % n
        r = t // n
        a = row_offset(r, shape, st, 0)
        u0 = x + left
        hi = min(u0 // s, p - 1)
        lo = u0 - (k - 1) * d
        if lo <= 0:
            lo = 0
        else:
            lo = (lo + s - 1) // s
        acc = zero
        for i in range(lo, hi + 1):
            u = u0 - i * s
            if u % d == 0:
                acc += src[a + i * gp + (u // d) * gk]
        dst[row_offset(r, shape, st, 1) + x * os] = acc
        t += step
