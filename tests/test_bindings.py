"""SPEC §4: every run-time binding rule, with its error code and JSON path."""
from __future__ import annotations

import hashlib

import numpy as np
import pytest

from runtime import FormulaError
from runtime.program import loader
from runtime.execution.banks import BankOperand
from runtime.execution.bindings import bind_values
from runtime.testing import ProgramBuilder

SRC = "arti/formula-operand-bank@1"


def program(build):
    """A program holding only bindings: bind_values needs the model, not the atoms."""
    b = ProgramBuilder()
    build(b)
    return loader.program(b.build(outputs=[]))


@pytest.fixture
def prog():
    def build(b):
        b.input("x", {"B": "B", "D": 4})
        b.input("gain", {})
        b.input("idx", {"B": "B"}, dtype="int64")
        b.input("mask", {"D": 4}, dtype="boolean")
        b.input("any", {"S": "S"}, dtype="floating")
        b.bank("w", {"D": 4, "E": 3}, partition_id="W")
    return program(build)


def good(prog, rng=np.random.default_rng(0)):
    inputs = {"x": rng.standard_normal((2, 4)).astype(np.float32), "gain": np.float32(0.5),
              "idx": np.array([0, 1]), "mask": np.ones(4, bool),
              "any": np.zeros(5, np.float16)}
    return inputs, {"w": rng.standard_normal((4, 3)).astype(np.float32)}


def raises(code, path, fn, *args, match=None):
    with pytest.raises(FormulaError) as info:
        fn(*args)
    assert info.value.code == code, info.value
    assert info.value.path == path, info.value
    if match:
        assert match in info.value.message, info.value.message
    return info.value


def test_valid_binding_keeps_arrays_and_dims(prog):
    inputs, banks = good(prog)
    bound = bind_values(prog, inputs, banks)
    assert bound.values["x"] is inputs["x"] and bound.values["w"] is banks["w"]
    assert bound.dims == {"B": 2, "S": 5}
    assert list(bound.values) == ["x", "gain", "idx", "mask", "any", "w"]
    assert bound.binding_bytes == sum(np.asarray(v).nbytes for v in [*inputs.values(), *banks.values()])


def test_fortran_strided_readonly_arrays_are_accepted_uncopied(prog):
    inputs, banks = good(prog)
    inputs["x"] = np.asfortranarray(inputs["x"])
    big = np.zeros((8, 6), np.float32)
    banks["w"] = big[::2, ::2]
    banks["w"].flags.writeable = False
    bound = bind_values(prog, inputs, banks)
    assert bound.values["x"] is inputs["x"] and bound.values["w"] is banks["w"]


def test_missing_and_extra_keys_name_them(prog):
    inputs, banks = good(prog)
    del inputs["x"]
    inputs["w"] = banks["w"]
    err = raises("binding_keys", "$.inputs", bind_values, prog, inputs, banks)
    assert "['x']" in err.message and "'w'" in err.message and "pass in banks" in err.message
    inputs, banks = good(prog)
    raises("binding_keys", "$.banks", bind_values, prog, inputs, {}, match="['w']")
    raises("binding_keys", "$.banks", bind_values, prog, inputs, None)
    raises("binding_keys", "$.banks", bind_values, prog, inputs, {**banks, "v": 1}, match="'v'")


def test_non_mapping_arguments_are_schema_errors(prog):
    inputs, banks = good(prog)
    raises("schema", "$.inputs", bind_values, prog, [1, 2], banks)
    raises("schema", "$.banks", bind_values, prog, inputs, 3)


def test_rank_extent_and_empty_axis(prog):
    inputs, banks = good(prog)
    raises("binding_shape", "$.inputs.x", bind_values, prog, {**inputs, "x": np.zeros((2, 4, 1), np.float32)},
           banks, match="rank 3")
    raises("binding_shape", "$.inputs.x", bind_values, prog, {**inputs, "x": np.zeros((2, 5), np.float32)},
           banks, match="axis D")
    raises("binding_shape", "$.inputs.x", bind_values, prog, {**inputs, "x": np.zeros((0, 4), np.float32)},
           {**banks}, match="empty")
    raises("binding_shape", "$.banks.w", bind_values, prog, inputs, {"w": np.zeros((3, 4), np.float32)})


def test_dtype_is_exact_and_floating_takes_any_float(prog):
    inputs, banks = good(prog)
    raises("binding_dtype", "$.inputs.x", bind_values, prog, {**inputs, "x": inputs["x"].astype(np.float64)},
           banks, match="float64")
    raises("binding_dtype", "$.inputs.idx", bind_values, prog, {**inputs, "idx": np.array([0, 1], np.int32)},
           banks)
    raises("binding_dtype", "$.inputs.mask", bind_values, prog, {**inputs, "mask": np.ones(4, np.uint8)}, banks)
    raises("binding_dtype", "$.inputs.any", bind_values, prog, {**inputs, "any": np.zeros(5, np.int64)}, banks)
    raises("binding_dtype", "$.inputs.any", bind_values, prog, {**inputs, "any": np.array(["a"] * 5)}, banks)
    for dt in (np.float32, np.float64):
        assert bind_values(prog, {**inputs, "any": np.zeros(5, dt)}, banks).values["any"].dtype == dt


def test_lists_and_objects_are_binding_dtype(prog):
    inputs, banks = good(prog)
    raises("binding_dtype", "$.inputs.x", bind_values, prog, {**inputs, "x": [[0.0] * 4] * 2}, banks,
           match="list")
    raises("binding_dtype", "$.banks.w", bind_values, prog, inputs, {"w": object()})
    raises("binding_dtype", "$.inputs.x", bind_values, prog,
           {**inputs, "x": np.ma.masked_array(inputs["x"])}, banks, match="masked")


def test_python_numbers_for_0d_bindings(prog):
    inputs, banks = good(prog)
    bound = bind_values(prog, {**inputs, "gain": 2}, banks)
    assert bound.values["gain"].dtype == np.float32 and bound.values["gain"].shape == ()
    assert float(bound.values["gain"]) == 2.0
    raises("binding_dtype", "$.inputs.gain", bind_values, prog, {**inputs, "gain": True}, banks)
    raises("nonfinite", "$.inputs.gain", bind_values, prog, {**inputs, "gain": float("nan")}, banks)
    raises("binding_shape", "$.inputs.x", bind_values, prog, {**inputs, "x": 1.0}, banks, match="rank 2")


def test_python_numbers_for_int_bool_and_floating_scalars():
    p = program(lambda b: (b.input("n", {}, dtype="int64"), b.input("flag", {}, dtype="boolean"),
                           b.input("f", {}, dtype="floating"), b.input("v", {"D": 2}, dtype="floating")))
    v = np.zeros(2, np.float16)
    bound = bind_values(p, {"n": 3, "flag": True, "f": 0.25, "v": v}, None)
    assert bound.values["n"].dtype == np.int64 and bound.values["flag"].dtype == np.bool_
    assert bound.values["f"].dtype == np.float16  # follows the other 'floating' values
    raises("binding_dtype", "$.inputs.n", bind_values, p, {"n": 1.5, "flag": True, "f": 1.0, "v": v}, None)
    raises("binding_dtype", "$.inputs.n", bind_values, p, {"n": 2**63, "flag": True, "f": 1.0, "v": v}, None)
    raises("binding_dtype", "$.inputs.flag", bind_values, p, {"n": 1, "flag": 1, "f": 1.0, "v": v}, None)
    raises("nonfinite", "$.inputs.f", bind_values, p, {"n": 1, "flag": True, "f": 1e6, "v": v}, None,
           match="1000000.0")


def test_nonfinite_values_are_located(prog):
    inputs, banks = good(prog)
    x = inputs["x"].copy()
    x[1, 2] = np.inf
    err = raises("nonfinite", "$.inputs.x", bind_values, prog, {**inputs, "x": x}, banks)
    assert "[1, 2]" in err.message and "inf" in err.message
    w = banks["w"].copy()
    w[0, 0] = np.nan
    raises("nonfinite", "$.banks.w", bind_values, prog, inputs, {"w": w}, match="nan")
    raises("nonfinite", "$.inputs.any", bind_values, prog,
           {**inputs, "any": np.array([1, 2, 3, 4, -np.inf], np.float16)}, banks)


def test_huge_finite_values_whose_sum_overflows_are_finite(prog):
    inputs, banks = good(prog)
    x = np.full((2, 4), 3e38, np.float32)
    any16 = np.full(5, 60000, np.float16)
    bind_values(prog, {**inputs, "x": x, "any": any16}, banks)


def test_symbol_conflict_names_both_places(prog):
    inputs, banks = good(prog)
    err = raises("symbol_conflict", "$.inputs.idx", bind_values, prog, {**inputs, "idx": np.arange(3)}, banks)
    assert "$.inputs.x axis B" in err.message and "$.inputs.idx axis B" in err.message


def test_big_endian_is_converted_not_refused(prog):
    inputs, banks = good(prog)
    be = inputs["x"].astype(">f4")
    bound = bind_values(prog, {**inputs, "x": be}, banks)
    assert bound.values["x"].dtype.isnative and np.array_equal(bound.values["x"], inputs["x"])


def test_caller_arrays_are_not_modified(prog):
    inputs, banks = good(prog)
    before = {k: np.array(v, copy=True) for k, v in inputs.items()}
    bind_values(prog, inputs, banks)
    for k, v in before.items():
        assert np.array_equal(inputs[k], v)


# --- bank operands -----------------------------------------------------------------------
def fingerprint(a):
    return hashlib.sha256(np.ascontiguousarray(a).tobytes()).hexdigest()


def bank_program(**bank):
    return program(lambda b: b.bank("w", {"D": 4, "E": 3}, **bank))


def test_bank_operand_identity_must_match():
    w = np.ones((4, 3), np.float32)
    p = bank_program(partition_id="W")
    assert bind_values(p, None, {"w": BankOperand(w, source_ref=SRC, partition_id="W")}).values["w"] is w
    raises("bank_identity", "$.banks.w", bind_values, p, None,
           {"w": BankOperand(w, source_ref="arti/other@1", partition_id="W")}, match="source_ref")
    raises("bank_identity", "$.banks.w", bind_values, p, None,
           {"w": BankOperand(w, source_ref=SRC, partition_id="V")}, match="partition_id")
    raises("bank_identity", "$.banks.w", bind_values, p, None,
           {"w": BankOperand(w, source_ref=SRC, partition_id="W", bundle_id="b", member_ids=["m"])},
           match="bundle_id")
    raises("bank_identity", "$.banks.w", bind_values, p, None,
           {"w": BankOperand(w, source_ref=SRC, partition_id="W", asset_fingerprint="0" * 64)},
           match="asset_fingerprint")


def test_bundle_operand_members_and_fingerprint_must_match():
    w = np.ones((4, 3), np.float32)
    p = bank_program(bundle_id="lora", member_ids=["m0"], asset_fingerprint="a" * 64)
    ok = BankOperand(w, source_ref=SRC, partition_id="w", bundle_id="lora", member_ids=["m0"],
                     asset_fingerprint="a" * 64)
    assert bind_values(p, None, {"w": ok}).values["w"] is w  # bundle assets are the store's to check
    raises("bank_identity", "$.banks.w", bind_values, p, None,
           {"w": BankOperand(w, source_ref=SRC, partition_id="w", bundle_id="lora", member_ids=["m1"],
                             asset_fingerprint="a" * 64)}, match="member_ids")


def test_asset_fingerprint_is_verified_for_plain_arrays_and_operands():
    w = np.arange(12, dtype=np.float32).reshape(4, 3)
    p = bank_program(asset_fingerprint=fingerprint(w))
    bind_values(p, None, {"w": w})
    bind_values(p, None, {"w": np.asfortranarray(w)})  # C-order bytes, whatever the layout
    bind_values(p, None, {"w": BankOperand(w, source_ref=SRC, partition_id="w",
                                           asset_fingerprint=fingerprint(w))})
    err = raises("bank_identity", "$.banks.w", bind_values, p, None, {"w": w + 1})
    assert fingerprint(w) in err.message


def test_input_given_an_operand_is_refused(prog):
    inputs, banks = good(prog)
    op = BankOperand(inputs["x"], source_ref=SRC, partition_id="x")
    raises("binding_dtype", "$.inputs.x", bind_values, prog, {**inputs, "x": op}, banks)


def test_store_object_resolves_banks_and_foreign_errors_are_wrapped(prog):
    inputs, banks = good(prog)

    class Store:
        def resolve_bank(self, binding, path, verify=True):
            return BankOperand(banks[binding.name], source_ref=binding.source_ref,
                               partition_id=binding.partition_id)

    class Broken:
        def resolve_bank(self, binding, path, verify=True):
            raise KeyError(binding.name)

    assert bind_values(prog, inputs, Store()).values["w"] is banks["w"]
    raises("bank_store", "$.banks.w", bind_values, prog, inputs, Broken(), match="KeyError")


@pytest.mark.parametrize("size", [3, 100, 5000, (1 << 18) + 7])
@pytest.mark.parametrize("dtype", [np.float32, np.float64, np.float16, "bfloat16"])
@pytest.mark.parametrize("layout", ["C", "F", "strided"])
@pytest.mark.parametrize("built", [True, False], ids=["scan built", "numpy until built"])
def test_finiteness_scan_finds_one_bad_value_in_every_size_regime(size, dtype, layout, built, monkeypatch):
    from runtime.execution.bindings import _all_finite
    from runtime.kernels import finite
    from runtime.kernels.finite import PARALLEL_MIN, SMALL

    if dtype == "bfloat16":
        dtype = pytest.importorskip("ml_dtypes").bfloat16
    if built:
        finite.prepare({np.dtype(dtype).name})
    else:
        monkeypatch.setattr(finite, "_ready", set())

    assert SMALL < 100 and 5000 < PARALLEL_MIN < (1 << 18) + 8  # the sizes cover each path
    base = np.ones((size, 2), dtype)
    a = {"C": base, "F": np.asfortranarray(base), "strided": base[:, :1]}[layout]
    assert _all_finite(a)
    # (a built scan decides every contiguous array past SMALL: half banks were summed in NumPy)
    assert (finite.all_finite(a) is not None) == (built and layout != "strided" and a.size >= SMALL)
    for bad in (np.nan, np.inf, -np.inf):
        b = a.copy(order="K") if layout != "strided" else base.copy()[:, :1]
        b[size // 2, 0] = bad
        assert not _all_finite(b), (size, layout, bad)
    huge = np.full_like(a, np.finfo(dtype).max)  # finite, and its sum overflows
    assert _all_finite(huge)


def _error(fn, *args):
    try:
        fn(*args)
    except FormulaError as exc:
        return exc.code, exc.path, exc.message
    return None


def test_a_warm_binder_checks_each_run_exactly_like_the_full_path(prog):
    from runtime.execution.bindings import Binder

    binder = Binder(prog)
    inputs, banks = good(prog)
    first = binder.bind(inputs, banks)
    assert binder._last is not None  # the fast path is armed for this structure
    x_inf = inputs["x"].copy()
    x_inf[1, 2] = np.inf
    w_nan = banks["w"].copy()
    w_nan[2, 1] = np.nan
    cases = {
        "inf in x": ({**inputs, "x": x_inf}, banks),
        "nan in a bank": (inputs, {"w": w_nan}),
        "-inf in a float16": ({**inputs, "any": np.array([1, -np.inf], np.float16)}, banks),
        "nan gain": ({**inputs, "gain": np.float32("nan")}, banks),
        "symbol conflict": ({**inputs, "idx": np.arange(3)}, banks),
        "wrong dtype": ({**inputs, "x": inputs["x"].astype(np.float64)}, banks),
        "missing": ({k: v for k, v in inputs.items() if k != "mask"}, banks),
        "extra": ({**inputs, "w": banks["w"]}, banks),
    }
    def bind_and_check(i, b):  # a new structure's finiteness is the executor's (``unchecked``)
        bound = binder.bind(i, b)
        binder.check_finite(bound, bound.unchecked, i, b)

    for name, (i, b) in cases.items():
        want = _error(bind_values, prog, i, b)
        assert want is not None, name
        assert _error(bind_and_check, i, b) == want, name
    be = binder.bind({**inputs, "x": inputs["x"].astype(">f4")}, banks)
    assert be.values["x"].dtype.isnative and np.array_equal(be.values["x"], inputs["x"])
    again = binder.bind(inputs, banks)
    assert again.dims == first.dims and again.binding_bytes == first.binding_bytes
    assert again.values["x"] is inputs["x"] and list(again.values) == list(first.values)


def test_the_fast_path_takes_equal_dtypes_that_are_distinct_objects(prog, monkeypatch):
    """The last structure is first matched by dtype identity; an equal dtype object that is
    not the builtin one (here: with metadata) still takes the fast path, through the key."""
    from runtime.execution import bindings
    from runtime.execution.bindings import Binder

    full = []
    plain = bindings.bind_values
    monkeypatch.setattr(bindings, "bind_values", lambda *a, **k: full.append(1) or plain(*a, **k))
    binder = Binder(prog)
    inputs, banks = good(prog)
    binder.bind(inputs, banks)
    again = binder.bind(inputs, banks)
    meta = np.dtype(np.float32, metadata={"origin": "test"})
    x = inputs["x"].astype(meta)
    assert x.dtype is not inputs["x"].dtype and x.dtype == inputs["x"].dtype
    other = binder.bind({**inputs, "x": x}, banks)
    assert len(full) == 1 and other.structure is again.structure and other.values["x"] is x
    binder.bind({**inputs, "x": inputs["x"][:1], "idx": inputs["idx"][:1]}, banks)  # B = 1: the full path
    assert len(full) == 2


def test_the_reference_backend_builds_no_compiled_scan(monkeypatch):
    """The oracle is plain NumPy, and the first run of a tiered executable runs on it while
    the compiled kernels build: the finiteness checks must not wait for a Numba compile."""
    import runtime
    from runtime.kernels import finite

    monkeypatch.setattr(finite, "_ready", set())
    b = __import__("runtime.build", fromlist=["ProgramBuilder"]).ProgramBuilder()
    program = b.build(outputs=[b.op("scalar-map", [b.input("x", {"T": "T"})], {"mode": "silu"})])
    x = np.ones(1 << 12, np.float32)
    assert runtime.compile(program, "reference").run(inputs={"x": x})
    assert finite._ready == set()
    with pytest.raises(runtime.FormulaError) as err:
        runtime.compile(program, "reference").run(inputs={"x": np.where(x > 0, np.nan, x)})
    assert err.value.code == "nonfinite" and finite._ready == set()
    runtime.compile(program, "cpu", tiered=False).run(inputs={"x": x})
    assert finite._ready == {"float32"}  # a compiled backend builds it with its plan


def test_a_torch_tensor_is_refused_with_the_view_to_pass_instead():
    """arti's callers pass torch tensors (docs/coming-from-arti.md): the message says how."""
    torch = pytest.importorskip("torch")
    import runtime

    b = ProgramBuilder()
    program = b.build(outputs=[b.op("scalar-map", [b.input("x", {"T": 4})], {"mode": "silu"})])
    t = torch.linspace(-1, 1, 4)
    with pytest.raises(FormulaError) as err:
        runtime.execute(program, inputs={"x": t}, backend="reference")
    assert err.value.code == "binding_dtype" and err.value.path == "$.inputs.x"
    assert "got a Tensor" in err.value.message and "tensor.numpy() (a view, no copy" in err.value.message
    out = runtime.execute(program, inputs={"x": t.numpy()}, backend="reference")
    assert torch.from_numpy(next(iter(out.values()))).shape == (4,)
