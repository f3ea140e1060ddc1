"""Vectorisable scalar math for generated CPU kernels.

Numba (LLVM without a vector math library: llvmlite no longer carries SVML) compiles
``math.exp`` to a scalar libm call, which keeps every loop around it scalar: a fused
``x·Aᵀ → silu`` epilogue spent more time in ``exp`` than in its GEMM tile. :func:`vexp` is
plain arithmetic (range reduction by ln 2, a degree-13 polynomial, the power of two built from
its bits), so LLVM vectorises the loops that call it (≈4× faster silu on AVX-512).

It is typed by its argument: a float32 argument takes a float32 evaluation (Cody-Waite
reduction, degree-7 polynomial, ``int32`` exponent bits), which fills 8-lane AVX2 registers
where the float64 one fills 4 and needs a float→int64 conversion that AVX2 lacks (the
``scalar-map-silu`` atom benchmark is at NumPy's speed with it). Anything else evaluates in
float64.

Accuracy: within ~2 ulp of libm over the argument's normal range (float64: within ~1 ulp);
NaN and ±inf as ``math.exp``; results below the smallest normal number (2⁻¹⁰²², or 2⁻¹²⁶ for
float32) are flushed to 0. Elementwise expressions stay written with
``math.exp`` (valid in Python, njit and CUDA); the CPU code generators swap it in
(:func:`cpu_code`), and CUDA keeps the device's own ``exp``.
"""
from __future__ import annotations

from collections.abc import Iterable

import numpy as np
import math

from llvmlite import ir
from numba import njit, types
from numba.extending import intrinsic, overload

# Part of every generated source that uses it: a change here must change their text, so
# Numba's disk cache (keyed by the generated file) never serves kernels built on the old code.
VERSION = 2
IMPORT = f"from runtime.kernels.vmath import vexp as _vexp  # vmath v{VERSION}"


def _bits_as(float_type, int_type, llvm_type):
    """An intrinsic reinterpreting an integer as the float with the same bits (vectorises,
    unlike a view)."""
    @intrinsic
    def bits_as(typingctx, bits):
        def codegen(context, builder, signature, args):
            return builder.bitcast(args[0], llvm_type)
        return float_type(int_type), codegen
    return bits_as


_bits_as_float64 = _bits_as(types.float64, types.int64, ir.DoubleType())
_bits_as_float32 = _bits_as(types.float32, types.int32, ir.FloatType())


def vexp(x):
    """``exp(x)`` for compiled kernels, in the argument's precision (float32 or float64); in
    plain Python, ``math.exp``."""
    return math.exp(x)


@overload(vexp, jit_options={"error_model": "numpy"})
def _vexp_typed(x):
    if x == types.float32:
        return lambda x: _exp32(x)
    if isinstance(x, (types.Float, types.Integer, types.Boolean)):
        return lambda x: _exp64(x)
    return None


@njit(inline="always", error_model="numpy")
def _exp32(x):
    lo, hi = np.float32(-87.33655), np.float32(88.72283)  # ln of the smallest normal, of the largest
    xc = x if x > lo else lo
    xc = xc if xc < hi else hi
    n = np.floor(xc * np.float32(1.442695) + np.float32(0.5))
    r = (xc - n * np.float32(0.693359375)) - n * np.float32(-2.12194440e-4)  # ln 2 in two parts
    p = np.float32(1.0 / 5040)  # Taylor coefficients 1/7! ... 1/0!: |r| <= ln2 / 2 keeps the
    p = p * r + np.float32(1.0 / 720)  # truncation below 1e-8 relative
    p = p * r + np.float32(1.0 / 120)
    p = p * r + np.float32(1.0 / 24)
    p = p * r + np.float32(1.0 / 6)
    p = p * r + np.float32(0.5)
    p = p * r + np.float32(1.0)
    p = p * r + np.float32(1.0)
    k = np.int32(n)
    half = k >> 1  # 2^n as two factors (n = 128 has no float32 exponent)
    res = p * _bits_as_float32((half + np.int32(127)) << 23) * _bits_as_float32((k - half + np.int32(127)) << 23)
    if x > hi:
        res = np.float32(np.inf)
    if x < lo:
        res = np.float32(0.0)
    if x != x:
        res = x
    return res


@njit(inline="always", error_model="numpy")
def _exp64(x):
    x = np.float64(x)
    xc = x if x > -708.3 else -708.3
    xc = xc if xc < 709.78 else 709.78
    n = np.floor(xc * 1.4426950408889634 + 0.5)  # exp(x) = 2^n · exp(r), |r| <= ln2 / 2
    r = (xc - n * 6.93147180369123816490e-01) - n * 1.90821492927058770002e-10
    p = 1.6059043836821613e-10  # Taylor coefficients 1/13! ... 1/0!
    p = p * r + 2.08767569878681e-09
    p = p * r + 2.505210838544172e-08
    p = p * r + 2.755731922398589e-07
    p = p * r + 2.7557319223985893e-06
    p = p * r + 2.48015873015873e-05
    p = p * r + 0.0001984126984126984
    p = p * r + 0.001388888888888889
    p = p * r + 0.008333333333333333
    p = p * r + 0.041666666666666664
    p = p * r + 0.16666666666666666
    p = p * r + 0.5
    p = p * r + 1.0
    p = p * r + 1.0
    k = np.int64(n)
    half = k >> 1  # 2^n as two factors: n = 1024 (just below overflow) has no float64 exponent
    res = p * _bits_as_float64((half + 1023) << 52) * _bits_as_float64((k - half + 1023) << 52)
    if x > 709.782712893384:
        res = np.inf
    if x < -708.3:
        res = 0.0
    if x != x:
        res = x
    return res


def cpu_code(lines: Iterable[str]) -> list[str]:
    """Generated CPU source lines with ``math.exp`` calls evaluated by :func:`vexp`
    (the module must also contain :data:`IMPORT`)."""
    return [line.replace("math.exp(", "_vexp(") for line in lines]
