"""Compiled calls per run: generated ``@njit`` drivers that call a plan's kernels in turn.

A run that launches its kernels from Python pays, per kernel, the dispatch of a dozen or more
arguments and the views and layouts of its operands; at small extents (one token) that is
most of the run. The executor generates a driver for each run of consecutive kernels that can
be called from compiled code (a *segment*): it takes the run's slot arrays once and calls them
all, with every layout-derived argument worked out when the driver is built. Kernels that
cannot (a plugin's kernel without a :class:`CompiledCall`, a group with value checks before
it) are launched from Python between the segments.

That is only sound for arrays of a known layout, so a driver takes a run only when every
binding is C-contiguous and aligned (:meth:`Driver.takes`; arena views and results always
are); other runs, and traced ones, launch kernel by kernel. A kernel takes part by carrying a
:class:`CompiledCall` as its ``Kernel.compiled`` entry: its Numba dispatcher and the meaning of
each of its parameters under that assumption. The driver passes the very types a Python
launch passes (C-contiguous arrays, int64 scalars: never literals, which Numba would compile
a new specialisation of the kernel for), so it reuses the kernels' compiled code.
"""
from __future__ import annotations

import contextlib
import sys
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import attrs
import numpy as np

from runtime.kernels.codegen import Source, configure_numba_cache, load_generated, source_stamp
from runtime.plugins.kernel import CompiledCall, Param


@contextlib.contextmanager
def _all_of(guards: Sequence[Any]):
    """Several guards entered as one, in order (left in reverse, also when one fails)."""
    with contextlib.ExitStack() as stack:
        for guard in guards:
            stack.enter_context(guard)
        yield


@attrs.frozen(eq=False)
class Segment:
    """Consecutive kernels of a plan as one compiled function, ``call(*slot arrays, *constants)``,
    which returns the count of non-finite values its kernels read. ``slots``: the slot of each
    array parameter; ``bindings``: those of them the caller supplies (the only ones whose
    layout can differ from run to run: arena views and results are always C-contiguous)."""

    call: Any
    slots: tuple[str, ...]
    bindings: tuple[str, ...]
    constants: tuple[Any, ...]
    derived: tuple[tuple[str, Callable[[Any], Any]], ...] = ()  # (slot, derive): last arguments
    guards: tuple[Any, ...] = ()  # context managers every call runs inside
    launches: tuple[int, ...] = ()  # the positions of its kernels among the plan's launches

    def _args(self, values: Mapping[str, Any]) -> list[Any]:
        args = [values[slot] for slot in self.slots]
        args += self.constants
        for slot, derive in self.derived:
            args.append(derive(values[slot]))
        return args

    def compile(self, values: Mapping[str, Any]) -> None:
        """Compile (or load from the disk cache) the call for the types of these values, so
        that a run taking the same types finds it ready."""
        self.call.compile(self._signature(values))

    def compiled_for(self, values: Mapping[str, Any]) -> bool:
        """Whether the call has machine code for the types of these values (a call then
        compiles nothing)."""
        return self._signature(values) in self.call.overloads

    def _signature(self, values: Mapping[str, Any]) -> tuple:
        from numba import typeof

        return tuple(typeof(arg) for arg in self._args(values))

    def run(self, values: Mapping[str, Any]) -> int:
        args = self._args(values)
        if not self.guards:
            return self.call(*args)
        with self.guards[0] if len(self.guards) == 1 else _all_of(self.guards):
            return self.call(*args)


@attrs.frozen(eq=False)
class Driver:
    """A plan's launches in order: each part a :class:`Segment`, or the position of a launch
    the executor runs from Python."""

    parts: tuple[Segment | int, ...]
    bindings: tuple[str, ...]  # the segments' bindings

    def compile(self, values: Mapping[str, Any]) -> None:
        """Every segment compiled for the types of these values (a run's)."""
        for part in self.parts:
            if isinstance(part, Segment):
                part.compile(values)

    def compiled_for(self, values: Mapping[str, Any]) -> bool:
        """Whether every segment has machine code for the types of these values."""
        return all(part.compiled_for(values) for part in self.parts if isinstance(part, Segment))

    def takes(self, values: Mapping[str, Any]) -> bool:
        """Whether these values have the layout the driver was built for."""
        for slot in self.bindings:
            flags = values[slot].flags
            if not (flags.c_contiguous and flags.aligned):
                return False
        return True


MIN_SEGMENT = 2  # launches: a lone kernel is not worth a driver module of its own


class NotLoaded(Exception):
    """A segment's module is not loaded in this process (``build_driver(loaded_only=True)``)."""


def build_driver(launches: Sequence[Any], bindings: frozenset[str], loaded_only: bool = False) -> Driver | None:
    """The driver of these launches (``launches.Launch``): segments of at least
    :data:`MIN_SEGMENT` consecutive launches whose kernel has a :class:`CompiledCall` and no
    value check before it; None when there is no such segment. ``loaded_only``: raise
    :class:`NotLoaded` rather than import a segment's module (a disk load in the foreground)."""
    parts: list[Segment | int] = []
    run: list[int] = []

    def flush() -> None:
        if len(run) >= MIN_SEGMENT:
            parts.append(build_segment(launches, tuple(run), bindings, loaded_only))
        else:
            parts.extend(run)
        run.clear()

    for i, launch in enumerate(launches):
        if launch.checks or not isinstance(launch.kernel.compiled, CompiledCall):
            flush()
            parts.append(i)
        else:
            run.append(i)
    flush()
    if not any(isinstance(p, Segment) for p in parts):
        return None
    used = tuple(dict.fromkeys(s for p in parts if isinstance(p, Segment) for s in p.bindings))
    return Driver(tuple(parts), used)


def _import_name(kernel: Any) -> tuple[str, str]:
    """(module, name) under which ``kernel`` is a module-level global: its function's own name,
    or another (a dispatcher compiled at run time and kept beside the plain function)."""
    module = kernel.py_func.__module__
    name = kernel.py_func.__name__
    space = vars(sys.modules[module])
    if space.get(name) is not kernel:
        name = next((n for n, v in space.items() if v is kernel), None)
        if name is None:
            raise ValueError(f"kernel {kernel.py_func.__qualname__} is not a global of {module}")
    return module, name


def sources_stamp(modules: Sequence[str]) -> str:
    """A digest of the source files of ``modules`` and of the ``runtime.kernels`` package (the
    helpers kernels inline). Numba's disk cache checks only a function's own file, and a driver
    holds its callees' machine code: the stamp, written into the driver's source, renames the
    driver when a kernel's code changes, so a cache never serves one built from older kernels."""
    import runtime.kernels

    files = sorted({getattr(sys.modules[m], "__file__", None) or "" for m in modules} - {""})
    files += sorted(str(p) for p in Path(runtime.kernels.__file__).parent.glob("*.py"))
    return source_stamp(*files, length=20)


def build_segment(plan_launches: Sequence[Any], positions: tuple[int, ...], bindings: frozenset[str],
                  loaded_only: bool = False) -> Segment:
    """One compiled call of the launches at these positions, each with a :class:`CompiledCall`
    (``bindings``: the plan's slots that the caller supplies; ``loaded_only``: see
    :func:`build_driver`)."""
    launches = [plan_launches[i] for i in positions]
    calls = [launch.kernel.compiled for launch in launches]
    slots: dict[str, int] = {}  # slot id -> parameter position
    ints: list[int] = []
    arrays: list[np.ndarray] = []
    derived: list[tuple[str, Callable[[Any], Any]]] = []
    imports, body, modules = [], [], []

    def slot_param(slot: str) -> str:
        return f"f{slots.setdefault(slot, len(slots))}"

    def const(value: int) -> str:
        ints.append(value)
        return f"c[{len(ints) - 1}]"

    def shaped(name: str, p: Param) -> str:
        if p.view is not None:
            name = f"{name}.view(np.{p.view})"
        if p.shape is not None:  # (extents in c, not in the source: one driver serves every extent)
            name = f"{name}.reshape(({''.join(f'{const(n)}, ' for n in p.shape)}))"
        return f"_unaligned({name})" if p.unaligned else name

    for i, (launch, call) in enumerate(zip(launches, calls)):
        module, name = _import_name(call.dispatcher())
        modules.append(module)
        imports.append(f"from {module} import {name} as k{i}")
        args = []
        for p in call.params:
            if p.kind == "input":
                args.append(shaped(slot_param(launch.inputs[p.index]), p))
            elif p.kind == "extra":
                args.append(shaped(slot_param(launch.extras[p.index]), p))
            elif p.kind == "output":
                args.append(shaped(slot_param(launch.output), p))
            elif p.kind == "int":
                args.append(const(p.value))
            elif p.kind in ("array", "scalar"):  # (a scalar of its own type: not through c's int64)
                args.append(f"q{len(arrays)}")
                arrays.append(p.value)
            elif p.kind == "derived":
                args.append(f"d{len(derived)}")
                derived.append((launch.inputs[p.index], p.value))
            else:
                raise ValueError(f"unknown kernel parameter kind {p.kind!r}")
        call_line = f"k{i}({', '.join(args)})"
        body.append(f"n += {call_line}" if launch.kernel.counts.any else call_line)
    order = sorted(slots, key=slots.get)
    params = [f"v{j}" for j in range(len(order))] + ["c"] + [f"q{j}" for j in range(len(arrays))] + \
        [f"d{j}" for j in range(len(derived))]
    src = Source("Generated by runtime.execution.driver: consecutive kernels of a plan in one compiled call.",
                 [f"# kernels' sources: {sources_stamp(modules)}",  # (first: it renames the module)
                  "import numpy as np", "from numba import njit",
                  "from runtime.kernels.retype import unaligned as _unaligned", *imports])
    src.add("", "", "@njit(cache=True, nogil=True)")
    with src.block(f"def driver({', '.join(params)}):"):
        src.add([f"f{j} = v{j}.reshape(v{j}.size)" for j in range(len(order))], "n = 0", body, "return n")
    source = src.text()
    configure_numba_cache()
    module = load_generated(source, "driver", loaded_only)
    if module is None:
        raise NotLoaded(source.splitlines()[0])
    call = module.driver
    guards = tuple(dict.fromkeys(c.guard for c in calls if c.guard is not None))
    return Segment(call, tuple(order), tuple(s for s in order if s in bindings),
                   (np.array(ints, np.int64), *arrays), tuple(derived), guards, positions)
