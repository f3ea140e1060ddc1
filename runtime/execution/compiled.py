"""Compiled plans: a plan with its kernels built (:class:`CompiledPlan`), the pool of arenas
its concurrent runs take, its result pool and its compiled driver; and the builder that
makes them for one program on one backend (:class:`PlanBuilder`), keeping each in a
:class:`~runtime.execution.plancache.PlanCache` by its plan key.
"""
from __future__ import annotations

import logging
import threading
import time
import weakref
from collections.abc import Mapping
from typing import Any

import attrs

from runtime.backends.base import Backend
from runtime.core.errors import FormulaError, fail
from runtime.core.types import FLOAT_DTYPES, TensorType, is_float
from runtime.execution import background
from runtime.execution.driver import Driver, build_driver
from runtime.execution.launches import Launch, group_failed
from runtime.execution.plancache import PlanCache, plan_key, ready_key
from runtime.execution.pool import ResultPool
from runtime.plan.freeaxes import FreeAxes
from runtime.plan.halves import widen_halves
from runtime.plan.planner import Plan, make_plan, output_extras
from runtime.plan.resolve import resolve_nodes
from runtime.plugins import failures
from runtime.plugins.expressions import numba_typing
from runtime.plugins.kernel import Kernel, KernelRequest
from runtime.program.model import Program

# a plan's compiled drivers are built (in the background) from this run of it on: a plan run a
# few times (a one-off call, a test) is not worth their compilation
DRIVER_AFTER_RUNS = 8


class CompiledPlan:
    """A plan with its launches (one per kernel group), the value checks to run before any
    kernel, the idle arenas of its runs, its result pool and its compiled driver."""

    def __init__(self, plan: Plan, types: dict[str, TensorType], launches: list[Launch],
                 upfront_checks, backend, resident: frozenset[str] = frozenset(),
                 check_outputs: bool = False):
        self.plan = plan
        self.check_outputs = check_outputs
        self.resident = resident  # banks whose runs bind runtime-owned C-order copies
        # float bindings a kernel reads in full and counts itself (Kernel.counts)
        self.deferred_finite = frozenset(s for launch in launches for s in launch.counts_nonfinite)
        self.types = types
        self.launches = launches
        self.upfront_checks = upfront_checks
        self.backend = backend
        self._free_arenas: list[dict[str, Any]] = []
        self._raw: dict[int, Any] = {}  # each arena's buffer, by the id of its views
        self.shelf: ArenaShelf | None = None  # (set by the builder: the plans of other extents)
        self._lock = threading.Lock()
        self.results = ResultPool()
        self.outputs = tuple((slot, types[slot]) for slot, buf in plan.buffers.items() if buf.kind == "output")
        self._temporaries = tuple(
            (slot, buf.offset if buf.offset is not None else plan.buffers[buf.alias_of].offset, types[slot])
            for slot, buf in plan.buffers.items() if buf.in_arena)
        # temporaries computed in a program output's array (planner: an in-place node making it)
        self.in_outputs = tuple((slot, buf.alias_of) for slot, buf in plan.buffers.items()
                                if buf.kind == "temporary" and not buf.in_arena)
        self._driver: Driver | None = None
        self._driver_thread: background.Thread | None = None
        self.driver_after = DRIVER_AFTER_RUNS  # the run that starts building the drivers
        self.driver_error: Exception | None = None
        # device plans launch kernel by kernel, and so do checked ones (to name the instruction)
        self._driver_built = backend.device_memory or check_outputs
        # waiting for the kernels, where the backend has anything to wait for
        self.synchronize = None if type(backend).synchronize is Backend.synchronize else backend.synchronize
        self._runs = 0
        # loaded from the disk cache in the foreground (tiers): the kernels' other variants load
        # in the background from this run on, so a new extent does not stall on them
        self.warm_after: int | None = None
        self._warm_thread: background.Thread | None = None

    def driver(self, values: Mapping[str, Any] | None = None) -> Driver | None:
        """The plan's kernels in compiled calls (:mod:`runtime.execution.driver`), or None: not
        built yet, or no two consecutive kernels that compiled code can call. Built in the
        background from the plan's :attr:`driver_after`-th run, and compiled there for the types
        of that run's ``values``: no run waits for it, and until it is ready runs launch their
        kernels from Python. A plan of a new extent whose drivers another plan of the program
        has built takes them at its first run, when their code is loaded for these types (it
        then compiles nothing, and its first runs need not launch from Python)."""
        if not self._driver_built or (self.warm_after is not None and self._warm_thread is None):
            with self._lock:
                self._runs += 1
                if self._runs == 1 and not self._driver_built and values and self.shelf is not None \
                        and self.shelf.has_driver(self):
                    self._driver_now(values)
                if self.warm_after is not None and self._warm_thread is None and self._runs >= self.warm_after:
                    self._warm_thread = background.Thread(self._warm_variants, "formula-warm")
                    self._warm_thread.start()  # (refused once the process exits)
                if not self._driver_built and self._driver_thread is None and self._runs >= self.driver_after:
                    self._driver_thread = background.Thread(self._build_driver, "formula-driver",
                                                            (dict(values or {}),))
                    self._driver_thread.start()  # (refused once the process exits)
        return self._driver

    def _driver_now(self, values: Mapping[str, Any]) -> None:
        """The drivers built here, if their modules are loaded and compiled for the types of
        ``values``; else nothing happens (they build in the background, as for any plan)."""
        try:
            driver = build_driver(self.launches, self._caller_slots(), loaded_only=True)
        except Exception:  # NotLoaded; any other error the background build names (a driver is only faster)
            return
        if driver is not None and driver.takes(values) and driver.compiled_for(values):
            self._driver = driver
            self._driver_built = True

    def _caller_slots(self) -> frozenset[str]:
        """The slots a run's caller supplies (resident banks always have the driver's layout)."""
        return frozenset(s for s, b in self.plan.buffers.items() if b.kind in ("input", "bank") and s not in self.resident)

    def _build_driver(self, values: dict[str, Any]) -> None:
        try:
            driver = build_driver(self.launches, self._caller_slots())
            if driver is not None and values and driver.takes(values):  # (only their types are read)
                driver.compile(values)
            self._driver = driver
        except Exception as exc:  # (kernels launched from Python are as right: a driver is only faster)
            if not background.exiting():  # (else cancelled at exit: nothing failed)
                self.drop_driver(exc, "failed to build")
        self._driver_built = True

    def _warm_variants(self) -> None:
        try:
            self.warm()
        except Exception as exc:  # (the run that needs a failing variant raises its error)
            if not background.exiting():
                logging.getLogger("runtime.compile").warning("warming a plan's kernel variants in the "
                                                             "background failed: %s", exc)

    def drop_driver(self, exc: Exception, what: str = "could not take a run's values") -> None:
        """Launch from Python from now on: the compiled driver ``what`` (the error kept as
        :attr:`driver_error`, and logged)."""
        self.driver_error = exc
        self._driver = None
        logging.getLogger("runtime.compile").warning("a plan's compiled driver %s; its kernels are launched "
                                                     "from Python: %s: %s", what, type(exc).__name__, exc)

    def wait_driver(self, timeout: float | None = None) -> bool:
        """Wait for the drivers (and kernel variants) building in the background; True when
        none is left."""
        deadline = None if timeout is None else time.monotonic() + timeout
        for thread in (self._warm_thread, self._driver_thread):
            if thread is not None:
                thread.join(None if deadline is None else max(0.0, deadline - time.monotonic()))
                if thread.is_alive():
                    return False
        return True

    def warm(self) -> None:
        """Every variant of the kernels (``Kernel.warm`` where a kernel has one; see
        ``Executable.warm``)."""
        for launch in self.launches:
            if launch.kernel.warm is not None:
                try:
                    launch.kernel.warm()
                except (FormulaError, MemoryError):
                    raise
                except Exception as exc:
                    raise group_failed(launch.nodes, self.backend.name, "kernel (compiling its variants)",
                                        exc) from exc

    def acquire_arena(self) -> dict[str, Any]:
        """Each concurrent run gets its own arena, reused run after run: given as the views
        of every temporary slot into it, made once per arena. A plan with no idle arena of its
        own takes, when its arena is large, the idle one of another plan of the same program
        (``shelf``) that is large enough, rather than new memory whose first touch faults in
        every page (a new extent's first run paid that). (``list.pop`` and ``append`` are
        atomic, so no lock is needed to hand out idle arenas.)"""
        try:
            return self._free_arenas.pop()
        except IndexError:
            pass
        nbytes = self.plan.arena_bytes
        raw = self.shelf.take(nbytes, self) if self.shelf is not None and nbytes >= TAKE_ARENA_BYTES else None
        if raw is None:
            raw = self.backend.allocate(nbytes)
        arena = {slot: self.backend.view(raw, offset, t) for slot, offset, t in self._temporaries}
        self._raw[id(arena)] = raw
        return arena

    def release_arena(self, arena) -> None:
        self._free_arenas.append(arena)

    def give_idle_arena(self, nbytes: int) -> Any:
        """The buffer of one of this plan's idle arenas if it holds ``nbytes``, given up (to
        another plan: :class:`ArenaShelf`); else None."""
        try:
            arena = self._free_arenas.pop()
        except IndexError:
            return None
        raw = self._raw.get(id(arena))
        if raw is None or raw.size < nbytes:
            self._free_arenas.append(arena)
            return None
        del self._raw[id(arena)]
        return raw

    def release_memory(self) -> None:
        """Drop the idle arenas and the pooled result arrays (runs in flight keep theirs)."""
        idle, self._free_arenas[:] = list(self._free_arenas), []
        for arena in idle:
            self._raw.pop(id(arena), None)
        self.results.clear()


# an arena of at least this many bytes is taken from another plan's idle one where it can (a
# fresh one faults in each page on first touch, ~0.2 ms a MiB; new views cost ~20 µs)
TAKE_ARENA_BYTES = 1 << 20


class ArenaShelf:
    """The compiled plans of one builder (one program, one backend), whose idle arenas a plan
    without one may take (:meth:`CompiledPlan.acquire_arena`): plans of other extents, held weakly."""

    def __init__(self):
        self._plans: weakref.WeakSet[CompiledPlan] = weakref.WeakSet()

    def add(self, plan: CompiledPlan) -> None:
        self._plans.add(plan)

    def has_driver(self, asker: CompiledPlan) -> bool:
        """Whether another plan has its compiled drivers (their code may serve ``asker``'s)."""
        return any(plan._driver is not None for plan in list(self._plans) if plan is not asker)

    def take(self, nbytes: int, taker: CompiledPlan) -> Any:
        """An idle arena buffer of another plan that holds ``nbytes``, or None."""
        for plan in list(self._plans):
            if plan is not taker:
                raw = plan.give_idle_arena(nbytes)
                if raw is not None:
                    return raw
        return None


class PlanBuilder:
    """Plans and compiled plans of ``program`` on ``backend``: :meth:`schedule` plans (nothing
    built), :meth:`build` builds the kernels, :meth:`compiled` finds or builds the compiled
    plan of a plan key in ``cache``."""

    def __init__(self, program: Program, specs, backend, memory_limit: int | None, free: FreeAxes,
                 cache: PlanCache[CompiledPlan]):
        self.program = program
        self.specs = specs
        self.backend = backend
        self.memory_limit = memory_limit
        self.free_axes = free
        self.cache = cache
        self.arenas = ArenaShelf()  # the idle arenas of its plans, for a plan of a new extent

    def compiled(self, dims: dict[str, int], dtypes: dict[str, str], resident: frozenset[str] = frozenset(),
                 check_outputs: bool = False, whole: Mapping[str, int] | None = None) -> CompiledPlan:
        """The compiled plan of these extents, from the cache or built now. ``whole``: these
        extents are one slice of a run with those (see :class:`Node`)."""
        whole = None if whole is None or dict(whole) == dict(dims) else dict(whole)
        key = plan_key(dims, dtypes, resident, check_outputs, whole)
        compiled = self.cache.get(key)
        if compiled is not None:
            return compiled
        return self.cache.put(key, self.build(dims, dtypes, resident, check_outputs, whole))

    def ready_key(self, dtypes: Mapping[str, str], resident: frozenset) -> str:
        """:func:`~runtime.execution.plancache.ready_key` of this program and backend."""
        return ready_key(self.program.fingerprint, self.backend.name, dtypes, resident)

    def binding_types(self, dims: Mapping[str, int], dtypes: dict[str, str]) -> dict[str, TensorType]:
        binding_types = {}
        for b in self.program.bindings:
            t = b.value_type.resolve(dims, dtypes.get(b.name))
            if not t.is_static:
                unknown = [s for s in t.sizes if isinstance(s, str)]
                fail("binding_shape", "$.dims", f"no extent given for symbols {unknown} of binding {b.name!r}")
            if t.dtype == "floating":
                t = t.evolve(dtype="float32")  # planning without values: assume float32
            binding_types[b.name] = t
        return binding_types

    def schedule(self, dims: dict[str, int], dtypes: dict[str, str], enforce: bool = True,
                  check_outputs: bool = False, whole: Mapping[str, int] | None = None):
        """(plan, resolved types, binding types) for these extents: no kernel is built.
        ``whole``: the extents of the run these are a slice of; each node then carries its
        instruction resolved for them (``Node.whole``)."""
        program = self.program
        binding_types = self.binding_types(dims, dtypes)
        nodes, dims, types = resolve_nodes(program, self.specs, binding_types, dims)
        if whole is not None:
            whole_nodes = resolve_nodes(program, self.specs, self.binding_types(whole, dtypes), whole)[0]
            nodes = [attrs.evolve(n, whole=w) for n, w in zip(nodes, whole_nodes)]
        if not self.backend.half_kernels:
            nodes = widen_halves(nodes, program.outputs, self.backend.name)
            types = {**types, **{n.output_slot: n.output_type for n in nodes}}
        plan = make_plan(nodes, binding_types, program.outputs, program.limits, dims,
                         backend=self.backend.name, fuse=self.backend.fuses,
                         slot_index={s.slot_id: i for i, s in enumerate(program.slots)},
                         binding_kinds={b.name: b.kind for b in program.bindings}, enforce=enforce,
                         memory_limit=self.memory_limit, keep_fused_operands=check_outputs)
        return attrs.evolve(plan, free=self.free_axes), types, binding_types

    def build(self, dims: dict[str, int], dtypes: dict[str, str], resident: frozenset[str],
               check_outputs: bool = False, whole: Mapping[str, int] | None = None) -> CompiledPlan:
        """Kernels for these extents; none counts the non-finite values of ``resident``
        banks (checked when loaded). ``check_outputs``: every instruction output is checked."""
        with numba_typing():  # (the plan's expressions, typed as the kernels about to compile them)
            plan, types, binding_types = self.schedule(dims, dtypes, check_outputs=check_outputs, whole=whole)
        self.backend.prepare({t.dtype for t in binding_types.values()})
        binding_slots = set(binding_types)
        unclaimed = {n for n, t in binding_types.items() if t.dtype in FLOAT_DTYPES} - resident
        launches, upfront = [], []
        for group in plan.kernel_groups:  # (a view's output is its operand's buffer: nothing to run)
            checks = []
            for node in group.nodes:
                if node.atom.check_values is not None:
                    entry = (node, node.atom.checked_inputs)
                    if all(node.input_slots[k] in binding_slots for k in node.atom.checked_inputs):
                        upfront.append(entry)
                    else:
                        checks.append(entry)
            launches.append(self._launch(group, tuple(checks), unclaimed, resident, check_outputs,
                                         output_extras(plan, group)))
            unclaimed.difference_update(launches[-1].counts_nonfinite)
        compiled = CompiledPlan(plan, types, launches, tuple(upfront), self.backend, resident, check_outputs)
        compiled.shelf = self.arenas
        self.arenas.add(compiled)
        return compiled

    def _launch(self, group, checks, unclaimed: set[str], resident: frozenset[str],
                check_outputs: bool = False, in_output: tuple[int, ...] = ()) -> Launch:
        """The group's kernel, asked (``KernelRequest``) to count the non-finite values of the
        float bindings in ``unclaimed`` that it reads (and, with ``check_outputs``, of the
        values it makes); it answers with what it counts."""
        backend = self.backend.name
        label = {"instructions": [n.instruction_id for n in group.nodes],
                 "atoms": [n.atom.ref for n in group.nodes], "backend": backend}
        epilogue = None if group.epilogue.empty else group.epilogue
        extra_slots = group.epilogue.extra_slots
        count_extras = tuple(k for k, slot in enumerate(extra_slots) if slot in unclaimed)
        check_outputs = check_outputs and any(is_float(n.output_type.dtype) for n in group.nodes)
        if group.anchor is None:
            inputs: tuple[str, ...] = ()
            request = KernelRequest(None, epilogue, count_extras=count_extras, check_outputs=check_outputs,
                                    output_extras=in_output)
            try:
                kernel = self.backend.elementwise_kernel(request)
            except (FormulaError, MemoryError):
                raise
            except Exception as exc:  # the generated code of checked expressions did not compile
                exprs = "; ".join(repr(step.op.expr) for step in epilogue.steps)
                raise group_failed(group.nodes, backend, f"kernel generated from ScalarOp {exprs}",
                                    exc) from exc
        else:
            anchor = group.anchor
            inputs = anchor.input_slots
            factory = anchor.atom.kernels.get(backend)
            if factory is None:
                fail("backend_unavailable", anchor.path,
                     f"atom {anchor.atom.name} ({anchor.atom.ref}) has no {backend!r} kernel; "
                     f"it has: {', '.join(sorted(anchor.atom.kernels)) or 'none'}")
            request = KernelRequest(
                anchor, epilogue, count_inputs=tuple(k for k, slot in enumerate(inputs) if slot in unclaimed),
                count_extras=count_extras, resident=tuple(k for k, slot in enumerate(inputs) if slot in resident),
                check_outputs=check_outputs, output_extras=in_output)
            kernel = failures.guard(factory, anchor.atom, anchor.path, f"{backend!r} kernel factory",
                                    request, backend=backend)
            if not isinstance(kernel, Kernel):
                fail("plugin_error", anchor.path,
                     f"the {backend!r} kernel factory of atom {anchor.atom.name} ({anchor.atom.ref}) "
                     f"returned {type(kernel).__name__}, not a runtime.plugins.kernel.Kernel")
        counts = kernel.counts  # only what was asked can be claimed
        counted = tuple(dict.fromkeys([*(inputs[k] for k in counts.inputs if k in request.count_inputs),
                                       *(extra_slots[k] for k in counts.extras if k in request.count_extras)]))
        if counted:
            label["checks_finite"] = list(counted)
        check_output = None
        if check_outputs:
            check_output = "kernel" if counts.outputs else "scan"
            label["checks_output"] = check_output
        extra_types = group.epilogue.extra_types
        aligners = tuple(self.backend.aligner(t, group.output_type) for t in extra_types)
        return Launch(kernel, tuple(inputs), extra_slots, extra_types, aligners,
                       counted, group.output_slot, group.output_type, checks, label,
                       tuple(group.nodes), check_output)
