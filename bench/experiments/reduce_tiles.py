"""The reduce atom's cpu kernel (atoms.reduce) side by side over task counts and tile widths,
calls interleaved, medians in ms: a float32 [1024, 1024] value summed over its last axis
(rows side by side) and over its first (tiles of accumulators), and NumPy's sum for scale.
Behind ``INNER_BLOCK``, ``MIN_INNER_BLOCK`` and the parallel split.

    python bench/experiments/reduce_tiles.py [reps]
"""
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

import atoms.reduce as reduce_atom  # noqa: E402

CONFIGS = [(False, 1, 1024), (True, 2, 1024), (True, 8, 1024), (True, 2, 512), (True, 8, 128)]  # parallel, tasks, tile


def main(reps: int) -> None:
    x = np.random.default_rng(0).standard_normal((1024, 1024)).astype(np.float32)
    flat = x.reshape(-1)
    for shape, axis in (((1024, 1024, 1), 1), ((1, 1024, 1024), 0)):
        out = np.empty(shape[0] * shape[2], np.float32)
        times = {c: [] for c in CONFIGS}
        for c in CONFIGS:
            reduce_atom._cpu_kernel(c[0])(flat, out, *shape, c[2], c[1])
        for _ in range(reps):
            for c in CONFIGS:
                t0 = time.perf_counter()
                reduce_atom._cpu_kernel(c[0])(flat, out, *shape, c[2], c[1])
                times[c].append(time.perf_counter() - t0)
        t0 = time.perf_counter()
        for _ in range(reps):
            x.sum(axis=axis)
        numpy_ms = (time.perf_counter() - t0) / reps * 1e3
        cells = ", ".join(f"{'parallel' if p else 'serial'} {n} task(s) of tile {b}: {np.median(v) * 1e3:.3f}"
                          for (p, n, b), v in times.items())
        print(f"[outer, K, inner] = {list(shape)}: {cells}; NumPy sum(axis={axis}) {numpy_ms:.3f} ms")


if __name__ == "__main__":
    main(int(sys.argv[1]) if len(sys.argv) > 1 else 300)
