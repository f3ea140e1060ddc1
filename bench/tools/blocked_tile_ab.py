"""Register-tile shapes of the blocked GEMM, single-threaded, one process: GFLOP/s of a plain
cache-blocked GEMM (the left rows packed in strips per K slice, the right operand packed in
panels once, outside the timing) for tiles of MR rows x NV vectors of LANES floats, K slices of
KC and row tiles of TM, over the shapes of a transformer block's MLP and projections.

    python bench/tools/blocked_tile_ab.py

This is the experiment behind ``atoms._microgemm``'s BLOCKED_MR, BLOCKED_NV, BLOCKED_KC and
BLOCKED_MIN_TM (docs/performance.md, tuning log); it builds its own kernels rather than the
runtime's, so it measures the tile alone (no epilogue, no threads).
"""
from __future__ import annotations

import sys
import time
from pathlib import Path

import numpy as np
from numba import njit, types

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from runtime.kernels import simd  # noqa: E402

SHAPES = [(128, 512, 2048), (128, 2048, 512), (2048, 1024, 1024), (4096, 1024, 4096)]
# (MR, NV, lanes, KC, TM): 32-byte vectors, then 64-byte ones (AVX-512)
CONFIGS = [(6, 2, 8, 256, 48), (6, 2, 16, 256, 48), (6, 2, 16, 256, 96), (6, 2, 16, 512, 48),
           (4, 4, 16, 256, 48), (8, 3, 16, 256, 48), (12, 2, 16, 256, 48)]


def make(mr: int, nv: int, lanes: int, kc: int):
    ops, _ = simd._define(types.float32, 4 * lanes)
    nr = nv * lanes
    R, V = range(mr), range(nv)
    strip = ["if first:", *[f"    c{r}_{v} = vzero()" for r in R for v in V], "else:",
             *[f"    c{r}_{v} = vload(scr, so + np.uint64({r}) * sn + np.uint64({v * lanes}))" for r in R for v in V],
             "pa = np.uint64(ib * kw)", "pb = np.uint64(pbb)", "for kk in range(np.uint64(kw)):",
             *[f"    b{v} = vload(bp, pb + np.uint64({v * lanes}))" for v in V]]
    for r in R:
        strip += [f"    a{r} = vbcast(apk[pa + np.uint64({r})])"] + [f"    c{r}_{v} = vfma(a{r}, b{v}, c{r}_{v})" for v in V]
    strip += [f"    pa += np.uint64({mr})", f"    pb += np.uint64({nr})"]
    strip += [f"vstore(scr, so + np.uint64({r}) * sn + np.uint64({v * lanes}), c{r}_{v})" for r in R for v in V]
    src = ["def tile(am, bp, scr, apk, i0, rows, n, k, lda, npad):",
           "    sn = np.uint64(npad)",
           f"    rpad = (rows + {mr - 1}) // {mr} * {mr}",
           f"    for kc0 in range(0, k, {kc}):",
           f"        kw = min({kc}, k - kc0)",
           "        first = kc0 == 0",
           f"        for ib in range(0, rpad, {mr}):",
           f"            for r in range({mr}):",
           "                dst = ib * kw + r",
           "                src = (i0 + ib + r) * lda + kc0",
           "                for kk in range(kw):",
           f"                    apk[dst + kk * {mr}] = am[src + kk] if ib + r < rows else 0",
           f"        for j0 in range(0, npad, {nr}):",
           f"            pbb = j0 * k + kc0 * {nr}",
           f"            for ib in range(0, rpad, {mr}):",
           "                so = np.uint64(ib * npad + j0)",
           *["                " + line for line in strip]]
    scope = {"np": np, **{f"v{op}": fn for op, fn in ops.items()}}
    exec("\n".join(src), scope)
    tile = njit(nogil=True, error_model="numpy")(scope["tile"])

    @njit(nogil=True, error_model="numpy")
    def gemm(am, bp, out, m, n, k, tm):
        npad = (n + nr - 1) // nr * nr
        scr = np.empty((tm + mr) * npad, np.float32)
        apk = np.empty((tm + mr) * kc, np.float32)
        for i0 in range(0, m, tm):
            rows = min(tm, m - i0)
            tile(am, bp, scr, apk, i0, rows, n, k, k, npad)
            for i in range(rows):
                for j in range(n):
                    out[(i0 + i) * n + j] = scr[i * npad + j]
    return gemm, nr


def pack(b: np.ndarray, nr: int) -> np.ndarray:
    k, n = b.shape
    panels = np.zeros((-(-n // nr), k, nr), np.float32)
    for p in range(panels.shape[0]):
        w = min(nr, n - p * nr)
        panels[p, :, :w] = b[:, p * nr:p * nr + w]
    return panels.reshape(-1)


def main() -> None:
    rng = np.random.default_rng(0)
    print("MR NV lanes KC TM  GFLOP/s for M,K,N = " + "  ".join(",".join(map(str, s)) for s in SHAPES))
    for mr, nv, lanes, kc, tm in CONFIGS:
        gemm, nr = make(mr, nv, lanes, kc)
        got = []
        for m, k, n in SHAPES:
            a, b = rng.random((m, k), np.float32), rng.random((k, n), np.float32)
            bp, out = pack(b, nr), np.empty(m * n, np.float32)
            gemm(a.reshape(-1), bp, out, m, n, k, tm)
            assert np.allclose(out.reshape(m, n), a @ b, rtol=1e-4)
            reps = max(1, int(3e9 / (2 * m * n * k)))
            t = time.perf_counter()
            for _ in range(reps):
                gemm(a.reshape(-1), bp, out, m, n, k, tm)
            got.append(f"{2 * m * n * k * reps / (time.perf_counter() - t) / 1e9:.0f}")
        print(f"{mr:2} {nv:2} {lanes:5} {kc:3} {tm:3}  " + "  ".join(got), flush=True)


if __name__ == "__main__":
    main()
