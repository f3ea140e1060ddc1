"""The loader's own promises: every source form, exact round trip, fingerprint, no mutation."""
import copy
import hashlib
import json
import os
import time
from pathlib import Path

import pytest

import runtime

SEED = Path(__file__).resolve().parents[1] / "examples" / "seed-lora-silu.program.json"


@pytest.fixture(scope="module")
def seed_dict():
    return json.loads(SEED.read_text())


def test_seed_loads_from_every_source_form(seed_dict):
    text = SEED.read_text()
    for src in (SEED, str(SEED), text, text.encode(), seed_dict):
        prog = runtime.load_program(src)
        assert prog.outputs == ("%4",)
        assert [i.instruction_id for i in prog.instructions] == ["i0", "i1", "i2", "i3", "i4"]


def test_round_trip_is_exact(seed_dict):
    prog = runtime.load_program(seed_dict)
    assert prog.to_dict() == seed_dict
    assert json.dumps(prog.to_dict(), indent=2) == json.dumps(seed_dict, indent=2)


def test_fingerprint_is_sha256_of_canonical_json(seed_dict):
    prog = runtime.load_program(seed_dict)
    canonical = json.dumps(seed_dict, sort_keys=True, separators=(",", ":"))
    assert prog.fingerprint == hashlib.sha256(canonical.encode()).hexdigest()


def test_loading_never_modifies_the_callers_dict(seed_dict):
    before = copy.deepcopy(seed_dict)
    prog = runtime.load_program(seed_dict)
    prog.to_dict()["instructions"][0]["attributes"]["reduce_axes"].append(["x", "y"])
    assert seed_dict == before
    assert prog.instructions[0].attributes == before["instructions"][0]["attributes"]


@pytest.mark.parametrize("src, code", [
    ("{not json", "schema"),
    (b"\xff\xfe", "schema"),
    ("/no/such/program.json", "program_unreadable"),  # not JSON text: a path, and a missing one
    ("nope.program.json", "program_unreadable"),
    ("[]", "schema"),
    (42, "schema"),
    ('{"a": NaN}', "schema"),
])
def test_unreadable_sources_are_schema_errors(src, code):
    with pytest.raises(runtime.FormulaError) as err:
        runtime.load_program(src)
    assert err.value.code == code
    assert err.value.path == "$"


def test_a_missing_path_is_named_as_a_path():
    with pytest.raises(runtime.FormulaError) as err:
        runtime.load_program("nope.program.json")
    assert "cannot read program file 'nope.program.json'" in err.value.message
    assert "not valid JSON" not in err.value.message


@pytest.mark.parametrize("text, where", [('{"schema_ref": "x",\n }', "line 1 column 19, before '}'"),
                                         ('{"outputs": ["%1", ]}', "line 1 column 18, before ']'")])
def test_a_trailing_comma_is_named(text, where, tmp_path):
    for src in (text, tmp_path / "p.json"):
        (tmp_path / "p.json").write_text(text)
        with pytest.raises(runtime.FormulaError) as err:
            runtime.load_program(src)
        assert err.value.code == "schema" and f"a trailing comma at {where}" in err.value.message
    with pytest.raises(runtime.FormulaError) as err:
        runtime.load_program('{"outputs": ["%1" "%2"]}')
    assert "trailing comma" not in err.value.message


@pytest.mark.parametrize("kind", ["directory", "fifo", "device", "oversize"])
def test_paths_that_are_not_small_regular_files_are_refused_without_reading(tmp_path, kind):
    if kind == "directory":
        path = tmp_path
    elif kind == "fifo":
        path = tmp_path / "p.json"
        os.mkfifo(path)  # opening it for reading would block forever
    elif kind == "device":
        path = Path("/dev/zero")  # reading it never ends
    else:
        path = tmp_path / "big.json"
        path.write_text(" " * 2048 + "{}")
    t0 = time.perf_counter()
    with pytest.raises(runtime.FormulaError) as err:
        runtime.load_program(path, max_bytes=1024)
    assert time.perf_counter() - t0 < 2
    assert err.value.code == "program_unreadable" and err.value.path == "$"
    assert str(path) in err.value.message


def test_program_size_cap_comes_from_the_environment(monkeypatch, seed_dict):
    text = json.dumps(seed_dict)
    monkeypatch.setenv("FORMULA_MAX_PROGRAM_BYTES", str(len(text) - 1))
    with pytest.raises(runtime.FormulaError) as err:
        runtime.load_program(text)
    assert err.value.code == "limit_exceeded" and "FORMULA_MAX_PROGRAM_BYTES" in err.value.message
    monkeypatch.setenv("FORMULA_MAX_PROGRAM_BYTES", str(len(text)))
    runtime.load_program(text)


@pytest.mark.parametrize("form", ["text", "bytes", "dict"])
def test_lone_surrogates_are_rejected_at_load_with_their_path(seed_dict, form):
    bad = copy.deepcopy(seed_dict)
    bank = next(i for i, b in enumerate(bad["bindings"]) if b["kind"] == "bank")
    bad["bindings"][bank]["partition_id"] = "A\ud800"
    src = {"text": json.dumps(bad), "bytes": json.dumps(bad).encode(), "dict": bad}[form]
    with pytest.raises(runtime.FormulaError) as err:
        runtime.load_program(src)
    assert err.value.code == "schema"
    assert err.value.path == f"$.bindings[{bank}].partition_id"
    str(err.value).encode("utf-8")  # the message itself is printable


def test_versioned_and_digest_references_are_aliases(seed_dict):
    versioned = copy.deepcopy(seed_dict)
    for ins in versioned["instructions"]:
        family = ins["atom_ref"].split("@")[0]
        ins["atom_ref"] = f"{family}@1"
    versioned["schema_ref"] = "arti/formula-program@2"
    a, b = runtime.load_program(seed_dict), runtime.load_program(versioned)
    assert a.fingerprint != b.fingerprint
    assert [i.step for i in a.instructions] == [i.step for i in b.instructions]


def test_formula_error_pickles_and_names_code_and_path():
    import pickle

    err = runtime.FormulaError("schema", "$.slots[0]", "bad")
    again = pickle.loads(pickle.dumps(err))
    assert (again.code, again.path, again.message) == ("schema", "$.slots[0]", "bad")
    assert "[schema] $.slots[0]: bad" == str(err)
    with pytest.raises(ValueError):
        runtime.FormulaError("no-such-code", "$", "x")


def test_program_builder_names_a_missing_attribute_instead_of_a_key_error():
    from runtime.testing import ProgramBuilder

    b = ProgramBuilder()
    x = b.input("x", {"N": 3})
    with pytest.raises(runtime.FormulaError) as err:
        b.op("scale", [x, x], {"factor_axes": []})
    assert (err.value.code, err.value.path) == ("atom_signature", "$.instructions[0].attributes")
    assert "missing ['accumulation_dtype']" in err.value.message
    with pytest.raises(runtime.FormulaError) as err:
        b.op("scale", [x], {"factor_axes": [], "accumulation_dtype": "float32"})
    assert err.value.path == "$.instructions[0].input_slots"


def test_attributes_nested_too_deeply_or_not_copyable_are_schema_errors(seed_dict):
    deep = inner = {}
    for _ in range(50_000):
        inner["a"] = {}
        inner = inner["a"]

    class Uncopyable:
        def __deepcopy__(self, memo):
            raise TypeError("no copies")

    for value, words in ((deep, "nested too deeply"), (Uncopyable(), "cannot be copied")):
        bad = copy.deepcopy(seed_dict)
        bad["instructions"][0]["attributes"]["extra"] = value
        with pytest.raises(runtime.FormulaError) as err:
            runtime.load_program(bad)
        assert err.value.code == "schema" and err.value.path == "$.instructions[0].attributes"
        assert words in err.value.message


def test_mangled_json_text_stays_a_json_error_and_a_mistyped_name_is_unreadable():
    """A str that is neither JSON nor an existing file is a missing path only when it reads as
    one; text with JSON's brackets or several lines is reported as the JSON it fails to be."""
    import runtime

    with pytest.raises(runtime.FormulaError) as err:
        runtime.load_program(':{"schema_ref": "arti/formula-program@2"}')
    assert err.value.code == "schema"
    for text in ("", "   ", "not json"):
        with pytest.raises(runtime.FormulaError) as err:
            runtime.load_program(text)
        assert err.value.code == "schema", text
    for name in ("nope.program.json", "no/such/dir/program"):
        with pytest.raises(runtime.FormulaError) as err:
            runtime.load_program(name)
        assert err.value.code == "program_unreadable", name
