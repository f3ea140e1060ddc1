"""Free axes: the size symbols along which a program can run in independent slices.

A symbol is free when slicing every tensor that carries it gives, slice by slice, the same
values as the whole run: every instruction maps the axes it sizes position by position
(``AtomSpec.free_axes``), every operand that has such an axis has it at the output's full
extent (or at extent 1, broadcast), no tensor carries it twice, no bank carries it (banks are
not sliced) and an input carries it (its extent comes from the values). Decided once per
program, on the declared (symbolic) types.
"""
from __future__ import annotations

from collections.abc import Mapping, Sequence

import attrs

from runtime.core.types import TensorType
from runtime.plugins.atomspec import AtomSpec, Node
from runtime.program.model import Program


@attrs.frozen
class FreeAxes:
    """``free``: the free symbols, in program order; ``tied``: every other symbol -> why."""

    free: tuple[str, ...]
    tied: Mapping[str, str]

    def to_dict(self) -> dict:
        return {"free": list(self.free), "tied": dict(self.tied)}

    def describe(self) -> str:
        lines = [f"free axes: {', '.join(self.free) if self.free else 'none'}"]
        lines += [f"  {s} is tied: {why}" for s, why in self.tied.items()]
        return "\n".join(lines)


def free_axes(program: Program, specs: Sequence[AtomSpec]) -> FreeAxes:
    """The free symbols of ``program`` (``specs``: each instruction's atom, in order)."""
    tied: dict[str, str] = {}

    def tie(symbol: str, why: str) -> None:
        tied.setdefault(symbol, why)  # the first reason, in program order

    types: dict[str, TensorType] = {}
    carried_by_input: set[str] = set()
    for b in program.bindings:
        types[b.name] = b.value_type
        for a, s in _symbolic(b.value_type):
            if b.kind == "bank":
                tie(s, f"bank {b.name!r} carries it on axis {a!r} (banks are not sliced)")
            else:
                carried_by_input.add(s)
    for slot in program.slots:
        types.setdefault(slot.slot_id, slot.value_type)
    for name, t in types.items():
        seen: dict[str, str] = {}
        for a, s in _symbolic(t):
            if s in seen:
                tie(s, f"{name!r} carries it on two axes ({seen[s]!r} and {a!r})")
            seen[s] = a
    for i, (ins, spec) in enumerate(zip(program.instructions, specs)):
        operands = tuple(types[s] for s in ins.input_slots)
        out = types[ins.output_slot]
        node = Node(i, ins.instruction_id, spec, ins.attributes, tuple(ins.input_slots),
                    ins.output_slot, operands, out, f"$.instructions[{i}]")
        free = spec.free_axes(node) if spec.free_axes is not None else frozenset()
        where = f"instruction {ins.instruction_id!r} ({spec.name})"
        named = [(spec.inputs[k] if k < len(spec.inputs) else f"operand {k}", t)
                 for k, t in enumerate(operands)] + [("its output", out)]
        for what, t in named:
            for a, s in _symbolic(t):
                if a not in free:
                    tie(s, f"{where} ties axis {a!r} of {what}" + (
                        "" if spec.free_axes is not None else " (the atom declares no free axis)"))
                elif out.axes.count(a) != 1 or out.size_of(a) != s:
                    tie(s, f"{where} maps axis {a!r} of {what} onto an output extent "
                           f"{out.size_of(a) if a in out.axes else 'that is absent'}")
        for a, s in _symbolic(out):
            if a not in free:
                continue
            for what, t in named[:-1]:
                if a in t.axes and t.size_of(a) not in (s, 1):
                    tie(s, f"{where}: {what} has axis {a!r} at extent {t.size_of(a)}, not {s}")
    for s in program.symbols:
        if s not in carried_by_input:
            tie(s, "no input carries it")
    free_symbols = tuple(s for s in program.symbols if s not in tied)
    return FreeAxes(free_symbols, {s: tied[s] for s in program.symbols if s in tied})


def _symbolic(t: TensorType):
    return [(a, s) for a, s in zip(t.axes, t.sizes) if isinstance(s, str)]


def slice_axes(t: TensorType, symbol: str) -> int | None:
    """The position of the axis of ``t`` sized by ``symbol``, or None."""
    for k, s in enumerate(t.sizes):
        if s == symbol:
            return k
    return None


__all__ = ["FreeAxes", "free_axes", "slice_axes"]


@attrs.frozen
class Chunking:
    """How a run is split along one free symbol: ``count`` slices of ``size`` positions (the
    last one starts at ``extent - size``, overlapping the one before when ``size`` does not
    divide ``extent``: every slice has one shape, so one compiled plan and one arena serve all)."""

    symbol: str
    extent: int
    size: int
    count: int
    requested: str | int  # "auto" or the positions per slice the caller asked for
    whole_working_bytes: int  # what the unsliced run would need
    slice_working_bytes: int

    def starts(self) -> list[int]:
        return [min(k * self.size, self.extent - self.size) for k in range(self.count)]

    def to_dict(self) -> dict:
        return {"symbol": self.symbol, "extent": self.extent, "size": self.size, "count": self.count,
                "starts": self.starts(), "requested": self.requested,
                "whole_working_bytes": self.whole_working_bytes,
                "slice_working_bytes": self.slice_working_bytes}

    def describe(self) -> str:
        overlap = self.count * self.size - self.extent
        return (f"chunked along {self.symbol} (chunks={self.requested!r}): {self.extent} positions in "
                f"{self.count} slices of {self.size}"
                + (f" (the last overlaps the one before by {overlap})" if overlap else "")
                + f"; each slice's working set {self.slice_working_bytes:,} bytes, the whole run's "
                  f"{self.whole_working_bytes:,}")


def even_slices(extent: int, most: int) -> tuple[int, int]:
    """(size, count): the fewest slices of at most ``most`` positions, sized evenly."""
    count = -(-extent // most)
    return -(-extent // count), count


__all__ += ["Chunking", "even_slices"]
