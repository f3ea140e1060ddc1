"""Property-based fuzzing: whatever the program or the inputs, nothing but a
``runtime.FormulaError`` with a SPEC §6 code ever escapes ``load_program`` / ``execute``.

Programs are mutated valid programs (fields deleted, added, retyped, swapped, refs
corrupted, random JSON anywhere); a mutant that still loads is executed on inputs built from
its own declared types. Inputs are mutated valid seed inputs (dtypes, shapes, NaNs, keys,
non-arrays, bank operands).
"""
from __future__ import annotations

import copy
import io
import json
import random
import time
from typing import Any

import numpy as np
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import runtime
from runtime.kernels import compilelog
from runtime.core import settings as fuzz_settings  # (hypothesis owns `settings` here)
from runtime.core.errors import CODES

from .atom_cases import VALID
from .builders import SEED_PATH, SPEC_CODES, seed, simple_add
from .test_valid_programs import seed_values

# FORMULA_FUZZ_EXAMPLES scales the hypothesis tests; FORMULA_FUZZ_CASES / FORMULA_FUZZ_SECONDS
# the bounded loop (CI: 3000 cases, at most 45 s; long mode e.g. 100000 cases, 3600 s).
EXAMPLES = fuzz_settings.FUZZ_EXAMPLES.read()
FUZZ = settings(max_examples=EXAMPLES, deadline=None, database=None,
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


class _Drawn:
    """Choices through hypothesis (shrinkable)."""

    def __init__(self, draw):
        self.draw = draw

    def choice(self, items):
        return self.draw(st.sampled_from(items))

    def integer(self, lo: int, hi: int) -> int:
        return self.draw(st.integers(lo, hi))

    def json(self):
        return self.draw(json_values)

    def text(self) -> str:
        return self.draw(st.text(max_size=8))


class _Seeded:
    """The same choices from a seeded ``random.Random`` (the bounded loop: no per-case overhead)."""

    SCALARS = [None, True, False, 0, -1, 1, 2, 1 << 40, -(1 << 70), 1.5, float("nan"), float("inf"), "",
               "N", "%0", "x", "float32", "arti/formula-atom-add@1", "sum", "silu", "input", "bank",
               "instruction", "output", "A\ud800", "\x00", "é", "K"]

    def __init__(self, rng: random.Random):
        self.rng = rng

    def choice(self, items):
        return self.rng.choice(list(items))

    def integer(self, lo: int, hi: int) -> int:
        return self.rng.randint(lo, hi)

    def json(self, depth: int = 0):
        kind = self.rng.random()
        if depth > 2 or kind < 0.7:
            return self.rng.choice(self.SCALARS)
        if kind < 0.85:
            return [self.json(depth + 1) for _ in range(self.rng.randint(0, 3))]
        return {self.text(): self.json(depth + 1) for _ in range(self.rng.randint(0, 3))}

    def text(self) -> str:
        return self.rng.choice(["", "x", "kind", "axes", "sizes", "A\ud800", "mode", "extra"])


def mutate_program(prog, c) -> Any:
    """1-3 mutations of a program: fields deleted, replaced, added, swapped or tweaked."""
    for _ in range(c.integer(1, 3)):
        paths = list(paths_of(prog))[1:]
        if not paths:
            return prog
        path = c.choice(paths)
        parent, key = get(prog, path[:-1]), path[-1]
        op = c.choice(["delete", "replace", "add", "swap", "tweak"])
        if op == "delete":
            del parent[key]
        elif op == "replace":
            parent[key] = c.json()
        elif op == "add":
            target = parent[key]
            if isinstance(target, dict):
                target[c.text()] = c.json()
            elif isinstance(target, list):
                target.insert(c.integer(0, len(target)), c.json())
            else:
                parent[key] = [target]
        elif op == "swap":
            other = c.choice(paths)
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
                parent[key] = c.choice([value + 1, value - 1, 0, -1, 1 << 40, 2])
            elif isinstance(value, str):
                parent[key] = corrupt_string(value, c.integer(0, 6))
            else:
                parent[key] = c.json()
    return prog


@st.composite
def mutated_programs(draw):
    return mutate_program(copy.deepcopy(draw(st.sampled_from(BASES))), _Drawn(draw))


def check_formula_error(fn, *args, codes=SPEC_CODES, **kwargs):
    """Call fn; success or a FormulaError with a §6 code are the only allowed outcomes
    (``codes``: the runtime's own additions too, for bank files and program paths)."""
    try:
        return fn(*args, **kwargs)
    except runtime.FormulaError as err:
        assert err.code in codes, f"code {err.code!r} is not a SPEC §6 code: {err}"
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


# --- the bounded mutation loop: programs, program text, inputs and bank files -------------
CASES = fuzz_settings.FUZZ_CASES.read()
BUDGET_S = fuzz_settings.FUZZ_SECONDS.read()
CASE_LIMIT_S = 5.0  # no single case may take longer (a hang or data-sized work on a hostile case)


def _hostile_value(arr: np.ndarray, c: _Seeded):
    """A value an attacker could pass where ``arr`` is expected."""
    kind = c.choice(["zero-stride", "byteswap", "strided", "nan", "dtype", "shape", "object", "huge-0d"])
    if kind == "zero-stride" and arr.ndim:  # one element of memory declaring up to 2**42
        shape = list(arr.shape)
        shape[c.integer(0, arr.ndim - 1)] = c.choice([3, 1 << 20, 1 << 31])
        return np.lib.stride_tricks.as_strided(np.zeros(1, arr.dtype), shape=shape, strides=(0,) * arr.ndim)
    if kind == "byteswap":
        return arr.astype(arr.dtype.newbyteorder(">"))
    if kind in ("strided", "zero-stride"):
        return np.repeat(arr, 2, axis=-1)[..., ::2] if arr.ndim else arr
    if kind == "nan":
        out = np.array(arr, dtype=np.float32, copy=True)
        if out.size:
            out.flat[c.integer(0, out.size - 1)] = c.choice([np.nan, np.inf, -np.inf])
        return out
    if kind == "dtype":
        return arr.astype(c.choice([np.float64, np.float16, np.int64, np.bool_, np.complex64, np.uint8]))
    if kind == "shape":
        return c.choice([arr.reshape(-1), arr[None], np.zeros((0,) + arr.shape[1:], arr.dtype)])
    if kind == "object":
        return np.array([{"a": 1}] * max(arr.size, 1), dtype=object)
    return np.float64(c.choice([1e308, -0.0, 3e38]))


def _bank_file(tmp_path, banks: dict, c: _Seeded, case: int):
    """The seed's banks as an npz or safetensors store, then damaged: bytes flipped or cut, or
    a header declaring another (possibly huge) shape."""
    from safetensors.numpy import save

    if c.choice(["npz", "safetensors"]) == "npz":
        buf = io.BytesIO()
        np.savez_compressed(buf, **banks)
        data, suffix = bytearray(buf.getvalue()), ".npz"
    else:
        data, suffix = bytearray(save(dict(banks))), ".safetensors"
    how = c.choice(["flip", "cut", "shape"])
    if how == "flip" and data:
        for _ in range(c.integer(1, 8)):
            data[c.integer(0, len(data) - 1)] ^= 1 << c.integer(0, 7)
    elif how == "cut":
        data = data[: c.integer(0, len(data))]
    elif suffix == ".safetensors":  # a consistent header with another shape, data unchanged
        n = int.from_bytes(data[:8], "little")
        header = json.loads(bytes(data[8:8 + n]))
        key = c.choice(sorted(k for k in header if k != "__metadata__"))
        header[key]["shape"] = [c.choice([1, 32, 1 << 20, 1 << 40]) for _ in header[key]["shape"]]
        raw = json.dumps(header).encode()
        data = bytearray(len(raw).to_bytes(8, "little")) + raw + data[8 + n:]
    else:
        buf = io.BytesIO()
        np.savez(buf, **{k: np.lib.stride_tricks.as_strided(np.zeros(1, v.dtype), shape=(1 << 20,) * v.ndim,
                                                             strides=(0,) * v.ndim)[:1 << 10, :1 << 10]
                         for k, v in banks.items()})
        data = bytearray(buf.getvalue())
    path = tmp_path / f"case{case}{suffix}"
    path.write_bytes(bytes(data))
    return path


def test_bounded_mutation_loop(tmp_path):
    """CASES cases (at most BUDGET_S seconds) cycling over four targets; each ends in success
    or a §6 FormulaError within CASE_LIMIT_S, and never modifies the caller's values."""
    rng = random.Random(fuzz_settings.FUZZ_SEED.read())
    c = _Seeded(rng)
    exes = {b: _exe(b) for b in ("reference", "cpu")}
    for exe in exes.values():  # compiled before the clock starts (a cold cache takes seconds)
        inputs, banks = seed_values(1, 2, 0)
        exe.run(inputs=inputs, banks=banks)
    started, done = time.perf_counter(), 0
    for case in range(CASES):
        if time.perf_counter() - started > BUDGET_S:
            break
        t0, compiled = time.perf_counter(), compilelog.total()
        target = ("program", "text", "inputs", "banks")[case % 4]
        if target == "program":
            prog = mutate_program(copy.deepcopy(c.choice(BASES)), c)
            before = copy.deepcopy(prog)
            loaded = check_formula_error(runtime.load_program, prog)
            assert prog == before
            values = inputs_for(prog, np.random.default_rng(case)) if loaded is not None else None
            if values is not None:
                check_formula_error(runtime.execute, loaded, inputs=values[0], banks=values[1], backend="reference")
        elif target == "text":
            at = c.integer(0, len(SEED_TEXT))
            insert = c.choice(["", "\\ud800", "\"\\udfff\"", "1e999", "9" * 400, "[" * 5000, "\x00", "}", ","])
            text = SEED_TEXT[:at] + insert + SEED_TEXT[at + c.integer(0, 40):]
            check_formula_error(runtime.load_program, text)
            check_formula_error(runtime.load_program, text.encode("utf-8", "surrogatepass"))
        elif target == "inputs":
            inputs, banks = seed_values(1, 2, case)
            pool = c.choice([inputs, banks])
            name = c.choice(sorted(pool))
            pool[name] = _hostile_value(pool[name], c)
            small = {k: v for k, v in {**inputs, **banks}.items() if np.size(v) < 1 << 20}  # not the views
            snapshot = {k: np.array(v, copy=True) for k, v in small.items()}
            check_formula_error(exes[c.choice(sorted(exes))].run, inputs=inputs, banks=banks)
            for k, v in small.items():
                np.testing.assert_array_equal(np.asarray(v), snapshot[k])
        else:
            inputs, banks = seed_values(1, 2, case)
            path = _bank_file(tmp_path, {"A": banks["lora.A"], "B": banks["lora.B"]}, c, case)
            store = check_formula_error(runtime.open_bank_store, path, codes=CODES)
            if store is not None:
                check_formula_error(exes["reference"].run, inputs=inputs, banks=store, codes=CODES)
            path.unlink()
        elapsed = time.perf_counter() - t0
        if compilelog.total() == compiled:  # (a kernel variant compiled for a new layout is not data work)
            assert elapsed < CASE_LIMIT_S, f"case {case} ({target}) took {elapsed:.1f} s"
        done += 1
    assert done >= min(CASES, 200), f"only {done} cases ran in {BUDGET_S} s"
