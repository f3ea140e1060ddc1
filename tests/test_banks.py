"""Bank stores: safetensors and npz round trips, bundles stacked along K, fingerprints."""
from __future__ import annotations

import hashlib
import json

import numpy as np
import pytest
from safetensors.numpy import save_file

import runtime
from runtime import FormulaError
from runtime.program import loader
from runtime.api import open_bank_store
from runtime.execution.banks import BankOperand, NpzStore, SafetensorsStore, tensor_fingerprint
from runtime.execution.bindings import bind_values
from runtime.plugins.hookspecs import hookimpl
from runtime.plugins.registry import Registry
from runtime.testing import ProgramBuilder

SRC = "arti/formula-operand-bank@1"
RNG = np.random.default_rng(1)
A0, A1 = (RNG.standard_normal((3, 4)).astype(np.float32) for _ in range(2))
W = RNG.standard_normal((4, 2)).astype(np.float32)


def banks_registry():
    return Registry(autoload=False, builtins=("runtime.execution.banks",))


def program(fingerprints=None, bundle_asset=None, k_last=False):
    fingerprints = fingerprints or {}
    b = ProgramBuilder()
    axes = {"R": 3, "D": 4, "K": 2} if k_last else {"K": 2, "R": 3, "D": 4}
    b.bank("lora.A", axes, partition_id="A", bundle_id="lora", member_ids=["m0", "m1"],
           asset_fingerprint=bundle_asset)
    b.bank("w", {"D": 4, "E": 2}, partition_id="W", asset_fingerprint=fingerprints.get("W"))
    return loader.program(b.build(outputs=[]))


def write(tmp_path, fmt, tensors, metadata=None):
    path = tmp_path / f"banks.{fmt}"
    if fmt == "safetensors":
        save_file(tensors, str(path), metadata=metadata)
    else:
        extra = {"__metadata__": np.array(json.dumps(metadata))} if metadata else {}
        np.savez(path, **tensors, **extra)
    return path


def file_sha(path):
    return hashlib.sha256(path.read_bytes()).hexdigest()


def raises(code, path, fn, *args, match=None):
    with pytest.raises(FormulaError) as info:
        fn(*args)
    assert (info.value.code, info.value.path) == (code, path), info.value
    if match:
        assert match in info.value.message, info.value.message
    return info.value


@pytest.mark.parametrize("fmt", ["safetensors", "npz"])
@pytest.mark.parametrize("k_last", [False, True])
def test_round_trip_stacks_bundle_members_along_k(tmp_path, fmt, k_last):
    path = write(tmp_path, fmt, {"A/m0": A0, "A/m1": A1, "W": W})
    store = open_bank_store(path, banks_registry())
    assert isinstance(store, SafetensorsStore if fmt == "safetensors" else NpzStore)
    prog = program(k_last=k_last)
    bound = bind_values(prog, None, store)
    want = np.stack([A0, A1], axis=2 if k_last else 0)
    np.testing.assert_array_equal(bound.values["lora.A"], want)
    np.testing.assert_array_equal(bound.values["w"], W)
    op = store.resolve_bank(prog.binding("lora.A"), "$.banks.lora.A")
    assert isinstance(op, BankOperand)
    assert (op.source_ref, op.partition_id, op.bundle_id, op.member_ids) == (SRC, "A", "lora", ("m0", "m1"))


@pytest.mark.parametrize("fmt", ["safetensors", "npz"])
def test_fingerprints_are_verified(tmp_path, fmt):
    path = write(tmp_path, fmt, {"A/m0": A0, "A/m1": A1, "W": W}, {"source_ref": SRC})
    store = open_bank_store(str(path), banks_registry())
    prog = program({"W": tensor_fingerprint(W)}, bundle_asset=file_sha(path))
    bound = bind_values(prog, None, store)
    np.testing.assert_array_equal(bound.values["w"], W)

    bad_tensor = program({"W": "0" * 64}, bundle_asset=file_sha(path))
    raises("bank_identity", "$.banks.w", bind_values, bad_tensor, None, store, match="sha256")
    raises("bank_identity", "$.banks.w", store.resolve_bank, bad_tensor.binding("w"), "$.banks.w")
    bad_asset = program(bundle_asset="1" * 64)
    raises("bank_identity", "$.banks.lora.A", bind_values, bad_asset, None, store, match=file_sha(path))


def test_store_source_ref_metadata_must_match(tmp_path):
    path = write(tmp_path, "safetensors", {"A/m0": A0, "A/m1": A1, "W": W}, {"source_ref": "arti/other@2"})
    store = open_bank_store(path, banks_registry())
    raises("bank_identity", "$.banks.lora.A", bind_values, program(), None, store, match="arti/other@2")


def test_missing_tensors_are_named(tmp_path):
    path = write(tmp_path, "npz", {"A/m0": A0, "W": W})
    store = open_bank_store(path, banks_registry())
    err = raises("binding_keys", "$.banks.lora.A", bind_values, program(), None, store)
    assert "A/m1" in err.message and "W" in err.message
    path = write(tmp_path, "safetensors", {"A/m0": A0, "A/m1": A1})
    raises("binding_keys", "$.banks.w", bind_values, program(), None,
           open_bank_store(path, banks_registry()), match="'W', 'w'")


def test_members_of_different_shapes_are_refused(tmp_path):
    path = write(tmp_path, "npz", {"A/m0": A0, "A/m1": A1[:, :2].copy(), "W": W})
    raises("binding_shape", "$.banks.lora.A", bind_values, program(), None,
           open_bank_store(path, banks_registry()))


def test_store_values_are_checked_like_any_value(tmp_path):
    path = write(tmp_path, "npz", {"A/m0": A0, "A/m1": A1, "W": W.astype(np.float64)})
    raises("binding_dtype", "$.banks.w", bind_values, program(), None, open_bank_store(path, banks_registry()))


def test_single_member_bundle_without_k_reads_member_or_plain_tensor(tmp_path):
    b = ProgramBuilder()
    b.bank("lora.B", {"D": 4, "E": 2}, partition_id="B", bundle_id="lora", member_ids=["member-000"])
    prog = loader.program(b.build(outputs=[]))
    for key in ("B/member-000", "B"):
        path = write(tmp_path, "npz", {key: W})
        np.testing.assert_array_equal(
            bind_values(prog, None, open_bank_store(path, banks_registry())).values["lora.B"], W)


def test_open_bank_store_errors(tmp_path):
    reg = banks_registry()
    raises("bank_store", "$.banks", open_bank_store, tmp_path / "weights.bin", reg, match=".safetensors")
    raises("bank_store", "$.banks", open_bank_store, tmp_path / "missing.npz", reg, match="does not exist")
    (tmp_path / "junk.safetensors").write_bytes(b"not a safetensors file")
    raises("bank_store", "$.banks", open_bank_store, tmp_path / "junk.safetensors", reg)
    (tmp_path / "junk.npz").write_bytes(b"PK not a zip")
    raises("bank_store", "$.banks", open_bank_store, tmp_path / "junk.npz", reg)
    raises("bank_store", "$.banks", open_bank_store, 42, reg)


def test_npz_with_pickled_objects_is_refused(tmp_path):
    path = tmp_path / "obj.npz"
    np.savez(path, W=np.array([{"a": 1}], dtype=object))
    store = open_bank_store(path, banks_registry())
    b = ProgramBuilder()
    b.bank("w", {"D": 1}, partition_id="W")
    raises("bank_store", "$.banks.w", bind_values, loader.program(b.build(outputs=[])), None, store,
           match="pickle")


def test_plugin_openers_are_asked_through_the_hook_first_answer_wins_errors_wrapped():
    reg = banks_registry()
    sentinel = object()

    class Plugin:
        @hookimpl
        def formula_open_bank_store(self, location):
            if str(location).startswith("boom://"):
                return 1 / 0
            return sentinel if str(location).startswith("mem://") else None

    reg.register(Plugin(), None)
    assert open_bank_store("mem://x", reg) is sentinel
    raises("bank_store", "$.banks", open_bank_store, "boom://x", reg, match="ZeroDivisionError")
    raises("bank_store", "$.banks", open_bank_store, "boom://x", reg, match="plugin Plugin")
    raises("bank_store", "$.banks", open_bank_store, "nope://x", reg, match="no bank store opener")


def test_a_plugin_opener_may_claim_a_builtin_suffix(tmp_path):
    reg = banks_registry()
    sentinel = object()

    class Plugin:
        @hookimpl
        def formula_open_bank_store(self, location):
            return sentinel if str(location).endswith(".npz") else None

    reg.register(Plugin(), None)
    assert open_bank_store(tmp_path / "w.npz", reg) is sentinel  # the built-in opener runs last


def test_public_names():
    assert runtime.BankOperand is BankOperand and runtime.open_bank_store is open_bank_store
    assert BankOperand(W, source_ref=SRC, partition_id="W", member_ids="m").member_ids == ("m",)
