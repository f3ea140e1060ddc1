"""Parsing untrusted JSON into the program model, one record at a time, with JSON paths.

Only the shape of each record is checked here (SPEC §2 field sets, JSON types, names,
tensor types, references); the rules that relate records to each other are in
``runtime.program.validate``. Nothing is executed and the caller's objects are never modified.
"""
from __future__ import annotations

import copy
import json
import os
import re
import stat
from pathlib import Path
from typing import Any

from runtime.core import settings
from runtime.core.errors import FormulaError, fail, json_kind as _kind
from runtime.program.model import (BANK_FIELDS, INPUT_FIELDS, INSTRUCTION_FIELDS, LIMIT_FIELDS, PROGRAM_FIELDS, SLOT_FIELDS, TENSOR_TYPE_FIELDS, BankBinding, InputBinding, Instruction, Limits, Program, Slot)
from runtime.core.refs import parse_ref
from runtime.core.types import BINDING_NAME_RE, DTYPES, NAME_RE, TensorType

SEED_DIGESTS = {
    "program": ("arti/formula-program", "215f631f44a79a6ffd2e59fcae801397c9f6e8abf597b8e836c98a8702142c0d", 2),
    "tensor": ("arti/formula-tensor-type", "2e8878cf1e99d96acf3eeada7c31268b4fa1a8594b97cee660de148db4bf4f0c", 1),
    "limits": ("arti/formula-limits", "8280c6ef583c507defa40a52a3b0b80aa29975b6013a6a86651fe23464a073cf", 1),
}
FINGERPRINT_RE = re.compile(r"^[0-9a-f]{64}$")


#: The default cap on program text (bytes); ``FORMULA_MAX_PROGRAM_BYTES`` overrides it.
DEFAULT_MAX_PROGRAM_BYTES = settings.MAX_PROGRAM_BYTES.default


def max_program_bytes(override: int | None = None) -> int:
    """The program text cap: the argument, else ``FORMULA_MAX_PROGRAM_BYTES``, else the default."""
    if override is not None:
        if isinstance(override, bool) or not isinstance(override, int) or override < 1:
            fail("schema", "$.max_bytes", f"max_bytes must be a positive int, got {override!r}")
        return override
    return settings.MAX_PROGRAM_BYTES.read()  # a malformed value: schema at "$", naming it


def read_source(src: Any, max_bytes: int | None = None) -> Any:
    """The parsed JSON of a path, JSON text or bytes; a dict or list is returned as is.

    Text and files are capped at ``max_program_bytes`` before any of it is parsed."""
    if isinstance(src, (dict, list)):
        check_unicode(src)
        return src
    cap = max_program_bytes(max_bytes)
    if isinstance(src, (bytes, bytearray, memoryview)):
        src = bytes(src)
        _check_size(len(src), cap, "program bytes")
        try:
            src = src.decode("utf-8")
        except UnicodeDecodeError as exc:
            fail("schema", "$", f"program bytes are not UTF-8: {exc}")
        return _parse_json(src, "program text")
    if isinstance(src, os.PathLike) or (isinstance(src, str) and not src.lstrip().startswith(("{", "["))
                                        and _exists(src)):
        path = Path(src)
        data = read_file_capped(path, cap)
        try:
            text = data.decode("utf-8")
        except UnicodeDecodeError as exc:
            fail("schema", "$", f"program file {str(path)!r} is not UTF-8: {exc}")
        return _parse_json(text, f"file {str(path)!r}")
    if isinstance(src, str):
        _check_size(len(src), cap, "program text")  # characters: a lower bound on its bytes
        if not src.lstrip().startswith(("{", "[")):
            try:
                return _parse_json(src, "program text")
            except FormulaError:  # neither JSON text nor an existing path: a missing path, if
                if _looks_like_path(src):  # it reads as one (mangled JSON stays a JSON error)
                    read_file_capped(Path(src), cap)
                raise
        return _parse_json(src, "program text")
    fail("schema", "$", f"expected a program as a path, JSON text, bytes or dict, got {type(src).__name__}")


def _looks_like_path(text: str) -> bool:
    """What a mistyped file name looks like: one line within PATH_MAX, no JSON brackets, and a
    directory separator or a ``.json`` ending (other non-JSON text stays a JSON error)."""
    name = text.strip()
    return (0 < len(name) < 4096 and not any(c in name for c in "\n{}[]")
            and ("/" in name or "\\" in name or name.lower().endswith(".json")))


def _exists(text: str) -> bool:
    """Whether a string names something on disk (else it is read as JSON text: ``"null"``)."""
    try:
        return os.path.lexists(text)
    except (OSError, ValueError):
        return False


def _check_size(size: int, cap: int, what: str, code: str = "limit_exceeded") -> None:
    if size > cap:
        fail(code, "$", f"{what} of {size} bytes exceeds the program size cap of {cap} bytes "
                                    "(FORMULA_MAX_PROGRAM_BYTES)")


def read_file_capped(path: Path, cap: int) -> bytes:
    """A regular file's bytes, at most ``cap`` of them; devices, FIFOs, sockets and directories
    are refused before they are opened for reading (a FIFO would block, a device never ends)."""
    where = str(path)
    try:
        st = os.stat(path)
    except (OSError, ValueError) as exc:
        fail("program_unreadable", "$", f"cannot read program file {where!r}: {_reason(exc)}; "
                                        "expected a readable regular file")
    if not stat.S_ISREG(st.st_mode):
        fail("program_unreadable", "$", f"program path {where!r} is {_file_kind(st.st_mode)}; "
                                        "expected a regular file")
    if st.st_size > cap:
        _check_size(st.st_size, cap, f"program file {where!r}", "program_unreadable")
    try:
        # O_NONBLOCK: if the path was swapped for a FIFO after the stat, open must not block
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0))
    except OSError as exc:
        fail("program_unreadable", "$", f"cannot open program file {where!r}: {_reason(exc)}; "
                                        "expected a readable regular file")
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            fail("program_unreadable", "$", f"program path {where!r} is not a regular file")
        with os.fdopen(fd, "rb", closefd=False) as f:
            data = f.read(cap + 1)
    except OSError as exc:
        fail("program_unreadable", "$", f"cannot read program file {where!r}: {_reason(exc)}")
    finally:
        os.close(fd)
    if len(data) > cap:
        _check_size(len(data), cap, f"program file {where!r}", "program_unreadable")
    return data


def _reason(exc: BaseException) -> str:
    return exc.strerror if isinstance(exc, OSError) and exc.strerror else str(exc)


def _file_kind(mode: int) -> str:
    for test, what in ((stat.S_ISDIR, "a directory"), (stat.S_ISFIFO, "a FIFO"),
                       (stat.S_ISCHR, "a character device"), (stat.S_ISBLK, "a block device"),
                       (stat.S_ISSOCK, "a socket")):
        if test(mode):
            return what
    return "not a regular file"


_SURROGATE_ESCAPE = re.compile(r"\\u[dD][89a-fA-F]")


def check_unicode(value: Any) -> None:
    """Every string (keys included) is a sequence of Unicode scalar values: a lone surrogate
    (JSON ``"\\ud800"``) cannot be encoded, so it would break every later print or hash."""
    try:  # one pass in C for the common case; the walk below only finds the path
        json.dumps(value, ensure_ascii=False).encode("utf-8")
        return
    except (UnicodeEncodeError, TypeError, ValueError, RecursionError):
        pass
    stack: list[tuple[Any, str]] = [(value, "$")]
    seen: set[int] = set()  # a dict given by the caller may refer to itself
    while stack:
        v, path = stack.pop()
        if isinstance(v, str):
            _scalar_string(v, path)
        elif isinstance(v, (dict, list, tuple)) and id(v) not in seen:
            seen.add(id(v))
            if isinstance(v, dict):
                for key, item in v.items():
                    if isinstance(key, str):
                        _scalar_string(key, path)
                    stack.append((item, f"{path}.{key}"))
            else:
                stack.extend((item, f"{path}[{i}]") for i, item in enumerate(v))


def _scalar_string(s: str, path: str) -> None:
    if not s.isascii() and not _is_encodable(s):
        fail("schema", path, f"string {ascii(s)} is not valid Unicode (it holds a lone surrogate)")


def _parse_json(text: str, what: str) -> Any:
    try:
        value = json.loads(text, parse_constant=_reject_constant)
    except FormulaError:
        raise
    except (ValueError, RecursionError) as exc:
        fail("schema", "$", f"{what} is not valid JSON: {exc}{_trailing_comma(text, exc)}")
    # a lone surrogate comes from a \\udXXX escape or from a str that was never UTF-8
    if _SURROGATE_ESCAPE.search(text) or not (text.isascii() or _is_encodable(text)):
        check_unicode(value)
    return value


def _trailing_comma(text: str, exc: Exception) -> str:
    """`` (a trailing comma: ...)`` when the JSON error is a comma before a closing bracket."""
    pos = getattr(exc, "pos", None)
    if pos is None or pos >= len(text) or text[pos] not in "}]":
        return ""
    before = text[:pos].rstrip()
    if not before.endswith(","):
        return ""
    line = before.count("\n") + 1
    return (f" (a trailing comma at line {line} column {len(before) - before.rfind(chr(10)) - 1}, "
            f"before {text[pos]!r}: JSON allows no comma after the last item)")


def _is_encodable(s: str) -> bool:
    try:
        s.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


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
    return Instruction(iid, step, atom_ref, tuple(inputs), output, _copied(attributes, f"{path}.attributes"))


_SCALARS = (str, int, float, bool, type(None))


def _copied(value: Any, path: str) -> Any:
    """A copy of JSON data (the caller's object is never shared); plain dicts and lists are
    copied directly, three times faster than ``deepcopy``, which handles anything else."""
    try:
        return _copy_json(value)
    except (RecursionError, _NotJSON):
        pass
    try:
        return copy.deepcopy(value)
    except RecursionError:
        fail("schema", path, "nested too deeply")
    except Exception as exc:  # an object of the caller's that cannot be copied
        fail("schema", path, f"cannot be copied as JSON data: {type(exc).__name__}: {exc}")


class _NotJSON(Exception):
    pass


def _copy_json(value: Any) -> Any:
    if type(value) is dict:
        return {k: v if type(v) in _SCALARS else _copy_json(v) for k, v in value.items()}
    if type(value) is list:
        return [v if type(v) in _SCALARS else _copy_json(v) for v in value]
    if type(value) in _SCALARS:
        return value
    raise _NotJSON


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

