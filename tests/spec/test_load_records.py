"""SPEC §1–2 at load time: JSON shape, references, names, tensor types, exact field sets.

Each case starts from a valid program (the seed or a tiny builder program), breaks exactly
one rule, and asserts the §6 code and the JSON path of the offending piece.
"""
from __future__ import annotations

import json

import pytest

import runtime

from .builders import (SEED_PATH, ProgramBuilder, load_error, rename_binding, seed,
                       seed_versioned, simple_add)

HEX = "ab" * 32
PROGRAM_FIELDS = ("schema_ref", "schema_version", "bindings", "slots", "instructions",
                  "outputs", "limits")
TYPE_FIELDS = ("schema_ref", "axes", "sizes", "dtype", "domain")
INPUT_FIELDS = ("kind", "name", "value_type")
BANK_FIELDS = ("kind", "name", "source_ref", "partition_id", "value_type",
               "asset_fingerprint", "route_ref", "bundle_id", "member_ids")
SLOT_FIELDS = ("slot_id", "value_type", "producer", "producer_id", "role")
INSTRUCTION_FIELDS = ("instruction_id", "step", "atom_ref", "input_slots", "output_slot",
                      "attributes")
LIMIT_FIELDS = ("schema_ref", "schema_version", "max_bindings", "max_slots",
                "max_instructions", "max_steps", "max_axes", "max_axis_extent",
                "max_tensor_elements", "max_tensor_bytes", "max_working_bytes")

# (record path in the seed, getter, its exact field set)
RECORDS = [
    ("$", lambda p: p, PROGRAM_FIELDS),
    ("$.bindings[0].value_type", lambda p: p["bindings"][0]["value_type"], TYPE_FIELDS),
    ("$.slots[3].value_type", lambda p: p["slots"][3]["value_type"], TYPE_FIELDS),
    ("$.bindings[1]", lambda p: p["bindings"][1], INPUT_FIELDS),
    ("$.bindings[2]", lambda p: p["bindings"][2], BANK_FIELDS),
    ("$.slots[4]", lambda p: p["slots"][4], SLOT_FIELDS),
    ("$.instructions[2]", lambda p: p["instructions"][2], INSTRUCTION_FIELDS),
    ("$.limits", lambda p: p["limits"], LIMIT_FIELDS),
]
MISSING = [(path, get, f) for path, get, fields in RECORDS for f in fields]


def test_seed_and_versioned_seed_load():
    assert runtime.load_program(seed()).outputs == ("%4",)
    assert runtime.load_program(seed_versioned()).outputs == ("%4",)


def test_every_source_form_loads():
    text = SEED_PATH.read_text()
    for src in (SEED_PATH, str(SEED_PATH), text, text.encode(), json.loads(text)):
        assert len(runtime.load_program(src).instructions) == 5


@pytest.mark.parametrize("path,get,field", MISSING, ids=[f"{p}.{f}" for p, _, f in MISSING])
def test_missing_field(path, get, field):
    prog = seed()
    del get(prog)[field]
    load_error("schema", (path, f"{path}.{field}"), prog)


@pytest.mark.parametrize("path,get,_fields", RECORDS, ids=[r[0] for r in RECORDS])
def test_unknown_field(path, get, _fields):
    prog = seed()
    get(prog)["colour"] = "blue"
    load_error("schema", (path, f"{path}.colour"), prog)


@pytest.mark.parametrize("src", ["{not json", "", b"\xff\xfe{", "[]", "3", "null", '"x"'])
def test_not_json_or_not_an_object(src):
    load_error("schema", "$", src)


WRONG_JSON_TYPES = [
    ("bindings", lambda p: p.__setitem__("bindings", {}), "$.bindings"),
    ("slots", lambda p: p.__setitem__("slots", "x"), "$.slots"),
    ("instructions", lambda p: p.__setitem__("instructions", None), "$.instructions"),
    ("outputs", lambda p: p.__setitem__("outputs", "%4"), "$.outputs"),
    ("limits", lambda p: p.__setitem__("limits", []), "$.limits"),
    ("binding", lambda p: p["bindings"].__setitem__(0, 5), "$.bindings[0]"),
    ("slot", lambda p: p["slots"].__setitem__(0, []), "$.slots[0]"),
    ("instruction", lambda p: p["instructions"].__setitem__(0, "i0"), "$.instructions[0]"),
    ("value_type", lambda p: p["bindings"][0].__setitem__("value_type", "f32"),
     "$.bindings[0].value_type"),
    ("axes", lambda p: p["bindings"][4]["value_type"].__setitem__("axes", "N"),
     "$.bindings[4].value_type.axes"),
    ("name", lambda p: p["bindings"][0].__setitem__("name", 7), "$.bindings[0].name"),
    ("input_slots", lambda p: p["instructions"][1].__setitem__("input_slots", "%0"),
     "$.instructions[1].input_slots"),
    ("attributes", lambda p: p["instructions"][1].__setitem__("attributes", ["silu"]),
     "$.instructions[1].attributes"),
    ("atom_ref", lambda p: p["instructions"][1].__setitem__("atom_ref", 3),
     "$.instructions[1].atom_ref"),
    ("output_slot", lambda p: p["instructions"][1].__setitem__("output_slot", ["%1"]),
     "$.instructions[1].output_slot"),
    ("member_ids", lambda p: p["bindings"][2].__setitem__("member_ids", "member-000"),
     "$.bindings[2].member_ids"),
    ("schema_version", lambda p: p.__setitem__("schema_version", "2"), "$.schema_version"),
    ("limit", lambda p: p["limits"].__setitem__("max_slots", "128"), "$.limits.max_slots"),
    ("limit_float", lambda p: p["limits"].__setitem__("max_slots", 128.5), "$.limits.max_slots"),
    ("limit_bool", lambda p: p["limits"].__setitem__("max_steps", True), "$.limits.max_steps"),
    ("schema_ref", lambda p: p.__setitem__("schema_ref", None), "$.schema_ref"),
]


@pytest.mark.parametrize("mutate,path", [c[1:] for c in WRONG_JSON_TYPES],
                         ids=[c[0] for c in WRONG_JSON_TYPES])
def test_wrong_json_type(mutate, path):
    prog = seed()
    mutate(prog)
    load_error("schema", path, prog)


@pytest.mark.parametrize("value", [0, -3])
def test_limit_not_positive(value):
    prog = seed()
    prog["limits"]["max_instructions"] = value
    # SPEC §2: "all positive ints" — no code is named for a non-positive one; either reading.
    load_error(("schema", "limit_exceeded"), "$.limits.max_instructions", prog)


# ---- §1 references -----------------------------------------------------------------------

@pytest.mark.parametrize("where,value", [
    ("program", "arti/formula-program@3"),
    ("program", "arti/formula-program@1"),
    ("program", "other/formula-program@2"),
    ("program", "arti/formula-program@sha256:" + HEX),
    ("type", "arti/formula-tensor-type@2"),
    ("type", "arti/formula-tensor-type@sha256:" + HEX),
    ("limits", "arti/formula-limits@2"),
    ("limits", "arti/formula-program@2"),
])
def test_unsupported_schema_ref(where, value):
    prog = seed()
    target, path = {"program": (prog, "$.schema_ref"),
                    "type": (prog["slots"][3]["value_type"], "$.slots[3].value_type.schema_ref"),
                    "limits": (prog["limits"], "$.limits.schema_ref")}[where]
    target["schema_ref"] = value
    load_error("unsupported_schema", path, prog)


@pytest.mark.parametrize("field,value,path", [
    ("program", 1, "$.schema_version"), ("program", 3, "$.schema_version"),
    ("limits", 2, "$.limits.schema_version"), ("limits", 0, "$.limits.schema_version"),
])
def test_unsupported_schema_version(field, value, path):
    prog = seed()
    (prog if field == "program" else prog["limits"])["schema_version"] = value
    load_error("unsupported_schema", path, prog)


BAD_REFS = ["arti/formula-atom-add", "arti/formula-atom-add@0", "arti/formula-atom-add@-1",
            "arti/formula-atom-add@one", "formula-atom-add@1", "arti/formula-atom-add@1.0",
            "arti/formula-atom-add@sha256:" + HEX.upper(),
            "arti/formula-atom-add@sha256:" + HEX[:-1], "arti/formula-atom-add@sha1:" + HEX,
            "", "arti/ formula-atom-add@1"]


@pytest.mark.parametrize("ref", BAD_REFS)
def test_atom_ref_breaking_pattern(ref):
    prog = seed()
    prog["instructions"][4]["atom_ref"] = ref
    load_error("invalid_name", "$.instructions[4].atom_ref", prog)


@pytest.mark.parametrize("ref", BAD_REFS[:6])
def test_bank_source_ref_breaking_pattern(ref):
    prog = seed()
    for i in (2, 3):  # both members of the bundle, so they still agree with each other
        prog["bindings"][i]["source_ref"] = ref
    load_error("invalid_name", "$.bindings[2].source_ref", prog)


@pytest.mark.parametrize("ref", ["arti/formula-program", "formula-program@2",
                                 "arti/formula-program@sha256:xyz"])
def test_schema_ref_breaking_pattern(ref):
    prog = seed()
    prog["schema_ref"] = ref
    # invalid_name (the pattern) and unsupported_schema (unknown ref) both describe it.
    load_error(("invalid_name", "unsupported_schema"), "$.schema_ref", prog)


@pytest.mark.parametrize("ref", ["arti/formula-atom-nosuch@1", "arti/formula-atom-add@2",
                                 "arti/formula-atom-add@sha256:" + HEX,
                                 "someone/formula-atom-add@1"])
def test_unknown_atom(ref):
    prog = seed()
    prog["instructions"][4]["atom_ref"] = ref
    load_error("unknown_atom", "$.instructions[4].atom_ref", prog)


# ---- §2 names ----------------------------------------------------------------------------

@pytest.mark.parametrize("name", ["1x", "x y", "_x", "x/y", "", "é", "x:y", "-x", ".x"])
def test_bad_binding_name(name):
    prog = rename_binding(seed(), "x", name)
    load_error("invalid_name", "$.bindings[1].name", prog)


@pytest.mark.parametrize("name", ["x1", "lora.gain2", "a-b", "A_b.c-D"])
def test_good_binding_names(name):
    runtime.load_program(rename_binding(seed(), "x", name))


def _axis_everywhere(prog, old, new):
    for key in ("bindings", "slots"):
        for rec in prog[key]:
            vt = rec["value_type"]
            vt["axes"] = [new if a == old else a for a in vt["axes"]]
    return prog


@pytest.mark.parametrize("axis", ["1N", "N-M", "N.M", "", "_N", "N M"])
def test_bad_axis_name(axis):
    prog = _axis_everywhere(simple_add(), "M", axis)
    load_error("invalid_name", "$.bindings[0].value_type.axes[1]", prog)


@pytest.mark.parametrize("symbol", ["1S", "S-1", "S.x", "_S"])
def test_bad_size_symbol(symbol):
    b = ProgramBuilder()
    b.input("x", ["N"], [symbol])
    b.input("y", ["N"], [symbol])
    b.op("add", ["x", "y"], {"accumulation_dtype": "activation"}, ["N"], [symbol])
    load_error("invalid_name", "$.bindings[0].value_type.sizes[0]", b.build())


@pytest.mark.parametrize("member", ["member 0", "0m", "", "m/0"])
def test_bad_member_id(member):
    prog = seed()
    for i in (2, 3):
        prog["bindings"][i]["member_ids"] = [member]
    load_error("invalid_name", "$.bindings[2].member_ids[0]", prog)


@pytest.mark.parametrize("fp", ["AB" * 32, "ab" * 31, "xyz", "ab" * 33])
def test_bad_asset_fingerprint(fp):
    prog = seed()
    for i in (2, 3):
        prog["bindings"][i]["asset_fingerprint"] = fp
    load_error(("invalid_name", "schema"), "$.bindings[2].asset_fingerprint", prog)


# ---- §2 tensor types ---------------------------------------------------------------------

def _sized(size, dtype="float32", domain="anonymous"):
    b = ProgramBuilder()
    b.input("x", ["N", "M"], [2, size], dtype, domain)
    b.input("y", ["N", "M"], [2, size], dtype, domain)
    b.op("add", ["x", "y"], {"accumulation_dtype": "activation"}, ["N", "M"], [2, size],
         dtype, domain)
    return b.build()


@pytest.mark.parametrize("size", [0, -1, True, False, 1.5, None, [3], {"n": 3}],
                         ids=repr)
def test_bad_size(size):
    load_error("invalid_type", "$.bindings[0].value_type.sizes[1]", _sized(size))


@pytest.mark.parametrize("dtype", ["float8", "int32", "Float32", "float", "bool", "complex64", ""])
def test_unknown_dtype(dtype):
    load_error("invalid_type", "$.bindings[0].value_type.dtype", _sized(3, dtype=dtype))


def test_dtype_not_a_string():
    load_error(("invalid_type", "schema"), "$.bindings[0].value_type.dtype", _sized(3, dtype=32))


def test_empty_domain():
    load_error("invalid_type", "$.bindings[0].value_type.domain", _sized(3, domain=""))


def test_domain_not_a_string():
    load_error(("invalid_type", "schema"), "$.bindings[0].value_type.domain",
               _sized(3, domain=None))


@pytest.mark.parametrize("sizes", [[2], [2, 3, 4], []])
def test_rank_mismatch(sizes):
    prog = simple_add()
    for rec in prog["bindings"] + prog["slots"]:
        rec["value_type"]["sizes"] = list(sizes)
    load_error("invalid_type", ("$.bindings[0].value_type.sizes", "$.bindings[0].value_type"),
               prog)


def test_every_dtype_and_floating_load():
    for dtype in ("float16", "bfloat16", "float32", "float64", "floating"):
        runtime.load_program(_sized(3, dtype=dtype))
    b = ProgramBuilder()  # int64 / boolean: a permute accepts any dtype
    for dtype in ("int64", "boolean"):
        b.input(f"v{dtype}", ["N"], [2], dtype)
        b.op("permute", [f"v{dtype}"], {"output_axes": ["N"]}, ["N"], [2], dtype)
    runtime.load_program(b.build(outputs=["%0", "%1"]))


def test_zero_d_and_symbolic_types_load():
    b = ProgramBuilder()
    b.input("x", ["B", "N"], ["B", 3])
    b.input("g", [], [])
    b.op("scale", ["x", "g"], {"factor_axes": [], "accumulation_dtype": "activation"},
         ["B", "N"], ["B", 3])
    runtime.load_program(b.build())
