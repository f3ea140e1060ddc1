"""A program being extended: the forward program's records as JSON dicts, plus instructions
appended with their output types inferred by their atoms (so a rule that emits a malformed
instruction fails where it emits it), fresh names that collide with nothing, and steps."""
from __future__ import annotations

import copy
import re
from collections.abc import Mapping, Sequence
from typing import Any

from runtime.core.types import BINDING_NAME_RE, TensorType
from runtime.plugins.atomspec import AtomSpec, InferContext
from runtime.program.model import Program, type_to_dict
from runtime.program.validate import check_signature

OWN_ATOMS = ("fill", "scalar-map-vjp", "masked-softmax-vjp", "slice-vjp", "window-vjp")


def atom_ref(atom: str) -> str:
    """``"scale"`` -> ``arti/formula-atom-scale@1``, ``"reduce@2"`` -> ``…-reduce@2``, the
    gradient atoms under the project's owner (SPEC §3c); a whole reference is kept."""
    if "/" in atom:
        return atom
    name, _, version = atom.partition("@")
    owner = "formula-runtime" if name in OWN_ATOMS else "arti"
    return f"{owner}/formula-atom-{name}@{version or 1}"


class ProgramWriter:
    """The forward program's bindings, slots and instructions, unchanged, and what is added."""

    def __init__(self, program: Program, registry):
        self.registry = registry
        self.program = program
        data = program.to_dict()
        self.bindings: list[dict] = data["bindings"]
        self.slots: list[dict] = data["slots"]
        self.instructions: list[dict] = data["instructions"]
        self.limits: dict = data["limits"]
        self.types: dict[str, TensorType] = {s.slot_id: s.value_type for s in program.slots}
        self.steps: dict[str, int] = {b.name: 0 for b in program.bindings}
        self.producers: dict[str, str] = {s.slot_id: s.producer for s in program.slots}
        for ins in program.instructions:
            self.steps[ins.output_slot] = ins.step
        self._names = {*self.types, *(i.instruction_id for i in program.instructions)}
        self._symbols = set(program.symbols)
        self._counter = 0

    # --- names -------------------------------------------------------------------------
    def fresh(self, stem: str) -> str:
        """A name no slot, binding or instruction uses yet."""
        name = stem
        while name in self._names:
            self._counter += 1
            name = f"{stem}{self._counter}"
        self._names.add(name)
        return name

    def fresh_symbol(self, stem: str = "N") -> str:
        name, k = stem, 0
        while name in self._symbols:
            k += 1
            name = f"{stem}{k}"
        self._symbols.add(name)
        return name

    def binding_name(self, stem: str) -> str:
        clean = re.sub(r"[^A-Za-z0-9_.-]", "", stem).strip(".-_") or "value"
        name = f"cotangent.{clean}"
        assert BINDING_NAME_RE.match(name)
        return self.fresh(name)

    # --- records -----------------------------------------------------------------------
    def input(self, name: str, t: TensorType) -> str:
        self.bindings.append({"kind": "input", "name": name, "value_type": type_to_dict(t)})
        self.slots.append({"slot_id": name, "value_type": type_to_dict(t), "producer": "input",
                           "producer_id": name, "role": "input"})
        self.types[name] = t
        self.steps[name] = 0
        self.producers[name] = "input"
        return name

    def spec(self, atom: str, path: str = "$") -> AtomSpec:
        return self.registry.atom(atom_ref(atom), path)

    def op(self, atom: str, inputs: Sequence[str], attributes: Mapping[str, Any]) -> str:
        """Append one instruction; its type comes from the atom's ``infer`` (which raises a
        FormulaError when the operands or attributes are wrong)."""
        ref = atom_ref(atom)
        index = len(self.instructions)
        path = f"$.instructions[{index}]"
        spec = self.registry.atom(ref, f"{path}.atom_ref")
        attributes = copy.deepcopy(dict(attributes))
        inputs = list(inputs)
        check_signature(spec, inputs, attributes, path)
        out = spec.infer(InferContext(spec, path, attributes, [self.types[s] for s in inputs], inputs))
        iid = self.fresh("vjp")
        slot = self.fresh("%vjp")
        step = 1 + max((self.steps[s] for s in inputs), default=0)
        self.instructions.append({"instruction_id": iid, "step": step, "atom_ref": ref,
                                  "input_slots": inputs, "output_slot": slot, "attributes": attributes})
        self.slots.append({"slot_id": slot, "value_type": type_to_dict(out), "producer": "instruction",
                           "producer_id": iid, "role": "temporary"})
        self.types[slot] = out
        self.steps[slot] = step
        self.producers[slot] = "instruction"
        return slot

    def build(self, outputs: Sequence[str]) -> dict:
        """The program dict: instructions ordered by step (stable), roles from ``outputs``,
        count limits raised to what the program now holds (tensor limits kept)."""
        outputs = list(outputs)
        chosen = set(outputs)
        slots = copy.deepcopy(self.slots)
        for s in slots:
            if s["producer"] == "instruction":
                s["role"] = "output" if s["slot_id"] in chosen else "temporary"
        instructions = sorted(copy.deepcopy(self.instructions), key=lambda i: i["step"])
        limits = dict(self.limits)
        limits["max_bindings"] = max(limits["max_bindings"], len(self.bindings))
        limits["max_slots"] = max(limits["max_slots"], len(slots))
        limits["max_instructions"] = max(limits["max_instructions"], len(instructions))
        limits["max_steps"] = max(limits["max_steps"], max((i["step"] for i in instructions), default=1))
        limits["max_axes"] = max(limits["max_axes"], max(t.rank for t in self.types.values()))
        return {"schema_ref": self.program.schema_ref, "schema_version": self.program.schema_version,
                "bindings": copy.deepcopy(self.bindings), "slots": slots, "instructions": instructions,
                "outputs": outputs, "limits": limits}


def slot_bytes(program: Program, slots, dims: Mapping[str, int]) -> dict[str, int]:
    """Bytes of each of ``slots`` at ``dims`` ('floating' counted as float32; 0 if unresolved)."""
    out = {}
    for slot in slots:
        t = program.slot(slot).value_type
        t = t.resolve(dims, "float32" if t.dtype == "floating" else None)
        out[slot] = t.nbytes if t.is_static else 0
    return out
