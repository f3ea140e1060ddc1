"""scatter@2's CPU kernels side by side on an embedding's gradient, in one process: the row
kernel (``SCATTER_ADD``, a row of the updates per coordinate of the other axes, walking the
index axis) against blocks of contiguous rows (``SCATTER_ADD_INNER``), both parallel, into a
kept output that already holds the base; medians of repeated calls, and the bits compared.

    python bench/lab/scatter_rows.py [--vocab 4096] [--width 512] [--rows 512] [--reps 50]
"""
from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from atoms.scatter_add import SCATTER_ADD, SCATTER_ADD_INNER  # noqa: E402


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--vocab", type=int, default=4096)
    p.add_argument("--width", type=int, default=512)
    p.add_argument("--rows", type=int, default=512)
    p.add_argument("--reps", type=int, default=50)
    args = p.parse_args()
    v, d, n = args.vocab, args.width, args.rows
    rng = np.random.default_rng(0)
    base = rng.standard_normal((v, d)).astype(np.float32)
    idx = rng.integers(0, v, n)
    upd = rng.standard_normal((n, d)).astype(np.float32).reshape(-1)
    shape, strides = np.array([d], np.int64), np.array([[1], [0], [1]], np.int64)
    offsets = np.zeros(3, np.int64)
    calls = {
        "rows": lambda out: SCATTER_ADD.parallel(upd, idx, out, shape, strides, offsets, d, 1, d, n, v, d),
        "blocks": lambda out: SCATTER_ADD_INNER.parallel(upd, idx, out, 0, 0, d, 1, d, n, v, d),
    }
    got = {}
    for name, call in calls.items():
        out = base.reshape(-1).copy()
        call(out)  # (compiles)
        times = []
        for _ in range(args.reps):
            np.copyto(out, base.reshape(-1))
            started = time.perf_counter()
            call(out)
            times.append((time.perf_counter() - started) * 1e3)
        got[name] = out
        print(f"{name:6}  {statistics.median(times):.3f} ms a call (the additions only)")
    print("same bits:", np.array_equal(got["rows"], got["blocks"]))


if __name__ == "__main__":
    main()
