"""``numba.cuda`` kernels for the cuda backend. Imported only by the cuda kernel factories,
so the plugin imports on machines without CUDA.

Norms run one thread per row (grid-stride over ``outer * inner`` rows of the
``(outer, n, inner)`` view): neighbouring threads read neighbouring ``inner`` elements, so
loads coalesce when the normalised axis is not innermost; each thread sums its row in index
order, so results are deterministic. Activations are flat grid-stride loops.
"""
from __future__ import annotations

import math

from numba import cuda

SQRT_2_OVER_PI = math.sqrt(2.0 / math.pi)


@cuda.jit(cache=True)
def rms_norm_rows(x, out, eps, inv_n, zero):
    n, inner = x.shape[1], x.shape[2]
    rows = x.shape[0] * inner
    t = cuda.grid(1)
    step = cuda.gridsize(1)
    while t < rows:
        o = t // inner
        i = t - o * inner
        s = zero
        for k in range(n):
            v = x[o, k, i]
            s += v * v
        r = math.sqrt(s * inv_n + eps)
        for k in range(n):
            out[o, k, i] = x[o, k, i] / r
        t += step


@cuda.jit(cache=True)
def layer_norm_rows(x, out, eps, inv_n, zero):
    n, inner = x.shape[1], x.shape[2]
    rows = x.shape[0] * inner
    t = cuda.grid(1)
    step = cuda.gridsize(1)
    while t < rows:
        o = t // inner
        i = t - o * inner
        s = zero
        for k in range(n):
            s += x[o, k, i]
        mu = s * inv_n
        q = zero
        for k in range(n):
            d = x[o, k, i] - mu
            q += d * d
        r = math.sqrt(q * inv_n + eps)
        for k in range(n):
            out[o, k, i] = (x[o, k, i] - mu) / r
        t += step


@cuda.jit(device=True)
def gelu_tanh(z):
    return 0.5 * z * (1.0 + math.tanh(SQRT_2_OVER_PI * (z + 0.044715 * z * z * z)))


@cuda.jit(device=True)
def softplus(z):
    return math.log1p(math.exp(-abs(z))) + (z if z > 0.0 else 0.0)


@cuda.jit(cache=True)
def gelu_tanh_flat(x, out):
    t = cuda.grid(1)
    step = cuda.gridsize(1)
    while t < x.shape[0]:
        out[t] = gelu_tanh(x[t])
        t += step


@cuda.jit(cache=True)
def softplus_flat(x, out):
    t = cuda.grid(1)
    step = cuda.gridsize(1)
    while t < x.shape[0]:
        out[t] = softplus(x[t])
        t += step


NORMS = {"rms-norm": rms_norm_rows, "layer-norm": layer_norm_rows}
ACTIVATIONS = {"gelu-tanh": gelu_tanh_flat, "softplus": softplus_flat}
