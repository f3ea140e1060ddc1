"""Half precision (float16, bfloat16) on backends whose kernels compute in float32 (SPEC §3b.1).

Numba has no float16 or bfloat16 type, so the planner rewrites half-typed work before it
groups nodes: a half operand is *widened* once into a float32 temporary (an arena slot, so it
counts in the working bytes and the §5 preflight), the node runs its float32 kernel, and its
output is *narrowed* (rounded once, to nearest even) into the half slot. A reader that computes
in float32 and gives a half result takes the float32 value itself, so a chain of half ops
stays in float32 and is rounded once at its end; a reader with another output dtype (a
compare, a cast to float64) sees the rounded half value. A narrowing nobody reads is dropped. Atoms that list the backend in
``AtomSpec.half_native`` (data movement by item size) take half operands as they are.

The conversions work on integer views (uint16 <-> float32 bits as uint32): no half type is
needed inside Numba, on the CPU or on CUDA.
"""
from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import attrs

from runtime.core.types import HALF_DTYPES, TensorType
from runtime.kernels.halfconv import BF16_TO_F32, F16_TO_F32, F32_TO_BF16, F32_TO_F16
from runtime.plugins.atomspec import AtomSpec, Node
from runtime.plugins.kernel import Kernel, KernelRequest, plain_kernel

WIDE = "~f32"  # suffix of a half slot's float32 temporary (never a valid slot id: no clash)

def _kind(node: Node) -> int:
    if node.atom is NARROW:
        return F32_TO_F16 if node.output_type.dtype == "float16" else F32_TO_BF16
    return F16_TO_F32 if node.input_types[0].dtype == "float16" else BF16_TO_F32


def _cpu_factory(request: KernelRequest) -> Kernel:
    node = request.node
    kind = _kind(node)

    from runtime.kernels.halfconv_cpu import convert_host, warm_host

    def run(inputs: Sequence[Any], out) -> None:
        convert_host(inputs[0], out, kind)
    return plain_kernel(run, warm=lambda: warm_host(kind))


def _cuda_factory(request: KernelRequest) -> Kernel:
    node = request.node
    kind = _kind(node)

    from runtime.kernels.halfconv_cuda import convert_device

    def run(inputs: Sequence[Any], out) -> None:
        convert_device(inputs[0], out, kind)
    return plain_kernel(run)


def _infer_unused(ctx):  # the planner builds these nodes with their types; no program names them
    raise AssertionError("half conversions are planner-made nodes")


_KERNELS = {"cpu": _cpu_factory, "cuda": _cuda_factory}
WIDEN = AtomSpec("half-widen", ("formula-runtime/half-widen@1",), ("value",), frozenset(), _infer_unused,
                 kernels=_KERNELS, summary="float16/bfloat16 -> float32, exactly (planner-made)")
NARROW = AtomSpec("half-narrow", ("formula-runtime/half-narrow@1",), ("value",), frozenset(), _infer_unused,
                  kernels=_KERNELS, summary="float32 -> float16/bfloat16, rounded once (planner-made)")


def _needs_widening(node: Node, backend: str) -> bool:
    if backend in node.atom.half_native:
        return False
    return node.output_type.dtype in HALF_DTYPES or any(t.dtype in HALF_DTYPES for t in node.input_types)


def widen_halves(nodes: Sequence[Node], outputs: Sequence[str], backend: str) -> list[Node]:
    """``nodes`` (program order) with half-typed work rewritten to run in float32 (see the
    module docstring); renumbered in run order, paths kept. Unchanged when nothing is half."""
    if not any(_needs_widening(n, backend) for n in nodes):
        return list(nodes)
    exact: dict[str, tuple[str, TensorType]] = {}  # half slot -> its widened copy
    unrounded: dict[str, tuple[str, TensorType]] = {}  # half slot -> its producer's float32 value
    out: list[Node] = []

    def float32_of(slot: str, t: TensorType, node: Node) -> tuple[str, TensorType]:
        if node.output_type.dtype in HALF_DTYPES and slot in unrounded:
            return unrounded[slot]  # half in, half out: the chain is rounded once, at its end
        if slot not in exact:  # otherwise the half value itself (a compare or cast sees it)
            wt = t.evolve(dtype="float32")
            name = f"{slot}{WIDE}" if slot not in unrounded else f"{slot}~rounded{WIDE}"
            out.append(Node(0, f"{node.instruction_id}~widen-{slot}", WIDEN, {}, (slot,), name,
                            (t,), wt, node.path))
            exact[slot] = (name, wt)
        return exact[slot]

    for node in nodes:
        if not _needs_widening(node, backend):
            out.append(node)
            continue
        slots, types = [], []
        for slot, t in zip(node.input_slots, node.input_types):
            if t.dtype in HALF_DTYPES:
                slot, t = float32_of(slot, t, node)
            slots.append(slot)
            types.append(t)
        result = node.output_type
        if result.dtype not in HALF_DTYPES:
            out.append(attrs.evolve(node, input_slots=tuple(slots), input_types=tuple(types)))
            continue
        wt = result.evolve(dtype="float32")
        wslot = node.output_slot + WIDE
        out.append(attrs.evolve(node, input_slots=tuple(slots), input_types=tuple(types),
                                output_slot=wslot, output_type=wt))
        out.append(Node(0, f"{node.instruction_id}~narrow", NARROW, {}, (wslot,), node.output_slot,
                        (wt,), result, node.path))
        unrounded[node.output_slot] = (wslot, wt)
    read = {s for n in out for s in n.input_slots} | set(outputs)
    kept = [n for n in out if n.atom is not NARROW or n.output_slot in read]
    return [n if n.index == i else attrs.evolve(n, index=i) for i, n in enumerate(kept)]
