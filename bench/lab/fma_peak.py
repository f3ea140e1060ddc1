"""This core's float32 FMA peak: twelve independent accumulators in registers, no memory
traffic (runtime.kernels.simd vectors, one thread), of 32-byte vectors, then of 64-byte ones
where the CPU has them (the blocked tile's on AVX-512). The ceiling for the micro-kernels' GFLOP/s.

    python bench/lab/fma_peak.py
"""
import time

from numba import njit

from runtime.kernels import simd
from runtime.kernels.simd import bcast_f32x8 as vb, fma_f32x8 as vf, hsum_f32x8 as vh, zero_f32x8 as vz


def _chains(vb, vf, vh, vz):
    @njit(cache=False)
    def chains(n):
        a, b = vb(1.0000001), vb(0.9999999)
        c0, c1, c2, c3, c4, c5 = vz(), vz(), vz(), vz(), vz(), vz()
        c6, c7, c8, c9, c10, c11 = vz(), vz(), vz(), vz(), vz(), vz()
        for _ in range(n):
            c0, c1, c2, c3 = vf(a, b, c0), vf(a, b, c1), vf(a, b, c2), vf(a, b, c3)
            c4, c5, c6, c7 = vf(a, b, c4), vf(a, b, c5), vf(a, b, c6), vf(a, b, c7)
            c8, c9, c10, c11 = vf(a, b, c8), vf(a, b, c9), vf(a, b, c10), vf(a, b, c11)
        return (vh(c0) + vh(c1) + vh(c2) + vh(c3) + vh(c4) + vh(c5) + vh(c6) + vh(c7) + vh(c8) + vh(c9)
                + vh(c10) + vh(c11))

    return chains


def main():
    widths = [(32, (vb, vf, vh, vz))]
    if simd.WIDE_BYTES == 64:
        widths.append((64, (simd.bcast_f32x16, simd.fma_f32x16, simd.hsum_f32x16, simd.zero_f32x16)))
    for nbytes, ops in widths:
        chains = _chains(*ops)
        chains(10)
        n = 10_000_000
        best = min(_timed(chains, n) for _ in range(5))
        lanes = nbytes // 4
        print(f"float32 FMA peak, one core, {nbytes}-byte vectors: {n * 12 * 2 * lanes / best / 1e9:.1f} GFLOP/s "
              f"({n * 12 / best / 1e9:.2f} G vector FMAs/s)")


def _timed(chains, n):
    t0 = time.perf_counter()
    chains(n)
    return time.perf_counter() - t0


if __name__ == "__main__":
    main()
