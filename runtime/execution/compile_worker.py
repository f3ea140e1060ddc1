"""Compiling a plan's kernels in a process of its own, to fill the disk cache (``fill_cache``).

A tiered executable's first runs execute on the ``reference`` kernels while the compiled ones
build. Built in a thread of the caller's process, the compile holds the GIL through Numba's
typing and lowering, and every first-tier run beside it waited for the GIL at each NumPy call
(the seed at T=4096: 2.7x NumPy's time, against 1.4x with nothing compiling). So the kernels are
compiled by a worker process (``runtime.execution.compile_worker_main``) at a lower
priority; the tier's thread waits for it without the GIL, then loads the plan from the disk
cache, which holds the GIL for a few hundred milliseconds instead of seconds.

The worker rebuilds what the caller has from the program alone: the default registry (the
built-in plugins and the entry points: ``Registry.reproducible``), the same extents, float
dtypes and resident banks, and random values of those types. It only warms the cache: when it
fails for any reason the thread compiles in the caller's process as before, and that compile
raises the error, with its cause, as a run's error.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Mapping
from pathlib import Path

from runtime.execution import background

# a worker makes random values as large as the run's: above this it would double the memory a
# large run takes, and the compile stays in the caller's process
WORKER_MAX_BYTES = 1 << 30


# The worker's first lines: its priority is lowered before it imports anything (its imports
# alone take a core for a third of a second). Started from a niced thread, it may be niced
# already; it never raises its priority.
_BOOTSTRAP = """
import os, sys
nice = int(sys.argv[1])
if nice and hasattr(os, "setpriority"):
    try:
        os.setpriority(os.PRIO_PROCESS, 0, max(nice, os.getpriority(os.PRIO_PROCESS, 0)))
    except OSError:
        pass
import runpy
runpy.run_module("runtime.execution.compile_worker_main", run_name="__main__")
"""


def fill_cache(exe, dims: Mapping[str, int], dtypes: Mapping[str, str] | str, resident: bool = False) -> None:
    """Compile (or load) every kernel of ``exe``'s plan for these extents and float dtypes (a
    dtype per ``floating`` binding, or one for all), in every variant a later extent may take,
    with its drivers, by running it on random values; the plan is then marked ready in the
    cache. ``resident``: its banks as ``exe.load_banks`` keeps them."""
    from runtime.core.types import numpy_dtype
    from runtime.execution.compiled import DRIVER_AFTER_RUNS
    from runtime.execution.values import random_values

    inputs, banks = random_values(exe.program, dict(dims), memory_limit=exe.memory_limit)
    for b in exe.program.bindings:
        if b.value_type.dtype == "floating":
            values = inputs if b.name in inputs else banks
            values[b.name] = values[b.name].astype(numpy_dtype(dtypes if isinstance(dtypes, str) else dtypes[b.name]))
    run_banks = exe.load_banks(banks) if resident else banks
    for _ in range(DRIVER_AFTER_RUNS):  # the first compiles the kernels, the last starts the compiled drivers
        exe.run(inputs=inputs, banks=run_banks)
    exe.warm()  # (after waiting for the drivers) the variants other extents take, and the ready mark


def fill_in_worker(program, backend: str, memory_limit: int | None, dims: Mapping[str, int],
                   dtypes: Mapping[str, str], resident: bool, nbytes: int, nice: int) -> bool:
    """``fill_cache`` in a worker process ``nice`` steps below this one; waits for it (without
    the GIL) and answers whether it filled the cache. False at once when it cannot run here (no
    interpreter to start, values over ``WORKER_MAX_BYTES``, the process exiting). At exit the
    worker is terminated (``background``)."""
    if not sys.executable or nbytes > WORKER_MAX_BYTES:
        return False
    request = json.dumps({"program": program.to_json(indent=None), "backend": backend,
                          "memory_limit": memory_limit, "dims": dict(dims), "dtypes": dict(dtypes),
                          "resident": resident}).encode()
    env = dict(os.environ)
    root = str(Path(__file__).resolve().parents[2])  # (the runtime a script put on sys.path itself)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (root, env.get("PYTHONPATH")) if p)
    try:
        proc = subprocess.Popen([sys.executable, "-c", _BOOTSTRAP, str(min(19, _nice_of_main() + nice) if nice else 0)],
                                stdin=subprocess.PIPE, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                                env=env, close_fds=True)
    except OSError:
        return False
    if not background.track(proc):  # the process began to exit: terminated
        return False
    try:
        proc.stdin.write(request)
        proc.stdin.close()
        return proc.wait() == 0 and not background.exiting()
    except OSError:  # (a worker that died before reading its request)
        proc.kill()
        proc.wait()
        return False
    finally:
        background.untrack(proc)


def _nice_of_main() -> int:
    """This process's nice value (its main thread's: a background thread's own may be higher)."""
    try:
        return os.getpriority(os.PRIO_PROCESS, os.getpid())
    except (AttributeError, OSError):
        return 0
