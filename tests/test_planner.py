"""Planner: lifetimes, in-place reuse, arena layout, the preflight of SPEC §5 and the report —
on stand-in atoms (tests/test_grouping.py) run through a simulated executor, and on the real
atoms through runtime.compile."""
import json
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

import runtime
from runtime.plan.fusion import CHAIN
from runtime.kernels.layout import align_to
from runtime.program.model import Limits
from runtime.plan.planner import make_plan
from runtime.execution.compiled import DRIVER_AFTER_RUNS
from runtime.testing import ProgramBuilder, assert_backends_agree, random_values
from tests.test_grouping import (ADD, CUMSUM, MIX, MIX_PLAIN, OPAQUE, SCALE, TANH, VIEW, Prog, seed_like,
                                 spec, t)

BIG = 1 << 40


def limits(**over) -> Limits:
    fields = dict(schema_ref="arti/formula-limits@1", schema_version=1, max_bindings=32, max_slots=128,
                  max_instructions=96, max_steps=64, max_axes=8, max_axis_extent=BIG,
                  max_tensor_elements=BIG, max_tensor_bytes=BIG, max_working_bytes=BIG)
    fields.update(over)
    return Limits(**fields)


def plan_of(p: Prog, outputs, backend="cpu", fuse=None, lim=None, **kw):
    fuse = backend != "reference" if fuse is None else fuse
    return make_plan(p.nodes, p.bindings, outputs, lim or limits(), {}, backend, fuse, **kw)


# --- a simulated executor: arena views at the planned offsets, epilogues via Epilogue.emit ---

def _eval(node, args):
    name = node.atom.name
    if name in ("tanh", "add"):
        return np.tanh(args[0]) if name == "tanh" else args[0] + args[1]
    if name == "scale":
        return args[0] * align_to(args[1], node.input_types[1], node.output_type)
    if name in ("mix", "mix-plain"):
        return args[0] @ args[1].T
    if name == "cumsum":
        return np.cumsum(args[0], axis=0)
    if name == "view":
        return args[0].reshape(node.output_type.shape)
    assert name == "opaque"
    return args[0] * 2.0


def _reference(p: Prog, values):
    env = dict(values)
    for n in p.nodes:
        env[n.output_slot] = _eval(n, [env[s] for s in n.input_slots])
    return env


def simulate(plan, p: Prog, values):
    """Run the plan as the executor would: temporaries are views into one arena (pre-filled
    with NaN so an unwritten or clobbered read shows), outputs are fresh arrays, and a view
    group runs nothing (its output is its operand's memory)."""
    mem = np.full(max(plan.arena_bytes, 8) // 8 + 1, np.nan)
    raw = mem.view(np.uint8)
    outs = {}

    def where(slot, gi):
        b = plan.buffers[slot]
        if b.kind in ("input", "bank"):
            return values[slot]
        if b.kind == "output":
            return outs.setdefault(slot, np.full(p.types[slot].shape, np.nan))
        if b.alias_of is not None and plan.buffers[b.alias_of].kind == "output":  # computed in its array
            assert b.first <= gi <= b.last, f"{slot} used outside its lifetime"
            return where(b.alias_of, gi)
        root = plan.buffers[b.alias_of or slot]
        assert root.first <= gi <= root.last and b.first <= gi, f"{slot} used outside its lifetime"
        return raw[b.offset:b.offset + b.nbytes].view(np.float64).reshape(p.types[slot].shape)

    ns_math = SimpleNamespace(tanh=np.tanh)
    for gi, g in enumerate(plan.groups):
        if gi in plan.views:
            assert plan.buffers[g.output_slot].alias_of is not None
            continue
        value = None
        if g.anchor is not None:
            value = _eval(g.anchor, [where(s, gi).copy() for s in g.anchor.input_slots])
        if not g.epilogue.empty:
            env = {"math": ns_math, "_anchor": value}
            for k, (s, ty) in enumerate(zip(g.epilogue.extra_slots, g.epilogue.extra_types)):
                env[f"_x{k}"] = align_to(where(s, gi).copy(), ty, g.output_type)
            lines, result = g.epilogue.emit(None if value is None else "_anchor",
                                            [f"_x{k}" for k in range(g.epilogue.n_extra)])
            exec("\n".join(lines), env)
            value = env[result]
        where(g.output_slot, gi)[...] = value
    return outs


def _bytes(b):
    return b.offset, b.offset + b.nbytes


def check_invariants(plan, p: Prog, outputs):
    from runtime.plan.planner import live_nodes  # unread results are not computed

    live = live_nodes(p.nodes, outputs)
    assert sorted(n.index for g in plan.groups for n in g.nodes) == sorted(n.index for n in live)
    assert [g.position for g in plan.groups] == sorted(g.position for g in plan.groups)
    produced = set(p.bindings)
    for gi, g in enumerate(plan.groups):
        assert set(g.input_slots) <= produced, f"group {gi} reads a slot produced later"
        produced.add(g.output_slot)
        for step in g.epilogue.steps:  # the chain value always has the step's output type's shape
            chained = [step.node.input_types[k] for k, src in enumerate(step.sources) if src == CHAIN]
            assert all((c.axes, c.shape) == (step.node.output_type.axes, step.node.output_type.shape)
                       for c in chained)
            assert (step.node.output_type.axes, step.node.output_type.shape) == \
                (g.output_type.axes, g.output_type.shape)
        for s in g.fused_slots:
            assert s not in plan.buffers and s not in outputs
            assert sum(n.input_slots.count(s) for n in live) == 1
    every_temp = [b for b in plan.buffers.values() if b.kind == "temporary"]
    for a in every_temp:  # computed in an output's array: read last by the group that makes the output
        if a.alias_of is not None and plan.buffers[a.alias_of].kind == "output":
            out = plan.buffers[a.alias_of]
            assert a.offset is None and not a.in_arena and a.last == out.first and a.nbytes == out.nbytes
            assert p.types[a.slot] == p.types[a.alias_of] or \
                (p.types[a.slot].shape, p.types[a.slot].dtype) == (p.types[a.alias_of].shape, p.types[a.alias_of].dtype)
    temps = [b for b in every_temp if b.in_arena]
    for i, a in enumerate(temps):
        ra = plan.buffers[a.alias_of or a.slot]
        assert a.offset == ra.offset and a.offset % 64 == 0 and a.offset + a.nbytes <= plan.arena_bytes
        for b in temps[i + 1:]:
            rb = plan.buffers[b.alias_of or b.slot]
            if ra.slot != rb.slot and ra.first <= rb.last and rb.first <= ra.last:
                (a0, a1), (b0, b1) = _bytes(ra), _bytes(rb)
                assert a1 <= b0 or b1 <= a0, f"{a.slot} and {b.slot} overlap while live"
    assert plan.temporaries_bytes == sum(b.nbytes for b in every_temp)
    assert plan.working_bytes == plan.binding_bytes + plan.arena_bytes + plan.output_bytes


CLASSES = {"A": t(T=3, D=4), "B": t(T=3, E=8)}


@st.composite
def programs(draw):
    p = Prog()
    by_class = {"A": [p.input("xa", CLASSES["A"])], "B": [p.input("xb", CLASSES["B"])]}
    gains = {"A": [p.input("ga", t(D=4))], "B": [p.input("gb", t(E=8))]}  # factors, by class
    weights = {"A": p.input("wba", t(E=8, D=4)), "B": p.input("wab", t(D=4, E=8))}  # class -> other
    produced = []
    for _ in range(draw(st.integers(1, 9))):
        c = draw(st.sampled_from("AB"))
        pick = lambda: draw(st.sampled_from(by_class[c]))  # noqa: E731
        kind = draw(st.sampled_from(["tanh", "add", "scale", "mix", "mix-plain", "cumsum", "opaque",
                                     "factor", "view"]))
        if kind == "add":
            slot, oc = p.op(ADD, pick(), pick()), c
        elif kind == "scale":
            slot, oc = p.op(SCALE, pick(), draw(st.sampled_from(gains[c]))), c
        elif kind == "factor":  # a computed factor: may never become the chain value of scale
            slot = p.op(TANH, draw(st.sampled_from(gains[c])))
            gains[c].append(slot)
            produced.append(slot)
            continue
        elif kind in ("mix", "mix-plain"):
            slot, oc = p.op(MIX if kind == "mix" else MIX_PLAIN, pick(), weights[c]), "B" if c == "A" else "A"
        else:
            slot, oc = p.op({"tanh": TANH, "cumsum": CUMSUM, "opaque": OPAQUE, "view": VIEW}[kind], pick()), c
        by_class[oc].append(slot)
        produced.append(slot)
    extra = draw(st.lists(st.sampled_from(produced), unique=True, max_size=3))
    return p, list(dict.fromkeys([produced[-1]] + extra))


@settings(max_examples=150, deadline=None)
@given(programs(), st.sampled_from(["cpu", "cuda", "reference"]))
def test_simulated_runs_of_random_plans_match_unplanned_evaluation(prog, backend):
    p, outputs = prog
    plan = plan_of(p, outputs, backend)
    check_invariants(plan, p, outputs)
    rng = np.random.default_rng(0)
    values = {name: rng.standard_normal(ty.shape) for name, ty in p.bindings.items()}
    got = simulate(plan, p, values)
    want = _reference(p, values)
    assert set(got) == set(outputs)
    for slot in outputs:
        np.testing.assert_allclose(got[slot], want[slot], rtol=1e-12, atol=1e-12)


def test_seed_shape_plan_with_stand_ins():
    p, outs = seed_like()
    plan = plan_of(p, outs, "cpu", binding_kinds={"A": "bank", "B": "bank"})
    assert [b.slot for b in plan.buffers.values() if b.kind == "temporary"] == ["%1"]
    assert plan.buffers["%1"] == runtime.plan.planner.Buffer("%1", "temporary", 4 * 2 * 8, 0, 1, 0, None)
    assert plan.buffers["A"].kind == "bank" and plan.buffers["x"].kind == "input"
    assert plan.buffers["x"].first == -1 and plan.buffers["x"].last == 0
    assert plan.buffers["base"].last == 1 and plan.buffers["%4"].kind == "output"
    assert plan.buffers["%4"].offset is None and plan.arena_bytes == 64
    assert "%0" not in plan.buffers and "%2" not in plan.buffers  # never materialised


# --- in-place reuse ---

def _tanh_chain(n):
    p = Prog()
    v = p.input("x", t(T=3, D=4))
    for _ in range(n):
        v = p.op(TANH, v)
    return p, v


def test_in_place_when_the_operand_dies_here_and_aliases_resolve_to_the_root():
    p, v = _tanh_chain(4)
    out = p.op(OPAQUE, v)  # (not in place: the chain stays in the arena)
    plan = plan_of(p, [out], "reference")
    b = plan.buffers
    assert b["%0"].alias_of is None and b["%1"].alias_of == "%0" and b["%2"].alias_of == "%0" \
        and b["%3"].alias_of == "%0"
    assert b["%0"].last == 4  # extended over its aliases' lifetimes
    assert b[out].kind == "output" and b[out].alias_of is None
    assert plan.arena_bytes == 96 and plan.temporaries_bytes == 4 * 96
    assert "in place of %0" in plan.describe()


def test_an_in_place_chain_that_ends_in_an_output_is_computed_in_the_outputs_array():
    """The seed's first tier: its product, scale and add all in the result (as NumPy's
    temporary elision does), no arena."""
    p, out = _tanh_chain(4)
    plan = plan_of(p, [out], "reference")
    b = plan.buffers
    assert b["%0"].alias_of == b["%1"].alias_of == b["%2"].alias_of == out  # the whole chain
    assert b[out].kind == "output" and b[out].alias_of is None
    assert plan.arena_bytes == 0 and f"in the array of output {out}" in plan.describe()
    values = {"x": np.linspace(-2, 2, 12).reshape(3, 4)}
    np.testing.assert_allclose(simulate(plan, p, values)[out], _reference(p, values)[out])
    q = Prog()
    x = q.input("x", t(T=3, D=4))
    a = q.op(TANH, x)
    kept = q.op(TANH, a)
    c = q.op(ADD, kept, q.op(TANH, x))
    plan = plan_of(q, [c, a], "reference")  # a is an output of its own: the chain starts after it
    assert plan.buffers[kept].alias_of == c and plan.buffers[a].alias_of is None
    values = {"x": np.linspace(-2, 2, 12).reshape(3, 4)}
    got, want = simulate(plan, q, values), _reference(q, values)
    for slot in (a, c):
        np.testing.assert_allclose(got[slot], want[slot])


def test_no_in_place_while_the_operand_is_still_read_later():
    p = Prog()
    x = p.input("x", t(T=3, D=4))
    a = p.op(TANH, x)
    b = p.op(TANH, a)
    c = p.op(ADD, b, a)  # a is still read here: b may not take its buffer; c may take b's
    d = p.op(OPAQUE, c)  # (not in place: the chain stays in the arena)
    plan = plan_of(p, [d], "reference")
    assert plan.buffers[b].alias_of is None and plan.buffers[c].alias_of == b
    assert plan.buffers[a].offset != plan.buffers[b].offset


def test_no_in_place_over_a_binding_or_a_different_size():
    shrink = spec("shrink", lambda ctx: ctx.output(ctx.operands[0].axes[:-1], ctx.operands[0].sizes[:-1]),
                  ("value",), inplace=0)
    p = Prog()
    a = p.op(TANH, p.input("x", t(T=3, D=4)))  # operand is a binding
    s = p.op(shrink, a)  # sizes differ
    out = p.op(TANH, s)
    plan = plan_of(p, [out], "reference")
    assert plan.buffers[a].alias_of is None and plan.buffers[s].alias_of != a
    assert plan.buffers[s].alias_of == out and not plan.buffers[s].in_arena  # (the output's own array)
    check_invariants(plan, p, [out])


def test_a_lone_in_place_node_making_an_output_computes_its_operand_in_the_outputs_array():
    """An embedding's gradient (scatter over a fill) writes its zeros into the result and adds
    into it: the operand takes no arena bytes (the output of its last reader); not when it is a
    program output itself."""
    p = Prog()
    u = p.op(CUMSUM, p.input("x", t(T=3, D=4)))
    out = p.op(TANH, u)
    plan = plan_of(p, [out], "reference")
    assert plan.buffers[u].alias_of == out and plan.arena_bytes == 0
    check_invariants(plan, p, [out])
    values = {"x": np.random.default_rng(0).standard_normal((3, 4))}
    np.testing.assert_allclose(simulate(plan, p, values)[out], _reference(p, values)[out])
    p = Prog()
    u = p.op(CUMSUM, p.input("x", t(T=3, D=4)))
    out, again = p.op(TANH, u), p.op(TANH, u)  # read twice: in the array of its last reader's output
    plan = plan_of(p, [out, again], "reference")
    assert plan.buffers[u].alias_of == again
    check_invariants(plan, p, [out, again])
    got, want = simulate(plan, p, values), _reference(p, values)
    for slot in (out, again):
        np.testing.assert_allclose(got[slot], want[slot])
    p = Prog()
    u = p.op(CUMSUM, p.input("x", t(T=3, D=4)))
    out = p.op(TANH, u)
    assert plan_of(p, [out, u], "reference").buffers[u].kind == "output"  # an output itself


def test_fused_groups_reuse_an_epilogue_operand_of_the_output_shape_in_place():
    """An epilogue reads each operand at the output's own index before writing it there."""
    p = Prog()
    u = p.op(CUMSUM, p.input("x", t(T=3, D=4)))
    v = p.op(TANH, p.op(TANH, u))  # a chain reading u, its last reader
    w = p.op(CUMSUM, v)
    plan = plan_of(p, [w], "cpu")
    assert plan.groups[1].anchor is None and plan.buffers[v].alias_of == u
    assert plan.buffers[u].offset == plan.buffers[v].offset
    check_invariants(plan, p, [w])


def test_a_view_of_a_temporary_aliases_it_and_runs_no_kernel():
    p = Prog()
    x = p.input("x", t(T=3, D=4))
    a = p.op(CUMSUM, x)
    v = p.op(VIEW, a)
    w = p.op(VIEW, v)  # a view of a view: the same root
    out = p.op(CUMSUM, w)
    plan = plan_of(p, [out], "cpu")
    b = plan.buffers
    assert plan.views == {1, 2} and b[v].alias_of == a and b[w].alias_of == a
    assert b[a].last == 3 and plan.arena_bytes == b[a].nbytes  # extended over the views' readers
    assert [g.output_slot for g in plan.kernel_groups] == [a, out]
    assert "a view of %0" in plan.describe() and plan.to_dict()["schedule"][1]["kernel"] == "view"
    check_invariants(plan, p, [out])


def test_no_view_of_a_binding_into_an_output_or_on_the_reference_backend():
    p = Prog()
    x = p.input("x", t(T=3, D=4))
    v = p.op(VIEW, x)  # a caller's array: copied by the kernel
    a = p.op(CUMSUM, v)
    out = p.op(VIEW, a)  # an output is a fresh array
    assert not plan_of(p, [out], "cpu").views
    p2 = Prog()
    a2 = p2.op(CUMSUM, p2.input("x", t(T=3, D=4)))
    out2 = p2.op(CUMSUM, p2.op(VIEW, a2))
    assert plan_of(p2, [out2], "cpu").views == {1}
    assert not plan_of(p2, [out2], "reference").views  # the oracle copies


def test_no_in_place_over_a_buffer_a_view_still_reads():
    """``a`` dies at ``b`` by its own readers, but its view ``v`` is read after: ``b`` may not
    take the buffer they share."""
    p = Prog()
    x = p.input("x", t(T=3, D=4))
    a = p.op(CUMSUM, x)
    v = p.op(VIEW, a)
    doubled = spec("opaque", lambda ctx: ctx.operands[0], ("value",), lambda node: None, inplace=0)
    b = p.op(doubled, a)  # a lone node, in place on a: a's last reader
    c = p.op(ADD, b, v)
    plan = plan_of(p, [c], "cpu", fuse=True)
    assert plan.buffers[v].alias_of == a and plan.buffers[b].alias_of is None
    check_invariants(plan, p, [c])
    values = {"x": np.random.default_rng(1).standard_normal((3, 4))}
    np.testing.assert_allclose(simulate(plan, p, values)[c], _reference(p, values)[c], rtol=1e-12)


def test_an_anchor_operand_is_never_reused_in_place():
    """A contraction reads its operands across the output: never in place, fused or not."""
    p = Prog()
    u = p.op(CUMSUM, p.input("x", t(T=3, D=3)))
    y = p.op(TANH, p.op(MIX, u, p.input("w", t(E=3, D=3))))  # [T=3, E=3]: u's size, last read here
    z = p.op(CUMSUM, y)
    plan = plan_of(p, [z], "cpu")
    assert plan.groups[1].kind == "anchor+epilogue" and plan.buffers[y].alias_of is None
    assert plan.buffers[u].offset != plan.buffers[y].offset
    check_invariants(plan, p, [z])


# --- preflight ---

@pytest.mark.parametrize("over, words", [
    ({"max_axis_extent": 15}, "axis 'E' has extent 16; max_axis_extent allows 15"),
    ({"max_tensor_elements": 63}, "has 64 elements; max_tensor_elements allows 63"),
    ({"max_tensor_bytes": 511}, "needs 512 bytes; max_tensor_bytes allows 511"),
])
def test_per_tensor_limits_name_the_slot_and_both_numbers(over, words):
    p, outs = seed_like()
    with pytest.raises(runtime.FormulaError) as err:
        plan_of(p, outs, lim=limits(**over))
    assert err.value.code == "limit_exceeded" and words in err.value.message
    assert err.value.path == "$.slots.base" and "'base'" in err.value.message
    with pytest.raises(runtime.FormulaError) as err:
        plan_of(p, outs, lim=limits(**over), slot_index={"base": 3})
    assert err.value.path == "$.slots[3]"


def test_per_tensor_limits_cover_fused_intermediates():
    p = Prog()
    x = p.input("x", t(T=4, D=2))
    y = p.op(TANH, p.op(MIX, x, p.input("w", t(E=3, D=2))))  # %0 [T=4, E=3], fused away
    assert "%0" not in plan_of(p, [y]).buffers
    with pytest.raises(runtime.FormulaError) as err:
        plan_of(p, [y], lim=limits(max_tensor_elements=11))
    assert err.value.path == "$.slots.%0"


def test_unresolved_types_are_refused():
    p = Prog()
    p.bindings["x"] = t(D=4).evolve(dtype="floating")
    with pytest.raises(runtime.FormulaError) as err:
        plan_of(p, [])
    assert err.value.code == "invalid_type"
    p.bindings["x"] = t(D="D")
    with pytest.raises(runtime.FormulaError) as err:
        plan_of(p, [])
    assert err.value.code == "binding_shape"


def test_working_set_fits_only_thanks_to_freeing():
    p = Prog()
    v = p.input("x", t(T=3, D=4))
    for _ in range(5):
        v = p.op(CUMSUM, v)  # no in-place trait: each temporary is freed after its reader
    plan = plan_of(p, [v], "cpu")
    assert plan.arena_bytes == 2 * 96 + 32 and plan.temporaries_bytes == 4 * 96  # 96 -> 128 aligned
    exact = plan.binding_bytes + plan.arena_bytes + plan.output_bytes
    assert exact < plan.binding_bytes + plan.temporaries_bytes + plan.output_bytes
    assert plan_of(p, [v], lim=limits(max_working_bytes=exact)).fits
    with pytest.raises(runtime.FormulaError) as err:
        plan_of(p, [v], lim=limits(max_working_bytes=exact - 1))
    assert err.value.code == "limit_exceeded" and err.value.path == "$.limits.max_working_bytes"
    assert f"needs {exact} bytes" in err.value.message and "working set" in err.value.message
    assert f"allows {exact - 1}" in err.value.message and "384 without reuse" in err.value.message


def test_in_place_chain_needs_one_buffer():
    p, v = _tanh_chain(5)
    out = p.op(OPAQUE, v)  # (not in place: the chain stays in the arena)
    plan = plan_of(p, [out], "cpu", fuse=False)
    assert plan.arena_bytes == 96 and plan.temporaries_bytes == 5 * 96
    assert {plan.buffers[f"%{i}"].offset for i in range(5)} == {0}


def test_alternating_offsets_without_in_place():
    p = Prog()
    v = p.input("x", t(T=3, D=4))
    for _ in range(5):
        v = p.op(CUMSUM, v)
    plan = plan_of(p, [v], "cpu")
    assert [plan.buffers[f"%{i}"].offset for i in range(4)] == [0, 128, 0, 128]


def test_report_is_json_ready_and_readable():
    p, outs = seed_like()
    plan = plan_of(p, outs, "cpu")
    d = json.loads(json.dumps(plan.to_dict()))
    assert d["verdict"] == "fits" and d["fused"] and d["backend"] == "cpu"
    assert [g["instructions"] for g in d["schedule"]] == [["i0", "i1"], ["i2", "i3", "i4"]]
    assert d["schedule"][1]["fused_slots"] == ["%2", "%3"] and d["schedule"][1]["kernel"] == "anchor+epilogue"
    assert d["arena"]["peak_bytes"] == 64 and d["arena"]["without_reuse_bytes"] == 64
    assert {b["slot"]: (b["first"], b["last"], b["offset"]) for b in d["buffers"]}["%1"] == (0, 1, 0)
    text = plan.describe()
    for words in ("2 kernel groups for 5 instructions", "mix+scale+add [i2, i3, i4]", "fused away: %2, %3",
                  "arena peak 64 B vs 64 B without reuse", "fits max_working_bytes"):
        assert words in text, text

SEED = Path(__file__).resolve().parents[1] / "examples" / "seed-lora-silu.program.json"


def test_seed_runs_as_two_fused_groups_with_one_temporary():
    plan = runtime.compile(SEED, "cpu").plan({"B": 2, "S": 64})
    assert [[n.instruction_id for n in g.nodes] for g in plan.groups] == [["i0", "i1"], ["i2", "i3", "i4"]]
    temps = [b for b in plan.buffers.values() if b.kind == "temporary"]
    assert [(b.slot, b.nbytes, b.offset) for b in temps] == [("%1", 2 * 64 * 32 * 4, 0)]
    assert plan.arena_bytes == 2 * 64 * 32 * 4
    assert plan.buffers["%4"].kind == "output" and plan.buffers["%4"].offset is None
    d = plan.to_dict()
    json.dumps(d)
    assert d["fits"] and d["schedule"][1]["atoms"] == ["contract", "scale", "add"]
    text = plan.describe()
    assert "arena peak" in text and "contract+scale+add" in text


def test_reference_backend_plans_every_instruction_alone():
    plan = runtime.compile(SEED, "reference").plan({"B": 1, "S": 8})
    assert len(plan.groups) == 5
    assert {b.slot for b in plan.buffers.values() if b.kind == "temporary"} == {"%0", "%1", "%2", "%3"}
    assert plan.arena_bytes < plan.temporaries_bytes  # freed temporaries are reused


def _chain(n_steps=4, fork=False):
    b = ProgramBuilder()
    x = b.input("x", {"T": "T", "D": 256})
    y = b.input("y", {"T": "T", "D": 256})
    v = b.op("add", [x, y], {"accumulation_dtype": "float32"})
    slots = [v]
    for _ in range(n_steps):
        v = b.op("scalar-map", [v], {"mode": "tanh"})
        slots.append(v)
    out = b.op("add", [v, slots[0]] if fork else [v, x], {"accumulation_dtype": "float32"})
    return b.build(outputs=[out])


def test_elementwise_chain_fuses_into_one_kernel():
    plan = runtime.compile(_chain(), "cpu").plan({"T": 8})
    assert len(plan.groups) == 1 and plan.groups[0].anchor is None
    assert plan.arena_bytes == 0


def test_an_intermediate_with_two_readers_is_materialised():
    plan = runtime.compile(_chain(fork=True), "cpu").plan({"T": 8})
    assert len(plan.groups) == 2
    assert [b.slot for b in plan.buffers.values() if b.kind == "temporary"] == ["%0"]


def test_an_output_is_never_fused_away():
    b = ProgramBuilder()
    x = b.input("x", {"D": 16})
    h = b.op("scalar-map", [x], {"mode": "relu"})
    y = b.op("scalar-map", [h], {"mode": "tanh"})
    plan = runtime.compile(b.build(outputs=[h, y]), "cpu").plan({})
    assert len(plan.groups) == 2


def test_broadcast_side_is_not_the_chain_value():
    b = ProgramBuilder()
    x = b.input("x", {"T": 4, "D": 16})
    g = b.input("g", {"D": 16})
    f = b.op("scalar-map", [g], {"mode": "sigmoid"})
    y = b.op("scale", [x, f], {"factor_axes": ["D"], "accumulation_dtype": "float32"})
    plan = runtime.compile(b.build(outputs=[y]), "cpu").plan({})
    assert len(plan.groups) == 2


def test_in_place_reuse_when_the_operand_dies_here():
    # non-fusing backend: each tanh may overwrite its dying input
    plan = runtime.compile(_chain(3), "reference").plan({"T": 8})
    aliased = [b for b in plan.buffers.values() if b.alias_of]
    assert aliased, plan.describe()
    for b in aliased:  # in a temporary's buffer, or (a chain ending in the result) in the result's array
        root = plan.buffers[b.alias_of]
        assert (root.kind, b.offset) in (("temporary", root.offset), ("output", None))


def test_preflight_rejects_a_peak_over_max_working_bytes_before_allocating():
    exe = runtime.compile(SEED, "cpu")
    huge = {"B": 1, "S": 1 << 20}  # 4 GiB per [T, 1024] tensor, > 2 GiB max_working_bytes
    with pytest.raises(runtime.FormulaError) as err:
        exe.plan(huge)
    assert err.value.code == "limit_exceeded"


def test_a_program_fits_only_thanks_to_freeing():
    # reference: five [T,D] temporaries in sequence; without reuse they would not fit
    program = _chain(4)
    plan = runtime.compile(program, "reference").plan({"T": 64})
    need = plan.binding_bytes + plan.output_bytes
    limit = need + plan.arena_bytes
    assert need + plan.temporaries_bytes > limit
    program["limits"]["max_working_bytes"] = limit
    ok = runtime.compile(program, "reference")
    assert ok.plan({"T": 64}).working_bytes == limit
    program["limits"]["max_working_bytes"] = limit - 1
    with pytest.raises(runtime.FormulaError) as err:
        runtime.compile(program, "reference").plan({"T": 64})
    assert err.value.code == "limit_exceeded" and err.value.path == "$.limits.max_working_bytes"


def test_in_place_plan_runs_correctly_end_to_end_on_the_reference_backend():
    program = _chain(3)
    exe = runtime.compile(program, "reference")
    plan = exe.plan({"T": 5})
    # the whole in-place chain ends in the result: computed in its array
    assert {b.slot: b.alias_of for b in plan.buffers.values() if b.alias_of} == \
        {"%0": "%4", "%1": "%4", "%2": "%4", "%3": "%4"}
    assert plan.arena_bytes == 0
    rng = np.random.default_rng(1)
    x, y = (rng.standard_normal((5, 256)).astype(np.float32) for _ in range(2))
    got = exe.run(inputs={"x": x, "y": y})
    (out,) = got.values()
    want = np.tanh(np.tanh(np.tanh(x + y))) + x
    np.testing.assert_allclose(out, want, rtol=1e-5, atol=1e-6)


def _broadcast_program(dtype: str = "float32") -> dict:
    """A projection's bias, a mean subtracted (layer norm's first half), a transposed and an
    extent-1 operand expanded, and a mask expanded for a select: each broadcast read once."""
    acc = {"accumulation_dtype": "float32"}
    b = ProgramBuilder(dtype)
    x = b.input("x", {"B": 2, "S": 5, "D": 16})
    w = b.bank("w", {"E": 16, "D": 16})
    bias, neg = b.bank("bias", {"E": 16}), b.input("neg", {})
    col = b.input("col", {"E": 16, "B": 2})  # another axis order than the output's
    row = b.input("row", {"B": 2, "S": 1, "E": 16})  # an extent-1 axis expanded
    mask = b.input("mask", {"S": 5, "E": 16}, "boolean")
    full = {"output_axes": ["B", "S", "E"], "output_sizes": [2, 5, 16]}
    y = b.op("contract", [x, w], {"reduce_axes": [["D", "D"]], "output_axes": ["B", "S", "E"], **acc})
    y = b.op("add", [y, b.op("broadcast", [bias], full)], acc)
    mean = b.op("reduce@2", [y], {"axis": "E", "mode": "mean", **acc})
    shift = b.op("broadcast", [b.op("scale", [mean, neg], {"factor_axes": [], **acc})], full)
    centred = b.op("add", [y, shift], acc)
    turned = b.op("broadcast", [col], full)
    z = b.op("add", [b.op("add", [centred, b.op("broadcast", [row], full)], acc),
                     b.op("scalar-map", [b.op("add", [y, turned], acc)], {"mode": "tanh"})], acc)
    out = b.op("select", [b.op("broadcast", [mask], full), z, y])
    return b.build(outputs=[out])


@pytest.mark.parametrize("dtype", ["float32", "float64", "float16"])
def test_broadcasts_read_once_by_a_chain_are_never_materialised(dtype):
    prog = _broadcast_program(dtype)
    inputs, banks = random_values(prog, {}, seed=3)
    plan = runtime.compile(prog, "cpu").plan({})
    lone = [g.label for g in plan.groups if [n.atom.name for n in g.nodes] == ["broadcast"]]
    absorbed = [n for g in plan.groups for n in g.nodes if n.atom.name == "broadcast"]
    assert not lone and len(absorbed) == 5, plan.describe()
    assert all(n.output_slot not in plan.buffers for n in absorbed)  # no memory: never written
    assert_backends_agree(prog, inputs, banks, backends=("cpu", "cuda"))
    exe = runtime.compile(prog, "cpu")
    want = runtime.compile(prog, "reference").run(inputs=inputs, banks=banks)
    for _ in range(DRIVER_AFTER_RUNS + 1):  # then through the compiled driver
        got = exe.run(inputs=inputs, banks=banks)
    exe.wait_compiled()
    got = exe.run(inputs=inputs, banks=banks)
    for slot in want:
        np.testing.assert_allclose(np.asarray(got[slot], np.float64), np.asarray(want[slot], np.float64),
                                   rtol=1e-2 if dtype == "float16" else 1e-5, atol=1e-2 if dtype == "float16" else 1e-5)
