"""Compile feedback: every kernel Numba compiles (a cache miss) is logged on the
``runtime.compile`` logger, INFO when it starts and DEBUG with its duration when it ends.

A compiled function that calls others compiles them inside its own compilation; only the
outermost one of each thread is logged, so one line stands for one kernel a user waits on.
Loading from the on-disk cache triggers no event: a warm run logs nothing.
"""
from __future__ import annotations

import logging
import threading
import time

log = logging.getLogger("runtime.compile")

_installed = False
_install_lock = threading.Lock()


def _name(event) -> str:
    """``module.qualname`` of the function compiling (generated kernels share short names)."""
    dispatcher = (event.data or {}).get("dispatcher")
    func = getattr(dispatcher, "py_func", dispatcher)
    name = getattr(func, "__qualname__", None) or getattr(func, "__name__", "function")
    module = getattr(func, "__module__", None)
    return f"{module}.{name}" if module else name


def install() -> None:
    """Register the Numba compile-event listener once per process (imports numba)."""
    global _installed
    if _installed:
        return
    with _install_lock:
        if _installed:
            return
        from numba.core import event

        class _Listener(event.Listener):
            def __init__(self):
                self.local = threading.local()

            def on_start(self, ev):
                depth = getattr(self.local, "depth", 0)
                self.local.depth = depth + 1
                if depth == 0:
                    self.local.started = time.perf_counter()
                    log.info("compiling %s", _name(ev))

            def on_end(self, ev):
                self.local.depth -= 1
                if self.local.depth == 0:
                    log.debug("compiled %s in %.2f s", _name(ev),
                              time.perf_counter() - self.local.started)

        event.register("numba:compile", _Listener())
        _installed = True
