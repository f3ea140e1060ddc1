"""Numba ``@njit`` kernels for the cpu backend.

Norm kernels take the operand as ``(outer, n, inner)`` rows (``runtime.toolkit.rows_shape``) and
compute in the operand dtype (on cpu the accumulation dtype always equals it: float32 stays
float32, float64 stays float64), so constants arrive as typed scalars (``eps``, ``inv_n``,
``zero``): a bare ``0.0`` literal would silently promote float32 sums to float64.
Each norm has a serial and a ``prange`` driver around one ``inline="always"`` row body, the
``Twins`` of ``runtime.toolkit``; the parallel one compiles only when a call is large enough to
use it (or the plan is warmed).
"""
from __future__ import annotations

import math

import numpy as np
from numba import njit, prange

from runtime.toolkit import Twins

SQRT_2_OVER_PI = math.sqrt(2.0 / math.pi)


# --- rms-norm ---------------------------------------------------------------------------
@njit(inline="always")
def _rms_rows(x, out, o, eps, inv_n, zero):
    n, inner = x.shape[1], x.shape[2]
    if inner == 1:  # the usual case: the normalised axis is innermost and contiguous
        s = zero
        for k in range(n):
            v = x[o, k, 0]
            s += v * v
        r = math.sqrt(s * inv_n + eps)
        for k in range(n):
            out[o, k, 0] = x[o, k, 0] / r
    else:  # accumulate a vector of row sums so the inner loop stays contiguous
        acc = np.full(inner, zero)
        for k in range(n):
            for i in range(inner):
                v = x[o, k, i]
                acc[i] += v * v
        for i in range(inner):
            acc[i] = math.sqrt(acc[i] * inv_n + eps)
        for k in range(n):
            for i in range(inner):
                out[o, k, i] = x[o, k, i] / acc[i]


@njit(cache=True, nogil=True)
def rms_norm_serial(x, out, eps, inv_n, zero):
    for o in range(x.shape[0]):
        _rms_rows(x, out, o, eps, inv_n, zero)


@njit(cache=True, nogil=True, parallel=True)
def rms_norm_parallel(x, out, eps, inv_n, zero):
    for o in prange(x.shape[0]):
        _rms_rows(x, out, o, eps, inv_n, zero)


# --- layer-norm (two passes: mean, then the biased variance of the deviations) -----------
@njit(inline="always")
def _ln_rows(x, out, o, eps, inv_n, zero):
    n, inner = x.shape[1], x.shape[2]
    if inner == 1:
        s = zero
        for k in range(n):
            s += x[o, k, 0]
        mu = s * inv_n
        q = zero
        for k in range(n):
            d = x[o, k, 0] - mu
            q += d * d
        r = math.sqrt(q * inv_n + eps)
        for k in range(n):
            out[o, k, 0] = (x[o, k, 0] - mu) / r
    else:
        mu = np.full(inner, zero)
        q = np.full(inner, zero)
        for k in range(n):
            for i in range(inner):
                mu[i] += x[o, k, i]
        for i in range(inner):
            mu[i] = mu[i] * inv_n
        for k in range(n):
            for i in range(inner):
                d = x[o, k, i] - mu[i]
                q[i] += d * d
        for i in range(inner):
            q[i] = math.sqrt(q[i] * inv_n + eps)
        for k in range(n):
            for i in range(inner):
                out[o, k, i] = (x[o, k, i] - mu[i]) / q[i]


@njit(cache=True, nogil=True)
def layer_norm_serial(x, out, eps, inv_n, zero):
    for o in range(x.shape[0]):
        _ln_rows(x, out, o, eps, inv_n, zero)


@njit(cache=True, nogil=True, parallel=True)
def layer_norm_parallel(x, out, eps, inv_n, zero):
    for o in prange(x.shape[0]):
        _ln_rows(x, out, o, eps, inv_n, zero)


# --- scalar-map-ext (flat loops; fused chains use the ScalarOp expressions instead) ------
@njit(inline="always")
def gelu_tanh(z):
    return 0.5 * z * (1.0 + math.tanh(SQRT_2_OVER_PI * (z + 0.044715 * z * z * z)))


@njit(inline="always")
def softplus(z):
    return math.log1p(math.exp(-abs(z))) + (z if z > 0.0 else 0.0)


@njit(cache=True, nogil=True)
def gelu_tanh_flat(x, out):
    for k in range(x.shape[0]):
        out[k] = gelu_tanh(x[k])


@njit(cache=True, nogil=True)
def softplus_flat(x, out):
    for k in range(x.shape[0]):
        out[k] = softplus(x[k])


NORMS = {"rms-norm": Twins(rms_norm_serial, rms_norm_parallel),
         "layer-norm": Twins(layer_norm_serial, layer_norm_parallel)}
ACTIVATIONS = {"gelu-tanh": gelu_tanh_flat, "softplus": softplus_flat}
