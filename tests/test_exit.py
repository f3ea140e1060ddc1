"""A process that ends while kernels or drivers compile in the background exits with its own
status (the end of ``main``, ``sys.exit(3)``, an uncaught exception), never a segmentation
fault or an LLVM abort: each case is a fresh interpreter on an empty cache, ended at a point
where a background compilation is pending, starting or inside LLVM (issue 36, item 1)."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

# PROGRAM: "small" (two kernels that compile in about a second: a fused silu, a row sum) or
# "seed" (T=64); WHEN: where the script ends. "first": right after the first (tiered, so
# reference) run, its compile thread just started; "compiling": AFTER seconds into the LLVM
# optimisation of a kernel in that thread; "driver-start": right after the run that starts the
# driver's build (untiered); "driver": AFTER seconds into the driver's LLVM optimisation;
# "worker": AFTER seconds after the compile worker process started (the "compiling" cases
# compile in-process: FORMULA_COMPILE_WORKER=0). Each driver is new (its source stamped at
# random), so even a warm kernel cache compiles one.
SCRIPT = r"""
import os, sys, threading, time, uuid
import numpy as np
from numba.core.codegen import CPUCodeLibrary
import runtime
from runtime.execution import driver
from runtime.execution.compiled import DRIVER_AFTER_RUNS

driver.sources_stamp = lambda modules: uuid.uuid4().hex

def program():
    if os.environ["PROGRAM"] == "seed":
        from bench import programs
        data = programs.seed_data(64, "float32")
        return programs.seed_program("float32"), data["inputs"], data["banks"]
    from runtime.build import ProgramBuilder
    b = ProgramBuilder()
    x = b.input("x", {"T": "T", "D": 32})
    y = b.op("scalar-map", [x], {"mode": "silu"})
    z = b.op("reduce@2", [y], {"axis": "D", "mode": "sum", "accumulation_dtype": "float32"})
    return b.build(outputs=[z]), {"x": np.ones((16, 32), np.float32)}, None

# the library whose LLVM optimisation a thread other than this one last entered
entered = {"name": None}
_optimize = CPUCodeLibrary._optimize_final_module

def _optimize_final_module(self):
    if threading.current_thread() is not threading.main_thread():
        entered["name"] = self.name
    return _optimize(self)

CPUCodeLibrary._optimize_final_module = _optimize_final_module

def wait_for(library):
    deadline = time.monotonic() + 300
    while entered["name"] != library:
        time.sleep(0.001)
        assert time.monotonic() < deadline, f"no background compilation of {library!r} reached LLVM"
    time.sleep(float(os.environ.get("AFTER", "0")))

def main():
    when, tiered = os.environ["WHEN"], os.environ["WHEN"] in ("first", "compiling", "worker")
    doc, inputs, banks = program()
    exe = runtime.compile(doc, "cpu", tiered=tiered)
    for _ in range(1 if tiered else int(os.environ.get("RUNS", DRIVER_AFTER_RUNS))):
        result = exe.run(inputs=inputs, banks=banks)
    assert result.tier == ("reference" if tiered else "cpu"), result.tier
    if when in ("compiling", "driver"):
        wait_for("kernel" if when == "compiling" else "driver")
    if when == "worker":
        from runtime.execution import background
        deadline = time.monotonic() + 60
        while not background._workers:
            time.sleep(0.001)
            assert time.monotonic() < deadline, "no compile worker started"
        print("worker", next(iter(background._workers)).pid, flush=True)
        time.sleep(float(os.environ.get("AFTER", "0")))
    print("ran", flush=True)
    how = os.environ["HOW"]
    if how == "exit":
        sys.exit(3)
    if how == "raise":
        raise RuntimeError("the script's own error")

main()
"""

EXPECTED = {"end": 0, "exit": 3, "raise": 1}


def _run(cache: Path, program: str, when: str, how: str, **env: str) -> subprocess.CompletedProcess:
    cache.mkdir(mode=0o700, parents=True, exist_ok=True)
    full = {k: v for k, v in os.environ.items() if k not in ("NUMBA_CACHE_DIR", "FORMULA_TIERED")}
    full.update(FORMULA_CACHE_DIR=str(cache), PYTHONPATH=str(ROOT), PROGRAM=program, WHEN=when, HOW=how, **env)
    return subprocess.run([sys.executable, "-c", SCRIPT], env=full, cwd=ROOT, capture_output=True,
                          text=True, timeout=600)


def _check(done: subprocess.CompletedProcess, how: str) -> None:
    assert done.returncode == EXPECTED[how], \
        f"exit status {done.returncode}, expected {EXPECTED[how]}\n{done.stdout}\n{done.stderr[-3000:]}"
    assert done.stdout.splitlines()[-1:] == ["ran"]
    if how == "raise":
        assert done.stderr.rstrip().endswith("RuntimeError: the script's own error"), done.stderr[-3000:]
    else:
        assert "Traceback" not in done.stderr, done.stderr[-3000:]
    assert "compiled driver failed" not in done.stderr  # (a cancelled build is no failure)


@pytest.mark.parametrize("when, how", [
    ("first", "end"), ("compiling", "exit"), ("compiling", "raise"),
    ("driver-start", "end"), ("driver", "end"), ("driver", "exit"), ("driver", "raise"),
])
def test_an_exit_on_an_empty_cache_keeps_its_status(tmp_path, when, how):
    _check(_run(tmp_path / "cache", "small", when, how, AFTER="0.05", FORMULA_COMPILE_WORKER="0"), how)


@pytest.mark.parametrize("after, how", [("0", "end"), ("0.5", "exit"), ("1.5", "raise")])
def test_an_exit_while_the_compile_worker_runs_keeps_its_status_and_ends_the_worker(tmp_path, after, how):
    done = _run(tmp_path / "cache", "small", "worker", how, AFTER=after, FORMULA_COMPILE_WORKER="1")
    _check(done, how)
    pid = int(next(line for line in done.stdout.splitlines() if line.startswith("worker ")).split()[1])
    with pytest.raises(ProcessLookupError):  # terminated and reaped at the script's exit
        os.kill(pid, 0)


@pytest.fixture(scope="module")
def seed_kernels(tmp_path_factory) -> Path:
    """A cache holding the seed's kernels (its drivers are new in every script)."""
    cache = tmp_path_factory.mktemp("exit") / "cache"
    _check(_run(cache, "seed", "driver-start", "end", RUNS="1"), "end")
    return cache


@pytest.mark.slow  # (CI runs the slow set after the suite: README)
@pytest.mark.parametrize("after, how", [("0.1", "end"), ("0.3", "exit"), ("0.5", "raise"), ("0.2", "end")])
def test_an_exit_while_the_seed_driver_compiles_keeps_its_status(seed_kernels, after, how):
    """Ended a moment into LLVM's optimisation of the seed's driver, a process crashed at
    exit 6 times out of 6 (segmentation fault or LLVM assertion) before the exit waited."""
    _check(_run(seed_kernels, "seed", "driver", how, AFTER=after), how)


@pytest.mark.slow
@pytest.mark.parametrize("when", ["compiling", "driver"])
def test_the_seed_on_an_empty_cache_exits_cleanly_while_compiling(tmp_path, when):
    for after in ("0.1", "0.4"):  # (each a fresh empty cache)
        _check(_run(tmp_path / after, "seed", when, "end", AFTER=after), "end")


def test_the_exit_terminates_the_compile_worker_instead_of_waiting_for_it(tmp_path):
    """The seed's kernels take the worker seconds to compile: a script that ends 0.3 s after the
    worker started leaves no plan marked ready in the cache (waiting for the worker would)."""
    done = _run(tmp_path / "cache", "seed", "worker", "end", AFTER="0.3", FORMULA_COMPILE_WORKER="1")
    _check(done, "end")
    ready = tmp_path / "cache" / "ready"
    assert not (ready.is_dir() and any(ready.iterdir())), sorted(ready.iterdir())
