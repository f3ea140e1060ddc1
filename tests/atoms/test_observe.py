"""The observe atoms (SPEC §3b): infer errors, hand-computed values, cpu/cuda vs reference."""
from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

from atoms.observe import SPECS
from runtime.plugins.atomspec import InferContext
from runtime.core.errors import FormulaError
from runtime.testing import run_kernel
from runtime.core.types import TensorType

SPEC = {s.name: s for s in SPECS}
BACKENDS = ("reference", "cpu", "cuda")


def T(axes, sizes, dtype="float32", domain="d"):
    return TensorType(tuple(axes), tuple(sizes), dtype, domain)


def FOURIER(shape=(2, 3), mode="cartesian", eps=1e-6, policy="safe_training"):
    return {"spatial_shape": list(shape) if isinstance(shape, tuple) else shape, "state_mode": mode,
            "direction_epsilon": eps, "compile_policy": policy}


def four(b=2, n=6, d=3, t=2, s=2, dtype="float32"):
    return [T("BND", [b, n, d], dtype), T("BTS", [b, t, s], dtype), T("BN", [b, n], "boolean"),
            T("BT", [b, t], "boolean")]


def affine_types(d=3, s=2, **kw):
    return four(d=d, s=s, **kw) + [T("WS", [2 * d, s]), T("W", [2 * d])]


def infer(name, attributes, *types):
    ctx = InferContext(SPEC[name], "$.instructions[2]", attributes, types, [f"s{k}" for k in range(len(types))])
    return SPEC[name].infer(ctx)


def run(name, attributes, types, values, backend="reference"):
    return run_kernel(SPEC[name], attributes, types, values, backend)


def test_infer_output_types():
    types = [T("BND", ["B", "N", 4], "floating"), T("BTS", ["B", "T", 2], "float64"),
             T("BN", ["B", "N"], "boolean"), T("BT", ["B", "T"], "float32")]
    assert infer("observe-identity", {}, *types) == T("BTND", ["B", "T", "N", 4], "floating")
    out = infer("observe-fourier", FOURIER(shape=(2, 2)), T("BND", ["B", 4, 4]), *types[1:])
    assert out == T("BTND", ["B", "T", 4, 4])


def _replace(types, k, t):
    return types[:k] + [t] + types[k + 1:]


@pytest.mark.parametrize("name, attributes, types, code, path, needle", [
    ("observe-identity", {}, _replace(four(), 0, T("BN", [2, 6])), "type_mismatch", ".input_slots[0]", "rank 3"),
    ("observe-identity", {}, _replace(four(), 1, T("BT", [2, 2])), "type_mismatch", ".input_slots[1]", "rank 3"),
    ("observe-identity", {}, _replace(four(), 1, T("CTS", [2, 2, 2])), "type_mismatch", ".input_slots[1]", "'B'"),
    ("observe-identity", {}, _replace(four(), 1, T("BTS", [3, 2, 2])), "type_mismatch", ".input_slots[1]", "extents"),
    ("observe-identity", {}, _replace(four(), 1, T("BNS", [2, 6, 2])), "type_mismatch", ".input_slots[1]", "'N'"),
    ("observe-identity", {}, _replace(four(), 0, T("BND", [2, 6, 3], "int64")), "type_mismatch", ".input_slots[0]", "floating"),
    ("observe-identity", {}, _replace(four(), 1, T("BTS", [2, 2, 2], "boolean")), "type_mismatch", ".input_slots[1]", "floating"),
    ("observe-identity", {}, _replace(four(), 2, T("BN", [2, 6])), "type_mismatch", ".input_slots[2]", "boolean"),
    ("observe-identity", {}, _replace(four(), 2, T("NB", [6, 2], "boolean")), "type_mismatch", ".input_slots[2]", "exactly"),
    ("observe-identity", {}, _replace(four(), 2, T("BN", [2, 5], "boolean")), "type_mismatch", ".input_slots[2]", "extents"),
    ("observe-identity", {}, _replace(four(), 3, T("BT", [2, 2], "int64")), "type_mismatch", ".input_slots[3]", "boolean or floating"),
    ("observe-identity", {}, _replace(four(), 3, T("B", [2], "boolean")), "type_mismatch", ".input_slots[3]", "exactly"),
    ("observe-affine", {"scale": 0}, affine_types(), "atom_attributes", ".attributes.scale", "> 0"),
    ("observe-affine", {"scale": True}, affine_types(), "atom_attributes", ".attributes.scale", "number"),
    ("observe-affine", {"scale": math.inf}, affine_types(), "atom_attributes", ".attributes.scale", "finite"),
    ("observe-affine", {"scale": 1.0}, _replace(affine_types(), 4, T("WS", [5, 2])), "type_mismatch", ".input_slots[4]", "[6, 2]"),
    ("observe-affine", {"scale": 1.0}, _replace(affine_types(), 4, T("WQ", [6, 2])), "type_mismatch", ".input_slots[4]", "'S'"),
    ("observe-affine", {"scale": 1.0}, _replace(affine_types(), 5, T("V", [6])), "type_mismatch", ".input_slots[5]", "'W'"),
    ("observe-affine", {"scale": 1.0}, _replace(affine_types(), 5, T("W", [6], "float64")), "type_mismatch", "", "share one dtype"),
    ("observe-affine", {"scale": 1.0}, _replace(affine_types(), 0, T("BND", [2, 6, "D"])), "type_mismatch", "", "static"),
    ("observe-fourier", FOURIER(shape=(2,)), four(), "atom_attributes", ".attributes.spatial_shape", "two integers"),
    ("observe-fourier", FOURIER(shape=(0, 6)), four(), "atom_attributes", ".attributes.spatial_shape", "two integers"),
    ("observe-fourier", FOURIER(shape="2x3"), four(), "atom_attributes", ".attributes.spatial_shape", "two integers"),
    ("observe-fourier", FOURIER(shape=[True, 6]), four(), "atom_attributes", ".attributes.spatial_shape", "two integers"),
    ("observe-fourier", FOURIER(mode="spherical"), four(), "atom_attributes", ".attributes.state_mode", "'spherical'"),
    ("observe-fourier", FOURIER(eps=0.0), four(), "atom_attributes", ".attributes.direction_epsilon", "> 0"),
    ("observe-fourier", FOURIER(eps="small"), four(), "atom_attributes", ".attributes.direction_epsilon", "number"),
    ("observe-fourier", FOURIER(policy="eager"), four(), "atom_attributes", ".attributes.compile_policy", "'eager'"),
    ("observe-fourier", FOURIER(shape=(2, 2)), four(), "type_mismatch", ".input_slots[0]", "H·W = 4"),
    ("observe-fourier", FOURIER(mode="polar"), four(), "type_mismatch", ".input_slots[1]", "3 entries"),
])
def test_infer_errors(name, attributes, types, code, path, needle):
    with pytest.raises(FormulaError) as info:
        infer(name, attributes, *types)
    assert (info.value.code, info.value.path) == (code, "$.instructions[2]" + path), info.value
    assert needle in info.value.message


def test_affine_floating_bound_to_two_dtypes_is_binding_dtype():
    from runtime.plugins.atomspec import bind_node

    types = affine_types()
    types[5] = T("W", [6], "float64")
    with pytest.raises(FormulaError) as info:
        bind_node(SPEC["observe-affine"], {"scale": 1.0}, types)
    assert info.value.code == "binding_dtype"


def _values(seed=0, b=2, n=6, d=3, t=2, s=2, dtype=np.float32):
    rng = np.random.default_rng(seed)
    return [rng.standard_normal((b, n, d)).astype(dtype), (rng.standard_normal((b, t, s)) * 2).astype(dtype),
            rng.random((b, n)) < 0.7, rng.random((b, t)) < 0.7]


@pytest.mark.parametrize("backend", BACKENDS)
def test_identity_values(backend):
    x, states, mask, act = _values()
    act = np.array([[0.5, 1.0], [0.0, -2.0]], np.float64)  # a floating activity, cast to the value's dtype
    types = four()
    types[3] = T("BT", [2, 2], "float64")
    got = run("observe-identity", {}, types, [x, states, mask, act], backend)
    want = np.where(mask[:, None, :, None], x[:, None] * act[:, :, None, None].astype(np.float32), 0)
    np.testing.assert_array_equal(got, want)


@pytest.mark.parametrize("backend", BACKENDS)
def test_affine_values(backend):
    x, states, mask, act = _values()
    rng = np.random.default_rng(1)
    w, bias = rng.standard_normal((6, 2)).astype(np.float32), rng.standard_normal(6).astype(np.float32)
    got = run("observe-affine", {"scale": 0.25}, affine_types(), [x, states, mask, act, w, bias], backend)
    z = states.astype(np.float64) @ w.T.astype(np.float64) + bias
    alpha, beta = np.tanh(z[..., :3])[:, :, None], np.tanh(z[..., 3:])[:, :, None]
    y = (x[:, None] * (1 + 0.25 * alpha) + 0.25 * beta) * act[:, :, None, None]
    np.testing.assert_allclose(got, np.where(mask[:, None, :, None], y, 0), rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("backend", BACKENDS)
def test_fourier_integer_shift_is_a_roll_and_polar_epsilon(backend):
    x, _, _, _ = _values(b=1, n=12, t=3)
    mask, act = np.ones((1, 12), bool), np.ones((1, 3), bool)
    img = x[0].reshape(3, 4, 3)
    cart = np.array([[[1.0, 0.0], [0.0, 2.0], [-1.0, 1.0]]], np.float32)  # (dx, dy)
    got = run("observe-fourier", FOURIER(shape=(3, 4)), four(b=1, n=12, t=3), [x, cart, mask, act], backend)
    for k, (dx, dy) in enumerate([(1, 0), (0, 2), (-1, 1)]):
        want = np.roll(np.roll(img, dx, axis=1), dy, axis=0).reshape(12, 3)
        np.testing.assert_allclose(got[0, k], want, atol=2e-6)
    # polar: s0 · v/|v|; |v| <= ε gives no shift at all
    polar = np.array([[[2.0, 0.0, 5.0], [3.0, 1e-7, 0.0], [1.0, 3.0, 0.0]]], np.float32)
    got = run("observe-fourier", FOURIER(shape=(3, 4), mode="polar", eps=1e-6), four(b=1, n=12, t=3, s=3),
              [x, polar, mask, act], backend)
    np.testing.assert_allclose(got[0, 0], np.roll(img, 2, axis=0).reshape(12, 3), atol=2e-6)  # dy = 2
    np.testing.assert_allclose(got[0, 1], x[0], atol=2e-6)
    np.testing.assert_allclose(got[0, 2], np.roll(img, 1, axis=1).reshape(12, 3), atol=2e-6)  # dx = 1


def test_fourier_half_pixel_shift_uses_the_signed_frequencies():
    # W = 2, dx = 1/2: f_2 = [0, -1/2]; the Nyquist term's phase e^{iπ/2} is imaginary: Re drops it
    x = np.array([[[1.0], [3.0]]])
    got = run("observe-fourier", FOURIER(shape=(1, 2)), four(b=1, n=2, d=1, t=1, dtype="float64"),
              [x, np.array([[[0.5, 0.0]]]), np.ones((1, 2), bool), np.ones((1, 1), bool)])
    np.testing.assert_allclose(got[0, 0, :, 0], [2.0, 2.0], atol=1e-15)
    same = run("observe-fourier", FOURIER(shape=(1, 2), policy="fullgraph_forward"),
               four(b=1, n=2, d=1, t=1, dtype="float64"),
               [x, np.array([[[0.5, 0.0]]]), np.ones((1, 2), bool), np.ones((1, 1), bool)])
    np.testing.assert_array_equal(same, got)  # compile_policy does not change values


@settings(deadline=None, max_examples=4)
@given(seed=st.integers(0, 2**16), h=st.integers(1, 3), w=st.integers(1, 4), polar=st.booleans(),
       dtype=st.sampled_from(["float32", "float64"]))
def test_observe_devices_match_reference(seed, h, w, polar, dtype):
    s = 3 if polar else 2
    values = _values(seed, n=h * w, s=s, dtype=dtype)
    rng = np.random.default_rng(seed + 1)
    weight, bias = rng.standard_normal((6, s)).astype(dtype), rng.standard_normal(6).astype(dtype)
    types = four(n=h * w, s=s, dtype=dtype)
    atype = types + [T("WS", [6, s], dtype), T("W", [6], dtype)]
    tol = dict(rtol=1e-4, atol=1e-5) if dtype == "float32" else dict(rtol=1e-10, atol=1e-10)
    for name, attributes, tys, vals in [
            ("observe-identity", {}, types, values),
            ("observe-affine", {"scale": 0.7}, atype, values + [weight, bias]),
            ("observe-fourier", FOURIER(shape=(h, w), mode="polar" if polar else "cartesian"), types, values)]:
        want = run(name, attributes, tys, vals)
        for backend in ("cpu", "cuda"):
            np.testing.assert_allclose(run(name, attributes, tys, vals, backend), want, err_msg=f"{name} {backend}", **tol)


def test_fourier_tables_are_counted_in_the_working_bytes():
    from runtime.plugins.atomspec import bind_node

    node = bind_node(SPEC["observe-fourier"], FOURIER(shape=(2, 3)), four(b=2, t=5))
    assert SPEC["observe-fourier"].scratch_bytes(node, "cpu") == 2 * 5 * 2 * (4 + 6 - 2) * 4


def test_plan_counts_fourier_tables_and_refuses_when_they_do_not_fit():
    import runtime
    from tests.spec.atom_cases import VALID

    make, inputs = next(case[1:3] for case in VALID if case[0] == "observe-fourier")
    plan = runtime.compile(make(), backend="cpu").plan({})
    assert plan.scratch_bytes == 1 * 1 * 2 * (4 + 4 - 2) * 4
    assert plan.working_bytes == plan.binding_bytes + plan.arena_bytes + plan.output_bytes + plan.scratch_bytes
    program = make()
    program["limits"]["max_working_bytes"] = plan.working_bytes - 1
    with pytest.raises(FormulaError) as info:
        runtime.execute(program, inputs=inputs, banks={}, backend="cpu")
    assert info.value.code == "limit_exceeded" and "kernel scratch 48" in info.value.message
