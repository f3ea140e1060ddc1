"""The seed side by side with one module constant set to each of several values: one
executable per value (its kernels built while the constant has that value), calls
interleaved in one process, each executable checked bitwise against the first; 10th and
50th percentiles in µs. For a tuning constant, or an experiment's switch with its patch
applied (as the experiment patches at commit 1168164 were).

    python bench/lab/ab_constant.py 256 atoms.contract.tiles EPILOGUE_PREFETCH 0,4,8 --reps 2000
    python bench/lab/ab_constant.py 1024 atoms.contract.micro PACK_LEFT_MIN_PANELS 16,1073741824
"""
import argparse
import importlib
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from bench.lab.ab_seed import built, seed_values  # noqa: E402
from runtime.execution.compiled import DRIVER_AFTER_RUNS  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("tokens", type=int)
    parser.add_argument("module")
    parser.add_argument("name")
    parser.add_argument("values", help="comma-separated integers")
    parser.add_argument("--reps", type=int, default=2000)
    args = parser.parse_args()
    module = importlib.import_module(args.module)
    inputs, banks = seed_values(args.tokens)
    values = [int(v) for v in args.values.split(",")]
    exes = {v: built(inputs, banks, module, args.name, v) for v in values}
    first = None
    for v, (exe, run_banks) in exes.items():
        result = exe.run(inputs=inputs, banks=run_banks)["%4"].copy()
        first = result if first is None else first
        assert np.array_equal(result, first), f"{args.name}={v} changes the result"
        for _ in range(DRIVER_AFTER_RUNS):
            exe.run(inputs=inputs, banks=run_banks)
        exe.wait_compiled()  # (the compiled drivers build in the background)
    times = {v: [] for v in values}
    for _ in range(args.reps):
        for v, (exe, run_banks) in exes.items():
            t0 = time.perf_counter()
            exe.run(inputs=inputs, banks=run_banks)
            times[v].append(time.perf_counter() - t0)
    for v, t in times.items():
        t = np.array(t) * 1e6
        print(f"T={args.tokens} {args.name}={v}: p10 {np.percentile(t, 10):.1f}  p50 {np.percentile(t, 50):.1f} µs")


if __name__ == "__main__":
    main()
