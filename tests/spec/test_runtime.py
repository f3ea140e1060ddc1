"""SPEC §4 (binding values at run time), §5 (memory limits before allocation) and the
promise that nothing the caller passes in is modified.
"""
from __future__ import annotations

import copy
import hashlib

import numpy as np
import pytest

import runtime

from .atom_cases import one
from .builders import ProgramBuilder, expect_error, seed, simple_add, under
from .test_valid_programs import D, R, seed_expected, seed_values

BANK = "arti/formula-operand-bank@sha256:c2f6e7173f8d22828ef8300806b6c853116b8d476af9e4822596e120f21babb1"
ANY = lambda path: True  # noqa: E731 — where SPEC.md fixes only the code


def run_seed(inputs, banks, backend="reference"):
    return runtime.execute(seed(), inputs=inputs, banks=banks, backend=backend)


def seed_error(code, paths, inputs, banks, backend="reference"):
    return expect_error(code, paths, run_seed, inputs, banks, backend)


# ---- binding_keys ------------------------------------------------------------------------

def test_missing_input_named():
    inputs, banks = seed_values(1, 2)
    del inputs["x"]
    err = seed_error("binding_keys", ("$.inputs", "$.inputs.x"), inputs, banks)
    assert "x" in err.message


def test_extra_input_named():
    inputs, banks = seed_values(1, 2)
    inputs["surplus"] = np.zeros(2, np.float32)
    err = seed_error("binding_keys", ("$.inputs", "$.inputs.surplus"), inputs, banks)
    assert "surplus" in err.message


def test_missing_and_extra_bank_named():
    inputs, banks = seed_values(1, 2)
    banks["lora.C"] = banks.pop("lora.B")
    err = seed_error("binding_keys", ("$.banks", "$.banks.lora.B", "$.banks.lora.C"), inputs, banks)
    assert "lora.B" in err.message or "lora.C" in err.message


def test_bank_passed_as_input():
    inputs, banks = seed_values(1, 2)
    inputs["lora.A"] = banks.pop("lora.A")
    seed_error("binding_keys", under("$.inputs", "$.banks"), inputs, banks)


# ---- binding_shape -------------------------------------------------------------------------

@pytest.mark.parametrize("shape", [(2, 1024), (1, 2, 1024, 1), (1, 2, 1023), ()])
def test_wrong_rank_or_static_extent(shape):
    inputs, banks = seed_values(1, 2)
    inputs["x"] = np.zeros(shape, np.float32)
    seed_error("binding_shape", "$.inputs.x", inputs, banks)


def test_wrong_bank_extent():
    inputs, banks = seed_values(1, 2)
    banks["lora.A"] = np.zeros((R + 1, D), np.float32)
    seed_error("binding_shape", "$.banks.lora.A", inputs, banks)


@pytest.mark.parametrize("shape", [(0, 2, D), (1, 0, D)])
def test_empty_symbolic_axis(shape):
    inputs, banks = seed_values(1, 2)
    inputs["x"] = np.zeros(shape, np.float32)
    inputs["base"] = np.zeros(shape, np.float32)
    seed_error("binding_shape", ("$.inputs.x", "$.inputs.base"), inputs, banks)


def test_python_number_for_non_scalar_binding():
    inputs, banks = seed_values(1, 2)
    inputs["x"] = 1.5
    seed_error("binding_shape", "$.inputs.x", inputs, banks)


@pytest.mark.parametrize("value", ["abc", None, object(), [[1.0]]], ids=["str", "None", "object", "list"])
def test_non_array_value(value):
    inputs, banks = seed_values(1, 2)
    inputs["x"] = value
    seed_error(("binding_shape", "binding_dtype", "schema"), "$.inputs.x", inputs, banks)


# ---- binding_dtype (no silent casts) --------------------------------------------------------

@pytest.mark.parametrize("dtype", [np.float64, np.float16, np.int64, np.bool_, np.int32])
def test_wrong_dtype(dtype):
    inputs, banks = seed_values(1, 2)
    inputs["x"] = inputs["x"].astype(dtype)
    seed_error("binding_dtype", "$.inputs.x", inputs, banks)


def test_wrong_bank_dtype():
    inputs, banks = seed_values(1, 2)
    banks["lora.B"] = banks["lora.B"].astype(np.float64)
    seed_error("binding_dtype", "$.banks.lora.B", inputs, banks)


def test_zero_d_array_of_other_dtype_is_not_cast():
    inputs, banks = seed_values(1, 2)
    inputs["lora.gain"] = np.array(0.5, np.float64)
    seed_error("binding_dtype", "$.inputs.lora.gain", inputs, banks)


@pytest.mark.parametrize("value", ["0.5", b"1", None], ids=repr)
def test_zero_d_non_number(value):
    inputs, banks = seed_values(1, 2)
    inputs["lora.gain"] = value
    seed_error(("binding_dtype", "binding_shape", "schema"), "$.inputs.lora.gain", inputs, banks)


def test_python_int_for_zero_d_float():
    inputs, banks = seed_values(1, 2)
    inputs["lora.gain"] = np.array(2.0, np.float32)
    expected = run_seed(inputs, banks)["%4"]
    inputs["lora.gain"] = 2
    np.testing.assert_array_equal(run_seed(inputs, banks)["%4"], expected)


def test_index_dtype_checked():
    prog = one("gather", [("v", ["N"], [4], "float32"), ("i", ["J"], [2], "int64")],
               {"axis": "N", "index_axis": "J"}, ["J"], [2])
    v = np.arange(4, dtype=np.float32)
    expect_error("binding_dtype", "$.inputs.i", runtime.execute, prog,
                 inputs={"v": v, "i": np.array([0, 1], np.int32)}, banks={}, backend="reference")


def test_floating_accepts_any_float_but_not_int():
    prog = one("scalar-map", [("v", ["N"], [2], "floating")], {"mode": "relu"}, ["N"], [2],
               "floating")
    for dtype in (np.float32, np.float64):
        out = runtime.execute(prog, inputs={"v": np.array([-1.0, 2.0], dtype)}, banks={},
                              backend="reference")["%0"]
        assert out.dtype == dtype
        np.testing.assert_array_equal(out, [0.0, 2.0])
    expect_error("binding_dtype", "$.inputs.v", runtime.execute, prog,
                 inputs={"v": np.array([1, 2], np.int64)}, banks={}, backend="reference")


# ---- nonfinite, symbol_conflict --------------------------------------------------------------

@pytest.mark.parametrize("where,name,bad", [
    ("inputs", "x", np.nan), ("inputs", "base", np.inf), ("banks", "lora.A", -np.inf),
    ("inputs", "lora.gain", np.nan)])
def test_nonfinite(where, name, bad):
    inputs, banks = seed_values(1, 2)
    target = inputs if where == "inputs" else banks
    value = np.array(target[name], copy=True)
    value.flat[value.size // 2] = bad
    target[name] = value
    seed_error("nonfinite", f"$.{where}.{name}", inputs, banks)


def test_nonfinite_python_number():
    inputs, banks = seed_values(1, 2)
    inputs["lora.gain"] = float("inf")
    seed_error("nonfinite", "$.inputs.lora.gain", inputs, banks)


def test_symbol_conflict():
    inputs, banks = seed_values(1, 2)
    inputs["x"] = np.zeros((2, 2, D), np.float32)
    seed_error("symbol_conflict", ("$.inputs.x", "$.inputs.base"), inputs, banks)


# ---- bank_identity -------------------------------------------------------------------------

def _operand(value, **over):
    identity = dict(source_ref=BANK, partition_id="A", asset_fingerprint=None, bundle_id="lora",
                    member_ids=("member-000",))
    identity.update(over)
    return runtime.BankOperand(value, **identity)


def test_matching_bank_operand_accepted():
    inputs, banks = seed_values(1, 2)
    expected = seed_expected(inputs, banks)
    banks["lora.A"] = _operand(banks["lora.A"])
    out = run_seed(inputs, banks)["%4"]
    np.testing.assert_allclose(out, expected, rtol=2e-5, atol=2e-5)


@pytest.mark.parametrize("field,value", [
    ("source_ref", "arti/formula-operand-bank@1"), ("partition_id", "B"),
    ("asset_fingerprint", "ab" * 32), ("bundle_id", "other"), ("bundle_id", None),
    ("member_ids", ("member-001",)), ("member_ids", ())])
def test_bank_operand_identity_differs(field, value):
    inputs, banks = seed_values(1, 2)
    banks["lora.A"] = _operand(banks["lora.A"], **{field: value})
    seed_error("bank_identity", "$.banks.lora.A", inputs, banks)


def _fingerprinted(value):
    b = ProgramBuilder()
    b.bank("w", ["N", "M"], [2, 3], asset_fingerprint=hashlib.sha256(
        np.ascontiguousarray(value).tobytes()).hexdigest())
    b.op("permute", ["w"], {"output_axes": ["M", "N"]}, ["M", "N"], [3, 2])
    return b.build()


def test_asset_fingerprint_verified():
    w = np.arange(6, dtype=np.float32).reshape(2, 3)
    prog = _fingerprinted(w)
    for value in (w, np.asfortranarray(w)):  # the fingerprint is of the C-order bytes
        out = runtime.execute(prog, inputs={}, banks={"w": value}, backend="reference")["%0"]
        np.testing.assert_array_equal(out, w.T)
    expect_error("bank_identity", "$.banks.w", runtime.execute, prog, inputs={},
                 banks={"w": w + 1}, backend="reference")
    operand = runtime.BankOperand(w, source_ref="arti/formula-operand-bank@1", partition_id="w",
                                  asset_fingerprint="cd" * 32)
    expect_error("bank_identity", "$.banks.w", runtime.execute, prog, inputs={},
                 banks={"w": operand}, backend="reference")


# ---- index_range, duplicate_index ------------------------------------------------------------

IDX_PATHS = under("$.inputs.i", "$.instructions[0]")
GATHER = lambda: one("gather", [("v", ["N", "D"], [4, 2], "float32"),  # noqa: E731
                                ("i", ["J"], [3], "int64")],
                     {"axis": "N", "index_axis": "J"}, ["J", "D"], [3, 2])
LOOKUP = lambda: one("lookup", [("t", ["V", "D"], [4, 2], "float32"),  # noqa: E731
                                ("i", ["B", "T"], [1, 3], "int64")],
                     {"table_axis": "V", "output_axes": ["B", "T", "D"]}, ["B", "T", "D"], [1, 3, 2])
SCATTER = lambda: one("scatter", [("b", ["N", "D"], [4, 2], "float32"),  # noqa: E731
                                  ("i", ["J"], [3], "int64"), ("u", ["J", "D"], [3, 2], "float32")],
                      {"axis": "N", "index_axis": "J", "mode": "replace"}, ["N", "D"], [4, 2])
TABLE = np.arange(8, dtype=np.float32).reshape(4, 2)


def _index_inputs(kind, idx):
    idx = np.array(idx, np.int64)
    if kind == "gather":
        return GATHER(), {"v": TABLE, "i": idx}
    if kind == "lookup":
        return LOOKUP(), {"t": TABLE, "i": idx.reshape(1, 3)}
    return SCATTER(), {"b": TABLE, "i": idx, "u": np.ones((3, 2), np.float32)}


@pytest.mark.parametrize("backend", ["reference", "cpu"])
@pytest.mark.parametrize("kind", ["gather", "lookup", "scatter"])
@pytest.mark.parametrize("idx", [[0, 4, 1], [0, -1, 2], [2, 1, 1 << 40]], ids=["extent", "neg", "huge"])
def test_index_range(kind, idx, backend):
    prog, inputs = _index_inputs(kind, idx)
    expect_error("index_range", IDX_PATHS, runtime.execute, prog, inputs=inputs, banks={},
                 backend=backend)


@pytest.mark.parametrize("backend", ["reference", "cpu"])
def test_duplicate_scatter_index(backend):
    prog, inputs = _index_inputs("scatter", [3, 1, 3])
    expect_error("duplicate_index", IDX_PATHS, runtime.execute, prog, inputs=inputs, banks={},
                 backend=backend)


# ---- §5 limits at run time, before allocation ------------------------------------------------

def _vector_program(**limits):
    b = ProgramBuilder()
    b.input("x", ["N"], ["N"])
    b.op("scalar-map", ["x"], {"mode": "relu"}, ["N"], ["N"])
    return b.build(**limits)


@pytest.mark.parametrize("limit,cap", [("max_axis_extent", 10), ("max_tensor_elements", 10),
                                       ("max_tensor_bytes", 40)])
def test_runtime_tensor_limits(limit, cap):
    exe = runtime.compile(_vector_program(**{limit: cap}), backend="reference")
    exe.run(inputs={"x": np.ones(10, np.float32)}, banks={})  # exactly at the cap
    err = expect_error("limit_exceeded", ANY, exe.run, inputs={"x": np.ones(11, np.float32)},
                       banks={})
    assert str(cap) in err.message


def test_working_bytes_boundary():
    # inputs 2·24 B + output 24 B, no temporaries: 72 bytes fit, 71 do not
    x = np.ones((2, 3), np.float32)
    ok = simple_add()
    ok["limits"]["max_working_bytes"] = 72
    runtime.execute(ok, inputs={"x": x, "y": x}, banks={}, backend="reference")
    bad = simple_add()
    bad["limits"]["max_working_bytes"] = 71
    expect_error("limit_exceeded", ANY, lambda: runtime.execute(
        bad, inputs={"x": x, "y": x}, banks={}, backend="reference"))


@pytest.mark.parametrize("backend", ["reference", "cpu"])
def test_huge_temporary_refused_before_allocation(backend):
    """[B,1]·[C,1] → [B,C] with B = C = 2·10⁵ needs 160 GB: refused, never attempted."""
    big = 1 << 62
    prog = one("contract", [("x", ["B", "K"], ["B", 1], "float32"),
                            ("y", ["C", "K"], ["C", 1], "float32")],
               {"reduce_axes": [["K", "K"]], "output_axes": ["B", "C"],
                "accumulation_dtype": "float32"}, ["B", "C"], ["B", "C"])
    prog["limits"].update(max_tensor_elements=big, max_tensor_bytes=big, max_working_bytes=1 << 34)
    x = np.ones((200_000, 1), np.float32)
    err = expect_error("limit_exceeded", ANY, runtime.execute, prog, inputs={"x": x, "y": x},
                       banks={}, backend=backend)
    assert "%0" in err.message or "working" in err.message


# ---- nothing the caller passed in is modified ---------------------------------------------------

@pytest.mark.parametrize("backend", ["reference", "cpu"])
def test_inputs_and_program_unchanged(backend):
    prog = seed()
    prog_before = copy.deepcopy(prog)
    inputs, banks = seed_values(2, 3)
    before = {k: np.array(v, copy=True) for k, v in {**inputs, **banks}.items()}
    runtime.execute(prog, inputs=inputs, banks=banks, backend=backend)
    assert prog == prog_before
    for k, v in {**inputs, **banks}.items():
        np.testing.assert_array_equal(v, before[k])
        assert v.flags.writeable


@pytest.mark.parametrize("backend", ["reference", "cpu"])
def test_read_only_fortran_and_strided_values(backend):
    inputs, banks = seed_values(2, 3)
    expected = seed_expected(inputs, banks)
    odd = {"base": np.asfortranarray(inputs["base"]),
           "x": np.repeat(inputs["x"], 2, axis=1)[:, ::2],  # strided view
           "lora.gain": inputs["lora.gain"]}
    odd_banks = {"lora.A": np.asfortranarray(banks["lora.A"]), 
                 "lora.B": np.repeat(banks["lora.B"], 2, axis=0)[::2]}
    for v in (*odd.values(), *odd_banks.values()):
        v.setflags(write=False)
    out = runtime.execute(seed(), inputs=odd, banks=odd_banks, backend=backend)["%4"]
    np.testing.assert_allclose(out, expected, rtol=2e-5, atol=2e-5)


def test_results_survive_the_next_run():
    exe = runtime.compile(seed(), backend="cpu")
    inputs, banks = seed_values(1, 2, rng_seed=1)
    first = exe.run(inputs=inputs, banks=banks)["%4"]
    kept = first.copy()
    inputs2, banks2 = seed_values(1, 2, rng_seed=2)
    exe.run(inputs=inputs2, banks=banks2)
    np.testing.assert_array_equal(first, kept)


def test_unknown_backend():
    expect_error("backend_unavailable", ANY, runtime.compile, simple_add(), backend="tpu")


def test_cuda_backend_or_unavailable():
    """SPEC §7: ``cuda`` runs where numba.cuda can (the simulator counts), else backend_unavailable."""
    from numba import cuda  # lazily: conftest switches the simulator on before numba loads

    x = np.arange(6, dtype=np.float32).reshape(2, 3)
    if not cuda.is_available():
        expect_error("backend_unavailable", ANY, lambda: runtime.execute(
            simple_add(), inputs={"x": x, "y": x}, banks={}, backend="cuda"))
        return
    out = runtime.execute(simple_add(), inputs={"x": x, "y": x}, banks={}, backend="cuda")["%0"]
    assert isinstance(out, np.ndarray) and out.dtype == np.float32
    np.testing.assert_array_equal(out, 2 * x)
