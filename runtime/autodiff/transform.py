"""Reverse mode as a program transform (SPEC §3c): ``vjp(program, wrt)`` returns a program of
the same format that keeps the forward unchanged and appends, for each instruction on a path
from a ``wrt`` binding to a requested output, the atoms its gradient rule emits.

Activity analysis keeps the rest out: a value is *varied* when it is floating and depends on a
``wrt`` binding, *useful* when a requested output depends on it; only instructions whose
output is both get a rule. Contributions to one value are summed with ``add`` in the order the
walk meets them (reverse instruction order, then operand order), so results are deterministic.
"""
from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import attrs

from runtime.core.errors import FormulaError, fail
from runtime.core.types import TensorType, is_float
from runtime.program.model import Program
from runtime.program.validate import load
from runtime.autodiff.context import VjpContext
from runtime.autodiff.simplify import scale_after_contractions
from runtime.autodiff.writer import ProgramWriter, slot_bytes


@attrs.frozen
class Gradient:
    """The result of :func:`vjp`: ``program`` (a program dict), ``cotangents`` (output slot ->
    the input binding that carries its cotangent) and ``gradients`` (wrt name -> output slot)."""

    program: dict
    cotangents: dict[str, str]
    gradients: dict[str, str]
    forward: Program = attrs.field(repr=False)
    added: int = 0  # instructions the transform appended

    def manifest(self) -> dict[str, Any]:
        return {"cotangents": dict(self.cotangents), "gradients": dict(self.gradients),
                "instructions_added": self.added}

    @property
    def saved(self) -> tuple[str, ...]:
        """The forward instructions' results the backward reads (what a training step keeps
        from its forward pass), in program order."""
        ids = {i.instruction_id for i in self.forward.instructions}
        reads = {s for ins in self.program["instructions"] if ins["instruction_id"] not in ids
                 for s in ins["input_slots"]}
        return tuple(i.output_slot for i in self.forward.instructions if i.output_slot in reads)

    def split(self, remat: Any = "save-all"):
        """A forward program that also outputs what the backward reads, and the backward that
        takes it (runtime.autodiff.split: ``remat`` is the recompute policy)."""
        from runtime.autodiff.split import split

        return split(self, remat)

    def saved_bytes(self, dims: Mapping[str, int]) -> dict[str, int]:
        """Bytes of each saved value at ``dims`` ('floating' counted as float32)."""
        return slot_bytes(self.forward, self.saved, dims)


def vjp(src: Any, wrt: Sequence[str], outputs: Sequence[str] | None = None, registry=None,
        seeds: Mapping[str, float] | None = None) -> Gradient:
    """The vector-Jacobian product of ``src`` as a program (SPEC §3c). ``seeds`` gives a
    requested 0-d output a constant cotangent instead of an input binding (``grad``)."""
    if registry is None:
        from runtime.plugins.registry import default_registry

        registry = default_registry()
    program = load(src, registry)
    wrt = _check_wrt(program, wrt)
    outputs = _check_outputs(program, outputs)
    specs = [registry.atom(ins.atom_ref, f"$.instructions[{k}].atom_ref")
             for k, ins in enumerate(program.instructions)]
    types = {s.slot_id: s.value_type for s in program.slots}

    varied = set(wrt)
    for ins in program.instructions:
        if is_float(types[ins.output_slot].dtype) and any(s in varied for s in ins.input_slots):
            varied.add(ins.output_slot)
    useful = set(outputs)
    for ins in reversed(program.instructions):
        if ins.output_slot in useful:
            useful.update(ins.input_slots)

    writer = ProgramWriter(program, registry)
    cotangents: dict[str, str] = {}
    pending: dict[str, list[str]] = {}
    for slot in outputs:  # one cotangent per requested output, used or not: a stable interface
        if seeds and slot in seeds:
            if slot in varied:
                pending[slot] = [writer.op("fill", [slot], {"axes": [], "dtype": types[slot].dtype,
                                                            "value": seeds[slot]})]
            continue
        cotangents[slot] = writer.input(writer.binding_name(slot), types[slot])
        if slot in varied:
            pending[slot] = [cotangents[slot]]

    for k in range(len(program.instructions) - 1, -1, -1):
        ins, spec = program.instructions[k], specs[k]
        if ins.output_slot not in varied or ins.output_slot not in useful:
            continue
        contributions = pending.pop(ins.output_slot, None)
        if not contributions:
            continue
        path = f"$.instructions[{k}]"
        wanted = frozenset(i for i, s in enumerate(ins.input_slots) if s in varied)
        found = registry.vjp_rule(spec)
        owner = registry.atom_owner.get(ins.atom_ref)
        if found is None:
            fail("not_differentiable", path,
                 f"atom {ins.atom_ref} ({spec.name}, from plugin {_who(owner)}) has no gradient rule, "
                 f"and operand {_operands(spec, ins, wanted)} depends on a wrt binding")
        rule, differentiable, rule_owner = found
        missing = sorted(wanted - set(differentiable))
        if missing:
            fail("not_differentiable", path,
                 f"atom {ins.atom_ref} ({spec.name}, from plugin {_who(owner)}) has no gradient for "
                 f"operand {_operands(spec, ins, frozenset(missing))}, which depends on a wrt binding")
        ybar = _sum(writer, contributions)
        ctx = VjpContext(writer, ins, spec, ybar, wanted, path)
        result = _apply(rule, ctx, spec, ins, path, rule_owner)
        for i in sorted(result):
            pending.setdefault(ins.input_slots[i], []).append(result[i])

    gradients: dict[str, str] = {}
    taken: set[str] = set()
    for name in wrt:
        contributions = pending.get(name)
        if contributions:
            slot = _sum(writer, contributions)
        else:  # no requested output depends on it: zeros (SPEC §3c)
            slot = writer.op("fill", [name], {"axes": list(types[name].axes), "dtype": types[name].dtype,
                                              "value": 0})
        if slot in taken or writer.producers[slot] != "instruction":
            t = writer.types[slot]  # an output must be instruction-made and listed once
            slot = writer.op("reshape", [slot], {"output_axes": list(t.axes), "output_sizes": list(t.sizes)})
        taken.add(slot)
        gradients[name] = slot
    scale_after_contractions(writer, len(program.instructions), set(gradients.values()))
    added = len(writer.instructions) - len(program.instructions)
    built = writer.build([gradients[n] for n in wrt])
    return Gradient(built, cotangents, gradients, program, added)


def grad(src: Any, wrt: Sequence[str], output: str, registry=None) -> Gradient:
    """``vjp`` of one 0-d floating output with the cotangent 1 (no cotangent input)."""
    if registry is None:
        from runtime.plugins.registry import default_registry

        registry = default_registry()
    program = load(src, registry)
    if not isinstance(output, str) or output not in program.outputs:
        fail("invalid_output", "$.output",
             f"grad: {output!r} is not an output of the program (outputs {list(program.outputs)})")
    t = program.slot(output).value_type
    if t.rank or not is_float(t.dtype):
        fail("not_differentiable", "$.output",
             f"grad needs a 0-d floating output; {output} is {t.describe()} (use runtime.vjp with a cotangent)")
    return vjp(program, wrt, [output], registry, seeds={output: 1.0})


# --- checks ---------------------------------------------------------------------------------

def _check_wrt(program: Program, wrt: Sequence[str]) -> list[str]:
    if isinstance(wrt, str) or not isinstance(wrt, Sequence) or not wrt:
        fail("schema", "$.wrt", f"wrt must be a non-empty list of binding names, got {wrt!r}")
    names = {b.name: b for b in program.bindings}
    seen: set[str] = set()
    for i, name in enumerate(wrt):
        path = f"$.wrt[{i}]"
        if not isinstance(name, str):
            fail("schema", path, f"expected a binding name, got {type(name).__name__}")
        if name not in names:
            from runtime.core.errors import did_you_mean

            fail("binding_keys", path, f"{name!r} is not a binding of the program"
                                       f"{did_you_mean(name, names)} (bindings: {sorted(names)})")
        if name in seen:
            fail("duplicate", path, f"{name!r} is listed twice in wrt")
        seen.add(name)
        t = names[name].value_type
        if not is_float(t.dtype):
            fail("not_differentiable", path,
                 f"{name!r} is {t.dtype}: only floating bindings have gradients")
    return list(wrt)


def _check_outputs(program: Program, outputs: Sequence[str] | None) -> list[str]:
    types = {s.slot_id: s.value_type for s in program.slots}
    if outputs is None:
        chosen = [o for o in program.outputs if is_float(types[o].dtype)]
        if not chosen:
            fail("not_differentiable", "$.outputs", "the program has no floating output to differentiate")
        return chosen
    if isinstance(outputs, str) or not isinstance(outputs, Sequence) or not outputs:
        fail("schema", "$.outputs", f"outputs must be a non-empty list of output slots, got {outputs!r}")
    seen: set[str] = set()
    for i, slot in enumerate(outputs):
        path = f"$.outputs[{i}]"
        if not isinstance(slot, str) or slot not in program.outputs:
            fail("invalid_output", path, f"{slot!r} is not an output of the program "
                                         f"(outputs {list(program.outputs)})")
        if slot in seen:
            fail("duplicate", path, f"{slot!r} is listed twice in outputs")
        seen.add(slot)
        if not is_float(types[slot].dtype):
            fail("not_differentiable", path, f"output {slot} is {types[slot].dtype}: only floating "
                                             "outputs carry a cotangent")
    return list(outputs)


# --- walking ----------------------------------------------------------------------------------

def _sum(writer: ProgramWriter, contributions: list[str]) -> str:
    total = contributions[0]
    for c in contributions[1:]:
        total = writer.op("add", [total, c], {"accumulation_dtype": "float32"})
    return total


def _apply(rule, ctx: VjpContext, spec, ins, path: str, owner) -> dict[int, str]:
    """Run a rule; what it gets wrong is ``kernel_failed`` naming the atom and the plugin, the
    original exception as the cause."""
    where = f"the gradient rule of {ins.atom_ref} ({spec.name}, from plugin {_who(owner)})"
    try:
        result = rule(ctx)
    except FormulaError as exc:
        if exc.code == "not_differentiable":  # the rule's own refusal, at its path
            raise
        raise FormulaError("kernel_failed", path, f"{where} emitted an instruction that does not "
                                                  f"check: [{exc.code}] {exc.path}: {exc.message}") from exc
    except Exception as exc:
        raise FormulaError("kernel_failed", path,
                           f"{where} raised {type(exc).__name__}: {exc}") from exc
    if not isinstance(result, Mapping):
        fail("kernel_failed", path, f"{where} returned {type(result).__name__}, expected a mapping "
                                    "of operand positions to slots")
    out: dict[int, str] = {}
    for i, slot in result.items():
        if not isinstance(i, int) or not 0 <= i < len(ins.input_slots):
            fail("kernel_failed", path, f"{where} returned a gradient for operand {i!r}; the atom has "
                                        f"{len(ins.input_slots)} operands")
        if not ctx.wants(i) or slot is None:
            continue
        if not isinstance(slot, str) or slot not in ctx.writer.types:
            fail("kernel_failed", path, f"{where} returned {slot!r} for operand {spec.inputs[i]!r}, "
                                        "which is no slot of the gradient program")
        want: TensorType = ctx.writer.types[ins.input_slots[i]]
        got: TensorType = ctx.writer.types[slot]
        if not got.same_as(want):
            fail("kernel_failed", path, f"{where} returned a gradient of type {got.describe()} for "
                                        f"operand {spec.inputs[i]!r}, which is {want.describe()}")
        out[i] = slot
    return out


def _who(owner) -> str:
    return owner.describe() if owner is not None else "?"


def _operands(spec, ins, positions: frozenset[int]) -> str:
    return ", ".join(f"{spec.inputs[i]!r} ({ins.input_slots[i]})" for i in sorted(positions))
