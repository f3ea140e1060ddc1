"""What the interpreter's switch interval does to a run beside a thread that holds the GIL (as
a background compile does, in Numba's typing and lowering): a NumPy computation of the seed's
shape (T=4096) timed alone, then beside a Python-bound thread at each interval, alternating.

    python bench/lab/gil_switch.py [--intervals 0.005,0.0005] [--rounds 2] [--runs 30]

runtime/execution/background.py lowers the interval to ``SWITCH_INTERVAL`` while any
background compile runs.
"""
from __future__ import annotations

import argparse
import statistics
import sys
import threading
import time

import numpy as np


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--intervals", default="0.005,0.0005")
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--runs", type=int, default=30)
    args = p.parse_args()
    rng = np.random.default_rng(0)
    x, base = rng.random((4096, 1024), np.float32), rng.random((4096, 1024), np.float32)
    a, b = rng.random((32, 1024), np.float32), rng.random((1024, 32), np.float32)

    def run():
        h = x @ a.T
        h = h / (1 + np.exp(-h))
        d = h @ b.T
        d *= 0.5
        d += base
        return d

    def busy(stop: threading.Event) -> None:
        while not stop.is_set():
            sum(i * i for i in range(1000))

    def median_ms(beside: bool) -> float:
        stop = threading.Event()
        thread = threading.Thread(target=busy, args=(stop,))
        if beside:
            thread.start()
        times = []
        for _ in range(args.runs):
            start = time.perf_counter()
            run()
            times.append((time.perf_counter() - start) * 1e3)
        stop.set()
        if beside:
            thread.join()
        return statistics.median(times)

    default = sys.getswitchinterval()
    run()
    print(f"alone: {median_ms(False):.2f} ms")
    for r in range(args.rounds):
        for interval in map(float, args.intervals.split(",")):
            sys.setswitchinterval(interval)
            print(f"round {r + 1}, switch interval {interval * 1e3:g} ms, beside a GIL-bound thread: "
                  f"{median_ms(True):.2f} ms", flush=True)
    sys.setswitchinterval(default)


if __name__ == "__main__":
    main()
