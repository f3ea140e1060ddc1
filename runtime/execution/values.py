"""Values from outside a program: arrays by name read from ``.npz``/``.safetensors`` files
(measured by their headers first) and random values of a program's declared types; the
``formula`` command's ``--inputs``/``--random`` and ``runtime.testing.random_values``."""

from __future__ import annotations

from pathlib import Path

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
