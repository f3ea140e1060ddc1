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
float32) are flushed to 0.

:func:`verf` and :func:`vtanh` do the same for ``math.erf`` (exact gelu) and ``math.tanh``:
piecewise polynomials whose branches are all evaluated and one selected per element, so the
loop around them vectorises (speed-ups: docs/performance.md). Measured
bounds over every float64 binade, subnormals, ±0, ±inf and NaN (tests/test_vmath.py): erf
and tanh within 2 ulp of libm for float64; float32 arguments are evaluated in float64 and
rounded, within 1 ulp. ±0 keeps its sign; NaN stays NaN; erf(±inf) = ±1, tanh(±inf) = ±1.

:func:`vgelu` is the exact gelu (scalar-map's expression, :data:`GELU_EXPR`). Its float32
form computes in float32 (twice the lanes of the float64 chain that the expression's float64
literals would otherwise start) and takes ½x·erfc(|t|) for the negative tail instead of
½x·(1 + erf(t)), which cancels there even in float64, and evaluates erfcx as one polynomial
in 1/(1 + |t|) (no per-piece coefficient selects): measured within 4.4 ulp of x·Φ(x) over
every float32 in [-15.5, -1] (the negative tail, subnormal results included), within 1.5
ulp for 10⁻³⁰ ≤ |x| < 1 and 1.3 ulp for x in [1, 10] (every float32 of each range:
bench/lab/gelu_ulp.py). float64 arguments keep the formula with
:func:`verf`.

:func:`vlog` and :func:`vlog1p` (``math.log``, ``math.log1p``) are in :mod:`runtime.kernels.vlog`.

Elementwise expressions stay written with ``math.exp``/``math.erf``/``math.tanh``/``math.log``/
``math.log1p`` (valid in Python, njit and CUDA); an atom declares the CPU form that calls these
helpers instead (``ScalarOp(expr, cpu=...)``, the names of :data:`CPU_HELPERS`), which the CPU
code generators use, and CUDA keeps the device's own functions.
"""
from __future__ import annotations

import math
from collections.abc import Iterable
from pathlib import Path

import numpy as np

from llvmlite import ir
from numba import njit, types
from numba.extending import intrinsic, overload

from runtime.kernels.codegen import source_stamp
from runtime.plugins.expressions import CPU_HELPERS  # noqa: F401 (the names IMPORT binds, below)

# Part of every generated source that uses it, with a digest of this file: an edit here changes
# their text, so Numba's disk cache (keyed by the generated file) never serves kernels built on
# the old code.
IMPORT = (f"from runtime.kernels.vmath import vexp as _vexp, verf as _verf, vtanh as _vtanh, "
          f"vgelu as _vgelu, vgelu_grad as _vgelu_grad  # vmath {source_stamp(__file__)}")
# log and log1p came later: their own import line, only in the sources that call them, so
# every source without them (and its cached kernel) stays as it was (vlog.py inlines helpers
# of this file: both are in its digest)
LOG_IMPORT = (f"from runtime.kernels.vlog import vlog as _vlog, vlog1p as _vlog1p  "
              f"# vmath log {source_stamp(Path(__file__).with_name('vlog.py'), __file__)}")
# IMPORT binds CPU_HELPERS, the names ScalarOp's ``cpu`` expressions may call (declared with the
# expression checks, a layer below: runtime.plugins.expressions)
# erf, tanh, gelu, log and log1p are inlined whole (tens of operations each, a noticeable
# compile cost per copy): a generated module with more calls than this binds their names to
# libm's functions instead (LIBM_IMPORT), so a long fused chain still compiles in seconds
MAX_INLINED = 4
_INLINED = ("_verf(", "_vtanh(", "_vgelu(", "_vgelu_grad(", "_vlog(", "_vlog1p(")
LIBM_IMPORT = ("from runtime.kernels.vmath import vexp as _vexp, gelu_libm as _vgelu, gelu_grad_libm as _vgelu_grad",
               "from math import erf as _verf, tanh as _vtanh, log as _vlog, log1p as _vlog1p")


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


def _by_precision(fn, f32, f64, inline: str = "always") -> None:
    """Compile ``fn`` in kernels as ``f32`` for a float32 argument and as ``f64`` for any
    other number; ``inline``: into the caller's Numba IR (erf, tanh, gelu, log and log1p: a
    call per element would keep the loop scalar), or "never" for exp, which kept Numba's
    default and vectorises so (tests/test_vmath.py)."""
    @overload(fn, inline=inline, jit_options={"error_model": "numpy"})
    def typed(x):
        if x == types.float32:
            return lambda x: f32(x)
        if isinstance(x, (types.Float, types.Integer, types.Boolean)):
            return lambda x: f64(x)
        return None


@njit(inline="always", error_model="numpy")
def _exp32(x):
    lo, hi = np.float32(-87.33655), np.float32(88.72283)  # ln of the smallest normal, of the largest
    xc = x if x > lo else lo
    xc = xc if xc < hi else hi
    p, k = _exp32_reduced(xc)
    half = k >> 1  # 2^n as two factors (n = 128 has no float32 exponent)
    res = p * _pow2_32(half) * _pow2_32(k - half)
    if x > hi:
        res = np.float32(np.inf)
    if x < lo:
        res = np.float32(0.0)
    if x != x:
        res = x
    return res


# float32 exp: ln 2 in two parts (Cody-Waite), and the Taylor coefficients 1/0! ... 1/7!
# (|r| <= ln2 / 2 keeps the truncation below 1e-8 relative); the gelu's tail shares them
_LN2_32 = (0.693359375, -2.12194440e-4)
_EXP32_TAYLOR = (1.0, 1.0, 0.5, 1.0 / 6, 1.0 / 24, 1.0 / 120, 1.0 / 720, 1.0 / 5040)


@njit(inline="always", error_model="numpy")
def _exp32_reduced(x):
    """exp(x) = p · 2^k for a finite float32 x, with p in [√½, √2]."""
    n = np.floor(x * np.float32(1.442695) + np.float32(0.5))
    r = (x - n * np.float32(_LN2_32[0])) - n * np.float32(_LN2_32[1])
    p = np.float32(_EXP32_TAYLOR[7])
    for i in range(6, -1, -1):  # (Horner without FMA: vexp's float32 results as they were)
        p = p * r + np.float32(_EXP32_TAYLOR[i])
    return p, np.int32(n)


@njit(inline="always", error_model="numpy")
def _pow2_32(k):
    """2^k as a float32, for -126 <= k <= 127."""
    return _bits_as_float32((k + np.int32(127)) << 23)


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


def _bits_of(float_type, int_type, llvm_type):
    """An intrinsic reinterpreting a float as the integer with the same bits."""
    @intrinsic
    def bits_of(typingctx, value):
        def codegen(context, builder, signature, args):
            return builder.bitcast(args[0], llvm_type)
        return int_type(float_type), codegen
    return bits_of


_bits_of_float64 = _bits_of(types.float64, types.int64, ir.IntType(64))
_SIGN64 = np.int64(-0x8000000000000000)


@njit(inline="always", error_model="numpy")
def _with_sign_of(magnitude, x):
    """``copysign(magnitude, x)`` for a non-negative float64 magnitude, as bit operations
    (vectorises; -0.0 and NaN signs kept)."""
    return _bits_as_float64(_bits_of_float64(magnitude) | (_bits_of_float64(x) & _SIGN64))


# --- erf and tanh ---------------------------------------------------------------------------
# Coefficients from bench/lab/fit_vmath.py (least squares on Chebyshev nodes; its docstring
# gives the forms). Every branch is computed and one is selected per element, so loops around
# these functions vectorise (LLVM if-converts the selects).

_ERF_SMALL = (
    0.12837916709551253,
    -0.3761263890318296,
    0.11283791670909099,
    -0.026866170637130173,
    0.005223977557282527,
    -0.0008548323632617532,
    0.00012055225844952771,
    -1.4923409757075971e-05,
    1.643063555463817e-06,
    -1.6071003572830543e-07,
    1.3028251699316853e-08,
    -5.895853432934122e-10,
    -2.0828308238794477e-11)

_ERFC0 = (
    0.32158541645431776,
    -0.08181145886628,
    0.019037759963865884,
    -0.004116363162445977,
    0.0008360838096303603,
    -0.00016081117338416417,
    2.947085691978123e-05,
    -5.171328515053964e-06,
    8.723067338753273e-07,
    -1.419124483914686e-07,
    2.2323236564266076e-08,
    -3.4049338389367506e-09,
    5.11172547137699e-10,
    -7.338130646827568e-11,
    5.970843192740937e-12,
    -1.2618370371867755e-12,
    1.3090028224805118e-12)

_ERFC1 = (
    0.19366209627906872,
    -0.04742822817047639,
    0.011114208555367202,
    -0.0025035488002864703,
    0.0005440864559264692,
    -0.00011442715404951987,
    2.3347541883108286e-05,
    -4.6317048768589875e-06,
    8.950260146654036e-07,
    -1.687441186417863e-07,
    3.108180581298014e-08,
    -5.600750532505544e-09,
    9.907609850791316e-10,
    -1.711158898529854e-10,
    2.7712911299474056e-11,
    -5.131420960898903e-12,
    1.160164570236105e-12)

_ERFC2 = (
    0.1163027072102475,
    -0.029379310747703356,
    0.007283322451518827,
    -0.001773630658284504,
    0.00042462964854709704,
    -0.00010002374582728464,
    2.3197610955046508e-05,
    -5.30036977868678e-06,
    1.1938336111817673e-06,
    -2.6520320408917494e-07,
    5.813598204543117e-08,
    -1.2591857490777418e-08,
    2.691251453498431e-09,
    -5.579041641987268e-10,
    1.166077090265858e-10,
    -2.9618313375608214e-11,
    5.995489997989461e-12)

_TANH_SMALL = (
    -0.3333333333333332,
    0.1333333333332658,
    -0.05396825396115359,
    0.02186948824964879,
    -0.008863229609052075,
    0.003592056508878185,
    -0.001455293062721916,
    0.0005873725381568785,
    -0.0002306224127102564,
    7.939966895253908e-05,
    -1.7135373828573827e-05)



@njit(inline="always", error_model="numpy")
def _pick(m1, m2, a, b, c):
    return a if m1 else (b if m2 else c)


def verf(x):
    """``erf(x)`` for compiled kernels; in plain Python, ``math.erf``."""
    return math.erf(x)


def vtanh(x):
    """``tanh(x)`` for compiled kernels; in plain Python, ``math.tanh``."""
    return math.tanh(x)






@njit(inline="always", error_model="numpy")
def _erf64(x):
    """|x| < 1: x + x·P(x²); 1 <= |x| < 6: ±(1 − exp(−x²)·G(|x|)), G ≈ erfcx piecewise on
    [1, 2], [2, 3.5], [3.5, 6]; beyond, ±1 (erfc(6) < 2⁻⁵⁴). Within 2 ulp of libm."""
    x = np.float64(x)
    a = abs(x)
    s = x * x
    p = _ERF_SMALL[12]
    p = p * s + _ERF_SMALL[11]
    p = p * s + _ERF_SMALL[10]
    p = p * s + _ERF_SMALL[9]
    p = p * s + _ERF_SMALL[8]
    p = p * s + _ERF_SMALL[7]
    p = p * s + _ERF_SMALL[6]
    p = p * s + _ERF_SMALL[5]
    p = p * s + _ERF_SMALL[4]
    p = p * s + _ERF_SMALL[3]
    p = p * s + _ERF_SMALL[2]
    p = p * s + _ERF_SMALL[1]
    p = p * s + _ERF_SMALL[0]
    small = x + x * p
    ac = min(max(a, 1.0), 6.0)  # keeps the unused branch finite
    m1, m2 = ac < 2.0, ac < 3.5
    t = (ac - _pick(m1, m2, 1.5, 2.75, 4.75)) * _pick(m1, m2, 2.0, 1.0 / 0.75, 1.0 / 1.25)
    g = _pick(m1, m2, _ERFC0[16], _ERFC1[16], _ERFC2[16])
    g = g * t + _pick(m1, m2, _ERFC0[15], _ERFC1[15], _ERFC2[15])
    g = g * t + _pick(m1, m2, _ERFC0[14], _ERFC1[14], _ERFC2[14])
    g = g * t + _pick(m1, m2, _ERFC0[13], _ERFC1[13], _ERFC2[13])
    g = g * t + _pick(m1, m2, _ERFC0[12], _ERFC1[12], _ERFC2[12])
    g = g * t + _pick(m1, m2, _ERFC0[11], _ERFC1[11], _ERFC2[11])
    g = g * t + _pick(m1, m2, _ERFC0[10], _ERFC1[10], _ERFC2[10])
    g = g * t + _pick(m1, m2, _ERFC0[9], _ERFC1[9], _ERFC2[9])
    g = g * t + _pick(m1, m2, _ERFC0[8], _ERFC1[8], _ERFC2[8])
    g = g * t + _pick(m1, m2, _ERFC0[7], _ERFC1[7], _ERFC2[7])
    g = g * t + _pick(m1, m2, _ERFC0[6], _ERFC1[6], _ERFC2[6])
    g = g * t + _pick(m1, m2, _ERFC0[5], _ERFC1[5], _ERFC2[5])
    g = g * t + _pick(m1, m2, _ERFC0[4], _ERFC1[4], _ERFC2[4])
    g = g * t + _pick(m1, m2, _ERFC0[3], _ERFC1[3], _ERFC2[3])
    g = g * t + _pick(m1, m2, _ERFC0[2], _ERFC1[2], _ERFC2[2])
    g = g * t + _pick(m1, m2, _ERFC0[1], _ERFC1[1], _ERFC2[1])
    g = g * t + _pick(m1, m2, _ERFC0[0], _ERFC1[0], _ERFC2[0])
    large = _with_sign_of(1.0 - _exp64(-s) * g, x)  # exp(-inf) = 0: ±1 at ±inf; NaN stays NaN
    return small if a < 1.0 else large


@njit(inline="always", error_model="numpy")
def _tanh64(x):
    """|x| < 0.625: x + x·s·Q(s), s = x²; beyond, ±(1 − 2/(exp(2|x|) + 1)). Within 2 ulp of
    libm."""
    x = np.float64(x)
    a = abs(x)
    s = x * x
    q = _TANH_SMALL[10]
    q = q * s + _TANH_SMALL[9]
    q = q * s + _TANH_SMALL[8]
    q = q * s + _TANH_SMALL[7]
    q = q * s + _TANH_SMALL[6]
    q = q * s + _TANH_SMALL[5]
    q = q * s + _TANH_SMALL[4]
    q = q * s + _TANH_SMALL[3]
    q = q * s + _TANH_SMALL[2]
    q = q * s + _TANH_SMALL[1]
    q = q * s + _TANH_SMALL[0]
    small = x + x * s * q
    large = _with_sign_of(1.0 - 2.0 / (_exp64(2.0 * a) + 1.0), x)  # exp overflow: 2/inf = 0
    small = small if a != 0.0 else x  # the correction's sign would turn -0.0 into +0.0
    return small if a < 0.625 else large


# --- gelu -----------------------------------------------------------------------------------
# The exact gelu as scalar-map writes it (placeholders are plain names, ScalarOp); its CPU form
# is vgelu, whose float32 form computes in float32 without the cancellation of 1 + erf(t) for
# negative x.
GELU_EXPR = "(0.5 * {0} * (1.0 + math.erf({0} * 0.7071067811865476)))"

# bench/lab/fit_vmath.py (float32 coefficients): erf(t) = t + t·P(t²) on |t| < 0.75 (degree
# 5), and erfcx(a) = w·G(u) on [0.75, 10.2], w = 1/(1 + a), u = (w − centre)·scale (degree 9)
_ERF32_SMALL = (
    0.12837916612625122, -0.376126229763031, 0.11283428221940994, -0.02683696523308754,
    0.005118804518133402, -0.0006779764662496746)
_ERFCX32 = (
    0.7644439339637756, 0.14136511087417603, -0.014139094389975071, -0.006287676747888327,
    0.0017441925592720509, 0.00017625547479838133, -0.0002079998521367088, 4.0829261706676334e-05,
    1.2899757166451309e-05, -7.56781537347706e-06)
_ERFCX32_CENTRE, _ERFCX32_SCALE = 0.33035714285714285, 4.148148148148149
_GELU32_SMALL, _GELU32_FAR = 0.75, 10.2


@intrinsic
def _fma32(typingctx, a, b, c):
    """a·b + c rounded once, in float32 (one vfmadd per vector)."""
    if not all(isinstance(v, types.Float) for v in (a, b, c)):
        return None

    def codegen(context, builder, signature, args):
        return builder.fma(*[context.cast(builder, v, t, types.float32)
                             for v, t in zip(args, signature.args)])
    return types.float32(a, b, c), codegen


@njit(inline="always", error_model="numpy")
def _horner32(coefs, u):
    """Σ coefs[i]·uⁱ in float32, one FMA per step from the highest degree down (a constant
    tuple: the steps unroll and the coefficients fold)."""
    p = np.float32(coefs[len(coefs) - 1])
    for i in range(len(coefs) - 2, -1, -1):
        p = _fma32(p, u, coefs[i])
    return p


def vgelu(x):
    """The exact gelu, ``x·Φ(x)``, for compiled kernels; in plain Python, its formula."""
    return 0.5 * x * (1.0 + math.erf(x * 0.7071067811865476))




@njit(inline="always", error_model="numpy")
def _cdf32_times(x, h, top):
    """``top``·Φ(x) with h = ½·top (top: x for the gelu, 1 for Φ), all in float32:
    ½top·(1 + erf(t)), t = x/√2. |t| < 0.75: erf by its odd polynomial. Beyond, erfc(|t|) = exp(−t²)·erfcx(|t|): x − ½x·erfc for x > 0, ½x·erfc for
    x < 0 (never 1 + erf, whose cancellation would lose the negative tail). erfcx is one
    polynomial in w = 1/(1 + |t|), corrected to first order (erfcx' = 2a·erfcx − 2/√π) for
    the rounding of w and of |t| (t is carried as th + tl); t² is sh + sl (exact square by
    FMA), exp(−sh − sl) kept as q·2^k1·2^k2 so that the tail is rounded once, down to
    subnormal results."""
    one = np.float32(1.0)
    th = x * np.float32(0.70710677)
    tl = _fma32(x, np.float32(0.70710677), -th) + x * np.float32(1.2101617e-08)
    a = abs(th)
    s = th * th
    p = _horner32(_ERF32_SMALL, s)
    small = _fma32(h, one + th, h * _fma32(th, p, tl))  # ½x·(1 + t) + ½x·(t·P + tl)
    small = small if small != np.float32(0.0) else h  # x = -2⁻¹⁴⁹: -0.0, as the formula
    ac = min(max(a, np.float32(_GELU32_SMALL)), np.float32(_GELU32_FAR))  # keeps the unused branch finite
    d = ac + one
    w = one / d
    u = _fma32(w, np.float32(_ERFCX32_SCALE), np.float32(-_ERFCX32_CENTRE * _ERFCX32_SCALE))
    g = _horner32(_ERFCX32, u) * w  # erfcx(1/w − 1)
    tla = tl if th >= np.float32(0.0) else -tl  # |t| = ac + tla
    e = _fma32(-w, d, one) - w * (ac + (one - d))  # 1 − w·(1 + ac), exactly: w's rounding
    g = g - _fma32(np.float32(2.0) * ac, g, np.float32(-1.1283792)) * (e * d - tla)
    sh = ac * ac
    sl = _fma32(ac, ac, -sh) + np.float32(2.0) * ac * tla
    n = np.floor(sh * np.float32(-1.442695) + np.float32(0.5))  # exp(−sh − sl) = q·2^n, as
    r = _fma32(n, np.float32(-_LN2_32[0]), -sh)  # _exp32_reduced with sl in r and FMA steps
    r = _fma32(n, np.float32(-_LN2_32[1]), r) - sl
    q = _horner32(_EXP32_TAYLOR, r)
    k = np.int32(n)  # sh <= 104.04: k >= -150, so 2^k1 and 2^k2 are normal
    k1 = k >> 1
    scaled = q * _pow2_32(k1) * g  # erfc(|t|) / 2^k2
    e2 = _pow2_32(k - k1)
    tail = (top - h * (scaled * e2)) if x > np.float32(0.0) else (h * scaled) * e2
    far = (top if x > np.float32(0.0) else h * np.float32(0.0))  # gelu(-inf): NaN, as the formula
    tail = far if a > np.float32(_GELU32_FAR) else tail
    return small if a < np.float32(_GELU32_SMALL) else tail


@njit(inline="always", error_model="numpy")
def _gelu32(x):
    """x·Φ(x) in float32 (_cdf32_times)."""
    return _cdf32_times(x, np.float32(0.5) * x, x)


@njit(inline="always", error_model="numpy")
def _phi32(x):
    """Φ(x), the normal CDF, in float32 (_cdf32_times): no cancellation in the negative tail."""
    return _cdf32_times(x, np.float32(0.5), np.float32(1.0))


@njit(inline="always", error_model="numpy")
def _erf32(x):
    return np.float32(_erf64(np.float64(x)))


@njit(inline="always", error_model="numpy")
def _tanh32(x):
    return np.float32(_tanh64(np.float64(x)))


@njit(inline="always", error_model="numpy")
def _gelu64(x):
    return 0.5 * x * (1.0 + _erf64(x * 0.7071067811865476))


def vgelu_grad(x):
    """The exact gelu's derivative, Φ(x) + x·φ(x), for compiled kernels (x·φ(x) taken as 0
    beyond |x| = 40, so that ±inf gives 1 and 0, not inf·0); in plain Python, its formula."""
    tail = x * 0.3989422804014327 * math.exp(-0.5 * x * x) if abs(x) < 40.0 else 0.0
    return 0.5 * (1.0 + math.erf(x * 0.7071067811865476)) + tail


@njit(inline="always", error_model="numpy")
def _gelu_grad32(x):
    """vgelu_grad in float32: Φ by _phi32 (the float64 erf that a literal's promotion would
    take runs 3x slower, the gelu's backward epilogue over its GEMM)."""
    sh = x * x
    sl = _fma32(x, x, -sh)  # x² = sh + sl exactly: exp(-sh/2)·(1 - sl/2), not exp of a rounded x²
    e = _exp32(np.float32(-0.5) * sh) * (np.float32(1.0) - np.float32(0.5) * sl)
    tail = x * np.float32(0.3989422804014327) * e
    return _phi32(x) + (tail if abs(x) < np.float32(40.0) else np.float32(0.0))


@njit(inline="always", error_model="numpy")
def _gelu_grad64(x):
    tail = x * 0.3989422804014327 * _exp64(-0.5 * x * x)
    return 0.5 * (1.0 + _erf64(x * 0.7071067811865476)) + (tail if abs(x) < 40.0 else 0.0)


_by_precision(vexp, _exp32, _exp64, inline="never")
_by_precision(verf, _erf32, _erf64)
_by_precision(vtanh, _tanh32, _tanh64)
_by_precision(vgelu, _gelu32, _gelu64)
_by_precision(vgelu_grad, _gelu_grad32, _gelu_grad64)


# The same formulas compiled as written, with libm's erf and exp: ``_vgelu`` and
# ``_vgelu_grad`` in a module over :data:`MAX_INLINED` (LIBM_IMPORT)
gelu_libm = njit(inline="always", error_model="numpy")(vgelu)
gelu_grad_libm = njit(inline="always", error_model="numpy")(vgelu_grad)


def inlined_calls(lines: Iterable[str]) -> int:
    """How many calls of the inlined helpers (erf, tanh, gelu, log, log1p) ``lines`` hold."""
    return _inlined_in("\n".join(lines))


def _inlined_in(text: str) -> int:
    return sum(text.count(call) for call in _INLINED)  # (one scan per helper, not per line)


def with_imports(lines: list[str]) -> list[str]:
    """A generated module's lines (holding :data:`IMPORT`, and code calling the helpers of
    :data:`CPU_HELPERS`) with what else they need: :data:`LOG_IMPORT` after :data:`IMPORT`
    when the code calls ``_vlog`` or ``_vlog1p``, or, when it holds more than
    :data:`MAX_INLINED` calls of inlined helpers, :data:`LIBM_IMPORT` in place of
    :data:`IMPORT` (the same names, bound to libm's functions)."""
    text = "\n".join(lines)
    if _inlined_in(text) > MAX_INLINED:
        at = lines.index(IMPORT)
        return lines[:at] + list(LIBM_IMPORT) + lines[at + 1:]
    if not ("_vlog(" in text or "_vlog1p(" in text) or LOG_IMPORT in lines:
        return lines
    at = lines.index(IMPORT) + 1
    return lines[:at] + [LOG_IMPORT] + lines[at:]
