"""Property-based fuzzing: whatever the program or the inputs, nothing but a
``runtime.FormulaError`` with a SPEC §6 code ever escapes ``load_program`` / ``execute``.

Programs are mutated valid programs (fields deleted, added, retyped, swapped, refs
corrupted, random JSON anywhere); a mutant that still loads is executed on inputs built from
its own declared types. Inputs are mutated valid seed inputs (dtypes, shapes, NaNs, keys,
non-arrays, bank operands).
"""
from __future__ import annotations

import copy
import json

import numpy as np
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import runtime

from .atom_cases import VALID
from .builders import SEED_PATH, SPEC_CODES, seed, simple_add
from .test_valid_programs import seed_values

FUZZ = settings(max_examples=120, deadline=None, database=None,
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])

BASES = [seed(), simple_add()] + [case[1]() for case in VALID[::3]]

json_scalars = (st.none() | st.booleans() | st.integers(-(1 << 70), 1 << 70)
                | st.floats(allow_nan=True, allow_infinity=True) | st.text(max_size=12)
                | st.sampled_from(["", "N", "%0", "x", "float32", "arti/formula-atom-add@1",
                                   "sum", "silu", "input", "bank", "instruction", "output"]))
json_values = st.recursive(json_scalars, lambda inner: st.lists(inner, max_size=4)
                           | st.dictionaries(st.text(max_size=8), inner, max_size=4), max_leaves=10)


def paths_of(node, prefix=()):
    yield prefix
    if isinstance(node, dict):
        for k, v in node.items():
            yield from paths_of(v, prefix + (k,))
    elif isinstance(node, list):
        for i, v in enumerate(node):
            yield from paths_of(v, prefix + (i,))


def get(node, path):
    for k in path:
        node = node[k]
    return node


def corrupt_string(s: str, how: int) -> str:
    return [s[:-1], s.upper(), s + "x", s.replace("@", "#"), " " + s, s[: len(s) // 2], ""][how % 7]


@st.composite
def mutated_programs(draw):
    prog = copy.deepcopy(draw(st.sampled_from(BASES)))
    for _ in range(draw(st.integers(1, 3))):
        paths = list(paths_of(prog))[1:]
        path = draw(st.sampled_from(paths))
        parent, key = get(prog, path[:-1]), path[-1]
        op = draw(st.sampled_from(["delete", "replace", "add", "swap", "tweak"]))
        if op == "delete":
            del parent[key]
        elif op == "replace":
            parent[key] = draw(json_values)
        elif op == "add":
            target = parent[key]
            if isinstance(target, dict):
                target[draw(st.text(max_size=8))] = draw(json_values)
            elif isinstance(target, list):
                target.insert(draw(st.integers(0, len(target))), draw(json_values))
            else:
                parent[key] = [target]
        elif op == "swap":
            other = draw(st.sampled_from(paths))
            try:
                other_parent = get(prog, other[:-1])
                a, b = copy.deepcopy(parent[key]), copy.deepcopy(other_parent[other[-1]])
                parent[key], other_parent[other[-1]] = b, a
            except (KeyError, IndexError, TypeError):
                pass  # the other path vanished under this one: keep the program as is
        else:
            value = parent[key]
            if isinstance(value, bool):
                parent[key] = not value
            elif isinstance(value, int):
                parent[key] = draw(st.sampled_from([value + 1, value - 1, 0, -1, 1 << 40, 2]))
            elif isinstance(value, str):
                parent[key] = corrupt_string(value, draw(st.integers(0, 6)))
            else:
                parent[key] = draw(json_values)
    return prog


def check_formula_error(fn, *args, **kwargs):
    """Call fn; success or a FormulaError with a §6 code are the only allowed outcomes."""
    try:
        return fn(*args, **kwargs)
    except runtime.FormulaError as err:
        assert err.code in SPEC_CODES, f"code {err.code!r} is not a SPEC §6 code: {err}"
        assert isinstance(err.path, str) and err.path.startswith("$"), err
        return None


NP_DTYPES = {"float16": np.float16, "float32": np.float32, "float64": np.float64,
             "floating": np.float32, "int64": np.int64, "boolean": np.bool_}


def inputs_for(prog: dict, rng) -> tuple[dict, dict] | None:
    """Values for a loaded program's bindings from its declared types; None when too big."""
    inputs, banks = {}, {}
    for b in prog["bindings"]:
        vt = b["value_type"]
        shape = tuple(2 if isinstance(s, str) else s for s in vt["sizes"])
        if int(np.prod(shape)) > 1 << 16 or vt["dtype"] not in NP_DTYPES:
            return None
        dtype = NP_DTYPES[vt["dtype"]]
        if dtype is np.bool_:
            value = rng.random(shape) < 0.5
        elif dtype is np.int64:
            value = np.zeros(shape, np.int64)
        else:
            value = rng.standard_normal(shape).astype(dtype)
        (banks if b["kind"] == "bank" else inputs)[b["name"]] = value
    return inputs, banks


@FUZZ
@given(mutated_programs(), st.integers(0, 2 ** 32 - 1))
def test_mutated_programs_raise_only_formula_errors(prog, value_seed):
    before = copy.deepcopy(prog)
    loaded = check_formula_error(runtime.load_program, prog)
    assert prog == before  # the caller's dict is never modified
    if loaded is None or not isinstance(prog, dict):
        return
    values = inputs_for(prog, np.random.default_rng(value_seed))
    if values is not None:
        check_formula_error(runtime.execute, loaded, inputs=values[0], banks=values[1],
                            backend="reference")


SEED_TEXT = SEED_PATH.read_text()


@settings(max_examples=80, deadline=None, database=None)
@given(st.integers(0, len(SEED_TEXT)), st.integers(0, 40), st.text(max_size=6))
def test_mutated_program_text(at, cut, insert):
    text = SEED_TEXT[:at] + insert + SEED_TEXT[at + cut:]
    check_formula_error(runtime.load_program, text)
    check_formula_error(runtime.load_program, text.encode("utf-8", "surrogatepass"))


odd_values = (st.none() | st.integers() | st.floats() | st.text(max_size=4)
              | st.lists(st.floats(), max_size=3) | st.dictionaries(st.text(max_size=3), st.integers(), max_size=2)
              | st.sampled_from([np.float64(1.0), np.int64(3), np.array([1, 2]), np.array("s"),
                                 np.zeros((1, 2, 1024), np.float64), np.zeros((1, 2, 1024), np.float32)[:, :, ::2],
                                 np.zeros((0, 2, 1024), np.float32), np.full((1, 2, 1024), np.nan, np.float32)]))

EXECUTABLES = {}


def _exe(backend):
    if backend not in EXECUTABLES:
        EXECUTABLES[backend] = runtime.compile(seed(), backend=backend)
    return EXECUTABLES[backend]


@FUZZ
@given(st.data())
def test_mutated_inputs_raise_only_formula_errors(data):
    inputs, banks = seed_values(1, 2)
    for _ in range(data.draw(st.integers(1, 3))):
        target = data.draw(st.sampled_from([inputs, banks]))
        names = sorted(target) or ["x"]
        name = data.draw(st.sampled_from(names + ["extra", "lora.C", ""]))
        op = data.draw(st.sampled_from(["drop", "odd", "dtype", "shape", "nan", "operand"]))
        current = target.get(name)
        if op == "drop":
            target.pop(name, None)
        elif op == "odd" or not isinstance(current, np.ndarray):
            target[name] = data.draw(odd_values)
        elif op == "dtype":
            if np.asarray(current).dtype.kind not in "biufc":  # a string left by an earlier mutation
                continue
            target[name] = np.asarray(current).astype(data.draw(st.sampled_from(
                [np.float64, np.float16, np.int64, np.int32, np.bool_, np.complex64])))
        elif op == "shape":
            arr = np.asarray(current)
            target[name] = data.draw(st.sampled_from(
                [arr.reshape(-1), arr[None], np.zeros((3,) + arr.shape[1:], arr.dtype)]
                + ([arr[..., :1]] if arr.ndim else [])))
        elif op == "nan":
            if np.asarray(current).dtype.kind not in "biuf" or np.asarray(current).size == 0:
                continue  # an earlier mutation left non-numbers or an empty array
            arr = np.array(current, dtype=np.float32, copy=True)
            arr.flat[0] = data.draw(st.sampled_from([np.nan, np.inf, -np.inf]))
            target[name] = arr
        else:
            target[name] = runtime.BankOperand(
                current, source_ref=data.draw(st.sampled_from(["arti/formula-operand-bank@1", "x", ""])),
                partition_id=data.draw(st.sampled_from(["A", "B", ""])),
                asset_fingerprint=data.draw(st.sampled_from([None, "ab" * 32, "zz"])),
                bundle_id=data.draw(st.sampled_from([None, "lora"])),
                member_ids=data.draw(st.sampled_from([(), ("member-000",), ("a", "a")])))
    snapshot = {k: copy.deepcopy(v) for k, v in {**inputs, **banks}.items()}
    backend = data.draw(st.sampled_from(["reference", "cpu"]))
    check_formula_error(_exe(backend).run, inputs=inputs, banks=banks)
    for k, v in {**inputs, **banks}.items():
        if isinstance(v, np.ndarray):
            np.testing.assert_array_equal(v, snapshot[k])


def test_fuzz_helpers_see_every_leaf():
    assert ("bindings", 0, "value_type", "sizes", 0) in set(paths_of(seed()))
    assert json.loads(json.dumps(simple_add())) == simple_add()
