"""Greedy arena placement (as in TFLite Micro's planner): largest buffer first, each at the
lowest aligned offset that overlaps no already-placed buffer alive at the same time."""
from __future__ import annotations

from collections.abc import Sequence

import attrs

ALIGNMENT = 64


@attrs.frozen
class Request:
    name: str
    nbytes: int
    first: int  # first group that uses it (inclusive)
    last: int  # last group that uses it (inclusive)

    def overlaps_in_time(self, other: "Request") -> bool:
        return self.first <= other.last and other.first <= self.last


def aligned(n: int, alignment: int = ALIGNMENT) -> int:
    return (n + alignment - 1) // alignment * alignment


def place(requests: Sequence[Request], alignment: int = ALIGNMENT) -> tuple[dict[str, int], int]:
    """Offsets per request name and the peak (max offset + size)."""
    order = sorted(requests, key=lambda r: (-r.nbytes, r.first, r.name))
    placed: list[tuple[Request, int]] = []
    offsets: dict[str, int] = {}
    for req in order:
        busy = sorted((off, off + r.nbytes) for r, off in placed if r.overlaps_in_time(req))
        offset = 0
        for start, end in busy:
            if offset + req.nbytes <= start:
                break
            offset = max(offset, aligned(end, alignment))
        offsets[req.name] = offset
        placed.append((req, offset))
    peak = max((offsets[r.name] + r.nbytes for r in requests), default=0)
    return offsets, peak


def check_no_overlap(requests: Sequence[Request], offsets: dict[str, int]) -> None:
    """Self-check: two buffers alive at once never share a byte."""
    for i, a in enumerate(requests):
        for b in requests[i + 1:]:
            if a.overlaps_in_time(b) and a.nbytes and b.nbytes:
                oa, ob = offsets[a.name], offsets[b.name]
                if oa < ob + b.nbytes and ob < oa + a.nbytes:
                    raise AssertionError(f"buffers {a.name} and {b.name} overlap in the arena")
