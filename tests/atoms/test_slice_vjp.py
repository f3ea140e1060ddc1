"""The gradient atom slice-vjp@1: the cotangent placed in zeros, the adjoint of slice."""
from __future__ import annotations

import math

import numpy as np
import pytest

from atoms._grad import SLICE_VJP_REF
from runtime.core.types import numpy_dtype
from tests.atoms.gradient_helpers import BACKENDS, SLICE, T, run


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("dtype", ["float16", "bfloat16", "float32", "float64"])
def test_slice_vjp_places_the_cotangent_in_zeros(backend, dtype):
    dt = numpy_dtype(dtype)
    g = np.array([[1.5, -0.0], [2.5, -3.0]], dt)  # axes B, N: positions 1 and 3 of N
    got = run(SLICE_VJP_REF, SLICE, [T("BN", (2, 2), dtype), T("BN", (2, 5), dtype)],
              [g, np.full((2, 5), np.nan, dt)], backend)
    want = np.zeros((2, 5), dt)
    want[:, 1::2] = g
    assert got.dtype == dt
    np.testing.assert_array_equal(got.view(np.uint8), want.view(np.uint8))  # bits: -0.0 stays -0.0


@pytest.mark.parametrize("backend", BACKENDS)
def test_slice_vjp_is_the_adjoint_of_slice(backend):
    rng = np.random.default_rng(4)
    for axis, start, stop, step in (("N", 0, None, 1), ("N", 2, 4, 1), ("B", 1, None, 2), ("C", 0, 9, 3)):
        a = {"axis": axis, "start": start, "stop": stop, "step": step}
        vt = T("BNC", (3, 5, 4), "float64")
        v = rng.standard_normal(vt.shape)
        s = run("arti/formula-atom-slice@1", a, [vt], [v])
        g = rng.standard_normal(s.shape)
        back = run(SLICE_VJP_REF, a, [T("BNC", s.shape, "float64"), vt], [g, v], backend)
        assert math.isclose(float(np.sum(s * g)), float(np.sum(v * back)), rel_tol=1e-12)


# --- window-vjp ----------------------------------------------------------------------------------
