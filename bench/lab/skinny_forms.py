"""The contraction's tile forms side by side on skinny products, the right operand ``[N, K]``
as a weight is stored, each form forced through ``choose_form``, alternating in one process:
``--region short-k`` (default): ``bcast`` against ``blocked`` at K 32 and 64 (a LoRA
up-projection; N 256-4096, M 8-2048); ``--region dot``: ``bcast``, ``dot`` and BLAS at N 32
and 64, K 256-1024 (a LoRA down-projection x·Aᵀ; M 5-1024), the left operand scanned for
non-finite values as the seed's is; ``--region wgrad``: BLAS against ``blocked`` on weight
gradients gᵀ·x (the left operand [K, M], K-leading; M 16-128, N 1024-4096, K 1024-8192).

    python bench/lab/skinny_forms.py [--region short-k|dot|wgrad] [--threads 2] [--dtype float32] [--per-call-pack]

Prints each shape's medians, bcast / blocked, and whether the two give the same bits (the
form of a shape decides every slice's result: chunks and dask blocks rely on it). For an
AVX2 target on an AVX-512 host, run it under tests/test_chunked.py's ``avx2_features()``
(``NUMBA_CPU_NAME=znver3 NUMBA_CPU_FEATURES=...``) with empty cache directories.
"""
from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))


def kernel(m: int, k: int, n: int, dt: str, form: str | None, resident: bool, scan: bool = False,
           k_leading: bool = False):
    from atoms.contract import SPECS, micro
    from runtime.core.types import TensorType
    from runtime.plugins.atomspec import bind_node
    from runtime.plugins.kernel import request_for

    spec = next(s for s in SPECS if s.name == "contract")
    lt = TensorType(("k", "i"), (k, m), dt, "d") if k_leading else TensorType(("i", "k"), (m, k), dt, "d")
    rt = TensorType(("k", "j"), (k, n), dt, "d") if k_leading else TensorType(("j", "k"), (n, k), dt, "d")
    node = bind_node(spec, {"reduce_axes": [["k", "k"]], "output_axes": ["i", "j"],
                            "accumulation_dtype": "float32"}, [lt, rt])
    chosen = micro.choose_form
    micro.choose_form = lambda *dims: form
    try:
        return spec.kernels["cpu"](request_for(node, resident=frozenset({1}) if resident else frozenset(),
                                               count_inputs=(0,) if scan else ()))
    finally:
        micro.choose_form = chosen


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--region", default="short-k", choices=("short-k", "dot", "wgrad"))
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--dtype", default="float32", choices=("float32", "float64"))
    p.add_argument("--per-call-pack", action="store_true", help="the right operand passed per run (packed per call)")
    args = p.parse_args()
    import numba

    numba.set_num_threads(args.threads)
    rng = np.random.default_rng(0)
    if args.region == "dot":
        shapes = [(n, k, m) for n, k in ((32, 1024), (64, 1024), (32, 256), (64, 512))
                  for m in (5, 8, 16, 32, 64, 128, 256, 1024)]
        forms: tuple[str | None, ...] = ("bcast", "dot", None)
    elif args.region == "wgrad":
        shapes = [(n, k, m) for m, n, k in ((32, 1024, 8192), (32, 4096, 4096), (16, 1024, 4096),
                                            (64, 1024, 4096), (128, 1024, 4096), (32, 1024, 1024))]
        forms = (None, "blocked")
    else:
        shapes = [(n, k, m) for k in (32, 64) for n in (256, 1024, 4096) for m in (8, 32, 128, 512, 2048)]
        forms = ("bcast", "blocked")
    for n, k, m in shapes:
        wgrad = args.region == "wgrad"
        a = rng.standard_normal((k, m) if wgrad else (m, k)).astype(args.dtype)
        b = rng.standard_normal((k, n) if wgrad else (n, k)).astype(args.dtype)
        runs = {f: kernel(m, k, n, args.dtype, f, not (args.per_call_pack or wgrad), args.region == "dot", wgrad)
                for f in forms}
        out = {f: np.empty((m, n), args.dtype) for f in runs}
        for f, run in runs.items():
            run([a, b], (), out[f])
        times: dict[str | None, list[float]] = {f: [] for f in runs}
        for _ in range(max(5, min(200, int(3e8 / (2 * m * n * k))))):
            for f, run in runs.items():
                t = time.perf_counter()
                run([a, b], (), out[f])
                times[f].append(time.perf_counter() - t)
        med = {f: statistics.median(v) for f, v in times.items()}
        cells = ", ".join(f"{f or 'BLAS'} {t * 1e6:.1f} µs" for f, t in med.items())
        print(f"K={k} N={n} M={m}: {cells}, {forms[0]}/{forms[1]} {med[forms[0]] / med[forms[1]]:.2f}x, "
              f"same bits: {np.array_equal(out[forms[0]], out[forms[1]])}", flush=True)


if __name__ == "__main__":
    main()
