"""Background compiles run below their caller's priority (issue 36, item 4): each
``background.Thread`` lowers its own nice value (Linux), never the caller's."""
from __future__ import annotations

import os
import sys
import threading

import pytest

from runtime.execution import background

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="per-thread nice values are Linux's")


def _nice() -> int:
    return os.getpriority(os.PRIO_PROCESS, threading.get_native_id())


def _nice_in_a_background_thread() -> int:
    seen = []
    thread = background.Thread(lambda: seen.append(_nice()), "formula-test")
    assert thread.start()
    thread.join()
    return seen[0]


@pytest.mark.parametrize("setting, steps", [(None, 10), ("3", 3), ("0", 0), ("40", 19), ("x", 10)])
def test_a_background_thread_runs_below_its_caller(monkeypatch, setting, steps):
    if setting is None:
        monkeypatch.delenv("FORMULA_COMPILE_NICE", raising=False)
    else:
        monkeypatch.setenv("FORMULA_COMPILE_NICE", setting)
    caller = _nice()
    assert _nice_in_a_background_thread() == min(19, caller + steps)
    assert _nice() == caller  # (the caller keeps its priority)


def test_the_switch_interval_is_short_while_a_background_thread_lives():
    """A compile holds the GIL through most of Numba's work: while one runs the interpreter
    hands the GIL over every SWITCH_INTERVAL at most (a run's NumPy steps beside it waited up
    to 5 ms each), and the caller's interval comes back once none is left; an interval the
    caller set meanwhile is kept."""
    before = sys.getswitchinterval()
    assert before > background.SWITCH_INTERVAL  # (CPython's default, 5 ms)
    go, seen = threading.Event(), []
    first = background.Thread(lambda: go.wait(10), "formula-test-a")
    second = background.Thread(lambda: seen.append(sys.getswitchinterval()), "formula-test-b")
    assert first.start()
    assert sys.getswitchinterval() <= background.SWITCH_INTERVAL
    assert second.start()
    second.join()
    assert seen[0] <= background.SWITCH_INTERVAL
    assert sys.getswitchinterval() <= background.SWITCH_INTERVAL  # (the first still runs)
    go.set()
    first.join()
    assert sys.getswitchinterval() == before
    try:  # a caller's own change while a thread runs stays
        go.clear()
        third = background.Thread(lambda: go.wait(10), "formula-test-c")
        assert third.start()
        sys.setswitchinterval(0.002)
        go.set()
        third.join()
        assert sys.getswitchinterval() == 0.002
    finally:
        sys.setswitchinterval(before)


def test_full_collections_are_rarer_while_a_background_thread_lives(monkeypatch):
    """A compile makes long-lived objects fast: at CPython's thresholds the block's cold compile
    ran 28 full collections, each holding the GIL for 50-120 ms. While a background thread
    lives the third threshold is at least GC_GEN2_THRESHOLD; the caller's comes back after,
    and the last thread collects once if a full collection is then due (so that the next run
    does not); a short one, which leaves none due, collects nothing."""
    import gc

    before = gc.get_threshold()
    assert before[2] < background.GC_GEN2_THRESHOLD  # (CPython's default, 10)
    collected = []
    real = gc.collect
    monkeypatch.setattr(gc, "collect", lambda *a: collected.append(threading.current_thread().name) or real(*a))
    go, seen = threading.Event(), []

    def compile_like():  # (gen-1 passes past the caller's third threshold: a full pass is due)
        go.wait(10)
        for _ in range(before[2] + 2):
            real(1)

    first = background.Thread(compile_like, "formula-test-a")
    second = background.Thread(lambda: seen.append(gc.get_threshold()), "formula-test-b")
    assert first.start() and second.start()
    second.join()
    assert seen[0][2] == background.GC_GEN2_THRESHOLD and seen[0][:2] == before[:2]
    assert collected == []  # (the first still runs)
    go.set()
    first.join()
    assert gc.get_threshold() == before and collected == ["formula-test-a"]
    short = background.Thread(lambda: None, "formula-test-short")  # (no full collection due after it)
    assert short.start()
    short.join()
    assert not background.full_collection_due() and collected == ["formula-test-a"]
    try:  # thresholds the caller set meanwhile stay, and nothing is collected for it
        go.clear()
        third = background.Thread(lambda: go.wait(10), "formula-test-c")
        assert third.start()
        gc.set_threshold(500, 5, 7)
        go.set()
        third.join()
        assert gc.get_threshold() == (500, 5, 7) and collected == ["formula-test-a"]
    finally:
        gc.set_threshold(*before)
