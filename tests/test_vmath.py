"""runtime.kernels.vmath: the vectorisable exp that CPU kernels use in place of libm's."""
import math

import numpy as np
from numba import njit

from runtime.kernels import vmath
from runtime.kernels.vmath import vexp


@njit
def _exp_all(x, out):
    for i in range(x.size):
        out[i] = vexp(x[i])


def _vexp(x):
    out = np.empty_like(x)
    _exp_all(x, out)
    return out


def test_vexp_is_within_two_ulp_of_libm_over_the_normal_range():
    rng = np.random.default_rng(0)
    x = np.concatenate([np.linspace(-708.3, 709.78, 400_001), rng.standard_normal(200_000) * 4,
                        rng.uniform(-1e-8, 1e-8, 1000), [0.0, -0.0, 1.0, -1.0, 709.78, -708.29]])
    want = np.exp(x)
    got = _vexp(x)
    ulp = np.spacing(want)
    assert np.max(np.abs(got - want) / ulp) <= 2.0


def test_vexp_special_values_match_math_exp_and_subnormals_flush_to_zero():
    special = np.array([np.nan, np.inf, -np.inf, 709.79, 1000.0, -708.31, -745.2, -1e300])
    got = _vexp(special)
    assert math.isnan(got[0])
    assert got[1] == np.inf and got[2] == 0.0 and got[3] == np.inf and got[4] == np.inf
    np.testing.assert_array_equal(got[5:], 0.0)


def test_cpu_code_swaps_math_exp_only():
    lines = vmath.cpu_code(["    _v0 = (x / (1.0 + math.exp(-x)))", "    _v1 = math.expm1(x) + math.tanh(x)"])
    assert lines == ["    _v0 = (x / (1.0 + _vexp(-x)))", "    _v1 = math.expm1(x) + math.tanh(x)"]


def test_generated_cpu_kernels_use_vexp_for_silu():
    from runtime.backends.cpu_codegen import render

    src = render("t", [("x0", "float32", 1, False), ("out", "float32", 1, True)],
                 ["    for i in range(out.shape[0]):", "        out[i] = x0[i] / (1.0 + math.exp(-x0[i]))"], False)
    assert vmath.IMPORT in src and "_vexp(-x0[i])" in src and "math.exp" not in src


def test_float32_arguments_evaluate_in_float32_within_two_ulp():
    rng = np.random.default_rng(1)
    x = np.concatenate([np.linspace(-87.33, 88.72, 400_001), rng.standard_normal(200_000) * 4,
                        rng.uniform(-1e-4, 1e-4, 1000), [0.0, -0.0, 1.0, -1.0, 88.72283]]).astype(np.float32)
    got = _vexp(x)
    assert got.dtype == np.float32
    assert _exp_all.nopython_signatures[-1].args[0].dtype.bitwidth == 32
    want = np.exp(x.astype(np.float64))
    ulp = np.spacing(want.astype(np.float32)).astype(np.float64)
    assert np.max(np.abs(got - want) / ulp) <= 2.0
    # float32 evaluation, not float64 rounded: some results differ from the float64 path's
    assert np.any(got != _vexp(x.astype(np.float64)).astype(np.float32))


def test_float32_special_values_and_flush_below_the_smallest_normal():
    special = np.array([np.nan, np.inf, -np.inf, 88.73, 1000.0, -87.34, -103.0, -3e38], np.float32)
    got = _vexp(special)
    assert math.isnan(got[0])
    assert got[1] == np.inf and got[2] == 0.0 and got[3] == np.inf and got[4] == np.inf
    np.testing.assert_array_equal(got[5:], 0.0)


def test_vexp_is_math_exp_in_plain_python():
    assert vexp(1.5) == math.exp(1.5)
