"""Result arrays lent to callers and reclaimed once nothing outside the pool refers to them.

Standard library only, so the mechanism is tested on every supported CPython (each counts
the references a loop holds in its own way: the idle count is measured, not assumed).
"""
from __future__ import annotations

import sys
import threading
import weakref
from collections.abc import Callable
from typing import Any

KEEP_PER_SLOT = 2  # `y = exe.run(...)` in a loop still holds the previous result during a run


def _first_idle(candidates, idle: int | None) -> Any:
    """The first candidate whose reference count is ``idle`` and that no weak reference
    names; with ``idle`` None, the count the first candidate shows here (calibration)."""
    for value in candidates:
        count = sys.getrefcount(value)
        if idle is None:
            return count
        if count == idle and not weakref.getweakrefcount(value):
            return value
    return None


# what a pooled value held by nothing else shows in _first_idle (the list, the loop variable,
# the call's argument on CPython 3.10-3.13), measured through the very same code path
_IDLE = _first_idle([bytearray(1)], None)


class ResultPool:
    """Result arrays lent to callers, per output slot, reclaimed once they are unreferenced
    (no name, container, view, buffer export or weak reference: exactly when freeing them
    would be safe, so reuse is indistinguishable from free then malloc of warm memory).

    An array stays in the pool while a run writes it and while the caller holds it: the
    references of either keep it from being taken again, so a run takes one without
    removing it, and nothing has to be put back after the run."""

    def __init__(self):
        self._lent: dict[str, list[Any]] = {}
        self._lock = threading.Lock()

    def take(self, slot: str, make: Callable[[], Any]) -> Any:
        """An array for ``slot``'s result: a pooled one that nothing else refers to, else
        ``make()``, pooled from now on."""
        with self._lock:  # the caller's reference exists before another run can look
            value = _first_idle(self._lent.get(slot, ()), _IDLE)
            if value is not None:
                return value
        value = make()
        with self._lock:
            lent = self._lent.setdefault(slot, [])
            lent.append(value)
            if len(lent) > KEEP_PER_SLOT:
                del lent[0]  # the caller keeps it; it is simply no longer ours to reuse
        return value

    def clear(self) -> None:
        with self._lock:
            self._lent.clear()
