"""What a gradient rule sees (``AtomSpec.vjp(ctx)``): the forward instruction, its output's
cotangent, which operands want a gradient, and an emitter of atoms with the helpers most
rules need. Rules emit atoms, never kernels, so the backward pass is planned, fused and run
like any program (SPEC §3c)."""
from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from runtime.core.types import TensorType, is_float
from runtime.plugins.atomspec import AtomSpec
from runtime.program.model import Instruction
from runtime.autodiff.writer import ProgramWriter

SUM = {"mode": "sum", "accumulation_dtype": "float32"}


class VjpContext:
    """One instruction's gradient rule at work. ``cotangent`` is ȳ (typed like the output);
    the rule returns ``{operand position: slot}`` for the positions ``wants``, each slot typed
    exactly like that operand (axes, order, sizes, dtype, domain)."""

    def __init__(self, writer: ProgramWriter, instruction: Instruction, spec: AtomSpec,
                 cotangent: str, wanted: frozenset[int], path: str):
        self.writer = writer
        self.instruction = instruction
        self.atom = spec
        self.attributes: Mapping[str, Any] = instruction.attributes
        self.inputs: tuple[str, ...] = instruction.input_slots
        self.output: str = instruction.output_slot
        self.cotangent = cotangent
        self.path = path
        self._wanted = wanted

    # --- what the rule reads -------------------------------------------------------------
    def wants(self, operand: int) -> bool:
        return operand in self._wanted

    def type_of(self, slot: str) -> TensorType:
        return self.writer.types[slot]

    @property
    def input_types(self) -> tuple[TensorType, ...]:
        return tuple(self.type_of(s) for s in self.inputs)

    @property
    def output_type(self) -> TensorType:
        return self.type_of(self.output)

    # --- emitting ------------------------------------------------------------------------
    def op(self, atom: str, inputs: Sequence[str], attributes: Mapping[str, Any] | None = None) -> str:
        """Emit one instruction (``"scale"``, ``"reduce@2"``, ``"fill"`` or a whole reference)."""
        return self.writer.op(atom, inputs, attributes or {})

    def fill(self, like: str, value: Any, axes: Sequence[str] | None = None,
             dtype: str | None = None) -> str:
        """A constant over ``axes`` of ``like`` (all of them by default), of ``like``'s dtype."""
        t = self.type_of(like)
        return self.op("fill", [like], {"axes": list(t.axes if axes is None else axes),
                                        "dtype": dtype or t.dtype, "value": value})

    def scalar(self, like: str, value: float) -> str:
        """A 0-d constant of ``like``'s float dtype."""
        return self.fill(like, value, axes=())

    def zeros(self, like: str) -> str:
        return self.fill(like, False if self.type_of(like).dtype == "boolean" else 0)

    def mul(self, value: str, factor: str, acc: str = "float32") -> str:
        """value · factor, the factor broadcast by axis name (its axes ⊆ value's)."""
        return self.op("scale", [value, factor], {"factor_axes": list(self.type_of(factor).axes),
                                                   "accumulation_dtype": acc})

    def add(self, left: str, right: str, acc: str = "float32") -> str:
        return self.op("add", [left, right], {"accumulation_dtype": acc})

    def neg(self, value: str) -> str:
        return self.mul(value, self.scalar(value, -1.0))

    def sub(self, left: str, right: str) -> str:
        return self.add(left, self.neg(right))

    def select(self, mask: str, when_true: str, when_false: str) -> str:
        return self.op("select", [mask, when_true, when_false])

    def map(self, value: str, mode: str) -> str:
        return self.op("scalar-map@2", [value], {"mode": mode, "accumulation_dtype": "float32"})

    def map_vjp(self, value: str, cotangent: str, mode: str, acc: str = "float32") -> str:
        return self.op("scalar-map-vjp", [value, cotangent], {"mode": mode, "accumulation_dtype": acc})

    def compare(self, left: str, right: str, mode: str) -> str:
        return self.op("compare", [left, right], {"mode": mode})

    def cast(self, value: str, dtype: str) -> str:
        return value if self.type_of(value).dtype == dtype else self.op("cast", [value], {"dtype": dtype})

    def permute(self, value: str, axes: Sequence[str]) -> str:
        return value if tuple(axes) == self.type_of(value).axes else \
            self.op("permute", [value], {"output_axes": list(axes)})

    def reshape(self, value: str, axes: Sequence[str], sizes: Sequence[Any]) -> str:
        t = self.type_of(value)
        if (tuple(axes), tuple(sizes)) == (t.axes, t.sizes):
            return value
        return self.op("reshape", [value], {"output_axes": list(axes), "output_sizes": list(sizes)})

    def rename(self, value: str, mapping: Mapping[str, str]) -> str:
        """The same values under other axis names (a C-order reshape: a view, no kernel)."""
        t = self.type_of(value)
        return self.reshape(value, [mapping.get(a, a) for a in t.axes], t.sizes)

    def copy(self, value: str) -> str:
        """An instruction-made copy (an output must be instruction-produced and unique)."""
        t = self.type_of(value)
        return self.op("reshape", [value], {"output_axes": list(t.axes), "output_sizes": list(t.sizes)})

    def reduce_sum(self, value: str, axes: Sequence[str]) -> str:
        """Σ over ``axes`` (reduce@2 sum, accumulated in float32), in the given order."""
        for axis in axes:
            value = self.op("reduce@2", [value], {"axis": axis, **SUM})
        return value

    def broadcast_to(self, value: str, target: TensorType) -> str:
        """``value`` (axes ⊆ target's, extents equal or 1) repeated to ``target``'s axes and sizes."""
        t = self.type_of(value)
        if (t.axes, t.sizes) == (target.axes, target.sizes):
            return value
        return self.op("broadcast", [value], {"output_axes": list(target.axes),
                                              "output_sizes": list(target.sizes)})

    def unbroadcast(self, value: str, target: TensorType) -> str:
        """The adjoint of ``broadcast_to``: ``value`` summed over the axes ``target`` lacks and
        over those ``target`` has at extent 1 (but ``value`` not), then in ``target``'s order."""
        t = self.type_of(value)
        gone = [a for a in t.axes if a not in target.axes]
        expanded = [a for a in target.axes if target.size_of(a) == 1 and t.size_of(a) != 1]
        value = self.reduce_sum(value, gone + expanded)
        kept = [a for a in target.axes if a not in expanded]
        value = self.permute(value, kept)
        return self.reshape(value, target.axes, target.sizes)

    def ones_where(self, mask: str, like: str) -> str:
        """1 where ``mask`` holds, else 0, typed like ``like``."""
        return self.select(mask, self.fill(like, 1.0), self.fill(like, 0.0))

    def is_float(self, slot: str) -> bool:
        return is_float(self.type_of(slot).dtype)
