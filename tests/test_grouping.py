"""Fusion grouping rules, on stand-in atoms whose traits are set per test (the planner knows
atoms only through ``elementwise``, ``anchors`` and ``inplace``). The stand-ins and the small
program builder here are reused by tests/test_planner.py."""
from __future__ import annotations

import attrs

from runtime.plugins.atomspec import AtomSpec, InferContext, ScalarOp, bind_node
from runtime.plan.fusion import CHAIN
from runtime.plan.grouping import make_groups
from runtime.core.types import TensorType


def _same(ctx: InferContext) -> TensorType:
    for k in range(1, len(ctx.operands)):
        if not ctx.operands[k].same_as(ctx.operands[0]):
            ctx.mismatch("operands differ", k)
    return ctx.operands[0]


def _scale(ctx: InferContext) -> TensorType:
    value, factor = ctx.operands
    if not set(factor.axes) <= set(value.axes):
        ctx.mismatch("factor axes must be value axes", 1)
    return value


def _mix(ctx: InferContext) -> TensorType:
    """left[T, X] · right[Y, X] -> [T, Y] (a contraction over the last left axis)."""
    left, right = ctx.operands
    ctx.require_extent(left.sizes[-1], right.sizes[1], "reduced axis", 1)
    return ctx.output(left.axes[:-1] + right.axes[:1], left.sizes[:-1] + right.sizes[:1])


def spec(name, infer, inputs, elementwise=None, anchors=(), inplace=None, view=False) -> AtomSpec:
    return AtomSpec(name, (f"test/formula-atom-{name}@1",), inputs, frozenset(), infer,
                    elementwise=elementwise, anchors=frozenset(anchors),
                    inplace=inplace, view=view)


def ew(expr):
    return lambda node: ScalarOp(expr)


TANH = spec("tanh", _same, ("value",), ew("math.tanh({0})"), inplace=0)
ADD = spec("add", _same, ("left", "right"), ew("({0} + {1})"), inplace=0)
SCALE = spec("scale", _scale, ("value", "factor"), ew("({0} * {1})"), inplace=0)
MIX = spec("mix", _mix, ("left", "right"), anchors=("cpu",))  # anchors on cpu only
MIX_PLAIN = spec("mix-plain", _mix, ("left", "right"))  # no anchor kernel anywhere
CUMSUM = spec("cumsum", _same, ("value",))  # neither elementwise nor an anchor
OPAQUE = spec("opaque", _same, ("value",), lambda node: None)  # elementwise() declines
VIEW = spec("view", _same, ("value",), view=True)  # the operand's memory as is (a reshape)

def t(**axes) -> TensorType:
    return TensorType(tuple(axes), tuple(axes.values()), "float64", "d")


@attrs.define
class Prog:
    """Nodes with explicit slot names, as the loader would give them."""

    types: dict = attrs.field(factory=dict)
    nodes: list = attrs.field(factory=list)
    bindings: dict = attrs.field(factory=dict)

    def input(self, name, ty: TensorType) -> str:
        self.types[name] = self.bindings[name] = ty
        return name

    def op(self, atom: AtomSpec, *slots: str) -> str:
        i = len(self.nodes)
        node = bind_node(atom, {}, [self.types[s] for s in slots], instruction_id=f"i{i}", index=i)
        node = attrs.evolve(node, input_slots=tuple(slots), output_slot=f"%{i}")
        self.nodes.append(node)
        self.types[node.output_slot] = node.output_type
        return node.output_slot


def ids(groups):
    return [[n.instruction_id for n in g.nodes] for g in groups]


def seed_like() -> tuple[Prog, list[str]]:
    """contract → silu → contract → scale(gain) → add(base, ·), as in the seed program."""
    p = Prog()
    x, base = p.input("x", t(T=4, D=8)), p.input("base", t(T=4, E=16))
    a, b = p.input("A", t(R=2, D=8)), p.input("B", t(E=16, R=2))
    gain = p.input("gain", t())
    h = p.op(TANH, p.op(MIX, x, a))
    y = p.op(ADD, base, p.op(SCALE, p.op(MIX, h, b), gain))
    return p, [y]


def test_seed_shape_gives_two_anchor_groups_with_exact_sources():
    p, outs = seed_like()
    groups = make_groups(p.nodes, outs, "cpu", fuse=True)
    assert ids(groups) == [["i0", "i1"], ["i2", "i3", "i4"]]
    g0, g1 = groups
    assert g0.anchor.instruction_id == "i0" and [s.sources for s in g0.epilogue.steps] == [(CHAIN,)]
    assert g0.epilogue.extra_slots == () and g0.output_slot == "%1" and g0.fused_slots == ("%0",)
    # scale: value is the chain, gain is extra 0; add(base, chain): base is extra 1
    assert [s.sources for s in g1.epilogue.steps] == [(CHAIN, 0), (1, CHAIN)]
    assert g1.epilogue.extra_slots == ("gain", "base")
    assert g1.epilogue.extra_types == (t(), t(T=4, E=16))
    assert g1.input_slots == ("%1", "B", "gain", "base") and g1.kind == "anchor+epilogue"
    assert g1.output_type == t(T=4, E=16) and g1.fused_slots == ("%2", "%3")
    lines, result = g1.epilogue.emit("acc", ["g", "b"])
    assert lines[-2:] == ["_v0 = (acc * _e0)", "_v1 = (_e1 + _v0)"] and result == "_v1"


def test_fuse_false_makes_every_node_a_singleton():
    p, outs = seed_like()
    groups = make_groups(p.nodes, outs, "cpu", fuse=False)
    assert ids(groups) == [["i0"], ["i1"], ["i2"], ["i3"], ["i4"]]
    assert all(g.epilogue.empty and g.anchor is g.nodes[0] and g.kind == "single" for g in groups)


def test_anchor_without_kernel_for_the_backend_does_not_absorb():
    p, outs = seed_like()
    groups = make_groups(p.nodes, outs, "cuda", fuse=True)  # MIX anchors only on cpu
    assert ids(groups) == [["i0"], ["i1"], ["i2"], ["i3", "i4"]]
    chain = groups[3]
    assert chain.anchor is None and chain.kind == "elementwise chain"
    # an anchorless chain's first step reads only extras
    assert chain.epilogue.extra_slots == ("%2", "gain", "base")
    assert [s.sources for s in chain.epilogue.steps] == [(0, 1), (2, CHAIN)]


def test_intermediate_with_two_readers_is_not_fused():
    p = Prog()
    x = p.input("x", t(T=4, D=8))
    h = p.op(TANH, x)
    y = p.op(ADD, p.op(TANH, h), h)
    groups = make_groups(p.nodes, [y], "cpu", fuse=True)
    assert ids(groups) == [["i0"], ["i1", "i2"]]
    assert groups[1].epilogue.extra_slots == ("%0",)


def test_an_operand_read_twice_by_one_node_counts_as_two_readers():
    p = Prog()
    h = p.op(TANH, p.input("x", t(T=4, D=8)))
    y = p.op(ADD, h, h)
    assert ids(make_groups(p.nodes, [y], "cpu", fuse=True)) == [["i0"], ["i1"]]


def test_a_program_output_is_never_fused_away():
    p = Prog()
    h = p.op(TANH, p.input("x", t(D=8)))
    y = p.op(TANH, h)
    assert ids(make_groups(p.nodes, [h, y], "cpu", fuse=True)) == [["i0"], ["i1"]]
    assert ids(make_groups(p.nodes, [y], "cpu", fuse=True)) == [["i0", "i1"]]


def test_broadcast_side_is_never_the_chain_value():
    p = Prog()
    x, g = p.input("x", t(T=4, D=8)), p.input("g", t(D=8))
    y = p.op(SCALE, x, p.op(TANH, g))  # tanh(g) is the factor: broadcast, not chained
    assert ids(make_groups(p.nodes, [y], "cpu", fuse=True)) == [["i0"], ["i1"]]
    p2 = Prog()
    x, g = p2.input("x", t(T=4, D=8)), p2.input("g", t(D=8))
    y = p2.op(SCALE, p2.op(TANH, x), g)  # the value side chains
    groups = make_groups(p2.nodes, [y], "cpu", fuse=True)
    assert ids(groups) == [["i0", "i1"]] and groups[0].epilogue.extra_slots == ("x", "g")


def test_same_extents_in_another_axis_order_are_not_chained():
    p = Prog()
    x, y = p.input("x", t(T=4, D=4)), p.input("y", t(D=4, T=4))
    h = p.op(TANH, y)
    out = p.op(SCALE, x, h)  # h has x's extents but not its axis order: the broadcast side
    assert ids(make_groups(p.nodes, [out], "cpu", fuse=True)) == [["i0"], ["i1"]]


def test_other_nodes_are_singletons_and_do_not_absorb():
    p = Prog()
    x, w = p.input("x", t(T=4, D=8)), p.input("w", t(E=8, D=8))
    y = p.op(TANH, p.op(CUMSUM, x))
    z = p.op(TANH, p.op(MIX_PLAIN, y, w))
    groups = make_groups(p.nodes, [z], "cpu", fuse=True)
    assert ids(groups) == [["i0"], ["i1"], ["i2"], ["i3"]]


def test_elementwise_atom_that_declines_is_not_fused():
    p = Prog()
    y = p.op(TANH, p.op(OPAQUE, p.op(TANH, p.input("x", t(D=8)))))
    assert ids(make_groups(p.nodes, [y], "cpu", fuse=True)) == [["i0"], ["i1"], ["i2"]]


def test_anchorless_chain_dedupes_extras():
    p = Prog()
    x = p.input("x", t(D=8))
    y = p.op(TANH, p.op(ADD, x, x))
    (g,) = make_groups(p.nodes, [y], "cpu", fuse=True)
    assert g.anchor is None and g.epilogue.extra_slots == ("x",)
    assert [s.sources for s in g.epilogue.steps] == [(0, 0), (CHAIN,)]


def test_groups_run_at_their_last_node():
    p = Prog()
    x, w = p.input("x", t(T=4, D=8)), p.input("w", t(E=8, D=8))
    m = p.op(MIX, x, w)  # i0: anchor, its epilogue arrives at i2
    u = p.op(CUMSUM, p.input("z", t(T=4, E=8)))  # i1
    v = p.op(TANH, m)  # i2 joins i0's group
    out = p.op(ADD, v, u)  # i3 joins too (u is the extra)
    groups = make_groups(p.nodes, [out], "cpu", fuse=True)
    assert ids(groups) == [["i1"], ["i0", "i2", "i3"]]
    assert [g.position for g in groups] == [1, 3]


def test_first_qualifying_operand_is_the_chain():
    p = Prog()
    a = p.op(TANH, p.input("x", t(D=8)))
    b = p.op(TANH, p.input("y", t(D=8)))
    out = p.op(ADD, a, b)
    groups = make_groups(p.nodes, [out], "cpu", fuse=True)
    assert ids(groups) == [["i1"], ["i0", "i2"]]
    assert groups[1].epilogue.steps[1].sources == (CHAIN, 1)


def _expand(ctx: InferContext) -> TensorType:
    """value[D] -> [T=4, D] (a stand-in broadcast)."""
    return ctx.output(("T",) + ctx.operands[0].axes, (4,) + ctx.operands[0].sizes)


EXPAND = attrs.evolve(spec("expand", _expand, ("value",)), role="broadcast")
EXPAND_NAMED = spec("expand", _expand, ("value",))  # the same, but no role: never absorbed


def test_a_broadcast_read_once_by_a_chain_is_read_by_the_chain_itself():
    # bias: mix(x, w) + expand(b) -> the chain reads b [D] itself, the copy is never made
    p = Prog()
    x, w, b = p.input("x", t(T=4, D=8)), p.input("w", t(D=8, E=8)), p.input("b", t(D=8))
    y = p.op(ADD, p.op(MIX, x, w), p.op(EXPAND, b))
    (g,) = make_groups(p.nodes, [y], "cpu", fuse=True)
    assert ids([g]) == [["i0", "i1", "i2"]] and g.anchor.instruction_id == "i0"
    assert g.epilogue.extra_slots == ("b",) and g.epilogue.extra_types == (t(D=8),)
    assert g.fused_slots == ("%0", "%1") and g.input_slots == ("x", "w", "b")
    # an anchorless chain starting at the reader: tanh(x + expand(b))
    p = Prog()
    x, b = p.input("x", t(T=4, D=8)), p.input("b", t(D=8))
    y = p.op(TANH, p.op(ADD, x, p.op(EXPAND, b)))
    (g,) = make_groups(p.nodes, [y], "cuda", fuse=True)
    assert ids([g]) == [["i0", "i1", "i2"]] and g.anchor is None
    assert g.epilogue.extra_slots == ("x", "b") and [s.sources for s in g.epilogue.steps] == [(0, 1), (CHAIN,)]


def test_a_broadcast_stays_a_kernel_unless_one_chain_reads_it():
    def groups(build, fuse=True):
        p = Prog()
        x, b = p.input("x", t(T=4, D=8)), p.input("b", t(D=8))
        return ids(make_groups(p.nodes, build(p, x, b), "cpu", fuse=fuse))

    two_readers = lambda p, x, b: [p.op(ADD, p.op(ADD, x, e), e) for e in [p.op(EXPAND, b)]]
    assert groups(two_readers) == [["i0"], ["i1", "i2"]]
    read_twice = lambda p, x, b: [p.op(ADD, e, e) for e in [p.op(EXPAND, b)]]
    assert groups(read_twice) == [["i0"], ["i1"]]
    output = lambda p, x, b: [e, p.op(ADD, x, e)] if (e := p.op(EXPAND, b)) else None
    assert groups(output) == [["i0"], ["i1"]]
    not_elementwise = lambda p, x, b: [p.op(CUMSUM, p.op(EXPAND, b))]
    assert groups(not_elementwise) == [["i0"], ["i1"]]
    no_role = lambda p, x, b: [p.op(ADD, x, p.op(EXPAND_NAMED, b))]
    assert groups(no_role) == [["i0"], ["i1"]]
    unfused = lambda p, x, b: [p.op(ADD, x, p.op(EXPAND, b))]
    assert groups(unfused, fuse=False) == [["i0"], ["i1"]]
