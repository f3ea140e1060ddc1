"""Background compiles that the process's exit waits for, and cancels where it can.

LLVM cannot be torn down while a thread is inside it: a process that ended (the end of a
script, ``sys.exit``, an uncaught exception) while a daemon thread compiled a plan or a driver
died with a segmentation fault or an LLVM assertion instead of its own exit status. Every
background compile of the runtime therefore runs in a :class:`Thread` of this module, and at
exit (an :mod:`atexit` handler, which runs before the interpreter finalizes):

- a thread not started yet never starts (:meth:`Thread.start` answers False);
- a Numba compilation about to begin in one of these threads raises :class:`Cancelled`
  instead (a listener of Numba's ``numba:compile`` event), so a plan stops between kernels;
- the compilation or disk-cache load in flight is waited for: the handler joins every thread;
- a compile worker process (``runtime.execution.compile_worker``) is terminated: its thread,
  which waits for it, then ends without loading anything.

The threads stay daemons so that the interpreter's wait for non-daemon threads, which comes
before the atexit handlers, does not wait for whole plans to compile.

They also run at a lower priority than the runs they serve (Linux: the thread's own nice
value, ``FORMULA_COMPILE_NICE`` steps above the caller's, 10 by default, 0 to leave it): on a
machine whose cores the runs fill, a compile then takes the time they leave instead of a core
of theirs. Numba's worker threads are started by the caller first, so that no pool is
created, with the lower priority, by a background thread and shared with the runs. And while
they run the interpreter switches threads every SWITCH_INTERVAL at most, so that a run's
Python steps do not wait 5 ms each for the GIL a compile holds, and full garbage collections
(each one holds the GIL) come a tenth as often; the last thread to end collects once.
"""
from __future__ import annotations

import atexit
import gc
import os
import sys
import threading
from collections.abc import Callable
from typing import Any

from runtime.core import settings

_lock = threading.Lock()
_live: set[Thread] = set()  # started and not yet finished
# While any of them runs, the interpreter's switch interval is at most this (seconds): a
# compile holds the GIL through most of Numba's typing and lowering, and at the default 5 ms
# each NumPy call of a run beside it (the first tier's) waited up to that for the GIL
SWITCH_INTERVAL = 0.0005
_saved_interval: list[float] = []  # the caller's interval while it is lowered (and what it was set to)
# ... and the garbage collector's third threshold is at least this: a compile makes long-lived
# objects fast, and each full collection holds the GIL (a first-tier run beside it waits);
# docs/performance.md, tuning log: bench/lab/compile_gc.py
GC_GEN2_THRESHOLD = 100
_saved_gc: list[tuple[int, ...]] = []  # the caller's thresholds while raised (and what they were set to)
_exiting = threading.Event()
_installed = False
_workers: set[Any] = set()  # compile worker processes (subprocess.Popen) a thread waits for


class Cancelled(Exception):
    """A background compilation refused because the process is exiting."""


def exiting() -> bool:
    """Whether the process has begun to exit (background work is then being cancelled)."""
    return _exiting.is_set()


class Thread(threading.Thread):
    """A daemon thread for background compiles, waited for at exit (see the module)."""

    def __init__(self, target: Callable[..., Any], name: str, args: tuple = ()):
        super().__init__(target=target, name=name, args=args, daemon=True)

    def start(self) -> bool:  # type: ignore[override]
        """Start, unless the process is exiting: then nothing runs and the answer is False."""
        with _lock:
            if _exiting.is_set():
                return False
            _install()
            if compile_nice():
                import numba

                numba.get_num_threads()  # (starts Numba's worker threads here, if not yet: see the module)
            _live.add(self)
            _shorter_switches()
            try:
                super().start()
            except BaseException:
                _live.discard(self)
                _restore_switches()
                raise
        return True

    def run(self) -> None:
        try:
            _lower_priority(compile_nice())
            super().run()
        finally:
            with _lock:
                _live.discard(self)
                collect = _restore_switches()
            if collect and not _exiting.is_set() and full_collection_due():
                gc.collect()  # (here, at this thread's priority, rather than in the next run)

    def join(self, timeout: float | None = None) -> None:
        if self.ident is None:  # (never started: refused at exit, nothing to wait for)
            return
        super().join(timeout)


def track(process) -> bool:
    """Count a worker process (a ``subprocess.Popen``) as background work: the exit terminates
    it rather than wait for it. False when the process has begun to exit (it is then terminated
    here)."""
    with _lock:
        if not _exiting.is_set():
            _workers.add(process)
            return True
    _terminate(process)
    return False


def untrack(process) -> None:
    with _lock:
        _workers.discard(process)


def _terminate(process) -> None:
    try:
        process.terminate()
    except OSError:  # (already gone)
        pass


def compile_nice() -> int:
    """How many nice steps background compiles run below their caller (``FORMULA_COMPILE_NICE``,
    runtime.core.settings; 0 leaves them at the caller's priority); 0 where a thread's priority
    cannot be set alone (not Linux)."""
    if not sys.platform.startswith("linux"):
        return 0
    return max(0, min(19, settings.COMPILE_NICE.read()))


def _shorter_switches() -> None:
    """The switch interval at most SWITCH_INTERVAL, and full collections rarer, while background
    threads live (under ``_lock``)."""
    if not _saved_interval:
        current = sys.getswitchinterval()
        if current > SWITCH_INTERVAL:
            sys.setswitchinterval(SWITCH_INTERVAL)
            _saved_interval.extend((current, sys.getswitchinterval()))
    if not _saved_gc:
        current_gc = gc.get_threshold()
        if current_gc[0] and current_gc[2] < GC_GEN2_THRESHOLD:  # (0: the caller disabled collection)
            gc.set_threshold(current_gc[0], current_gc[1], GC_GEN2_THRESHOLD)
            _saved_gc.extend((current_gc, gc.get_threshold()))


def _restore_switches() -> bool:
    """The caller's interval and thresholds back once no background thread lives (under
    ``_lock``), unless someone changed them meanwhile. Returns whether thresholds came back
    (the garbage the compiles left is then collected by the last thread, not by a run)."""
    if _live:
        return False
    if _saved_interval:
        saved, ours = _saved_interval
        _saved_interval.clear()
        if sys.getswitchinterval() == ours:
            sys.setswitchinterval(saved)
    if _saved_gc:
        saved_gc, ours_gc = _saved_gc
        _saved_gc.clear()
        if gc.get_threshold() == ours_gc:
            gc.set_threshold(*saved_gc)
            return True
    return False


def full_collection_due() -> bool:
    """Whether the collector's next pass would be a full one at the thresholds in force: more
    gen-1 passes since the last full one than the third threshold allows. A short background
    thread (a plan of a new extent building its driver) leaves none due, and a full collection
    after it held the GIL for ~50 ms of the run beside it for nothing."""
    return gc.get_count()[2] > gc.get_threshold()[2]


def _lower_priority(steps: int) -> None:
    """This thread's nice value ``steps`` above its current one (Linux: per thread)."""
    if not steps:
        return
    tid = threading.get_native_id()
    try:
        os.setpriority(os.PRIO_PROCESS, tid, min(19, os.getpriority(os.PRIO_PROCESS, tid) + steps))
    except OSError:  # (a sandbox that refuses it: the compile runs at the caller's priority)
        pass


def _install() -> None:
    """The exit handler and the compile-event listener, once (under ``_lock``). Registered
    after Numba is imported, so the handler runs before Numba's and llvmlite's own."""
    global _installed
    if _installed:
        return
    from numba.core import event

    class _Refuse(event.Listener):
        def on_start(self, ev):
            if _exiting.is_set() and isinstance(threading.current_thread(), Thread):
                raise Cancelled("the process is exiting: background compilation cancelled")

        def on_end(self, ev):
            pass

    event.register("numba:compile", _Refuse())
    atexit.register(_at_exit)
    _installed = True


def _at_exit() -> None:
    """Refuse new background compilations, terminate the worker processes (their threads then
    end), then wait for the compilations in flight."""
    _exiting.set()
    with _lock:
        workers = list(_workers)
    for process in workers:
        _terminate(process)
    while True:
        with _lock:
            threads = [t for t in _live if t.is_alive()]
        if not threads:
            return
        for thread in threads:
            thread.join()
