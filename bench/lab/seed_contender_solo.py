"""One seed contender in a process of its own, warm, called back to back (µs percentiles).
Alternate contenders across processes to compare them without the rounds of pytest-benchmark:

    for i in 1 2 3 4; do for c in cpu onnxruntime; do
        python bench/lab/seed_contender_solo.py $c 256 2000; done; done
"""
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from bench import programs  # noqa: E402
from bench.contenders import prepare_seed  # noqa: E402
from bench.test_seed import seed_data  # noqa: E402


def main(contender: str, tokens: int, calls: int) -> None:
    data = seed_data("float32", tokens)
    run = prepare_seed(contender, programs.seed_program("float32"), data)
    for _ in range(50):
        run()
    times = []
    for _ in range(calls):
        t0 = time.perf_counter()
        result = run()
        times.append(time.perf_counter() - t0)
        del result
    v = np.array(times) * 1e6
    print(f"{contender:12s} T={tokens}: p10 {np.percentile(v, 10):.1f}  p50 {np.median(v):.1f}  "
          f"p90 {np.percentile(v, 90):.1f} µs")


if __name__ == "__main__":
    main(sys.argv[1], int(sys.argv[2]) if len(sys.argv) > 2 else 256, int(sys.argv[3]) if len(sys.argv) > 3 else 2000)
