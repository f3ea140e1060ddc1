"""Tiered execution: a run whose plan's kernels are not compiled yet runs on the ``reference``
kernels while a background thread compiles them (:class:`Tiers`); whether an executable is
tiered (:func:`tiered_default`)."""
from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any

import attrs
import numpy as np

from runtime.core import settings
from runtime.core.errors import FormulaError
from runtime.execution import background
from runtime.execution.compile_worker import fill_in_worker
from runtime.execution.compiled import CompiledPlan, PlanBuilder
from runtime.execution.launches import Launcher
from runtime.execution.plancache import PlanKey, plan_key
from runtime.kernels.codegen import mark_ready, ready_marker
from runtime.kernels.tiers import running_first_tier


# a plan loaded from the disk cache in the foreground warms its kernels' variants in the
# background from its second run: the first run's own kernel loads do not wait behind them
WARM_AFTER_RUNS = 2


def tiered_default(backend: str, tiered: bool | None) -> bool:
    """Whether runs are tiered: ``tiered`` when given, else on for ``cpu`` unless the
    environment says ``FORMULA_TIERED=0``. Never for ``reference`` (it compiles nothing)."""
    if backend == "reference":
        return False
    if tiered is not None:
        return bool(tiered)
    return backend == "cpu" and settings.TIERED.read()  # per call: tests set the environment


class Tiers:
    """The tiers of one executable: a plan whose kernels are not ready runs on a ``reference``
    executable of the same program (made once by ``reference()``) while a background thread
    builds the plan (``builder``), compiles its kernels (two runs by ``launcher`` on copies of
    the first run's values: the kernels, then the one-call driver) and their other variants,
    then publishes it in ``builder.cache``; the next run after that takes it.

    The thread first has a worker process fill the disk cache (``compile_worker``), where it
    can: Numba holds the GIL while it compiles, and the reference runs beside it waited for the
    GIL at every NumPy call. Loading the plan from the cache then holds it for far less. A plan
    whose kernels the disk cache holds (its readiness marker) is built in the foreground.
    """

    def __init__(self, builder: PlanBuilder, launcher: Launcher, reference: Callable[[], Any],
                 worker: bool = False):
        """``worker``: whether a worker process can compile for this executable (its registry is
        one a new process rebuilds: ``Registry.reproducible``); ``FORMULA_COMPILE_WORKER`` may
        still say no, per compile."""
        self._builder = builder
        self._launcher = launcher
        self._reference = reference
        self._worker = worker
        self._lock = threading.Lock()
        self._pending: dict[PlanKey, background.Thread] = {}
        self._errors: dict[PlanKey, FormulaError] = {}
        self._fallback: Any = None

    def ready(self, bound, dtypes: dict[str, str]) -> CompiledPlan | None:
        """The compiled plan for these values when it is ready, else None (its compilation
        started in the background if it was not running). A failed one raises its error."""
        builder = self._builder
        resident = frozenset(bound.resident)
        key = plan_key(bound.dims, dtypes, resident)  # (an unchecked plan of a whole run)
        compiled = builder.cache.get(key)
        if compiled is not None:
            return compiled
        # kernels depend on dtypes and layouts, not on the extents of symbolic axes: with a
        # plan of the same dtypes compiled (and warmed), a new extent compiles nothing
        known = any(k.kernels == key.kernels for k in builder.cache.keys())
        with self._lock:  # a failed build is this key's answer, whatever the disk cache holds
            error = self._errors.get(key)
        if error is not None:
            raise error
        if known:
            return builder.compiled(dict(bound.dims), dtypes, resident)
        if key in self._pending:  # (its worker may have marked it ready: the thread loads it)
            return None
        if ready_marker(builder.ready_key(dtypes, resident)).is_file():
            # kernels of these dtypes are in the disk cache: loading them beats the reference
            # tier; their variants (parallel twins, tails) load in the background from the next
            # run on, so a later new extent finds them loaded (the compiled tier warms them too)
            compiled = builder.compiled(dict(bound.dims), dtypes, resident)
            compiled.warm_after = WARM_AFTER_RUNS
            return compiled
        if key not in self._pending and key not in self._errors:
            # planned here (nothing compiled) so that a refused ScalarOp expression or a
            # raising infer is this run's error, not the background compilation's (which
            # alone types the expressions with Numba, as every kernel build does)
            builder.schedule(dict(bound.dims), dtypes, enforce=False)
        with self._lock:
            error = self._errors.get(key)
            if error is not None:
                raise error
            if key not in self._pending:
                values = {name: np.array(v, copy=True) if name not in bound.resident else v
                          for name, v in bound.values.items()}  # the caller may change its arrays
                # started once this run is done (fallback_run): Numba holds the GIL while it
                # compiles, which would hold up the reference run the caller is waiting for
                self._pending[key] = background.Thread(
                    self._compile, "formula-compile", (key, dict(bound.dims), dtypes, resident, bound, values))
        return None

    def _start_pending(self) -> None:
        with self._lock:
            for key, thread in list(self._pending.items()):
                if thread.ident is None and not thread.start():  # the process is exiting
                    del self._pending[key]

    def _compile(self, key: PlanKey, dims, dtypes, resident, bound, values) -> None:
        builder = self._builder
        try:
            if self._worker and settings.COMPILE_WORKER.read():
                # the kernels compile in a worker process, without this one's GIL; whatever it
                # answers, the build below loads what it filled (or compiles what it did not)
                fill_in_worker(builder.program, builder.backend.name, builder.memory_limit, dims, dtypes,
                               bool(resident), bound.binding_bytes,
                               background.compile_nice())
                if background.exiting():
                    return
            compiled = builder.build(dims, dtypes, resident)
            compiled.driver_after = 2  # (its drivers start building on the second run here)
            copy = attrs.evolve(bound, values=values, structure=None)
            for _ in range(compiled.driver_after):  # the kernels compile on their first call
                arena = compiled.acquire_arena()
                try:
                    self._launcher.execute(compiled, copy, arena, False, {}, (values, None))
                finally:
                    compiled.release_arena(arena)
            compiled.warm()  # (the drivers go on building: the plan is published without them)
            mark_ready(builder.ready_key(dtypes, resident))
        except Exception as exc:  # a kernel that fails to compile must not be lost in a thread
            if background.exiting():  # cancelled at exit (background.Cancelled): nothing failed
                return
            if isinstance(exc, FormulaError):
                with self._lock:
                    self._errors[key] = exc
                return
            error = FormulaError("backend_unavailable", "$", f"compiling the {builder.backend.name} kernels "
                                 f"for extents {dims or '{}'} failed in the background: "
                                 f"{type(exc).__name__}: {exc}")
            with self._lock:
                self._errors[key] = error
        else:
            builder.cache.put(key, compiled)
        finally:
            with self._lock:
                self._pending.pop(key, None)

    def fallback_run(self, inputs, banks, trace: bool, out):
        """This run on the ``reference`` executable; then the compilations it queued start."""
        if self._fallback is None:
            with self._lock:
                if self._fallback is None:
                    self._fallback = self._reference()
        try:
            with running_first_tier():  # (reference kernels' faster paths: BLAS contractions)
                return self._fallback.run(inputs=inputs, banks=banks, trace=trace, out=out)
        finally:
            self._start_pending()

    def wait(self, timeout: float | None) -> bool:
        """Wait for the compilations in the background; True when none is left. The first
        failed one raises its error."""
        self._start_pending()
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            with self._lock:
                threads = list(self._pending.values())
                errors = list(self._errors.values())
            if errors:
                raise errors[0]
            if not threads:
                return True
            for thread in threads:
                left = None if deadline is None else max(0.0, deadline - time.monotonic())
                thread.join(left)
                if thread.is_alive():
                    return False
