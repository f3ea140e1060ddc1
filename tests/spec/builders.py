"""Builders of valid formula programs, written from SPEC.md only (no runtime internals).

The conformance suite starts from a small valid program and breaks one thing at a time, so
the builder's job is to make the valid part effortless and readable: bindings come with
their slots, instructions with their output slots (whose types the *test* declares, as the
spec's hand-computed expectation), roles follow ``outputs``, and steps default to the
smallest legal value. Everything returned is a plain JSON-compatible dict.
"""
from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import pytest

import runtime

PROGRAM_REF = "arti/formula-program@2"
TYPE_REF = "arti/formula-tensor-type@1"
LIMITS_REF = "arti/formula-limits@1"
BANK_SOURCE = "arti/formula-operand-bank@1"
DOMAIN = "anonymous"

SEED_PATH = Path(__file__).resolve().parents[2] / "examples" / "seed-lora-silu.program.json"

# SPEC §6: every code the runtime may raise (more may be added, none renamed).
SPEC_CODES = frozenset(
    """schema unsupported_schema invalid_name invalid_type duplicate slot_producer
    ssa_visibility invalid_step unknown_atom atom_signature atom_attributes type_mismatch
    invalid_output unsupported_route bank_bundle limit_exceeded binding_keys binding_shape
    binding_dtype nonfinite symbol_conflict index_range duplicate_index bank_identity
    plugin_conflict backend_unavailable""".split()
)

DEFAULT_LIMITS = {
    "max_bindings": 32, "max_slots": 128, "max_instructions": 96, "max_steps": 64,
    "max_axes": 8, "max_axis_extent": 1 << 20, "max_tensor_elements": 1 << 28,
    "max_tensor_bytes": 1 << 30, "max_working_bytes": 1 << 31,
}


def atom_ref(name: str) -> str:
    """The versioned reference the built-in plugin registers for atom ``name`` (``reduce@2``
    names a version; a bare name is version 1)."""
    return f"arti/formula-atom-{name}" + ("" if "@" in name else "@1")


def ttype(axes, sizes=None, dtype: str = "float32", domain: str = DOMAIN,
          schema_ref: str = TYPE_REF) -> dict[str, Any]:
    """A tensor-type record; ``sizes`` defaults to the axis names (all symbolic)."""
    axes = list(axes)
    return {"schema_ref": schema_ref, "axes": axes,
            "sizes": list(axes if sizes is None else sizes), "dtype": dtype, "domain": domain}


def limits(**overrides: int) -> dict[str, Any]:
    """A limits record with generous defaults, any field overridable."""
    return {"schema_ref": LIMITS_REF, "schema_version": 1, **DEFAULT_LIMITS, **overrides}


class ProgramBuilder:
    """Accumulates bindings and instructions; ``build()`` returns the program dict."""

    def __init__(self) -> None:
        self.bindings: list[dict[str, Any]] = []
        self.binding_slots: list[dict[str, Any]] = []
        self.instructions: list[dict[str, Any]] = []
        self.instruction_slots: list[dict[str, Any]] = []
        self._step_of: dict[str, int] = {}  # slot id -> producing step (0 for bindings)

    def input(self, name: str, axes, sizes=None, dtype: str = "float32",
              domain: str = DOMAIN) -> str:
        vt = ttype(axes, sizes, dtype, domain)
        self.bindings.append({"kind": "input", "name": name, "value_type": vt})
        self._binding_slot(name, vt, "input", "input")
        return name

    def bank(self, name: str, axes, sizes=None, dtype: str = "float32", domain: str = DOMAIN,
             source_ref: str = BANK_SOURCE, partition_id: str | None = None,
             asset_fingerprint: str | None = None, bundle_id: str | None = None,
             member_ids=()) -> str:
        vt = ttype(axes, sizes, dtype, domain)
        self.bindings.append({
            "kind": "bank", "name": name, "source_ref": source_ref,
            "partition_id": name if partition_id is None else partition_id, "value_type": vt,
            "asset_fingerprint": asset_fingerprint, "route_ref": None, "bundle_id": bundle_id,
            "member_ids": list(member_ids)})
        self._binding_slot(name, vt, "bank", "bank_operand")
        return name

    def _binding_slot(self, name, vt, producer, role) -> None:
        self.binding_slots.append({"slot_id": name, "value_type": copy.deepcopy(vt),
                                   "producer": producer, "producer_id": name, "role": role})
        self._step_of[name] = 0

    def op(self, atom: str, inputs, attributes: dict[str, Any], axes, sizes=None,
           dtype: str = "float32", domain: str = DOMAIN, step: int | None = None,
           slot: str | None = None) -> str:
        """Append an instruction of ``atom`` and its output slot of the declared type."""
        n = len(self.instructions)
        slot = f"%{n}" if slot is None else slot
        if step is None:
            step = 1 + max((self._step_of.get(s, 0) for s in inputs), default=0)
        iid = f"i{n}"
        self.instructions.append({
            "instruction_id": iid, "step": step, "atom_ref": atom_ref(atom),
            "input_slots": list(inputs), "output_slot": slot,
            "attributes": copy.deepcopy(attributes)})
        self.instruction_slots.append({"slot_id": slot, "value_type": ttype(axes, sizes, dtype, domain),
                                       "producer": "instruction", "producer_id": iid,
                                       "role": "temporary"})
        self._step_of[slot] = step
        return slot

    def build(self, outputs=None, **limit_overrides: int) -> dict[str, Any]:
        """The program; ``outputs`` defaults to the last instruction's slot."""
        if outputs is None:
            outputs = [self.instruction_slots[-1]["slot_id"]]
        outputs = list(outputs)
        slots = copy.deepcopy(self.binding_slots + self.instruction_slots)
        for s in slots:
            if s["producer"] == "instruction":
                s["role"] = "output" if s["slot_id"] in outputs else "temporary"
        return {"schema_ref": PROGRAM_REF, "schema_version": 2,
                "bindings": copy.deepcopy(self.bindings), "slots": slots,
                "instructions": copy.deepcopy(self.instructions), "outputs": outputs,
                "limits": limits(**limit_overrides)}


def seed() -> dict[str, Any]:
    """The seed program as shipped (content-pinned digest refs)."""
    return json.loads(SEED_PATH.read_text())


def seed_versioned() -> dict[str, Any]:
    """The seed with every digest ref replaced by its versioned form."""
    prog = seed()
    prog["schema_ref"] = PROGRAM_REF
    prog["limits"]["schema_ref"] = LIMITS_REF
    for rec in prog["bindings"] + prog["slots"]:
        rec["value_type"]["schema_ref"] = TYPE_REF
    for b in prog["bindings"]:
        if b["kind"] == "bank":
            b["source_ref"] = BANK_SOURCE
    for ins in prog["instructions"]:
        ins["atom_ref"] = ins["atom_ref"].split("@")[0] + "@1"
    return prog


def simple_add() -> dict[str, Any]:
    """``%0 = x + y`` over a static [N=2, M=3] float32 pair: the smallest two-operand program."""
    b = ProgramBuilder()
    b.input("x", ["N", "M"], [2, 3])
    b.input("y", ["N", "M"], [2, 3])
    b.op("add", ["x", "y"], {"accumulation_dtype": "activation"}, ["N", "M"], [2, 3])
    return b.build()


def slot_index(prog: dict[str, Any], slot_id: str) -> int:
    return next(i for i, s in enumerate(prog["slots"]) if s["slot_id"] == slot_id)


def expect_error(code, paths, fn, *args, **kwargs) -> runtime.FormulaError:
    """Call ``fn`` and require a FormulaError of ``code`` whose path is one of ``paths``.

    ``code`` is a string, or a tuple where SPEC §6 gives two readings; ``paths`` is a string,
    a tuple of acceptable strings or a predicate (see :func:`under`): where SPEC.md leaves
    the exact anchor open (the record or its field), the test accepts each reasonable one.
    """
    with pytest.raises(runtime.FormulaError) as info:
        fn(*args, **kwargs)
    err = info.value
    codes = (code,) if isinstance(code, str) else tuple(code)
    assert err.code in codes, f"expected code {code!r}, got {err.code!r}: {err}"
    if callable(paths):
        assert paths(err.path), f"path {err.path!r} not accepted by {paths!r}: {err}"
    else:
        allowed = (paths,) if isinstance(paths, str) else tuple(paths)
        assert err.path in allowed, f"expected path in {allowed}, got {err.path!r}: {err}"
    return err


def under(*prefixes: str):
    """A path predicate: the path is one of ``prefixes`` or lies inside one of them."""
    def accept(path: str) -> bool:
        return any(path == p or path.startswith(p + ".") or path.startswith(p + "[")
                   for p in prefixes)
    accept.__qualname__ = f"under{prefixes}"
    return accept


def load_error(code, paths, prog) -> runtime.FormulaError:
    return expect_error(code, paths, runtime.load_program, prog)


def all_types(prog: dict[str, Any]):
    """(path, type record) of every tensor type in the program, in document order."""
    for key in ("bindings", "slots"):
        for i, rec in enumerate(prog[key]):
            yield f"$.{key}[{i}].value_type", rec["value_type"]


def rename_binding(prog: dict[str, Any], old: str, new: str) -> dict[str, Any]:
    """Rename a binding everywhere (binding, its slot, readers), so only the name can be wrong."""
    for b in prog["bindings"]:
        if b["name"] == old:
            b["name"] = new
    for s in prog["slots"]:
        if s["slot_id"] == old:
            s["slot_id"] = s["producer_id"] = new
    for ins in prog["instructions"]:
        ins["input_slots"] = [new if x == old else x for x in ins["input_slots"]]
    return prog
