"""Fusion: which instructions run as one kernel.

A group is an optional anchor (an atom with ``anchors`` for the backend, e.g. a contraction)
followed by a chain of elementwise atoms. An elementwise node joins the group that produces
one of its operands when that intermediate has exactly one reader, is not an output, and is
not the broadcast side (its shape is the node's output shape). As in TVM's FuseOps, the
intermediate then never reaches memory.
"""
from __future__ import annotations

from collections import Counter
from collections.abc import Sequence

import attrs

from .atomspec import Node
from .fusion import CHAIN, EMPTY_EPILOGUE, Epilogue, EpilogueStep
from .types import TensorType


@attrs.frozen
class Group:
    anchor: Node | None  # None: an anchorless elementwise chain
    epilogue: Epilogue
    nodes: tuple[Node, ...]
    output_slot: str
    output_type: TensorType

    @property
    def input_slots(self) -> tuple[str, ...]:
        """External slots read: the anchor's operands, then the epilogue's extras."""
        own = self.anchor.input_slots if self.anchor is not None else ()
        return tuple(dict.fromkeys(own + self.epilogue.extra_slots))

    @property
    def label(self) -> str:
        names = "+".join(n.atom.name for n in self.nodes)
        return f"{names} [{', '.join(n.instruction_id for n in self.nodes)}]"


def make_groups(nodes: Sequence[Node], outputs: Sequence[str], backend: str, fuse: bool) -> list[Group]:
    readers = Counter(s for n in nodes for s in n.input_slots)
    outputs = set(outputs)
    groups: list[Group] = []
    by_output: dict[str, int] = {}  # current output slot -> index in groups
    position: list[int] = []  # index of each group's last node
    for node in nodes:
        target = _fusable_operand(node, by_output, groups, readers, outputs, backend) if fuse else None
        if target is None:
            by_output[node.output_slot] = len(groups)
            groups.append(Group(node, EMPTY_EPILOGUE, (node,), node.output_slot, node.output_type))
            position.append(node.index)
            continue
        k, gi = target
        group = groups[gi]
        del by_output[group.output_slot]
        if group.anchor is not None and group.epilogue.empty and group.anchor.atom.elementwise \
                and backend not in group.anchor.atom.anchors:
            group = _as_chain(group.anchor)
        groups[gi] = _extend(group, node, k)
        by_output[node.output_slot] = gi
        position[gi] = node.index
    order = sorted(range(len(groups)), key=lambda i: position[i])
    return [groups[i] for i in order]


def _fusable_operand(node, by_output, groups, readers, outputs, backend):
    if node.atom.elementwise is None:
        return None
    for k, slot in enumerate(node.input_slots):
        gi = by_output.get(slot)
        if gi is None or readers[slot] != 1 or slot in outputs:
            continue
        if node.input_types[k].shape != node.output_type.shape or \
                node.input_types[k].axes != node.output_type.axes:
            continue  # the broadcast side is never the chain value
        group = groups[gi]
        anchor = group.anchor
        if anchor is not None and not anchor.atom.elementwise and backend not in anchor.atom.anchors:
            continue
        if anchor is not None and anchor.atom.elementwise and not group.epilogue.empty \
                and backend not in anchor.atom.anchors:
            continue
        return k, gi
    return None


def _as_chain(node: Node) -> Group:
    extras = tuple(dict.fromkeys(node.input_slots))
    types = tuple(node.input_types[node.input_slots.index(s)] for s in extras)
    step = EpilogueStep(node, node.atom.elementwise(node), tuple(extras.index(s) for s in node.input_slots))
    return Group(None, Epilogue((step,), extras, types), (node,), node.output_slot, node.output_type)


def _extend(group: Group, node: Node, chain_operand: int) -> Group:
    extras = list(group.epilogue.extra_slots)
    types = list(group.epilogue.extra_types)
    sources = []
    for k, slot in enumerate(node.input_slots):
        if k == chain_operand:
            sources.append(CHAIN)
            continue
        if slot not in extras:
            extras.append(slot)
            types.append(node.input_types[k])
        sources.append(extras.index(slot))
    step = EpilogueStep(node, node.atom.elementwise(node), tuple(sources))
    epilogue = Epilogue(group.epilogue.steps + (step,), tuple(extras), tuple(types))
    return Group(group.anchor, epilogue, group.nodes + (node,), node.output_slot, node.output_type)
