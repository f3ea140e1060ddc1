"""RMS norm as one row kernel (issue 38 item 3): the instructions arti emits for it,

    sq = scale(x, x)                      factor_axes: x's axes
    m  = reduce@2(sq, axis=D, mode=mean)  D: x's last axis
    e  = add(m, c)                        c: m's type (arti broadcasts ε to it)
    r  = scalar-map(e, mode=rsqrt)
    y  = scale(x, r)                      factor_axes: x's axes but D
    [g = scale(y, gain)]                  gain: [D], factor_axes [D]

rewritten into one planner-made node whose CPU kernel (:mod:`runtime.kernels.rmsnorm`) reads
each row of x twice while it is in L1 and writes y (or g) once: the unfused plan writes the
[rows, D] square, reads it back, and reads x again. Atoms are recognised by the SPEC names of
the runtime's own atoms (scale, reduce@2, add, scalar-map) and their attributes.

Safe only when every intermediate has exactly one reader and is not an output, and every value
is float32 (or every value float64) computed in that dtype; like fused attention, it is left
out when outputs are checked (the replay of a group names the instruction that made a NaN).
"""
from __future__ import annotations

from collections.abc import Sequence

import attrs
import numpy as np

from runtime.core import settings
from runtime.core.types import accumulation_dtype
from runtime.plan import patterns
from runtime.plugins.atomspec import AtomSpec, Node
from runtime.plugins.kernel import (FLAT_OUTPUT, CompiledCall, Kernel, KernelRequest, const_array, const_int,
                                    flat_input, plain_kernel)

DTYPES = ("float32", "float64")


@attrs.frozen
class Form:
    axis: str  # the normalised axis: x's last
    gain: bool  # the row is scaled by a [D] gain too (a third operand)
    dtype: str


def _infer_unused(ctx):  # the planner builds these nodes with their types; no program names them
    raise AssertionError("fused RMS norm is a planner-made node")


def _computes_in(node: Node, dt: str) -> bool:
    return accumulation_dtype(dt, node.attributes.get("accumulation_dtype", "activation")) == dt


def find(nodes: Sequence[Node], outputs: Sequence[str], backend: str) -> list[tuple[tuple[Node, ...], Node]]:
    """Each match: (the nodes it replaces in program order, the fused node). Only for a backend
    the fused node has a kernel for, and unless FORMULA_FUSED_NORMS=0 (the unfused plan, for
    comparisons)."""
    if backend not in RMS_NORM.kernels or not settings.FUSED_NORMS.read():
        return []
    return patterns.find(nodes, outputs, _match)


def _is(node: Node | None, name: str, **attributes) -> bool:
    return node is not None and node.atom.name == name and \
        all(node.attributes.get(k) == v for k, v in attributes.items())


def _match(y: Node, graph: patterns.Graph):
    producer, reader, single = graph.producer, graph.reader, graph.single
    if not _is(y, "scale") or y.input_slots[0] == y.input_slots[1]:
        return None
    x_slot, r_slot = y.input_slots
    xt, rt = y.input_types
    if xt.rank < 1 or not xt.elements or list(y.attributes.get("factor_axes", ())) != list(xt.axes[:-1]):
        return None
    axis, dt = xt.axes[-1], xt.dtype
    r = producer.get(r_slot)
    if not (_is(r, "scalar-map", mode="rsqrt") and single(r_slot)):
        return None
    e = producer.get(r.input_slots[0])
    if not (_is(e, "add") and single(e.output_slot)) or e.input_slots[0] == e.input_slots[1]:
        return None
    for side in (0, 1):
        m = producer.get(e.input_slots[side])
        if _is(m, "reduce@2", mode="mean", axis=axis) and single(m.output_slot):
            break
    else:
        return None
    c_slot, ct = e.input_slots[1 - side], e.input_types[1 - side]
    sq = producer.get(m.input_slots[0])
    if not (_is(sq, "scale") and single(sq.output_slot) and sq.input_slots == (x_slot, x_slot)
            and list(sq.attributes.get("factor_axes", ())) == list(xt.axes)):
        return None
    mt = m.output_type
    if ct.axes != mt.axes or ct.shape != mt.shape:
        return None
    if rt.axes != mt.axes or rt.shape != mt.shape or y.output_type.axes != xt.axes:
        return None
    every = [sq, m, e, r, y]
    g = reader.get(y.output_slot)
    gain = _is(g, "scale") and single(y.output_slot) and g.input_slots[0] == y.output_slot and \
        g.input_slots[1] != y.output_slot and g.input_types[1].axes == (axis,) and \
        list(g.attributes.get("factor_axes", ())) == [axis] and g.output_type.axes == xt.axes
    if gain:
        every.append(g)
    types = [xt, ct, *(n.output_type for n in every), *(n.input_types[1] for n in every[-1:] if gain)]
    if dt not in DTYPES or any(t.dtype != dt for t in types) or not all(_computes_in(n, dt) for n in every):
        return None
    last = every[-1]
    slots = (x_slot, c_slot, *((g.input_slots[1],) if gain else ()))
    in_types = (xt, ct, *((g.input_types[1],) if gain else ()))
    fused = Node(last.index, f"{last.instruction_id}~rms-norm", RMS_NORM,
                 {"form": Form(axis, gain, dt)}, slots, last.output_slot, in_types,
                 last.output_type, last.path)
    return tuple(every), fused


def _cpu(request: KernelRequest) -> Kernel:
    from runtime.kernels import rmsnorm as rk  # (numba: imported only once a plan needs it)

    node = request.node
    form: Form = node.attributes["form"]
    xt = node.input_types[0]
    n = xt.shape[-1]
    count = xt.elements // n
    twins = rk.ROWS[form.dtype]
    kernel = twins.pick(rk.parallel_rows(count, xt.elements))
    dtype = np.dtype(form.dtype)
    no_gain = np.zeros(1, dtype)

    def run(inputs: Sequence[np.ndarray], out: np.ndarray) -> None:
        x, c = (np.ascontiguousarray(v).reshape(-1) for v in inputs[:2])
        g = np.ascontiguousarray(inputs[2]).reshape(-1) if form.gain else no_gain
        target = out if out.flags.c_contiguous else np.empty(out.shape, dtype)
        kernel(x, c, g, int(form.gain), target.reshape(-1), n, count)
        if target is not out:
            out[...] = target

    compiled = CompiledCall(kernel, (flat_input(0), flat_input(1),
                                     flat_input(2) if form.gain else const_array(no_gain),
                                     const_int(int(form.gain)), FLAT_OUTPUT, const_int(n), const_int(count)))
    return plain_kernel(run, warm=twins.warm, compiled=compiled)


RMS_NORM = AtomSpec("fused-rms-norm", ("formula-runtime/fused-rms-norm@1",), ("x", "c", "gain"),
                    frozenset(), _infer_unused, kernels={"cpu": _cpu},
                    summary="x · rsqrt(mean(x²) + c) [· gain] over x's last axis, one row kernel (planner-made)")
