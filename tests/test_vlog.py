"""runtime.kernels.vlog: the vectorisable log and log1p that CPU kernels use in place of libm's."""
from __future__ import annotations

import math

import numpy as np

from runtime.kernels.vlog import vlog, vlog1p
from tests.test_vmath import _apply, _float32_loop, _over_all, _sweep32, _sweep64, _ulp_error

_log_all, _log1p_all = _over_all(vlog), _over_all(vlog1p)


LOG_ULP32, LOG1P_ULP32, LOG_ULP64 = 1.0, 1.5, 2.0  # the stated bounds (module docstring); float64 against libm


def test_vlog_and_vlog1p_float64_are_within_two_ulp_of_libm_over_every_binade():
    x = _sweep64(seed=2)
    with np.errstate(divide="ignore", invalid="ignore"):
        for kernel, ref in ((_log_all, np.log), (_log1p_all, np.log1p)):
            got = _apply(kernel, x)
            assert _ulp_error(got, ref(x)) <= LOG_ULP64, kernel
            assert np.signbit(got[x == 0]).tolist() == np.signbit(ref(x[x == 0])).tolist()


def test_vlog_and_vlog1p_float32_are_within_their_ulp_bounds_over_sampled_bit_patterns():
    x = _sweep32(stride=1021)
    with np.errstate(divide="ignore", invalid="ignore"):
        wide = x.astype(np.float64)
        for kernel, ref, bound in ((_log_all, np.log, LOG_ULP32), (_log1p_all, np.log1p, LOG1P_ULP32)):
            got = _apply(kernel, x)
            assert got.dtype == np.float32
            assert _ulp_error(got, ref(wide)) <= bound, kernel


def test_vlog_and_vlog1p_special_values_are_numpys():
    x = np.array([0.0, -0.0, -1.0, -2.0, -5e-324, np.inf, -np.inf, np.nan, 5e-324, 1e-300,
                  -1 + 2.0 ** -53, 1e-17, -1e-17, 1.7976931348623157e308])
    with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
        for dt in (np.float64, np.float32):
            v = x.astype(dt)
            for kernel, ref in ((_log_all, np.log), (_log1p_all, np.log1p)):
                got, want = _apply(kernel, v), ref(v)
                assert np.array_equal(np.isnan(got), np.isnan(want)), (dt, kernel)
                fin = ~np.isnan(want)
                assert np.allclose(got[fin], want[fin], rtol=2e-7, atol=0), (dt, kernel)
                assert np.signbit(got[fin]).tolist() == np.signbit(want[fin]).tolist(), (dt, kernel)
    assert vlog(2.5) == math.log(2.5) and vlog1p(0.25) == math.log1p(0.25)  # plain Python


def test_vlog1p_loops_vectorise_in_float32():
    vectors, called = _float32_loop(_log1p_all, np.linspace(-0.5, 30, 64, dtype=np.float32))
    assert vectors > 30
    assert not [name for name in called if "log" in name and "_all" not in name]  # inlined whole
