"""The search shared by the planner's rewrites (``runtime.plan.attention``, ``runtime.plan.rmsnorm``):
each node of the program is tried as the last of a pattern, and matches that would replace a
node another match took are left out (the first in program order wins)."""
from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Sequence

import attrs

from runtime.plugins.atomspec import Node

Match = tuple[tuple[Node, ...], Node]  # (the nodes it replaces in program order, the fused node)


@attrs.frozen
class Graph:
    """Who makes and who reads each slot of the nodes, and which slots are outputs."""

    producer: dict[str, Node]
    reader: dict[str, Node]  # (a reader, for slots read once)
    readers: Counter
    outputs: frozenset[str]

    def single(self, slot: str) -> bool:
        """Whether ``slot`` is read exactly once and is no output: a rewrite may fuse it away."""
        return self.readers[slot] == 1 and slot not in self.outputs


def find(nodes: Sequence[Node], outputs: Sequence[str], match: Callable[[Node, Graph], Match | None]) -> list[Match]:
    graph = Graph({n.output_slot: n for n in nodes}, {s: n for n in nodes for s in n.input_slots},
                  Counter(s for n in nodes for s in n.input_slots), frozenset(outputs))
    found, taken = [], set()
    for node in nodes:
        got = match(node, graph)
        if got is not None and not taken.intersection(n.index for n in got[0]):
            taken.update(n.index for n in got[0])
            found.append(got)
    return found
