"""What one Numba parallel region costs here: a ``prange`` over one task per thread doing
almost nothing, against the same body in a serial function, calls interleaved (µs; 10th
and 50th percentiles). An upper bound on what merging the seed's two kernels into one
region could save per run.

    python bench/experiments/parallel_region_cost.py [calls]
"""
import sys
import time

import numba
import numpy as np
from numba import njit, prange


@njit(parallel=True, nogil=True)
def one_region(a):
    for w in prange(a.size):
        a[w] += 1.0


@njit(nogil=True)
def serial(a):
    for w in range(a.size):
        a[w] += 1.0


def main(calls: int) -> None:
    a = np.zeros(numba.get_num_threads())
    times = {"parallel region": [], "serial": []}
    for f in (one_region, serial):
        f(a)
    for _ in range(calls):
        for name, f in (("parallel region", one_region), ("serial", serial)):
            t0 = time.perf_counter()
            f(a)
            times[name].append(time.perf_counter() - t0)
    print(f"threads {numba.get_num_threads()}, layer {numba.threading_layer()}")
    for name, t in times.items():
        t = np.array(t) * 1e6
        print(f"{name}: p10 {np.percentile(t, 10):.2f}  p50 {np.percentile(t, 50):.2f} µs")


if __name__ == "__main__":
    main(int(sys.argv[1]) if len(sys.argv) > 1 else 20000)
