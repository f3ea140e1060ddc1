"""Parsing untrusted JSON into the program model, one record at a time, with JSON paths.

Only the shape of each record is checked here (SPEC §2 field sets, JSON types, names,
tensor types, references); the rules that relate records to each other are in
``runtime.validate``. Nothing is executed and the caller's objects are never modified.
"""
from __future__ import annotations

import copy
import json
import os
import re
from pathlib import Path
from typing import Any

from .errors import FormulaError, fail, json_kind as _kind
from .model import (BANK_FIELDS, INPUT_FIELDS, INSTRUCTION_FIELDS, LIMIT_FIELDS, PROGRAM_FIELDS,
                    SLOT_FIELDS, TENSOR_TYPE_FIELDS, BankBinding, InputBinding, Instruction,
                    Limits, Program, Slot)
from .refs import parse_ref
from .types import BINDING_NAME_RE, DTYPES, NAME_RE, TensorType

SEED_DIGESTS = {
    "program": ("arti/formula-program", "215f631f44a79a6ffd2e59fcae801397c9f6e8abf597b8e836c98a8702142c0d", 2),
    "tensor": ("arti/formula-tensor-type", "2e8878cf1e99d96acf3eeada7c31268b4fa1a8594b97cee660de148db4bf4f0c", 1),
    "limits": ("arti/formula-limits", "8280c6ef583c507defa40a52a3b0b80aa29975b6013a6a86651fe23464a073cf", 1),
}
FINGERPRINT_RE = re.compile(r"^[0-9a-f]{64}$")


def read_source(src: Any) -> Any:
    """The parsed JSON of a path, JSON text or bytes; a dict or list is returned as is."""
    if isinstance(src, (dict, list)):
        return src
    if isinstance(src, (bytes, bytearray, memoryview)):
        try:
            src = bytes(src).decode("utf-8")
        except UnicodeDecodeError as exc:
            fail("schema", "$", f"program bytes are not UTF-8: {exc}")
        return _parse_json(src, "program text")
    if isinstance(src, os.PathLike) or (isinstance(src, str) and not src.lstrip().startswith(("{", "["))):
        path = Path(src)
        try:
            text = path.read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError, ValueError) as exc:
            fail("schema", "$", f"cannot read program file {str(path)!r}: {exc}")
        return _parse_json(text, f"file {str(path)!r}")
    if isinstance(src, str):
        return _parse_json(src, "program text")
    fail("schema", "$", f"expected a program as a path, JSON text, bytes or dict, got {type(src).__name__}")


def _parse_json(text: str, what: str) -> Any:
    try:
        return json.loads(text, parse_constant=_reject_constant)
    except FormulaError:
        raise
    except (ValueError, RecursionError) as exc:
        fail("schema", "$", f"{what} is not valid JSON: {exc}")


def _reject_constant(name: str):
    fail("schema", "$", f"{name} is not valid JSON")


# --- records ------------------------------------------------------------------------------
def record(value: Any, path: str, fields: tuple[str, ...], what: str) -> dict[str, Any]:
    if not isinstance(value, dict):
        fail("schema", path, f"expected {what} object, got {_kind(value)}")
    for key in value:
        if key not in fields:
            fail("schema", f"{path}.{key}", f"unknown field {key!r} in {what} (fields: {', '.join(fields)})")
    for key in fields:
        if key not in value:
            fail("schema", f"{path}.{key}", f"missing field {key!r} in {what}")
    return value


def string(value: Any, path: str, what: str, empty_ok: bool = False) -> str:
    if not isinstance(value, str):
        fail("schema", path, f"{what} must be a string, got {_kind(value)}")
    if not value and not empty_ok:
        fail("schema", path, f"{what} must not be empty")
    return value


def array(value: Any, path: str, what: str) -> list[Any]:
    if not isinstance(value, list):
        fail("schema", path, f"{what} must be a list, got {_kind(value)}")
    return value


def name(value: Any, path: str, what: str, pattern: re.Pattern = BINDING_NAME_RE) -> str:
    string(value, path, what, empty_ok=True)
    if not pattern.match(value):
        fail("invalid_name", path, f"{what} {value!r} does not match {pattern.pattern}")
    return value


def schema_ref(value: Any, path: str, kind: str) -> str:
    ref = parse_ref(value, path)
    family, digest, version = SEED_DIGESTS[kind]
    if ref.family != family or not (ref.digest == digest or ref.version == version):
        fail("unsupported_schema", path,
             f"unsupported schema {value!r}; expected {family}@{version} or {family}@sha256:{digest}")
    return value


def schema_version(value: Any, path: str, supported: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        fail("schema", path, f"schema_version must be an integer, got {_kind(value)}")
    if value != supported:
        fail("unsupported_schema", path, f"schema_version {value} is not supported (expected {supported})")
    return value


def tensor_type(value: Any, path: str) -> TensorType:
    rec = record(value, path, TENSOR_TYPE_FIELDS, "a tensor type")
    ref = schema_ref(rec["schema_ref"], f"{path}.schema_ref", "tensor")
    axes = array(rec["axes"], f"{path}.axes", "axes")
    for i, axis in enumerate(axes):
        name(axis, f"{path}.axes[{i}]", "axis", NAME_RE)
    seen: set[str] = set()
    for i, axis in enumerate(axes):
        if axis in seen:
            fail("duplicate", f"{path}.axes[{i}]", f"axis {axis!r} appears twice in one type")
        seen.add(axis)
    sizes = array(rec["sizes"], f"{path}.sizes", "sizes")
    if len(sizes) != len(axes):
        fail("invalid_type", f"{path}.sizes",
             f"{len(sizes)} sizes for {len(axes)} axes {axes}: ranks must match")
    for i, size in enumerate(sizes):
        p = f"{path}.sizes[{i}]"
        if isinstance(size, str):
            if not NAME_RE.match(size):
                fail("invalid_name", p, f"size symbol {size!r} does not match {NAME_RE.pattern}")
        elif isinstance(size, bool) or not isinstance(size, int) or size < 1:
            fail("invalid_type", p, f"size {json.dumps(size)} of axis {axes[i]!r} is neither a "
                                    "positive integer nor a symbol")
    dtype = string(rec["dtype"], f"{path}.dtype", "dtype", empty_ok=True)
    if dtype not in DTYPES:
        fail("invalid_type", f"{path}.dtype", f"unknown dtype {dtype!r} (expected one of {', '.join(DTYPES)})")
    domain = string(rec["domain"], f"{path}.domain", "domain", empty_ok=True)
    if not domain:
        fail("invalid_type", f"{path}.domain", "domain must be a non-empty string")
    return TensorType(tuple(axes), tuple(sizes), dtype, domain, ref)


def binding(value: Any, path: str):
    if not isinstance(value, dict):
        fail("schema", path, f"expected a binding object, got {_kind(value)}")
    kind = value.get("kind")
    if kind == "input":
        rec = record(value, path, INPUT_FIELDS, "an input binding")
        return InputBinding(name(rec["name"], f"{path}.name", "binding name"),
                            tensor_type(rec["value_type"], f"{path}.value_type"))
    if kind != "bank":
        if "kind" not in value:
            fail("schema", f"{path}.kind", "missing field 'kind' in a binding")
        fail("schema", f"{path}.kind", f"binding kind must be 'input' or 'bank', got {json.dumps(kind)}")
    rec = record(value, path, BANK_FIELDS, "a bank binding")
    bname = name(rec["name"], f"{path}.name", "binding name")
    source = rec["source_ref"]
    parse_ref(source, f"{path}.source_ref")
    partition = string(rec["partition_id"], f"{path}.partition_id", "partition_id")
    vtype = tensor_type(rec["value_type"], f"{path}.value_type")
    fingerprint = rec["asset_fingerprint"]
    if fingerprint is not None:
        string(fingerprint, f"{path}.asset_fingerprint", "asset_fingerprint")
        if not FINGERPRINT_RE.match(fingerprint):
            fail("invalid_name", f"{path}.asset_fingerprint",
                 f"asset_fingerprint {fingerprint!r} is not 64 lowercase hex digits")
    if rec["route_ref"] is not None:
        fail("unsupported_route", f"{path}.route_ref",
             f"bank {bname!r} has route_ref {json.dumps(rec['route_ref'])}: routed banks are not supported")
    bundle = rec["bundle_id"]
    if bundle is not None:
        name(bundle, f"{path}.bundle_id", "bundle_id")
    members = array(rec["member_ids"], f"{path}.member_ids", "member_ids")
    for i, member in enumerate(members):
        name(member, f"{path}.member_ids[{i}]", "member id")
    seen: set[str] = set()
    for i, member in enumerate(members):
        if member in seen:
            fail("duplicate", f"{path}.member_ids[{i}]", f"member id {member!r} appears twice")
        seen.add(member)
    return BankBinding(bname, source, partition, vtype, fingerprint, None, bundle, tuple(members))


def slot(value: Any, path: str) -> Slot:
    rec = record(value, path, SLOT_FIELDS, "a slot")
    slot_id = string(rec["slot_id"], f"{path}.slot_id", "slot_id")
    vtype = tensor_type(rec["value_type"], f"{path}.value_type")
    producer = string(rec["producer"], f"{path}.producer", "producer")
    if producer not in ("input", "bank", "instruction"):
        fail("schema", f"{path}.producer", f"producer must be input, bank or instruction, got {producer!r}")
    producer_id = string(rec["producer_id"], f"{path}.producer_id", "producer_id")
    role = string(rec["role"], f"{path}.role", "role")
    if role not in ("input", "bank_operand", "temporary", "output"):
        fail("schema", f"{path}.role", f"role must be input, bank_operand, temporary or output, got {role!r}")
    return Slot(slot_id, vtype, producer, producer_id, role)


def instruction(value: Any, path: str) -> Instruction:
    rec = record(value, path, INSTRUCTION_FIELDS, "an instruction")
    iid = string(rec["instruction_id"], f"{path}.instruction_id", "instruction_id")
    step = rec["step"]
    if isinstance(step, bool) or not isinstance(step, int) or step < 1:
        fail("invalid_step", f"{path}.step", f"step must be a positive integer, got {json.dumps(step)}")
    atom_ref = rec["atom_ref"]
    parse_ref(atom_ref, f"{path}.atom_ref")
    inputs = array(rec["input_slots"], f"{path}.input_slots", "input_slots")
    for i, s in enumerate(inputs):
        string(s, f"{path}.input_slots[{i}]", "input slot")
    output = string(rec["output_slot"], f"{path}.output_slot", "output_slot")
    attributes = rec["attributes"]
    if not isinstance(attributes, dict):
        fail("schema", f"{path}.attributes", f"attributes must be an object, got {_kind(attributes)}")
    return Instruction(iid, step, atom_ref, tuple(inputs), output, copy.deepcopy(attributes))


def limits(value: Any, path: str) -> Limits:
    rec = record(value, path, LIMIT_FIELDS, "a limits record")
    ref = schema_ref(rec["schema_ref"], f"{path}.schema_ref", "limits")
    version = schema_version(rec["schema_version"], f"{path}.schema_version", 1)
    numbers = {}
    for key in LIMIT_FIELDS[2:]:
        v = rec[key]
        if isinstance(v, bool) or not isinstance(v, int):
            fail("schema", f"{path}.{key}", f"{key} must be a positive integer, got {_kind(v)}")
        if v < 1:
            fail("schema", f"{path}.{key}", f"{key} must be a positive integer, got {v}")
        numbers[key] = v
    return Limits(ref, version, **numbers)


def program(value: Any) -> Program:
    rec = record(value, "$", PROGRAM_FIELDS, "a program")
    ref = schema_ref(rec["schema_ref"], "$.schema_ref", "program")
    version = schema_version(rec["schema_version"], "$.schema_version", 2)
    lists = {key: array(rec[key], f"$.{key}", key) for key in ("bindings", "slots", "instructions", "outputs")}
    lim = limits(rec["limits"], "$.limits")
    for key, cap in (("bindings", lim.max_bindings), ("slots", lim.max_slots),
                     ("instructions", lim.max_instructions)):
        if len(lists[key]) > cap:
            fail("limit_exceeded", f"$.{key}", f"{len(lists[key])} {key} exceed max_{key} = {cap}")
    bindings = tuple(binding(b, f"$.bindings[{i}]") for i, b in enumerate(lists["bindings"]))
    slots = tuple(slot(s, f"$.slots[{i}]") for i, s in enumerate(lists["slots"]))
    instructions = tuple(instruction(x, f"$.instructions[{i}]") for i, x in enumerate(lists["instructions"]))
    outputs = tuple(string(o, f"$.outputs[{i}]", "output slot id") for i, o in enumerate(lists["outputs"]))
    return Program(ref, version, bindings, slots, instructions, outputs, lim)

