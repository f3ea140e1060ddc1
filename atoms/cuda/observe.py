"""The observe atoms' CUDA kernels (atoms.observe): one thread per output row or element.
The activity is converted to the value's dtype by a store into the output, as on the CPU."""
import math

from numba import cuda


@cuda.jit(cache=True)
def identity(x, act, mask, out):
    q = cuda.grid(1)
    nb, nt, nn, nd = out.shape
    if q < nb * nt * nn:
        bt, n = q // nn, q % nn
        b, t = bt // nt, bt % nt
        out[b, t, n, 0] = act[b, t]
        a = out[b, t, n, 0]
        for j in range(nd):
            out[b, t, n, j] = x[b, n, j] * a if mask[b, n] else 0


@cuda.jit(cache=True)
def affine(x, states, act, mask, weight, bias, scale, out):
    q = cuda.grid(1)
    nb, nt, nn, nd = out.shape
    if q < nb * nt * nd:
        bt, j = q // nd, q % nd
        b, t = bt // nt, bt % nt
        za = bias[j]
        zb = bias[nd + j]
        for s in range(states.shape[2]):
            za += states[b, t, s] * weight[j, s]
            zb += states[b, t, s] * weight[nd + j, s]
        gain = scale / scale + scale * math.tanh(za)
        shift = scale * math.tanh(zb)
        for n in range(nn):
            out[b, t, n, j] = act[b, t]
            a = out[b, t, n, j]
            out[b, t, n, j] = (x[b, n, j] * gain + shift) * a if mask[b, n] else 0


@cuda.jit(cache=True)
def fourier(x, act, mask, g, h, w, out):
    q = cuda.grid(1)
    nb, nt, nn, nd = out.shape
    if q < nb * nt * nn * nd:
        rest, j = q // nd, q % nd
        bt, p = rest // nn, rest % nn
        b, t = bt // nt, bt % nt
        out[b, t, p, j] = act[b, t]
        a = out[b, t, p, j]
        r, c = p // w, p % w
        s = a - a
        for r2 in range(h):
            hr = g[bt, 0, r - r2 + h - 1]
            hi = g[bt, 1, r - r2 + h - 1]
            for c2 in range(w):
                k = hr * g[bt, 0, 2 * h - 1 + c - c2 + w - 1] - hi * g[bt, 1, 2 * h - 1 + c - c2 + w - 1]
                s += k * x[b, r2 * w + c2, j]
        out[b, t, p, j] = s * a if mask[b, p] else 0
