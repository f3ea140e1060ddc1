"""The ``formula`` console script: validate, run, plan and benchmark programs; list atoms/plugins.

Every ``FormulaError`` is printed as ``error [code] path: message`` on stderr with exit status
1, so a bad program or bad input never shows a traceback. An unexpected exception (a bug) is
reported in one line with exit status 2; ``FORMULA_DEBUG=1`` re-raises it for the traceback.

Files: ``--inputs`` is an ``.npz`` or ``.safetensors`` file of arrays named by input binding;
``--banks`` is a bank store (see ``runtime.banks`` for the key layout); ``--out`` writes the
outputs to an ``.npz`` named by slot id. ``--random`` makes normal floats, int64 in
``[0, --int-high)`` and random booleans for whatever ``--inputs``/``--banks`` do not provide.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path
from typing import Any, Sequence

import numpy as np

from .errors import FormulaError, fail


def main(argv: Sequence[str] | None = None) -> int:
    parser = _parser()
    try:
        args = parser.parse_args(argv)
    except SystemExit as exc:  # argparse reports usage errors itself; hand back its status
        return int(exc.code or 0)
    if args.command is None:
        parser.print_help(sys.stderr)
        return 2
    try:
        return args.func(args) or 0
    except FormulaError as exc:
        print(f"error [{exc.code}] {exc.path}: {exc.message}", file=sys.stderr)
        return 1
    except OSError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 130
    except Exception as exc:
        if os.environ.get("FORMULA_DEBUG"):
            raise
        print(f"internal error: {type(exc).__name__}: {exc} (set FORMULA_DEBUG=1 for a traceback)",
              file=sys.stderr)
        return 2


# --- arguments ---------------------------------------------------------------------------
def _dim(text: str) -> tuple[str, int]:
    name, sep, value = text.partition("=")
    if not sep or not name.strip():
        raise argparse.ArgumentTypeError(f"expected SYMBOL=EXTENT (e.g. B=2), got {text!r}")
    try:
        extent = int(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"extent of {name!r} must be an integer, got {value!r}") from None
    if extent < 1:
        raise argparse.ArgumentTypeError(f"extent of {name!r} must be positive, got {extent}")
    return name.strip(), extent


def _parser() -> argparse.ArgumentParser:
    from . import __version__

    p = argparse.ArgumentParser(prog="formula", description="Run typed formula programs.")
    p.add_argument("--version", action="version", version=f"formula-runtime {__version__}")
    sub = p.add_subparsers(dest="command", metavar="COMMAND")

    def command(name: str, func, help: str, program: bool = True, backend: bool = False):
        c = sub.add_parser(name, help=help, description=help)
        if program:
            c.add_argument("program", metavar="PROGRAM", help="program JSON file")
        if backend:
            c.add_argument("--backend", default="cpu", help="reference, cpu or cuda (default: cpu)")
        c.set_defaults(func=func)
        return c

    def dims(c):
        c.add_argument("--dim", action="append", type=_dim, default=[], metavar="SYMBOL=EXTENT",
                       help="extent of a size symbol (repeatable)")

    def random(c):
        c.add_argument("--seed", type=int, default=0, help="random seed (default 0)")
        c.add_argument("--int-high", type=int, default=1, metavar="N",
                       help="random int64 values are drawn from [0, N) (default 1)")

    command("validate", _validate, "Load and validate a program; print a summary.")
    c = command("run", _run, "Run a program once and summarise its outputs.", backend=True)
    c.add_argument("--inputs", metavar="FILE", help=".npz/.safetensors of input arrays by name")
    c.add_argument("--banks", metavar="FILE", help="bank store (.npz, .safetensors, or a plugin's)")
    c.add_argument("--out", metavar="FILE.npz", help="write the outputs here, by slot id")
    c.add_argument("--random", action="store_true",
                   help="random values for every input/bank not given by --inputs/--banks")
    dims(c)
    random(c)
    c = command("plan", _plan, "Print the schedule, lifetimes, arena and memory for extents.",
                backend=True)
    dims(c)
    c.add_argument("--json", action="store_true", help="print the plan as JSON")
    c = command("bench", _bench, "Time runs on random inputs.", backend=True)
    dims(c)
    random(c)
    c.add_argument("--repeat", type=int, default=10, metavar="N", help="timed runs (default 10)")
    c.add_argument("--warmup", type=int, default=1, metavar="N", help="untimed runs (default 1)")
    c.add_argument("--banks-per-run", action="store_true",
                   help="pass the banks to every run instead of loading them once (load_banks)")
    command("atoms", _atoms, "List the registered atoms.", program=False)
    command("plugins", _plugins, "List the registered plugins and their problems.", program=False)
    return p


# --- commands ----------------------------------------------------------------------------
def _validate(args) -> int:
    from .api import load_program

    program = load_program(Path(args.program))
    print(f"ok: {args.program}")
    for line in summary(program):
        print(line)
    return 0


def summary(program) -> list[str]:
    """Human-readable lines describing a validated program."""
    inputs, banks = program.input_bindings, program.bank_bindings
    steps = sorted({i.step for i in program.instructions})
    lines = [f"fingerprint   {program.fingerprint}",
             f"bindings      {len(program.bindings)} ({len(inputs)} inputs, {len(banks)} banks)"]
    for b in program.bindings:
        extra = ""
        if b.kind == "bank":
            extra = f"  partition {b.partition_id}"
            if b.bundle_id:
                extra += f", bundle {b.bundle_id} members {list(b.member_ids)}"
            if b.asset_fingerprint:
                extra += f", asset {b.asset_fingerprint[:12]}…"
        lines.append(f"  {b.kind:<5} {b.name}: {b.value_type.describe()}{extra}")
    lines += [f"slots         {len(program.slots)}",
              f"instructions  {len(program.instructions)}",
              f"steps         {len(steps)}",
              f"outputs       {', '.join(f'{o}: {program.slot(o).value_type.describe()}' for o in program.outputs)}",
              f"symbols       {', '.join(program.symbols) or '(none)'}"]
    return lines


def _run(args) -> int:
    from .api import compile as compile_program

    exe = compile_program(Path(args.program), backend=args.backend)
    inputs, banks = _values(exe, args)
    started = time.perf_counter()
    result = exe.run(inputs=inputs, banks=banks)
    elapsed = (time.perf_counter() - started) * 1e3
    for slot, value in result.items():
        print(describe_array(slot, np.asarray(value)))
    print(f"time          {elapsed:.3f} ms (first run on {args.backend}: includes planning and "
          f"kernel compilation)")
    if args.out:
        out = Path(args.out)
        with open(out, "wb") as f:  # an open file keeps np.savez from appending ".npz"
            np.savez(f, **{slot: np.asarray(v) for slot, v in result.items()})
        print(f"wrote         {out}")
    return 0


def describe_array(name: str, a: np.ndarray) -> str:
    stats = a.astype(np.float64) if a.dtype.kind == "f" or a.dtype.name == "bfloat16" else a
    mean = float(np.mean(stats))
    return (f"{name}  {a.dtype.name}{list(a.shape)}  min {_num(np.min(stats))}  "
            f"max {_num(np.max(stats))}  mean {mean:.6g}")


def _num(v) -> str:
    v = v.item() if hasattr(v, "item") else v
    return f"{v:.6g}" if isinstance(v, float) else str(v)


def _plan(args) -> int:
    from .api import compile as compile_program

    exe = compile_program(Path(args.program), backend=args.backend)
    plan = exe.plan(dict(args.dim), enforce=False)  # over max_working_bytes: reported, exit 1
    print(json.dumps(plan.to_dict(), indent=2) if args.json else plan.describe())
    return 0 if plan.fits else 1


def _bench(args) -> int:
    from .api import compile as compile_program

    if args.repeat < 1 or args.warmup < 0:
        fail("schema", "$.bench", f"--repeat must be ≥ 1 and --warmup ≥ 0, got {args.repeat}, {args.warmup}")
    exe = compile_program(Path(args.program), backend=args.backend)
    dims = dict(args.dim)
    _preflight(exe, dims)
    inputs, banks = random_values(exe.program, dims, args.seed, args.int_high, memory_limit=exe.memory_limit)
    if not args.banks_per_run:
        banks = exe.load_banks(banks)
    started = time.perf_counter()
    exe.run(inputs=inputs, banks=banks)
    first = (time.perf_counter() - started) * 1e3
    for _ in range(args.warmup):
        exe.run(inputs=inputs, banks=banks)
    times = []
    for _ in range(args.repeat):
        started = time.perf_counter()
        exe.run(inputs=inputs, banks=banks)
        times.append((time.perf_counter() - started) * 1e3)
    shown = ", ".join(f"{k}={v}" for k, v in dims.items()) or "static"
    print(f"bench {args.program} on {args.backend} ({shown}), {args.repeat} runs after "
          f"{args.warmup} warm-up, banks {'passed per run' if args.banks_per_run else 'loaded once'}")
    print(f"first run     {first:.3f} ms (planning and compilation included)")
    print(f"min           {min(times):.3f} ms")
    print(f"median        {statistics.median(times):.3f} ms")
    print(f"max           {max(times):.3f} ms")
    return 0


def _atoms(args) -> int:
    from . import diagnostics
    from .registry import default_registry

    print(diagnostics.format_atoms(diagnostics.atoms_table(default_registry())))
    return 0


def _plugins(args) -> int:
    from . import diagnostics
    from .registry import default_registry

    print(diagnostics.format_plugins(diagnostics.plugins_report(default_registry())))
    return 0


# --- values ------------------------------------------------------------------------------
def _values(exe, args) -> tuple[dict[str, Any], Any]:
    program, memory_limit = exe.program, exe.memory_limit
    inputs: dict[str, Any] | None = read_arrays(args.inputs, "$.inputs", program.limits, memory_limit) \
        if args.inputs else None
    banks: Any = None
    if args.banks:
        from .api import open_bank_store

        banks = open_bank_store(Path(args.banks))
    if args.random:
        dims = dict(args.dim)
        for b in program.input_bindings:  # extents the given inputs already fix
            value = (inputs or {}).get(b.name)
            if isinstance(value, np.ndarray) and value.ndim == b.value_type.rank:
                for size, extent in zip(b.value_type.sizes, value.shape):
                    if isinstance(size, str):
                        dims.setdefault(size, extent)
        _preflight(exe, dims)
        want_inputs = [] if inputs is not None else program.input_bindings
        want_banks = [] if banks is not None else program.bank_bindings
        rand_inputs, rand_banks = random_values(program, dims, args.seed, args.int_high,
                                                (*want_inputs, *want_banks), memory_limit)
        inputs = inputs if inputs is not None else rand_inputs
        banks = banks if banks is not None else rand_banks
    return inputs or {}, banks


def _preflight(exe, dims: dict[str, int]) -> None:
    """The whole plan's §5 limits and the memory ceiling for these extents, when they fix
    every symbol of the bindings: before any random value is made."""
    from .memory import check_working

    symbols = {s for b in exe.program.bindings for s in b.value_type.sizes if isinstance(s, str)}
    if symbols and symbols <= set(dims):
        plan = exe.plan({s: dims[s] for s in symbols}, enforce=False)  # per-tensor limits enforced
        check_working(plan.working_bytes, exe.program.limits, exe.memory_limit,
                      "the run's working set (bindings, arena peak and outputs)")


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
    except FormulaError:
        raise
    except Exception as exc:  # OSError, zip/pickle ValueError, safetensors' own errors
        fail("schema", path, f"cannot read arrays from {location!r}: {type(exc).__name__}: {exc}")


def _check_headers(file: Path, suffix: str, path: str, limits, memory_limit: int | None) -> None:
    from .banks import SAFETENSORS_DTYPES, npy_header
    from .memory import check_shape, check_working
    from .types import ITEMSIZE

    if suffix == ".npz":
        with np.load(file, allow_pickle=False) as z:
            heads = {k: npy_header(file, k) for k in z.files if k != "__metadata__"}
        sizes = {k: (shape, dtype.itemsize) for k, (shape, dtype) in heads.items()}
    else:
        from safetensors import safe_open

        with safe_open(str(file), framework="numpy") as f:
            slices = {k: f.get_slice(k) for k in f.keys()}
            sizes = {k: (tuple(sl.get_shape()), ITEMSIZE.get(SAFETENSORS_DTYPES.get(sl.get_dtype()), 8))
                     for k, sl in slices.items()}
    total = sum(check_shape(f"array {k!r} of {str(file)!r}", (f"dim{i}" for i in range(len(shape))), shape,
                            itemsize, limits, f"{path}.{k}") for k, (shape, itemsize) in sizes.items())
    check_working(total, limits, memory_limit, f"the arrays of {str(file)!r}")


def random_values(program, dims: dict[str, int], seed: int = 0, int_high: int = 1,
                  bindings=None, memory_limit: int | None = None) -> tuple[dict[str, np.ndarray], dict[str, np.ndarray]]:
    """Random values of the declared types (float32 for 'floating'), bundles included; every
    size limit (the program's and the runtime ``memory_limit``) is checked before any is made."""
    from .types import numpy_dtype

    if int_high < 1:
        fail("schema", "$.random", f"--int-high must be ≥ 1, got {int_high}")
    bindings = program.bindings if bindings is None else bindings
    needed = sorted({s for b in bindings for s in b.value_type.sizes if isinstance(s, str)} - set(dims))
    if needed:
        fail("binding_shape", "$.dims",
             f"no extent for symbols {needed}: pass --dim {needed[0]}=… for each")
    _check_random_sizes(program, dims, bindings, memory_limit)
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


def _check_random_sizes(program, dims: dict[str, int], bindings, memory_limit: int | None) -> None:
    """The values ``random_values`` would make, measured against the limits from their
    shapes alone (a huge ``--dim`` is refused, never allocated)."""
    from .memory import check_shape, check_working
    from .types import ITEMSIZE

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
    check_working(total, lim, memory_limit, "the random values")


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
