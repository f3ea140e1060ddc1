"""scalar-map-ext: gelu-tanh and softplus by hand, cpu/cuda against the reference, the fusion
expression against the reference, and infer errors."""
from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from runtime.plugins.atomspec import InferContext, bind_node
from runtime.core.errors import FormulaError

from norms_helpers import SPECS, TOL, run_kernel, ttype

SPEC = SPECS["scalar-map-ext"]


def gelu_tanh(z: float) -> float:
    return 0.5 * z * (1 + math.tanh(math.sqrt(2 / math.pi) * (z + 0.044715 * z**3)))


def test_reference_by_hand():
    x = np.array([-30.0, -1.0, 0.0, 0.5, 2.0, 40.0])
    got = run_kernel("scalar-map-ext", {"mode": "gelu-tanh"}, x, ("D",))
    np.testing.assert_allclose(got, [gelu_tanh(v) for v in x], rtol=1e-15, atol=1e-300)
    got = run_kernel("scalar-map-ext", {"mode": "softplus"}, x, ("D",))
    want = [math.log1p(math.exp(v)) for v in x]  # exp(40) is still finite in float64
    np.testing.assert_allclose(got, want, rtol=1e-14)
    assert got[-1] == 40.0 + math.log1p(math.exp(-40.0))  # no overflow for large inputs


def test_softplus_is_stable_in_float32():
    x = np.array([-80.0, 100.0], dtype=np.float32)  # exp(100) overflows float32; exp(-80) is normal
    got = run_kernel("scalar-map-ext", {"mode": "softplus"}, x, ("D",))
    assert got.dtype == np.float32 and np.all(np.isfinite(got))
    np.testing.assert_allclose(got, [math.exp(-80.0), 100.0], rtol=1e-6)


@pytest.mark.parametrize("mode", ["gelu-tanh", "softplus"])
def test_fusion_expression_matches_reference(mode):
    """The planner fuses through the ScalarOp text: it must compute what the kernels do."""
    node = bind_node(SPEC, {"mode": mode}, [ttype(("D",), (7,), "float64")])
    expr = SPEC.elementwise(node).expr
    x = np.linspace(-6, 6, 7)
    fused = [eval(expr.format("z"), {"math": math}, {"z": float(v)}) for v in x]  # noqa: S307
    np.testing.assert_allclose(fused, run_kernel("scalar-map-ext", {"mode": mode}, x, ("D",)),
                               rtol=1e-13, atol=1e-15)  # 1 + tanh cancels near z = -4


@st.composite
def cases(draw, max_side=5):
    rank = draw(st.integers(0, 3))
    shape = tuple(draw(st.integers(1, max_side)) for _ in range(rank))
    dtype = draw(st.sampled_from(["float32", "float64"]))
    mode = draw(st.sampled_from(["gelu-tanh", "softplus"]))
    x = (np.random.default_rng(draw(st.integers(0, 999))).standard_normal(shape) * 4).astype(dtype)
    return mode, x, ("A", "B", "C")[:rank]


@settings(deadline=None, max_examples=25)
@given(cases())
def test_cpu_matches_reference(case):
    mode, x, axes = case
    want = run_kernel("scalar-map-ext", {"mode": mode}, x, axes)
    got = run_kernel("scalar-map-ext", {"mode": mode}, x, axes, "cpu")
    np.testing.assert_allclose(got, want, **TOL[x.dtype.name])


def test_cpu_reads_transposed_read_only_inputs():
    x = np.arange(12.0).reshape(3, 4).T
    x.flags.writeable = False
    got = run_kernel("scalar-map-ext", {"mode": "softplus"}, x, ("A", "B"), "cpu")
    np.testing.assert_allclose(got, np.logaddexp(0, x), rtol=1e-13)


@pytest.mark.cuda
@settings(deadline=None, max_examples=6)
@given(cases(max_side=4))
def test_cuda_matches_reference(case):
    mode, x, axes = case
    want = run_kernel("scalar-map-ext", {"mode": mode}, x, axes)
    got = run_kernel("scalar-map-ext", {"mode": mode}, x, axes, "cuda")
    np.testing.assert_allclose(got, want, **TOL[x.dtype.name])


def infer(attributes, t):
    return SPEC.infer(InferContext(SPEC, "$.instructions[1]", attributes, [t], ["%x"]))


def test_infer_keeps_the_type():
    t = ttype(("T", "D"), ("T", 4), "floating")
    assert infer({"mode": "softplus"}, t).same_as(t)


@pytest.mark.parametrize("mode", ["gelu", "relu", "", 1, None])
def test_infer_rejects_unknown_modes(mode):
    with pytest.raises(FormulaError) as e:
        infer({"mode": mode}, ttype(("D",), (4,)))
    assert (e.value.code, e.value.path) == ("atom_attributes", "$.instructions[1].attributes.mode")
    assert "scalar-map-ext" in e.value.message


def test_infer_rejects_integer_operands():
    with pytest.raises(FormulaError) as e:
        infer({"mode": "gelu-tanh"}, ttype(("D",), (4,), "int64"))
    assert (e.value.code, e.value.path) == ("type_mismatch", "$.instructions[1].input_slots[0]")


def test_spec_declares_fusion():
    assert SPEC.elementwise is not None and SPEC.inplace == 0
    assert SPEC.ref == "formula-norms/formula-atom-scalar-map-ext@1"
