"""Chunked runs (``run(chunks=...)``, ``run(slice_of=...)``): how a run is sliced along a
free axis (:mod:`runtime.plan.freeaxes`), decided once per extents, dtypes and ``chunks``, and
the sliced run itself — every slice through one compiled plan (its nodes carry
``Node.whole``) and one arena (a second for a shorter last slice when outputs are sums,
added by :mod:`runtime.execution.partials`)."""
from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import attrs
import numpy as np

from runtime.core.errors import fail
from runtime.core.types import TensorType, numpy_dtype
from runtime.execution.bindings import BoundValues
from runtime.execution.compiled import PlanBuilder
from runtime.execution.launches import Launcher, check_values, host_values
from runtime.execution.outputs import check_out
from runtime.execution.partials import PartialSums
from runtime.execution.plancache import PlanCache
from runtime.execution.pool import ResultPool
from runtime.kernels.arrays import is_device_array
from runtime.plan.freeaxes import Chunking, accumulation_dtype, even_slices
from runtime.plan.planner import Plan


def check_chunks(chunks: Any) -> None:
    """``chunks``: "auto" or a positive number of positions per slice."""
    if chunks == "auto" and isinstance(chunks, str):
        return
    if isinstance(chunks, bool) or not isinstance(chunks, int) or chunks < 1:
        fail("schema", "$.chunks", f"chunks must be 'auto' or a positive integer (positions per "
                                   f"slice along a free axis), got {chunks!r}")


class Chunker:
    """The chunked runs of the plans ``builder`` makes: each slicing decided once (kept in a
    :class:`~runtime.execution.plancache.PlanCache`), slices run by ``launcher``."""

    def __init__(self, builder: PlanBuilder, launcher: Launcher):
        self.builder = builder
        self.launcher = launcher
        self.program = builder.program
        self.free_axes = builder.free_axes
        self.memory_limit = builder.memory_limit
        # (extents, dtypes, chunks) -> (the slicing, the whole outputs' types, their result pool)
        self.cache: PlanCache[tuple[Chunking | None, dict[str, TensorType], ResultPool]] = PlanCache()

    def chunking(self, dims: dict[str, int], dtypes: dict[str, str], chunks: str | int):
        """(the slicing, the whole outputs' types, their result pool), decided once per
        extents, dtypes and ``chunks``; the slicing is None when ``chunks="auto"`` and the
        whole fits."""
        key = (tuple(sorted(dims.items())), tuple(sorted(dtypes.items())), chunks)
        entry = self.cache.get(key)
        if entry is not None:
            return entry
        whole, types, _ = self.builder.schedule(dims, dtypes, enforce=False)
        chunking = self._choose_chunking(whole, dims, dtypes, chunks)
        if chunking is not None and self.free_axes.sums.get(chunking.symbol):  # added slice by slice
            chunking = attrs.evolve(chunking, sums=tuple(
                (slot, accumulation_dtype(types[slot].dtype)) for slot in self.free_axes.sums[chunking.symbol]))
        entry = (chunking, {slot: types[slot] for slot in self.program.outputs}, ResultPool())
        return self.cache.setdefault(key, entry)

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
        sliced = self.builder.schedule({**dims, symbol: size}, dtypes, enforce=False)[0]
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
                return self._fits(self.builder.schedule({**dims, symbol: size}, dtypes, enforce=False)[0])

            if fits(1):
                break
        else:
            one = self.builder.schedule({**dims, free[-1]: 1}, dtypes, enforce=False)[0]
            fail("limit_exceeded", "$.limits.max_working_bytes",
                 f"even a slice of one position along {free[-1]!r} needs {one.working_bytes} bytes "
                 f"but max_working_bytes allows {one.max_working_bytes}"
                 + (f" (and along {', '.join(map(repr, free[:-1]))} no less)" if len(free) > 1 else ""))
        lo, hi = 1, extents[symbol]  # fits(lo); hi: the whole, which does not
        while hi - lo > 1:
            mid = (lo + hi) // 2
            lo, hi = (mid, hi) if fits(mid) else (lo, mid)
        return symbol, lo

    def run(self, bound: BoundValues, dtypes: dict[str, str], chunking: Chunking,
            whole_types: dict[str, TensorType], pool: ResultPool, trace: bool, out, raw: tuple[Any, Any],
            slice_of: dict[str, int] | None) -> tuple[dict[str, Any], list[dict[str, Any]] | None, Plan]:
        """Run ``bound`` (checked values, host ones on a host backend; ``dtypes``: the float
        dtype of each ``floating`` binding) slice by slice: (the outputs by slot, the trace
        records with each slice's ``chunk`` or None, the plan of a slice with its
        ``chunking``). ``raw``: the run's inputs and banks as passed."""
        resident = frozenset(bound.resident)
        symbol = chunking.symbol
        # one plan per slice size (a shorter last slice when outputs are sums over the symbol)
        plans = {n: self.builder.compiled({**bound.dims, symbol: n}, dtypes, resident,
                                          whole={**bound.dims, **(slice_of or {})})
                 for n in dict.fromkeys(n for _, n in chunking.slices())}
        compiled = plans[chunking.size]
        given = check_out(out, self.program.outputs, whole_types, bound.values, is_device_array) \
            if out is not None else {}
        backend = self.launcher.backend
        host_results = not backend.device_memory or host_values(bound)
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
                check_values(node, positions, lambda slot: values[slot])
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
                got, got_trace = self.launcher.execute(plans[size], part, arenas[size], trace,
                                                      {**inplace, **sums.target(k)}, raw)
                for slot, t in targets.items():
                    if slot not in inplace:
                        t[...] = got[slot]
                sums.add(k, got)
                if records is not None:
                    records.extend({**r, "chunk": k} for r in got_trace)
        finally:
            for n, arena in arenas.items():  # (only those acquired)
                plans[n].release_arena(arena)
        sums.finish()
        return ({slot: results[slot] for slot in self.program.outputs}, records,
                attrs.evolve(compiled.plan, chunking=chunking))


def _axis_of(t: TensorType, symbol: str) -> int | None:
    return next((k for k, s in enumerate(t.sizes) if s == symbol), None)


def _contiguous(a: Any) -> bool:
    flags = getattr(a, "flags", None)
    if flags is not None:
        return bool(flags["C_CONTIGUOUS"])
    return bool(getattr(a, "is_c_contiguous", lambda: False)())
