"""The float32 exact gelu's error over every float32 of a range: the largest distance, in ulp
of the result, between ``runtime.kernels.vmath.vgelu`` (compiled, as generated kernels call it)
and x·Φ(x) evaluated in float64 through scipy's erfc (tests/test_vmath.py's oracle). The
ranges are those the vmath docstring states bounds for; tests/test_vmath.py checks every 7th
float32 of the negative tail and a sample of the rest.

    python bench/lab/gelu_ulp.py [--range LO HI ...]
"""
from __future__ import annotations

import argparse
import importlib.util
import sys
from pathlib import Path

import numpy as np
from numba import njit

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))
from runtime.kernels.vmath import vgelu  # noqa: E402

RANGES = ((-15.5, -1.0), (-1.0, -1e-30), (1e-30, 1.0), (1.0, 10.0))
CHUNK = 1 << 22


@njit(error_model="numpy")
def _gelu(x, out):
    for i in range(x.size):
        out[i] = vgelu(x[i])


def _oracle():
    spec = importlib.util.spec_from_file_location("test_vmath", REPO / "tests" / "test_vmath.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module._gelu_exact, module._ulp_error


def every_float32(lo: float, hi: float):
    """Every float32 in [lo, hi], in chunks (by bit pattern, each sign's half separately)."""
    halves = ([(lo, min(hi, -0.0))] if lo < 0 else []) + ([(max(lo, 0.0), hi)] if hi >= 0 else [])
    for a, b in halves:
        ends = sorted(np.array([a, b], np.float32).view(np.int32).tolist())
        for start in range(ends[0], ends[1] + 1, CHUNK):
            yield np.arange(start, min(start + CHUNK, ends[1] + 1), dtype=np.int32).view(np.float32)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--range", nargs=2, type=float, action="append", metavar=("LO", "HI"))
    args = p.parse_args()
    exact, ulp_error = _oracle()
    for lo, hi in args.range or RANGES:
        worst, count = 0.0, 0
        for x in every_float32(lo, hi):
            got = np.empty_like(x)
            _gelu(x, got)
            worst, count = max(worst, ulp_error(got, exact(x))), count + x.size
        print(f"[{lo}, {hi}]: {count} float32 values, within {worst:.2f} ulp")


if __name__ == "__main__":
    main()
