"""libm against runtime.kernels.vmath in a compiled loop, side by side in one process:
exact gelu (the formula with ``math.erf``, with ``verf``, and ``vgelu``, which generated CPU
kernels use), ``tanh`` (``math.tanh`` / ``vtanh``), float32 and float64, 2^20 elements
N(0, 4), interleaved, medians in ns per element.

    python bench/tools/vmath_ab.py [--reps 7]
"""
from __future__ import annotations

import argparse
import math
import sys
import time
from pathlib import Path

import numpy as np
from numba import njit

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from runtime.kernels.vmath import verf, vgelu, vtanh  # noqa: E402


@njit(error_model="numpy")
def gelu_libm(x, o):
    for i in range(x.size):
        o[i] = 0.5 * x[i] * (1.0 + math.erf(x[i] * 0.7071067811865476))


@njit(error_model="numpy")
def gelu_vmath(x, o):
    for i in range(x.size):
        o[i] = 0.5 * x[i] * (1.0 + verf(x[i] * 0.7071067811865476))


@njit(error_model="numpy")
def gelu_vgelu(x, o):
    for i in range(x.size):
        o[i] = vgelu(x[i])


@njit(error_model="numpy")
def tanh_libm(x, o):
    for i in range(x.size):
        o[i] = math.tanh(x[i])


@njit(error_model="numpy")
def tanh_vmath(x, o):
    for i in range(x.size):
        o[i] = vtanh(x[i])


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--reps", type=int, default=7)
    args = p.parse_args()
    fns = (gelu_libm, gelu_vmath, gelu_vgelu, tanh_libm, tanh_vmath)
    for dt in (np.float32, np.float64):
        x = (np.random.default_rng(0).standard_normal(1 << 20) * 2).astype(dt)
        o = np.empty_like(x)
        times: dict[str, list[float]] = {f.__name__: [] for f in fns}
        for f in fns:
            f(x, o)
        for _ in range(args.reps):
            for f in fns:
                t = time.perf_counter()
                f(x, o)
                times[f.__name__].append(time.perf_counter() - t)
        ns = {k: np.median(v) * 1e9 / x.size for k, v in times.items()}
        print(f"{np.dtype(dt).name}: " + ", ".join(f"{k} {v:.2f} ns" for k, v in ns.items())
              + f"; gelu {ns['gelu_libm'] / ns['gelu_vmath']:.1f}x (verf), {ns['gelu_libm'] / ns['gelu_vgelu']:.1f}x"
              f" (vgelu), tanh {ns['tanh_libm'] / ns['tanh_vmath']:.1f}x")


if __name__ == "__main__":
    main()
