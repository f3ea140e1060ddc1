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
