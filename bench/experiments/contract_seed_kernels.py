"""The seed's two fused contract groups, standalone (median ms after warm-up).

    python bench/experiments/contract_seed_kernels.py [T ...]

g1: x[B,S,Din]·A[R,Din]ᵀ → silu          (K=1024, N=32)
g2: h[B,S,R]·B[Dout,R]ᵀ → ·gain → base+v  (K=32,  N=1024)
Epilogues are written by hand (the elementwise atoms' exprs); OPENBLAS_CORETYPE is left as set.
"""
import os
import sys
import time

import numpy as np

from runtime.atomspec import ScalarOp, bind_node
from runtime.fusion import CHAIN, Epilogue, EpilogueStep
from runtime.layout import align_to
from runtime.types import TensorType

from atoms.contract import SPECS

SILU = "({0} / (1.0 + math.exp(-{0})))"
SILU_STABLE = ("(({0} / (1.0 + math.exp(-{0}))) if {0} >= 0.0 else "
               "({0} * math.exp({0}) / (1.0 + math.exp({0}))))")
CONTRACT = SPECS[0]


def t(axes, sizes):
    return TensorType(tuple(axes), tuple(sizes), "float32", "anonymous")


def median_ms(f, reps):
    for _ in range(3):
        f()
    ts = []
    for _ in range(reps):
        s = time.perf_counter()
        f()
        ts.append(time.perf_counter() - s)
    return float(np.median(ts)) * 1e3


def main(Ts):
    print(f"OPENBLAS_CORETYPE={os.environ.get('OPENBLAS_CORETYPE')} "
          f"OPENBLAS_NUM_THREADS={os.environ.get('OPENBLAS_NUM_THREADS')}")
    rng = np.random.default_rng(0)
    A = rng.standard_normal((32, 1024), np.float32) / 32
    Bm = rng.standard_normal((1024, 32), np.float32) / 6
    gain = np.array(0.5, np.float32)
    for T in Ts:
        reps = 200 if T <= 2048 else 40
        x = rng.standard_normal((1, T, 1024), np.float32)
        base = rng.standard_normal((1, T, 1024), np.float32)
        n1 = bind_node(CONTRACT, {"reduce_axes": [["Din", "Din"]], "output_axes": ["B", "S", "R"],
                                  "accumulation_dtype": "float32"},
                       [t("BSD", (1, T, 1024)).evolve(axes=("B", "S", "Din")), t(("R", "Din"), (32, 1024))])
        n2 = bind_node(CONTRACT, {"reduce_axes": [["R", "R"]], "output_axes": ["B", "S", "Dout"],
                                  "accumulation_dtype": "float32"},
                       [t(("B", "S", "R"), (1, T, 32)), t(("Dout", "R"), (1024, 32))])
        gt, ot = t((), ()), n2.output_type
        for name, expr in (("silu", SILU), ("silu-stable", SILU_STABLE), ("none", None)):
            ep = Epilogue((EpilogueStep(n1, ScalarOp(expr), (CHAIN,)),), (), ()) if expr else Epilogue((), (), ())
            g1 = CONTRACT.anchors["cpu"](n1, ep)
            h = np.empty((1, T, 32), np.float32)
            ms = median_ms(lambda: g1([x, A], [], h), reps)
            print(f"T={T:6d} g1 contract+{name:12s} {ms:8.3f} ms")
        ref_h = x @ A.T
        ref_h = ref_h / (1 + np.exp(-ref_h))
        g1 = CONTRACT.anchors["cpu"](n1, Epilogue((EpilogueStep(n1, ScalarOp(SILU_STABLE), (CHAIN,)),), (), ()))
        g1([x, A], [], h)
        assert np.allclose(h, ref_h, rtol=1e-4, atol=1e-4), np.abs(h - ref_h).max()
        ep2 = Epilogue((EpilogueStep(n2, ScalarOp("({0} * {1})"), (CHAIN, 0)),
                        EpilogueStep(n2, ScalarOp("({0} + {1})"), (1, CHAIN))),
                       ("lora.gain", "base"), (gt, ot))
        g2 = CONTRACT.anchors["cpu"](n2, ep2)
        out = np.empty((1, T, 1024), np.float32)
        extras = [align_to(gain, gt, ot), align_to(base, ot, ot)]
        ms2 = median_ms(lambda: g2([h, Bm], extras, out), reps)
        assert np.allclose(out, base + 0.5 * (h @ Bm.T), rtol=1e-4, atol=1e-4)
        print(f"T={T:6d} g2 contract+scale+add   {ms2:8.3f} ms")
        both = median_ms(lambda: (g1([x, A], [], h), g2([h, Bm], extras, out)), reps)
        print(f"T={T:6d} g1+g2 (silu-stable)      {both:8.3f} ms")


if __name__ == "__main__":
    main([int(a) for a in sys.argv[1:]] or [1, 256, 8192, 32768])
