"""Building program dicts in Python: ``ProgramBuilder`` declares bindings, adds instructions
(their output types inferred by the atoms, so a wrong operand fails where it is added) and
returns a program ``runtime.load_program`` accepts. Needs no test framework.

    from runtime.build import ProgramBuilder

    b = ProgramBuilder()
    x = b.input("x", {"T": "T", "D": 8})
    y = b.op("scalar-map", [x], {"mode": "silu"})
    program = b.build(outputs=[y])
"""
from __future__ import annotations

import copy
from collections.abc import Mapping, Sequence
from typing import Any

from runtime.plugins import failures
from runtime.plugins.atomspec import InferContext
from runtime.program.model import type_to_dict
from runtime.core.types import TensorType
from runtime.program.validate import check_signature

DEFAULT_LIMITS = {
    "schema_ref": "arti/formula-limits@1", "schema_version": 1, "max_bindings": 32,
    "max_slots": 128, "max_instructions": 96, "max_steps": 64, "max_axes": 8,
    "max_axis_extent": 1 << 20, "max_tensor_elements": 1 << 28, "max_tensor_bytes": 1 << 30,
    "max_working_bytes": 1 << 31,
}


class ProgramBuilder:
    """Builds valid program dicts; instruction output types are inferred by the atoms.

        b = ProgramBuilder()
        x = b.input("x", {"T": "T", "D": 8})
        y = b.op("scalar-map", [x], {"mode": "silu"})
        program = b.build(outputs=[y])
    """

    def __init__(self, dtype: str = "float32", domain: str = "anonymous", registry=None):
        self.dtype, self.domain = dtype, domain
        self.registry = registry
        self.bindings: list[dict] = []
        self.slots: list[dict] = []
        self.instructions: list[dict] = []
        self.types: dict[str, TensorType] = {}
        self._steps: dict[str, int] = {}

    def _type(self, axes: Mapping[str, Any], dtype: str | None) -> TensorType:
        return TensorType(tuple(axes), tuple(axes.values()), dtype or self.dtype, self.domain)

    def input(self, name: str, axes: Mapping[str, Any], dtype: str | None = None) -> str:
        t = self._type(axes, dtype)
        self.bindings.append({"kind": "input", "name": name, "value_type": type_to_dict(t)})
        return self._slot(name, t, "input", name, "input")

    def bank(self, name: str, axes: Mapping[str, Any], dtype: str | None = None, *,
             source_ref: str = "arti/formula-operand-bank@1", partition_id: str | None = None,
             asset_fingerprint: str | None = None, bundle_id: str | None = None,
             member_ids: Sequence[str] = ()) -> str:
        t = self._type(axes, dtype)
        self.bindings.append({
            "kind": "bank", "name": name, "source_ref": source_ref,
            "partition_id": partition_id or name, "value_type": type_to_dict(t),
            "asset_fingerprint": asset_fingerprint, "route_ref": None, "bundle_id": bundle_id,
            "member_ids": list(member_ids)})
        return self._slot(name, t, "bank", name, "bank_operand")

    def op(self, atom: str, inputs: Sequence[str], attributes: Mapping[str, Any] | None = None,
           *, slot: str | None = None, step: int | None = None, ref: str | None = None) -> str:
        from runtime.plugins.registry import default_registry

        registry = self.registry or default_registry()
        # "scale", "reduce@2", "hardswish", or a whole reference ("arti/formula-atom-scale@1")
        ref = ref or (atom if "/" in atom else
                      short_ref(registry, atom, f"$.instructions[{len(self.instructions)}].atom_ref"))
        spec = registry.atom(ref, "$")
        iid = f"i{len(self.instructions)}"
        slot = slot or f"%{len(self.instructions)}"
        attributes = dict(attributes or {})
        check_signature(spec, inputs, attributes, f"$.instructions[{len(self.instructions)}]")
        ctx = InferContext(spec, f"$.instructions[{len(self.instructions)}]", attributes,
                            [self.types[s] for s in inputs], inputs)
        out = failures.infer(spec, ctx)
        step = step or 1 + max((self._steps.get(s, 0) for s in inputs), default=0)
        self.instructions.append({"instruction_id": iid, "step": step, "atom_ref": ref,
                                  "input_slots": list(inputs), "output_slot": slot,
                                  "attributes": copy.deepcopy(attributes)})
        self._steps[slot] = step
        return self._slot(slot, out, "instruction", iid, "temporary")

    def _slot(self, slot_id, t, producer, producer_id, role) -> str:
        self.types[slot_id] = t
        self.slots.append({"slot_id": slot_id, "value_type": type_to_dict(t), "producer": producer,
                           "producer_id": producer_id, "role": role})
        return slot_id

    def build(self, outputs: Sequence[str], limits: Mapping[str, Any] | None = None) -> dict:
        order = sorted(range(len(self.instructions)), key=lambda i: self.instructions[i]["step"])
        slots = copy.deepcopy(self.slots)
        for s in slots:
            if s["slot_id"] in outputs:
                s["role"] = "output"
        return {"schema_ref": "arti/formula-program@2", "schema_version": 2,
                "bindings": copy.deepcopy(self.bindings), "slots": slots,
                "instructions": [copy.deepcopy(self.instructions[i]) for i in order],
                "outputs": list(outputs), "limits": {**DEFAULT_LIMITS, **(limits or {})}}


def _short(ref: str) -> str:
    """``owner/formula-atom-name@N`` -> ``name@N`` (``name`` for N = 1): the name ``op`` takes."""
    family, _, version = ref.partition("@")
    name = family.rpartition("/")[2].removeprefix("formula-atom-")
    return name if version == "1" else f"{name}@{version}"


def short_ref(registry, atom: str, path: str = "$.atom_ref") -> str:
    """The reference a short atom name (``scale``, ``reduce@2``, ``hardswish``) stands for,
    among every plugin's atoms: the built-in ``arti/`` one first, else the one reference of
    that name; a name that several plugins register, or none, is ``unknown_atom`` listing the
    references it could mean (or the names close to it)."""
    from runtime.core.errors import did_you_mean, fail

    builtin = f"arti/formula-atom-{atom}" + ("" if "@" in atom else "@1")
    if builtin in registry.atoms:
        return builtin
    wanted = atom if "@" in atom else f"{atom}@1"
    matches = sorted(r for r in registry.atoms if _short(r) == atom or f"{_short(r)}@1" == wanted)
    if len(matches) == 1:
        return matches[0]
    if matches:
        fail("unknown_atom", path, f"atom name {atom!r} is registered by several plugins: "
                                   f"{', '.join(matches)}; pass the whole reference (ref=...)")
    fail("unknown_atom", path, f"no plugin registers an atom named {atom!r}"
         f"{did_you_mean(atom, {_short(r) for r in registry.atoms})}; pass a whole reference "
         f"(owner/name@N, see `formula atoms`) or a short name such as 'scale' or 'reduce@2'")
