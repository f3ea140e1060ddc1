"""Valid programs compute what SPEC §3 says: the seed, symbolic axes, and every atom.

Expected values are computed by hand or by a NumPy line restating the spec's formula;
``reference`` must match them, and ``cpu`` must match ``reference``.
"""
from __future__ import annotations

import numpy as np
import pytest

import runtime

from .atom_cases import VALID, one
from .builders import ProgramBuilder, seed, seed_versioned

D = 1024
R = 32


def _silu(z):
    return z / (1.0 + np.exp(-z))


def seed_values(b: int, s: int, rng_seed: int = 0):
    rng = np.random.default_rng(rng_seed)
    inputs = {"base": rng.standard_normal((b, s, D), dtype=np.float32),
              "x": rng.standard_normal((b, s, D), dtype=np.float32) * np.float32(0.1),
              "lora.gain": np.array(0.75, np.float32)}
    banks = {"lora.A": rng.standard_normal((R, D), dtype=np.float32) * np.float32(0.1),
             "lora.B": rng.standard_normal((D, R), dtype=np.float32) * np.float32(0.1)}
    return inputs, banks


def seed_expected(inputs, banks):
    x = inputs["x"].astype(np.float64)
    a, bm = banks["lora.A"].astype(np.float64), banks["lora.B"].astype(np.float64)
    return inputs["base"] + float(inputs["lora.gain"]) * (_silu(x @ a.T) @ bm.T)


@pytest.mark.parametrize("backend", ["reference", "cpu"])
@pytest.mark.parametrize("make", [seed, seed_versioned], ids=["digest-refs", "versioned-refs"])
def test_seed_matches_numpy(make, backend):
    inputs, banks = seed_values(1, 3)
    res = runtime.execute(make(), inputs=inputs, banks=banks, backend=backend)
    assert set(res) == {"%4"}
    out = res["%4"]
    assert out.shape == (1, 3, D) and out.dtype == np.float32
    np.testing.assert_allclose(out, seed_expected(inputs, banks), rtol=2e-5, atol=2e-5)


def test_seed_symbols_bound_differently_per_run():
    exe = runtime.compile(seed(), backend="cpu")
    for b, s in ((1, 2), (2, 5), (3, 1)):
        inputs, banks = seed_values(b, s, rng_seed=b)
        out = exe.run(inputs=inputs, banks=banks)["%4"]
        assert out.shape == (b, s, D)
        np.testing.assert_allclose(out, seed_expected(inputs, banks), rtol=2e-5, atol=2e-5)


def test_seed_gain_as_python_number():
    inputs, banks = seed_values(1, 2)
    expected = seed_expected(inputs, banks)
    inputs["lora.gain"] = 0.75  # SPEC §4: Python numbers accepted for 0-d bindings
    out = runtime.execute(seed(), inputs=inputs, banks=banks, backend="reference")["%4"]
    assert out.dtype == np.float32
    np.testing.assert_allclose(out, expected, rtol=2e-5, atol=2e-5)


def _assert_matches(res, expected, out_slot="%0"):
    out = res[out_slot]
    expected = np.asarray(expected)
    assert out.shape == expected.shape
    tol = 1e-5 if out.dtype == np.float32 else 0
    if out.dtype.kind == "f":
        np.testing.assert_allclose(out.astype(np.float64), expected.astype(np.float64),
                                   rtol=tol, atol=tol)
    else:
        np.testing.assert_array_equal(out, expected)


@pytest.mark.parametrize("case_id,make,inputs,expected", VALID, ids=[c[0] for c in VALID])
def test_atom_reference(case_id, make, inputs, expected):
    res = runtime.execute(make(), inputs=inputs, banks={}, backend="reference")
    assert res["%0"].dtype == np.float32
    _assert_matches(res, expected)


@pytest.mark.parametrize("case_id,make,inputs,expected", VALID, ids=[c[0] for c in VALID])
def test_atom_cpu_matches_reference(case_id, make, inputs, expected):
    prog = make()
    ref = runtime.execute(prog, inputs=inputs, banks={}, backend="reference")["%0"]
    cpu = runtime.execute(prog, inputs=inputs, banks={}, backend="cpu")["%0"]
    assert cpu.dtype == ref.dtype and cpu.shape == ref.shape
    np.testing.assert_allclose(cpu, ref, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("backend", ["reference", "cpu"])
def test_reshape_infers_one_symbolic_size(backend):
    prog = one("reshape", [("v", ["B", "M"], ["B", 3], "float32")],
               {"output_axes": ["T"], "output_sizes": ["T"]}, ["T"], ["T"])
    exe = runtime.compile(prog, backend=backend)
    for b in (1, 4):
        v = np.arange(b * 3, dtype=np.float32).reshape(b, 3)
        np.testing.assert_array_equal(exe.run(inputs={"v": v}, banks={})["%0"], v.reshape(-1))


@pytest.mark.parametrize("backend", ["reference", "cpu"])
def test_chain_of_atoms_with_symbolic_batch(backend):
    """permute → scale → reduce over a symbolic axis; two outputs, one also read later."""
    b = ProgramBuilder()
    b.input("v", ["B", "M"], ["B", 3])
    b.input("f", ["M"], [3])
    p = b.op("permute", ["v"], {"output_axes": ["M", "B"]}, ["M", "B"], [3, "B"])
    s = b.op("scale", [p, "f"], {"factor_axes": ["M"], "accumulation_dtype": "float32"},
             ["M", "B"], [3, "B"])
    b.op("reduce", [s], {"axis": "B", "mode": "sum", "accumulation_dtype": "float32"}, ["M"], [3])
    prog = b.build(outputs=["%1", "%2"])
    v = np.arange(12, dtype=np.float32).reshape(4, 3)
    f = np.array([1.0, -1.0, 0.5], np.float32)
    res = runtime.execute(prog, inputs={"v": v, "f": f}, banks={}, backend=backend)
    np.testing.assert_allclose(res["%1"], (v * f).T)
    np.testing.assert_allclose(res["%2"], (v * f).sum(axis=0))


def test_float64_accumulation_and_int_dtypes():
    """acc=float32 on float64 operands computes in float64 (SPEC §3); permute keeps int64."""
    prog = one("reduce", [("v", ["N"], [3], "float64")],
               {"axis": "N", "mode": "sum", "accumulation_dtype": "float32"}, [], [], "float64")
    v = np.array([1.0, 2.0 ** -30, 2.0 ** -30], np.float64)
    out = runtime.execute(prog, inputs={"v": v}, banks={}, backend="reference")["%0"]
    assert out.dtype == np.float64 and out.shape == ()
    assert float(out) == 1.0 + 2.0 ** -29  # float32 arithmetic would give exactly 1.0
    prog = one("permute", [("v", ["N", "M"], [2, 2], "int64")], {"output_axes": ["M", "N"]},
               ["M", "N"], [2, 2], "int64")
    v = np.array([[1, 2], [3, 4]], np.int64)
    for backend in ("reference", "cpu"):
        out = runtime.execute(prog, inputs={"v": v}, banks={}, backend=backend)["%0"]
        assert out.dtype == np.int64
        np.testing.assert_array_equal(out, v.T)
