"""Vectorisable ``math.log`` and ``math.log1p`` for generated CPU kernels (the companions of
:mod:`runtime.kernels.vmath`'s exp, erf, tanh and gelu, built from its bit intrinsics).

:func:`vlog` and :func:`vlog1p` are fdlibm's log (the mantissa's log by a degree-14 odd
series in s = f/(2 + f), the exponent times ln 2 in two parts), log1p adding the rounding
error of 1 + u over 1 + u; both in the argument's precision. Measured within 1 ulp for log
and 1.5 ulp for log1p over sampled float32 bit patterns, and 1 ulp for float64 (against
100-bit references); log(0) = -inf, log(x < 0) = NaN, log1p(-1) = -inf, log1p(±0) = ±0, as
NumPy. softplus, log1p(exp(x)), runs at vector speed with them.

Generated sources import them by :data:`runtime.kernels.vmath.LOG_IMPORT`, only the sources
that call them (:func:`runtime.kernels.vmath.with_imports`).
"""
from __future__ import annotations

import math

import numpy as np
from llvmlite import ir
from numba import njit, types

from runtime.kernels.vmath import _bits_as_float32, _bits_as_float64, _bits_of, _bits_of_float64, _by_precision

# fdlibm's logf / log: log(1 + f) = f - f²/2 + s·(f²/2 + R(s²)), s = f / (2 + f), for the
# mantissa 1 + f in [√½, √2); within 1 ulp in each precision. log1p(u) is log(w), w = 1 + u
# rounded, plus the rounding error of w divided by w (exact to first order: Goldberg).

_LG32 = (6.6666668653e-01, 4.0000000596e-01, 2.8571429849e-01, 2.2222198546e-01,
         1.8183572590e-01, 1.5313838422e-01, 1.4798198640e-01)
_LG64 = (6.666666666666735130e-01, 3.999999999940941908e-01, 2.857142874366239149e-01,
         2.222219843214978396e-01, 1.818357216161805012e-01, 1.531383769920937332e-01,
         1.479819860511658591e-01)
_bits_of_float32 = _bits_of(types.float32, types.int32, ir.IntType(32))


@njit(inline="always", error_model="numpy")
def _log32_finite(w):
    """log(w) for a positive finite float32 ``w`` (subnormals scaled into the normal range)."""
    sub = w < np.float32(1.1754944e-38)
    b = _bits_of_float32(w * np.float32(16777216.0) if sub else w)
    e = ((b >> 23) & np.int32(0xff)) - np.int32(127) - (np.int32(24) if sub else np.int32(0))
    m = _bits_as_float32((b & np.int32(0x007fffff)) | np.int32(0x3f800000))  # in [1, 2)
    up = m > np.float32(1.4142135)
    f = (m * np.float32(0.5) if up else m) - np.float32(1.0)
    k = np.float32(e + (np.int32(1) if up else np.int32(0)))
    s = f / (np.float32(2.0) + f)
    z = s * s
    ww = z * z
    t1 = ww * (np.float32(_LG32[1]) + ww * (np.float32(_LG32[3]) + ww * np.float32(_LG32[5])))
    t2 = z * (np.float32(_LG32[0]) + ww * (np.float32(_LG32[2]) + ww * (np.float32(_LG32[4]) + ww * np.float32(_LG32[6]))))
    hfsq = np.float32(0.5) * f * f
    return k * np.float32(6.9313812256e-01) - ((hfsq - (s * (hfsq + (t1 + t2)) + k * np.float32(9.0580006145e-06))) - f)


@njit(inline="always", error_model="numpy")
def _log64_finite(w):
    """log(w) for a positive finite float64 ``w`` (subnormals scaled into the normal range)."""
    sub = w < 2.2250738585072014e-308
    b = _bits_of_float64(w * 18014398509481984.0 if sub else w)  # 2^54
    e = ((b >> 52) & np.int64(0x7ff)) - np.int64(1023) - (np.int64(54) if sub else np.int64(0))
    m = _bits_as_float64((b & np.int64(0x000fffffffffffff)) | np.int64(0x3ff0000000000000))
    up = m > 1.4142135623730951
    f = (m * 0.5 if up else m) - 1.0
    k = np.float64(e + (np.int64(1) if up else np.int64(0)))
    s = f / (2.0 + f)
    z = s * s
    ww = z * z
    t1 = ww * (_LG64[1] + ww * (_LG64[3] + ww * _LG64[5]))
    t2 = z * (_LG64[0] + ww * (_LG64[2] + ww * (_LG64[4] + ww * _LG64[6])))
    hfsq = 0.5 * f * f
    return k * 6.93147180369123816490e-01 - ((hfsq - (s * (hfsq + (t1 + t2)) + k * 1.90821492927058770002e-10)) - f)


@njit(inline="always", error_model="numpy")
def _log32(x):
    xc = min(max(x, np.float32(1e-45)), np.float32(3.4028235e38))  # keeps the unused branch finite
    res = _log32_finite(xc)
    res = np.float32(np.inf) if x == np.float32(np.inf) else res
    res = np.float32(-np.inf) if x == np.float32(0.0) else res
    return res if x >= np.float32(0.0) else np.float32(np.nan)  # (NaN compares false: NaN)


@njit(inline="always", error_model="numpy")
def _log64(x):
    x = np.float64(x)
    xc = min(max(x, 5e-324), 1.7976931348623157e308)
    res = _log64_finite(xc)
    res = np.inf if x == np.inf else res
    res = -np.inf if x == 0.0 else res
    return res if x >= 0.0 else np.nan


@njit(inline="always", error_model="numpy")
def _log1p32(u):
    one = np.float32(1.0)
    w = one + u
    wc = min(max(w, np.float32(1e-30)), np.float32(3.4028235e38))
    err = (u - (w - one)) if u < one else (one - (w - u))  # (1 + u) - w, exactly (Sterbenz)
    res = _log32_finite(wc) + err / wc
    res = u if abs(u) < np.float32(2.9802322e-08) else res  # |u| < 2⁻²⁵: u is log1p(u) rounded (±0 kept)
    res = np.float32(np.inf) if u == np.float32(np.inf) else res
    res = np.float32(-np.inf) if u == -one else res
    return res if u >= -one else np.float32(np.nan)


@njit(inline="always", error_model="numpy")
def _log1p64(u):
    u = np.float64(u)
    w = 1.0 + u
    wc = min(max(w, 1e-300), 1.7976931348623157e308)
    err = (u - (w - 1.0)) if u < 1.0 else (1.0 - (w - u))
    res = _log64_finite(wc) + err / wc
    res = u if abs(u) < 5.551115123125783e-17 else res  # |u| < 2⁻⁵⁴
    res = np.inf if u == np.inf else res
    res = -np.inf if u == -1.0 else res
    return res if u >= -1.0 else np.nan


def vlog(x):
    """``log(x)`` for compiled kernels, in the argument's precision (float32 or float64): within
    1 ulp over every binade, subnormals included; log(0) = -inf, log(x < 0) = NaN, log(inf) =
    inf. In plain Python, ``math.log`` (which raises where these return -inf or NaN)."""
    return math.log(x)


def vlog1p(x):
    """``log1p(x)`` for compiled kernels, in the argument's precision; -inf at -1, NaN below.
    In plain Python, ``math.log1p``."""
    return math.log1p(x)


_by_precision(vlog, _log32, _log64)
_by_precision(vlog1p, _log1p32, _log1p64)
