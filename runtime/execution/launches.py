"""Launches: one group of a compiled plan ready to run (:class:`Launch`), and running a compiled
plan's launches over an arena (:class:`Launcher`): the value checks before a kernel, the
kernels themselves (from Python, or through the plan's compiled driver), the finiteness of
what the kernels counted, the output check, and the per-group trace."""
from __future__ import annotations

import time
from typing import Any

import attrs
import numpy as np

from runtime.core.errors import FormulaError
from runtime.core.types import TensorType
from runtime.execution.bindings import Binder
from runtime.execution.outputcheck import check_output
from runtime.kernels.arrays import is_device_array
from runtime.plugins import failures
from runtime.plugins.atomspec import Node
from runtime.plugins.kernel import Kernel


@attrs.define
class Launch:
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


def group_failed(nodes, backend: str, what: str, exc: Exception) -> FormulaError:
    """kernel_failed for the kernel of a group: named by its first node (the anchor, whose
    kernel ran, or the chain's first step), the others it fused listed."""
    node = nodes[0]
    others = [f"{n.instruction_id} ({n.atom.ref})" for n in nodes[1:]]
    fused = f" (fused with {', '.join(others)})" if others else ""
    return failures.kernel_failed(node.atom, node.path, f"{backend!r} {what}{fused}", exc, backend)


def check_values(node: Node, positions, fetch) -> None:
    """The atom's value check (``check_values``) of ``node``, on host copies of the operands
    at ``positions`` (``fetch(slot)``)."""
    host = [None] * len(node.input_slots)
    for k in positions:
        host[k] = fetch(node.input_slots[k])
    failures.guard(node.atom.check_values, node.atom, node.path, "value check (check_values)", node, host)


def host_values(bound) -> bool:
    return all(isinstance(v, np.ndarray) for v in bound.values.values())


class Launcher:
    """Runs compiled plans (:class:`~runtime.execution.compiled.CompiledPlan`) of one program on
    one backend; ``binder`` names the non-finite values the kernels count."""

    def __init__(self, backend, binder: Binder, outputs: tuple[str, ...]):
        self.backend = backend
        self.binder = binder
        self.outputs = outputs  # the program's output slots, in order

    def execute(self, compiled, bound, arena: dict[str, Any], trace: bool, given: dict[str, Any],
                raw: tuple[Any, Any]) -> tuple[dict[str, Any], list[dict[str, Any]] | None]:
        """Run ``compiled`` on ``bound`` values over ``arena`` (its temporaries' views):
        (the outputs by slot in the program's order, the trace records or None). ``given``:
        the caller's checked ``out`` arrays; ``raw``: the run's inputs and banks as passed
        (for naming a non-finite value)."""
        backend = self.backend
        backend.entering_run()
        host_results = backend.device_memory and host_values(bound)
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
        for slot, output in compiled.in_outputs:  # (the output's array, this run's)
            values[slot] = values[output]
        records = [] if trace else None
        driver = None if trace else compiled.driver(values)
        if driver is not None and driver.takes(values):
            for part in driver.parts:
                if isinstance(part, int):
                    self.run_launch(compiled.launches[part], values, bound, raw, None)
                    continue
                try:
                    found = part.run(values)
                except Exception as exc:  # Numba refusing these values' types: before any kernel ran
                    if isinstance(exc, (FormulaError, MemoryError)):
                        raise
                    if not type(exc).__module__.startswith("numba"):
                        nodes = [n for k in part.launches for n in compiled.launches[k].nodes]
                        raise group_failed(nodes, backend.name, "kernel (in a compiled call)", exc) from exc
                    compiled.drop_driver(exc)
                    for k in part.launches:
                        self.run_launch(compiled.launches[k], values, bound, raw, None)
                    continue
                if found:  # non-finite values read
                    self.binder.check_finite(bound, compiled.deferred_finite, *raw)
        else:
            for launch in compiled.launches:
                self.run_launch(launch, values, bound, raw, records)
        if compiled.synchronize is not None:
            compiled.synchronize()
        if host_results:  # a device backend given host values: host results
            for slot, v in outputs.items():
                if slot in given and given[slot] is not v:
                    v.copy_to_host(given[slot])  # a device result into the caller's host array
                    outputs[slot] = given[slot]
                else:
                    outputs[slot] = backend.to_host(v)
        return {slot: outputs[slot] for slot in self.outputs}, records

    def run_launch(self, launch: Launch, values: dict[str, Any], bound, raw: tuple[Any, Any],
                   records: list[dict[str, Any]] | None) -> None:
        """One kernel launched from Python, after the value checks before it (with a trace
        record when ``records`` is a list)."""
        backend = self.backend
        for node, positions in launch.checks:
            check_values(node, positions, lambda slot: backend.to_host(values[slot]))
        out = values[launch.output]
        started = time.perf_counter() if records is not None else 0.0
        extras = [align(values[s]) for s, align in zip(launch.extras, launch.aligners)]
        try:
            found = launch.kernel([values[s] for s in launch.inputs], extras, out)
        except (FormulaError, MemoryError):
            raise
        except Exception as exc:  # plugin code: named, the exception kept as the cause
            raise group_failed(launch.nodes, backend.name, "kernel", exc) from exc
        if found and launch.counts_nonfinite:  # non-finite values read
            self.binder.check_finite(bound, launch.counts_nonfinite, *raw)
        if launch.check_output == "kernel" and found or launch.check_output == "scan":
            check_output(launch, values, backend)
        if records is not None:
            backend.synchronize()
            records.append({**launch.label, "tier": backend.name, "output": launch.output,
                            "ms": (time.perf_counter() - started) * 1e3,
                            "bytes": launch.output_type.nbytes})
