"""Greedy arena placement: exact offsets on hand-built lifetimes, alignment, hole reuse,
determinism, and the no-overlap property with its self-check."""
import pytest
from hypothesis import given, settings, strategies as st

from runtime.plan import arena


def R(name, nbytes, first, last):
    return arena.Request(name, nbytes, first, last)


def test_exact_offsets_largest_first_first_fit():
    reqs = [R("a", 100, 0, 1), R("b", 300, 1, 2), R("c", 50, 2, 3), R("d", 200, 3, 4)]
    offsets, peak = arena.place(reqs)
    # b (largest) at 0; d (lives 3..4, b 1..2) also at 0; a overlaps b -> after b (aligned);
    # c overlaps b and d -> the lowest aligned offset past both
    assert offsets == {"b": 0, "d": 0, "a": 320, "c": 320}
    assert peak == 420
    arena.check_no_overlap(reqs, offsets, peak=peak)


def test_offsets_are_64_byte_aligned_and_gaps_are_reused():
    reqs = [R("big", 1000, 0, 0), R("x", 10, 0, 2), R("y", 900, 1, 1)]
    offsets, peak = arena.place(reqs)
    assert offsets == {"big": 0, "y": 0, "x": 1024} and peak == 1034


def test_a_small_buffer_fills_the_hole_between_two_live_ones():
    # a [0,640) and c [1280,1920) are live with s; the hole [640,1280) takes s exactly
    reqs = [R("a", 640, 0, 2), R("b", 640, 0, 0), R("c", 640, 0, 2), R("s", 640, 1, 2)]
    offsets, peak = arena.place(reqs)
    assert offsets == {"a": 0, "b": 640, "c": 1280, "s": 640} and peak == 1920


def test_a_hole_too_small_is_skipped():
    reqs = [R("a", 640, 0, 2), R("b", 100, 0, 0), R("c", 640, 0, 2), R("s", 200, 1, 2)]
    offsets, _ = arena.place(reqs)
    assert offsets["b"] == 1280 and offsets["s"] == 1280  # b placed after a and c; s reuses b's bytes


def test_ties_go_to_the_earlier_first_use_then_the_name():
    reqs = [R("z", 128, 0, 1), R("y", 128, 1, 2), R("x", 128, 1, 2)]
    offsets, _ = arena.place(reqs)
    assert offsets == {"z": 0, "x": 128, "y": 256}
    assert [r.name for r in arena.placement_order(reqs)] == ["z", "x", "y"]


def test_disjoint_lifetimes_share_offset_zero_and_the_peak_is_below_the_sum():
    reqs = [R(f"t{i}", 4096, i, i + 1) for i in range(6)]  # each overlaps only its neighbours
    offsets, peak = arena.place(reqs)
    assert peak == 2 * 4096 < sum(r.nbytes for r in reqs)
    assert sorted(set(offsets.values())) == [0, 4096]


def test_empty_and_zero_size_requests():
    assert arena.place([]) == ({}, 0)
    offsets, peak = arena.place([R("e", 0, 0, 3), R("a", 64, 0, 3)])
    assert offsets == {"a": 0, "e": 0} and peak == 64


def test_custom_alignment():
    offsets, peak = arena.place([R("a", 10, 0, 1), R("b", 10, 0, 1)], alignment=256)
    assert offsets == {"a": 0, "b": 256} and peak == 266


def test_bad_requests_are_refused():
    with pytest.raises(ValueError):
        R("a", 10, 3, 2)
    with pytest.raises(ValueError):
        R("a", -1, 0, 0)
    with pytest.raises(ValueError, match="repeat"):
        arena.place([R("a", 1, 0, 0), R("a", 2, 1, 1)])


@settings(max_examples=300, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 5000), st.integers(0, 10), st.integers(0, 5)), min_size=1, max_size=25))
def test_live_buffers_never_overlap(items):
    reqs = [R(f"b{i}", n, f, f + d) for i, (n, f, d) in enumerate(items)]
    offsets, peak = arena.place(reqs)
    arena.check_no_overlap(reqs, offsets, peak=peak)
    assert peak >= max(r.nbytes for r in reqs)
    assert peak <= sum(arena.aligned(r.nbytes) for r in reqs)
    # greedy: each buffer sits at the lowest aligned offset free of those placed before it
    order = arena.placement_order(reqs)
    for i, r in enumerate(order):
        before = order[:i]
        for lower in range(0, offsets[r.name], arena.ALIGNMENT):
            clash = any(b.overlaps_in_time(r) and b.nbytes and lower < offsets[b.name] + b.nbytes
                        and offsets[b.name] < lower + r.nbytes for b in before)
            assert clash, f"{r.name} could sit at {lower} < {offsets[r.name]}"


def test_overlap_self_check_detects_a_bad_layout():
    reqs = [R("a", 100, 0, 1), R("b", 100, 1, 2)]
    assert arena.overlapping_pairs(reqs, {"a": 0, "b": 64}) == [("a", "b")]
    with pytest.raises(AssertionError, match="a and b overlap"):
        arena.check_no_overlap(reqs, {"a": 0, "b": 64})
    with pytest.raises(AssertionError, match="not a multiple of 64"):
        arena.check_no_overlap(reqs, {"a": 0, "b": 100})
    with pytest.raises(AssertionError, match="past the peak"):
        arena.check_no_overlap(reqs, {"a": 0, "b": 128}, peak=200)
    arena.check_no_overlap([R("a", 100, 0, 0), R("b", 100, 1, 1)], {"a": 0, "b": 0})  # not live together
