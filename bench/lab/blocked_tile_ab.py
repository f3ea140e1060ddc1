"""Register-tile shapes of the blocked GEMM, single-threaded, one process: GFLOP/s of the
runtime's blocked tile (``atoms.contract.micro.blocked_tile``: the left rows packed in strips per K
slice; the right operand packed in panels once, outside the timing) for tiles of MR rows x NV
vectors of LANES floats, K slices of KC and row tiles of TM, over the shapes of a transformer
block's MLP and projections.

    python bench/lab/blocked_tile_ab.py
    python bench/lab/blocked_tile_ab.py --shapes 128,512,512 --configs 4,4,16,64,32 4,4,16,256,32

This is the experiment behind ``atoms.contract.micro``'s BLOCKED_MR, BLOCKED_NV, BLOCKED_KC and
BLOCKED_MIN_TM (docs/performance.md, tuning log); it calls the tile from a plain loop, so it
measures the tile alone (no epilogue, no threads).
"""
from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np
from numba import njit, types

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from atoms.contract import micro  # noqa: E402
from runtime.kernels import simd  # noqa: E402
from runtime.toolkit.cpu import Source  # noqa: E402

SHAPES = [(128, 512, 2048), (128, 2048, 512), (2048, 1024, 1024), (4096, 1024, 4096)]
# (MR, NV, lanes, KC, TM): 32-byte vectors, then 64-byte ones (AVX-512)
CONFIGS = [(6, 2, 8, 256, 48), (6, 2, 16, 256, 48), (6, 2, 16, 256, 96), (6, 2, 16, 512, 48),
           (4, 4, 16, 256, 48), (8, 3, 16, 256, 48), (12, 2, 16, 256, 48)]


def make(mr: int, nv: int, lanes: int, kc: int):
    """The runtime's blocked tile (``atoms.contract.micro.blocked_tile``) at this shape, as a plain
    njit function, and a GEMM calling it per row tile of ``tm`` rows."""
    ops, _ = simd._define(types.float32, 4 * lanes)
    nr = nv * lanes
    src = Source()
    with src.block("def tile(am, m_bp, scratch, apk, bi, sab, sbb, ta, lda, i0, rows, n, k, j0, cols):"):
        src.add(micro.blocked_tile("float32", mr, nv, kc, lanes))
    scope = {"np": np, "vprefetch": simd.prefetch, **{f"v{op}": fn for op, fn in ops.items()}}
    exec(src.text(), scope)
    tile = njit(nogil=True, error_model="numpy")(scope["tile"])

    @njit(nogil=True, error_model="numpy")
    def gemm(am, bp, out, m, n, k, tm):
        npad = (n + nr - 1) // nr * nr
        scr = np.empty((tm + mr) * npad, np.float32)
        apk = np.empty((tm + mr) * kc, np.float32)
        for i0 in range(0, m, tm):
            rows = min(tm, m - i0)
            tile(am, bp, scr, apk, 0, 0, 0, 0, k, i0, rows, n, k, 0, n)
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
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--shapes", nargs="*", default=[",".join(map(str, s)) for s in SHAPES], help="M,K,N ...")
    p.add_argument("--configs", nargs="*", default=[",".join(map(str, c)) for c in CONFIGS],
                   help="MR,NV,LANES,KC,TM ...")
    args = p.parse_args()
    shapes = [tuple(map(int, s.split(","))) for s in args.shapes]
    rng = np.random.default_rng(0)
    print("MR NV lanes KC TM  GFLOP/s for M,K,N = " + "  ".join(",".join(map(str, s)) for s in shapes))
    for mr, nv, lanes, kc, tm in (tuple(map(int, c.split(","))) for c in args.configs):
        gemm, nr = make(mr, nv, lanes, kc)
        got = []
        for m, k, n in shapes:
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
