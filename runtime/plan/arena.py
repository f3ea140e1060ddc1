"""Greedy arena placement (as in TFLite Micro's planner): largest buffer first, each at the
lowest aligned offset that overlaps no already-placed buffer alive at the same time.

Lifetimes are inclusive ``[first, last]`` schedule positions. Largest-first leaves the big
buffers at low offsets and lets small ones fill the holes between them; ties are broken by
first use, then name, so a plan (and its report) is the same on every run. Pure integers:
nothing is allocated here.
"""
from __future__ import annotations

from collections.abc import Mapping, Sequence

import attrs

ALIGNMENT = 64  # a cache line; a multiple of every dtype's itemsize and of SIMD widths


@attrs.frozen
class Request:
    name: str
    nbytes: int
    first: int  # first group that uses it (inclusive)
    last: int  # last group that uses it (inclusive)

    def __attrs_post_init__(self):
        if self.nbytes < 0 or self.last < self.first:
            raise ValueError(f"arena request {self.name!r}: need nbytes >= 0 and first <= last, "
                             f"got nbytes={self.nbytes}, first={self.first}, last={self.last}")

    def overlaps_in_time(self, other: "Request") -> bool:
        return self.first <= other.last and other.first <= self.last


def aligned(n: int, alignment: int = ALIGNMENT) -> int:
    return (n + alignment - 1) // alignment * alignment


def placement_order(requests: Sequence[Request]) -> list[Request]:
    return sorted(requests, key=lambda r: (-r.nbytes, r.first, r.name))


def place(requests: Sequence[Request], alignment: int = ALIGNMENT) -> tuple[dict[str, int], int]:
    """Offsets per request name and the peak (max offset + size)."""
    names = [r.name for r in requests]
    if len(set(names)) != len(names):
        raise ValueError(f"arena request names repeat: {sorted({n for n in names if names.count(n) > 1})}")
    placed: list[tuple[Request, int]] = []
    offsets: dict[str, int] = {}
    for req in placement_order(requests):
        # intervals of live neighbours, by start: first fit below the next neighbour, else
        # past it (every earlier neighbour ends at or below `offset`, so the gap is free)
        busy = sorted((off, off + r.nbytes) for r, off in placed
                      if r.nbytes and r.overlaps_in_time(req))
        offset = 0
        for start, end in busy:
            if offset + req.nbytes <= start:
                break
            offset = max(offset, aligned(end, alignment))
        offsets[req.name] = offset
        placed.append((req, offset))
    peak = max((offsets[r.name] + r.nbytes for r in requests), default=0)
    return offsets, peak


def overlapping_pairs(requests: Sequence[Request], offsets: Mapping[str, int]) -> list[tuple[str, str]]:
    """Pairs of buffers alive at the same time whose byte ranges intersect."""
    bad = []
    for i, a in enumerate(requests):
        for b in requests[i + 1:]:
            if a.overlaps_in_time(b) and a.nbytes and b.nbytes:
                oa, ob = offsets[a.name], offsets[b.name]
                if oa < ob + b.nbytes and ob < oa + a.nbytes:
                    bad.append((a.name, b.name))
    return bad


def check_no_overlap(requests: Sequence[Request], offsets: Mapping[str, int],
                     alignment: int = ALIGNMENT, peak: int | None = None) -> None:
    """Self-check: two buffers alive at once never share a byte, every offset is aligned,
    and (when given) the peak covers every buffer. Raises AssertionError naming the culprits."""
    bad = overlapping_pairs(requests, offsets)
    if bad:
        a, b = bad[0]
        raise AssertionError(f"buffers {a} and {b} overlap in the arena while both are live "
                             f"({len(bad)} overlapping pair(s) in all)")
    for r in requests:
        off = offsets[r.name]
        if off < 0 or off % alignment:
            raise AssertionError(f"buffer {r.name} is at offset {off}, not a multiple of {alignment}")
        if peak is not None and off + r.nbytes > peak:
            raise AssertionError(f"buffer {r.name} ends at {off + r.nbytes}, past the peak {peak}")
