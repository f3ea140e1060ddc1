"""runtime/execution/plancache.py: the plan key, and the one cache an executable keeps its
compiled plans, value structures and chunkings in (bounded, least recently used evicted)."""
from __future__ import annotations

import threading

import numpy as np
import pytest

import runtime
from runtime.build import ProgramBuilder
from runtime.execution.plancache import MAX_CACHED_PLANS, PlanCache, plan_key, ready_key


def test_the_least_recently_used_entry_is_evicted_first():
    cache = PlanCache(3)
    for k in "abc":
        cache.put(k, k.upper())
    assert cache.get("a") == "A"  # read: now the most recently used
    cache.put("d", "D")
    assert cache.keys() == ["c", "a", "d"] and "b" not in cache and cache.get("b") is None
    cache.put("c", "C2")  # written: the most recently used too
    cache.put("e", "E")
    assert cache.keys() == ["d", "c", "e"] and cache.get("c") == "C2"
    assert len(cache) == 3 and list(cache) == ["d", "e", "c"] and cache.values() == ["D", "E", "C2"]


def test_a_full_cache_keeps_its_other_entries():
    """One policy for every cache: a new entry evicts one, never the whole cache."""
    cache = PlanCache(MAX_CACHED_PLANS)
    for k in range(MAX_CACHED_PLANS + 1):
        cache.put(k, k)
    assert len(cache) == MAX_CACHED_PLANS and 0 not in cache and all(k in cache for k in range(1, 17))


def test_setdefault_keeps_the_first_value_and_counts_as_a_use():
    cache = PlanCache(2)
    assert cache.setdefault("a", 1) == 1
    cache.put("b", 2)
    assert cache.setdefault("a", 3) == 1  # the first maker's
    cache.put("c", 4)  # evicts b: a was used after it
    assert cache.keys() == ["a", "c"]


def test_a_cache_holds_at_least_one_entry():
    with pytest.raises(ValueError):
        PlanCache(0)


def test_threads_share_a_cache_within_its_bound():
    cache = PlanCache(8)

    def fill(base: int) -> None:
        for k in range(200):
            cache.put((base, k), k)
            cache.get((base, k // 2))

    threads = [threading.Thread(target=fill, args=(i,)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(cache) == 8 and len(cache.items()) == 8


def test_plan_keys_compare_by_content_and_share_kernels_across_extents():
    a = plan_key({"T": 4, "B": 2}, {"x": "float32"})
    assert a == plan_key({"B": 2, "T": 4}, {"x": "float32"}) and a.whole is None and not a.check_outputs
    b = plan_key({"T": 8, "B": 2}, {"x": "float32"})
    assert a != b and a.kernels == b.kernels
    assert plan_key({"T": 4}, {}, whole={"T": 8}).whole == (("T", 8),)
    assert plan_key({"T": 4}, {"x": "float64"}).kernels != plan_key({"T": 4}, {"x": "float32"}).kernels
    assert ready_key("f", "cpu", {"x": "float32"}, frozenset({"w"})) != \
        ready_key("f", "cpu", {"x": "float64"}, frozenset({"w"}))


def test_an_executable_keeps_at_most_max_cached_plans_the_latest_used():
    b = ProgramBuilder()
    x = b.input("x", {"T": "T"})
    y = b.op("add", [x, x], {"accumulation_dtype": "float32"})
    exe = runtime.compile(b.build([y]), "reference")
    for t in range(1, MAX_CACHED_PLANS + 3):
        exe.run(inputs={"x": np.ones(t, np.float32)})
    assert len(exe._plans) == MAX_CACHED_PLANS
    assert [dict(k.dims)["T"] for k in exe._plans] == list(range(3, MAX_CACHED_PLANS + 3))
    exe.run(inputs={"x": np.ones(3, np.float32)})  # a cached plan, used again: kept longest now
    exe.run(inputs={"x": np.ones(MAX_CACHED_PLANS + 3, np.float32)})
    assert dict(exe._plans.keys()[-2].dims)["T"] == 3 and len(exe._by_structure) <= MAX_CACHED_PLANS
