"""Background compiles that the process's exit waits for, and cancels where it can.

LLVM cannot be torn down while a thread is inside it: a process that ended (the end of a
script, ``sys.exit``, an uncaught exception) while a daemon thread compiled a plan or a driver
died with a segmentation fault or an LLVM assertion instead of its own exit status. Every
background compile of the runtime therefore runs in a :class:`Thread` of this module, and at
exit (an :mod:`atexit` handler, which runs before the interpreter finalizes):

- a thread not started yet never starts (:meth:`Thread.start` answers False);
- a Numba compilation about to begin in one of these threads raises :class:`Cancelled`
  instead (a listener of Numba's ``numba:compile`` event), so a plan stops between kernels;
- the compilation or disk-cache load in flight is waited for: the handler joins every thread.

The threads stay daemons so that the interpreter's wait for non-daemon threads, which comes
before the atexit handlers, does not wait for whole plans to compile.
"""
from __future__ import annotations

import atexit
import threading
from collections.abc import Callable
from typing import Any

_lock = threading.Lock()
_live: set[Thread] = set()  # started and not yet finished
_exiting = threading.Event()
_installed = False


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
            _live.add(self)
            try:
                super().start()
            except BaseException:
                _live.discard(self)
                raise
        return True

    def run(self) -> None:
        try:
            super().run()
        finally:
            with _lock:
                _live.discard(self)

    def join(self, timeout: float | None = None) -> None:
        if self.ident is None:  # (never started: refused at exit, nothing to wait for)
            return
        super().join(timeout)


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
    """Refuse new background compilations, then wait for the ones in flight."""
    _exiting.set()
    while True:
        with _lock:
            threads = [t for t in _live if t.is_alive()]
        if not threads:
            return
        for thread in threads:
            thread.join()
