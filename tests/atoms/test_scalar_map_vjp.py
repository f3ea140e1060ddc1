"""The gradient atom scalar-map-vjp@1: derivatives against float64 finite differences, the
conventions at kinks and IEEE edges, cpu and cuda against the reference, the contraction's
epilogue."""
from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

import runtime
from atoms._grad import SCALAR_MAP_VJP_REF
from atoms.elementwise import MODES_V2
from atoms.scalar_map_vjp import VJP_EXPRS, scalar_map_vjp_numpy
from runtime.core.types import numpy_dtype
from runtime.testing import ProgramBuilder, TOLERANCES, assert_backends_agree, real_cuda
from tests.atoms.gradient_helpers import BACKENDS, F32, INF, execute


def _forward(mode: str, x: np.ndarray) -> np.ndarray:
    from atoms.elementwise import scalar_map_numpy

    return scalar_map_numpy(mode, x)


# points away from each mode's kinks, domain edges and the softplus threshold
FD_POINTS = {
    "rsqrt": [0.05, 0.3, 1.0, 2.5, 40.0], "log": [0.05, 0.3, 1.0, 2.5, 40.0],
    "log1p": [-0.9, -0.3, 0.0, 1.5, 30.0], "reciprocal": [-3.0, -0.2, 0.1, 0.7, 5.0],
    "softplus": [-30.0, -2.0, 0.0, 3.0, 19.0, 21.0],
}
DEFAULT_POINTS = [-6.0, -2.5, -0.7, -0.1, 0.2, 0.9, 2.0, 5.5]


@pytest.mark.parametrize("mode", MODES_V2)
def test_scalar_map_vjp_is_the_derivative_float64(mode):
    """Central finite differences of scalar-map@2's own formula, in float64, with ȳ ≠ 1."""
    x = np.array(FD_POINTS.get(mode, DEFAULT_POINTS), np.float64)
    g = np.linspace(-2.0, 3.0, x.size)
    h = 1e-6 * np.maximum(1.0, np.abs(x))
    fd = g * (_forward(mode, x + h) - _forward(mode, x - h)) / (2 * h)
    np.testing.assert_allclose(scalar_map_vjp_numpy(mode, x, g), fd, rtol=1e-6, atol=1e-8)
    for backend in BACKENDS:
        got = _vjp(mode, "float64", x, g, backend)
        np.testing.assert_allclose(got, fd, rtol=1e-6, atol=1e-8, err_msg=backend)


def _vjp(mode, dtype, x, g, backend, acc="float32"):
    b = ProgramBuilder(dtype=dtype)
    xs, gs = b.input("x", {"N": len(x)}), b.input("g", {"N": len(x)})
    y = b.op("scalar-map-vjp", [xs, gs], {"mode": mode, "accumulation_dtype": acc}, ref=SCALAR_MAP_VJP_REF)
    dt = numpy_dtype(dtype)
    return execute(b.build(outputs=[y]), {"x": np.asarray(x, dt), "g": np.asarray(g, dt)}, backend)[y]


KINKS = {  # mode: (x, ȳ, ȳ·f′(x)) at the conventions of SPEC §3c and IEEE edges; exact in every dtype
    "relu": ([0.0, -0.0, -1.0, 2.0], [3.0, 3.0, 3.0, 3.0], [0.0, 0.0, 0.0, 3.0]),
    "abs": ([0.0, -0.0, -1.0, 2.0], [3.0, 3.0, 3.0, 3.0], [0.0, 0.0, -3.0, 3.0]),
    "softplus": ([21.0, 20.5, 0.0, 30.0], [2.0, 2.0, 2.0, -1.0], [2.0, 2.0, 1.0, -1.0]),
    "rsqrt": ([0.0, -0.0, -1.0, 4.0], [1.0, 1.0, 1.0, 1.0], [-INF, INF, math.nan, -1 / 16]),
    "log": ([0.0, -0.0, -2.0, 4.0], [1.0, 1.0, 1.0, 2.0], [INF, -INF, -0.5, 0.5]),
    "log1p": ([-1.0, 0.0, 1.0, -2.0], [1.0, 1.0, 2.0, 1.0], [INF, 1.0, 1.0, -1.0]),
    "reciprocal": ([0.0, -0.0, 2.0, -0.5], [1.0, 1.0, 1.0, 1.0], [-INF, -INF, -0.25, -4.0]),
    "exp": ([0.0, -1000.0, 1000.0, 1.0], [2.0, 1.0, 1.0, 1.0], [2.0, 0.0, INF, math.e]),
    "expm1": ([0.0, -1000.0, 1000.0, 1.0], [2.0, 1.0, 1.0, 1.0], [2.0, 0.0, INF, math.e]),
    "sigmoid": ([0.0, 1000.0, -1000.0, 0.0], [4.0, 1.0, 1.0, -2.0], [1.0, 0.0, 0.0, -0.5]),
    "silu": ([0.0, 1000.0, -1000.0, 0.0], [2.0, 1.0, 1.0, 1.0], [1.0, 1.0, 0.0, 0.5]),
    "tanh": ([0.0, 30.0, -30.0, 0.0], [2.0, 1.0, 1.0, -1.0], [2.0, 0.0, 0.0, -1.0]),
    "gelu": ([0.0, 50.0, -50.0, 0.0], [2.0, 1.0, 1.0, -1.0], [1.0, 1.0, 0.0, -0.5]),
    "sin": ([0.0, math.pi, 0.0, 0.0], [2.0, 1.0, 1.0, 1.0], [2.0, -1.0, 1.0, 1.0]),
    "cos": ([0.0, 0.5 * math.pi, 0.0, 0.0], [2.0, 1.0, 1.0, 1.0], [-0.0, -1.0, -0.0, -0.0]),
}


@pytest.mark.parametrize("dtype", ["float16", "float32", "float64"])
@pytest.mark.parametrize("mode", sorted(KINKS))
def test_scalar_map_vjp_conventions_and_ieee_edges(mode, dtype):
    x, g, want = KINKS[mode]
    want = np.array(want, np.float64)
    for backend in BACKENDS:
        got = _vjp(mode, dtype, x, g, backend).astype(np.float64)
        np.testing.assert_allclose(got, want, rtol=2e-3 if dtype == "float16" else 1e-6, atol=1e-6,
                                   err_msg=f"{mode} {dtype} {backend}")


def test_scalar_map_vjp_softplus_threshold_is_strict():
    """softplus′(x) = 1 only for x > 20: at 20 itself it is sigmoid(20) < 1 (float64)."""
    got = _vjp("softplus", "float64", [20.0, np.nextafter(20.0, 21.0)], [1.0, 1.0], "cpu")
    assert got[0] == 1 / (1 + math.exp(-20.0)) and got[1] == 1.0


def test_scalar_map_vjp_expressions_never_raise_in_plain_python():
    """The chain code runs as plain Python in the simulator and the tiers: no input may raise."""
    values = [0.0, -0.0, 1e-320, -1e-320, 1e-160, 1.0, -1.0, 20.0, 709.9, -709.9, 1e308, -1e308, INF, -INF,
              math.nan]
    for mode, expr in VJP_EXPRS.items():
        for x in values:
            for g in (0.0, 1.0, -INF, 1e308):
                eval(expr.format("x", "g"), {"math": math, "np": np}, {"x": x, "g": g})  # noqa: S307


@settings(deadline=None, max_examples=10)
@given(seed=st.integers(0, 2 ** 16), mode=st.sampled_from(MODES_V2),
       dtype=st.sampled_from(["float16", "bfloat16", "float32", "float64"]),
       acc=st.sampled_from(["float32", "activation"]), order=st.permutations("ABC"),
       extents=st.tuples(*[st.integers(1, 4)] * 3))
def test_scalar_map_vjp_cpu_matches_reference(seed, mode, dtype, acc, order, extents):
    rng = np.random.default_rng(seed)
    dt = numpy_dtype(dtype)
    x = rng.standard_normal(extents) * 3
    if mode in ("rsqrt", "log"):
        x = np.abs(x) + 0.1
    if mode in ("reciprocal",):
        x = np.where(np.abs(x) < 0.1, 0.5, x)
    b = ProgramBuilder(dtype=dtype)
    axes = dict(zip(order, extents))
    xs, gs = b.input("x", axes), b.input("g", axes)
    y = b.op("scalar-map-vjp", [xs, gs], {"mode": mode, "accumulation_dtype": acc}, ref=SCALAR_MAP_VJP_REF)
    rtol, atol = TOLERANCES[dtype]
    assert_backends_agree(b.build(outputs=[y]), {"x": x.astype(dt), "g": rng.standard_normal(extents).astype(dt)},
                          backends=["cpu"], rtol=rtol, atol=atol)


@settings(deadline=None, max_examples=25 if real_cuda() else 3)
@given(seed=st.integers(0, 2 ** 16), mode=st.sampled_from(MODES_V2))
def test_scalar_map_vjp_cuda_matches_reference(seed, mode):
    rng = np.random.default_rng(seed)
    x = np.abs(rng.standard_normal(6)) + 0.2
    g = rng.standard_normal(6)
    want = _vjp(mode, "float32", x, g, "reference")
    np.testing.assert_allclose(_vjp(mode, "float32", x, g, "cuda"), want, rtol=2e-4, atol=2e-5)


@pytest.mark.parametrize("dtype", ["float32", "float16"])
def test_scalar_map_vjp_joins_the_epilogue_of_the_contraction_producing_the_cotangent(dtype):
    b = ProgramBuilder(dtype=dtype)
    x = b.input("x", {"T": 4, "R": 3})
    u = b.input("u", {"T": 4, "D": 8})
    w = b.input("w", {"R": 3, "D": 8})
    g = b.op("contract", [u, w], {"reduce_axes": [["D", "D"]], "output_axes": ["T", "R"], **F32})
    y = b.op("scalar-map-vjp", [x, g], {"mode": "silu", **F32}, ref=SCALAR_MAP_VJP_REF)
    prog = b.build(outputs=[y])
    for backend in ("cpu", "cuda"):
        groups = runtime.compile(prog, backend=backend).plan().groups
        fused = [grp for grp in groups if grp.anchor is not None and grp.anchor.atom.name == "contract"]
        assert [n.atom.name for n in fused[0].nodes] == ["contract", "scalar-map-vjp"], backend
    rng = np.random.default_rng(2)
    dt = np.dtype(dtype)
    inputs = {k: rng.standard_normal(s).astype(dt) for k, s in (("x", (4, 3)), ("u", (4, 8)), ("w", (3, 8)))}
    rtol, atol = TOLERANCES[dtype]
    assert_backends_agree(prog, inputs, backends=["cpu", "cuda"], rtol=rtol, atol=atol)


# --- masked-softmax-vjp -----------------------------------------------------------------------------
