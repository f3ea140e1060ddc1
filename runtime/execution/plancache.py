"""The plan key, and the one cache an executable keeps its compiled plans (and what it decides
once per plan: which compiled plan a value structure takes, how a run is chunked) in.

Every such cache is a :class:`PlanCache`: bounded to :data:`MAX_CACHED_PLANS` entries, the
least recently used one evicted first, safe to share between threads.
"""
from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Hashable, Iterator, Mapping
from typing import Any, Generic, NamedTuple, TypeVar

MAX_CACHED_PLANS = 16

V = TypeVar("V")


class PlanKey(NamedTuple):
    """What a compiled plan depends on: the extents, the float dtype of each ``floating``
    binding, the resident banks, the output check and, for one slice of a larger run, that
    run's extents (``whole``)."""

    dims: tuple[tuple[str, int], ...]
    dtypes: tuple[tuple[str, str], ...]
    resident: frozenset[str]
    check_outputs: bool
    whole: tuple[tuple[str, int], ...] | None

    @property
    def kernels(self) -> tuple:
        """The key less the extents: kernels depend on dtypes and layouts, not on the extents
        of symbolic axes (two keys equal here share their kernels)."""
        return self[1:]


def plan_key(dims: Mapping[str, int], dtypes: Mapping[str, str], resident: frozenset[str] = frozenset(),
             check_outputs: bool = False, whole: Mapping[str, int] | None = None) -> PlanKey:
    """The key of these extents' plan (``whole``: None, or the extents of the run these are a
    slice of when they differ)."""
    return PlanKey(tuple(sorted(dims.items())), tuple(sorted(dtypes.items())), resident, check_outputs,
                   tuple(sorted(whole.items())) if whole else None)


def ready_key(fingerprint: str, backend: str, dtypes: Mapping[str, str], resident: frozenset[str]) -> str:
    """What the kernels of a whole, unchecked plan depend on besides layouts: the program, the
    backend, the dtypes and which banks are resident (``codegen.ready_marker``)."""
    return "|".join([fingerprint, backend, repr(sorted(dtypes.items())), repr(sorted(resident))])


class PlanCache(Generic[V]):
    """A bounded mapping: at most ``size`` entries, the least recently used (read or written)
    evicted when a new one would pass the bound. Every operation holds the cache's lock, so
    threads share it; what it returns is a snapshot."""

    def __init__(self, size: int = MAX_CACHED_PLANS):
        if size < 1:
            raise ValueError(f"a PlanCache holds at least one entry, not {size}")
        self.size = size
        self._entries: OrderedDict[Hashable, V] = OrderedDict()
        self._lock = threading.Lock()

    def get(self, key: Hashable, default: Any = None) -> V | Any:
        """The entry for ``key`` (now the most recently used), else ``default``."""
        with self._lock:
            value = self._entries.get(key, default)
            if key in self._entries:
                self._entries.move_to_end(key)
            return value

    def put(self, key: Hashable, value: V) -> V:
        """Keep ``value`` for ``key`` (replacing any), evicting the least recently used beyond
        the bound; returns ``value``."""
        with self._lock:
            self._entries[key] = value
            self._entries.move_to_end(key)
            self._evict()
        return value

    def setdefault(self, key: Hashable, value: V) -> V:
        """The entry for ``key`` when there is one (a concurrent maker's), else ``value``, kept."""
        with self._lock:
            if key in self._entries:
                self._entries.move_to_end(key)
                return self._entries[key]
            self._entries[key] = value
            self._evict()
            return value

    def _evict(self) -> None:
        while len(self._entries) > self.size:
            self._entries.popitem(last=False)

    def keys(self) -> list[Hashable]:
        """The keys, least recently used first."""
        with self._lock:
            return list(self._entries)

    def values(self) -> list[V]:
        """The entries, least recently used first."""
        with self._lock:
            return list(self._entries.values())

    def items(self) -> list[tuple[Hashable, V]]:
        with self._lock:
            return list(self._entries.items())

    def __iter__(self) -> Iterator[Hashable]:
        return iter(self.keys())

    def __len__(self) -> int:
        return len(self._entries)

    def __contains__(self, key: Hashable) -> bool:
        return key in self._entries
