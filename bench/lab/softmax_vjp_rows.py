"""The masked-softmax-vjp's CPU row kernels side by side, in one process: the scalar rows
(``MASKED_SOFTMAX_VJP``, any strides) against the vector rows (``VECTOR_ROWS``, contiguous
rows), on attention's [B, H, S, K] probabilities under a causal mask, a key-padding mask and no
mask, writing a fresh array and in place over ȳ; medians of repeated runs, both twins parallel.

    python bench/lab/softmax_vjp_rows.py [--shape 1,8,512,512] [--reps 30]
"""
from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from atoms.softmax_vjp import MASKED_SOFTMAX_VJP, VECTOR_ROWS, masked_softmax_vjp_numpy  # noqa: E402


def probabilities(shape, mask: str, rng) -> np.ndarray:
    s, k = shape[-2:]
    logits = rng.standard_normal(shape).astype(np.float32)
    if mask == "causal":
        visible = np.tril(np.ones((s, k), bool))
    elif mask == "padding":  # each query row sees the first 40 % of the keys
        visible = np.zeros((s, k), bool)
        visible[:, : max(1, int(0.4 * k))] = True
    else:
        visible = np.ones((s, k), bool)
    e = np.where(visible, np.exp(logits - logits.max(-1, keepdims=True)), 0)
    return (e / e.sum(-1, keepdims=True)).astype(np.float32)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--shape", default="1,8,512,512")
    p.add_argument("--reps", type=int, default=30)
    args = p.parse_args()
    shape = tuple(int(v) for v in args.shape.split(","))
    n, count = shape[-1], int(np.prod(shape[:-1]))
    rng = np.random.default_rng(0)
    print(f"shape {shape}: ms a call (median of {args.reps})")
    for mask in ("causal", "padding", "none"):
        y = probabilities(shape, mask, rng).reshape(-1)
        g = rng.standard_normal(y.size).astype(np.float32)
        want = masked_softmax_vjp_numpy(y.reshape(shape), g.reshape(shape), len(shape) - 1).reshape(-1)
        rows_shape = np.array([count], np.int64)
        strides = np.array([[n], [n], [n]], np.int64)
        base = np.zeros(3, np.int64)
        scalar = MASKED_SOFTMAX_VJP.parallel
        vector = VECTOR_ROWS["float32"].parallel
        calls = {
            "scalar": lambda out, src: scalar(y, src, out, rows_shape, strides, base, 1, 1, 1, n, count),
            "vector": lambda out, src: vector(y, src, out, 0, 0, n, count),
        }
        row = []
        for name, call in calls.items():
            for where in ("fresh", "in place"):
                times = []
                for _ in range(args.reps):
                    src = g.copy()
                    out = src if where == "in place" else np.empty_like(g)
                    started = time.perf_counter()
                    call(out, src)
                    times.append((time.perf_counter() - started) * 1e3)
                np.testing.assert_allclose(out, want, rtol=2e-4, atol=2e-6)
                row.append(f"{name} {where} {statistics.median(times):6.3f}")
        print(f"{mask:8}  " + "   ".join(row))


if __name__ == "__main__":
    main()
