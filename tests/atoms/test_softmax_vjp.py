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



def _masked_probabilities(shape, kind, rng, dt):
    s, n = shape[-2:]
    if kind == "causal":
        visible = np.tril(np.ones((s, n), bool))
    else:  # key padding: the first 40 % of the keys, all hidden in the last row
        visible = np.zeros((s, n), bool)
        visible[:-1, : max(1, int(0.4 * n))] = True
    return softmax(rng.standard_normal(shape), np.broadcast_to(visible, shape), len(shape) - 1).astype(dt), visible


@pytest.mark.parametrize("dt", ["float32", "float64"])
@pytest.mark.parametrize("n", [15, 16, 37, 512])
@pytest.mark.parametrize("kind", ["causal", "padding"])
def test_masked_softmax_vjp_vector_rows_agree_with_the_oracle(dt, n, kind):
    """Contiguous rows (the axis last) on cpu take the vector rows (below, at and past a vector
    of lanes, with tails): equal to the reference within rounding; hidden entries exactly +0
    under an infinite cotangent; a NaN among the visible entries reaches its whole row."""
    from atoms.softmax_vjp import VECTOR_ROWS

    rng = np.random.default_rng(n)
    shape = (2, 3, 4, n)
    y, visible = _masked_probabilities(shape, kind, rng, dt)
    g = rng.standard_normal(shape).astype(dt)
    g[..., ~visible] = np.inf  # hidden: never read into a product
    y[1, 2, 0, 0] = np.nan  # (visible in every mask): that row only turns NaN
    attributes = {"axis": "N", "accumulation_dtype": "activation"}  # (the operands' dtype)
    types = [T("BHSN", shape, dt)] * 2
    want = run(MASKED_SOFTMAX_VJP_REF, attributes, types, [y, g], "reference")
    vector = VECTOR_ROWS[dt]
    got = run(MASKED_SOFTMAX_VJP_REF, attributes, types, [y, g], "cpu")
    assert vector.serial.signatures or vector.parallel.signatures, "the rows did not take the vector kernel"
    tol = {"float32": dict(rtol=2e-5, atol=2e-6), "float64": dict(rtol=1e-12, atol=1e-14)}[dt]
    np.testing.assert_allclose(got, want, **tol)
    hidden = np.broadcast_to(~visible, shape)
    assert np.all(got[hidden] == 0) and not np.signbit(got[hidden]).any()
    assert np.isnan(got[1, 2, 0, visible[0]]).all()
    assert np.isfinite(np.delete(got.reshape(-1, n), 20, axis=0)).all()  # (row 20 is [1, 2, 0])


def test_masked_softmax_vjp_rows_along_a_middle_axis_take_the_strided_kernel():
    """The softmax axis not last: the scalar rows read it with a stride, and still agree."""
    rng = np.random.default_rng(5)
    logits = rng.standard_normal((3, 40, 2))
    mask = rng.random((3, 40, 2)) < 0.7
    y = softmax(logits, mask, 1).astype(np.float32)
    g = rng.standard_normal((3, 40, 2)).astype(np.float32)
    types = [T("BNH", (3, 40, 2))] * 2
    want = run(MASKED_SOFTMAX_VJP_REF, {"axis": "N", **F32}, types, [y, g], "reference")
    got = run(MASKED_SOFTMAX_VJP_REF, {"axis": "N", **F32}, types, [y, g], "cpu")
    np.testing.assert_allclose(got, want, rtol=2e-5, atol=2e-6)
    assert np.all(got[~mask] == 0)


def test_masked_softmax_vjp_in_place_over_its_cotangent_in_a_program():
    """ȳ made inside the program (one reader): the output may take its buffer, and the vector
    rows read each element before they write it."""
    b = ProgramBuilder()
    y_in = b.input("y", {"H": 4, "S": 8, "K": 64})
    g_in = b.input("g", {"H": 4, "S": 8, "K": 64})
    two = b.input("two", {}, "float32")
    g2 = b.op("scale", [g_in, two], {"factor_axes": [], **F32})
    d = b.op("masked-softmax-vjp", [y_in, g2], {"axis": "K", **F32}, ref=MASKED_SOFTMAX_VJP_REF)
    prog = b.build(outputs=[d])
    rng = np.random.default_rng(9)
    y, visible = _masked_probabilities((4, 8, 64), "causal", rng, np.float32)
    inputs = {"y": y, "g": rng.standard_normal((4, 8, 64)).astype(np.float32), "two": np.float32(2)}
    want = assert_backends_agree(prog, inputs, backends=["cpu"])[d]
    assert np.all(want[:, ~visible] == 0)


# --- slice-vjp -----------------------------------------------------------------------------------
