"""Values from outside a program: arrays by name read from ``.npz``/``.safetensors`` files
(measured by their headers first) and written to ``.npz``, random values of a program's
declared types, a run's values as the ``formula`` command's ``--inputs``/``--banks``/``--random``
give them, and the summary of an output it prints; ``runtime.testing.random_values``."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from runtime.core.errors import FormulaError, fail


def read_arrays(location: str, path: str, limits=None, memory_limit: int | None = None) -> dict[str, np.ndarray]:
    """Arrays by name from an ``.npz`` (no pickles) or ``.safetensors`` file; with ``limits``,
    every array's header is measured against them before any data is read."""
    file = Path(location)
    suffix = file.suffix.lower()
    if suffix not in (".npz", ".safetensors"):
        fail("schema", path, f"{location!r}: expected an .npz or .safetensors file of arrays by name")
    try:
        if limits is not None:
            _check_headers(file, suffix, path, limits, memory_limit)
        if suffix == ".npz":
            with np.load(file, allow_pickle=False) as z:
                return {k: z[k] for k in z.files if k != "__metadata__"}
        from safetensors.numpy import load_file

        return load_file(str(file))
    except FormulaError as exc:
        if exc.code != "bank_store":
            raise
        fail("schema", path, f"cannot read arrays from {location!r}: {exc.message}")
    except Exception as exc:  # OSError, zip/pickle ValueError, safetensors' own errors
        fail("schema", path, f"cannot read arrays from {location!r}: {type(exc).__name__}: {exc}")


def _check_headers(file: Path, suffix: str, path: str, limits, memory_limit: int | None) -> None:
    """Every array's shape and dtype from the file's headers, read the bank stores' way
    (``BankStore.header``), measured against ``limits`` and the memory ceiling."""
    from runtime.core.types import ITEMSIZE
    from runtime.execution.banks import NpzStore, SafetensorsStore
    from runtime.plan.memory import check_shape, check_working

    store = NpzStore(file) if suffix == ".npz" else SafetensorsStore(file)
    total = 0
    for key in store.keys():
        shape, dtype = store.header(key, path)
        total += check_shape(f"array {key!r} of {str(file)!r}", (f"dim{i}" for i in range(len(shape))), shape,
                             ITEMSIZE.get(dtype, 8), limits, f"{path}.{key}")  # 8: a dtype the format lacks
    check_working(total, limits, memory_limit, f"the arrays of {str(file)!r}")


def random_values(program, dims: dict[str, int], seed: int = 0, int_high: int = 1,
                  bindings=None, memory_limit: int | None = None,
                  whole_working: bool = True) -> tuple[dict[str, np.ndarray], dict[str, np.ndarray]]:
    """Random values of the declared types (float32 for 'floating'), bundles included; every
    size limit (the program's and the runtime ``memory_limit``) is checked before any is made
    (``whole_working=False``, for a chunked run: all of them together may pass max_working_bytes)."""
    from runtime.core.types import numpy_dtype

    if int_high < 1:
        fail("schema", "$.random", f"--int-high must be ≥ 1, got {int_high}")
    bindings = program.bindings if bindings is None else bindings
    needed = sorted({s for b in bindings for s in b.value_type.sizes if isinstance(s, str)} - set(dims))
    if needed:
        fail("binding_shape", "$.dims",
             f"no extent for symbols {needed}: pass --dim {needed[0]}=… for each")
    _check_random_sizes(program, dims, bindings, memory_limit, whole_working)
    rng = np.random.default_rng(seed)
    inputs: dict[str, np.ndarray] = {}
    banks: dict[str, np.ndarray] = {}
    for b in bindings:
        t = b.value_type
        shape = tuple(dims[s] if isinstance(s, str) else s for s in t.sizes)
        dtype = "float32" if t.dtype == "floating" else t.dtype
        if dtype == "boolean":
            value = rng.random(shape) < 0.5
        elif dtype == "int64":
            value = rng.integers(0, int_high, size=shape, dtype=np.int64)
        else:
            value = rng.standard_normal(shape).astype(numpy_dtype(dtype))
        (inputs if b.kind == "input" else banks)[b.name] = value
    return inputs, banks


def _check_random_sizes(program, dims: dict[str, int], bindings, memory_limit: int | None,
                        whole_working: bool = True) -> None:
    """The values ``random_values`` would make, measured against the limits from their
    shapes alone (a huge ``--dim`` is refused, never allocated)."""
    from runtime.core.types import ITEMSIZE
    from runtime.plan.memory import check_shape, check_working

    lim = program.limits
    for symbol, extent in dims.items():
        if isinstance(extent, bool) or not isinstance(extent, int) or extent < 1:
            fail("binding_shape", f"$.dims.{symbol}", f"extent of {symbol} must be a positive integer, got {extent!r}")
    total = 0
    for b in bindings:
        t = b.value_type
        shape = [dims[s] if isinstance(s, str) else s for s in t.sizes]
        total += check_shape(f"random {b.name!r}", t.axes, shape, ITEMSIZE["float32" if t.dtype == "floating" else t.dtype],
                             lim, f"$.{'inputs' if b.kind == 'input' else 'banks'}.{b.name}")
    if whole_working:
        check_working(total, lim, memory_limit, "the random values")


def write_arrays(location: str, arrays) -> None:
    """Arrays by name (a run's outputs by slot id) into an ``.npz`` at exactly ``location``."""
    with open(location, "wb") as f:  # an open file keeps np.savez from appending ".npz"
        np.savez(f, **{name: np.asarray(v) for name, v in arrays.items()})


def run_values(exe, dims: dict[str, int], inputs: str | None = None, banks: str | None = None,
               random: bool = False, seed: int = 0, int_high: int = 1, chunked: bool = False,
               open_store=None) -> tuple[dict[str, Any], Any]:
    """A run's inputs and banks, as the ``formula`` command's flags give them: ``inputs``, an
    ``.npz``/``.safetensors`` file; ``banks``, a bank store (opened by ``open_store``); with
    ``random``, random values (``seed``, ``int_high``) for whatever those leave out. A program
    that needs values none of them gives is told which flags give them, before anything is
    read. ``chunked``: the run is chunked (each slice is preflighted, not the whole)."""
    program, memory_limit = exe.program, exe.memory_limit
    for flag, bindings, given in (("inputs", program.input_bindings, inputs),
                                  ("banks", program.bank_bindings, banks)):
        if bindings and not given and not random:
            names = ", ".join(repr(b.name) for b in bindings)
            fail("binding_keys", f"$.{flag}",
                 f"the program needs {flag} {names}: pass --{flag} FILE "
                 f"({'.npz/.safetensors of arrays by name' if flag == 'inputs' else 'a bank store'}) "
                 f"or --random for random values")
    store: Any = open_store(Path(banks)) if banks else None  # (its index, not its arrays)
    values: dict[str, Any] | None = read_arrays(inputs, "$.inputs", program.limits, memory_limit) \
        if inputs else None
    if random:
        dims = fixed_extents(program.input_bindings, values or {}, dims)  # what the given inputs fix
        if not chunked:  # a chunked run preflights each slice
            preflight(exe, dims)
        want_inputs = [] if values is not None else program.input_bindings
        want_banks = [] if store is not None else program.bank_bindings
        rand_inputs, rand_banks = random_values(program, dims, seed, int_high, (*want_inputs, *want_banks),
                                                memory_limit, not chunked)
        values = values if values is not None else rand_inputs
        store = store if store is not None else rand_banks
    return values or {}, store


def fixed_extents(bindings, values, dims: dict[str, int]) -> dict[str, int]:
    """``dims`` plus the extents of symbols that the arrays among ``values`` fix (by binding name)."""
    dims = dict(dims)
    for b in bindings:
        value = values.get(b.name)
        if isinstance(value, np.ndarray) and value.ndim == b.value_type.rank:
            for size, extent in zip(b.value_type.sizes, value.shape):
                if isinstance(size, str):
                    dims.setdefault(size, extent)
    return dims


def preflight(exe, dims: dict[str, int]) -> None:
    """The whole plan's §5 limits and the memory ceiling for these extents, when they fix
    every symbol of the bindings: before any random value is made."""
    from runtime.plan.memory import check_working

    symbols = {s for b in exe.program.bindings for s in b.value_type.sizes if isinstance(s, str)}
    if symbols and symbols <= set(dims):
        plan = exe.plan({s: dims[s] for s in symbols}, enforce=False)  # per-tensor limits enforced
        check_working(plan.working_bytes, exe.program.limits, exe.memory_limit,
                      "the run's working set (bindings, arena peak and outputs)")


def array_stats(a: np.ndarray) -> dict[str, Any]:
    """dtype, shape, min, max and mean of an output (``formula run --json``)."""
    stats = a.astype(np.float64) if a.dtype.kind == "f" or a.dtype.name == "bfloat16" else a
    empty = a.size == 0
    return {"dtype": a.dtype.name, "shape": list(a.shape),
            "min": None if empty else np.min(stats).item(),
            "max": None if empty else np.max(stats).item(),
            "mean": None if empty else float(np.mean(stats))}


def describe_array(name: str, a: np.ndarray) -> str:
    """One line: ``name``, dtype, shape, min, max and mean (``formula run``)."""
    s = array_stats(a)
    if s["min"] is None:
        return f"{name}  {s['dtype']}{s['shape']}  (empty)"
    return (f"{name}  {s['dtype']}{s['shape']}  min {_num(s['min'])}  "
            f"max {_num(s['max'])}  mean {s['mean']:.6g}")


def _num(v) -> str:
    return f"{v:.6g}" if isinstance(v, float) else str(v)
