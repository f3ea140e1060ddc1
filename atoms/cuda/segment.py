"""The segment atom's CUDA kernel (atoms.segment): one thread per row, per-row group scratch."""
import math

from numba import cuda

from atoms.cuda.rows import row_offset


@cuda.jit(cache=True)
def segment(x, ids, mask, out, shape, st, vs, js, ms, os, n, count, mode, acc, cnt, mx, rows):
    t = cuda.grid(1)
    step = cuda.gridsize(1)
    while t < rows:
        v0 = row_offset(t, shape, st, 0)
        i0 = row_offset(t, shape, st, 1)
        m0 = row_offset(t, shape, st, 2)
        o0 = row_offset(t, shape, st, 3)
        s0 = t * count
        for g in range(count):
            acc[s0 + g] = 0
            cnt[s0 + g] = 0
            mx[s0 + g] = -math.inf
        for j in range(n):
            if mask[m0 + j * ms] != 0:
                g = ids[i0 + j * js]
                if g >= 0 and g < count:
                    v = x[v0 + j * vs]
                    cnt[s0 + g] += 1
                    if mode >= 2:
                        if v > mx[s0 + g] or v != v:
                            mx[s0 + g] = v
                    else:
                        acc[s0 + g] += v
        if mode == 3:
            for j in range(n):
                e = 0.0
                if mask[m0 + j * ms] != 0:
                    g = ids[i0 + j * js]
                    if g >= 0 and g < count:
                        e = math.exp(x[v0 + j * vs] - mx[s0 + g])
                        acc[s0 + g] += e
                out[o0 + j * os] = e
            for j in range(n):
                if mask[m0 + j * ms] != 0:
                    g = ids[i0 + j * js]
                    if g >= 0 and g < count:
                        out[o0 + j * os] /= acc[s0 + g]
        else:
            for g in range(count):
                if cnt[s0 + g] == 0:
                    out[o0 + g * os] = 0
                elif mode == 0:
                    out[o0 + g * os] = acc[s0 + g]
                elif mode == 1:
                    out[o0 + g * os] = acc[s0 + g] / cnt[s0 + g]
                else:
                    out[o0 + g * os] = mx[s0 + g]
        t += step
