"""How single seed calls spread over time on this machine: per-call times of the cpu backend
(banks loaded once) for a few seconds, as percentiles, and the share of calls more than 20 %
above the 10th percentile. Run it with NUMBA_NUM_THREADS=1 and =2 to see how much of the
spread comes from needing both cores at once.

    python bench/experiments/seed_call_spread.py 256 8
"""
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # (the repository root: bench/)
from bench.ab_seed import built, seed_values  # noqa: E402


def main(tokens: int, seconds: float) -> None:
    inputs, banks = seed_values(tokens)
    exe, run_banks = built(inputs, banks)
    for _ in range(50):
        exe.run(inputs=inputs, banks=run_banks)
    times, end = [], time.time() + seconds
    while time.time() < end:
        started = time.perf_counter()
        exe.run(inputs=inputs, banks=run_banks)
        times.append(time.perf_counter() - started)
    ms = np.array(times) * 1e3
    p10, p50, p75, p90, p99 = np.percentile(ms, [10, 50, 75, 90, 99])
    print(f"T={tokens}: {ms.size} calls; ms p10 {p10:.3f}, p50 {p50:.3f}, p75 {p75:.3f}, p90 {p90:.3f}, "
          f"p99 {p99:.3f}; {100 * float((ms > 1.2 * p10).mean()):.0f} % of calls above 1.2 x p10")


if __name__ == "__main__":
    main(int(sys.argv[1]) if len(sys.argv) > 1 else 256, float(sys.argv[2]) if len(sys.argv) > 2 else 8)
