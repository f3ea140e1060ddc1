"""How a fused epilogue should note non-finite operand values: the seed's last epilogue
(``out = base + gain * acc`` over a [126, 1024] tile, one thread), side by side in one process:
an int64 count per element (what ``Epilogue.emit`` wrote before), a boolean flag per row
(what it writes now), and no check at all (the floor).

    NUMBA_NUM_THREADS=1 python bench/experiments/epilogue_nonfinite_flag.py
"""
import time

import numpy as np
from numba import njit


@njit(error_model="numpy")
def count_int64(s, base, out, g, rows, n):
    nf = 0
    for i in range(rows):
        r = np.uint64(i * n)
        for j in range(np.uint64(n)):
            acc, e0, e1 = s[r + j], g, base[r + j]
            nf += (e0 - e0) != 0
            nf += (e1 - e1) != 0
            out[r + j] = e1 + acc * e0
    return nf


@njit(error_model="numpy")
def flag_per_row(s, base, out, g, rows, n):
    nf = 0
    for i in range(rows):
        r = np.uint64(i * n)
        bad = False
        for j in range(np.uint64(n)):
            acc, e0, e1 = s[r + j], g, base[r + j]
            bad |= (e0 - e0) != 0
            bad |= (e1 - e1) != 0
            out[r + j] = e1 + acc * e0
        nf += bad
    return nf


@njit(error_model="numpy")
def unchecked(s, base, out, g, rows, n):
    for i in range(rows):
        r = np.uint64(i * n)
        for j in range(np.uint64(n)):
            out[r + j] = base[r + j] + s[r + j] * g
    return 0


def main():
    rng = np.random.default_rng(0)
    m, n = 126, 1024
    s, base = (rng.standard_normal(m * n).astype(np.float32) for _ in range(2))
    out, g = np.empty_like(base), np.float32(0.7)
    kernels = {"int64 count per element": count_int64, "flag per row": flag_per_row, "no check": unchecked}
    bad = base.copy()
    bad[5000] = np.nan
    for name, fn in kernels.items():
        assert fn(s, base, out, g, m, n) == 0 and (fn is unchecked or fn(s, bad, out, g, m, n) > 0), name
    times = {name: [] for name in kernels}
    for _ in range(500):
        for name, fn in kernels.items():
            started = time.perf_counter()
            fn(s, base, out, g, m, n)
            times[name].append(time.perf_counter() - started)
    print(", ".join(f"{name} {np.median(v) * 1e6:.1f} us" for name, v in times.items()))


if __name__ == "__main__":
    main()
