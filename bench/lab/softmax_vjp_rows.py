"""The cpu masked-softmax-vjp kernel on attention-shaped rows ([8, 512, 512], float32) under a
causal mask and under a random (key-padding) one, medians of 30 calls, with its largest
difference from the oracle.

    python bench/lab/softmax_vjp_rows.py
"""
from __future__ import annotations

import statistics
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))


def main() -> None:
    from atoms import softmax_vjp
    from runtime.core.types import TensorType
    from runtime.plugins.atomspec import bind_node
    from runtime.plugins.kernel import request_for

    spec = softmax_vjp.SPECS[0]
    h, s = 8, 512
    t = TensorType(("H", "S", "K"), (h, s, s), "float32", "d")
    kernel = spec.kernels["cpu"](request_for(bind_node(spec, {"axis": "K", "accumulation_dtype": "float32"}, [t, t])))
    rng = np.random.default_rng(0)
    y = rng.random((h, s, s)).astype(np.float32)
    causal = y.copy()
    causal[:, np.triu_indices(s, 1)[0], np.triu_indices(s, 1)[1]] = 0
    padding = y.copy()
    padding[rng.random((h, s, s)) < 0.5] = 0
    g = rng.standard_normal((h, s, s)).astype(np.float32)
    out = np.empty_like(y)
    for name, rows in (("causal", causal), ("key padding", padding)):
        kernel([rows, g], (), out)
        times = []
        for _ in range(30):
            started = time.perf_counter()
            kernel([rows, g], (), out)
            times.append((time.perf_counter() - started) * 1e3)
        error = float(np.abs(out - softmax_vjp.masked_softmax_vjp_numpy(rows, g, 2)).max())
        print(f"{name}: {statistics.median(times):.2f} ms, largest difference from the oracle {error:.2g}")


if __name__ == "__main__":
    main()
