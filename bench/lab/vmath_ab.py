"""libm against runtime.kernels.vmath in a compiled loop, side by side in one process:
exact gelu (the formula with ``math.erf``, with ``verf``, and ``vgelu``, which generated CPU
kernels use), gelu's derivative (the float64 chain that the expression's float64 literals start,
with ``verf`` and ``vexp``, and ``vgelu_grad``, the gelu-vjp's CPU form), ``tanh`` (``math.tanh`` / ``vtanh``), softplus (scalar-map@2's expression with
``math.log1p(math.exp(x))`` / ``vlog1p(vexp(x))``) and ``log`` of |x| (``math.log`` /
``vlog``), float32 and float64, 2^20 elements N(0, 4), interleaved, medians in ns per
element. Then the silu chain ``base + silu(x)`` written into a third array and written in
place of ``base`` (the planner's in-place reuse): read as a second array that overlaps the
output, the loop runs its scalar path, and read through the output it vectorises again
(``KernelRequest.output_extras``).

    python bench/lab/vmath_ab.py [--reps 7]
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
from runtime.kernels.vlog import vlog, vlog1p  # noqa: E402
from runtime.kernels.vmath import verf, vexp, vgelu, vgelu_grad, vtanh  # noqa: E402


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
def gelu_grad_promoted(x, o):
    for i in range(x.size):
        v = x[i]
        o[i] = 0.5 * (1.0 + verf(0.7071067811865476 * v)) + (
            (v * 0.3989422804014327 * vexp(-0.5 * v * v)) if abs(v) < 40.0 else 0.0)


@njit(error_model="numpy")
def gelu_grad_vmath(x, o):
    for i in range(x.size):
        o[i] = vgelu_grad(x[i])


@njit(error_model="numpy")
def tanh_libm(x, o):
    for i in range(x.size):
        o[i] = math.tanh(x[i])


@njit(error_model="numpy")
def tanh_vmath(x, o):
    for i in range(x.size):
        o[i] = vtanh(x[i])


@njit(error_model="numpy")
def softplus_libm(x, o):
    for i in range(x.size):
        o[i] = x[i] if x[i] > 20.0 else math.log1p(math.exp(x[i]))


@njit(error_model="numpy")
def softplus_vmath(x, o):
    for i in range(x.size):
        o[i] = x[i] if x[i] > 20.0 else vlog1p(vexp(x[i]))


@njit(error_model="numpy")
def log_libm(x, o):
    for i in range(x.size):
        o[i] = math.log(abs(x[i]))


@njit(error_model="numpy")
def log_vmath(x, o):
    for i in range(x.size):
        o[i] = vlog(abs(x[i]))


@njit(error_model="numpy")
def silu_into(x, base, o):
    """o = base + silu(x): ``base`` read as its own array (o may be base's memory)."""
    for i in range(x.size):
        v = x[i]
        o[i] = base[i] + v / (1.0 + vexp(-v))


@njit(error_model="numpy")
def silu_through_out(x, o):
    """o = o + silu(x): the operand in o's memory read through o."""
    for i in range(x.size):
        v = x[i]
        o[i] = o[i] + v / (1.0 + vexp(-v))


def aliasing(reps: int) -> None:
    x = (np.random.default_rng(1).standard_normal(1 << 20) * 2).astype(np.float32)
    base, o = np.ones_like(x), np.empty_like(x)
    cases = {"into a third array": lambda: silu_into(x, base, o), "in place, read as its own array":
             lambda: silu_into(x, o, o), "in place, read through the output": lambda: silu_through_out(x, o)}
    times: dict[str, list[float]] = {k: [] for k in cases}
    for f in cases.values():
        f()
    for _ in range(reps):
        for k, f in cases.items():
            t = time.perf_counter()
            f()
            times[k].append(time.perf_counter() - t)
    print("float32 base + silu(x): " + ", ".join(f"{k} {np.median(v) * 1e9 / x.size:.2f} ns"
                                                  for k, v in times.items()))


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--reps", type=int, default=7)
    args = p.parse_args()
    fns = (gelu_libm, gelu_vmath, gelu_vgelu, gelu_grad_promoted, gelu_grad_vmath, tanh_libm, tanh_vmath,
           softplus_libm, softplus_vmath, log_libm, log_vmath)
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
              f" (vgelu), gelu' {ns['gelu_grad_promoted'] / ns['gelu_grad_vmath']:.1f}x (vgelu_grad), "
              f"tanh {ns['tanh_libm'] / ns['tanh_vmath']:.1f}x, softplus "
              f"{ns['softplus_libm'] / ns['softplus_vmath']:.1f}x, log {ns['log_libm'] / ns['log_vmath']:.1f}x")
    aliasing(args.reps)


if __name__ == "__main__":
    main()
