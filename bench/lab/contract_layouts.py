"""The contraction kernel on one matmul shape in three layouts, alternating runs in one process:
NT (``x[S, D]·w[F, D]``, a forward projection), NN (``g[S, F]·w[F, D]``, a backward data
gradient) and TN (``g[S, F]ᵀ·x[S, D]``, a weight gradient: the reduced axis leads both
operands), then NumPy's (OpenBLAS) ``gᵀ @ x`` on its own (after ours: OpenBLAS's woken threads
would slow Numba's, PERFORMANCE-FACTS "the trap").

    python bench/lab/contract_layouts.py 4096 1024 4096     # S D F
"""
from __future__ import annotations

import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
import runtime  # noqa: E402
from runtime.build import ProgramBuilder  # noqa: E402

ATTRS = {"accumulation_dtype": "float32"}


def program(kind: str, S: int, D: int, F: int) -> dict:
    b = ProgramBuilder("float32")
    if kind == "NT":
        x, w = b.input("x", {"S": S, "D": D}), b.input("w", {"F": F, "D": D})
        y = b.op("contract", [x, w], {"reduce_axes": [["D", "D"]], "output_axes": ["S", "F"], **ATTRS})
    elif kind == "NN":
        x, w = b.input("x", {"S": S, "F": F}), b.input("w", {"F": F, "D": D})
        y = b.op("contract", [x, w], {"reduce_axes": [["F", "F"]], "output_axes": ["S", "D"], **ATTRS})
    else:
        x, w = b.input("x", {"S": S, "F": F}), b.input("w", {"S": S, "D": D})
        y = b.op("contract", [x, w], {"reduce_axes": [["S", "S"]], "output_axes": ["F", "D"], **ATTRS})
    return b.build([y])


def main(S: int, D: int, F: int, reps: int = 15) -> None:
    rng = np.random.default_rng(0)
    cases = {}
    for kind in ("NT", "NN", "TN"):
        p = runtime.load_program(program(kind, S, D, F))
        values = {b.name: rng.standard_normal(b.value_type.shape).astype(np.float32) for b in p.bindings}
        exe = runtime.compile(p, "cpu", tiered=False)
        for _ in range(10):  # past the compiled driver's build
            exe.run(inputs=values)
        exe.wait_compiled()
        cases[kind] = (exe, values)
    g, x = rng.standard_normal((S, F)).astype(np.float32), rng.standard_normal((S, D)).astype(np.float32)
    times: dict[str, list[float]] = {k: [] for k in (*cases, "numpy TN")}
    for _ in range(reps):
        for kind, (exe, values) in cases.items():
            t = time.perf_counter()
            exe.run(inputs=values)
            times[kind].append(time.perf_counter() - t)
    for _ in range(reps):
        t = time.perf_counter()
        g.T @ x
        times["numpy TN"].append(time.perf_counter() - t)
    flops = 2 * S * D * F
    for kind, ts in times.items():
        m = float(np.median(ts))
        print(f"{kind:9s} {m * 1e3:8.2f} ms  {flops / m / 1e9:6.1f} GFLOP/s")


if __name__ == "__main__":
    main(*(int(v) for v in sys.argv[1:4]))
