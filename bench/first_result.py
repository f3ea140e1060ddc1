"""Time to first result, each in a fresh process on an empty cache: ``python bench/first_result.py``.

Prints one JSON object (``--markdown``: the table of docs/performance.md) with:

- ``seed_cli``: the README's quick-start ``formula run`` of the seed, wall seconds from process
  start to exit (the result is printed just before), on an empty cache; then ``formula
  compile`` for the same extents (its seconds) and the same run warm;
- ``block_api``: the transformer block (D=512, 8 heads of 64, MLP 2048, S=512) through the
  API: seconds from process start to the first result (and its tier), to the compiled
  kernels being ready (``wait_compiled``), and the steady run time;
- ``new_extent``: the first run at each new extent of the symbolic axis against its steady
  time (seed and block), tiered, after three runs at S=64 (``three_runs``) and after
  ``wait_compiled`` and ``warm`` (``warmed``); on an empty cache, then on the cache it left;
- ``ort``: ONNX Runtime's session creation plus first run of the seed in a fresh process
  (skipped when ``onnxruntime`` is not importable by ``--ort-python``).
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

_START = time.time()
REPO = Path(__file__).resolve().parent.parent
BLOCK_DIMS = {"D": 512, "H": 8, "Dh": 64, "F": 2048}
QUICK_START = ["examples/seed-lora-silu.program.json", "--random", "--dim", "B=2", "--dim", "S=64"]


def _env(cache: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in ("NUMBA_CACHE_DIR", "FORMULA_TIERED")}
    env["FORMULA_CACHE_DIR"] = str(cache)
    return env


def _child(kind: str, cache: Path, python: str = sys.executable) -> dict:
    started = time.time()
    proc = subprocess.run([python, str(Path(__file__).resolve()), "--child", kind], cwd=REPO,
                          capture_output=True, text=True, env=_env(cache), timeout=1800)
    if proc.returncode != 0:
        return {"error": proc.stderr[-2000:]}
    got = json.loads(proc.stdout.strip().splitlines()[-1])
    startup = got.pop("child_start") - started  # interpreter start until this script runs
    got["startup_s"] = round(startup, 3)
    for key in ("first_result_s", "compiled_ready_s", "from_process_start_s"):
        if key in got:
            got[key] = round(got[key] + startup, 3)  # from process start
    return got


def _formula(verb: str, *args: str) -> list[str]:
    formula = shutil.which("formula", path=str(Path(sys.executable).parent)) or shutil.which("formula")
    return [formula, verb, *args] if formula else [sys.executable, "-m", "runtime.cli", verb, *args]


def seed_cli(cache: Path) -> dict:
    """The quick start, cold (no process left filling the cache: it would load the machine
    while the later cases are measured); then ``formula compile`` fills the cache and the
    same command runs warm."""
    cold = _seed_run(cache, "--no-fill-cache")
    started = time.perf_counter()
    subprocess.run(_formula("compile", *QUICK_START[:1], *QUICK_START[2:]), cwd=REPO, capture_output=True,
                   env=_env(cache), timeout=1800, check=True)
    return {"cold": cold, "compile_s": round(time.perf_counter() - started, 3), "warm": _seed_run(cache)}


def _seed_run(cache: Path, *extra: str) -> dict:
    cmd = _formula("run", *QUICK_START, *extra)
    started = time.perf_counter()
    proc = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, env=_env(cache), timeout=1800)
    wall = time.perf_counter() - started
    return {"wall_s": round(wall, 3), "returncode": proc.returncode,
            "time_line": next((ln for ln in proc.stdout.splitlines() if ln.startswith("time")), "")}


# --- children (each one fresh process) -------------------------------------------------------
def _block_api() -> dict:
    sys.path.insert(0, str(REPO))
    from bench import transformer

    program = transformer.transformer_block_program(full=True, dims=BLOCK_DIMS)
    data = transformer.transformer_block_data(512, full=True, dims=BLOCK_DIMS)
    import runtime

    exe = runtime.compile(program, "cpu")
    first = exe.run(**data)
    first_at = time.time() - _START
    first_out = next(iter(first.values())).copy()
    exe.wait_compiled()
    ready_at = time.time() - _START
    compiled = exe.run(**data)
    times = []
    for _ in range(5):
        t = time.perf_counter()
        exe.run(**data)
        times.append(time.perf_counter() - t)
    import numpy as np

    diff = float(np.max(np.abs(first_out - next(iter(compiled.values())))))
    return {"first_result_s": round(first_at, 3), "first_tier": first.tier, "compiled_ready_s": round(ready_at, 3),
            "steady_ms": round(statistics.median(times) * 1e3, 3), "tier_after": compiled.tier,
            "max_abs_diff_between_tiers": diff}


def _new_extent() -> dict:
    """Per case, two ways to reach a new extent: ``warmed`` (after ``wait_compiled`` and
    ``warm``) and ``three_runs`` (a fresh executable run three times at the first extent, as
    a user would, with nothing waited for: issue 36's "after S=64")."""
    sys.path.insert(0, str(REPO))
    from bench import programs, transformer

    import runtime
    from runtime.kernels import compilelog

    def seed_data(t):
        d = programs.seed_data(t, "float32")
        return {"inputs": d["inputs"], "banks": d["banks"]}

    def block_data(t):
        return transformer.transformer_block_data(t, full=True, dims=BLOCK_DIMS)

    def block_inputs(t):  # (a new extent's request: its inputs, not a new set of weights)
        return {"inputs": transformer.transformer_block_inputs(t, BLOCK_DIMS["D"], np.random.default_rng(t))}

    cases = {"seed": (lambda: runtime.compile(programs.seed_program("float32"), "cpu"), seed_data, seed_data, 64,
                      (4097, 1000, 300, 77)),
             "block": (lambda: runtime.compile(transformer.transformer_block_program(full=True, dims=BLOCK_DIMS),
                                               "cpu"), block_data, block_inputs, 64, (512, 100, 300, 77))}
    out = {}
    for name, (make, data_for, inputs_for, warm_extent, extents) in cases.items():
        for how in ("three_runs", "warmed"):
            exe = make()
            data = data_for(warm_extent)
            banks = data["banks"]  # (a served program keeps its weights: only the inputs change length)
            for _ in range(3):
                exe.run(**data)
            if how == "warmed":
                exe.wait_compiled()
                exe.warm()
            rows = []
            for t in extents:
                data = {"inputs": inputs_for(t)["inputs"], "banks": banks}
                before = compilelog.specialisations()
                started = time.perf_counter()
                first = exe.run(**data)
                first_ms = (time.perf_counter() - started) * 1e3
                steady = []
                for _ in range(5):
                    started = time.perf_counter()
                    exe.run(**data)
                    steady.append((time.perf_counter() - started) * 1e3)
                rows.append({"extent": t, "first_ms": round(first_ms, 3), "tier": first.tier,
                             "steady_ms": round(statistics.median(steady), 3),
                             "over_steady_ms": round(first_ms - statistics.median(steady), 3),
                             "specialisations": compilelog.specialisations() - before})
            out[f"{name}_{how}"] = rows
            exe.wait_compiled()
    return out


def _ort() -> dict:
    sys.path.insert(0, str(REPO))
    from bench import contenders, programs

    data = programs.seed_data(64, "float32")
    started = time.perf_counter()
    run = contenders.seed_onnxruntime(data)
    run()
    return {"session_and_first_run_s": round(time.perf_counter() - started, 3),
            "from_process_start_s": time.time() - _START}


CHILDREN = {"block": _block_api, "extent": _new_extent, "ort": _ort}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--child", choices=sorted(CHILDREN), help=argparse.SUPPRESS)
    parser.add_argument("--ort-python", default=sys.executable,
                        help="a Python that can import onnxruntime (default: this one)")
    parser.add_argument("--only", choices=("seed_cli", "block_api", "new_extent", "ort"), action="append")
    args = parser.parse_args(argv)
    if args.child:
        got = CHILDREN[args.child]()
        got["child_start"] = _START
        print(json.dumps(got))
        return 0
    only = set(args.only or ("seed_cli", "block_api", "new_extent", "ort"))
    report: dict = {}
    with tempfile.TemporaryDirectory(prefix="formula-first-") as tmp:
        if "seed_cli" in only:
            cache = Path(tmp) / "seed"
            report["seed_cli"] = seed_cli(cache)
        if "block_api" in only:
            report["block_api"] = {"cold": _child("block", Path(tmp) / "block")}
        if "new_extent" in only:
            # an empty cache, then the same cache as the next process finds it
            report["new_extent"] = {"cold": _child("extent", Path(tmp) / "extent"),
                                    "warm_cache": _child("extent", Path(tmp) / "extent")}
        if "ort" in only:
            report["ort"] = _child("ort", Path(tmp) / "ort", args.ort_python)
    print(json.dumps(report, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
