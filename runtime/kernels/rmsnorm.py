"""The RMS-norm row kernel (runtime.plan.rmsnorm): each row of ``x`` (its last axis, C order)
read twice while it is in L1 (its sum of squares, then the scaled row) instead of the three
passes over memory and the [rows, D] square that the unfused plan writes.

Per row r of n: ``inv = rsqrt(Σ x² / n + c[r])`` and ``out = (x · inv) · g`` (``g`` only
when ``has_g``), every step rounded in the rows' dtype as the unfused instructions round it; the
squares are summed in lanes of explicit vectors, then the lanes pairwise, so a row's result does
not depend on the thread or the slice that computes it. rsqrt follows the scalar-map mode: +inf
at 0 and NaN below, and IEEE values propagate (a NaN or ±inf in a row makes its sum non-finite).
"""
from __future__ import annotations

import math

import numpy as np
from numba import njit, prange

from runtime.kernels import simd
from runtime.kernels.twins import Twins

# below this many elements one thread is cheaper than waking the others
PARALLEL_MIN_ELEMENTS = 1 << 16


def parallel_rows(count: int, elements: int) -> bool:
    return count > 1 and elements >= PARALLEL_MIN_ELEMENTS


def _row(dt: str):
    """The kernel of one row in ``dt``'s vectors (inlined into its callers)."""
    o = simd.ops(dt, wide=True)
    vload, vstore, vbcast, vzero, vhsum, vadd, vmul = (o[k] for k in ("load", "store", "bcast", "zero", "hsum",
                                                                       "add", "mul"))
    lanes = simd.lanes(dt, wide=True)
    T = np.float32 if dt == "float32" else np.float64

    @njit(inline="always", nogil=True)
    def row(x, c, g, has_g, out, n, r):
        base = r * n
        acc = vzero()
        k = 0
        while k + lanes <= n:
            xv = vload(x, base + k)
            acc = vadd(acc, vmul(xv, xv))
            k += lanes
        s = vhsum(acc)
        for t in range(k, n):
            s += x[base + t] * x[base + t]
        e = s / T(n) + c[r]
        if e > 0:
            inv = T(1.0 / math.sqrt(e))
        elif e == 0:
            inv = T(math.copysign(math.inf, e))
        else:
            inv = T(math.nan)
        iv = vbcast(inv)
        k = 0
        if has_g:
            while k + lanes <= n:
                vstore(out, base + k, vmul(vmul(vload(x, base + k), iv), vload(g, k)))
                k += lanes
            for t in range(k, n):
                out[base + t] = (x[base + t] * inv) * g[t]
        else:
            while k + lanes <= n:
                vstore(out, base + k, vmul(vload(x, base + k), iv))
                k += lanes
            for t in range(k, n):
                out[base + t] = x[base + t] * inv

    return row


_row_f32, _row_f64 = _row("float32"), _row("float64")


# The callers are plain module-level functions that name their row kernel as a global: Numba's
# disk cache keys a function by its code and the pickled values it closes over, and a closure
# over a dispatcher pickles differently in every process (it would compile again in each one).
@njit(cache=True, nogil=True)
def rms_rows_f32_serial(x, c, g, has_g, out, n, count):
    for r in range(count):
        _row_f32(x, c, g, has_g, out, n, r)


@njit(cache=True, nogil=True, parallel=True)
def rms_rows_f32_parallel(x, c, g, has_g, out, n, count):
    for r in prange(count):
        _row_f32(x, c, g, has_g, out, n, r)


@njit(cache=True, nogil=True)
def rms_rows_f64_serial(x, c, g, has_g, out, n, count):
    for r in range(count):
        _row_f64(x, c, g, has_g, out, n, r)


@njit(cache=True, nogil=True, parallel=True)
def rms_rows_f64_parallel(x, c, g, has_g, out, n, count):
    for r in prange(count):
        _row_f64(x, c, g, has_g, out, n, r)


ROWS = {"float32": Twins(rms_rows_f32_serial, rms_rows_f32_parallel),
        "float64": Twins(rms_rows_f64_serial, rms_rows_f64_parallel)}
