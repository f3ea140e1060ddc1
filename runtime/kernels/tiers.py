"""Whether the kernels running now serve the first tier: the runs a tiered executable sends to
its private ``reference`` executable while the compiled kernels build in the background.

Those runs need speed more than the oracle's exact summation order, so a reference kernel may
take a faster NumPy path there (the contraction: BLAS through ``np.matmul`` instead of
``np.einsum``); ``backend="reference"`` itself never does. A context variable, set around one
run by the executor, so that concurrent runs of the oracle in other threads are not affected.
"""
from __future__ import annotations

import contextlib
import contextvars
from collections.abc import Iterator

_first_tier: contextvars.ContextVar[bool] = contextvars.ContextVar("formula_first_tier", default=False)


def first_tier() -> bool:
    """Whether this thread runs a first-tier run now."""
    return _first_tier.get()


@contextlib.contextmanager
def running_first_tier() -> Iterator[None]:
    """Mark the runs inside as first-tier runs (see the module)."""
    token = _first_tier.set(True)
    try:
        yield
    finally:
        _first_tier.reset(token)
