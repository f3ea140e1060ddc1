"""Numba's worker threads pinned one per core (runtime.kernels.threads), in fresh processes:
the setting is read, and the threads are created, once per process."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]

pytestmark = pytest.mark.skipif(not hasattr(os, "sched_getaffinity") or len(os.sched_getaffinity(0)) < 2,
                                reason="pinning needs Linux and two usable CPUs")

# Runs a one-instruction program on cpu `runs` times, then reports each thread's CPUs.
CHILD = r"""
import json, os, sys
os.sched_setaffinity(0, json.loads(sys.argv[2]))  # two CPUs, before any thread starts
import numpy as np
import runtime
from bench.programs import Builder
from runtime.kernels import threads

b = Builder("float32")
x = b.input("x", {"T": 512, "D": 512})
y = b.op("scalar-map", [x], {"mode": "silu"}, {"T": 512, "D": 512})
exe = runtime.compile(b.build([y]), "cpu", tiered=False)
v = np.random.default_rng(0).standard_normal((512, 512), np.float32)
for _ in range(int(sys.argv[1])):
    exe.run(inputs={"x": v})
tasks = sorted(int(t) for t in os.listdir("/proc/self/task"))
print(json.dumps({"main": sorted(os.sched_getaffinity(0)), "threads": {str(t): sorted(os.sched_getaffinity(t)) for t in tasks},
                  "pinned": getattr(threads._done, "pinned", None)}))
"""


def _child(runs: int, **env: str) -> dict:
    cpus = sorted(os.sched_getaffinity(0))[:2]
    full = {k: v for k, v in os.environ.items() if k != "FORMULA_PIN_THREADS"}
    full.update({"NUMBA_NUM_THREADS": "2", "NUMBA_THREADING_LAYER": "omp", **env})
    out = subprocess.run([sys.executable, "-c", CHILD, str(runs), json.dumps(cpus)],
                         cwd=REPO, env=full, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    return json.loads(out.stdout.strip().splitlines()[-1])


def _single_cpu_threads(report: dict) -> list[int]:
    return [int(t) for t, cpus in report["threads"].items() if len(cpus) == 1]


def test_workers_are_pinned_one_per_cpu_when_asked():
    report = _child(3, FORMULA_PIN_THREADS="1")
    assert report["pinned"] is True
    pinned = _single_cpu_threads(report)
    assert len(pinned) == 1 and report["threads"][str(pinned[0])] == [sorted(report["main"])[1]]
    assert len(report["main"]) == 2  # the calling thread stays free


def test_no_pinning_by_default_before_the_third_run_nor_with_one_thread():
    default = _child(3)
    assert default["pinned"] is False and _single_cpu_threads(default) == []
    assert _single_cpu_threads(_child(2, FORMULA_PIN_THREADS="1")) == []
    one = _child(3, FORMULA_PIN_THREADS="1", NUMBA_NUM_THREADS="1")
    assert one["pinned"] is False and _single_cpu_threads(one) == []


def test_an_unknown_setting_pins_nothing_and_says_so(caplog):
    import logging

    from runtime.kernels import threads

    os.environ["FORMULA_PIN_THREADS"] = "sometimes"
    try:
        with caplog.at_level(logging.WARNING, logger=threads.__name__):
            assert threads.setting() == "0"
    finally:
        del os.environ["FORMULA_PIN_THREADS"]
    assert "FORMULA_PIN_THREADS='sometimes'" in caplog.text
