"""Contraction forms on products whose left operand is K-leading (gradients: gᵀ·x, and
attention's dV), each form forced (``tiles.form_for``, past its rules) in one process, medians of
the runtime's own kernel: the measurements behind ``tiles.WGRAD_BLAS_MIN_K`` and
``tiles.BATCHED_WGRAD_BLAS_ROWS`` (docs/performance.md, tuning log).

    python bench/lab/kleading_forms.py [--forms default,none,bcast,blocked] [--reps 30]
    python bench/lab/kleading_forms.py --grid --forms default --column-cols 1024   # and 256

``--wide``: weight gradients of wide layers instead (M 512-4096, N 1024-4096, K 2048 and 4096).
``--grid``: products of few rows instead (M 16-128, K 256 and 1024, N 512-2048, the left operand
K-leading and row-major), the cases behind ``tiles.BLOCKED_COLUMN_COLS``; ``--column-cols`` sets it.

``default`` is the form the runtime chooses; ``none`` is BLAS; ``rows`` is BLAS in row tiles
only (``tiles.WGRAD_SPLIT_COLS`` out of reach: no column tiles).
"""
from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

H, DH = 8, 64


def _cases():
    from runtime.core.types import TensorType

    def t(axes, sizes):
        return TensorType(tuple(axes), tuple(sizes), "float32", "d")

    def attrs(pair, out):
        return {"reduce_axes": [[pair, pair]], "output_axes": list(out), "accumulation_dtype": "float32"}

    cases = {f"seed dB, T={n}: [D,R] = g[T,D]ᵀ·s[T,R]": (t("TD", (n, 1024)), t("TR", (n, 32)), attrs("T", "DR"))
             for n in (256, 8192)}
    cases["seed dA, T=8192: [R,D] = dh[T,R]ᵀ·x[T,D]"] = (t("TR", (8192, 32)), t("TD", (8192, 1024)), attrs("T", "RD"))
    for s in (128, 512, 2048):
        cases[f"dV = Pᵀ·dO, S={s}: [K,H,Dh] = P[H,S,K]·dO[S,H,Dh]"] = (
            t(("H", "S", "K"), (H, s, s)), t(("S", "H", "Dh"), (s, H, DH)), attrs("S", ("K", "H", "Dh")))
        cases[f"dV = dOᵀ·P, S={s}: [K,H,Dh] = dO[S,H,Dh]·P[H,S,K]"] = (
            t(("S", "H", "Dh"), (s, H, DH)), t(("H", "S", "K"), (H, s, s)), attrs("S", ("K", "H", "Dh")))
    for m, n in ((1024, 4096), (4096, 1024)):  # the MLP's weight gradients at T=4096
        cases[f"MLP dW, T=4096: [M={m},N={n}] = g[T,M]ᵀ·x[T,N]"] = (
            t("TM", (4096, m)), t("TN", (4096, n)), attrs("T", "MN"))
    return cases


def _grid():
    from runtime.core.types import TensorType

    def t(axes, sizes):
        return TensorType(tuple(axes), tuple(sizes), "float32", "d")

    attributes = {"reduce_axes": [["T", "T"]], "output_axes": ["R", "D"], "accumulation_dtype": "float32"}
    cases = {}
    for m in (16, 32, 64, 128):
        for k in (256, 1024):
            for n in (512, 1024, 2048):
                cases[f"K-leading M={m} K={k} N={n}"] = (t("TR", (k, m)), t("TD", (k, n)), attributes)
                cases[f"row-major M={m} K={k} N={n}"] = (t("RT", (m, k)), t("TD", (k, n)), attributes)
    return cases


def _wide():
    """Weight gradients of wide layers: gᵀ·x with the left operand K-leading, M 512-4096 rows,
    N 1024-4096 columns, K (tokens) 2048 and 4096 (the MLP's at T=4096 among them)."""
    from runtime.core.types import TensorType

    def t(axes, sizes):
        return TensorType(tuple(axes), tuple(sizes), "float32", "d")

    attributes = {"reduce_axes": [["T", "T"]], "output_axes": ["M", "N"], "accumulation_dtype": "float32"}
    return {f"K-leading M={m} N={n} K={k}": (t("TM", (k, m)), t("TN", (k, n)), attributes)
            for k in (2048, 4096) for m in (512, 1024, 2048, 4096) for n in (1024, 2048, 4096)}


def main() -> None:
    from atoms.contract import SPECS, tiles
    from runtime.plugins.atomspec import bind_node
    from runtime.plugins.kernel import request_for

    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--forms", default="default,none,rows,bcast,blocked")
    p.add_argument("--reps", type=int, default=30)
    p.add_argument("--only", help="the cases whose name holds this text")
    p.add_argument("--grid", action="store_true", help="products of few rows (tiles.BLOCKED_COLUMN_COLS)")
    p.add_argument("--wide", action="store_true", help="weight gradients of wide layers (M, N >= 512, long K)")
    p.add_argument("--column-cols", type=int, help="tiles.BLOCKED_COLUMN_COLS for this run")
    args = p.parse_args()
    if args.column_cols:
        tiles.BLOCKED_COLUMN_COLS = args.column_cols
    spec = next(s for s in SPECS if s.name == "contract")
    rng = np.random.default_rng(0)
    for name, (lt, rt, attributes) in (_grid() if args.grid else _wide() if args.wide else _cases()).items():
        if args.only and args.only not in name:
            continue
        a, b = rng.standard_normal(lt.shape, dtype=np.float32), rng.standard_normal(rt.shape, dtype=np.float32)
        node = bind_node(spec, attributes, [lt, rt])
        first, cells = None, []
        for form in args.forms.split(","):
            chosen, split = tiles.form_for, tiles.WGRAD_SPLIT_COLS
            if form != "default":
                tiles.form_for = lambda *dims, f=form, **kw: None if f in ("none", "rows") else f
            if form == "rows":
                tiles.WGRAD_SPLIT_COLS = 1 << 62
            try:
                kernel = spec.kernels["cpu"](request_for(node))
            finally:
                tiles.form_for, tiles.WGRAD_SPLIT_COLS = chosen, split
            out = np.empty(node.output_type.shape, np.float32)
            kernel([a, b], (), out)
            first = out.copy() if first is None else first
            assert np.allclose(out, first, rtol=1e-3, atol=1e-3), (name, form)
            times = []
            for _ in range(args.reps + 5):  # (the first calls warm the kernel's threads and caches)
                started = time.perf_counter()
                kernel([a, b], (), out)
                times.append((time.perf_counter() - started) * 1e3)
            cells.append(f"{form} {statistics.median(times[5:]):.3f}")
        print(f"{name}: " + ", ".join(cells) + " ms", flush=True)


if __name__ == "__main__":
    main()
