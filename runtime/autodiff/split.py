"""A gradient program cut in two (``Gradient.split``): a forward program that also outputs the
values its backward reads, and a backward program that takes them, so a training step runs each
forward instruction once. What is kept and what the backward recomputes is a policy, applied as
a rewrite of the backward program (JAX's checkpoint policies, PyTorch's partitioner):

- ``"save-all"``: every forward result the backward reads is kept;
- ``"save-contractions"``: contraction, reduction, softmax and segment results are kept; the
  elementwise chains between them are recomputed, where the planner fuses them into the
  backward's kernels;
- ``"save-inputs"``: nothing is kept; the backward recomputes what it needs from the bindings;
- a list of forward slots: those are kept, the rest recomputed.
"""
from __future__ import annotations

import copy
import re
from collections.abc import Mapping, Sequence
from typing import Any

import attrs

from runtime.core.errors import fail
from runtime.program.model import Program
from runtime.autodiff.writer import slot_bytes

POLICIES = ("save-all", "save-contractions", "save-inputs")
# atoms whose results ``save-contractions`` keeps: the expensive ones to recompute
KEPT_ATOMS = ("contract", "reduce", "masked-softmax", "segment", "observe-affine", "observe-fourier",
              "masked-softmax-vjp")


@attrs.frozen
class Split:
    """``forward``: the forward program, its outputs followed by the kept values. ``backward``:
    takes ``bindings`` (forward bindings it reads), the kept values (``saved``: forward slot ->
    its input binding here) and the cotangents; outputs the gradients (``gradients``)."""

    forward: dict
    backward: dict
    saved: dict[str, str]
    bindings: tuple[str, ...]
    cotangents: dict[str, str]
    gradients: dict[str, str]
    recomputed: tuple[str, ...]  # forward instruction ids the backward runs again
    program: Program = attrs.field(repr=False)

    def saved_bytes(self, dims: Mapping[str, int]) -> dict[str, int]:
        """Bytes of each kept value at ``dims`` ('floating' counted as float32)."""
        return slot_bytes(self.program, self.saved, dims)


def split(gradient, remat: Any = "save-all") -> Split:
    forward: Program = gradient.forward
    data = gradient.program
    forward_ids = {ins.instruction_id for ins in forward.instructions}
    by_slot = {ins.output_slot: ins for ins in forward.instructions}
    keep = _policy(remat, forward, by_slot)

    backward_ins = [i for i in data["instructions"] if i["instruction_id"] not in forward_ids]
    saved: dict[str, None] = {}
    recompute: set[str] = set()
    bindings: dict[str, None] = {}
    binding_names = {b.name for b in forward.bindings}
    stack = [s for i in backward_ins for s in i["input_slots"]]
    while stack:  # what the backward reads: kept, recomputed, or a forward binding
        slot = stack.pop()
        if slot in binding_names:
            bindings[slot] = None
        elif slot in by_slot:
            ins = by_slot[slot]
            if slot in keep:
                saved[slot] = None
            elif ins.instruction_id not in recompute:
                recompute.add(ins.instruction_id)
                stack.extend(ins.input_slots)
    saved_order = [i.output_slot for i in forward.instructions if i.output_slot in saved]
    taken = {s["slot_id"] for s in data["slots"]} | {b["name"] for b in data["bindings"]}
    names = {slot: _binding_name(slot, taken) for slot in saved_order}

    # the forward: unchanged, with the kept values as outputs too
    fwd = forward.to_dict()
    fwd["outputs"] = list(dict.fromkeys([*forward.outputs, *saved_order]))
    for s in fwd["slots"]:
        if s["slot_id"] in saved:
            s["role"] = "output"

    # the backward: the bindings it reads, the kept values as inputs, what it recomputes, its own
    cotangent_names = set(gradient.cotangents.values())
    slot_types = {s["slot_id"]: s["value_type"] for s in data["slots"]}
    bwd_bindings = [copy.deepcopy(b) for b in data["bindings"]
                    if b["name"] in bindings or b["name"] in cotangent_names]
    bwd_bindings += [{"kind": "input", "name": names[s], "value_type": copy.deepcopy(slot_types[s])}
                     for s in saved_order]
    kept_ids = recompute | {i["instruction_id"] for i in backward_ins}
    instructions = [_renamed(i, names) for i in data["instructions"] if i["instruction_id"] in kept_ids]
    produced = {i["output_slot"] for i in instructions}
    bound = {b["name"] for b in bwd_bindings}
    slots = []
    for s in data["slots"]:
        if s["slot_id"] in produced or s["slot_id"] in bound:
            s = copy.deepcopy(s)
            if s["producer"] == "instruction":  # the gradients are the only outputs here
                s["role"] = "output" if s["slot_id"] in gradient.gradients.values() else "temporary"
            slots.append(s)
    slots += [{"slot_id": names[s], "value_type": copy.deepcopy(slot_types[s]), "producer": "input",
               "producer_id": names[s], "role": "input"} for s in saved_order]
    bwd = {**{k: copy.deepcopy(v) for k, v in data.items() if k not in ("bindings", "slots", "instructions")},
           "bindings": bwd_bindings, "slots": slots, "instructions": instructions,
           "outputs": list(data["outputs"])}
    # the kept values become bindings: count limits grow to what the backward holds, as vjp's do
    limits = bwd["limits"] = dict(bwd["limits"])
    for key, count in (("max_bindings", len(bwd_bindings)), ("max_slots", len(slots)),
                       ("max_instructions", len(instructions))):
        limits[key] = max(limits[key], count)
    recomputed = tuple(i.instruction_id for i in forward.instructions if i.instruction_id in recompute)
    return Split(fwd, bwd, {s: names[s] for s in saved_order},
                 tuple(b.name for b in forward.bindings if b.name in bindings),
                 dict(gradient.cotangents), dict(gradient.gradients), recomputed, forward)


def _policy(remat: Any, forward: Program, by_slot) -> set[str]:
    if isinstance(remat, str):
        if remat == "save-all":
            return set(by_slot)
        if remat == "save-inputs":
            return set()
        if remat == "save-contractions":
            return {slot for slot, ins in by_slot.items() if _family(ins.atom_ref) in KEPT_ATOMS}
        fail("schema", "$.remat", f"remat must be one of {', '.join(POLICIES)} or a list of forward "
                                  f"slots, got {remat!r}")
    if not isinstance(remat, Sequence) or not all(isinstance(s, str) for s in remat):
        fail("schema", "$.remat", f"remat must be one of {', '.join(POLICIES)} or a list of forward "
                                  f"slots, got {remat!r}")
    for k, slot in enumerate(remat):
        if slot not in by_slot:
            fail("invalid_output", f"$.remat[{k}]", f"{slot!r} is not a slot a forward instruction "
                                                    f"produces (they are {sorted(by_slot)})")
    return set(remat)


def _family(ref: str) -> str:
    """``arti/formula-atom-reduce@2`` -> ``reduce``."""
    name = ref.split("@", 1)[0].rpartition("/")[2]
    return name.removeprefix("formula-atom-")


def _binding_name(slot: str, taken: set[str]) -> str:
    stem = "saved." + (re.sub(r"[^A-Za-z0-9_.-]", "", slot).strip(".-_") or "value")
    name, k = stem, 0
    while name in taken:
        k += 1
        name = f"{stem}.{k}"
    taken.add(name)
    return name


def _renamed(ins: dict, names: Mapping[str, str]) -> dict:
    ins = copy.deepcopy(ins)
    ins["input_slots"] = [names.get(s, s) for s in ins["input_slots"]]
    return ins
