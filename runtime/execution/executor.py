"""Compiled executables: plan once per set of extents, then run groups over one arena.

A run binds and checks the values (SPEC §4), finds or builds the compiled plan for their
extents (types, fused groups, kernels, arena layout, memory preflight — all before anything
is allocated; :mod:`runtime.execution.compiled`), then launches one kernel per group
(:mod:`runtime.execution.launches`). Results never alias the arena or memory a later run
writes: they are the caller's ``out=`` arrays, or arrays of the plan's
:class:`~runtime.execution.pool.ResultPool` (fresh, or ones the caller has let go of entirely).
Chunked runs are :mod:`runtime.execution.chunked`'s, tiered ones :mod:`runtime.execution.tiers`'s.
"""
from __future__ import annotations

import time
from collections.abc import Iterator, Mapping
from typing import Any

import attrs
import numpy as np

from runtime.core.errors import did_you_mean, fail
from runtime.core.types import TensorType, formula_dtype
from runtime.execution.bindings import Binder, BoundValues, bind_values, load_resident
from runtime.execution.chunked import Chunker, check_chunks
from runtime.execution.compiled import CompiledPlan, PlanBuilder
from runtime.execution.launches import Launcher, check_values, host_values
from runtime.execution.outputs import check_out
from runtime.execution.plancache import PlanCache, plan_key
from runtime.execution.resident import ResidentBanks
from runtime.execution.tiers import Tiers, tiered_default
from runtime.kernels import compilelog
from runtime.kernels.arrays import is_device_array
from runtime.kernels.codegen import heal_numba_cache, mark_ready
from runtime.plan.freeaxes import FreeAxes, free_axes
from runtime.plan.memory import memory_limit as runtime_memory_limit, no_memory_error
from runtime.plan.planner import Plan
from runtime.plugins.registry import Registry, is_default_registry
from runtime.program.model import Program


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


class Executable:
    def __init__(self, program: Program, backend: str, registry: Registry, memory_limit: Any = None,
                 tiered: bool | None = None):
        """``memory_limit``: the runtime ceiling for every run (:func:`runtime.plan.memory.memory_limit`).
        ``tiered`` (:func:`~runtime.execution.tiers.tiered_default`): a run whose plan's kernels
        are not compiled yet runs on the ``reference`` kernels while they compile in a
        background thread; later runs take the compiled plan once it is ready
        (:meth:`wait_compiled` waits for it)."""
        self.memory_limit = runtime_memory_limit(memory_limit)
        heal_numba_cache()  # before the first kernel is loaded from the disk cache
        self.program = program
        self.registry = registry
        self.backend = registry.backend(backend)
        self.specs = [registry.atom(ins.atom_ref, f"$.instructions[{i}].atom_ref")
                      for i, ins in enumerate(program.instructions)]
        self.free_axes: FreeAxes = free_axes(program, self.specs)
        self._plans: PlanCache[CompiledPlan] = PlanCache()  # by plan key
        self._builder = PlanBuilder(program, self.specs, self.backend, self.memory_limit, self.free_axes,
                                    self._plans)
        # the binder's value structures -> their compiled plan (unchecked runs), the last one apart
        self._by_structure: PlanCache[CompiledPlan] = PlanCache()
        self._last_structure: tuple[tuple | None, CompiledPlan | None] = (None, None)
        self._binder = Binder(program, self._deferred_finite, self.memory_limit)
        self._launcher = Launcher(self.backend, self._binder, program.outputs)
        self._chunker = Chunker(self._builder, self._launcher)
        compilelog.install()  # kernels compile lazily, on first call: say so on runtime.compile
        self.tiered = tiered_default(self.backend.name, tiered)
        self._tiers = Tiers(self._builder, self._launcher, self._reference,
                            worker=self.backend.name == "cpu" and is_default_registry(registry)
                            and registry.reproducible) if self.tiered else None

    def _reference(self) -> Executable:
        """An executable of the same program on the ``reference`` backend (the first tier)."""
        return Executable(self.program, "reference", self.registry, self.memory_limit, tiered=False)

    def release_memory(self) -> None:
        """Give back what the executable keeps between runs — idle arenas and released result
        arrays — while keeping its compiled plans and kernels. The next run allocates anew."""
        for c in self._plans.values() + self._by_structure.values():
            c.release_memory()

    def wait_compiled(self, timeout: float | None = None) -> bool:
        """Wait until every plan compiling in the background (tiered runs) is ready, and every
        compiled driver building in the background, for deterministic timing; True when none
        is left. A failed background compilation is raised here (and by the next run that
        needs that plan) as a FormulaError."""
        deadline = None if timeout is None else time.monotonic() + timeout
        if self._tiers is not None and not self._tiers.wait(timeout):
            return False
        return all(c.wait_driver(None if deadline is None else max(0.0, deadline - time.monotonic()))
                   for c in self._plans.values())

    def warm(self) -> None:
        """Build every variant of the compiled plans' kernels that a later extent may take
        (e.g. the parallel twin of a kernel that ran serially), so new extents of symbolic
        axes compile nothing. Tiered executables do it in the background."""
        self.wait_compiled()
        for key, c in self._plans.items():
            c.warm()
            if not key.check_outputs and key.whole is None:  # a whole unchecked plan: what tiered runs take
                mark_ready(self._builder.ready_key(dict(key.dtypes), key.resident))

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
            chunking = self._chunker.chunking(dims, dict(dtypes or {}), chunks)[0]
            if chunking is not None:
                sliced = {**dims, chunking.symbol: chunking.size}
                plan = self._builder.compiled(sliced, dict(dtypes or {}), whole=dims).plan if enforce else \
                    self._builder.schedule(sliced, dict(dtypes or {}), enforce=False)[0]
                return attrs.evolve(plan, chunking=chunking)
        if not enforce:
            return self._builder.schedule(dims, dict(dtypes or {}), enforce=False)[0]
        return self._builder.compiled(dims, dict(dtypes or {})).plan

    def output_types(self, dims: Mapping[str, int], dtypes: Mapping[str, str] | None = None) -> dict[str, TensorType]:
        """Each output's resolved type for these extents (``dtypes``: the float dtype of each
        ``floating`` binding); nothing is compiled and the working set is not enforced."""
        types = self._builder.schedule(check_dims(self.program, dims), dict(dtypes or {}), enforce=False)[1]
        return {slot: types[slot] for slot in self.program.outputs}

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
            compiled = self._builder.compiled(bound.dims, self._float_dtypes(bound), frozenset(bound.resident),
                                              whole=whole)
        elif bound.structure is not None and last[0] is bound.structure:
            compiled = last[1]
            if not bound.unchecked <= compiled.deferred_finite:  # (bound before that plan was found)
                self._binder.check_finite(bound, bound.unchecked - compiled.deferred_finite, inputs, banks)
        else:
            compiled = self._by_structure.get(bound.structure) if bound.structure is not None else None
            if compiled is not None:  # (its plan is the latest used too: the plan cache keeps it longest)
                self._plans.get(plan_key(bound.dims, self._float_dtypes(bound), frozenset(bound.resident)))
            else:
                compiled = self._compiled_for(bound)
                if compiled is None:  # tiered: its kernels are compiling; this run on reference's
                    return self._tiers.fallback_run(inputs, banks, trace, out)
            if bound.structure is not None:
                self._last_structure = (bound.structure, compiled)  # one tuple: replaced atomically
            rest = bound.unchecked - compiled.deferred_finite  # (a new structure's: no kernel counts them)
            if rest:
                self._binder.check_finite(bound, rest, inputs, banks)
        given = self._given(out, compiled, bound) if out is not None else {}
        if given and bound.unchecked:  # the caller's out arrays are never written on bad input
            self._binder.check_finite(bound, bound.unchecked, inputs, banks)
        for node, positions in compiled.upfront_checks:
            check_values(node, positions, lambda slot: bound.values[slot])
        arena = compiled.acquire_arena()
        try:
            values, records = self._launcher.execute(compiled, bound, arena, trace, given, (inputs, banks))
        finally:
            compiled.release_arena(arena)
        return Result(values, records, compiled.plan, self.backend.name)

    def _given(self, out, compiled: CompiledPlan, bound) -> dict[str, Any]:
        """The caller's ``out`` arrays, checked like bindings and for the kind of memory
        (host or device) this run's results are."""
        given = check_out(out, self.program.outputs, compiled.types, bound.values, is_device_array) \
            if out is not None else {}
        device_results = bool(given) and self.backend.device_memory and not host_values(bound)
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
            check_values(node, positions, lambda slot: bound.values[slot])
        arena = compiled.acquire_arena()
        try:
            values, records = self._launcher.execute(compiled, bound, arena, trace, {}, (inputs, banks))
        finally:
            compiled.release_arena(arena)
        for slot, target in given.items():
            value = values[slot]
            if is_device_array(target):
                target.copy_to_device(value)
            else:
                np.copyto(target, self.backend.to_host(value))
            values[slot] = target
        return Result(values, records, compiled.plan, self.backend.name)

    def _run_chunked(self, inputs, banks, trace: bool, out, chunks: str | int | None,
                     slice_of: dict[str, int] | None) -> Result:
        # the values together may pass max_working_bytes: each slice is preflighted instead
        bound = bind_values(self.program, inputs, banks, self.memory_limit, whole_working=chunks is None)
        self._check_host(bound)
        dtypes = self._float_dtypes(bound)
        chunking, whole_types, pool = self._chunker.chunking(dict(bound.dims), dtypes, chunks) \
            if chunks is not None else (None, None, None)
        if chunking is None:  # the whole fits: an ordinary run, on the values bound already
            return self._run_bound(bound, inputs, banks, trace, out,
                                   {**bound.dims, **slice_of} if slice_of is not None else None)
        values, records, plan = self._chunker.run(bound, dtypes, chunking, whole_types, pool, trace, out,
                                                  (inputs, banks), slice_of)
        return Result(values, records, plan)

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
            compiled = self._builder.compiled(bound.dims, dtypes, frozenset(bound.resident), check_outputs)
        if bound.structure is not None and not check_outputs:
            self._by_structure.put(bound.structure, compiled)
        return compiled


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
