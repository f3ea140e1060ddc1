"""Serial against parallel loop-nest kernels (runtime.backends.cpu_codegen) by size, side by
side: one-instruction programs (add of two [rows, 1024] float32 inputs, silu of one), the
same executable run with ``PARALLEL_MIN_ELEMENTS`` set before each call so that it takes the
serial or the parallel kernel, calls interleaved; medians in ms. Behind the constant's value.

    python bench/experiments/loop_parallel_threshold.py [reps]
"""
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

import runtime  # noqa: E402
import runtime.backends.cpu_codegen as cg  # noqa: E402
from bench.atom_cases import ACC, _one  # noqa: E402


def main(reps: int) -> None:
    rng = np.random.default_rng(0)
    for mode in ("add", "silu"):
        for rows in (64, 128, 256, 512, 1024):
            shape = {"T": rows, "D": 1024}
            if mode == "add":
                program = _one("add", {"a": shape, "b": shape}, dict(ACC), shape)()
                inputs = {k: rng.standard_normal((rows, 1024), dtype=np.float32) for k in "ab"}
            else:
                program = _one("scalar-map", {"x": shape}, {"mode": "silu"}, shape)()
                inputs = {"x": rng.standard_normal((rows, 1024), dtype=np.float32)}
            exe = runtime.compile(program, "cpu")
            times = {False: [], True: []}
            for parallel in times:  # both kernels compiled and warm
                cg.PARALLEL_MIN_ELEMENTS = 1 if parallel else 1 << 40
                exe.run(inputs=inputs)
            for _ in range(reps):
                for parallel, got in times.items():
                    cg.PARALLEL_MIN_ELEMENTS = 1 if parallel else 1 << 40
                    t0 = time.perf_counter()
                    exe.run(inputs=inputs)
                    got.append(time.perf_counter() - t0)
            print(f"{mode} {rows * 1024} elements: serial {np.median(times[False]) * 1e3:.3f} ms, "
                  f"parallel {np.median(times[True]) * 1e3:.3f} ms")


if __name__ == "__main__":
    main(int(sys.argv[1]) if len(sys.argv) > 1 else 300)
