"""The gradient atom masked-softmax-vjp@1: the Jacobian transpose, hidden entries exactly zero, in
a program."""
from __future__ import annotations

import numpy as np
import pytest

from atoms._grad import MASKED_SOFTMAX_VJP_REF
from runtime.testing import ProgramBuilder, assert_backends_agree
from tests.atoms.gradient_helpers import BACKENDS, F32, T, run, softmax


def test_masked_softmax_vjp_is_the_jacobian_transpose_and_zero_where_hidden():
    rng = np.random.default_rng(0)
    logits = rng.standard_normal((3, 5))
    mask = np.array([[1, 1, 0, 1, 1], [0, 0, 0, 0, 0], [1, 0, 0, 0, 0]], bool)  # a fully masked row, a lone one
    y = softmax(logits, mask, 1)
    g = rng.standard_normal((3, 5))
    want = np.stack([(np.diag(r) - np.outer(r, r)) @ c for r, c in zip(y, g)])  # Jᵀȳ (J symmetric)
    for backend in BACKENDS:
        got = run(MASKED_SOFTMAX_VJP_REF, {"axis": "N", **F32}, [T("BN", (3, 5), "float64")] * 2, [y, g], backend)
        np.testing.assert_allclose(got, want, rtol=1e-12, atol=1e-14, err_msg=backend)
        assert np.all(got[~mask] == 0) and not np.signbit(got[~mask]).any(), backend


@pytest.mark.parametrize("backend", BACKENDS)
def test_masked_softmax_vjp_hidden_entries_stay_zero_whatever_their_cotangent(backend):
    """Where y = 0, the result is exactly 0 and adds nothing to the row's sum, even for a huge ȳ
    (inf·0 would be NaN)."""
    y = np.array([[0.25, 0.0, 0.75], [0.0, 0.0, 0.0]], np.float32)
    g = np.array([[1.0, 3e38, 2.0], [3e38, -3e38, 1.0]], np.float32)
    got = run(MASKED_SOFTMAX_VJP_REF, {"axis": "N", **F32}, [T("BN", (2, 3))] * 2, [y, g], backend)
    s = 0.25 * 1.0 + 0.75 * 2.0
    np.testing.assert_allclose(got, [[0.25 * (1 - s), 0.0, 0.75 * (2 - s)], [0, 0, 0]], rtol=1e-6)
    assert got[0, 1] == 0 and np.all(got[1] == 0)


@pytest.mark.parametrize("backend", BACKENDS)
def test_masked_softmax_vjp_after_masked_softmax_in_a_program(backend):
    b = ProgramBuilder()
    lg = b.input("l", {"H": 2, "K": 4, "Q": 3})
    m = b.input("m", {"K": 4, "Q": 3}, "boolean")
    g = b.input("g", {"H": 2, "K": 4, "Q": 3})
    y = b.op("masked-softmax", [lg, m], {"axis": "K", **F32})
    d = b.op("masked-softmax-vjp", [y, g], {"axis": "K", **F32}, ref=MASKED_SOFTMAX_VJP_REF)
    prog = b.build(outputs=[d])
    rng = np.random.default_rng(3)
    mask = rng.random((4, 3)) < 0.6
    mask[:, 0] = False
    inputs = {"l": rng.standard_normal((2, 4, 3)).astype(np.float32), "m": mask,
              "g": rng.standard_normal((2, 4, 3)).astype(np.float32)}
    want = assert_backends_agree(prog, inputs, backends=[backend])[d]
    assert np.all(want[:, ~mask] == 0)


# --- slice-vjp -----------------------------------------------------------------------------------
