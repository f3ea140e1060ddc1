"""AtomSpec.dtypes: what ``formula atoms`` says each operand accepts is what ``infer`` accepts.

The declarations are checked against the loader itself: every one-instruction program of the
conformance cases is re-typed operand by operand (alone, and together with the operands of
the same dtype, for atoms that require identical types) through every dtype, and the dtypes
that load must be exactly the declared class."""
from __future__ import annotations

import copy

import pytest

import runtime
from runtime.core.types import DTYPES, dtype_class_members
from runtime.plugins import diagnostics
from runtime.plugins.atomspec import AtomSpec
from runtime.plugins.hookspecs import hookimpl
from runtime.plugins.registry import Registry, default_registry
from tests.spec.atom_cases import VALID


def _specs():
    registry = default_registry()
    return {id(s): s for s in (registry.atom(ref, "$") for ref in registry.atoms)}.values()


@pytest.mark.parametrize("spec", sorted(_specs(), key=lambda s: s.ref), ids=lambda s: s.ref)
def test_every_operand_of_every_shipped_atom_is_declared(spec):
    assert set(spec.dtypes) == set(spec.inputs)
    for expr in spec.dtypes.values():
        assert dtype_class_members(expr)


def _retyped(program, slots, dtype, out_dtype):
    p = copy.deepcopy(program)
    out_slot = p["instructions"][0]["output_slot"]
    for s in p["slots"]:
        if s["slot_id"] in slots:
            s["value_type"]["dtype"] = dtype
        elif s["slot_id"] == out_slot and out_dtype is not None:
            s["value_type"]["dtype"] = out_dtype
    for b in p["bindings"]:
        if b["name"] in slots:
            b["value_type"]["dtype"] = dtype
    return p


def _loads(program) -> bool:
    try:
        runtime.load_program(program)
    except runtime.FormulaError:
        return False
    return True


def _accepted(program, slot) -> set[str]:
    """Dtypes operand ``slot`` may take, the output re-typed to whatever the atom then gives."""
    orig = {s["slot_id"]: s["value_type"]["dtype"] for s in program["slots"]}
    names = program["instructions"][0]["input_slots"]
    tied = {n for n in names if orig[n] == orig[slot]}
    return {dt for dt in DTYPES for group in ({slot}, tied)
            if any(_loads(_retyped(program, group, dt, out)) for out in (None, dt, "boolean"))}


CASES = {}
for _case in VALID:
    _program = _case[1]() if callable(_case[1]) else _case[1]
    CASES.setdefault(_program["instructions"][0]["atom_ref"], _program)


@pytest.mark.parametrize("ref", sorted(CASES))
def test_declared_dtypes_are_what_the_loader_accepts(ref):
    program = CASES[ref]
    spec = default_registry().atom(ref, "$")
    for position, slot in enumerate(program["instructions"][0]["input_slots"]):
        operand = spec.inputs[position]
        assert _accepted(program, slot) == set(dtype_class_members(spec.dtypes[operand])), operand


def test_formula_atoms_shows_dtypes_and_the_legend():
    rows = diagnostics.atoms_table(default_registry())
    gather = next(r for r in rows if r["reference"] == "arti/formula-atom-gather@2")
    assert gather["dtype_classes"] == {"value": "any", "indices": "int64"}
    assert gather["dtypes"]["indices"] == ["int64"]
    text = diagnostics.format_atoms(rows)
    assert "    dtypes value: any; indices: int64" in text
    assert "floating = float16 bfloat16 float32 float64" in text


def test_a_plugin_declaring_unknown_dtypes_is_refused():
    class Bad:
        @hookimpl
        def formula_register_atoms(self, register):
            register(AtomSpec(name="oops", refs=("acme/oops@1",), inputs=("value",),
                              attributes=frozenset(), infer=lambda ctx: ctx.operands[0],
                              dtypes={"value": "complex"}))

    registry = Registry(autoload=False, builtins=())
    with pytest.raises(runtime.FormulaError) as exc:
        registry.register(Bad(), None)
    assert exc.value.code == "plugin_error"
    assert "declares 'value' as 'complex'" in exc.value.message and "floating" in exc.value.message
    assert "acme/oops@1" not in registry.atoms
