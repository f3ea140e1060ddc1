"""The plan for one set of extents: kernel groups, slot lifetimes, in-place reuse, arena
offsets and the memory preflight of SPEC §5 — all decided before anything is allocated."""
from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import attrs

from . import arena
from .atomspec import Node
from .errors import fail
from .grouping import Group, make_groups
from .types import TensorType


@attrs.frozen
class Buffer:
    slot: str
    kind: str  # "input" | "bank" | "temporary" | "output"
    nbytes: int
    first: int  # group index of the producer (-1 for bindings)
    last: int  # last group index reading it
    offset: int | None = None  # arena offset of temporaries
    alias_of: str | None = None  # in-place: the temporary whose buffer this one reuses


@attrs.frozen
class Plan:
    dims: Mapping[str, int]
    groups: tuple[Group, ...]
    buffers: Mapping[str, Buffer]
    arena_bytes: int
    temporaries_bytes: int
    binding_bytes: int
    output_bytes: int
    max_working_bytes: int

    @property
    def working_bytes(self) -> int:
        return self.binding_bytes + self.arena_bytes + self.output_bytes

    def to_dict(self) -> dict[str, Any]:
        return {
            "dims": dict(self.dims),
            "groups": [{"index": i, "kernel": "anchor+epilogue" if g.anchor and not g.epilogue.empty
                        else ("elementwise chain" if g.anchor is None else "single"),
                        "instructions": [n.instruction_id for n in g.nodes],
                        "atoms": [n.atom.name for n in g.nodes],
                        "inputs": list(g.input_slots), "output": g.output_slot}
                       for i, g in enumerate(self.groups)],
            "buffers": {s: attrs.asdict(b) for s, b in self.buffers.items()},
            "arena_bytes": self.arena_bytes, "temporaries_bytes": self.temporaries_bytes,
            "binding_bytes": self.binding_bytes, "output_bytes": self.output_bytes,
            "working_bytes": self.working_bytes, "max_working_bytes": self.max_working_bytes,
            "fits": self.working_bytes <= self.max_working_bytes,
        }

    def describe(self) -> str:
        lines = [f"plan for {', '.join(f'{k}={v}' for k, v in self.dims.items()) or 'static extents'}",
                 f"{len(self.groups)} kernel groups:"]
        for i, g in enumerate(self.groups):
            lines.append(f"  [{i}] {g.label} -> {g.output_slot} {g.output_type}")
        lines.append("buffers (lifetime in groups, arena offset):")
        for b in self.buffers.values():
            where = (f"offset {b.offset}" if b.offset is not None
                     else f"in place of {b.alias_of}" if b.alias_of else "not in arena")
            lines.append(f"  {b.slot:<16} {b.kind:<9} {b.nbytes:>12} B  groups {b.first}..{b.last}  {where}")
        lines.append(f"arena peak {self.arena_bytes} B vs {self.temporaries_bytes} B without reuse")
        verdict = "fits" if self.working_bytes <= self.max_working_bytes else "EXCEEDS"
        lines.append(f"working bytes {self.working_bytes} = bindings {self.binding_bytes} + arena "
                     f"{self.arena_bytes} + outputs {self.output_bytes}; {verdict} "
                     f"max_working_bytes {self.max_working_bytes}")
        return "\n".join(lines)


def make_plan(nodes: Sequence[Node], binding_types: Mapping[str, TensorType], outputs: Sequence[str],
              limits, dims: Mapping[str, int], backend: str, fuse: bool,
              slot_index: Mapping[str, int] | None = None, binding_kinds: Mapping[str, str] | None = None) -> Plan:
    slot_index = slot_index or {}
    types = dict(binding_types)
    types.update({n.output_slot: n.output_type for n in nodes})
    for slot, t in types.items():
        _check_tensor(slot, t, limits, slot_index)
    groups = make_groups(nodes, outputs, backend, fuse)
    last_read: dict[str, int] = {}
    for gi, g in enumerate(groups):
        for s in g.input_slots:
            last_read[s] = gi
    buffers: dict[str, Buffer] = {}
    for slot, t in binding_types.items():
        kind = (binding_kinds or {}).get(slot, "input")
        buffers[slot] = Buffer(slot, kind, t.nbytes, -1, last_read.get(slot, -1))
    output_set = set(outputs)
    root: dict[str, str] = {}
    for gi, g in enumerate(groups):
        slot = g.output_slot
        kind = "output" if slot in output_set else "temporary"
        buffers[slot] = Buffer(slot, kind, g.output_type.nbytes, gi, last_read.get(slot, gi))
        alias = _inplace_source(g, gi, buffers, last_read)
        if kind == "temporary" and alias is not None:
            base = root.get(alias, alias)
            root[slot] = base
            buffers[slot] = attrs.evolve(buffers[slot], alias_of=base)
            buffers[base] = attrs.evolve(buffers[base], last=max(buffers[base].last, buffers[slot].last))
    temporaries = [b for b in buffers.values() if b.kind == "temporary"]
    requests = [arena.Request(b.slot, b.nbytes, b.first, b.last) for b in temporaries if b.alias_of is None]
    offsets, peak = arena.place(requests)
    for b in temporaries:
        offset = offsets[b.alias_of or b.slot]
        buffers[b.slot] = attrs.evolve(b, offset=offset)
    plan = Plan(dict(dims), tuple(groups), buffers, peak, sum(b.nbytes for b in temporaries),
                sum(b.nbytes for b in buffers.values() if b.kind in ("input", "bank")),
                sum(b.nbytes for b in buffers.values() if b.kind == "output"), limits.max_working_bytes)
    if plan.working_bytes > limits.max_working_bytes:
        fail("limit_exceeded", "$.limits.max_working_bytes",
             f"the run needs {plan.working_bytes} working bytes (bindings {plan.binding_bytes} + arena "
             f"peak {plan.arena_bytes} + outputs {plan.output_bytes}); max_working_bytes = "
             f"{limits.max_working_bytes}")
    return plan


def _inplace_source(g: Group, gi: int, buffers: Mapping[str, Buffer], last_read) -> str | None:
    """The operand whose buffer the group's output may reuse (TFLite's in-place rule)."""
    node = g.anchor
    if node is None or not g.epilogue.empty or node.atom.inplace is None:
        return None
    slot = node.input_slots[node.atom.inplace]
    b = buffers.get(slot)
    if b is None or b.kind != "temporary" or last_read.get(slot) != gi:
        return None
    return slot if b.nbytes == g.output_type.nbytes else None


def _check_tensor(slot: str, t: TensorType, limits, slot_index) -> None:
    path = f"$.slots[{slot_index[slot]}]" if slot in slot_index else f"$.slots.{slot}"
    for axis, extent in zip(t.axes, t.shape):
        if extent > limits.max_axis_extent:
            fail("limit_exceeded", path, f"slot {slot!r} axis {axis!r} has extent {extent}; "
                                         f"max_axis_extent = {limits.max_axis_extent}")
    if t.elements > limits.max_tensor_elements:
        fail("limit_exceeded", path, f"slot {slot!r} has {t.elements} elements; "
                                     f"max_tensor_elements = {limits.max_tensor_elements}")
    if t.nbytes > limits.max_tensor_bytes:
        fail("limit_exceeded", path, f"slot {slot!r} needs {t.nbytes} bytes; "
                                     f"max_tensor_bytes = {limits.max_tensor_bytes}")
