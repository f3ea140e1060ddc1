"""ns an element of each scalar-map mode on cpu, beside a plain copy's: a [T, F] float32
``scalar-map`` alone (its own chain kernel, on Numba's threads), written into a caller's ``out``,
median of repeated runs after the compiled driver builds.

    python bench/lab/scalar_map_rate.py [--shape 4096,4096] [--reps 30]

Near relu's rate a mode is memory-bound; far above it, its arithmetic decides.
"""
from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))


def main() -> None:
    import runtime
    from atoms.elementwise import MODES
    from runtime.testing import ProgramBuilder

    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--shape", default="4096,4096")
    p.add_argument("--reps", type=int, default=30)
    args = p.parse_args()
    t, f = (int(v) for v in args.shape.split(","))
    x = np.random.default_rng(0).standard_normal((t, f), dtype=np.float32)
    out = np.empty_like(x)
    for mode in MODES:
        b = ProgramBuilder("float32")
        y = b.op("scalar-map", [b.input("x", {"T": t, "F": f})], {"mode": mode})
        exe = runtime.compile(b.build([y]), "cpu", tiered=False)
        for _ in range(12):  # (the kernel compiles on the first run, the driver after a few)
            exe.run(inputs={"x": x}, out={y: out})
        exe.wait_compiled()
        times = []
        for _ in range(args.reps):
            started = time.perf_counter()
            exe.run(inputs={"x": x}, out={y: out})
            times.append(time.perf_counter() - started)
        ms = statistics.median(times) * 1e3
        print(f"{mode:8s} {ms:8.3f} ms  {ms * 1e6 / x.size:6.3f} ns an element")


if __name__ == "__main__":
    main()
