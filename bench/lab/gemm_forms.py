"""Contraction kernel time per tile form, side by side in one process: the ``blocked``
micro-kernel against BLAS tiles (``choose_form`` forced), over matmul shapes.

    python bench/lab/gemm_forms.py [--threads 1|2] [--reps N] [M,K,N ...]

Prints, per shape, the median time of each form and GFLOP/s (both forms are this runtime's
kernel: one process is fair; OpenBLAS keeps to the calling thread inside it).
"""
from __future__ import annotations

import argparse
import statistics
import time

import numpy as np

SHAPES = ["12,1024,32", "16,1024,32", "32,64,64", "64,64,64", "128,128,128", "64,512,512", "128,512,2048",
          "128,2048,512", "512,512,512", "512,512,2048", "512,2048,512", "2048,1024,1024", "4096,1024,4096",
          "4096,4096,1024"]


def kernel(m: int, k: int, n: int, form, resident: bool):
    from atoms.contract import micro
    from atoms.contract import SPECS
    from runtime.core.types import TensorType
    from runtime.plugins.atomspec import bind_node
    from runtime.plugins.kernel import request_for

    spec = next(s for s in SPECS if s.name == "contract")
    lt, rt = TensorType(("i", "k"), (m, k), "float32", "d"), TensorType(("k", "j"), (k, n), "float32", "d")
    node = bind_node(spec, {"reduce_axes": [["k", "k"]], "output_axes": ["i", "j"],
                            "accumulation_dtype": "float32"}, [lt, rt])
    chosen = micro.choose_form
    micro.choose_form = lambda *dims: form
    try:
        return spec.kernels["cpu"](request_for(node, resident=frozenset({1}) if resident else frozenset()))
    finally:
        micro.choose_form = chosen


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("shapes", nargs="*", default=SHAPES)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--reps", type=int, default=15)
    parser.add_argument("--resident", action="store_true", help="the right operand a resident bank")
    args = parser.parse_args()
    import numba

    numba.set_num_threads(args.threads)
    rng = np.random.default_rng(0)
    print(f"threads={args.threads} resident={args.resident}")
    print(f"{'M,K,N':>16} {'BLAS µs':>10} {'blocked µs':>11} {'GF/s BLAS':>10} {'GF/s blocked':>13} {'ratio':>6}")
    for shape in args.shapes:
        m, k, n = map(int, shape.split(","))
        a, b = rng.standard_normal((m, k), np.float32), rng.standard_normal((k, n), np.float32)
        want = a.astype(np.float64) @ b.astype(np.float64)
        times = {}
        runs = {f: kernel(m, k, n, f, args.resident) for f in (None, "blocked")}
        out = {f: np.empty((m, n), np.float32) for f in runs}
        for f, run in runs.items():
            run([a, b], (), out[f])
            assert np.allclose(out[f], want, rtol=1e-3, atol=1e-3 * np.sqrt(k)), (shape, f)
            times[f] = []
        reps = max(3, min(args.reps, int(2e9 / (2 * m * n * k))))
        for _ in range(reps):  # alternating, so drift hits both
            for f, run in runs.items():
                t = time.perf_counter()
                run([a, b], (), out[f])
                times[f].append(time.perf_counter() - t)
        med = {f: statistics.median(v) for f, v in times.items()}
        gf = {f: 2 * m * n * k / t / 1e9 for f, t in med.items()}
        print(f"{shape:>16} {med[None] * 1e6:10.1f} {med['blocked'] * 1e6:11.1f} {gf[None]:10.1f} "
              f"{gf['blocked']:13.1f} {med[None] / med['blocked']:6.2f}", flush=True)


if __name__ == "__main__":
    main()
