"""NumPy's own product (its OpenBLAS, threaded as it likes) on the seed's two weight-gradient
shapes, in a process that runs no runtime kernel (Numba's threads beside OpenBLAS's slow both):
the yardstick for ``python bench/lab/kleading_forms.py``'s forms.

    python bench/lab/numpy_wgrad.py [--tokens 8192] [--reps 25]
"""
from __future__ import annotations

import argparse
import statistics
import time

import numpy as np


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--tokens", type=int, default=8192)
    p.add_argument("--reps", type=int, default=25)
    args = p.parse_args()
    rng = np.random.default_rng(0)
    g = rng.standard_normal((args.tokens, 1024), dtype=np.float32)  # the output's cotangent, and x
    s = rng.standard_normal((args.tokens, 32), dtype=np.float32)  # the rank-32 activations
    for name, run in ((f"seed dB, T={args.tokens}: g[T,D]ᵀ·s[T,R]", lambda: g.T @ s),
                      (f"seed dA, T={args.tokens}: s[T,R]ᵀ·x[T,D]", lambda: s.T @ g)):
        times = []
        for _ in range(args.reps + 5):
            started = time.perf_counter()
            run()
            times.append((time.perf_counter() - started) * 1e3)
        print(f"{name}: numpy {statistics.median(times[5:]):.3f} ms", flush=True)


if __name__ == "__main__":
    main()
