"""Compile feedback: every kernel Numba compiles (a cache miss) is logged on the
``runtime.compile`` logger, INFO when it starts and DEBUG with its duration when it ends.

A compiled function that calls others compiles them inside its own compilation; only the
outermost one of each thread is logged, so one line stands for one kernel a user waits on.
Loading from the on-disk cache triggers no event: a warm run logs nothing.

:func:`counts` counts those outermost compilations per process (a counter, not a timing: the
tests that a new extent of a symbolic axis compiles nothing read it). :func:`compile_feedback`
says on a stream (the ``formula`` command's stderr) that kernels are compiling.
"""
from __future__ import annotations

import contextlib
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


class CompileNotice(logging.Handler):
    """Says on ``stream`` that kernels are compiling (a cache miss, logged on
    ``runtime.compile``): one line when the first starts (naming the cache, ``where()``), a live
    count on a terminal, a total when done (:meth:`finish`)."""

    def __init__(self, stream, where=None):
        super().__init__(logging.INFO)
        self.stream = stream
        self.where = where
        self.tty = bool(getattr(stream, "isatty", lambda: False)())
        self.count = 0
        self.started: float | None = None

    def emit(self, record: logging.LogRecord) -> None:
        if record.levelno != logging.INFO or record.threadName == "formula-compile":
            return  # (a tiered run's background compilation: nobody waits for it)
        self.count += 1
        if self.started is None:
            self.started = time.perf_counter()
            cached = f"; cached in {self.where()}" if self.where is not None else ""
            print(f"compiling kernels (first use of these shapes{cached})…", file=self.stream, flush=True)
        if self.tty:
            line = f"  {self.count} compiled, {time.perf_counter() - self.started:.0f} s: {record.getMessage()}"
            self.stream.write("\r" + line[:99].ljust(99))
            self.stream.flush()

    def finish(self) -> None:
        if self.started is None:
            return
        if self.tty:
            self.stream.write("\r" + " " * 99 + "\r")
        kernels = "kernel" if self.count == 1 else "kernels"
        print(f"compiled {self.count} {kernels} in {time.perf_counter() - self.started:.1f} s",
              file=self.stream, flush=True)


@contextlib.contextmanager
def compile_feedback(stream, where=None):
    """A :class:`CompileNotice` on ``stream`` for the compilations inside the block (``where``:
    a function naming the kernel cache, for its first line)."""
    notice = CompileNotice(stream, where)
    level = log.level
    log.addHandler(notice)
    if log.getEffectiveLevel() > logging.INFO:
        log.setLevel(logging.INFO)
    try:
        yield
    finally:
        log.removeHandler(notice)
        log.setLevel(level)
        notice.finish()
