"""Planner: exact arena offsets, no overlap of live buffers, reuse, in-place, fusion rules,
and the working-bytes preflight (before any allocation)."""
import json
from pathlib import Path

import pytest
from hypothesis import given, settings, strategies as st

import runtime
from runtime import arena
from runtime.testing import ProgramBuilder

SEED = Path(__file__).resolve().parents[1] / "examples" / "seed-lora-silu.program.json"


def R(name, nbytes, first, last):
    return arena.Request(name, nbytes, first, last)


def test_exact_offsets_largest_first_first_fit():
    reqs = [R("a", 100, 0, 1), R("b", 300, 1, 2), R("c", 50, 2, 3), R("d", 200, 3, 4)]
    offsets, peak = arena.place(reqs)
    # b (largest) at 0; d (no overlap with b? b lives 1..2, d 3..4) at 0; a overlaps b -> after b
    assert offsets == {"b": 0, "d": 0, "a": 320, "c": 320}
    assert peak == 420
    arena.check_no_overlap(reqs, offsets)


def test_offsets_are_64_byte_aligned_and_gaps_are_reused():
    reqs = [R("big", 1000, 0, 0), R("x", 10, 0, 2), R("y", 900, 1, 1)]
    offsets, peak = arena.place(reqs)
    assert offsets == {"big": 0, "y": 0, "x": 1024}
    assert all(o % 64 == 0 for o in offsets.values())


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(st.integers(1, 5000), st.integers(0, 10), st.integers(0, 5)), min_size=1, max_size=25))
def test_live_buffers_never_overlap(items):
    reqs = [R(f"b{i}", n, f, f + d) for i, (n, f, d) in enumerate(items)]
    offsets, peak = arena.place(reqs)
    arena.check_no_overlap(reqs, offsets)
    assert peak >= max(r.nbytes for r in reqs)
    assert peak <= sum(arena.aligned(r.nbytes) for r in reqs)


def test_overlap_self_check_detects_a_bad_layout():
    reqs = [R("a", 100, 0, 1), R("b", 100, 1, 2)]
    with pytest.raises(AssertionError):
        arena.check_no_overlap(reqs, {"a": 0, "b": 64})


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
    for b in aliased:
        assert plan.buffers[b.alias_of].kind == "temporary"
        assert b.offset == plan.buffers[b.alias_of].offset


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
