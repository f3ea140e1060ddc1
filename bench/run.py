"""Benchmark driver: one fresh pytest process per contender, results merged into one JSON.

Thread pools of OpenBLAS (NumPy's and scipy's), libgomp (Numba) and ONNX Runtime that live
in one process distort each other's timings, so every contender gets a process of its own.
The environment is inherited unchanged (no OPENBLAS_* or thread variables are set here)
and recorded, per process, by bench/conftest.py.

    python bench/run.py                                   # everything, merged JSON in bench/results/
    python bench/run.py --contenders numpy,cpu -k "not T32768" --report docs/performance.md
    python bench/run.py --quick                           # each case once, results checked
    python bench/run.py --suites blocks --noisy           # a CPU-bound process on one core meanwhile
    python bench/run.py --suites grad,train,remat --contenders cpu,torch --fresh   # gradients, training
"""
from __future__ import annotations

import argparse
import contextlib
import datetime as dt
import json
import os
import re
import shlex
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from bench import coldstart, envinfo  # noqa: E402
from bench.contenders import CONTENDERS, RUNTIME_BACKENDS  # noqa: E402

SUITES = {"seed": "bench/test_seed.py", "atoms": "bench/test_atoms.py", "blocks": "bench/test_blocks.py",
          "grad": "bench/test_grad.py", "train": "bench/test_train.py", "remat": "bench/test_remat.py",
          "overhead": "bench/test_overhead.py"}
DEFAULT_SUITES = ("seed", "atoms", "blocks")  # the gradient and training suites are named: --suites grad,train,remat
SCHEMA = "formula-bench-merged/1"


def pytest_command(contender: str, files: list[str], json_path: Path, meta_path: Path,
                   keyword: str | None, quick: bool, extra: list[str]) -> list[str]:
    cmd = [sys.executable, "-m", "pytest", *files, "-q", "-p", "no:cacheprovider",
           f"--bench-contenders={contender}", f"--bench-meta={meta_path}",
           f"--benchmark-json={json_path}"]
    if not set(contender.split(",")) & set(RUNTIME_BACKENDS):
        cmd += ["-p", "no:formula_runtime"]  # keep the runtime (and numba) out of peer processes
    if keyword:
        cmd += ["-k", keyword]
    if quick:
        cmd.append("--benchmark-disable")
    return cmd + extra


NEIGHBOUR = ("import os, sys\n"
             "os.sched_setaffinity(0, {int(sys.argv[1])})\n"
             "while True:\n"
             "    sum(i * i for i in range(10000))\n")


def start_neighbour() -> subprocess.Popen:
    """A CPU-bound process pinned to the last usable core: the noisy neighbour."""
    core = max(os.sched_getaffinity(0))
    return subprocess.Popen([sys.executable, "-c", NEIGHBOUR, str(core)])


@contextlib.contextmanager
def neighbour(on: bool = True) -> Iterator[None]:
    """The noisy neighbour running for the block's duration (nothing when ``on`` is false)."""
    process = start_neighbour() if on else None
    try:
        yield
    finally:
        if process is not None:
            process.kill()
            process.wait()


def run_contender(contender: str, files: list[str], workdir: Path, keyword: str | None,
                  quick: bool, extra: list[str], timeout: float, noisy: bool = False) -> dict[str, Any]:
    stem = contender.replace(",", "+")
    json_path, meta_path = workdir / f"{stem}.json", workdir / f"{stem}.meta.json"
    cmd = pytest_command(contender, files, json_path, meta_path, keyword, quick, extra)
    print(f"[bench] {contender}: {shlex.join(cmd)}{' (noisy neighbour)' if noisy else ''}", flush=True)
    t = time.perf_counter()
    with neighbour(noisy):
        try:
            proc = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=timeout)
            returncode, stdout = proc.returncode, proc.stdout + proc.stderr
        except subprocess.TimeoutExpired as exc:
            returncode, stdout = "timeout", f"{exc}"
    seconds = time.perf_counter() - t
    summary = [ln for ln in stdout.splitlines() if re.search(r"\d+ (passed|failed|skipped|deselected|error)", ln)]
    print(f"[bench] {contender}: rc={returncode} in {seconds:.1f}s: {(summary or [''])[-1].strip()}", flush=True)
    return {"contender": contender, "command": shlex.join(cmd), "returncode": returncode,
            "seconds": round(seconds, 3), "output_tail": stdout[-4000:],
            "benchmark_json": _read_json(json_path), "meta": _read_json(meta_path)}


def _read_json(path: Path) -> Any:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None


def merge(runs: list[dict[str, Any]], coldstarts: list[dict[str, Any]], argv: list[str],
          driver_env: dict[str, Any]) -> dict[str, Any]:
    """One document: every timed benchmark (raw samples dropped) tagged with the process it
    ran in, each process's environment, skip reasons, and the cold-start figures."""
    processes = []
    for run in runs:
        bj = run.get("benchmark_json") or {}
        meta = run.get("meta") or {}
        processes.append({
            "contender": run["contender"], "command": run["command"],
            "returncode": run["returncode"], "seconds": run["seconds"],
            "environment": meta.get("environment") or bj.get("formula_env"),
            "machine_info": bj.get("machine_info"), "commit_info": bj.get("commit_info"),
            "skipped": meta.get("skipped", []), "failed": meta.get("failed", []),
            "passed": len(meta.get("passed", [])),
            "output_tail": run["output_tail"] if run["returncode"] not in (0, 5) else None})
    return {"schema": SCHEMA, "created": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
            "command": shlex.join([sys.executable, *argv]), "environment": driver_env,
            "processes": processes, "benchmarks": benchmarks_of(runs), "coldstart": coldstarts}


def benchmarks_of(runs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Every timed benchmark of these runs (raw samples dropped), tagged with its process."""
    benchmarks = []
    for run in runs:
        for bench in (run.get("benchmark_json") or {}).get("benchmarks", []):
            stats = {k: v for k, v in bench.get("stats", {}).items() if k != "data"}
            extra = bench.get("extra_info", {})
            benchmarks.append({"name": bench.get("name"), "fullname": bench.get("fullname"),
                               "group": bench.get("group"), "suite": extra.get("suite"),
                               "contender": extra.get("contender", run["contender"]),
                               "shared_process": "," in run["contender"],
                               "process": run["contender"], "extra_info": extra,
                               "options": bench.get("options"), "stats": stats})
    return benchmarks


def median_round(rounds: list[list[dict[str, Any]]]) -> list[dict[str, Any]]:
    """Per case and contender, the benchmark of the round whose median is the median of the
    rounds' (the lower one for an even count), with every round's median kept beside it: on
    a machine whose speed drifts, one pass per contender would credit whoever ran in a fast
    minute."""
    cases: dict[tuple, list[dict[str, Any]]] = {}
    for benches in rounds:
        for b in benches:
            if b["stats"].get("median") is not None:
                cases.setdefault((b["name"], b["contender"]), []).append(b)
    out = []
    for found in cases.values():
        ranked = sorted(found, key=lambda b: b["stats"]["median"])
        chosen = dict(ranked[(len(ranked) - 1) // 2])
        chosen["round_medians"] = [b["stats"]["median"] for b in found]
        out.append(chosen)
    return out


def parse_args(argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(description="Run each benchmark contender in its own process and merge the results.")
    p.add_argument("--contenders", default=",".join(CONTENDERS),
                   help=f"comma-separated, default all: {','.join(CONTENDERS)}")
    p.add_argument("--suites", default=",".join(DEFAULT_SUITES),
                   help=f"comma-separated of: {','.join(SUITES)} (default {','.join(DEFAULT_SUITES)})")
    p.add_argument("--noisy", action="store_true",
                   help="noisy neighbour: a CPU-bound process pinned to one core while each contender runs")
    p.add_argument("-k", dest="keyword", default=None, help='pytest -k expression, e.g. "not T32768"')
    p.add_argument("--quick", action="store_true", help="--benchmark-disable: each case once, checked")
    p.add_argument("--out", type=Path, default=None, help="merged JSON (default bench/results/run-<time>.json)")
    p.add_argument("--report", type=Path, default=None, help="also write the markdown report here")
    p.add_argument("--coldstart", default="cpu",
                   help="comma-separated backends for the cold/warm first-run step; 'none' to skip")
    p.add_argument("--coldstart-tokens", type=int, default=256)
    p.add_argument("--rss", action="store_true",
                   help="also measure each contender's peak RSS on the block at (4, 512), fresh process each")
    p.add_argument("--fresh", action="store_true",
                   help="train/remat suites: each contender's training step in a fresh process too "
                        "(peak RSS, time to the first step; bench/training.py fresh)")
    p.add_argument("--fresh-cold", action="store_true",
                   help="with --fresh: the runtime's first step with empty kernel caches, then warm")
    p.add_argument("--shared-process", action="store_true",
                   help="run all contenders in ONE process (only to show the interference it causes)")
    p.add_argument("--rounds", type=int, default=1,
                   help="run every contender this many times, rotating the order; report the median round")
    p.add_argument("--timeout", type=float, default=3600, help="seconds per contender process")
    p.add_argument("pytest_args", nargs="*", help="extra pytest arguments (after --)")
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    args = parse_args(argv)
    contenders = [c.strip() for c in args.contenders.split(",") if c.strip()]
    unknown = sorted(set(contenders) - set(CONTENDERS))
    suites = [s.strip() for s in args.suites.split(",") if s.strip()]
    if unknown or not set(suites) <= set(SUITES):
        print(f"unknown contenders {unknown} or suites {suites}", file=sys.stderr)
        return 2
    files = [SUITES[s] for s in suites]
    with tempfile.TemporaryDirectory(prefix="formula-bench-") as tmp:
        groups = [",".join(contenders)] if args.shared_process else contenders
        rounds = []
        for r in range(args.rounds):  # rotated, so no contender always runs first or last
            order = groups[r % len(groups):] + groups[:r % len(groups)]
            if args.rounds > 1:
                print(f"[bench] round {r + 1}/{args.rounds}: {', '.join(order)}", flush=True)
            by_name = {c: run_contender(c, files, Path(tmp), args.keyword, args.quick, args.pytest_args,
                                        args.timeout, args.noisy) for c in order}
            rounds.append([by_name[c] for c in groups])
    colds: list[dict[str, Any]] = []
    for backend in [] if args.coldstart == "none" else args.coldstart.split(","):
        print(f"[bench] cold/warm first run: {backend}, T={args.coldstart_tokens}", flush=True)
        colds.extend(coldstart.cold_and_warm(backend.strip(), args.coldstart_tokens))
    merged = merge(rounds[0], colds, [str(Path(__file__).relative_to(REPO)), *argv],
                   envinfo.collect(REPO))
    merged["noisy"] = args.noisy
    if args.rss:
        from bench import blocks

        print("[bench] peak RSS on the block at (4, 512)", flush=True)
        merged["peak_rss"] = blocks.peak_rss([c for c in contenders if c != "reference"])
    if args.fresh:
        from bench import training

        rows = training.fresh_rows(suites, contenders)
        print(f"[bench] training steps in fresh processes: {len(rows)}", flush=True)
        merged["training_fresh"] = training.fresh(rows, cold=args.fresh_cold, quick=args.quick)
    if len(rounds) > 1:
        merged["benchmarks"] = median_round([benchmarks_of(rs) for rs in rounds])
        merged["rounds"] = len(rounds)
    stamp = dt.datetime.now().strftime("%Y%m%d-%H%M%S")
    out = args.out or REPO / "bench" / "results" / f"run-{stamp}.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(merged, indent=1, default=str))
    print(f"[bench] merged results: {out}")
    if args.report:
        from bench import report

        args.report.write_text(report.render(merged, source=str(out)))
        print(f"[bench] report: {args.report}")
    bad = sorted({r["contender"] for rs in rounds for r in rs if r["returncode"] not in (0, 5)})  # 5: deselected
    bad += sorted({f"{r['contender']} (fresh {r['case']})" for r in merged.get("training_fresh", []) if r.get("error")})
    if bad:
        print(f"[bench] FAILED contenders: {bad}", file=sys.stderr)
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
