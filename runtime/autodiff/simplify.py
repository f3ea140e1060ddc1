"""Rewrites of the instructions a gradient adds, before its program is built.

:func:`scale_after_contractions`: the vjp of ``y = scale(v, f)`` with a 0-d ``f`` is
``v̄ = ȳ·f``, a full pass that writes a value as large as ȳ; when only contractions read v̄
(a LoRA gain before its up-projection: the seed's ``gain·(silu(h)·Bᵀ)``), each contraction
reads ȳ instead and scales its own result, ``contract(ȳ, w)·f``, which the planner fuses into
the contraction's epilogue: one pass over the largest value of the backward less (the seed's
backward at T=8192: 32 MiB written and read again). The same value up to rounding: a scalar
factor commutes with the sums of a contraction.
"""
from __future__ import annotations

from collections import Counter

from runtime.autodiff.writer import ProgramWriter, atom_ref

_SCALE, _CONTRACT = atom_ref("scale"), atom_ref("contract")


def scale_after_contractions(writer: ProgramWriter, first: int, keep: set[str]) -> None:
    """Rewrite the instructions from index ``first`` (those the gradient added) in place:
    each ``scale`` by a 0-d factor whose result only contractions read (never both of one
    contraction's operands, never a slot of ``keep``) is moved past them."""
    added = writer.instructions[first:]
    readers: dict[str, list[dict]] = {}
    for ins in added:
        for slot in dict.fromkeys(ins["input_slots"]):
            readers.setdefault(slot, []).append(ins)
    for scale in [i for i in added if i["atom_ref"] == _SCALE]:
        value, factor = scale["input_slots"]
        out = scale["output_slot"]
        users = readers.get(out, [])
        if (out in keep or not users or writer.types[factor].rank != 0 or writer.types[value] != writer.types[out]
                or any(u["atom_ref"] != _CONTRACT or Counter(u["input_slots"])[out] != 1 for u in users)):
            continue
        for user in users:
            product = writer.fresh("%vjp")
            user["input_slots"] = [value if s == out else s for s in user["input_slots"]]
            writer.types[product] = writer.types[user["output_slot"]]
            writer.slots.append({"slot_id": product, "value_type": _slot(writer, user["output_slot"])["value_type"],
                                 "producer": "instruction", "producer_id": user["instruction_id"],
                                 "role": "temporary"})
            moved = {"instruction_id": writer.fresh("vjp"), "step": 0, "atom_ref": _SCALE,
                     "input_slots": [product, factor], "output_slot": user["output_slot"],
                     "attributes": dict(scale["attributes"])}
            _slot(writer, user["output_slot"])["producer_id"] = moved["instruction_id"]
            user["output_slot"] = product
            writer.instructions.insert(writer.instructions.index(user) + 1, moved)
        writer.instructions.remove(scale)
        writer.slots.remove(_slot(writer, out))
        del writer.types[out]
    _restep(writer, first)


def _slot(writer: ProgramWriter, slot_id: str) -> dict:
    return next(s for s in writer.slots if s["slot_id"] == slot_id)


def _restep(writer: ProgramWriter, first: int) -> None:
    """Steps of the added instructions again, each one past the steps of its operands (they
    are in an order where every operand comes first)."""
    for ins in writer.instructions[first:]:
        ins["step"] = 1 + max((writer.steps[s] for s in ins["input_slots"]), default=0)
        writer.steps[ins["output_slot"]] = ins["step"]
