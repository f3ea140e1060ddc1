"""One compiled call per run: a generated ``@njit`` driver that calls a plan's kernels in turn.

A run that launches its kernels from Python pays, per kernel, the dispatch of a dozen or more
arguments and the views and layouts of its operands; at small extents (one token) that is
most of the run. When every kernel of a plan can be called from compiled code, the executor
generates a driver that takes the run's slot arrays once and calls them all, with every
layout-derived argument worked out when the driver is built.

That is only sound for arrays of a known layout, so a driver takes a run only when every
binding is C-contiguous and aligned (:meth:`Driver.takes`; arena views and results always
are); other runs, and traced ones, launch kernel by kernel. A kernel takes part by carrying a
:class:`CompiledCall` as its ``Kernel.compiled`` entry: its Numba dispatcher and the meaning of
each of its parameters under that assumption. The driver passes the very types a Python
launch passes (flat C-contiguous arrays, int64 scalars: never literals, which Numba would
compile a new specialisation of the kernel for), so it reuses the kernels' compiled code.
"""
from __future__ import annotations

import contextlib
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import attrs
import numpy as np

from runtime.kernels.codegen import configure_numba_cache, load_generated


@attrs.frozen
class Param:
    """One kernel parameter: ``kind`` is "input" / "extra" (the flat C-order array of operand /
    epilogue operand ``index``), "output" (the flat output), "int" (an int64 ``value``),
    "array" (the constant array ``value``) or "derived" (the array ``value(operand)`` for
    operand ``index`` as bound, worked out in Python before each call: e.g. a cached packed
    form of a resident bank)."""

    kind: str
    index: int = 0
    value: Any = None


def flat_input(index: int) -> Param:
    return Param("input", index)


def derived_input(index: int, derive: Callable[[Any], np.ndarray]) -> Param:
    return Param("derived", index, derive)


def flat_extra(index: int) -> Param:
    return Param("extra", index)


FLAT_OUTPUT = Param("output")


def const_int(value: int) -> Param:
    return Param("int", value=int(value))


def const_array(value: np.ndarray) -> Param:
    return Param("array", value=value)


@attrs.frozen(eq=False)
class CompiledCall:
    """How compiled code calls a kernel (``Kernel.compiled``) whose operands are C-contiguous,
    aligned arrays of their types. ``guard``: a context manager the call must run inside
    (entered once around the whole driver). It returns the count the ``Kernel`` returns when
    that kernel counts anything (``Kernel.counts``)."""

    kernel: Any  # a Numba dispatcher defined at module level in an importable module
    params: tuple[Param, ...]
    guard: Any = None


@contextlib.contextmanager
def _all_of(guards: Sequence[Any]):
    """Several guards entered as one, in order (left in reverse, also when one fails)."""
    with contextlib.ExitStack() as stack:
        for guard in guards:
            stack.enter_context(guard)
        yield


@attrs.frozen(eq=False)
class Driver:
    """A plan's kernels as one compiled function, ``call(*slot arrays, *constants)``, which
    returns the count of non-finite values its kernels read. ``slots``: the slot of each
    array parameter; ``bindings``: those of them the caller supplies (the only ones whose
    layout can differ from run to run: arena views and results are always C-contiguous)."""

    call: Any
    slots: tuple[str, ...]
    bindings: tuple[str, ...]
    constants: tuple[Any, ...]
    derived: tuple[tuple[str, Callable[[Any], Any]], ...] = ()  # (slot, derive): last arguments
    guards: tuple[Any, ...] = ()  # context managers every call runs inside

    def takes(self, values: Mapping[str, Any]) -> bool:
        """Whether these values have the layout the driver was built for."""
        for slot in self.bindings:
            flags = values[slot].flags
            if not (flags.c_contiguous and flags.aligned):
                return False
        return True

    def run(self, values: Mapping[str, Any]) -> int:
        args = [values[slot] for slot in self.slots]
        args += self.constants
        for slot, derive in self.derived:
            args.append(derive(values[slot]))
        if not self.guards:
            return self.call(*args)
        with self.guards[0] if len(self.guards) == 1 else _all_of(self.guards):
            return self.call(*args)


def build_driver(launches: Sequence[Any], bindings: frozenset[str]) -> Driver | None:
    """The driver of these launches (``executor._Launch``), or None when one of them has a
    value check to run between kernels or a kernel without a :class:`CompiledCall`."""
    calls = []
    for launch in launches:
        call = launch.kernel.compiled
        if launch.checks or not isinstance(call, CompiledCall):
            return None
        calls.append(call)
    slots: dict[str, int] = {}  # slot id -> parameter position
    ints: list[int] = []
    arrays: list[np.ndarray] = []
    derived: list[tuple[str, Callable[[Any], Any]]] = []
    imports, body = [], []

    def slot_param(slot: str) -> str:
        return f"f{slots.setdefault(slot, len(slots))}"

    for i, (launch, call) in enumerate(zip(launches, calls)):
        module, name = call.kernel.py_func.__module__, call.kernel.py_func.__name__
        imports.append(f"from {module} import {name} as k{i}")
        args = []
        for p in call.params:
            if p.kind == "input":
                args.append(slot_param(launch.inputs[p.index]))
            elif p.kind == "extra":
                args.append(slot_param(launch.extras[p.index]))
            elif p.kind == "output":
                args.append(slot_param(launch.output))
            elif p.kind == "int":
                args.append(f"c[{len(ints)}]")
                ints.append(p.value)
            elif p.kind == "array":
                args.append(f"q{len(arrays)}")
                arrays.append(p.value)
            elif p.kind == "derived":
                args.append(f"d{len(derived)}")
                derived.append((launch.inputs[p.index], p.value))
            else:
                raise ValueError(f"unknown kernel parameter kind {p.kind!r}")
        call_line = f"k{i}({', '.join(args)})"
        body.append(f"    n += {call_line}" if launch.kernel.counts.any else f"    {call_line}")
    order = sorted(slots, key=slots.get)
    params = [f"v{j}" for j in range(len(order))] + ["c"] + [f"q{j}" for j in range(len(arrays))] + \
        [f"d{j}" for j in range(len(derived))]
    source = "\n".join(
        ['"""Generated by runtime.execution.driver: one plan\'s kernels in one compiled call."""',
         "from numba import njit", *imports, "", "",
         "@njit(cache=True, nogil=True)",
         f"def driver({', '.join(params)}):",
         *[f"    f{j} = v{j}.reshape(v{j}.size)" for j in range(len(order))],
         "    n = 0", *body, "    return n"]) + "\n"
    configure_numba_cache()
    call = load_generated(source, "driver").driver
    guards = tuple(dict.fromkeys(c.guard for c in calls if c.guard is not None))
    return Driver(call, tuple(order), tuple(s for s in order if s in bindings),
                  (np.array(ints, np.int64), *arrays), tuple(derived), guards)
