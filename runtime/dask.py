"""Formula programs over ``dask.array`` inputs: one run per block along the free axes.

``execute(program, inputs=…, banks=…)`` builds a dask graph with one task per block of the
inputs' chunk grid (the inputs may be chunked only along free axes,
:mod:`runtime.plan.freeaxes`) and returns {output slot: dask array}. Each task runs the program
on its block through an executable compiled once per worker process; the banks enter the
graph as one key, so a scheduler ships them to each worker once, where they are loaded once as
resident banks. A block over ``max_working_bytes`` runs in slices (``run(chunks="auto")``).
Outputs that are sums over a chunked axis (a gradient program's bank gradients,
``FreeAxes.sums``) are summed across its blocks by a tree of tasks; the others concatenated.
Works with any dask scheduler: threads, processes, ``dask.distributed``.

An optional part of the runtime: ``pip install 'formula-runtime[dask]'``; ``import runtime``
does not import it.
"""
from __future__ import annotations

import itertools
import json
import operator
import threading
from collections import OrderedDict
from collections.abc import Mapping
from typing import Any

import numpy as np

from runtime.api import compile as compile_program, load_program
from runtime.core.errors import fail
from runtime.core.types import formula_dtype, numpy_dtype
from runtime.plan.freeaxes import accumulation_dtype
from runtime.program.model import Program

CACHED = 4  # executables (and resident bank sets) kept per worker process
SPLIT_EVERY = 8  # blocks' partial sums added per task of the tree that sums them

_lock = threading.Lock()
_executables: OrderedDict[tuple, Any] = OrderedDict()
_resident: OrderedDict[tuple, Any] = OrderedDict()


class BankValues:
    """The bank arrays of one ``execute`` call, with the token that names them in the graph
    (the per-process cache of resident banks is keyed by it)."""

    def __init__(self, values: Mapping[str, np.ndarray], token: str):
        self.values = dict(values)
        self.token = token


def execute(program: Any, inputs: Mapping[str, Any], banks: Mapping[str, Any] | None = None,
            backend: str = "cpu", memory_limit: Any = None) -> dict[str, Any]:
    """{output slot: dask array} of ``program`` (anything :func:`runtime.load_program` takes)
    over ``inputs`` (dask or NumPy arrays, chunked only along free axes, every input that
    carries a chunked axis chunked alike) and ``banks`` (NumPy arrays). Nothing runs until the
    results are computed; shapes and chunking are checked here, values by each block's run."""
    try:
        import dask
        import dask.array as da
        from dask.base import tokenize
        from dask.highlevelgraph import HighLevelGraph
    except ImportError:
        fail("backend_unavailable", "$", "runtime.dask needs dask: pip install 'formula-runtime[dask]'")
    program = load_program(program)
    text = json.dumps(program.to_dict(), sort_keys=True)
    exe = _executable(text, backend, memory_limit)
    inputs = _mapping(inputs, "$.inputs", "inputs")
    banks = _mapping(banks, "$.banks", "banks")
    _check_names(program, inputs, banks)
    dims, shapes = _dims(program, inputs)
    chunks = _chunking(program, exe.free_axes, inputs)
    arrays, numbers = {}, {}
    for b in program.input_bindings:
        v = inputs[b.name]
        if isinstance(v, (int, float)) and not isinstance(v, bool):
            numbers[b.name] = v  # a Python number takes its dtype in the run, as in Executable.run
            continue
        if not isinstance(v, da.Array):
            v = da.from_array(np.asarray(v), chunks=tuple(
                chunks.get(s, (n,)) if isinstance(s, str) else (n,)
                for s, n in zip(b.value_type.sizes, shapes[b.name])))
        arrays[b.name] = v
    dtypes = {b.name: formula_dtype(np.dtype(arrays[b.name].dtype)) for b in program.input_bindings
              if b.value_type.dtype == "floating" and b.name in arrays}
    for b in program.bank_bindings:
        if b.value_type.dtype == "floating":
            dtypes[b.name] = formula_dtype(np.asarray(banks[b.name]).dtype)
    types = exe.output_types({s: n for s, n in dims.items() if s in program.symbols}, dtypes)

    token = tokenize(text, backend, memory_limit, numbers, *(a.name for a in arrays.values()),
                     *(np.asarray(banks[b.name]) for b in program.bank_bindings))
    layer: dict[Any, Any] = {}
    dependencies = list(arrays.values())
    bank_key = None
    if program.bank_bindings:
        bank_token = tokenize(*(np.asarray(banks[b.name]) for b in program.bank_bindings))
        held = BankValues({b.name: np.asarray(banks[b.name]) for b in program.bank_bindings}, bank_token)
        bank_obj = dask.delayed(held, name=f"formula-banks-{bank_token}", traverse=False)
        bank_key = bank_obj.key
        dependencies.append(bank_obj)
    split = [s for s in program.symbols if s in chunks and len(chunks[s]) > 1]
    names = tuple(b.name for b in program.input_bindings)
    run_name = f"formula-run-{token}"
    whole = {s: n for s, n in dims.items() if s in program.symbols}  # blocks compute as the whole would
    for idx in itertools.product(*(range(len(chunks[s])) for s in split)):
        where = dict(zip(split, idx))
        keys = [numbers[n] if n in numbers else (arrays[n].name, *_block(program.binding(n).value_type.sizes, where))
                for n in names]
        layer[(run_name, *idx)] = (_run_block, text, backend, memory_limit, whole, names, keys, bank_key)
    results = {}
    for slot in program.outputs:
        declared = program.slot(slot).value_type.sizes
        t = types[slot]
        out_name = f"formula-out-{slot}-{token}"
        out_layer = {}
        summed = [s for s in split if slot in exe.free_axes.sums.get(s, ())]
        parts: dict[tuple, list] = {}  # output block -> the blocks' values that add up to it
        for idx in itertools.product(*(range(len(chunks[s])) for s in split)):
            where = dict(zip(split, idx))
            if any(where[s] for s in split if s not in declared and s not in summed):
                continue  # an output without that axis is the same in every block along it
            parts.setdefault(_block(declared, where), []).append((operator.getitem, (run_name, *idx), slot))
        for block, values in parts.items():
            if not summed:
                out_layer[(out_name, *block)] = values[0]
                continue
            _tree_sum(out_layer, f"formula-sum-{slot}-{token}", (out_name, *block), block, values,
                      accumulation_dtype(t.dtype), t.dtype)
        out_layer.update(layer)
        graph = HighLevelGraph.from_collections(out_name, out_layer, dependencies=dependencies)
        out_chunks = tuple(chunks[s] if s in split else (n,) for s, n in zip(declared, t.shape))
        results[slot] = da.Array(graph, out_name, out_chunks, meta=np.empty((0,) * t.rank, numpy_dtype(t.dtype)))
    return results


def _tree_sum(layer: dict, name: str, key: tuple, block: tuple[int, ...], values: list,
              acc: str, dtype: str) -> None:
    """Tasks adding ``values`` (the blocks' partial sums of one output block) into ``key``: a
    tree of at most SPLIT_EVERY values per task, added in ``acc``, rounded once to ``dtype``."""
    level = 0
    while len(values) > SPLIT_EVERY:
        groups = [values[k:k + SPLIT_EVERY] for k in range(0, len(values), SPLIT_EVERY)]
        values = []
        for g, group in enumerate(groups):
            layer[(name, level, g, *block)] = (_add_partials, group, acc, acc)
            values.append((name, level, g, *block))
        level += 1
    layer[key] = (_add_partials, values, acc, dtype)


def _add_partials(values: list, acc: str, dtype: str) -> np.ndarray:
    """The sum of some blocks' partial values, in order, in ``acc``, then as ``dtype``."""
    total = np.array(values[0], dtype=numpy_dtype(acc), copy=True)
    for v in values[1:]:
        total += np.asarray(v).astype(total.dtype, copy=False)
    return total.astype(numpy_dtype(dtype), copy=False)


def _block(sizes, where: Mapping[str, int]) -> tuple[int, ...]:
    return tuple(where.get(s, 0) if isinstance(s, str) else 0 for s in sizes)


def _mapping(value: Any, path: str, what: str) -> Mapping:
    if value is None:
        return {}
    if not isinstance(value, Mapping):
        fail("schema", path, f"{what} must be a mapping of binding name to array, got {type(value).__name__}")
    return value


def _check_names(program: Program, inputs: Mapping, banks: Mapping) -> None:
    for given, bindings, path in ((inputs, program.input_bindings, "$.inputs"),
                                  (banks, program.bank_bindings, "$.banks")):
        names = [b.name for b in bindings]
        missing = [n for n in names if n not in given]
        extra = [k for k in given if k not in names]
        if missing or extra:
            fail("binding_keys", path, f"expected {names}; " + "; ".join(filter(None, [
                missing and f"missing {missing}", extra and f"not bindings of the program {extra}"])))


def _dims(program: Program, inputs: Mapping) -> tuple[dict[str, int], dict[str, tuple[int, ...]]]:
    """Each symbol's extent from the inputs' shapes (ranks and extents checked)."""
    dims: dict[str, int] = {}
    shapes = {}
    for b in program.input_bindings:
        v = inputs[b.name]
        shape = tuple(int(n) for n in np.shape(v)) if not hasattr(v, "shape") else tuple(v.shape)
        path = f"$.inputs.{b.name}"
        t = b.value_type
        if len(shape) != t.rank:
            fail("binding_shape", path, f"{b.name!r} has shape {list(shape)}; expected axes {list(t.axes)}")
        for a, want, got in zip(t.axes, t.sizes, shape):
            if isinstance(want, str):
                if dims.setdefault(want, got) != got:
                    fail("symbol_conflict", path, f"{b.name!r} axis {a!r} has extent {got} but symbol "
                                                  f"{want!r} is {dims[want]}")
            elif want != got:
                fail("binding_shape", path, f"{b.name!r} axis {a!r} has extent {got}; expected {want}")
        shapes[b.name] = shape
    return dims, shapes


def _chunking(program: Program, free, inputs: Mapping) -> dict[str, tuple[int, ...]]:
    """The chunks of each symbol along which some input is split, after checking that every
    split axis is free and that the inputs carrying it agree."""
    chunks: dict[str, tuple[int, ...]] = {}
    first: dict[str, str] = {}
    for b in program.input_bindings:
        v = inputs[b.name]
        given = getattr(v, "chunks", None)
        if given is None or not hasattr(v, "dask"):
            continue
        for a, s, c in zip(b.value_type.axes, b.value_type.sizes, given):
            c = tuple(int(n) for n in c)
            if len(c) > 1 and not (isinstance(s, str) and s in free.free):
                why = free.tied.get(s, "its extent is static") if isinstance(s, str) else \
                    f"its extent is static ({s})"
                fail("binding_shape", f"$.inputs.{b.name}",
                     f"{b.name!r} is chunked along axis {a!r} ({len(c)} chunks), which is not a free axis "
                     f"of the program: {why}; keep that axis whole (x.rechunk({{{list(b.value_type.axes).index(a)}: -1}}))")
            if not isinstance(s, str) or s not in free.free:
                continue
            if s in chunks and chunks[s] != c:
                fail("binding_shape", f"$.inputs.{b.name}",
                     f"mismatched chunking along {s}: {b.name!r} axis {a!r} has chunks {list(c)} but "
                     f"{first[s]!r} has {list(chunks[s])}; rechunk the inputs alike")
            chunks.setdefault(s, c)
            first.setdefault(s, b.name)
    return chunks


# --- on the workers ----------------------------------------------------------------------
def _executable(text: str, backend: str, memory_limit: Any):
    """The process's compiled executable for this program and backend (made once)."""
    key = (text, backend, memory_limit)
    with _lock:
        exe = _executables.get(key)
        if exe is not None:
            _executables.move_to_end(key)
            return exe
    exe = compile_program(json.loads(text), backend=backend, memory_limit=memory_limit)
    with _lock:
        exe = _executables.setdefault(key, exe)
        while len(_executables) > CACHED:
            _executables.popitem(last=False)
    return exe


def _resident_banks(exe, held: BankValues):
    """The banks loaded once per process (per executable) as resident banks."""
    key = (id(exe), held.token)
    with _lock:
        got = _resident.get(key)
        if got is not None and got[0] is exe:
            return got[1]
    banks = exe.load_banks(held.values)
    with _lock:
        _resident[key] = (exe, banks)
        while len(_resident) > CACHED:
            _resident.popitem(last=False)
    return banks


def _run_block(text: str, backend: str, memory_limit: Any, whole: dict[str, int], names: tuple[str, ...],
               values: list, held: BankValues | None) -> dict[str, np.ndarray]:
    """One block's run: sliced further if it is over max_working_bytes, its kernels chosen as
    for the whole arrays (``slice_of``), so the blocks agree bit for bit with one local run."""
    exe = _executable(text, backend, memory_limit)
    banks = _resident_banks(exe, held) if held is not None else None
    result = exe.run(inputs=dict(zip(names, values)), banks=banks, chunks="auto", slice_of=whole)
    return dict(result)


def cached_executables() -> int:
    """How many executables this process holds (tests check one per worker)."""
    return len(_executables)


__all__ = ["execute", "cached_executables"]
