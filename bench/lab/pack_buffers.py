"""The blocked tile's right-operand packing (``micro.pack_module``'s ``pack_right``, which
allocates its panels in every call) against the same panel copy into a buffer kept between
calls, and into a fresh NumPy array, in one process: what fresh pages cost a large pack (the
MLP backward's dW2 packs a [4096, 4096] operand in every call).

    python bench/lab/pack_buffers.py [--shapes 4096,4096 1024,4096] [--reps 7]
"""
from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import numpy as np
from numba import njit, prange

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from atoms.contract import micro  # noqa: E402

NR = micro.blocked_nr("float32")


@njit(parallel=True, nogil=True)
def pack_into(bm, k, n, ldb, bp):
    """``pack_right``'s panels of a row-major [k, n] operand (its ``tb == 0`` case) into ``bp``."""
    npan = (n + NR - 1) // NR
    for p in prange(npan):
        j0 = p * NR
        pw = min(n, j0 + NR) - j0
        base = np.uint64(p * k * NR)
        for kk in range(k):
            dst = base + np.uint64(kk * NR)
            src = np.uint64(kk * ldb + j0)
            for j in range(np.uint64(pw)):
                bp[dst + j] = bm[src + j]
            for j in range(np.uint64(pw), np.uint64(NR)):
                bp[dst + j] = 0
    return bp


def median_ms(fn, reps: int) -> float:
    fn()
    times = []
    for _ in range(reps):
        started = time.perf_counter()
        fn()
        times.append((time.perf_counter() - started) * 1e3)
    return statistics.median(times)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--shapes", nargs="*", default=["4096,4096", "1024,4096", "4096,1024"], help="K,N ...")
    p.add_argument("--reps", type=int, default=7)
    args = p.parse_args()
    module = micro.pack_module("float32", "blocked")
    for k, n in (tuple(int(v) for v in s.split(",")) for s in args.shapes):
        b = np.random.default_rng(0).random((k, n), np.float32).reshape(-1)
        size = k * ((n + NR - 1) // NR * NR)
        kept = np.empty(size, np.float32)
        assert np.array_equal(module.pack_right(b, 1, k, n, 0, n, 0, 1), pack_into(b, k, n, n, kept))
        allocating = median_ms(lambda: module.pack_right(b, 1, k, n, 0, n, 0, 1), args.reps)
        into_kept = median_ms(lambda: pack_into(b, k, n, n, kept), args.reps)
        into_fresh = median_ms(lambda: pack_into(b, k, n, n, np.empty(size, np.float32)), args.reps)
        print(f"[{k}, {n}] ({size * 4 >> 20} MiB): pack_right {allocating:.2f} ms, into a kept buffer "
              f"{into_kept:.2f} ms, into a fresh NumPy array {into_fresh:.2f} ms")


if __name__ == "__main__":
    main()
