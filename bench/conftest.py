"""Benchmark-session plumbing: contender selection, skip bookkeeping, environment capture.

Unlike tests/conftest.py this does NOT switch on the CUDA simulator: simulated timings mean
nothing, so the cuda contender runs only on a real GPU and is skipped otherwise.

``--bench-contenders=numpy,cpu`` keeps only those contenders (bench/run.py starts one
process per contender this way). ``--bench-meta=PATH`` writes, at the end of the session,
the process's environment (thread pools actually loaded, numba threading layer, versions)
and every skip with its reason; pytest-benchmark's own JSON is not written when nothing was
timed, so the driver relies on this file for those facts.
"""
from __future__ import annotations

import json
import os
import time
from pathlib import Path

# Benchmarks time the compiled kernels: no reference tier while they compile.
os.environ.setdefault("FORMULA_TIERED", "0")

import pytest

from bench import envinfo
from bench.contenders import CONTENDERS

REPO = Path(__file__).resolve().parent.parent
_records: dict[str, list] = {"skipped": [], "failed": [], "passed": []}


def pytest_addoption(parser):
    group = parser.getgroup("formula-bench")
    group.addoption("--bench-contenders", default=None,
                    help=f"comma-separated contenders to keep (of {', '.join(CONTENDERS)})")
    group.addoption("--bench-meta", default=None,
                    help="write this process's environment and skip reasons to this JSON file")


def pytest_configure(config):
    wanted = config.getoption("--bench-contenders")
    if wanted:
        names = [n.strip() for n in wanted.split(",") if n.strip()]
        unknown = sorted(set(names) - set(CONTENDERS))
        if unknown:
            raise pytest.UsageError(f"--bench-contenders: unknown {unknown}; known: {list(CONTENDERS)}")
    config._formula_started = time.time()


def contender_of(item) -> str | None:
    callspec = getattr(item, "callspec", None)
    if callspec is None:
        return None
    case = callspec.params.get("case")
    return getattr(case, "contender", callspec.params.get("contender"))


def pytest_collection_modifyitems(config, items):
    wanted = config.getoption("--bench-contenders")
    if not wanted:
        return
    keep = {n.strip() for n in wanted.split(",")}
    selected, deselected = [], []
    for item in items:
        (selected if contender_of(item) in keep else deselected).append(item)
    if deselected:
        config.hook.pytest_deselected(items=deselected)
        items[:] = selected


def pytest_runtest_logreport(report):
    if report.skipped:
        reason = report.longrepr[2] if isinstance(report.longrepr, tuple) else str(report.longrepr)
        _records["skipped"].append({"nodeid": report.nodeid, "reason": reason})
    elif report.failed:
        _records["failed"].append({"nodeid": report.nodeid, "when": report.when})
    elif report.when == "call":
        _records["passed"].append(report.nodeid)


def pytest_benchmark_update_json(config, benchmarks, output_json):
    output_json["formula_env"] = envinfo.collect(REPO)


def pytest_sessionfinish(session, exitstatus):
    path = session.config.getoption("--bench-meta")
    if not path:
        return
    meta = {"exitstatus": int(exitstatus),
            "seconds": round(time.time() - session.config._formula_started, 3),
            "contenders": session.config.getoption("--bench-contenders"),
            "environment": envinfo.collect(REPO), **_records}
    Path(path).write_text(json.dumps(meta, indent=2, default=str))
