"""SPEC §2 cross-record rules at load time: duplicates, slots vs producers, SSA visibility,
steps, arity and attribute key sets, outputs, routes, bank bundles and load-time limits.

Seed layout used below — bindings: 0 base, 1 x, 2 lora.A, 3 lora.B, 4 lora.gain;
slots: 0 base, 1 x, 2 lora.A, 3 %0, 4 %1, 5 lora.B, 6 %2, 7 lora.gain, 8 %3, 9 %4;
instructions i0 (step 1) … i4 (step 5).
"""
from __future__ import annotations

import pytest

import runtime

from .builders import ProgramBuilder, load_error, seed, simple_add, under

ACT = {"accumulation_dtype": "activation"}


def _two_adds(step0=1, step1=2, reads1=("%0", "y")):
    """%0 = x + y; %1 = <reads1>; both [N=2]."""
    b = ProgramBuilder()
    b.input("x", ["N"], [2])
    b.input("y", ["N"], [2])
    b.op("add", ["x", "y"], ACT, ["N"], [2], step=step0)
    b.op("add", list(reads1), ACT, ["N"], [2], step=step1)
    return b.build(outputs=["%0", "%1"])


# ---- duplicates ---------------------------------------------------------------------------

def test_duplicate_binding_name():
    b = ProgramBuilder()
    b.input("x", ["N"], [2])
    b.input("x", ["N"], [2])
    b.op("add", ["x", "x"], ACT, ["N"], [2])
    load_error("duplicate", ("$.bindings[1]", "$.bindings[1].name", "$.slots[1]",
                             "$.slots[1].slot_id"), b.build())


def test_duplicate_slot_id():
    prog = _two_adds(reads1=("x", "y"), step1=1)
    prog["instructions"][1]["output_slot"] = "%0"
    prog["slots"][3]["slot_id"] = "%0"
    prog["outputs"] = ["%0"]
    prog["slots"][3]["role"] = "output"
    load_error("duplicate", ("$.slots[3]", "$.slots[3].slot_id"), prog)


def test_duplicate_instruction_id():
    prog = _two_adds(reads1=("x", "y"), step1=1)
    prog["instructions"][1]["instruction_id"] = "i0"
    prog["slots"][3]["producer_id"] = "i0"
    load_error("duplicate", ("$.instructions[1]", "$.instructions[1].instruction_id"), prog)


def test_duplicate_axes_in_one_type():
    prog = simple_add()
    for rec in prog["bindings"] + prog["slots"]:
        rec["value_type"]["axes"] = ["N", "N"]
    load_error("duplicate", ("$.bindings[0].value_type.axes[1]", "$.bindings[0].value_type.axes"),
               prog)


def test_duplicate_member_ids():
    b = ProgramBuilder()
    b.bank("w", ["K", "N"], [2, 2], bundle_id="bun", member_ids=["m0", "m0"])
    b.op("reduce", ["w"], {"axis": "K", "mode": "sum", **ACT}, ["N"], [2])
    load_error("duplicate", ("$.bindings[0].member_ids[1]", "$.bindings[0].member_ids"), b.build())


def test_duplicate_outputs():
    prog = simple_add()
    prog["outputs"] = ["%0", "%0"]
    load_error("duplicate", ("$.outputs[1]", "$.outputs"), prog)


# ---- slots and their producers ------------------------------------------------------------

def test_binding_without_slot():
    prog = simple_add()
    prog["bindings"].append({"kind": "input", "name": "z", "value_type": prog["bindings"][0]["value_type"]})
    load_error("slot_producer", ("$.bindings[2]", "$.bindings[2].name"), prog)


@pytest.mark.parametrize("field,value", [
    ("dtype", "float64"), ("sizes", [2, 4]), ("domain", "other"), ("axes", ["M", "N"])])
def test_binding_slot_type_differs(field, value):
    prog = simple_add()
    prog["slots"][0]["value_type"][field] = value
    load_error("slot_producer", under("$.slots[0]"), prog)


@pytest.mark.parametrize("slot,field,value", [
    (1, "producer", "bank"), (1, "role", "temporary"), (1, "role", "bank_operand"),
    (1, "producer_id", "base"), (2, "producer", "input"), (2, "role", "input"),
    (3, "producer_id", "i1"), (3, "producer_id", "i99"), (3, "producer", "input"),
    (6, "role", "output"), (9, "role", "temporary"), (3, "role", "input"),
])
def test_slot_disagrees_with_producer(slot, field, value):
    prog = seed()
    prog["slots"][slot][field] = value
    load_error("slot_producer", (f"$.slots[{slot}]", f"$.slots[{slot}].{field}"), prog)


@pytest.mark.parametrize("value", ["banana", "output"])
def test_slot_producer_outside_enum(value):
    prog = seed()
    prog["slots"][3]["producer"] = value
    load_error(("schema", "slot_producer"), ("$.slots[3]", "$.slots[3].producer"), prog)


def test_instruction_output_slot_missing():
    prog = seed()
    prog["instructions"][1]["output_slot"] = "%9"
    load_error("slot_producer", under("$.instructions[1]", "$.slots[4]"), prog)


def test_instruction_slot_without_instruction():
    prog = simple_add()
    extra = dict(prog["slots"][2], slot_id="%7", producer_id="i7", role="temporary")
    prog["slots"].append(extra)
    load_error("slot_producer", under("$.slots[3]"), prog)


# ---- SSA visibility and steps ---------------------------------------------------------------

def test_read_missing_slot():
    prog = seed()
    prog["instructions"][4]["input_slots"] = ["base", "%9"]
    load_error("ssa_visibility", "$.instructions[4].input_slots[1]", prog)


def test_read_same_step():
    load_error("ssa_visibility", "$.instructions[1].input_slots[0]", _two_adds(1, 1))


def test_read_later_step():
    prog = _two_adds(1, 2)
    prog["instructions"][0]["input_slots"] = ["x", "%1"]
    load_error("ssa_visibility", "$.instructions[0].input_slots[1]", prog)


def test_read_own_output():
    prog = simple_add()
    prog["instructions"][0]["input_slots"] = ["x", "%0"]
    load_error("ssa_visibility", "$.instructions[0].input_slots[1]", prog)


def test_independent_same_step_and_gapped_steps_load():
    runtime.load_program(_two_adds(1, 1, reads1=("x", "y")))
    runtime.load_program(_two_adds(2, 7))


def test_decreasing_steps():
    load_error("invalid_step", "$.instructions[1].step", _two_adds(3, 2, reads1=("x", "y")))


@pytest.mark.parametrize("step", [0, -1, 1.5, True])
def test_step_not_positive_int(step):
    prog = simple_add()
    prog["instructions"][0]["step"] = step
    load_error("invalid_step", "$.instructions[0].step", prog)


@pytest.mark.parametrize("step", ["1", None, [1]])
def test_step_wrong_json_type(step):
    prog = simple_add()
    prog["instructions"][0]["step"] = step
    load_error(("invalid_step", "schema"), "$.instructions[0].step", prog)


# ---- arity and attribute key sets -----------------------------------------------------------

@pytest.mark.parametrize("inputs", [["x"], ["x", "y", "x"], []])
def test_arity(inputs):
    prog = simple_add()
    prog["instructions"][0]["input_slots"] = inputs
    load_error("atom_signature", "$.instructions[0].input_slots", prog)


def test_attribute_key_missing():
    prog = seed()
    del prog["instructions"][0]["attributes"]["output_axes"]
    load_error("atom_signature", ("$.instructions[0].attributes",
                                  "$.instructions[0].attributes.output_axes"), prog)


def test_attribute_key_extra():
    prog = seed()
    prog["instructions"][1]["attributes"]["accumulation_dtype"] = "float32"
    load_error("atom_signature", ("$.instructions[1].attributes",
                                  "$.instructions[1].attributes.accumulation_dtype"), prog)


def test_select_takes_no_attributes():
    b = ProgramBuilder()
    b.input("m", ["N"], [2], "boolean")
    b.input("t", ["N"], [2])
    b.input("f", ["N"], [2])
    b.op("select", ["m", "t", "f"], {"axis": "N"}, ["N"], [2])
    load_error("atom_signature", ("$.instructions[0].attributes",
                                  "$.instructions[0].attributes.axis"), b.build())


# ---- outputs -------------------------------------------------------------------------------

def test_outputs_empty():
    prog = simple_add()
    prog["outputs"] = []
    prog["slots"][2]["role"] = "temporary"
    load_error("invalid_output", "$.outputs", prog)


@pytest.mark.parametrize("name", ["x", "%9"])
def test_output_not_instruction_produced(name):
    prog = simple_add()
    prog["outputs"] = ["%0", name]
    load_error("invalid_output", "$.outputs[1]", prog)


# ---- routes and bank bundles ----------------------------------------------------------------

@pytest.mark.parametrize("route", ["arti/formula-route@1", "r", 3])
def test_route_ref_not_null(route):
    prog = seed()
    prog["bindings"][2]["route_ref"] = route
    load_error(("unsupported_route",) if isinstance(route, str) else ("unsupported_route", "schema"),
               "$.bindings[2].route_ref", prog)


def _bank_prog(axes, sizes, bundle_id, member_ids):
    b = ProgramBuilder()
    b.bank("w", axes, sizes, bundle_id=bundle_id, member_ids=member_ids)
    b.op("permute", ["w"], {"output_axes": list(axes)}, axes, sizes)
    return b.build()


@pytest.mark.parametrize("axes,sizes,bundle_id,members", [
    (["N"], [2], None, ["m0"]),               # member_ids without a bundle
    (["N"], [2], "bun", []),                  # a bundle without member_ids
    (["K", "N"], [2, 2], "bun", ["m0"]),      # fewer members than K
    (["K", "N"], [2, 2], "bun", ["m0", "m1", "m2"]),
    (["N"], [2], "bun", ["m0", "m1"]),        # no K: exactly one member
])
def test_member_ids_rules(axes, sizes, bundle_id, members):
    load_error("bank_bundle", under("$.bindings[0]"), _bank_prog(axes, sizes, bundle_id, members))


def test_member_ids_rules_valid():
    runtime.load_program(_bank_prog(["K", "N"], [3, 2], "bun", ["m0", "m1", "m2"]))
    runtime.load_program(_bank_prog(["N", "K"], [2, 1], "bun", ["m0"]))
    runtime.load_program(_bank_prog(["N"], [2], "bun", ["m0"]))
    runtime.load_program(_bank_prog(["N"], [2], None, []))


@pytest.mark.parametrize("field,value", [
    ("source_ref", "arti/formula-operand-bank@7"), ("asset_fingerprint", "cd" * 32),
    ("member_ids", ["member-001"])])
def test_bundle_members_disagree(field, value):
    prog = seed()
    prog["bindings"][3][field] = value
    load_error("bank_bundle", under("$.bindings[3]"), prog)


# ---- limits at load ---------------------------------------------------------------------------

@pytest.mark.parametrize("limit,value,paths", [
    ("max_bindings", 4, ("$.bindings", "$.limits.max_bindings")),
    ("max_slots", 9, ("$.slots", "$.limits.max_slots")),
    ("max_instructions", 4, ("$.instructions", "$.limits.max_instructions")),
    ("max_steps", 4, ("$.instructions[4].step", "$.instructions[4]", "$.instructions",
                      "$.limits.max_steps")),
])
def test_count_limits(limit, value, paths):
    prog = seed()
    prog["limits"][limit] = value
    load_error("limit_exceeded", paths, prog)
    prog["limits"][limit] = value + 1  # exactly at the limit is allowed
    runtime.load_program(prog)


@pytest.mark.parametrize("limit,value", [
    ("max_axes", 2), ("max_axis_extent", 1023), ("max_tensor_elements", 32767)])
def test_per_tensor_limits(limit, value):
    prog = seed()
    prog["limits"][limit] = value
    load_error("limit_exceeded", under("$.bindings", "$.slots", "$.limits"), prog)
    prog["limits"][limit] = value + 1
    runtime.load_program(prog)
