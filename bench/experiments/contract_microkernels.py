"""Micro-kernel tiles (atoms._microgemm) against BLAS tiles, side by side in one process, on one
thread: the contract kernel alone (no epilogue), one row tile of each of the seed's products.

    NUMBA_NUM_THREADS=1 python bench/experiments/contract_microkernels.py
"""
import time

import numpy as np

from atoms import _microgemm as micro
from atoms.contract import SPECS
from runtime.atomspec import bind_node
from runtime.types import TensorType

CONTRACT = SPECS[0]
SHAPES = {"x·Aᵀ tile [128,1024]x[1024,32]": (128, 1024, 32), "h·Bᵀ tile [64,32]x[32,1024]": (64, 32, 1024),
          "h·Bᵀ seed T=8192 [8192,32]x[32,1024]": (8192, 32, 1024)}


def kernel(m, k, n, form):
    node = bind_node(CONTRACT, {"reduce_axes": [["k", "k"]], "output_axes": ["i", "j"],
                                "accumulation_dtype": "float32"},
                     [TensorType(("i", "k"), (m, k), "float32", "d"), TensorType(("j", "k"), (n, k), "float32", "d")])
    saved = micro.choose_form
    micro.choose_form = lambda *dims: form
    try:
        return CONTRACT.kernels["cpu"](node)
    finally:
        micro.choose_form = saved


def main():
    rng = np.random.default_rng(0)
    for label, (m, k, n) in SHAPES.items():
        a, b = rng.standard_normal((m, k), np.float32), rng.standard_normal((n, k), np.float32)
        form = micro.choose_form(1, 1 << 20, n, k)
        runs = {"BLAS": kernel(m, k, n, None), form: kernel(m, k, n, form)}
        outs = {name: np.empty((m, n), np.float32) for name in runs}
        times = {name: [] for name in runs}
        reps = max(1, 2_000_000 // (m * n * k // 64 + 1))
        for name, run in runs.items():
            run([a, b], outs[name])
        np.testing.assert_allclose(outs[form], outs["BLAS"], rtol=1e-4, atol=1e-3)
        for _ in range(60):
            for name, run in runs.items():
                t0 = time.perf_counter()
                for _ in range(reps):
                    run([a, b], outs[name])
                times[name].append((time.perf_counter() - t0) / reps)
        line = ", ".join(f"{name} {np.median(v) * 1e6:.1f} us ({2 * m * n * k / np.median(v) / 1e9:.1f} GFLOP/s)"
                         for name, v in times.items())
        print(f"{label}: {line}", flush=True)


if __name__ == "__main__":
    main()
