"""The rules of SPEC §2 that relate records to each other, and static type inference.

Runs after ``runtime.program.loader`` built the records. Each rule raises the §6 code of its
clause; where two could apply, the more specific is checked first.
"""
from __future__ import annotations

from runtime.plugins import failures
from runtime.plugins.atomspec import InferContext
from runtime.core.errors import fail
from runtime.program import loader
from runtime.program.model import BankBinding, Program
from runtime.plugins.registry import Registry
from runtime.core.types import FLOAT_DTYPES, ITEMSIZE, TensorType

ROLE_OF_KIND = {"input": "input", "bank": "bank_operand"}


def validate(program: Program, registry: Registry) -> None:
    _unique(program)
    _limits(program)
    _bindings_have_slots(program)
    _bundles(program)
    _outputs(program)
    _instructions(program, registry)


def _unique(p: Program) -> None:
    for items, key, what, where in (
        (p.bindings, "name", "binding name", "bindings"),
        (p.slots, "slot_id", "slot id", "slots"),
        (p.instructions, "instruction_id", "instruction id", "instructions"),
    ):
        seen: set[str] = set()
        for i, item in enumerate(items):
            value = getattr(item, key)
            if value in seen:
                fail("duplicate", f"$.{where}[{i}].{key}", f"{what} {value!r} appears twice")
            seen.add(value)
    seen = set()
    for i, out in enumerate(p.outputs):
        if out in seen:
            fail("duplicate", f"$.outputs[{i}]", f"output {out!r} is listed twice")
        seen.add(out)
    writers: dict[str, int] = {}
    for i, ins in enumerate(p.instructions):
        if ins.output_slot in writers:
            fail("duplicate", f"$.instructions[{i}].output_slot",
                 f"slot {ins.output_slot!r} is written by instructions "
                 f"{p.instructions[writers[ins.output_slot]].instruction_id!r} and {ins.instruction_id!r}")
        writers[ins.output_slot] = i


def _limits(p: Program) -> None:
    lim = p.limits
    for i, ins in enumerate(p.instructions):
        if ins.step > lim.max_steps:
            fail("limit_exceeded", f"$.instructions[{i}].step",
                 f"step {ins.step} of {ins.instruction_id!r} exceeds max_steps = {lim.max_steps}")
    typed = [(f"$.slots[{i}].value_type", s.value_type, f"slot {s.slot_id!r}") for i, s in enumerate(p.slots)]
    typed += [(f"$.bindings[{i}].value_type", b.value_type, f"binding {b.name!r}")
              for i, b in enumerate(p.bindings)]
    for path, t, what in typed:
        check_type_limits(t, lim, path, what)


def check_type_limits(t: TensorType, lim, path: str, what: str) -> None:
    """Axes per type, static extents and static element/byte counts (load and run time)."""
    if t.rank > lim.max_axes:
        fail("limit_exceeded", f"{path}.axes", f"{what} has {t.rank} axes; max_axes = {lim.max_axes}")
    elements = 1
    for j, size in enumerate(t.sizes):
        if isinstance(size, int):
            if size > lim.max_axis_extent:
                fail("limit_exceeded", f"{path}.sizes[{j}]",
                     f"{what} axis {t.axes[j]!r} has extent {size}; max_axis_extent = {lim.max_axis_extent}")
            elements *= size
    if elements > lim.max_tensor_elements:
        fail("limit_exceeded", path, f"{what} has at least {elements} elements; "
                                     f"max_tensor_elements = {lim.max_tensor_elements}")
    # 'floating': the smallest float's size, a lower bound until the dtype is known
    itemsize = ITEMSIZE.get(t.dtype, min(ITEMSIZE[d] for d in FLOAT_DTYPES))
    if elements * itemsize > lim.max_tensor_bytes:
        fail("limit_exceeded", path, f"{what} needs at least {elements * itemsize} bytes; "
                                     f"max_tensor_bytes = {lim.max_tensor_bytes}")


def _bindings_have_slots(p: Program) -> None:
    slot_index = {s.slot_id: i for i, s in enumerate(p.slots)}
    binding_names = {b.name: b for b in p.bindings}
    for i, b in enumerate(p.bindings):
        j = slot_index.get(b.name)
        if j is None:
            fail("slot_producer", f"$.bindings[{i}]", f"binding {b.name!r} has no slot of the same name")
        s = p.slots[j]
        path = f"$.slots[{j}]"
        if s.producer != b.kind:
            fail("slot_producer", f"{path}.producer",
                 f"slot {s.slot_id!r} of {b.kind} binding must have producer {b.kind!r}, got {s.producer!r}")
        if s.producer_id != b.name:
            fail("slot_producer", f"{path}.producer_id",
                 f"slot {s.slot_id!r} must have producer_id {b.name!r}, got {s.producer_id!r}")
        if not s.value_type.same_as(b.value_type):
            fail("slot_producer", f"{path}.value_type",
                 f"slot {s.slot_id!r} has type {s.value_type} but its binding has {b.value_type}")
        if s.role != ROLE_OF_KIND[b.kind]:
            fail("slot_producer", f"{path}.role",
                 f"slot {s.slot_id!r} of a {b.kind} binding must have role {ROLE_OF_KIND[b.kind]!r}, got {s.role!r}")
    for j, s in enumerate(p.slots):
        if s.producer in ("input", "bank"):
            b = binding_names.get(s.slot_id)
            if b is None or b.name != s.producer_id:
                fail("slot_producer", f"$.slots[{j}]",
                     f"slot {s.slot_id!r} claims {s.producer} binding {s.producer_id!r}, which does not exist")


def _bundles(p: Program) -> None:
    first: dict[str, tuple[int, BankBinding]] = {}
    for i, b in enumerate(p.bindings):
        if not isinstance(b, BankBinding):
            continue
        path = f"$.bindings[{i}]"
        if (b.bundle_id is None) != (not b.member_ids):
            fail("bank_bundle", f"{path}.member_ids",
                 f"bank {b.name!r}: member_ids must be non-empty exactly when bundle_id is set "
                 f"(bundle_id {b.bundle_id!r}, {len(b.member_ids)} member ids)")
        if b.bundle_id is None:
            continue
        if "K" in b.value_type.axes:
            extent = b.value_type.size_of("K")
            if isinstance(extent, int) and extent != len(b.member_ids):
                fail("bank_bundle", f"{path}.member_ids",
                     f"bank {b.name!r} has {len(b.member_ids)} member ids but its member axis K has extent {extent}")
        elif len(b.member_ids) != 1:
            fail("bank_bundle", f"{path}.member_ids",
                 f"bank {b.name!r} has no member axis K, so it needs exactly 1 member id, got {len(b.member_ids)}")
        if b.bundle_id in first:
            j, other = first[b.bundle_id]
            for field in ("source_ref", "asset_fingerprint", "member_ids"):
                if getattr(b, field) != getattr(other, field):
                    fail("bank_bundle", f"{path}.{field}",
                         f"banks {other.name!r} and {b.name!r} of bundle {b.bundle_id!r} disagree on {field}")
        else:
            first[b.bundle_id] = (i, b)


def _instructions(p: Program, registry: Registry) -> None:
    slots = {s.slot_id: s for s in p.slots}
    slot_index = {s.slot_id: j for j, s in enumerate(p.slots)}  # dicts keep validation linear
    outputs = frozenset(p.outputs)
    produced_at: dict[str, int] = {b.name: 0 for b in p.bindings}
    previous_step = 0
    for i, ins in enumerate(p.instructions):
        path = f"$.instructions[{i}]"
        if ins.step < previous_step:
            fail("invalid_step", f"{path}.step",
                 f"step {ins.step} of {ins.instruction_id!r} is smaller than the previous step {previous_step}")
        previous_step = ins.step
        spec = registry.atom(ins.atom_ref, f"{path}.atom_ref")
        check_signature(spec, ins.input_slots, ins.attributes, path)
        operand_types = []
        for k, slot_id in enumerate(ins.input_slots):
            if slot_id not in slots:
                fail("ssa_visibility", f"{path}.input_slots[{k}]", f"{ins.instruction_id!r} reads slot {slot_id!r}, which does not exist")
            step = produced_at.get(slot_id)
            if step is None or step >= ins.step:
                when = "later" if step is None else f"at step {step}"
                fail("ssa_visibility", f"{path}.input_slots[{k}]",
                     f"{ins.instruction_id!r} at step {ins.step} reads slot {slot_id!r}, produced {when}; "
                     "only bindings and outputs of strictly earlier steps are visible")
            operand_types.append(slots[slot_id].value_type)
        out_slot = slots.get(ins.output_slot)
        if out_slot is None:
            fail("slot_producer", f"{path}.output_slot",
                 f"{ins.instruction_id!r} writes slot {ins.output_slot!r}, which has no slot record")
        out_index = slot_index[ins.output_slot]
        _check_instruction_slot(out_slot, out_index, ins.instruction_id, outputs)
        ctx = InferContext(spec, path, ins.attributes, operand_types, ins.input_slots)
        inferred = failures.infer(spec, ctx)
        if not inferred.same_as(out_slot.value_type):
            fail("type_mismatch", f"$.slots[{out_index}].value_type",
                 f"slot {out_slot.slot_id!r} is declared {out_slot.value_type} but {spec.name} "
                 f"({ins.instruction_id!r}) produces {inferred}")
        produced_at[ins.output_slot] = ins.step
    writers = {ins.output_slot: ins.instruction_id for ins in p.instructions}
    for j, s in enumerate(p.slots):
        if s.producer == "instruction" and s.slot_id not in writers:
            fail("slot_producer", f"$.slots[{j}].producer_id",
                 f"slot {s.slot_id!r} claims instruction {s.producer_id!r}, which does not write it")


def check_signature(spec, input_slots, attributes, path: str) -> None:
    """The operand count and the exact attribute keys an atom takes (before its ``infer``
    reads them)."""
    if len(input_slots) != len(spec.inputs):
        fail("atom_signature", f"{path}.input_slots",
             f"{spec.name} takes {len(spec.inputs)} inputs ({', '.join(spec.inputs)}), got {len(input_slots)}")
    keys = set(attributes)
    missing, extra = sorted(spec.attributes - keys), sorted(keys - spec.attributes)
    if missing or extra:
        parts = ([f"missing {missing}"] if missing else []) + ([f"unexpected {extra}"] if extra else [])
        fail("atom_signature", f"{path}.attributes",
             f"{spec.name} attributes must be exactly {sorted(spec.attributes)}: {'; '.join(parts)}")


def _check_instruction_slot(s, j: int, instruction_id: str, outputs: frozenset[str]) -> None:
    path = f"$.slots[{j}]"
    if s.producer != "instruction":
        fail("slot_producer", f"{path}.producer",
             f"slot {s.slot_id!r} is written by instruction {instruction_id!r} but has producer {s.producer!r}")
    if s.producer_id != instruction_id:
        fail("slot_producer", f"{path}.producer_id",
             f"slot {s.slot_id!r} is written by {instruction_id!r} but names producer {s.producer_id!r}")
    role = "output" if s.slot_id in outputs else "temporary"
    if s.role != role:
        fail("slot_producer", f"{path}.role", f"slot {s.slot_id!r} must have role {role!r}, got {s.role!r}")


def _outputs(p: Program) -> None:
    if not p.outputs:
        fail("invalid_output", "$.outputs", "a program needs at least one output")
    slots = {s.slot_id: s for s in p.slots}
    for i, out in enumerate(p.outputs):
        s = slots.get(out)
        if s is None or s.producer != "instruction":
            what = "does not exist" if s is None else f"is produced by {s.producer} {s.producer_id!r}"
            fail("invalid_output", f"$.outputs[{i}]", f"output {out!r} {what}; outputs must be instruction slots")


def load(src, registry: Registry, max_bytes: int | None = None) -> Program:
    """A fully validated program from a path, JSON text/bytes, a parsed dict, or a Program
    (returned as it is: it was validated when it was made)."""
    if isinstance(src, Program):
        return src
    program = loader.program(loader.read_source(src, max_bytes))
    validate(program, registry)
    return program
