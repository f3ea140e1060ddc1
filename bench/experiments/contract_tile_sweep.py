"""Scratch: row-tile size (SCRATCH_BYTES) sweep for the seed's two groups, one process."""
import sys
import numpy as np
from atoms import _gemm
import contract_seed_kernels as s  # noqa: E402  (run from bench/experiments)
from runtime.atomspec import ScalarOp, bind_node
from runtime.fusion import CHAIN, Epilogue, EpilogueStep
from runtime.layout import align_to

T = int(sys.argv[1]) if len(sys.argv) > 1 else 8192
rng = np.random.default_rng(0)
x = rng.standard_normal((1, T, 1024), np.float32)
A = rng.standard_normal((32, 1024), np.float32) / 32
Bm = rng.standard_normal((1024, 32), np.float32) / 6
base = rng.standard_normal((1, T, 1024), np.float32)
gain = np.array(0.5, np.float32)
n1 = bind_node(s.CONTRACT, {"reduce_axes": [["Din", "Din"]], "output_axes": ["B", "S", "R"], "accumulation_dtype": "float32"},
               [s.t(("B", "S", "Din"), (1, T, 1024)), s.t(("R", "Din"), (32, 1024))])
n2 = bind_node(s.CONTRACT, {"reduce_axes": [["R", "R"]], "output_axes": ["B", "S", "Dout"], "accumulation_dtype": "float32"},
               [s.t(("B", "S", "R"), (1, T, 32)), s.t(("Dout", "R"), (1024, 32))])
gt, ot = s.t((), ()), n2.output_type
ep1 = Epilogue((EpilogueStep(n1, ScalarOp(s.SILU_STABLE), (CHAIN,)),), (), ())
ep2 = Epilogue((EpilogueStep(n2, ScalarOp("({0} * {1})"), (CHAIN, 0)), EpilogueStep(n2, ScalarOp("({0} + {1})"), (1, CHAIN))),
               ("g", "base"), (gt, ot))
h = np.empty((1, T, 32), np.float32); out = np.empty((1, T, 1024), np.float32)
extras = [align_to(gain, gt, ot), base]
for rep in range(2):
    for sb in (32768, 65536, 131072, 262144, 524288, 1048576):
        _gemm.SCRATCH_BYTES = sb
        g1 = s.CONTRACT.anchors["cpu"](n1, ep1); g2 = s.CONTRACT.anchors["cpu"](n2, ep2)
        m1 = s.median_ms(lambda: g1([x, A], [], h), 30)
        m2 = s.median_ms(lambda: g2([h, Bm], extras, out), 30)
        print(f"T={T} scratch={sb:8d} g1 {m1:7.3f} g2 {m2:7.3f} ms")
