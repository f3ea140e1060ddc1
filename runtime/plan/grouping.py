"""Fusion: which instructions run as one kernel.

A group is an optional anchor (an atom with ``anchors`` for the backend, e.g. a contraction)
followed by a chain of elementwise atoms. An elementwise node joins the group that produces
one of its operands when that intermediate has exactly one reader in the whole program, is
not a program output, and is not the broadcast side (its axes and shape are the node's
output's). As in TVM's FuseOps, the intermediate then never reaches memory.

A ``broadcast`` whose one reader is such an elementwise node is absorbed into the reader's
group: the kernel reads the broadcast's operand itself, at index 0 along the axes it lacks
(the way it reads a ``scale`` factor), instead of a materialised copy of the output's size.

A group runs at the position of its last node. That order is valid: a slot read from outside
a group is the final output of its producing group (intermediates have their single reader
inside the group), and that producer's last node is strictly earlier than the reader.
"""
from __future__ import annotations

from collections import Counter
from collections.abc import Sequence

import attrs

from runtime.plan import attention, rmsnorm
from runtime.plugins.atomspec import Node, ScalarOp
from runtime.plugins.expressions import scalar_op
from runtime.plan.fusion import CHAIN, EMPTY_EPILOGUE, Epilogue, EpilogueStep
from runtime.core.types import TensorType

BROADCAST = "broadcast"  # AtomSpec.role of an atom whose operand an elementwise reader may read
# Longer chains split: compile time grows faster than linearly in a kernel's length, and one
# more pass over memory per this many fused steps costs little.
MAX_FUSED_NODES = 32


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
    def rewritten(self) -> bool:
        """Whether the anchor is a planner-made node that replaces ``nodes`` (fused attention)."""
        return self.anchor is not None and self.anchor not in self.nodes

    @property
    def kernel_nodes(self) -> tuple[Node, ...]:
        """The nodes whose kernels run: the planner-made anchor alone for a rewrite."""
        return (self.anchor,) if self.rewritten else self.nodes

    @property
    def kind(self) -> str:
        """'single' (one node, its own kernel), 'anchor+epilogue', 'elementwise chain', or the
        planner-made anchor's atom (e.g. 'fused-attention')."""
        if self.anchor is None:
            return "elementwise chain"
        if self.rewritten:
            return self.anchor.atom.name
        return "single" if self.epilogue.empty else "anchor+epilogue"

    @property
    def position(self) -> int:
        """Index of the instruction at whose place the group's kernel runs (its last node)."""
        return self.nodes[-1].index

    @property
    def fused_slots(self) -> tuple[str, ...]:
        """Intermediates computed inside the kernel and never materialised."""
        return tuple(n.output_slot for n in self.nodes[:-1])

    @property
    def label(self) -> str:
        names = "+".join(n.atom.name for n in self.nodes)
        return f"{names} [{', '.join(n.instruction_id for n in self.nodes)}]"


def make_groups(nodes: Sequence[Node], outputs: Sequence[str], backend: str, fuse: bool,
                rewrite: bool = True) -> list[Group]:
    """Kernel groups in run order (each at the position of its last node). With ``fuse`` and
    ``rewrite``, attention and RMS-norm patterns each become one planner-made node
    (runtime.plan.attention, runtime.plan.rmsnorm)."""
    readers = Counter(s for n in nodes for s in n.input_slots)  # operand uses, not nodes
    groups: list[Group] = []
    by_output: dict[str, int] = {}  # open groups: current output slot -> index in groups
    rewrites = {}  # index of a pattern's last node -> (the nodes it replaces, the fused node)
    found = [*attention.find(nodes, outputs, backend), *rmsnorm.find(nodes, outputs, backend)] \
        if fuse and rewrite else []
    for replaced, fused in found:
        rewrites[replaced[-1].index] = (replaced, fused)
    skipped = {n.index for replaced, _ in rewrites.values() for n in replaced}
    outputs = set(outputs)
    absorbed = _absorbed_broadcasts(nodes, outputs, readers, skipped, backend) if fuse else {}
    for node in nodes:
        if node.output_slot in absorbed:
            continue  # read by its reader's kernel (_operands)
        if node.index in rewrites:
            replaced, fused = rewrites[node.index]
            by_output[node.output_slot] = len(groups)  # no epilogue joins it (it anchors none)
            groups.append(Group(fused, EMPTY_EPILOGUE, replaced, node.output_slot, node.output_type))
            continue
        if node.index in skipped:
            continue
        op = _scalar_op(node, backend) if fuse else None
        target = _fusable_operand(node, by_output, groups, readers, outputs, backend) if op else None
        if target is None:
            by_output[node.output_slot] = len(groups)
            if op is not None and backend not in node.atom.anchors:
                groups.append(_as_chain(node, op, absorbed))  # even alone: the backend's chain kernel runs it
            else:
                groups.append(Group(node, EMPTY_EPILOGUE, (node,), node.output_slot, node.output_type))
            continue
        k, gi = target
        del by_output[groups[gi].output_slot]
        groups[gi] = _extend(groups[gi], node, k, op, absorbed)
        by_output[node.output_slot] = gi
    return sorted(groups, key=lambda g: g.position)


def _scalar_op(node: Node, backend: str) -> ScalarOp | None:
    """The node's scalar form, or None when its atom (or this use of it) is not fusable; its
    expression checked for ``backend`` (kernel_failed, naming the atom, when it is refused)."""
    return scalar_op(node, backend) if node.atom.elementwise is not None else None


def _fusable_operand(node, by_output, groups, readers, outputs, backend):
    """(operand index, group index) of the group this elementwise node may join, or None."""
    for k, slot in enumerate(node.input_slots):
        gi = by_output.get(slot)
        if gi is None or readers[slot] != 1 or slot in outputs or len(groups[gi].nodes) >= MAX_FUSED_NODES:
            continue
        if node.input_types[k].axes != node.output_type.axes or \
                node.input_types[k].shape != node.output_type.shape:
            continue  # the broadcast side is never the chain value
        anchor = groups[gi].anchor
        if anchor is not None and backend not in anchor.atom.anchors:
            continue  # a node's own kernel takes no epilogue (elementwise nodes start chains)
        return k, gi
    return None


def _absorbed_broadcasts(nodes: Sequence[Node], outputs: set[str], readers: Counter, skipped: set[int],
                         backend: str) -> dict[str, Node]:
    """Output slot -> ``broadcast`` node, for each broadcast read once, not a program output,
    by an elementwise node that runs in a chain (so it reads the slot as an epilogue operand)."""
    readers_of = {s: n for n in nodes for s in n.input_slots}
    absorbed = {}
    for node in nodes:
        slot = node.output_slot
        reader = readers_of.get(slot)
        if node.atom.role != BROADCAST or len(node.input_slots) != 1 or readers[slot] != 1 \
                or slot in outputs or node.index in skipped or reader is None or reader.index in skipped:
            continue
        if _scalar_op(reader, backend) is not None and backend not in reader.atom.anchors:
            absorbed[slot] = node
    return absorbed


def _operands(node: Node, absorbed: dict[str, Node]) -> list[tuple[str, TensorType, Node | None]]:
    """Per operand of ``node``: the slot and type its kernel reads, and the absorbed broadcast
    whose operand that is (None for its own operand)."""
    out = []
    for slot, t in zip(node.input_slots, node.input_types):
        source = absorbed.get(slot)
        out.append((slot, t, None) if source is None else
                   (source.input_slots[0], source.input_types[0], source))
    return out


def _as_chain(node: Node, op: ScalarOp, absorbed: dict[str, Node]) -> Group:
    return _extend(Group(None, EMPTY_EPILOGUE, (), node.output_slot, node.output_type), node, None, op, absorbed)


def _extend(group: Group, node: Node, chain_operand: int | None, op: ScalarOp, absorbed: dict[str, Node]) -> Group:
    extras = list(group.epilogue.extra_slots)
    types = list(group.epilogue.extra_types)
    sources, nodes = [], []
    for k, (slot, t, source) in enumerate(_operands(node, absorbed)):
        if k == chain_operand:
            sources.append(CHAIN)
            continue
        if source is not None and source not in nodes:
            nodes.append(source)
        if slot not in extras:
            extras.append(slot)
            types.append(t)
        sources.append(extras.index(slot))
    step = EpilogueStep(node, op, tuple(sources))
    epilogue = Epilogue(group.epilogue.steps + (step,), tuple(extras), tuple(types))
    return Group(group.anchor, epilogue, group.nodes + tuple(nodes) + (node,), node.output_slot, node.output_type)
