"""The program model: immutable records mirroring the JSON format (SPEC §2).

Loading builds these from untrusted JSON (see ``runtime.program.loader``); everything downstream works
on them, never on the raw dicts. ``Program.to_dict`` gives the JSON back field for field.
"""
from __future__ import annotations

import hashlib
import json
from functools import cached_property
from typing import Any, Union

import attrs

from runtime.core.types import TensorType

TENSOR_TYPE_FIELDS = ("schema_ref", "axes", "sizes", "dtype", "domain")
INPUT_FIELDS = ("kind", "name", "value_type")
BANK_FIELDS = ("kind", "name", "source_ref", "partition_id", "value_type", "asset_fingerprint",
               "route_ref", "bundle_id", "member_ids")
SLOT_FIELDS = ("slot_id", "value_type", "producer", "producer_id", "role")
INSTRUCTION_FIELDS = ("instruction_id", "step", "atom_ref", "input_slots", "output_slot", "attributes")
LIMIT_FIELDS = ("schema_ref", "schema_version", "max_bindings", "max_slots", "max_instructions",
                "max_steps", "max_axes", "max_axis_extent", "max_tensor_elements",
                "max_tensor_bytes", "max_working_bytes")
PROGRAM_FIELDS = ("schema_ref", "schema_version", "bindings", "slots", "instructions", "outputs",
                  "limits")


def type_to_dict(t: TensorType) -> dict[str, Any]:
    return {"schema_ref": t.schema_ref, "axes": list(t.axes), "sizes": list(t.sizes),
            "dtype": t.dtype, "domain": t.domain}


@attrs.frozen
class InputBinding:
    name: str
    value_type: TensorType
    kind: str = "input"

    def to_dict(self) -> dict[str, Any]:
        return {"kind": self.kind, "name": self.name, "value_type": type_to_dict(self.value_type)}


@attrs.frozen
class BankBinding:
    name: str
    source_ref: str
    partition_id: str
    value_type: TensorType
    asset_fingerprint: str | None
    route_ref: None
    bundle_id: str | None
    member_ids: tuple[str, ...]
    kind: str = "bank"

    def to_dict(self) -> dict[str, Any]:
        return {"kind": self.kind, "name": self.name, "source_ref": self.source_ref,
                "partition_id": self.partition_id, "value_type": type_to_dict(self.value_type),
                "asset_fingerprint": self.asset_fingerprint, "route_ref": self.route_ref,
                "bundle_id": self.bundle_id, "member_ids": list(self.member_ids)}


Binding = Union[InputBinding, BankBinding]


@attrs.frozen
class Slot:
    slot_id: str
    value_type: TensorType
    producer: str
    producer_id: str
    role: str

    def to_dict(self) -> dict[str, Any]:
        return {"slot_id": self.slot_id, "value_type": type_to_dict(self.value_type),
                "producer": self.producer, "producer_id": self.producer_id, "role": self.role}


@attrs.frozen(eq=False)
class Instruction:
    instruction_id: str
    step: int
    atom_ref: str
    input_slots: tuple[str, ...]
    output_slot: str
    attributes: dict[str, Any]  # a private deep copy of the JSON object; never mutated

    def to_dict(self) -> dict[str, Any]:
        return {"instruction_id": self.instruction_id, "step": self.step,
                "atom_ref": self.atom_ref, "input_slots": list(self.input_slots),
                "output_slot": self.output_slot, "attributes": json.loads(json.dumps(self.attributes))}


@attrs.frozen
class Limits:
    schema_ref: str
    schema_version: int
    max_bindings: int
    max_slots: int
    max_instructions: int
    max_steps: int
    max_axes: int
    max_axis_extent: int
    max_tensor_elements: int
    max_tensor_bytes: int
    max_working_bytes: int

    def to_dict(self) -> dict[str, Any]:
        return {f: getattr(self, f) for f in LIMIT_FIELDS}


@attrs.frozen(eq=False)
class Program:
    schema_ref: str
    schema_version: int
    bindings: tuple[Binding, ...]
    slots: tuple[Slot, ...]
    instructions: tuple[Instruction, ...]
    outputs: tuple[str, ...]
    limits: Limits

    def to_dict(self) -> dict[str, Any]:
        return {"schema_ref": self.schema_ref, "schema_version": self.schema_version,
                "bindings": [b.to_dict() for b in self.bindings],
                "slots": [s.to_dict() for s in self.slots],
                "instructions": [i.to_dict() for i in self.instructions],
                "outputs": list(self.outputs), "limits": self.limits.to_dict()}

    def to_json(self, indent: int | None = 2) -> str:
        return json.dumps(self.to_dict(), indent=indent)

    @cached_property
    def fingerprint(self) -> str:
        """sha256 of the canonical JSON (sorted keys, compact separators)."""
        text = json.dumps(self.to_dict(), sort_keys=True, separators=(",", ":"))
        return hashlib.sha256(text.encode()).hexdigest()

    @cached_property
    def _slots_by_id(self) -> dict[str, Slot]:
        return {s.slot_id: s for s in self.slots}

    def slot(self, slot_id: str) -> Slot:
        return self._slots_by_id[slot_id]

    @cached_property
    def _slot_indices(self) -> dict[str, int]:
        return {s.slot_id: i for i, s in enumerate(self.slots)}

    def slot_index(self, slot_id: str) -> int:
        return self._slot_indices[slot_id]

    def binding(self, name: str) -> Binding:
        return next(b for b in self.bindings if b.name == name)

    @property
    def input_bindings(self) -> tuple[InputBinding, ...]:
        return tuple(b for b in self.bindings if b.kind == "input")

    @property
    def bank_bindings(self) -> tuple[BankBinding, ...]:
        return tuple(b for b in self.bindings if b.kind == "bank")

    @cached_property
    def bank_signature(self) -> tuple:
        """What resident banks (``runtime.execution.resident``) must agree on to serve this program:
        every bank binding's name, declared type and identity."""
        return tuple((b.name, b.value_type, b.source_ref, b.partition_id, b.asset_fingerprint,
                      b.bundle_id, tuple(b.member_ids)) for b in self.bank_bindings)

    @property
    def symbols(self) -> tuple[str, ...]:
        seen: dict[str, None] = {}
        for s in self.slots:
            for size in s.value_type.sizes:
                if isinstance(size, str):
                    seen[size] = None
        return tuple(seen)

    def __repr__(self) -> str:
        return (f"<Program {self.fingerprint[:12]}: {len(self.bindings)} bindings, "
                f"{len(self.instructions)} instructions, outputs {list(self.outputs)}>")
