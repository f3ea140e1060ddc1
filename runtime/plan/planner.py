"""The plan for one set of extents: kernel groups, slot lifetimes, in-place reuse, arena
offsets and the memory preflight of SPEC §5 — all decided before anything is allocated.

Atom-agnostic: atoms are known only through their traits (``elementwise``, ``anchors``,
``inplace``). Bindings and outputs are pinned (outputs are fresh arrays per run, never arena
memory); temporaries live from their producing group to their last reading group and share
one arena, packed greedily (``runtime.plan.arena``).
"""
from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import attrs

from runtime.plan import arena
from runtime.plugins.atomspec import Node, inplace_operands
from runtime.core.errors import fail
from runtime.plan.freeaxes import Chunking, FreeAxes
from runtime.plan.grouping import Group, make_groups
from runtime.plan.memory import check_ceiling
from runtime.program.model import type_to_dict
from runtime.core.types import ITEMSIZE, TensorType

PINNED = ("input", "bank", "output")


@attrs.frozen
class Buffer:
    slot: str
    kind: str  # "input" | "bank" | "temporary" | "output"
    nbytes: int
    first: int  # group index of the producer (-1 for bindings: live before the first group)
    last: int  # last group index reading it (in-place roots: extended over their aliases)
    offset: int | None = None  # arena offset of temporaries (aliases: their root's offset)
    alias_of: str | None = None  # in-place or view: the temporary whose buffer this one reuses
    # (or, for a temporary, the program output in whose array it is computed: no arena offset)

    @property
    def in_arena(self) -> bool:
        return self.kind == "temporary" and self.offset is not None  # (not one computed in an output)


@attrs.frozen
class Plan:
    dims: Mapping[str, int]
    groups: tuple[Group, ...]
    buffers: Mapping[str, Buffer]
    arena_bytes: int  # peak of the packed temporaries
    temporaries_bytes: int  # sum of the temporaries' sizes: what no reuse would need
    binding_bytes: int
    output_bytes: int
    max_working_bytes: int
    backend: str = ""
    fused: bool = False
    scratch_bytes: int = 0  # kernels' own scratch beyond the slots (AtomSpec.scratch_bytes), summed
    free: FreeAxes | None = None  # the program's free axes (runtime.plan.freeaxes)
    chunking: Chunking | None = None  # set on the plan of one slice of a chunked run
    views: frozenset[int] = frozenset()  # groups that run no kernel: their output aliases their operand

    @property
    def kernel_groups(self) -> tuple[Group, ...]:
        """The groups whose kernels run, in order (every group but the views)."""
        return tuple(g for i, g in enumerate(self.groups) if i not in self.views)

    @property
    def working_bytes(self) -> int:
        return self.binding_bytes + self.arena_bytes + self.output_bytes + self.scratch_bytes

    @property
    def fits(self) -> bool:
        return self.working_bytes <= self.max_working_bytes

    @property
    def verdict(self) -> str:
        return "fits" if self.fits else "exceeds"

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready: the schedule, lifetimes and offsets, peak vs sum, and the verdict."""
        return {
            "backend": self.backend, "fused": self.fused, "dims": dict(self.dims),
            "schedule": [{"group": i, "runs_at": g.nodes[-1].instruction_id,
                          "kernel": "view" if i in self.views else g.kind,
                          "anchor": g.anchor.instruction_id if g.anchor is not None else None,
                          "instructions": [n.instruction_id for n in g.nodes],
                          "atoms": [n.atom.name for n in g.nodes],
                          "atom_refs": [n.atom.ref for n in g.nodes],
                          "fused_slots": list(g.fused_slots), "inputs": list(g.input_slots),
                          "output": g.output_slot, "output_type": type_to_dict(g.output_type)}
                         for i, g in enumerate(self.groups)],
            "buffers": [{**attrs.asdict(b), "in_arena": b.in_arena} for b in self.buffers.values()],
            "arena": {"alignment": arena.ALIGNMENT, "peak_bytes": self.arena_bytes,
                      "without_reuse_bytes": self.temporaries_bytes,
                      "saved_bytes": self.temporaries_bytes - self.arena_bytes},
            "arena_bytes": self.arena_bytes, "temporaries_bytes": self.temporaries_bytes,
            "binding_bytes": self.binding_bytes, "output_bytes": self.output_bytes,
            "scratch_bytes": self.scratch_bytes, "working_bytes": self.working_bytes,
            "max_working_bytes": self.max_working_bytes,
            "fits": self.fits, "verdict": self.verdict,
            "free_axes": self.free.to_dict() if self.free is not None else None,
            "chunking": self.chunking.to_dict() if self.chunking is not None else None,
        }

    def describe(self) -> str:
        """A readable report (``formula plan``): groups, lifetimes, offsets, memory verdict."""
        dims = ", ".join(f"{k}={v}" for k, v in self.dims.items()) or "static extents"
        n_nodes = sum(len(g.nodes) for g in self.groups)
        lines = [f"plan for {dims}" + (f" on {self.backend}" if self.backend else "")
                 + (" (fused)" if self.fused else " (unfused)"),
                 f"schedule: {len(self.groups)} kernel groups for {n_nodes} instructions"]
        for i, g in enumerate(self.groups):
            away = f"  (fused away: {', '.join(g.fused_slots)})" if g.fused_slots else ""
            kind = "view" if i in self.views else g.kind
            lines.append(f"  [{i}] {kind:<17} {g.label} -> {g.output_slot} {g.output_type}{away}")
        lines.append("lifetimes (group indices; '#' live, '=' pinned) and arena offsets:")
        timeline = len(self.groups) <= 48
        width = max([len(s) for s in self.buffers] + [4])
        head = f"  {'slot':<{width}}  {'kind':<9} {'bytes':>14}  {'groups':<7}"
        tw = max(len(self.groups) + 2, 8)
        lines.append(head + (f" {'timeline':<{tw}}" if timeline else "") + "  where")
        for b in self.buffers.values():
            span = f"{'in' if b.first < 0 else b.first}..{b.last if b.last >= 0 else '-'}"
            if b.alias_of is not None and self.buffers[b.alias_of].kind == "output":
                where = f"in the array of output {b.alias_of} (computed in place)"
            elif b.alias_of is not None:
                how = "a view of" if b.first in self.views else "in place of"
                where = f"offset {b.offset} ({how} {b.alias_of})"
            elif b.offset is not None:
                where = f"offset {b.offset}..{b.offset + b.nbytes}"
            else:
                where = "fresh array per run" if b.kind == "output" else "bound value"
            bar = ""
            if timeline:
                mark = "=" if b.kind in PINNED else "#"
                bar = "|" + "".join(mark if max(b.first, 0) <= i <= b.last else "."
                                    for i in range(len(self.groups))) + "|"
                bar = f" {bar:<{tw}}"
            lines.append(f"  {b.slot:<{width}}  {b.kind:<9} {b.nbytes:>14,}  {span:<7}{bar}  {where}")
        lines.append(f"arena peak {_size(self.arena_bytes)} vs {_size(self.temporaries_bytes)} without reuse"
                     f" (saved {_size(self.temporaries_bytes - self.arena_bytes)})")
        lines.append(f"working set {_size(self.working_bytes)} = bindings {_size(self.binding_bytes)}"
                     f" + arena {_size(self.arena_bytes)} + outputs {_size(self.output_bytes)}"
                     f" + kernel scratch {_size(self.scratch_bytes)}; "
                     f"{'fits' if self.fits else 'EXCEEDS'} max_working_bytes {_size(self.max_working_bytes)}")
        if self.free is not None:
            lines.append(self.free.describe())
        if self.chunking is not None:
            lines.append(self.chunking.describe())
        return "\n".join(lines)


def kernel_scratch(nodes: Sequence[Node], backend: str) -> int:
    """Scratch bytes the nodes' kernels declare for ``backend`` (summed: a cuda kernel may hold
    its scratch for the compiled plan's lifetime)."""
    return sum(n.atom.scratch_bytes(n, backend) for n in nodes if n.atom.scratch_bytes is not None)


def live_nodes(nodes: Sequence[Node], outputs: Sequence[str]) -> list[Node]:
    """The nodes an output depends on, and those with value checks (an index_range a
    program asks for is raised even where its result is unused): a gradient program keeps
    its forward instructions, and the forward outputs the backward never reads cost nothing."""
    needed = set(outputs)
    keep = [False] * len(nodes)
    for k in range(len(nodes) - 1, -1, -1):
        node = nodes[k]
        if node.output_slot in needed or node.atom.check_values is not None:
            keep[k] = True
            needed.update(node.input_slots)
    return [n for n, kept in zip(nodes, keep) if kept]


def make_plan(nodes: Sequence[Node], binding_types: Mapping[str, TensorType], outputs: Sequence[str],
              limits, dims: Mapping[str, int], backend: str, fuse: bool,
              slot_index: Mapping[str, int] | None = None,
              binding_kinds: Mapping[str, str] | None = None, enforce: bool = True,
              memory_limit: int | None = None, keep_fused_operands: bool = False) -> Plan:
    """Group, size, place and preflight ``nodes`` (resolved types, program order).

    ``slot_index`` (slot id -> index in ``$.slots``) gives errors their exact JSON path;
    ``binding_kinds`` (name -> "input" | "bank") labels the pinned buffers. With
    ``enforce=False`` a working set over ``max_working_bytes`` is reported (verdict
    "exceeds") instead of raised; per-tensor limits are always enforced. ``memory_limit``:
    the runtime's own ceiling (:mod:`runtime.plan.memory`), enforced like ``max_working_bytes``.
    ``keep_fused_operands``: no fused group of several nodes writes over an operand in place,
    so its operands are still there after it ran (the output check replays such a group to
    find the instruction that made a non-finite value), and no planner rewrite replaces nodes
    (runtime.plan.attention)."""
    slot_index = slot_index or {}
    if not keep_fused_operands:  # the output check looks at every instruction, dead ones too
        nodes = live_nodes(nodes, outputs)
    types = dict(binding_types)
    types.update({n.output_slot: n.output_type for n in nodes})
    sizes = {slot: _check_tensor(slot, t, limits, _slot_path(slot, slot_index)) for slot, t in types.items()}
    groups = make_groups(nodes, outputs, backend, fuse, rewrite=not keep_fused_operands)
    last_read: dict[str, int] = {}
    for gi, g in enumerate(groups):
        for s in g.input_slots:
            last_read[s] = gi
    buffers: dict[str, Buffer] = {}
    for slot in binding_types:
        kind = (binding_kinds or {}).get(slot, "input")
        buffers[slot] = Buffer(slot, kind, sizes[slot], -1, last_read.get(slot, -1))
    output_set = set(outputs)
    views = set()
    for gi, g in enumerate(groups):
        slot = g.output_slot
        kind = "output" if slot in output_set else "temporary"
        buffers[slot] = Buffer(slot, kind, sizes[slot], gi, last_read.get(slot, gi))
        keep = keep_fused_operands and len(g.nodes) > 1
        source = None
        if kind == "temporary" and fuse:
            source = _view_source(g, buffers)
            if source is not None:
                views.add(gi)
        if source is None and kind == "temporary" and not keep:
            source = _inplace_source(g, gi, buffers, last_read)
        if source is not None:
            root = buffers[source].alias_of or source
            buffers[slot] = attrs.evolve(buffers[slot], alias_of=root)
            buffers[root] = attrs.evolve(buffers[root], last=max(buffers[root].last, buffers[slot].last))
        if kind == "output":  # computed in the output's array: no arena bytes, no copy
            for member in _output_inplace_chain(g, gi, buffers, last_read, types):
                buffers[member] = attrs.evolve(buffers[member], alias_of=slot)
    temporaries = [b for b in buffers.values() if b.kind == "temporary"]
    requests = [arena.Request(b.slot, b.nbytes, b.first, b.last) for b in temporaries if b.alias_of is None]
    offsets, peak = arena.place(requests)
    arena.check_no_overlap(requests, offsets, peak=peak)  # cheap (slots ≤ max_slots); a bug here corrupts data
    for b in temporaries:
        if b.alias_of is None or buffers[b.alias_of].kind != "output":
            buffers[b.slot] = attrs.evolve(b, offset=offsets[b.alias_of or b.slot])
    plan = Plan(dict(dims), tuple(groups), buffers, peak, sum(b.nbytes for b in temporaries),
                sum(b.nbytes for b in buffers.values() if b.kind in ("input", "bank")),
                sum(b.nbytes for b in buffers.values() if b.kind == "output"), limits.max_working_bytes,
                backend, bool(fuse),
                kernel_scratch([n for gi, g in enumerate(groups) if gi not in views for n in g.kernel_nodes], backend),
                views=frozenset(views))
    if enforce and not plan.fits:
        fail("limit_exceeded", "$.limits.max_working_bytes",
             f"the working set needs {plan.working_bytes} bytes (bindings {plan.binding_bytes} + "
             f"arena peak {plan.arena_bytes} + outputs {plan.output_bytes} + kernel scratch "
             f"{plan.scratch_bytes}; the temporaries would need "
             f"{plan.temporaries_bytes} without reuse) but max_working_bytes allows {limits.max_working_bytes}")
    if enforce and memory_limit is not None:
        check_ceiling(plan.working_bytes, memory_limit, limits.max_working_bytes, "$.limits.max_working_bytes",
                      f"the working set (bindings {plan.binding_bytes} + arena peak {plan.arena_bytes} + "
                      f"outputs {plan.output_bytes})")
    return plan


def _view_source(g: Group, buffers: Mapping[str, Buffer]) -> str | None:
    """The temporary operand whose buffer a lone ``view`` node's output is (``AtomSpec.view``):
    the same bytes in C order, so the output needs neither memory nor a kernel. Bindings keep
    the kernel: a caller's array need not be C-contiguous, and a view of it would outlive the
    run."""
    node = g.anchor
    if node is None or g.rewritten or not g.epilogue.empty or not node.atom.view or len(node.input_slots) != 1:
        return None
    b = buffers.get(node.input_slots[0])
    if b is None or b.kind != "temporary" or b.nbytes != buffers[g.output_slot].nbytes \
            or node.input_types[0].dtype != node.output_type.dtype:
        return None
    return b.slot


def _inplace_source(g: Group, gi: int, buffers: Mapping[str, Buffer], last_read) -> str | None:
    """The operand whose buffer the group's output may reuse (TFLite's in-place rule): a
    temporary whose last reader is this group, of the output's size, that the kernel reads
    at each output index before writing it there. A lone node's atom names that operand
    (``inplace``); in a fused group it is any epilogue operand of the output's very axes and
    extents, since an epilogue reads its operands element by element at the output's index
    (the anchor's own operands are read across the output, never reused)."""
    if g.epilogue.empty:
        candidates = _inplace_operands(g)
    else:
        out = g.output_type
        candidates = [s for s, t in zip(g.epilogue.extra_slots, g.epilogue.extra_types)
                      if t.axes == out.axes and t.shape == out.shape]
    for slot in candidates:
        b = buffers.get(slot)
        if b is None or b.kind != "temporary" or last_read.get(slot) != gi \
                or b.nbytes != buffers[g.output_slot].nbytes:
            continue
        root = b.alias_of or slot
        if buffers[root].last > gi:  # a view of the buffer is read later
            continue
        if any(s != slot and s in buffers and buffers[s].kind == "temporary" and (buffers[s].alias_of or s) == root
               for s in g.input_slots):  # another operand here is a view of it, read at other indices
            continue
        return slot
    return None


def _inplace_operands(g: Group) -> list[str]:
    """The slots of the operands a lone node's atom lets its output reuse (``AtomSpec.inplace``),
    in its order of preference."""
    node = g.anchor
    if node is None:
        return []
    return [node.input_slots[k] for k in inplace_operands(node.atom) if 0 <= k < len(node.input_slots)]


def _output_inplace_chain(g: Group, gi: int, buffers: Mapping[str, Buffer], last_read,
                          types: Mapping[str, TensorType]) -> list[str]:
    """The temporaries that a lone node making a program output may compute over in the
    output's own array: its atom's ``inplace`` operand, read last here, with the in-place chain
    it ends (the temporary it reuses, and so on), all of the output's very type and read by
    nothing later. An embedding's gradient, ``scatter`` over a ``fill``, then writes its zeros
    into the result and adds into it; the seed's first tier computes its product, scales it and
    adds ``base`` in the result, as NumPy's temporary elision does. The executor binds such
    temporaries to the output's array of each run."""
    out = types[g.output_slot]
    for slot in (_inplace_operands(g) if not g.rewritten and g.epilogue.empty else ()):
        b = buffers.get(slot)
        if b is None or b.kind != "temporary" or last_read.get(slot) != gi \
                or g.anchor.input_slots.count(slot) != 1:
            continue
        root = b.alias_of or slot
        chain = [s for s, o in buffers.items() if o.kind == "temporary" and (o.alias_of or s) == root]
        if buffers[root].kind != "temporary" or buffers[root].last != gi:  # (a root's last is its chain's)
            continue
        if any((types[s].axes, types[s].shape, types[s].dtype) != (out.axes, out.shape, out.dtype)
               for s in chain):  # (no view: each is the output's array as it is)
            continue
        if any(s in chain for s in g.anchor.input_slots if s != slot):  # (read at other indices)
            continue
        return chain
    return []


def output_extras(plan: "Plan", g: Group) -> tuple[int, ...]:
    """The epilogue operands of the plan's group ``g`` whose memory is its output's (in-place reuse), of
    the output's very axes, extents and dtype: element for element the same addresses and
    values. A kernel reads them through its output array: read as a second array, the loop's
    vector path fails LLVM's overlap check and it runs scalar (``KernelRequest.output_extras``)."""
    buffers = plan.buffers
    root = buffers[g.output_slot].alias_of
    if root is None:
        return ()
    return tuple(k for k, (s, t) in enumerate(zip(g.epilogue.extra_slots, g.epilogue.extra_types))
                 if s in buffers and (buffers[s].alias_of or s) == root and buffers[s].kind == "temporary"
                 and (t.axes, t.shape, t.dtype) == (g.output_type.axes, g.output_type.shape, g.output_type.dtype))


def _slot_path(slot: str, slot_index: Mapping[str, int]) -> str:
    return f"$.slots[{slot_index[slot]}]" if slot in slot_index else f"$.slots.{slot}"


def _check_tensor(slot: str, t: TensorType, limits, path: str) -> int:
    """SPEC §5 per-tensor limits; returns the slot's bytes."""
    if not t.is_static:
        fail("binding_shape", path, f"slot {slot!r} has unresolved sizes {list(t.sizes)}; "
                                    f"every symbol needs an extent before planning")
    if t.dtype not in ITEMSIZE:
        fail("invalid_type", path, f"slot {slot!r} has no concrete dtype ({t.dtype!r}); "
                                   f"expected one of {', '.join(ITEMSIZE)}")
    for axis, extent in zip(t.axes, t.sizes):
        if extent > limits.max_axis_extent:
            fail("limit_exceeded", path, f"slot {slot!r} axis {axis!r} has extent {extent}; "
                                         f"max_axis_extent allows {limits.max_axis_extent}")
    elements = 1
    for extent in t.sizes:
        elements *= extent
    if elements > limits.max_tensor_elements:
        fail("limit_exceeded", path, f"slot {slot!r} ({t}) has {elements} elements; "
                                     f"max_tensor_elements allows {limits.max_tensor_elements}")
    nbytes = elements * ITEMSIZE[t.dtype]
    if nbytes > limits.max_tensor_bytes:
        fail("limit_exceeded", path, f"slot {slot!r} ({t}) needs {nbytes} bytes; "
                                     f"max_tensor_bytes allows {limits.max_tensor_bytes}")
    return nbytes


def _size(n: int) -> str:
    for unit, scale in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n >= scale:
            return f"{n / scale:.1f} {unit} ({n:,} B)"
    return f"{n} B"
