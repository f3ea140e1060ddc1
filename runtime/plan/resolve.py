"""Types for concrete extents: every slot's shape and dtype once the bindings are known.

Re-running each atom's ``infer`` on resolved operand types checks what load time could not
(extents of symbolic axes) and binds symbols that only an instruction determines (reshape)."""
from __future__ import annotations

from collections.abc import Mapping, Sequence

from runtime.plugins import failures
from runtime.plugins.atomspec import AtomSpec, InferContext, Node
from runtime.core.errors import FormulaError, fail
from runtime.program.model import Program
from runtime.core.types import TensorType


def resolve_nodes(program: Program, specs: Sequence[AtomSpec], binding_types: Mapping[str, TensorType],
                  dims: Mapping[str, int]) -> tuple[list[Node], dict[str, int], dict[str, TensorType]]:
    dims = dict(dims)
    types: dict[str, TensorType] = dict(binding_types)
    nodes: list[Node] = []
    for i, (ins, spec) in enumerate(zip(program.instructions, specs)):
        path = f"$.instructions[{i}]"
        operands = [types[s] for s in ins.input_slots]
        ctx = InferContext(spec, path, ins.attributes, operands, ins.input_slots, dims, planning=True)
        try:
            inferred = failures.infer(spec, ctx)
        except FormulaError as err:
            if err.code == "type_mismatch":
                _check_floating_bindings(program, binding_types, spec.name, path)
            raise
        declared = program.slot(ins.output_slot).value_type
        out = _unify(declared, inferred, dims, ins.output_slot, program.slot_index(ins.output_slot))
        types[ins.output_slot] = out
        nodes.append(Node(i, ins.instruction_id, spec, ins.attributes, ins.input_slots, ins.output_slot,
                          tuple(operands), out, path,
                          declared_inputs=tuple(program.slot(s).value_type for s in ins.input_slots)))
    return nodes, dims, types


def _check_floating_bindings(program: Program, binding_types: Mapping[str, TensorType], atom: str,
                             path: str) -> None:
    """Operands that must share a dtype disagree only at run time when ``floating`` bindings
    were bound to different float dtypes: that is the caller's binding, ``binding_dtype``
    (SPEC §3b.3 item 3), named at the first binding that differs from the first."""
    floating = [b for b in program.bindings if b.value_type.dtype == "floating" and b.name in binding_types]
    if not floating:
        return
    first = binding_types[floating[0].name].dtype
    for b in floating[1:]:
        got = binding_types[b.name].dtype
        if got != first:
            fail("binding_dtype", f"$.{'inputs' if b.kind == 'input' else 'banks'}.{b.name}",
                 f"{b.name!r} is bound as {got} but {floating[0].name!r} as {first}: the `floating` "
                 f"bindings meet in {atom} ({path}), whose operands share one dtype")


def _unify(declared: TensorType, inferred: TensorType, dims: dict[str, int], slot_id: str,
           slot_index: int) -> TensorType:
    path = f"$.slots[{slot_index}].value_type"
    if not inferred.is_static or declared.axes != inferred.axes:
        fail("type_mismatch", path, f"slot {slot_id!r} is declared {declared} but the instruction "
                                    f"produces {inferred}")
    for j, (want, got) in enumerate(zip(declared.sizes, inferred.sizes)):
        if isinstance(want, str):
            bound = dims.setdefault(want, got)
            if bound != got:
                fail("symbol_conflict", f"{path}.sizes[{j}]",
                     f"symbol {want!r} is bound to {bound} but slot {slot_id!r} axis "
                     f"{declared.axes[j]!r} has extent {got}")
        elif want != got:
            fail("type_mismatch", f"{path}.sizes[{j}]",
                 f"slot {slot_id!r} axis {declared.axes[j]!r} is declared {want} but is {got}")
    if declared.dtype not in ("floating", inferred.dtype):
        fail("type_mismatch", f"{path}.dtype",
             f"slot {slot_id!r} is declared {declared.dtype} but is {inferred.dtype}")
    return inferred.evolve(schema_ref=declared.schema_ref)
