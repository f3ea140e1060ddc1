"""runtime.kernels.simd: each vector operation against NumPy, for both dtypes, at unaligned offsets."""
from __future__ import annotations

import numpy as np
import pytest
from numba import njit

from runtime.kernels import simd
from runtime.kernels.codegen import source_stamp
from runtime.kernels.simd import (bcast_f32x8, bcast_f64x4, fma_f32x8, fma_f64x4, hsum_f32x8, hsum_f64x4,
                          load_f32x8, load_f64x4, store_f32x8, store_f64x4, zero_f32x8, zero_f64x4)


@njit
def _f32(x, y, out, at, s):  # out[at:at+8] = x[at:] * s + y[at:] (+0); returns sum of x[at:at+8]
    v = fma_f32x8(load_f32x8(x, at), bcast_f32x8(s), load_f32x8(y, at))
    store_f32x8(out, at, fma_f32x8(zero_f32x8(), v, v))
    return hsum_f32x8(load_f32x8(x, at))


@njit
def _f64(x, y, out, at, s):
    v = fma_f64x4(load_f64x4(x, at), bcast_f64x4(s), load_f64x4(y, at))
    store_f64x4(out, at, fma_f64x4(zero_f64x4(), v, v))
    return hsum_f64x4(load_f64x4(x, at))


@pytest.mark.parametrize("dt, fn", [("float32", _f32), ("float64", _f64)])
@pytest.mark.parametrize("at", [0, 1, 3])
def test_vector_ops(dt, fn, at):
    lanes = simd.lanes(dt)
    assert lanes * np.dtype(dt).itemsize == simd.VECTOR_BYTES
    rng = np.random.default_rng(at)
    x, y = rng.standard_normal(16).astype(dt), rng.standard_normal(16).astype(dt)
    out = np.zeros(16, dt)
    total = fn(x, y, out, at, 1.5)
    sl = slice(at, at + lanes)
    np.testing.assert_allclose(out[sl], x[sl] * 1.5 + y[sl], rtol=1e-6)
    assert not out[:at].any() and not out[at + lanes:].any()  # exactly one vector written
    np.testing.assert_allclose(total, x[sl].sum(), rtol=1e-5)


def test_ops_import_names_a_stamped_line():
    line = simd.ops_import("float64")
    assert "fma_f64x4 as vfma" in line and line.endswith(f"# simd {source_stamp(simd.__file__)}")
    namespace = {}
    exec(line.split("#")[0], namespace)
    assert namespace["vload"] is load_f64x4


@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_nonfinite_scan_finds_every_nan_and_inf_in_its_range_only(dtype):
    scan = simd.nonfinite_f32 if dtype == "float32" else simd.nonfinite_f64
    rng = np.random.default_rng(3)
    for n in (0, 1, 7, 31, 32, 33, 100, 1000):
        a = rng.standard_normal(n).astype(dtype) * 1e30  # large finite values stay finite
        assert scan(a, 0, n) == 0
        for at in {0, n // 2, n - 1} if n else ():
            for bad in (np.nan, np.inf, -np.inf):
                b = a.copy()
                b[at] = bad
                assert scan(b, 0, n) == 1, (n, at, bad)
                assert scan(b, 0, at) == 0 and scan(b, at + 1, n) == 0  # outside the range
                assert scan(b, at, at + 1) == 1
    edge = np.array([np.finfo(dtype).max, -np.finfo(dtype).max, -0.0, np.finfo(dtype).tiny] * 20, dtype)
    assert scan(edge, 0, edge.size) == 0


def test_prefetch_is_a_hint_that_never_faults_nor_writes():
    @njit
    def touch(a, far):
        simd.prefetch(a, 0)
        simd.prefetch(a, far)  # (far past the array: a prefetch never faults)
        simd.prefetch(a, -far)
        return a.sum()

    a = np.arange(64, dtype=np.float32)
    assert touch(a, 1 << 40) == a.sum() and np.array_equal(a, np.arange(64, dtype=np.float32))
    assert "prefetch" in touch.inspect_asm(touch.signatures[0])



def _lane_ops(dt: str, wide: bool):
    o = simd.ops(dt, wide)
    vload, vstore, add, sub, mul, nzsel = (o[k] for k in ("load", "store", "add", "sub", "mul", "nzsel"))

    @njit
    def lanewise(x, y, outs, at):  # outs rows: x+y, x-y, x*y, nzsel(x, y), each at [at:at+lanes]
        a, b = vload(x, at), vload(y, at)
        vstore(outs[0], at, add(a, b))
        vstore(outs[1], at, sub(a, b))
        vstore(outs[2], at, mul(a, b))
        vstore(outs[3], at, nzsel(a, b))
    return lanewise


@pytest.mark.parametrize("dt", ["float32", "float64"])
@pytest.mark.parametrize("wide", [False, True])
def test_lanewise_ops_and_the_nonzero_select(dt, wide):
    """add, sub and mul lane by lane; nzsel(y, x) is x where y != 0 (NaN included, as y != 0
    is in NumPy) and exactly +0 where y is ±0, even where x is inf or NaN."""
    lanes = simd.lanes(dt, wide)
    fn = _lane_ops(dt, wide)
    x = np.resize(np.array([1.5, 0.0, -0.0, np.nan, 2.0, -3.0, 0.0, 4.0], dt), lanes)
    y = np.resize(np.array([2.0, np.inf, np.nan, 1.0, -1.0, 0.5, -np.inf, 0.25], dt), lanes)
    for at in (0, 1):  # (unaligned too)
        xs, ys = np.zeros(lanes + 2, dt), np.zeros(lanes + 2, dt)
        xs[at:at + lanes], ys[at:at + lanes] = x, y
        outs = np.full((4, lanes + 2), 7, dt)
        fn(xs, ys, outs, at)
        with np.errstate(all="ignore"):
            want = [x + y, x - y, x * y, np.where(x != 0, y, 0).astype(dt)]
        for row, expected in zip(outs, want):
            np.testing.assert_array_equal(row[at:at + lanes], expected)
            assert (np.delete(row, range(at, at + lanes)) == 7).all()  # exactly one vector written
        assert not np.signbit(outs[3][at:at + lanes][x == 0]).any()
