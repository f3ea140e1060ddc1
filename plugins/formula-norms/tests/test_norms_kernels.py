"""rms-norm and layer-norm: hand-computed reference values, cpu/cuda against the reference,
and every infer rule (codes and paths)."""
from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from runtime.plugins.atomspec import InferContext, bind_node
from runtime.plugins.kernel import KernelRequest
from runtime.core.errors import FormulaError
from runtime.testing import real_cuda

from norms_helpers import SPECS, TOL, run_kernel, ttype

RMS = {"axis": "D", "epsilon": 1e-6, "accumulation_dtype": "float32"}
LN = {"axis": "D", "epsilon": 1e-5, "accumulation_dtype": "activation"}


# --- reference: hand-computed values ----------------------------------------------------
def test_rms_norm_reference_by_hand():
    x = np.array([[3.0, 4.0], [1.0, -1.0]])
    got = run_kernel("rms-norm", {**RMS, "epsilon": 0.5}, x, ("T", "D"))
    want = np.array([[3 / math.sqrt(12.5 + 0.5), 4 / math.sqrt(12.5 + 0.5)],
                     [1 / math.sqrt(1.5), -1 / math.sqrt(1.5)]])
    np.testing.assert_allclose(got, want, rtol=1e-15)


def test_norm_axis_is_chosen_by_name_not_position():
    x = np.array([[3.0, 1.0], [4.0, -1.0]])  # normalise down the columns: axis T is first
    got = run_kernel("rms-norm", {**RMS, "axis": "T", "epsilon": 0.5}, x, ("T", "D"))
    np.testing.assert_allclose(got[:, 0], [3 / math.sqrt(13.0), 4 / math.sqrt(13.0)], rtol=1e-15)
    np.testing.assert_allclose(got[:, 1], [1 / math.sqrt(1.5), -1 / math.sqrt(1.5)], rtol=1e-15)


def test_layer_norm_reference_by_hand():
    x = np.array([1.0, 2.0, 3.0, 4.0])
    got = run_kernel("layer-norm", {**LN, "epsilon": 0.25}, x, ("D",))
    np.testing.assert_allclose(got, (x - 2.5) / math.sqrt(1.25 + 0.25), rtol=1e-15)


def test_size_one_axis():
    x = np.array([[2.0], [-3.0]])
    rms = run_kernel("rms-norm", {**RMS, "epsilon": 1.0}, x, ("T", "D"))
    np.testing.assert_allclose(rms[:, 0], [2 / math.sqrt(5.0), -3 / math.sqrt(10.0)], rtol=1e-15)
    assert np.all(run_kernel("layer-norm", LN, x, ("T", "D")) == 0.0)


@pytest.mark.filterwarnings("ignore:overflow encountered:RuntimeWarning")
def test_float16_accumulates_in_float32_and_casts_back():
    x = np.array([300.0, 400.0], dtype=np.float16)  # x² overflows float16 (max 65504)
    got = run_kernel("rms-norm", {**RMS, "accumulation_dtype": "float32"}, x, ("D",))
    assert got.dtype == np.float16
    np.testing.assert_allclose(got.astype(np.float64), [0.8485, 1.1314], rtol=2e-3)
    bad = run_kernel("rms-norm", {**RMS, "accumulation_dtype": "activation"}, x, ("D",))
    assert np.all(bad == 0.0)  # in float16 the mean square is inf: activation really means it


def test_inputs_untouched_and_strided_views_accepted():
    base = np.arange(24, dtype=np.float64).reshape(4, 6) - 7.0
    x = base[:, ::2].T  # non-contiguous, transposed view
    x.flags.writeable = False
    before = base.copy()
    for backend in ("reference", "cpu"):
        got = run_kernel("layer-norm", LN, x, ("D", "T"), backend)
        want = (x - x.mean(0)) / np.sqrt(x.var(0) + 1e-5)
        np.testing.assert_allclose(got, want, rtol=1e-12)
    np.testing.assert_array_equal(base, before)


# --- cpu and cuda against the reference -------------------------------------------------
def _case(draw, max_side):
    rank = draw(st.integers(1, 3))
    axes = ("A", "B", "C")[:rank]
    shape = tuple(draw(st.integers(1, max_side)) for _ in range(rank))
    axis = draw(st.sampled_from(axes))
    dtype = draw(st.sampled_from(["float32", "float64"]))
    name = draw(st.sampled_from(["rms-norm", "layer-norm"]))
    acc = draw(st.sampled_from(["activation", "float32"]))
    eps = draw(st.sampled_from([1e-6, 1e-2, 1.0]))
    seed = draw(st.integers(0, 2**16))
    x = (np.random.default_rng(seed).standard_normal(shape) * 3 + 0.5).astype(dtype)
    return name, {"axis": axis, "epsilon": eps, "accumulation_dtype": acc}, x, axes


@st.composite
def cpu_cases(draw):
    return _case(draw, 6)


@st.composite
def cuda_cases(draw):
    return _case(draw, 70 if real_cuda() else 4)  # simulated: at most 64 elements


@settings(deadline=None, max_examples=30)
@given(cpu_cases())
def test_cpu_matches_reference(case):
    name, attrs_, x, axes = case
    want = run_kernel(name, attrs_, x, axes, "reference")
    got = run_kernel(name, attrs_, x, axes, "cpu")
    assert got.dtype == want.dtype
    np.testing.assert_allclose(got, want, **TOL[x.dtype.name])


@pytest.mark.cuda
@settings(deadline=None, max_examples=30 if real_cuda() else 8)
@given(cuda_cases())
def test_cuda_matches_reference(case):
    name, attrs_, x, axes = case
    want = run_kernel(name, attrs_, x, axes, "reference")
    got = run_kernel(name, attrs_, x, axes, "cuda")
    np.testing.assert_allclose(got, want, **TOL[x.dtype.name])


@pytest.mark.parametrize("backend", ["cpu", "cuda"])
def test_half_precision_needs_the_reference_backend(backend):
    spec = SPECS["rms-norm"]
    node = bind_node(spec, RMS, [ttype(("D",), (4,), "float16")])
    with pytest.raises(FormulaError) as e:
        spec.kernels[backend](KernelRequest(node))
    assert e.value.code == "backend_unavailable" and "float16" in e.value.message
    assert e.value.path == "$.instructions[0]"


# --- infer --------------------------------------------------------------------------------
def infer(name, attributes, t):
    spec = SPECS[name]
    return spec.infer(InferContext(spec, "$.instructions[3]", attributes, [t], ["%x"]))


@pytest.mark.parametrize("name", ["rms-norm", "layer-norm"])
def test_infer_symbolic_and_floating(name):
    t = ttype(("B", "S", "D"), ("B", "S", 64), "floating")
    out = infer(name, {**RMS, "axis": "S"}, t)
    assert out.same_as(t)


@pytest.mark.parametrize("key,value,needle", [
    ("axis", "E", "no axis 'E'"), ("axis", 3, "axis name"), ("epsilon", 0, "> 0"),
    ("epsilon", -1e-5, "> 0"), ("epsilon", "1e-5", "number"), ("epsilon", True, "number"),
    ("epsilon", math.inf, "finite"), ("epsilon", math.nan, "> 0"),
    ("accumulation_dtype", "float64", "activation"), ("accumulation_dtype", None, "string"),
])
@pytest.mark.parametrize("name", ["rms-norm", "layer-norm"])
def test_infer_rejects_attributes(name, key, value, needle):
    with pytest.raises(FormulaError) as e:
        infer(name, {**RMS, key: value}, ttype(("T", "D"), ("T", 8)))
    assert e.value.code == "atom_attributes"
    assert e.value.path == f"$.instructions[3].attributes.{key}"
    assert needle in e.value.message and name in e.value.message


@pytest.mark.parametrize("dtype", ["int64", "boolean"])
def test_infer_rejects_non_floating_operands(dtype):
    with pytest.raises(FormulaError) as e:
        infer("rms-norm", RMS, ttype(("T", "D"), (2, 8), dtype))
    assert e.value.code == "type_mismatch"
    assert e.value.path == "$.instructions[3].input_slots[0]" and dtype in e.value.message
