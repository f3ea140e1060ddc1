"""The output check (SPEC §3b.3 item 2, ``run(check_outputs=True)``): a ``nonfinite`` error at
the first instruction whose output holds a NaN or ±inf, named even inside a fused group."""
from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

from runtime.core.errors import fail
from runtime.core.types import is_float, numpy_dtype
from runtime.execution.bindings import value_is_finite
from runtime.plugins.atomspec import Node
from runtime.plugins.kernel import KernelRequest


def check_output(launch, values: Mapping[str, Any], backend) -> None:
    """Raise ``nonfinite`` at the first instruction of ``launch``'s group (a
    :class:`~runtime.execution.launches.Launch`) whose output holds a NaN or ±inf. A group of
    several nodes (whose kernel counted a non-finite value among them) is replayed node by
    node on host copies of its operands, each node by its reference kernel, to find which
    one; a kernel's false alarm (a count that came from its operands, found finite) passes."""
    nodes = launch.nodes
    if len(nodes) > 1:
        local: dict[str, np.ndarray] = {}
        for node in nodes:
            args = [local[s] if s in local else np.asarray(backend.to_host(values[s]))
                    for s in node.input_slots]
            factory = node.atom.kernels.get("reference") or node.atom.kernels.get("cpu")
            if factory is None:  # no host kernel to replay it with: name the whole group
                raise_if_nonfinite(node, np.array(np.nan), [n.instruction_id for n in nodes])
                return
            got = np.empty(node.output_type.shape, numpy_dtype(node.output_type.dtype))
            factory(KernelRequest(node))(args, (), got)
            raise_if_nonfinite(node, got)
            local[node.output_slot] = got
    out, dtype = values[launch.output], launch.output_type.dtype
    if dtype in ("float32", "float64"):  # a parallel (or on-device) scan
        if not value_is_finite(out):
            raise_if_nonfinite(nodes[-1], np.asarray(backend.to_host(out)))
    elif is_float(dtype):  # float16, bfloat16: NumPy on the host
        raise_if_nonfinite(nodes[-1], np.asarray(backend.to_host(out)))


def raise_if_nonfinite(node: Node, value: np.ndarray, group: list[str] | None = None) -> None:
    if group is not None:
        fail("nonfinite", node.path,
             f"fused instructions {group} produced a non-finite value (NaN or ±inf); instruction "
             f"{node.instruction_id!r} ({node.atom.ref}) has no host kernel to tell which one; "
             "check_outputs rejects NaN and ±inf in every instruction output (SPEC §3b.3 item 2)")
    if not is_float(node.output_type.dtype):
        return
    bad = ~np.isfinite(value.astype(np.float64) if value.dtype.kind != "f" else value)
    if not bad.any():
        return
    where = np.unravel_index(int(np.argmax(bad)), value.shape) if value.ndim else ()
    first = value[where] if value.ndim else value.item()
    instruction = node.instruction_id.split("~", 1)[0]  # (a planner-made half conversion's own)
    fail("nonfinite", node.path,
         f"instruction {instruction!r} ({node.atom.ref}) produced {int(bad.sum())} non-finite "
         f"value(s) in {node.output_slot.split('~', 1)[0]!r}, the first {float(first)} at index "
         f"{tuple(int(i) for i in where)}; check_outputs rejects NaN and ±inf in every "
         f"instruction output (SPEC §3b.3 item 2)")

