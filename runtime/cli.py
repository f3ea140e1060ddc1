"""The ``formula`` console script: validate, run, plan and benchmark programs; list atoms/plugins;
compile a program's kernels ahead of time (``compile``) and show or clear the cache (``cache``).

``run`` is tiered on cpu (its result may come from the reference kernels while the cpu ones
compile in the background, which the process does not wait for); ``bench`` and ``compile``
are not.

Every ``FormulaError`` is printed as ``error [code] path: message`` on stderr with exit status
1, so a bad program or bad input never shows a traceback. An unexpected exception (a bug) is
reported in one line with exit status 2; ``FORMULA_DEBUG=1`` re-raises it for the traceback.
A malformed argument (``--dim B``, ``--seed -1``) is a usage error, exit status 2.

Every argument is checked before any work: the syntax by argparse, then repeated ``--dim``s,
``--out`` (an ``.npz`` in an existing directory), the ``--inputs`` file and the backend, then
(once the program is loaded) unknown symbols, missing values and the ``--banks`` store.

``--json`` (every verb) prints one JSON object on stdout, ``{"command": VERB, "ok": bool,
...}``, with the verb's payload (README, "The CLI") or ``"error": {"code", "path",
"message"}``; the text report and progress still go to stderr.

Files: ``--inputs`` is an ``.npz`` or ``.safetensors`` file of arrays named by input binding;
``--banks`` is a bank store (see ``runtime.execution.banks`` for the key layout); ``--out`` writes the
outputs to an ``.npz`` named by slot id. ``--random`` makes normal floats, int64 in
``[0, --int-high)`` and random booleans for whatever ``--inputs``/``--banks`` do not provide.
"""
from __future__ import annotations

import argparse
import contextlib
import json
import os
import statistics
import sys
import time
from pathlib import Path
from typing import Any, Sequence

import numpy as np

from runtime.core import settings
from runtime.core.errors import FormulaError, fail
from runtime.execution.values import (array_stats, describe_array, fixed_extents, preflight, random_values,
                                      run_values, write_arrays)
from runtime.kernels.compilelog import compile_feedback


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
        if getattr(args, "json", False):
            _emit(args, False, error={"code": exc.code, "path": exc.path, "message": exc.message})
        return 1
    except BrokenPipeError:  # `formula atoms | head`: the reader left, as with any Unix tool
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())  # no error at exit flush
        return 141
    except OSError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 130
    except Exception as exc:
        if settings.DEBUG.read():
            raise
        print(f"internal error: {type(exc).__name__}: {exc} (set FORMULA_DEBUG=1 for a traceback)",
              file=sys.stderr)
        return 2


def _emit(args, ok: bool, **payload: Any) -> None:
    """The ``--json`` answer: one object, ``command`` and ``ok`` first."""
    print(json.dumps({"command": args.command, "ok": ok, **payload}, indent=2, default=str))


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


def _chunks(text: str) -> str | int:
    """An argparse type: 'auto' or a positive integer."""
    return "auto" if text == "auto" else _count(1)(text)


def _count(minimum: int):
    """An argparse type: an integer ≥ ``minimum``."""
    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected an integer, got {text!r}") from None
        if value < minimum:
            raise argparse.ArgumentTypeError(f"must be ≥ {minimum}, got {value}")
        return value
    return parse


def _parser() -> argparse.ArgumentParser:
    from runtime import __version__

    p = argparse.ArgumentParser(prog="formula", description="Run typed formula programs.")
    p.add_argument("--version", action="version", version=f"formula-runtime {__version__}")
    sub = p.add_subparsers(dest="command", metavar="COMMAND")

    def command(name: str, func, help: str, program: bool = True, backend: bool = False):
        c = sub.add_parser(name, help=help, description=help)
        if program:
            c.add_argument("program", metavar="PROGRAM", help="program JSON file")
        if backend:
            c.add_argument("--backend", default="cpu",
                           help="a registered backend: reference, cpu, cuda or a plugin's (default: cpu)")
        c.add_argument("--json", action="store_true",
                       help="print one JSON object on stdout (shape: README, 'The CLI')")
        c.set_defaults(func=func)
        return c

    def dims(c):
        c.add_argument("--dim", action="append", type=_dim, default=[], metavar="SYMBOL=EXTENT",
                       help="extent of a size symbol (repeatable)")

    def random(c):
        c.add_argument("--seed", type=_count(0), default=0, help="random seed, ≥ 0 (default 0)")
        c.add_argument("--int-high", type=_count(1), default=1, metavar="N",
                       help="random int64 values are drawn from [0, N) (default 1)")

    def chunks(c):
        c.add_argument("--chunks", type=_chunks, default=None, metavar="auto|N",
                       help="run in slices along a free axis: 'auto' when over max_working_bytes, "
                            "or slices of at most N positions")

    command("validate", _validate, "Load and validate a program; print a summary.")
    c = command("run", _run, "Run a program once and summarise its outputs.", backend=True)
    c.add_argument("--inputs", metavar="FILE", help=".npz/.safetensors of input arrays by name")
    c.add_argument("--banks", metavar="FILE", help="bank store (.npz, .safetensors, or a plugin's)")
    c.add_argument("--out", metavar="FILE.npz", help="write the outputs here, by slot id")
    c.add_argument("--random", action="store_true",
                   help="random values for every input/bank not given by --inputs/--banks")
    c.add_argument("--check-outputs", action="store_true",
                   help="fail (nonfinite, with the instruction's path) when any instruction output "
                        "holds NaN or ±inf (SPEC §3b.3 item 2)")
    c.add_argument("--no-fill-cache", action="store_true",
                   help="when the result came from the reference kernels, do not leave a "
                        "`formula compile` process filling the cache for the next run")
    chunks(c)
    dims(c)
    random(c)
    c = command("plan", _plan, "Print the schedule, lifetimes, arena and memory for extents.",
                backend=True)
    chunks(c)
    dims(c)
    c = command("bench", _bench, "Time runs on random inputs.", backend=True)
    dims(c)
    random(c)
    c.add_argument("--repeat", type=_count(1), default=10, metavar="N", help="timed runs (default 10)")
    c.add_argument("--warmup", type=_count(0), default=1, metavar="N", help="untimed runs (default 1)")
    c.add_argument("--banks-per-run", action="store_true",
                   help="pass the banks to every run instead of loading them once (load_banks)")
    c = command("compile", _compile, "Compile (or load from the cache) every kernel a program needs for "
                "extents and dtypes, so later processes start warm (deployment images).", backend=True)
    dims(c)
    c.add_argument("--dtype", choices=("float32", "float64"), default="float32",
                   help="the dtype of the program's 'floating' bindings (default float32)")
    c.add_argument("--note-failure", action="store_true", help=argparse.SUPPRESS)  # (_fill_cache's child)
    c = command("cache", _cache, "Show (info) or clear the kernel cache.", program=False)
    c.add_argument("action", choices=("info", "clear"), help="info: location, size, files; "
                   "clear: remove the cache's own files")
    c = command("grad", _grad, "Write the program's gradient program (SPEC §3c) and its manifest.")
    c.add_argument("--wrt", action="append", required=True, metavar="NAME",
                   help="a floating binding to differentiate for (repeatable)")
    c.add_argument("--output", action="append", default=None, metavar="SLOT",
                   help="an output to differentiate (repeatable; default every floating output); "
                        "one 0-d output alone is a loss: its cotangent is 1, not an input")
    c.add_argument("--out", required=True, metavar="G.program.json", help="where to write the program")
    c.add_argument("--manifest", metavar="FILE", help="where to write the manifest (cotangents, "
                   "gradients; default: beside --out, ending .manifest.json)")
    dims(c)
    command("atoms", _atoms, "List the registered atoms.", program=False)
    command("plugins", _plugins, "List the registered plugins and their problems.", program=False)
    return p


def _grad(args) -> int:
    """``formula grad``: the gradient program, its manifest, what it adds and keeps."""
    from runtime.api import grad, load_program, vjp
    from runtime.execution.executor import check_dims

    dims = _checked_dims(args)
    out = Path(args.out)
    manifest = Path(args.manifest) if args.manifest else out.with_name(
        out.name.removesuffix(".json").removesuffix(".program") + ".manifest.json")
    for key, path in (("$.out", out), ("$.manifest", manifest)):
        if path.is_dir() or not path.parent.is_dir():
            fail("schema", key, f"{str(path)!r}: expected a file name in an existing directory")
    program = load_program(Path(args.program))
    check_dims(program, dims)
    outputs = args.output
    if outputs and len(outputs) == 1 and outputs[0] in program.outputs and \
            not program.slot(outputs[0]).value_type.rank:
        g = grad(program, args.wrt, outputs[0])
    else:
        g = vjp(program, args.wrt, outputs)
    out.write_text(json.dumps(g.program, indent=2) + "\n")
    manifest.write_text(json.dumps(g.manifest(), indent=2) + "\n")
    needed = sorted({s for slot in g.saved for s in program.slot(slot).value_type.sizes
                     if isinstance(s, str)} - set(dims))
    saved = g.saved_bytes(dims) if not needed else {}
    total = sum(saved.values())
    if args.json:
        _emit(args, True, program=str(out), manifest=str(manifest), cotangents=g.cotangents,
              gradients=g.gradients, instructions_added=g.added, saved=list(g.saved),
              saved_bytes=saved if not needed else None, dims=dims)
        return 0
    print(f"{out}: {g.added} instructions added to {len(program.instructions)}; manifest {manifest}",
          file=sys.stderr)
    for slot, name in g.cotangents.items():
        print(f"  cotangent of {slot}: input {name}", file=sys.stderr)
    for name, slot in g.gradients.items():
        print(f"  gradient of {name}: output {slot}", file=sys.stderr)
    if needed:
        print(f"  kept for the backward: {', '.join(g.saved) or 'nothing'} "
              f"(--dim {needed[0]}=… for each of {needed} gives their size)", file=sys.stderr)
    else:
        print(f"  kept for the backward: {_mib(total)} in {len(saved)} values"
              + "".join(f"\n    {slot}: {_mib(n)}" for slot, n in saved.items()), file=sys.stderr)
    return 0


def _mib(n: int) -> str:
    return f"{n / 2**20:.1f} MiB ({n:,} B)"


# --- checks before any work ---------------------------------------------------------------
def _checked_dims(args) -> dict[str, int]:
    """``--dim``s as a dict; a symbol given twice is an error, not a silent override."""
    dims: dict[str, int] = {}
    for name, extent in getattr(args, "dim", []):
        if name in dims:
            fail("duplicate", f"$.dims.{name}",
                 f"--dim {name} is given twice ({dims[name]} and {extent}): give each symbol once")
        dims[name] = extent
    return dims


def _check_files(args) -> None:
    """``--out`` must be an ``.npz`` that can be created; ``--inputs`` must exist."""
    out = getattr(args, "out", None)
    if out:
        path = Path(out)
        if path.suffix.lower() != ".npz":
            fail("schema", "$.out", f"--out {out!r}: expected a file name ending in .npz "
                 f"(the outputs are written as an .npz of arrays by slot id)")
        if path.is_dir():
            fail("schema", "$.out", f"--out {out!r} is a directory: expected a file name ending in .npz")
        parent = path.parent
        if not parent.is_dir():
            fail("schema", "$.out", f"--out {out!r}: directory {str(parent)!r} does not exist")
        if not os.access(parent, os.W_OK):
            fail("schema", "$.out", f"--out {out!r}: directory {str(parent)!r} is not writable")
    given = getattr(args, "inputs", None)  # (--banks may name a plugin's store: its opener checks it)
    if given and not Path(given).is_file():
        fail("schema", "$.inputs", f"--inputs {given!r}: no such file")


def _prepare(args, tiered: bool | None = None):
    """Check every argument, then load the program and compile it for ``--backend``:
    (executable, dims). Nothing proportional to the data has run yet."""
    from runtime.api import compile as compile_program
    from runtime.execution.executor import check_dims
    from runtime.plugins.registry import default_registry

    dims = _checked_dims(args)
    _check_files(args)
    registry = default_registry()
    registry.backend(args.backend)  # unknown or unavailable here: before the program is read
    exe = compile_program(Path(args.program), backend=args.backend, registry=registry, tiered=tiered)
    return exe, check_dims(exe.program, dims)


def _compile_feedback():
    """Compile notices on stderr, naming the kernel cache."""
    from runtime.kernels.codegen import cache_dir

    return compile_feedback(sys.stderr, cache_dir)


# --- commands ----------------------------------------------------------------------------
def _validate(args) -> int:
    from runtime.api import load_program

    program = load_program(Path(args.program))
    if args.json:
        _emit(args, True, program=args.program, summary=summary_dict(program))
        return 0
    print(f"ok: {args.program}")
    for line in summary(program):
        print(line)
    return 0


def summary_dict(program) -> dict[str, Any]:
    """``formula validate --json``'s summary: what :func:`summary` prints, as data."""
    return {
        "fingerprint": program.fingerprint,
        "bindings": [{"kind": b.kind, "name": b.name, "type": b.value_type.describe(),
                      "partition_id": b.partition_id if b.kind == "bank" else None,
                      "bundle_id": b.bundle_id if b.kind == "bank" else None,
                      "member_ids": list(b.member_ids) if b.kind == "bank" else [],
                      "asset_fingerprint": b.asset_fingerprint if b.kind == "bank" else None}
                     for b in program.bindings],
        "slots": len(program.slots),
        "instructions": len(program.instructions),
        "steps": len({i.step for i in program.instructions}),
        "outputs": [{"slot": o, "type": program.slot(o).value_type.describe()} for o in program.outputs],
        "symbols": list(program.symbols),
    }


def summary(program) -> list[str]:
    """Human-readable lines describing a validated program."""
    data = summary_dict(program)
    inputs, banks = program.input_bindings, program.bank_bindings
    lines = [f"fingerprint   {data['fingerprint']}",
             f"bindings      {len(program.bindings)} ({len(inputs)} inputs, {len(banks)} banks)"]
    for b in data["bindings"]:
        extra = ""
        if b["kind"] == "bank":
            extra = f"  partition {b['partition_id']}"
            if b["bundle_id"]:
                extra += f", bundle {b['bundle_id']} members {b['member_ids']}"
            if b["asset_fingerprint"]:
                extra += f", asset {b['asset_fingerprint'][:12]}…"
        lines.append(f"  {b['kind']:<5} {b['name']}: {b['type']}{extra}")
    lines += [f"slots         {data['slots']}",
              f"instructions  {data['instructions']}",
              f"steps         {data['steps']}",
              "outputs       " + ", ".join(f"{o['slot']}: {o['type']}" for o in data["outputs"]),
              f"symbols       {', '.join(data['symbols']) or '(none)'}"]
    return lines


def _run(args) -> int:
    exe, dims = _prepare(args)
    _report_background_failure(exe.program, args.backend)
    from runtime.api import open_bank_store

    inputs, banks = run_values(exe, dims, args.inputs, args.banks, args.random, args.seed, args.int_high,
                               args.chunks is not None, open_bank_store)
    with _compile_feedback():
        started = time.perf_counter()
        result = exe.run(inputs=inputs, banks=banks, check_outputs=args.check_outputs,
                         chunks=args.chunks)
        elapsed = (time.perf_counter() - started) * 1e3
    if args.out:
        write_arrays(args.out, result)
    filler = None
    if result.tier != args.backend and not args.no_fill_cache:
        filler = _fill_cache(args, exe.program, inputs, banks, dims)
    if args.json:
        _emit(args, True, backend=args.backend, tier=result.tier, dims=dims, ms=round(elapsed, 3), out=args.out,
              outputs={slot: array_stats(np.asarray(v)) for slot, v in result.items()}, filling_cache=filler)
        return 0
    for slot, value in result.items():
        print(describe_array(slot, np.asarray(value)))
    if result.tier != args.backend:  # tiered: the backend's kernels were still compiling
        print(f"time          {elapsed:.3f} ms (on the {result.tier} kernels while the {args.backend} ones "
              f"compile; `formula compile` fills the cache ahead of time)")
        if filler is not None:
            print(f"cache         process {filler} compiles the {args.backend} kernels for the next run "
                  f"(`--no-fill-cache` to skip)")
    else:
        print(f"time          {elapsed:.3f} ms (first run on {args.backend}: includes planning and "
              f"loading or compiling kernels)")
    if args.out:
        print(f"wrote         {args.out}")
    return 0


def _fill_cache(args, program, inputs, banks, dims: dict[str, int]) -> int | None:
    """Start ``formula compile`` for this run's extents and dtype as a process of its own that
    outlives this one (the tiered run's background thread dies with it), so that the next
    ``formula run`` of the program finds its kernels in the cache. Its pid, or None when the
    extents or the dtype cannot be told from the run (a symbol fixed only by a bank store)."""
    import subprocess

    values = {**(banks if isinstance(banks, dict) else {}), **inputs}
    dims = fixed_extents(program.bindings, values, dims)
    floating = {values[b.name].dtype.name for b in program.bindings
                if b.value_type.dtype == "floating" and isinstance(values.get(b.name), np.ndarray)}
    symbols = {s for b in program.bindings for s in b.value_type.sizes if isinstance(s, str)}
    if not symbols <= set(dims) or len(floating) > 1 or not floating <= {"float32", "float64"}:
        return None
    command = [sys.executable, "-m", "runtime.cli", "compile", str(Path(args.program).resolve()),
               "--backend", args.backend, "--dtype", floating.pop() if floating else "float32", "--note-failure",
               *(f"--dim={s}={e}" for s, e in sorted(dims.items()))]
    child = subprocess.Popen(command, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                             stderr=subprocess.DEVNULL, start_new_session=True, close_fds=True)
    return child.pid


def _failure_note(program, backend: str) -> Path:
    """Where the ``formula compile`` that a one-shot ``formula run`` leaves behind writes its
    error, for the next ``formula run`` of the program to print (a file of the cache's
    ``ready/`` folder, so ``formula cache clear`` removes it)."""
    from runtime.kernels.codegen import ready_marker

    return ready_marker(f"failed|{program.fingerprint}|{backend}")


def _report_background_failure(program, backend: str) -> None:
    """Print, once, the error of the cache-filling compile an earlier run of this program left."""
    note = _failure_note(program, backend)
    try:
        error = json.loads(note.read_text())
        note.unlink()
    except (OSError, ValueError):
        return
    if isinstance(error, dict):
        print(f"error [{error.get('code')}] {error.get('path')}: {error.get('message')} (in the "
              f"background compile an earlier `formula run` of this program left; this run goes on)",
              file=sys.stderr)


def _compile(args) -> int:
    """Every kernel of the plan for ``--dim``s and ``--dtype``, in every variant a later extent
    of a symbolic axis may take, compiled or loaded into the cache; runs on random values.
    ``--note-failure`` (the child a one-shot ``formula run`` leaves): a FormulaError is also
    written where the next ``formula run`` prints it."""
    try:
        return _compile_program(args)
    except FormulaError as exc:
        if args.note_failure:
            from runtime.api import load_program

            with contextlib.suppress(OSError, FormulaError):
                note = _failure_note(load_program(Path(args.program)), args.backend)
                note.parent.mkdir(parents=True, exist_ok=True)
                note.write_text(json.dumps({"code": exc.code, "path": exc.path, "message": exc.message}))
        raise


def _compile_program(args) -> int:
    from runtime.api import compile as compile_program
    from runtime.execution.compile_worker import fill_cache
    from runtime.execution.executor import check_dims
    from runtime.kernels import compilelog
    from runtime.kernels.codegen import cache_dir
    from runtime.plugins.registry import default_registry

    dims = _checked_dims(args)
    registry = default_registry()
    registry.backend(args.backend)
    exe = compile_program(Path(args.program), backend=args.backend, registry=registry, tiered=False)
    dims = check_dims(exe.program, dims)
    before = compilelog.total()
    with _compile_feedback():
        started = time.perf_counter()
        fill_cache(exe, dims, args.dtype)
        elapsed = time.perf_counter() - started
    compiled = compilelog.total() - before
    where = str(cache_dir())
    if args.json:
        _emit(args, True, backend=args.backend, dims=dims, dtype=args.dtype, compiled=compiled,
              seconds=round(elapsed, 3), cache=where)
        return 0
    print(f"ready         {args.program} on {args.backend} for {dims or 'its static extents'} ({args.dtype})")
    print(f"compiled      {compiled} kernel{'s' if compiled != 1 else ''} in {elapsed:.1f} s "
          f"(the rest were in the cache)")
    print(f"cache         {where}")
    return 0


def _cache(args) -> int:
    from runtime.kernels import codegen

    if args.action == "clear":
        removed = codegen.clear_cache()
        info = codegen.cache_info()
        if args.json:
            _emit(args, True, action="clear", removed_files=removed, **info)
            return 0
        print(f"removed       {removed} file{'s' if removed != 1 else ''} from {info['location']}")
        return 0
    info = codegen.cache_info()
    if args.json:
        _emit(args, True, action="info", **info)
        return 0
    print(f"location      {info['location']}{'' if info['exists'] else ' (not created yet)'}")
    print(f"size          {info['bytes'] / 2**20:.1f} MiB in {info['files']} files "
          f"({info['generated_files']} generated sources, {info['numba_files']} Numba entries)")
    print(f"numba cache   {info['numba_cache_dir']}{'' if info['numba_cache_is_ours'] else ' (NUMBA_CACHE_DIR: not cleared by formula cache clear)'}")
    print("set FORMULA_CACHE_DIR to move it; `formula cache clear` empties it")
    return 0


def _plan(args) -> int:
    exe, dims = _prepare(args)
    plan = exe.plan(dims, enforce=False, chunks=args.chunks)  # over max_working_bytes: reported, exit 1
    if args.json:
        _emit(args, plan.fits, plan=plan.to_dict())
    else:
        print(plan.describe())
    return 0 if plan.fits else 1


def _bench(args) -> int:
    exe, dims = _prepare(args, tiered=False)  # times the backend's own kernels
    preflight(exe, dims)
    inputs, banks = random_values(exe.program, dims, args.seed, args.int_high, memory_limit=exe.memory_limit)
    if not args.banks_per_run:
        banks = exe.load_banks(banks)
    with _compile_feedback():
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
    banks_mode = "passed per run" if args.banks_per_run else "loaded once"
    if args.json:
        _emit(args, True, program=args.program, backend=args.backend, dims=dims,
              repeat=args.repeat, warmup=args.warmup, banks=banks_mode,
              first_ms=round(first, 3), min_ms=round(min(times), 3),
              median_ms=round(statistics.median(times), 3), max_ms=round(max(times), 3),
              times_ms=[round(t, 3) for t in times])
        return 0
    shown = ", ".join(f"{k}={v}" for k, v in dims.items()) or "static"
    print(f"bench {args.program} on {args.backend} ({shown}), {args.repeat} runs after "
          f"{args.warmup} warm-up, banks {banks_mode}")
    print(f"first run     {first:.3f} ms (planning and compilation included)")
    print(f"min           {min(times):.3f} ms")
    print(f"median        {statistics.median(times):.3f} ms")
    print(f"max           {max(times):.3f} ms")
    return 0


def _atoms(args) -> int:
    from runtime.plugins import diagnostics
    from runtime.plugins.registry import default_registry

    rows = diagnostics.atoms_table(default_registry())
    if args.json:
        _emit(args, True, atoms=rows)
    else:
        print(diagnostics.format_atoms(rows))
    return 0


def _plugins(args) -> int:
    from runtime.plugins import diagnostics
    from runtime.plugins.registry import default_registry

    rows = diagnostics.plugins_report(default_registry())
    if args.json:
        _emit(args, all(r["status"] == "loaded" and not r["problems"] for r in rows), plugins=rows)
    else:
        print(diagnostics.format_plugins(rows))
    return 0


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
