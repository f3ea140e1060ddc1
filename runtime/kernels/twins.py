"""Serial/parallel twins: one CPU kernel written as two module-level ``@njit`` functions.

A kernel that runs on one thread below a size and on Numba's threads above it is written
twice, as numbagg writes its kernels: a serial function and a parallel one (``prange``),
both at module level with ``cache=True``, sharing the body through an ``@njit`` helper::

    @njit(cache=True, nogil=True)
    def window_serial(...): ...

    @njit(cache=True, nogil=True, parallel=True)
    def window_parallel(...): ...

    WINDOW = Twins(window_serial, window_parallel)

They stay two written functions: Numba's disk cache tells functions apart by name and line,
not by their ``parallel`` flag, so one function compiled both ways would load one variant's
machine code for the other. Module-level names also let compiled callers import them
(``runtime.execution.driver``). Nothing is written into a module's globals at first use.
"""
from __future__ import annotations

from typing import Any

import attrs


@attrs.frozen(eq=False)
class Twins:
    """The serial and parallel dispatchers of one kernel (same arguments)."""

    serial: Any
    parallel: Any

    def pick(self, parallel: bool) -> Any:
        """The dispatcher to run: the parallel twin when ``parallel``."""
        return self.parallel if parallel else self.serial

    def warm(self) -> None:
        """Build both for every signature either was called with (``Kernel.warm``)."""
        warm_twins(self.serial, self.parallel)


def warm_twins(*dispatchers: Any) -> None:
    """Build (compile, or load from the disk cache) in each of ``dispatchers`` every
    signature any of them has been called with: the serial and parallel variants of one
    kernel take the same arguments, and an extent that crosses from one to the other must
    then compile nothing (``Kernel.warm``)."""
    signatures = {sig for d in dispatchers for sig in d.signatures}
    for d in dispatchers:
        for sig in signatures.difference(d.signatures):
            d.compile(sig)
