"""The runtime's own memory ceiling, independent of the program (a program may raise its own
``max_working_bytes`` as far as it likes; it cannot raise this).

The ceiling of an executable is ``compile(..., memory_limit=)``, else the environment's
``FORMULA_MEMORY_LIMIT`` (bytes, or with a K/M/G/T suffix, powers of 1024), else the memory
the machine has available when the executable is made. A run whose bound values, arena peak
and outputs exceed it gets ``limit_exceeded`` naming both limits, before anything is allocated.
"""
from __future__ import annotations

import functools
import math
import os
from typing import Any, Callable, TypeVar

from runtime.core import settings
from runtime.core.errors import fail

ENV = settings.MEMORY_LIMIT.name
_UNBOUNDED = 1 << 62  # a machine that cannot say what it has: the program's limits alone

F = TypeVar("F", bound=Callable[..., Any])


def available_memory() -> int:
    """Bytes the machine can give a new allocation now (``MemAvailable``), else its physical
    memory, else an unbounded figure."""
    try:
        with open("/proc/meminfo", encoding="ascii") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    try:
        return os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (AttributeError, OSError, ValueError):
        return _UNBOUNDED


def parse_amount(text: str, path: str) -> int:
    try:
        return settings.byte_amount(text)
    except ValueError:
        fail("schema", path, f"memory limit {text!r} is not {settings.BYTES_EXPECTED}")


def memory_limit(value: Any = None) -> int:
    """The ceiling for an executable: ``value`` (int bytes or a string like ``"8G"``), else
    ``FORMULA_MEMORY_LIMIT``, else the machine's available memory."""
    if value is None:
        limit = settings.MEMORY_LIMIT.read()  # per call: the environment when the executable is made
        return available_memory() if limit is None else limit
    if isinstance(value, str):
        return parse_amount(value, "$.memory_limit")
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        fail("schema", "$.memory_limit", f"memory_limit must be a positive int of bytes, got {value!r}")
    return value


def check_ceiling(needed: int, ceiling: int, max_working_bytes: int, path: str, what: str) -> None:
    """``limit_exceeded`` when ``needed`` bytes pass the runtime ceiling, naming both limits."""
    if needed > ceiling:
        fail("limit_exceeded", path,
             f"{what} needs {needed} bytes, over the runtime memory limit of {ceiling} bytes "
             f"(compile(memory_limit=...) or {ENV}); the program's max_working_bytes is "
             f"{max_working_bytes}")


def check_shape(what: str, axes, shape, itemsize: int, limits, path: str) -> int:
    """SPEC §5 per-tensor limits from a shape alone (no value is read: a zero-stride view or a
    file header may declare far more than it holds); returns the tensor's bytes."""
    for axis, extent in zip(axes, shape):
        if extent > limits.max_axis_extent:
            fail("limit_exceeded", path, f"axis {axis} of {what} has extent {extent}; "
                                         f"max_axis_extent allows {limits.max_axis_extent}")
    elements = math.prod(shape)
    nbytes = elements * itemsize
    for unit, got, cap in (("elements", elements, limits.max_tensor_elements),
                           ("bytes", nbytes, limits.max_tensor_bytes)):
        if got > cap:
            fail("limit_exceeded", path, f"{what} (shape {list(shape)}) has {got} {unit}; "
                                         f"max_tensor_{unit} allows {cap}")
    return nbytes


def check_working(total: int, limits, memory_limit: int | None, what: str) -> None:
    """``total`` bytes against the program's ``max_working_bytes`` and the runtime ceiling."""
    if total > limits.max_working_bytes:
        fail("limit_exceeded", "$.limits.max_working_bytes",
             f"{what} need {total} bytes; max_working_bytes allows {limits.max_working_bytes}")
    if memory_limit is not None:
        check_ceiling(total, memory_limit, limits.max_working_bytes, "$.limits.max_working_bytes", what)


def no_memory_error(fn: F) -> F:
    """A public entry point whose ``MemoryError`` (an allocation the checks did not foresee,
    or the machine running short meanwhile) becomes ``limit_exceeded``."""
    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        try:
            return fn(*args, **kwargs)
        except MemoryError as exc:
            fail("limit_exceeded", "$", f"{fn.__name__}: the machine ran out of memory "
                                        f"({exc or 'MemoryError'}); lower the run's size or "
                                        f"{ENV}")
    return wrapper  # type: ignore[return-value]
