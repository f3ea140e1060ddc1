"""Free axes: the size symbols along which a program can run in independent slices.

A symbol is free when slicing every tensor that carries it gives, slice by slice, the same
values as the whole run: every instruction maps the axes it sizes position by position
(``AtomSpec.free_axes``), every operand that has such an axis has it at the output's full
extent (or at extent 1, broadcast), no tensor carries it twice, no bank carries it (banks are
not sliced) and an input carries it (its extent comes from the values). Decided once per
program, on the declared (symbolic) types.

A free symbol may also be summed over (a gradient program's bank gradients are sums over the
batch and token axes): an instruction whose ``AtomSpec.linear`` declares a summation index
running along the symbol's axes in every operand that carries it makes an output that is the
sum of the slices' outputs, and so does a linear atom (add, scale, a layout move, another
sum, ``Linear``) of such sums with values no slice changes. Those slots are *sums over* the
symbol; a chunked run adds the slices' values of the outputs among them. Any other reader of a
sum ties the symbol, so every sum is exact: the slices' results add up to the whole.
"""
from __future__ import annotations

from collections.abc import Mapping, Sequence

import attrs

from runtime.core.types import TensorType
from runtime.plugins.atomspec import AtomSpec, Linear, Node
from runtime.program.model import Program


@attrs.frozen
class FreeAxes:
    """``free``: the free symbols, in program order; ``tied``: every other symbol -> why;
    ``sums``: free symbol -> the outputs that are sums over it (added slice by slice)."""

    free: tuple[str, ...]
    tied: Mapping[str, str]
    sums: Mapping[str, tuple[str, ...]] = attrs.field(factory=dict)

    def to_dict(self) -> dict:
        return {"free": list(self.free), "tied": dict(self.tied),
                "sums": {s: list(slots) for s, slots in self.sums.items()}}

    def describe(self) -> str:
        lines = [f"free axes: {', '.join(self.free) if self.free else 'none'}"]
        lines += [f"  summed over {s}: {', '.join(slots)} (a chunked run adds the slices' values)"
                  for s, slots in self.sums.items()]
        lines += [f"  {s} is tied: {why}" for s, why in self.tied.items()]
        return "\n".join(lines)


def free_axes(program: Program, specs: Sequence[AtomSpec]) -> FreeAxes:
    """The free symbols of ``program`` (``specs``: each instruction's atom, in order), and the
    outputs that are sums over them."""
    tied: dict[str, str] = {}
    merged = _merged_symbols(program, specs)  # N -> (B, the reshapes that make N = B·S·…)
    root = {n: b for n, (b, _) in merged.items()}
    merge_ids = {i for _, ids in merged.values() for i in ids}

    def tie(symbol: str, why: str) -> None:
        tied.setdefault(root.get(symbol, symbol), why)  # the first reason, in program order

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
    live = _live(program, specs)
    for name, t in types.items():
        if name not in live and program.slot(name).producer == "instruction":
            continue  # never computed (a gradient program's unread forward outputs)
        seen: dict[str, str] = {}
        for a, s in _symbolic(t):
            r = root.get(s, s)
            if r in seen:
                tie(r, f"{name!r} carries it on two axes ({seen[r]!r} and {a!r})")
            seen[r] = a
    for slot in program.outputs:  # a chunked run writes its outputs along the symbols themselves
        for a, s in _symbolic(types[slot]):
            if s in root:
                tie(s, f"output {slot!r} carries {s!r} (axis {a!r}), {root[s]!r} merged with other axes")
    summed: dict[str, set[str]] = {}  # symbol -> the slots that are sums over it
    zeros: set[str] = set()  # slots that are 0 (a sum over every symbol)
    for i, (ins, spec) in enumerate(zip(program.instructions, specs)):
        if ins.output_slot not in live:
            continue
        operands = tuple(types[s] for s in ins.input_slots)
        out = types[ins.output_slot]
        node = Node(i, ins.instruction_id, spec, ins.attributes, tuple(ins.input_slots),
                    ins.output_slot, operands, out, f"$.instructions[{i}]")
        free = spec.free_axes(node) if spec.free_axes is not None else frozenset()
        linear = spec.linear(node) if spec.linear is not None else None
        if linear is not None and not linear.operands and not linear.sums:
            zeros.add(ins.output_slot)  # linear in no operand: 0
        where = f"instruction {ins.instruction_id!r} ({spec.name})"
        named = [(spec.inputs[k] if k < len(spec.inputs) else f"operand {k}", t)
                 for k, t in enumerate(operands)] + [("its output", out)]
        out_symbols = _symbols((out,), root)
        sums_here = {s for s in _symbols(operands, root) - out_symbols if _sums_over(operands, linear, s, root)}
        merging = ins.instruction_id in merge_ids and out.sizes[0] in root
        for k, (what, t) in enumerate(named):
            for a, s in _symbolic(t):
                r = root.get(s, s)
                if r in sums_here:
                    continue  # a summation index: the slices' outputs add up to the whole
                if k in spec.types_only and r not in out_symbols:
                    continue  # only its type is read: the output is the same in every slice
                if merging and a == t.axes[0] and r == root[out.sizes[0]]:
                    continue  # B merged into the output's leading N: B's slices are N's
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
        read = [slot for k, slot in enumerate(ins.input_slots) if k not in spec.types_only]
        for s in sums_here | {s for s, slots in summed.items() if slots & set(read)}:
            why = _why_not_a_sum(ins.input_slots, operands, out, linear, s,
                                 summed.get(s, set()) & set(read), zeros, s in sums_here, root)
            if why is None:
                summed.setdefault(s, set()).add(ins.output_slot)
            else:
                tie(s, f"{where} {why}")
    for s in program.symbols:
        if s in merged:
            b, ids = merged[s]
            tied.setdefault(s, f"{b!r} merged with other axes by {', '.join(map(repr, ids))} (a slice "
                               f"along {b!r} is a slice of it)")
        elif s not in carried_by_input:
            tie(s, "no input carries it")
    free_symbols = tuple(s for s in program.symbols if s not in tied)
    sums = {s: tuple(o for o in program.outputs if o in summed.get(s, ())) for s in free_symbols}
    return FreeAxes(free_symbols, {s: tied[s] for s in program.symbols if s in tied},
                    {s: slots for s, slots in sums.items() if slots})


def _live(program: Program, specs: Sequence[AtomSpec]) -> set[str]:
    """The slots a run computes, exactly as ``planner.live_nodes`` keeps them (whatever a
    slice runs must slice well): those an output depends on, and those of instructions with
    value checks, with what they read."""
    needed = set(program.outputs)
    for ins, spec in zip(reversed(program.instructions), reversed(specs)):
        if ins.output_slot in needed or spec.check_values is not None:
            needed.add(ins.output_slot)
            needed.update(ins.input_slots)
    return needed


def _merged_symbols(program: Program, specs: Sequence[AtomSpec]) -> dict[str, tuple[str, tuple[str, ...]]]:
    """N -> (B, the instructions making it): symbols N that C-order reshapes (``AtomSpec.view``)
    make by merging a leading axis of symbol B with the axes after it ([B, S, D] -> [N, D]), so
    that a slice along B is a slice along N. Only when every producer of N merges the same
    sizes, nothing else introduces N and no binding carries it."""
    found: dict[str, list] = {}
    introduced: dict[str, set[str]] = {}  # N -> the instructions whose output has N and no operand does
    for ins, spec in zip(program.instructions, specs):
        inputs = [program.slot(slot).value_type for slot in ins.input_slots]
        o = program.slot(ins.output_slot).value_type
        for n in {s for s in o.sizes if isinstance(s, str)} - {s for t in inputs for s in t.sizes}:
            introduced.setdefault(n, set()).add(ins.instruction_id)
        if not spec.view or len(inputs) != 1:
            continue
        t = inputs[0]
        k = t.rank - o.rank + 1  # input axes [0, k) become output axis 0
        if k < 2 or o.rank < 1 or not isinstance(o.sizes[0], str) or not isinstance(t.sizes[0], str) \
                or (t.axes[k:], t.sizes[k:]) != (o.axes[1:], o.sizes[1:]) \
                or o.sizes[0] in t.sizes or t.sizes[0] in t.sizes[1:k]:
            continue
        found.setdefault(o.sizes[0], []).append((t.sizes[:k], ins.instruction_id))
    carried = {s for b in program.bindings for s in b.value_type.sizes if isinstance(s, str)}
    return {n: (uses[0][0][0], tuple(i for _, i in uses)) for n, uses in found.items()
            if n not in carried and len({u for u, _ in uses}) == 1
            and introduced.get(n, set()) == {i for _, i in uses} and uses[0][0][0] not in found}


def _symbols(ts: Sequence[TensorType], root: Mapping[str, str]) -> set[str]:
    return {root.get(s, s) for t in ts for _, s in _symbolic(t)}


def _sums_over(operands: Sequence[TensorType], linear: Linear | None, symbol: str,
               root: Mapping[str, str]) -> bool:
    """Whether every axis ``symbol`` sizes in ``operands`` (itself or a symbol merging it) lies
    on a summation index of ``linear`` that runs along it alone (each slice sums a part of its terms)."""
    if linear is None or not linear.sums:
        return False
    covered = set()
    for index in linear.sums:
        sizes = {operands[k].size_of(a) for k, a in index}
        roots = {root.get(s, s) for s in sizes}
        if symbol in roots:
            if roots != {symbol} or len(sizes) != 1:
                return False  # paired with a static axis or another symbol
            covered.update(index)
    return covered == {(k, a) for k, t in enumerate(operands) for a, s in _symbolic(t)
                       if root.get(s, s) == symbol}


def _why_not_a_sum(slots: Sequence[str], operands: Sequence[TensorType], out: TensorType,
                   linear: Linear | None, symbol: str, sums: set[str], zeros: set[str], summing: bool,
                   root: Mapping[str, str]) -> str | None:
    """Why the instruction's output is no sum over ``symbol`` though it sums over it
    (``summing``) or reads a sum over it (``sums``); None when it is one."""
    read = [k for k, slot in enumerate(slots) if slot in sums]
    if summing:  # operands without the symbol: the same in every slice, or (scatter's base) sums
        carrying = {k for k, t in enumerate(operands) if symbol in _symbols((t,), root)}
        if linear.jointly:
            rest = [k for k in linear.operands if k not in carrying and k not in read and slots[k] not in zeros]
            if rest:
                return (f"sums over {symbol!r} into {slots[rest[0]]!r}, which is not a sum over it (each "
                        "slice would add it again)")
        if any(k not in linear.operands or not linear.jointly for k in read):
            return f"sums over {symbol!r} and also reads {slots[read[0]]!r}, a sum over it"
        return None
    sum_name = slots[read[0]]
    if symbol in _symbols((*operands, out), root):
        return f"reads {sum_name!r}, a sum over {symbol!r}, together with values that carry {symbol!r}"
    if linear is None:
        return f"reads {sum_name!r}, a sum over {symbol!r}, and is not linear in it"
    fixed = [k for k in range(len(slots)) if k not in linear.operands]
    if any(k in read for k in fixed):
        return f"reads {sum_name!r}, a sum over {symbol!r}, as an operand it is not linear in"
    if linear.jointly and any(k not in read and slots[k] not in zeros for k in linear.operands):
        other = next(slots[k] for k in linear.operands if k not in read and slots[k] not in zeros)
        return (f"adds {sum_name!r}, a sum over {symbol!r}, to {other!r}, which is not one (each slice "
                "would add it again)")
    if not linear.jointly and len(read) > 1:
        return f"multiplies {sum_name!r} and {slots[read[1]]!r}, both sums over {symbol!r}"
    return None


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
    divide ``extent``: every slice has one shape, so one compiled plan and one arena serve all).
    With ``sums`` (output slot -> the dtype its slices' values are added in: outputs that are
    sums over the symbol) no slice overlaps: the last one is shorter instead, with a plan of its own."""

    symbol: str
    extent: int
    size: int
    count: int
    requested: str | int  # "auto" or the positions per slice the caller asked for
    whole_working_bytes: int  # what the unsliced run would need
    slice_working_bytes: int
    sums: tuple[tuple[str, str], ...] = ()

    def starts(self) -> list[int]:
        return [start for start, _ in self.slices()]

    def slices(self) -> list[tuple[int, int]]:
        """(start, positions) of each slice, in order."""
        if self.sums:  # an overlap would add its positions twice
            return [(k * self.size, min(self.size, self.extent - k * self.size)) for k in range(self.count)]
        return [(min(k * self.size, self.extent - self.size), self.size) for k in range(self.count)]

    def to_dict(self) -> dict:
        return {"symbol": self.symbol, "extent": self.extent, "size": self.size, "count": self.count,
                "starts": self.starts(), "requested": self.requested,
                "whole_working_bytes": self.whole_working_bytes,
                "slice_working_bytes": self.slice_working_bytes,
                "sums": dict(self.sums)}

    def describe(self) -> str:
        last = self.extent - (self.count - 1) * self.size
        overlap = 0 if self.sums else self.count * self.size - self.extent
        text = (f"chunked along {self.symbol} (chunks={self.requested!r}): {self.extent} positions in "
                f"{self.count} slices of {self.size}"
                + (f" (the last overlaps the one before by {overlap})" if overlap else "")
                + (f" (the last of {last})" if self.sums and last != self.size else "")
                + f"; each slice's working set {self.slice_working_bytes:,} bytes, the whole run's "
                  f"{self.whole_working_bytes:,}")
        if self.sums:
            text += "\n" + "\n".join(
                f"  {slot} is a sum over {self.symbol}: each slice's value is added into it, in {acc}"
                for slot, acc in self.sums)
        return text


def accumulation_dtype(dtype: str) -> str:
    """The dtype the slices' values of a sum are added in: SPEC c(float32, d) (float32, float64
    for float64; half outputs are rounded once, at the end); an integer sum in its own dtype."""
    return dtype if dtype in ("float64", "int64") else "float32"


def even_slices(extent: int, most: int) -> tuple[int, int]:
    """(size, count): the fewest slices of at most ``most`` positions, sized evenly."""
    count = -(-extent // most)
    return -(-extent // count), count


__all__ += ["Chunking", "accumulation_dtype", "even_slices"]
