"""Half-precision conversions (float16/bfloat16 <-> float32) as kernels over integer views
(uint16 <-> float32 bits as uint32): Numba has no half type, on the CPU or on CUDA. The
planner's half rule (runtime.plan.halves) places them; this is the scalar conversion that the
CPU kernels (runtime.kernels.halfconv_cpu) and the CUDA kernel (runtime.kernels.halfconv_cuda)
compile, each in a module of its own imported when a plan needs it: the planner imports this
one without numba."""
from __future__ import annotations

import numpy as np

# conversion kinds, as the kernels take them
F16_TO_F32, F32_TO_F16, BF16_TO_F32, F32_TO_BF16 = 0, 1, 2, 3


# --- scalar conversions (plain Python, compiled by Numba for the CPU and for CUDA devices) -----
def f16_bits_to_f32_bits(h):
    """float16 bits -> float32 bits, exactly (subnormals normalised, NaN payload kept)."""
    h = int(h)
    sign = (h & 0x8000) << 16
    exp = (h >> 10) & 0x1F
    man = h & 0x3FF
    if exp == 0x1F:
        return sign | 0x7F800000 | (man << 13)
    if exp != 0:
        return sign | ((exp + 112) << 23) | (man << 13)
    if man == 0:
        return sign
    e = 113  # a subnormal man·2^-24: shift its leading bit up to the implicit one
    while (man & 0x400) == 0:
        man <<= 1
        e -= 1
    return sign | (e << 23) | ((man & 0x3FF) << 13)


def f32_bits_to_f16_bits(x):
    """float32 bits -> float16 bits: round to nearest even, overflow to ±inf, NaN stays NaN."""
    x = int(x)
    sign = (x >> 16) & 0x8000
    a = x & 0x7FFFFFFF
    if a > 0x7F800000:  # NaN: the payload's top bits, never zero (as NumPy's astype)
        return sign | 0x7C00 | max((a >> 13) & 0x3FF, 1)
    if a >= 0x477FF000:  # |x| >= 65520 rounds past the largest half: ±inf
        return sign | 0x7C00
    if a >= 0x38800000:  # a normal half: rebias, round at bit 13
        m = a - 0x38000000
        return sign | ((m + 0xFFF + ((m >> 13) & 1)) >> 13)
    if a < 0x33000000:  # below half the smallest subnormal: ±0
        return sign
    shift = 126 - (a >> 23)  # a subnormal half: units of 2^-24
    mant = (a & 0x7FFFFF) | 0x800000
    return sign | ((mant + (1 << (shift - 1)) - 1 + ((mant >> shift) & 1)) >> shift)


def bf16_bits_to_f32_bits(h):
    """bfloat16 bits -> float32 bits (bfloat16 is float32's upper half)."""
    return int(h) << 16


def f32_bits_to_bf16_bits(x):
    """float32 bits -> bfloat16 bits: round to nearest even (carries into ±inf); a NaN becomes
    the quiet NaN of its sign (as ml_dtypes' astype)."""
    x = int(x)
    if (x & 0x7FFFFFFF) > 0x7F800000:
        return ((x >> 16) & 0x8000) | 0x7FC0
    return (x + 0x7FFF + ((x >> 16) & 1)) >> 16


_SCALAR = (f16_bits_to_f32_bits, f32_bits_to_f16_bits, bf16_bits_to_f32_bits, f32_bits_to_bf16_bits)


def scalar_conversion(compile_):
    """``one(bits, kind)``: the conversion ``kind`` of one element, compiled by ``compile_``
    (kind is loop-invariant in the callers, so the compiler hoists the branch)."""
    w16, n16, wbf, nbf = (compile_(f) for f in _SCALAR)

    def one(v, kind):
        if kind == 0:
            return w16(v)
        if kind == 1:
            return n16(v)
        if kind == 2:
            return wbf(v)
        return nbf(v)
    return compile_(one)


def _views(src, dst, kind: int):
    """The integer views the kernels read and write."""
    widen = kind in (F16_TO_F32, BF16_TO_F32)
    return src.view(np.uint16 if widen else np.uint32), dst.view(np.uint32 if widen else np.uint16)
