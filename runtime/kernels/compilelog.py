"""Compile feedback: every kernel Numba compiles (a cache miss) is logged on the
``runtime.compile`` logger, INFO when it starts and DEBUG with its duration when it ends.

A compiled function that calls others compiles them inside its own compilation; only the
outermost one of each thread is logged, so one line stands for one kernel a user waits on.
Loading from the on-disk cache triggers no event: a warm run logs nothing.

:func:`counts` counts those outermost compilations per process (a counter, not a timing: the
tests that a new extent of a symbolic axis compiles nothing read it).
"""
from __future__ import annotations

import logging
import threading
import time

log = logging.getLogger("runtime.compile")

_installed = False
_install_lock = threading.Lock()
_counts: dict[str, int] = {}  # module.qualname -> outermost compilations in this process
_counts_lock = threading.Lock()


def counts() -> dict[str, int]:
    """A snapshot of the outermost compilations so far, per ``module.qualname`` (installs the
    listener, so it counts from the first call on)."""
    install()
    with _counts_lock:
        return dict(_counts)


def total() -> int:
    """How many outermost compilations this process has made since the listener was installed."""
    return sum(counts().values())


_loads: dict[str, int] = {}  # Numba cache entries loaded from disk, per function name


def note_loaded(name: str) -> None:
    """Count a specialisation loaded from the disk cache (``codegen.heal_numba_cache`` calls it)."""
    with _counts_lock:
        _loads[name] = _loads.get(name, 0) + 1


def specialisations() -> int:
    """Compilations plus disk-cache loads so far: every machine-code specialisation this
    process has made, whether the cache was warm or not (what a new extent must not add)."""
    install()
    with _counts_lock:
        return sum(_counts.values()) + sum(_loads.values())


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
                    name = _name(ev)
                    with _counts_lock:
                        _counts[name] = _counts.get(name, 0) + 1
                    log.info("compiling %s", name)

            def on_end(self, ev):
                self.local.depth -= 1
                if self.local.depth == 0:
                    log.debug("compiled %s in %.2f s", _name(ev),
                              time.perf_counter() - self.local.started)

        event.register("numba:compile", _Listener())
        _installed = True
