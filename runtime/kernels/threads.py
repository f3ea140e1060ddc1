"""Numba's worker threads pinned one per CPU, as ONNX Runtime pins its intra-op threads by
default, when ``FORMULA_PIN_THREADS=1``: the calling thread stays free, worker ``t`` is bound
to the ``t``-th CPU of the process's affinity mask.

Why: on a machine whose cores the process fills, a busy core (a noisy neighbour) leaves
three runnable threads on two cores, and the scheduler has no better placement to move to
once two of them share a core: unpinned, both of ours sometimes share one while the
neighbour has the other to itself, which halves our speed for the whole run; pinned, one of
ours always has a core alone. Off by default: in the benchmark harness's quiet seed runs,
pinned threads once ran 1.6× slower in three processes of six, and later ran a little slower
in four alternating pairs of five, for a reason not found yet (docs/performance.md).

``FORMULA_PIN_THREADS``: ``0`` (the default) or ``1`` (pin when Numba has more than one
thread). Only Linux, and only Numba's ``omp`` and ``workqueue`` layers, whose worker threads
persist (OpenMP keeps one team per calling thread, so each thread that runs kernels pins its
own team, once).
"""
from __future__ import annotations

import logging
import os
import threading

import numpy as np
from llvmlite import ir
from numba import get_num_threads, get_thread_id, njit, prange, threading_layer, types
from numba.core import cgutils
from numba.extending import intrinsic

from runtime.core import settings

log = logging.getLogger(__name__)

ENV = settings.PIN_THREADS.name
# Runs of a thread before it pins its team: by then the team exists and the helper below
# loads from the cache in milliseconds (a one-shot run never waits for it).
PIN_AFTER_RUNS = 3
_done = threading.local()  # per calling thread: runs seen, and whether its team was pinned


@intrinsic
def _gettid(typingctx):
    """The kernel thread id (glibc's ``gettid``), by symbol: cached code stays valid."""
    def codegen(context, builder, signature, args):
        fn = cgutils.get_or_insert_function(builder.module, ir.FunctionType(ir.IntType(32), []), "gettid")
        return builder.sext(builder.call(fn, []), ir.IntType(64))
    return types.int64(), codegen


@njit(parallel=True, cache=True, nogil=True)
def _team_tids(out):
    """``out[t]``: the thread id of Numba's thread ``t``, for each thread that ran a task."""
    for i in prange(out.size):
        out[get_thread_id()] = _gettid()


def setting() -> str:
    """``FORMULA_PIN_THREADS``, checked (an unknown value pins nothing, with a warning)."""
    return "1" if settings.PIN_THREADS.read() else "0"


def on_run() -> None:
    """Count a run on this thread; its PIN_AFTER_RUNS-th pins the thread's team."""
    runs = getattr(_done, "runs", 0)
    if runs < PIN_AFTER_RUNS:  # (then nothing more to count)
        _done.runs = runs + 1
        if runs + 1 == PIN_AFTER_RUNS:
            pin_workers()


def pin_workers() -> bool:
    """Pin this thread's team of Numba workers (not this thread) once; whether it pinned."""
    if getattr(_done, "pinned", None) is not None:
        return _done.pinned
    _done.pinned = False
    if setting() == "0" or not hasattr(os, "sched_setaffinity"):
        return False
    cores = sorted(os.sched_getaffinity(0))
    threads = get_num_threads()
    if threads < 2:
        return False
    try:
        tids = _worker_tids(threads)
        if threading_layer() not in ("omp", "workqueue"):
            return False
        for t, tid in enumerate(tids):
            if t > 0 and tid > 0:
                os.sched_setaffinity(int(tid), {cores[t % len(cores)]})
    except Exception as exc:  # (no gettid symbol, a thread gone, a mask refused): run unpinned
        log.info("Numba's worker threads are not pinned (%s: %s)", type(exc).__name__, exc)
        return False
    _done.pinned = True
    log.debug("pinned Numba's worker threads %s, one per CPU of %s", tids[1:].tolist(), cores)
    return True


def _worker_tids(threads: int) -> np.ndarray:
    """Thread ids of this thread's team, slot ``t`` for Numba's thread ``t`` (a task loop
    need not give every thread a task, so it runs again until each slot is filled)."""
    tids = np.zeros(threads, np.int64)
    for _ in range(20):
        seen = np.zeros(threads, np.int64)
        _team_tids(seen)
        tids = np.where(seen > 0, seen, tids)
        if np.all(tids[1:] > 0):
            break
    return tids
