"""Compiled executables: plan once per set of extents, then run groups over one arena.

A run binds and checks the values (SPEC §4), finds or builds the compiled plan for their
extents (types, fused groups, kernels, arena layout, memory preflight — all before anything
is allocated), then launches one kernel per group. Results never alias the arena or memory
a later run writes: they are the caller's ``out=`` arrays, or arrays of the plan's
:class:`~runtime.execution.pool.ResultPool` (fresh, or ones the caller has let go of entirely).
"""
from __future__ import annotations

import logging
import threading
import time
from collections import OrderedDict
from collections.abc import Iterator, Mapping
from typing import Any

import attrs
import numpy as np

from runtime.execution import background
from runtime.kernels import compilelog
from runtime.kernels.tiers import running_first_tier
from runtime.plugins import failures
from runtime.plugins.atomspec import Node
from runtime.plugins.expressions import numba_typing
from runtime.plugins.kernel import Kernel, KernelRequest
from runtime.backends.base import Backend
from runtime.kernels.arrays import is_device_array
from runtime.execution.bindings import Binder, BoundValues, bind_values, load_resident, value_is_finite
from runtime.kernels.codegen import heal_numba_cache, mark_ready, ready_marker
from runtime.execution.driver import Driver, build_driver
from runtime.core import settings
from runtime.core.errors import FormulaError, did_you_mean, fail
from runtime.plan.memory import memory_limit as runtime_memory_limit, no_memory_error
from runtime.plan.halves import widen_halves
from runtime.program.model import Program
from runtime.execution.outputs import check_out
from runtime.execution.partials import PartialSums
from runtime.execution.pool import ResultPool
from runtime.plan.freeaxes import Chunking, FreeAxes, accumulation_dtype, even_slices, free_axes
from runtime.plan.planner import Plan, make_plan, output_extras
from runtime.plugins.registry import Registry
from runtime.execution.resident import ResidentBanks
from runtime.plan.resolve import resolve_nodes
from runtime.core.types import FLOAT_DTYPES, TensorType, formula_dtype, is_float, numpy_dtype

MAX_CACHED_PLANS = 16
# a plan's compiled drivers are built (in the background) from this run of it on: a plan run a
# few times (a one-off call, a test) is not worth their compilation
DRIVER_AFTER_RUNS = 8


class Result(Mapping):
    """Output slot id -> array, plus the per-group ``trace`` when asked for."""

    def __init__(self, values: dict[str, Any], trace: list[dict[str, Any]] | None, plan: Plan,
                 tier: str | None = None):
        self._values = values
        self.trace = trace
        self.plan = plan
        self.tier = tier  # the backend whose kernels ran: the executable's, or "reference" (tiered)

    def __getitem__(self, key: str):
        return self._values[key]

    def __iter__(self) -> Iterator[str]:
        return iter(self._values)

    def __len__(self) -> int:
        return len(self._values)

    def __repr__(self) -> str:
        parts = [f"{k}: {getattr(v, 'shape', ())}" for k, v in self._values.items()]
        return f"Result({', '.join(parts)})"


@attrs.define
class _Launch:
    """One group, ready to run: the kernel and where its operands live."""

    kernel: Kernel
    inputs: tuple[str, ...]  # anchor (or lone node) operand slots
    extras: tuple[str, ...]  # epilogue operand slots, aligned to the output
    extra_types: tuple[TensorType, ...]
    aligners: tuple[Any, ...]  # per extra: value -> keepdims form of the output
    counts_nonfinite: tuple[str, ...]  # binding slots whose finiteness the kernel counts
    output: str
    output_type: TensorType
    checks: tuple[tuple[Node, tuple[int, ...]], ...]  # value checks before this kernel
    label: dict[str, Any]
    nodes: tuple[Node, ...] = ()  # the group's nodes, in order
    # the output check (SPEC §3b.3 item 2): None (off, or no floating value to check),
    # "kernel" (the kernel counts its values as it makes them) or "scan" (a scan of the
    # output right after the kernel, for a kernel that cannot count them)
    check_output: str | None = None


class CompiledPlan:
    def __init__(self, plan: Plan, types: dict[str, TensorType], launches: list[_Launch],
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
        self._lock = threading.Lock()
        self.results = ResultPool()
        self.outputs = tuple((slot, types[slot]) for slot, buf in plan.buffers.items() if buf.kind == "output")
        self._temporaries = tuple(
            (slot, buf.offset if buf.offset is not None else plan.buffers[buf.alias_of].offset, types[slot])
            for slot, buf in plan.buffers.items() if buf.kind == "temporary")
        self._driver: Driver | None = None
        self._driver_thread: background.Thread | None = None
        self.driver_after = DRIVER_AFTER_RUNS  # the run that starts building the drivers
        self.driver_error: Exception | None = None
        # device plans launch kernel by kernel, and so do checked ones (to name the instruction)
        self._driver_built = backend.device_memory or check_outputs
        # waiting for the kernels, where the backend has anything to wait for
        self.synchronize = None if type(backend).synchronize is Backend.synchronize else backend.synchronize
        self._runs = 0

    def driver(self, values: Mapping[str, Any] | None = None) -> Driver | None:
        """The plan's kernels in compiled calls (:mod:`runtime.execution.driver`), or None: not
        built yet, or no two consecutive kernels that compiled code can call. Built in the
        background from the plan's :attr:`driver_after`-th run, and compiled there for the types
        of that run's ``values``: no run waits for it, and until it is ready runs launch their
        kernels from Python."""
        if not self._driver_built:
            with self._lock:
                self._runs += 1
                if self._driver_thread is None and self._runs >= self.driver_after:
                    self._driver_thread = background.Thread(self._build_driver, "formula-driver",
                                                            (dict(values or {}),))
                    self._driver_thread.start()  # (refused once the process exits)
        return self._driver

    def _build_driver(self, values: dict[str, Any]) -> None:
        buffers = self.plan.buffers  # (resident banks always have the driver's layout)
        try:
            driver = build_driver(self.launches, frozenset(
                s for s, b in buffers.items() if b.kind in ("input", "bank") and s not in self.resident))
            if driver is not None and values and driver.takes(values):  # (only their types are read)
                driver.compile(values)
            self._driver = driver
        except Exception as exc:  # (kernels launched from Python are as right: a driver is only faster)
            if not background.exiting():  # (else cancelled at exit: nothing failed)
                self.drop_driver(exc, "failed to build")
        self._driver_built = True

    def drop_driver(self, exc: Exception, what: str = "could not take a run's values") -> None:
        """Launch from Python from now on: the compiled driver ``what`` (the error kept as
        :attr:`driver_error`, and logged)."""
        self.driver_error = exc
        self._driver = None
        logging.getLogger("runtime.compile").warning("a plan's compiled driver %s; its kernels are launched "
                                                     "from Python: %s: %s", what, type(exc).__name__, exc)

    def wait_driver(self, timeout: float | None = None) -> bool:
        """Wait for the drivers building in the background; True when none is left."""
        thread = self._driver_thread
        if thread is not None:
            thread.join(timeout)
            return not thread.is_alive()
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
                    raise _group_failed(launch.nodes, self.backend.name, "kernel (compiling its variants)",
                                        exc) from exc

    def acquire_arena(self) -> dict[str, Any]:
        """Each concurrent run gets its own arena, reused run after run: given as the views
        of every temporary slot into it, made once per arena. (``list.pop`` and ``append``
        are atomic, so no lock is needed to hand out idle arenas.)"""
        try:
            return self._free_arenas.pop()
        except IndexError:
            pass
        arena = self.backend.allocate(self.plan.arena_bytes)
        return {slot: self.backend.view(arena, offset, t) for slot, offset, t in self._temporaries}

    def release_arena(self, arena) -> None:
        self._free_arenas.append(arena)

    def release_memory(self) -> None:
        """Drop the idle arenas and the pooled result arrays (runs in flight keep theirs)."""
        self._free_arenas.clear()
        self.results.clear()


def tiered_default(backend: str, tiered: bool | None) -> bool:
    """Whether runs are tiered: ``tiered`` when given, else on for ``cpu`` unless the
    environment says ``FORMULA_TIERED=0``. Never for ``reference`` (it compiles nothing)."""
    if backend == "reference":
        return False
    if tiered is not None:
        return bool(tiered)
    return backend == "cpu" and settings.TIERED.read()  # per call: tests set the environment


class Executable:
    def __init__(self, program: Program, backend: str, registry: Registry, memory_limit: Any = None,
                 tiered: bool | None = None):
        """``memory_limit``: the runtime ceiling for every run (:func:`runtime.plan.memory.memory_limit`).
        ``tiered`` (:func:`tiered_default`): a run whose plan's kernels are not compiled yet runs
        on the ``reference`` kernels while they compile in a background thread; later runs
        take the compiled plan once it is ready (:meth:`wait_compiled` waits for it)."""
        self.memory_limit = runtime_memory_limit(memory_limit)
        heal_numba_cache()  # before the first kernel is loaded from the disk cache
        self.program = program
        self.registry = registry
        self.backend = registry.backend(backend)
        self.specs = [registry.atom(ins.atom_ref, f"$.instructions[{i}].atom_ref")
                      for i, ins in enumerate(program.instructions)]
        self._plans: OrderedDict[tuple, CompiledPlan] = OrderedDict()
        self._plans_lock = threading.Lock()
        self._by_structure: dict[tuple, CompiledPlan] = {}
        self._last_structure: tuple[tuple | None, CompiledPlan | None] = (None, None)
        self._binder = Binder(program, self._deferred_finite, self.memory_limit)
        self.free_axes: FreeAxes = free_axes(program, self.specs)
        # (extents, dtypes, chunks) -> (the slicing, the whole outputs' types, their result pool)
        self._chunkings: dict[tuple, tuple[Chunking | None, dict[str, TensorType], ResultPool]] = {}
        compilelog.install()  # kernels compile lazily, on first call: say so on runtime.compile
        self.tiered = tiered_default(self.backend.name, tiered)
        self._tiers = _Tiers(self) if self.tiered else None

    def release_memory(self) -> None:
        """Give back what the executable keeps between runs — idle arenas and released result
        arrays — while keeping its compiled plans and kernels. The next run allocates anew."""
        with self._plans_lock:
            compiled = list(self._plans.values()) + list(self._by_structure.values())
        for c in compiled:
            c.release_memory()

    def wait_compiled(self, timeout: float | None = None) -> bool:
        """Wait until every plan compiling in the background (tiered runs) is ready, and every
        compiled driver building in the background, for deterministic timing; True when none
        is left. A failed background compilation is raised here (and by the next run that
        needs that plan) as a FormulaError."""
        deadline = None if timeout is None else time.monotonic() + timeout
        if self._tiers is not None and not self._tiers.wait(timeout):
            return False
        with self._plans_lock:
            compiled = list(self._plans.values())
        return all(c.wait_driver(None if deadline is None else max(0.0, deadline - time.monotonic()))
                   for c in compiled)

    def warm(self) -> None:
        """Build every variant of the compiled plans' kernels that a later extent may take
        (e.g. the parallel twin of a kernel that ran serially), so new extents of symbolic
        axes compile nothing. Tiered executables do it in the background."""
        self.wait_compiled()
        with self._plans_lock:
            compiled = list(self._plans.items())
        for key, c in compiled:
            c.warm()
            if not key[3] and key[4] is None:  # a whole unchecked plan: what tiered runs take
                mark_ready(self._ready_key(dict(key[1]), key[2]))

    def _ready_key(self, dtypes: Mapping[str, str], resident: frozenset) -> str:
        """What the kernels of a whole, unchecked plan depend on besides layouts: the program,
        the backend, the dtypes and which banks are resident (``codegen.ready_marker``)."""
        return "|".join([self.program.fingerprint, self.backend.name, repr(sorted(dtypes.items())),
                         repr(sorted(resident))])

    # --- planning -----------------------------------------------------------------------
    @no_memory_error
    def plan(self, dims: Mapping[str, int] | None = None, dtypes: Mapping[str, str] | None = None,
             *, enforce: bool = True, chunks: str | int | None = None) -> Plan:
        """The schedule, lifetimes, arena offsets and memory verdict for these extents (and
        the program's free axes). With ``enforce=False`` a working set over
        ``max_working_bytes`` gives a plan whose verdict is "exceeds" (nothing is compiled)
        instead of ``limit_exceeded``. With ``chunks`` (as :meth:`run` takes it): the plan of
        one slice, with its ``chunking``, when the run would be chunked."""
        dims = check_dims(self.program, dims or {})
        if chunks is not None:
            check_chunks(chunks)
            chunking = self._chunking(dims, dict(dtypes or {}), chunks)
            if chunking is not None:
                sliced = {**dims, chunking.symbol: chunking.size}
                plan = self._compiled(sliced, dict(dtypes or {}), whole=dims).plan if enforce else \
                    self._schedule(sliced, dict(dtypes or {}), enforce=False)[0]
                return attrs.evolve(plan, chunking=chunking)
        if not enforce:
            return self._schedule(dims, dict(dtypes or {}), enforce=False)[0]
        return self._compiled(dims, dict(dtypes or {})).plan

    def output_types(self, dims: Mapping[str, int], dtypes: Mapping[str, str] | None = None) -> dict[str, TensorType]:
        """Each output's resolved type for these extents (``dtypes``: the float dtype of each
        ``floating`` binding); nothing is compiled and the working set is not enforced."""
        types = self._schedule(check_dims(self.program, dims), dict(dtypes or {}), enforce=False)[1]
        return {slot: types[slot] for slot in self.program.outputs}

    def _compiled(self, dims: dict[str, int], dtypes: dict[str, str],
                  resident: frozenset[str] = frozenset(), check_outputs: bool = False,
                  whole: Mapping[str, int] | None = None) -> CompiledPlan:
        """``whole``: these extents are one slice of a run with those (see :class:`Node`)."""
        whole = None if whole is None or dict(whole) == dict(dims) else dict(whole)
        key = (tuple(sorted(dims.items())), tuple(sorted(dtypes.items())), resident, check_outputs,
               tuple(sorted(whole.items())) if whole else None)
        with self._plans_lock:
            compiled = self._plans.get(key)
            if compiled is not None:
                self._plans.move_to_end(key)
                return compiled
        compiled = self._build(dims, dtypes, resident, check_outputs, whole)
        with self._plans_lock:
            self._plans[key] = compiled
            while len(self._plans) > MAX_CACHED_PLANS:
                self._plans.popitem(last=False)
        return compiled

    def _binding_types(self, dims: Mapping[str, int], dtypes: dict[str, str]) -> dict[str, TensorType]:
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

    def _schedule(self, dims: dict[str, int], dtypes: dict[str, str], enforce: bool = True,
                  check_outputs: bool = False, whole: Mapping[str, int] | None = None):
        """(plan, resolved types, binding types) for these extents: no kernel is built.
        ``whole``: the extents of the run these are a slice of; each node then carries its
        instruction resolved for them (``Node.whole``)."""
        program = self.program
        binding_types = self._binding_types(dims, dtypes)
        nodes, dims, types = resolve_nodes(program, self.specs, binding_types, dims)
        if whole is not None:
            whole_nodes = resolve_nodes(program, self.specs, self._binding_types(whole, dtypes), whole)[0]
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

    def _build(self, dims: dict[str, int], dtypes: dict[str, str], resident: frozenset[str],
               check_outputs: bool = False, whole: Mapping[str, int] | None = None) -> CompiledPlan:
        """Kernels for these extents; none counts the non-finite values of ``resident``
        banks (checked when loaded). ``check_outputs``: every instruction output is checked."""
        with numba_typing():  # (the plan's expressions, typed as the kernels about to compile them)
            plan, types, binding_types = self._schedule(dims, dtypes, check_outputs=check_outputs, whole=whole)
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
        return CompiledPlan(plan, types, launches, tuple(upfront), self.backend, resident, check_outputs)

    def _launch(self, group, checks, unclaimed: set[str], resident: frozenset[str],
                check_outputs: bool = False, in_output: tuple[int, ...] = ()) -> _Launch:
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
                raise _group_failed(group.nodes, backend, f"kernel generated from ScalarOp {exprs}",
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
        return _Launch(kernel, tuple(inputs), extra_slots, extra_types, aligners,
                       counted, group.output_slot, group.output_type, checks, label,
                       tuple(group.nodes), check_output)

    # --- running ------------------------------------------------------------------------
    @no_memory_error
    def load_banks(self, banks: Any) -> ResidentBanks:
        """Check the bank values once (every SPEC §4 rule) and keep the runtime's own copies
        of them (on the device, for a device backend), to pass as ``run(banks=...)``: runs
        then check only their inputs, and no kernel scans the banks again. ``banks`` is what
        ``run`` takes: a mapping (of arrays or ``BankOperand``) or a bank store. Later changes
        to the caller's arrays do not reach the loaded copies: load them again."""
        return load_resident(self.program, banks, self.backend, self.memory_limit)

    @no_memory_error
    def run(self, inputs: Mapping[str, Any] | None = None, banks: Any = None, trace: bool = False,
            out: Mapping[str, Any] | None = None, check_outputs: bool = False,
            chunks: str | int | None = None, slice_of: Mapping[str, int] | None = None) -> Result:
        """Run once. ``out`` maps output slots to arrays to write the results into (host
        arrays, or device arrays for device results); results it leaves out are new arrays,
        or earlier results the caller no longer refers to at all. ``banks`` may be the
        :meth:`load_banks` of this program: then only the inputs are checked.
        ``check_outputs``: raise ``nonfinite`` at the instruction whose output first holds a
        NaN or ±inf (SPEC §3b.3 item 2), checked inside the kernels that make the values
        where they can count them, by a scan right after the kernel otherwise; ``out`` arrays
        are then written only once every output passed.

        ``chunks="auto"``: a run whose working set is over ``max_working_bytes`` runs in
        slices along a free axis (:mod:`runtime.plan.freeaxes`), each slice within the limit;
        ``chunks=n`` (an int): slices of at most n positions, whether or not the whole fits.
        The results are then fresh arrays (or ``out``), written slice by slice.

        ``slice_of``: the values are one slice (a block, say of a dask array) of a run with
        these symbol extents; kernels choose their algorithms as for those extents, so the
        slice's results are bit for bit those of the whole run."""
        if isinstance(banks, ResidentBanks):
            banks.check_backend(self.backend)
        if chunks is not None or slice_of is not None:
            if chunks is not None:
                check_chunks(chunks)
            if check_outputs:
                fail("schema", "$.chunks" if chunks is not None else "$.slice_of",
                     "check_outputs runs the whole program at once: it does not combine with "
                     "chunks or slice_of")
            whole = check_dims(self.program, slice_of) if slice_of is not None else None
            return self._run_chunked(inputs, banks, trace, out, chunks, whole)
        bound = self._binder.bind(inputs, banks)
        if check_outputs:
            return self._run_checked(bound, inputs, banks, trace, out)
        return self._run_bound(bound, inputs, banks, trace, out)

    def _run_bound(self, bound: BoundValues, inputs, banks, trace: bool, out,
                   whole: Mapping[str, int] | None = None) -> Result:
        last = self._last_structure  # the binder's fast path hands back the very same key
        if whole is not None:
            self._check_host(bound)
            compiled = self._compiled(bound.dims, self._float_dtypes(bound), frozenset(bound.resident),
                                      whole=whole)
        elif bound.structure is not None and last[0] is bound.structure:
            compiled = last[1]
        else:
            compiled = self._by_structure.get(bound.structure) if bound.structure is not None else None
            if compiled is None:
                compiled = self._compiled_for(bound)
                if compiled is None:  # tiered: its kernels are compiling; this run on reference's
                    return self._tiers.fallback_run(inputs, banks, trace, out)
            if bound.structure is not None:
                self._last_structure = (bound.structure, compiled)  # one tuple: replaced atomically
        given = self._given(out, compiled, bound)
        if given and bound.unchecked:  # the caller's out arrays are never written on bad input
            self._binder.check_finite(bound, bound.unchecked, inputs, banks)
        for node, positions in compiled.upfront_checks:
            _check(node, positions, lambda slot: bound.values[slot])
        arena = compiled.acquire_arena()
        try:
            return self._execute(compiled, bound, arena, trace, given, (inputs, banks))
        finally:
            compiled.release_arena(arena)

    def _given(self, out, compiled: CompiledPlan, bound) -> dict[str, Any]:
        """The caller's ``out`` arrays, checked like bindings and for the kind of memory
        (host or device) this run's results are."""
        given = check_out(out, self.program.outputs, compiled.types, bound.values, is_device_array) \
            if out is not None else {}
        device_results = bool(given) and self.backend.device_memory and not _host_values(bound)
        for slot, arr in given.items():
            if is_device_array(arr) != device_results:
                fail("out_buffer", f"$.out.{slot}", f"out[{slot!r}] must be a "
                     f"{'device array' if device_results else 'host NumPy array'}: this run's "
                     f"results are {'device' if device_results else 'host'} arrays")
        return given

    def _run_checked(self, bound, inputs, banks, trace: bool, out) -> Result:
        """A run with the output check: its own compiled plan (kernels asked to count their
        values, no in-place reuse inside fused groups, no driver); results go to the caller's
        ``out`` arrays only after every instruction output passed."""
        compiled = self._compiled_for(bound, check_outputs=True)
        given = self._given(out, compiled, bound)
        if bound.unchecked - compiled.deferred_finite:  # what these kernels leave unchecked
            self._binder.check_finite(bound, bound.unchecked - compiled.deferred_finite, inputs, banks)
        for node, positions in compiled.upfront_checks:
            _check(node, positions, lambda slot: bound.values[slot])
        arena = compiled.acquire_arena()
        try:
            result = self._execute(compiled, bound, arena, trace, {}, (inputs, banks))
        finally:
            compiled.release_arena(arena)
        if not given:
            return result
        values = dict(result._values)
        for slot, target in given.items():
            value = values[slot]
            if is_device_array(target):
                target.copy_to_device(value)
            else:
                np.copyto(target, self.backend.to_host(value))
            values[slot] = target
        return Result(values, result.trace, result.plan, result.tier)

    # --- chunked runs ---------------------------------------------------------------------
    def _chunking(self, dims: dict[str, int], dtypes: dict[str, str], chunks: str | int) -> Chunking | None:
        """How a run with these extents is sliced (None: ``chunks="auto"`` and the whole fits)."""
        return self._chunking_entry(dims, dtypes, chunks)[0]

    def _chunking_entry(self, dims: dict[str, int], dtypes: dict[str, str], chunks: str | int):
        """(the slicing, the whole outputs' types, their result pool), decided once per
        extents, dtypes and ``chunks``."""
        key = (tuple(sorted(dims.items())), tuple(sorted(dtypes.items())), chunks)
        entry = self._chunkings.get(key)
        if entry is not None:
            return entry
        whole, types, _ = self._schedule(dims, dtypes, enforce=False)
        chunking = self._choose_chunking(whole, dims, dtypes, chunks)
        if chunking is not None and self.free_axes.sums.get(chunking.symbol):  # added slice by slice
            chunking = attrs.evolve(chunking, sums=tuple(
                (slot, accumulation_dtype(types[slot].dtype)) for slot in self.free_axes.sums[chunking.symbol]))
        entry = (chunking, {slot: types[slot] for slot in self.program.outputs}, ResultPool())
        with self._plans_lock:
            if len(self._chunkings) >= MAX_CACHED_PLANS:
                self._chunkings.clear()
            return self._chunkings.setdefault(key, entry)

    def _choose_chunking(self, whole: Plan, dims: dict[str, int], dtypes: dict[str, str],
                         chunks: str | int) -> Chunking | None:
        if chunks == "auto" and self._fits(whole):
            return None
        free = [s for s in self.free_axes.free if s in whole.dims]
        if not free:
            reasons = "; ".join(f"{s}: {why}" for s, why in self.free_axes.tied.items()) or \
                "the program has no symbolic axis"
            if chunks == "auto":
                fail("limit_exceeded", "$.limits.max_working_bytes",
                     f"the working set needs {whole.working_bytes} bytes but max_working_bytes allows "
                     f"{whole.max_working_bytes}, and chunks='auto' finds no free axis to run it in "
                     f"slices along ({reasons})")
            fail("schema", "$.chunks", f"chunks={chunks!r} needs a free axis to slice along and the "
                                       f"program has none ({reasons})")
        # an axis that leads every tensor carrying it first (its slices are contiguous views,
        # results written in place), then the longest (the most room to split)
        free.sort(key=lambda s: (not self._leads(s), -whole.dims[s]))
        if chunks == "auto":
            symbol, most = self._slice_axis(dims, dtypes, free, whole.dims)
        else:
            symbol = next((s for s in free if whole.dims[s] > chunks), free[0])  # one that splits
            most = min(int(chunks), whole.dims[symbol])
        extent = whole.dims[symbol]
        size, count = even_slices(extent, most)
        sliced = self._schedule({**dims, symbol: size}, dtypes, enforce=False)[0]
        return Chunking(symbol, extent, size, count, chunks, whole.working_bytes, sliced.working_bytes)

    def _fits(self, plan: Plan) -> bool:
        return plan.fits and (self.memory_limit is None or plan.working_bytes <= self.memory_limit)

    def _leads(self, symbol: str) -> bool:
        """Whether ``symbol`` sizes the first axis of every binding and output carrying it."""
        types = [b.value_type for b in self.program.bindings] + \
            [self.program.slot(s).value_type for s in self.program.outputs]
        return all(t.sizes[0] == symbol for t in types if symbol in t.sizes)

    def _slice_axis(self, dims: dict[str, int], dtypes: dict[str, str], free: list[str],
                    extents: Mapping[str, int]) -> tuple[str, int]:
        """The first of ``free`` along which one position fits, and the most positions that
        do (bisection: the working set grows with the slice)."""
        for symbol in free:
            def fits(size: int) -> bool:
                return self._fits(self._schedule({**dims, symbol: size}, dtypes, enforce=False)[0])

            if fits(1):
                break
        else:
            one = self._schedule({**dims, free[-1]: 1}, dtypes, enforce=False)[0]
            fail("limit_exceeded", "$.limits.max_working_bytes",
                 f"even a slice of one position along {free[-1]!r} needs {one.working_bytes} bytes "
                 f"but max_working_bytes allows {one.max_working_bytes}"
                 + (f" (and along {', '.join(map(repr, free[:-1]))} no less)" if len(free) > 1 else ""))
        lo, hi = 1, extents[symbol]  # fits(lo); hi: the whole, which does not
        while hi - lo > 1:
            mid = (lo + hi) // 2
            lo, hi = (mid, hi) if fits(mid) else (lo, mid)
        return symbol, lo

    def _run_chunked(self, inputs, banks, trace: bool, out, chunks: str | int | None,
                     slice_of: dict[str, int] | None) -> Result:
        # the values together may pass max_working_bytes: each slice is preflighted instead
        bound = bind_values(self.program, inputs, banks, self.memory_limit, whole_working=chunks is None)
        self._check_host(bound)
        dtypes = self._float_dtypes(bound)
        resident = frozenset(bound.resident)
        chunking, whole_types, pool = self._chunking_entry(dict(bound.dims), dtypes, chunks) \
            if chunks is not None else (None, None, None)
        if chunking is None:  # the whole fits: an ordinary run, on the values bound already
            return self._run_bound(bound, inputs, banks, trace, out,
                                   {**bound.dims, **slice_of} if slice_of is not None else None)
        symbol = chunking.symbol
        # one plan per slice size (a shorter last slice when outputs are sums over the symbol)
        plans = {n: self._compiled({**bound.dims, symbol: n}, dtypes, resident,
                                   whole={**bound.dims, **(slice_of or {})})
                 for n in dict.fromkeys(n for _, n in chunking.slices())}
        compiled = plans[chunking.size]
        given = check_out(out, self.program.outputs, whole_types, bound.values, is_device_array) \
            if out is not None else {}
        backend = self.backend
        host_results = not backend.device_memory or _host_values(bound)
        results = {}
        for slot in self.program.outputs:
            t = whole_types[slot]
            if given.get(slot) is not None:
                results[slot] = given[slot]
            elif host_results:  # an earlier result nothing else refers to, else a fresh array
                results[slot] = pool.take(slot, lambda t=t: np.empty(t.shape, numpy_dtype(t.dtype)))
            else:
                results[slot] = backend.empty(t)
        axes = {name: _axis_of(t, symbol) for name, t in
                [(b.name, b.value_type) for b in self.program.bindings]
                + [(s, self.program.slot(s).value_type) for s in results]}  # declared: symbolic
        sums = PartialSums(dict(chunking.sums), results, whole_types, backend.to_host)
        slices = []
        for start, size in chunking.slices():
            def cut(name, value, start=start, size=size):
                k = axes[name]
                if k is None:
                    return value
                index = (slice(None),) * k + (slice(start, start + size),)
                return value[index]
            values = {name: cut(name, v) for name, v in bound.values.items()}
            slices.append((size, values, {slot: cut(slot, r) for slot, r in results.items()
                                          if slot not in sums.slots}))
        for size, values, _ in slices:  # index checks of every slice before any kernel writes a result
            for node, positions in plans[size].upfront_checks:
                _check(node, positions, lambda slot: values[slot])
        records: list[dict[str, Any]] | None = [] if trace else None
        arenas: dict[int, dict[str, Any]] = {}
        try:
            for n, c in plans.items():
                arenas[n] = c.acquire_arena()
            for k, (size, values, targets) in enumerate(slices):
                part = BoundValues(values, {**bound.dims, symbol: size},
                                   sum(getattr(v, "nbytes", 0) for v in values.values()),
                                   resident=bound.resident)
                # a target a kernel can write (C-contiguous) is written in place; others are copied
                inplace = {slot: t for slot, t in targets.items() if _contiguous(t)}
                got = self._execute(plans[size], part, arenas[size], trace, {**inplace, **sums.target(k)},
                                    (inputs, banks))
                for slot, t in targets.items():
                    if slot not in inplace:
                        t[...] = got[slot]
                sums.add(k, got)
                if records is not None:
                    records.extend({**r, "chunk": k} for r in got.trace)
        finally:
            for n, arena in arenas.items():  # (only those acquired)
                plans[n].release_arena(arena)
        sums.finish()
        return Result({slot: results[slot] for slot in self.program.outputs}, records,
                      attrs.evolve(compiled.plan, chunking=chunking))

    def _check_host(self, bound) -> None:
        """Host backends refuse device arrays."""
        if not self.backend.device_memory:
            for name, v in bound.values.items():
                if not isinstance(v, np.ndarray):
                    kind = "inputs" if self.program.binding(name).kind == "input" else "banks"
                    fail("binding_dtype", f"$.{kind}.{name}",
                         f"{name!r} is a device array; backend {self.backend.name!r} takes host "
                         "NumPy arrays (use backend='cuda', or copy it to the host)")

    def _float_dtypes(self, bound) -> dict[str, str]:
        """The float dtype each ``floating`` binding was bound as."""
        return {b.name: formula_dtype(bound.values[b.name].dtype) for b in self.program.bindings
                if b.value_type.dtype == "floating"}

    def _deferred_finite(self, structure: tuple) -> frozenset[str] | None:
        compiled = self._by_structure.get(structure)
        return compiled.deferred_finite if compiled is not None else None

    def _compiled_for(self, bound, check_outputs: bool = False) -> CompiledPlan:
        """The compiled plan for these values' extents and float dtypes (host backends refuse
        device arrays here). Remembered per value structure for the binder's fast path
        (unchecked runs only)."""
        self._check_host(bound)
        dtypes = self._float_dtypes(bound)
        if self._tiers is not None and not check_outputs:  # (checked runs are never tiered)
            compiled = self._tiers.ready(bound, dtypes)
            if compiled is None:
                return None
        else:
            compiled = self._compiled(bound.dims, dtypes, frozenset(bound.resident), check_outputs)
        if bound.structure is not None and not check_outputs:
            if len(self._by_structure) >= MAX_CACHED_PLANS:
                self._by_structure.clear()
            self._by_structure[bound.structure] = compiled
        return compiled

    def _execute(self, compiled: CompiledPlan, bound, arena: dict[str, Any], trace: bool,
                 given: dict[str, Any], raw: tuple[Any, Any]) -> Result:
        backend = self.backend
        backend.entering_run()
        plan = compiled.plan
        host_results = backend.device_memory and _host_values(bound)
        values: dict[str, Any] = dict(bound.values) if not backend.device_memory else \
            {name: bound.resident[name] if name in bound.resident else backend.to_backend(v)
             for name, v in bound.values.items()}
        values.update(arena)
        outputs: dict[str, Any] = {}
        for slot, t in compiled.outputs:
            target = given.get(slot) if given else None
            if target is not None and is_device_array(target) == backend.device_memory:
                outputs[slot] = values[slot] = target  # written in place by its kernel
            else:
                outputs[slot] = values[slot] = compiled.results.take(slot, lambda: backend.empty(t))
        records = [] if trace else None
        driver = None if trace else compiled.driver(values)
        if driver is not None and driver.takes(values):
            for part in driver.parts:
                if isinstance(part, int):
                    self._run_launch(compiled.launches[part], values, bound, raw, None)
                    continue
                try:
                    found = part.run(values)
                except Exception as exc:  # Numba refusing these values' types: before any kernel ran
                    if isinstance(exc, (FormulaError, MemoryError)):
                        raise
                    if not type(exc).__module__.startswith("numba"):
                        nodes = [n for k in part.launches for n in compiled.launches[k].nodes]
                        raise _group_failed(nodes, backend.name, "kernel (in a compiled call)", exc) from exc
                    compiled.drop_driver(exc)
                    for k in part.launches:
                        self._run_launch(compiled.launches[k], values, bound, raw, None)
                    continue
                if found:  # non-finite values read
                    self._binder.check_finite(bound, compiled.deferred_finite, *raw)
        else:
            for launch in compiled.launches:
                self._run_launch(launch, values, bound, raw, records)
        if compiled.synchronize is not None:
            compiled.synchronize()
        if host_results:  # a device backend given host values: host results
            for slot, v in outputs.items():
                if slot in given and given[slot] is not v:
                    v.copy_to_host(given[slot])  # a device result into the caller's host array
                    outputs[slot] = given[slot]
                else:
                    outputs[slot] = backend.to_host(v)
        return Result({slot: outputs[slot] for slot in self.program.outputs}, records, plan, backend.name)

    def _run_launch(self, launch: _Launch, values: dict[str, Any], bound, raw: tuple[Any, Any],
                    records: list[dict[str, Any]] | None) -> None:
        """One kernel launched from Python, after the value checks before it (with a trace
        record when ``records`` is a list)."""
        backend = self.backend
        for node, positions in launch.checks:
            _check(node, positions, lambda slot: backend.to_host(values[slot]))
        out = values[launch.output]
        started = time.perf_counter() if records is not None else 0.0
        extras = [align(values[s]) for s, align in zip(launch.extras, launch.aligners)]
        try:
            found = launch.kernel([values[s] for s in launch.inputs], extras, out)
        except (FormulaError, MemoryError):
            raise
        except Exception as exc:  # plugin code: named, the exception kept as the cause
            raise _group_failed(launch.nodes, backend.name, "kernel", exc) from exc
        if found and launch.counts_nonfinite:  # non-finite values read
            self._binder.check_finite(bound, launch.counts_nonfinite, *raw)
        if launch.check_output == "kernel" and found or launch.check_output == "scan":
            self._check_output(launch, values)
        if records is not None:
            backend.synchronize()
            records.append({**launch.label, "tier": backend.name, "output": launch.output,
                            "ms": (time.perf_counter() - started) * 1e3,
                            "bytes": launch.output_type.nbytes})

    def _check_output(self, launch: _Launch, values: Mapping[str, Any]) -> None:
        """Raise ``nonfinite`` at the first instruction of ``launch``'s group whose output holds
        a NaN or ±inf. A group of several nodes (whose kernel counted a non-finite value among
        them) is replayed node by node on host copies of its operands, each node by its
        reference kernel, to find which one; a kernel's false alarm (a count that came from
        its operands, found finite) passes."""
        nodes = launch.nodes
        if len(nodes) > 1:
            local: dict[str, np.ndarray] = {}
            for node in nodes:
                args = [local[s] if s in local else np.asarray(self.backend.to_host(values[s]))
                        for s in node.input_slots]
                factory = node.atom.kernels.get("reference") or node.atom.kernels.get("cpu")
                if factory is None:  # no host kernel to replay it with: name the whole group
                    _raise_if_nonfinite(node, np.array(np.nan), [n.instruction_id for n in nodes])
                    return
                got = np.empty(node.output_type.shape, numpy_dtype(node.output_type.dtype))
                factory(KernelRequest(node))(args, (), got)
                _raise_if_nonfinite(node, got)
                local[node.output_slot] = got
        out, dtype = values[launch.output], launch.output_type.dtype
        if dtype in ("float32", "float64"):  # a parallel (or on-device) scan
            if not value_is_finite(out):
                _raise_if_nonfinite(nodes[-1], np.asarray(self.backend.to_host(out)))
        elif is_float(dtype):  # float16, bfloat16: NumPy on the host
            _raise_if_nonfinite(nodes[-1], np.asarray(self.backend.to_host(out)))


def _raise_if_nonfinite(node: Node, value: np.ndarray, group: list[str] | None = None) -> None:
    if group is not None:
        fail("nonfinite", node.path,
             f"fused instructions {group} produced a non-finite value (NaN or ±inf); instruction "
             f"{node.instruction_id!r} ({node.atom.ref}) has no host kernel to tell which one; "
             "check_outputs rejects NaN and ±inf in every instruction output (SPEC §3b.3 item 2)")
    if not is_float(node.output_type.dtype):
        return
    bad = ~np.isfinite(value.astype(np.float64) if value.dtype.kind != "f" else value)
    if not bad.any():
        return
    where = np.unravel_index(int(np.argmax(bad)), value.shape) if value.ndim else ()
    first = value[where] if value.ndim else value.item()
    instruction = node.instruction_id.split("~", 1)[0]  # (a planner-made half conversion's own)
    fail("nonfinite", node.path,
         f"instruction {instruction!r} ({node.atom.ref}) produced {int(bad.sum())} non-finite "
         f"value(s) in {node.output_slot.split('~', 1)[0]!r}, the first {float(first)} at index "
         f"{tuple(int(i) for i in where)}; check_outputs rejects NaN and ±inf in every "
         f"instruction output (SPEC §3b.3 item 2)")


def _host_values(bound) -> bool:
    return all(isinstance(v, np.ndarray) for v in bound.values.values())


def _check(node: Node, positions, fetch) -> None:
    host = [None] * len(node.input_slots)
    for k in positions:
        host[k] = fetch(node.input_slots[k])
    failures.guard(node.atom.check_values, node.atom, node.path, "value check (check_values)", node, host)


def _group_failed(nodes, backend: str, what: str, exc: Exception) -> FormulaError:
    """kernel_failed for the kernel of a group: named by its first node (the anchor, whose
    kernel ran, or the chain's first step), the others it fused listed."""
    node = nodes[0]
    others = [f"{n.instruction_id} ({n.atom.ref})" for n in nodes[1:]]
    fused = f" (fused with {', '.join(others)})" if others else ""
    return failures.kernel_failed(node.atom, node.path, f"{backend!r} {what}{fused}", exc, backend)


def check_chunks(chunks: Any) -> None:
    """``chunks``: "auto" or a positive number of positions per slice."""
    if chunks == "auto" and isinstance(chunks, str):
        return
    if isinstance(chunks, bool) or not isinstance(chunks, int) or chunks < 1:
        fail("schema", "$.chunks", f"chunks must be 'auto' or a positive integer (positions per "
                                   f"slice along a free axis), got {chunks!r}")


def _axis_of(t: TensorType, symbol: str) -> int | None:
    return next((k for k, s in enumerate(t.sizes) if s == symbol), None)


def _contiguous(a: Any) -> bool:
    flags = getattr(a, "flags", None)
    if flags is not None:
        return bool(flags["C_CONTIGUOUS"])
    return bool(getattr(a, "is_c_contiguous", lambda: False)())


def check_dims(program: Program, dims: Mapping[str, int]) -> dict[str, int]:
    if not isinstance(dims, Mapping):
        fail("schema", "$.dims", f"dims must be a mapping of symbol to extent, got {type(dims).__name__}")
    symbols = set(program.symbols)
    out = {}
    for name, extent in dims.items():
        if name not in symbols:
            fail("binding_keys", f"$.dims.{name}", f"program has no symbol {name!r}"
                 f"{did_you_mean(str(name), symbols)} (symbols: {sorted(symbols)})")
        if isinstance(extent, bool) or not isinstance(extent, int) or extent < 1:
            fail("binding_shape", f"$.dims.{name}", f"extent of {name!r} must be a positive integer, got {extent!r}")
        out[name] = extent
    return out


# --- tiered execution --------------------------------------------------------------------
class _Tiers:
    """The tiers of one executable: a plan whose kernels are not ready runs on a private
    ``reference`` executable of the same program while a background thread builds the plan,
    compiles its kernels (two runs on copies of the first run's values: the kernels, then the
    one-call driver) and their other variants; the next run after that takes it.

    A thread rather than a worker process: Numba releases no GIL while it compiles, but the
    reference runs meanwhile spend their time in NumPy, which does; and a process would have to
    rebuild the registry and the plan, then still load every kernel from the disk cache here.
    A plan whose kernels the disk cache holds (its readiness marker) is built in the foreground.
    """

    def __init__(self, exe: Executable):
        self._exe = exe
        self._lock = threading.Lock()
        self._pending: dict[tuple, background.Thread] = {}
        self._errors: dict[tuple, FormulaError] = {}
        self._fallback: Executable | None = None

    @staticmethod
    def _key(dims, dtypes, resident) -> tuple:
        """``Executable._compiled``'s key of an unchecked plan of a whole run (check_outputs
        False, no ``whole``)."""
        return (tuple(sorted(dims.items())), tuple(sorted(dtypes.items())), resident, False, None)

    def ready(self, bound, dtypes: dict[str, str]) -> CompiledPlan | None:
        """The compiled plan for these values when it is ready, else None (its compilation
        started in the background if it was not running). A failed one raises its error."""
        exe = self._exe
        resident = frozenset(bound.resident)
        key = self._key(bound.dims, dtypes, resident)
        with exe._plans_lock:
            compiled = exe._plans.get(key)
            # kernels depend on dtypes and layouts, not on the extents of symbolic axes: with a
            # plan of the same dtypes compiled (and warmed), a new extent compiles nothing
            known = compiled is None and any(k[1:] == key[1:] for k in exe._plans)
        if compiled is not None:
            return compiled
        with self._lock:  # a failed build is this key's answer, whatever the disk cache holds
            error = self._errors.get(key)
        if error is not None:
            raise error
        if known or ready_marker(exe._ready_key(dtypes, resident)).is_file():
            # (kernels of these dtypes are in the disk cache: loading them beats the reference tier)
            return exe._compiled(dict(bound.dims), dtypes, resident)
        if key not in self._pending and key not in self._errors:
            # planned here (nothing compiled) so that a refused ScalarOp expression or a
            # raising infer is this run's error, not the background compilation's (which
            # alone types the expressions with Numba, as every kernel build does)
            exe._schedule(dict(bound.dims), dtypes, enforce=False)
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

    def _compile(self, key, dims, dtypes, resident, bound, values) -> None:
        exe = self._exe
        try:
            compiled = exe._build(dims, dtypes, resident)
            compiled.driver_after = 2  # (its drivers start building on the second run here)
            copy = attrs.evolve(bound, values=values, structure=None)
            for _ in range(compiled.driver_after):  # the kernels compile on their first call
                arena = compiled.acquire_arena()
                try:
                    exe._execute(compiled, copy, arena, False, {}, (values, None))
                finally:
                    compiled.release_arena(arena)
            compiled.warm()  # (the drivers go on building: the plan is published without them)
            mark_ready(exe._ready_key(dtypes, resident))
        except Exception as exc:  # a kernel that fails to compile must not be lost in a thread
            if background.exiting():  # cancelled at exit (background.Cancelled): nothing failed
                return
            if isinstance(exc, FormulaError):
                with self._lock:
                    self._errors[key] = exc
                return
            error = FormulaError("backend_unavailable", "$", f"compiling the {exe.backend.name} kernels "
                                 f"for extents {dims or '{}'} failed in the background: "
                                 f"{type(exc).__name__}: {exc}")
            with self._lock:
                self._errors[key] = error
        else:
            with exe._plans_lock:
                exe._plans[key] = compiled
                while len(exe._plans) > MAX_CACHED_PLANS:
                    exe._plans.popitem(last=False)
        finally:
            with self._lock:
                self._pending.pop(key, None)

    def fallback_run(self, inputs, banks, trace: bool, out) -> Result:
        if self._fallback is None:
            with self._lock:
                if self._fallback is None:
                    exe = self._exe
                    self._fallback = Executable(exe.program, "reference", exe.registry, exe.memory_limit,
                                                tiered=False)
        try:
            with running_first_tier():  # (reference kernels' faster paths: BLAS contractions)
                return self._fallback.run(inputs=inputs, banks=banks, trace=trace, out=out)
        finally:
            self._start_pending()

    def wait(self, timeout: float | None) -> bool:
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
