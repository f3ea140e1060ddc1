"""The gradient atom window-vjp@1: overlapping taps summed, padding dropped, the adjoint of window,
the reference bits."""
from __future__ import annotations

import math

import numpy as np
import pytest

import runtime
from atoms._grad import WINDOW_VJP_REF
from runtime.testing import ProgramBuilder
from tests.atoms.gradient_helpers import BACKENDS, INS, WIN, T, execute, expect, run, window_attrs


@pytest.mark.parametrize("backend", BACKENDS)
def test_window_vjp_sums_overlapping_taps_and_drops_padding(backend):
    a = window_attrs(3, 2, 1, (1, 1))  # N = 5: P = (5+2-2-1)//2 + 1 = 3, taps p·2 − 1 + k
    g = np.arange(1.0, 10.0, dtype=np.float32).reshape(3, 3)  # [p, k]
    got = run(WINDOW_VJP_REF, a, [T("PK", (3, 3)), T("N", (5,))], [g, np.zeros(5, np.float32)], backend)
    # n=0: (0,1); n=1: (0,2),(1,0); n=2: (1,1); n=3: (1,2),(2,0); n=4: (2,1); (0,0) and (2,2) in the padding
    np.testing.assert_array_equal(got, [2.0, 3 + 4, 5.0, 6 + 7, 8.0])


@pytest.mark.parametrize("backend", BACKENDS)
def test_window_vjp_is_the_adjoint_of_window(backend):
    rng = np.random.default_rng(5)
    for k, s, d, pad in ((1, 1, 1, (0, 0)), (3, 1, 1, (1, 1)), (2, 3, 2, (2, 0)), (4, 2, 3, (3, 4)), (2, 1, 1, (0, 0))):
        a = window_attrs(k, s, d, pad)
        vt = T("BN", (2, 7), "float64")
        v = rng.standard_normal(vt.shape)
        w = run("arti/formula-atom-window@1", a, [vt], [v])
        g = rng.standard_normal(w.shape)
        back = run(WINDOW_VJP_REF, a, [T("BPK", w.shape, "float64"), vt], [g, v], backend)
        assert math.isclose(float(np.sum(w * g)), float(np.sum(v * back)), rel_tol=1e-12), (k, s, d, pad)


@pytest.mark.parametrize("backend", ["cpu", "cuda"])
def test_window_vjp_gives_the_reference_bits(backend):
    """Taps added in ascending (p, k) in float32 on every backend: the very same bits."""
    rng = np.random.default_rng(6)
    a = window_attrs(5, 1, 1, (2, 2), axis="N")
    g = (rng.standard_normal((3, 6, 5)) * 1e3).astype(np.float32)
    types = [T("BPK", (3, 6, 5)), T("BN", (3, 6))]
    want = run(WINDOW_VJP_REF, a, types, [g, np.zeros((3, 6), np.float32)])
    got = run(WINDOW_VJP_REF, a, types, [g, np.zeros((3, 6), np.float32)], backend)
    np.testing.assert_array_equal(got.view(np.uint32), want.view(np.uint32))


@pytest.mark.parametrize("backend", BACKENDS)
def test_window_vjp_symbolic_extent_checks_at_run_time(backend):
    b = ProgramBuilder()
    v = b.input("v", {"N": "S"})
    g = b.input("g", {"P": "W", "K": 2})
    y = b.op("window-vjp", [g, v], {**WIN, "output_size": "W"}, ref=WINDOW_VJP_REF)
    exe = runtime.compile(b.build(outputs=[y]), backend=backend)
    out = exe.run(inputs={"v": np.zeros(4, np.float32), "g": np.ones((3, 2), np.float32)})[y]
    np.testing.assert_array_equal(out, [1, 2, 2, 1])
    expect("symbol_conflict", f"{INS}.attributes.output_size", exe.run,
           inputs={"v": np.zeros(5, np.float32), "g": np.ones((3, 2), np.float32)})
    b = ProgramBuilder()
    v = b.input("v", {"N": "S"})
    g = b.input("g", {"P": 3, "K": 2})
    y = b.op("window-vjp", [g, v], {**WIN, "output_size": 3}, ref=WINDOW_VJP_REF)
    expect("binding_shape", f"{INS}.attributes.output_size", execute, b.build(outputs=[y]),
           {"v": np.zeros(5, np.float32), "g": np.ones((3, 2), np.float32)}, backend)
