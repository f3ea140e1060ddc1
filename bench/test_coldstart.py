"""Cold and warm first runs of the seed, each in a fresh process (bench/coldstart.py).

Not part of bench/run.py's timed suites (the driver runs the same step itself, at
T=256); here at T=1 so that ``pytest bench --benchmark-disable`` checks it works and that
the on-disk kernel cache really makes the second process's first run cheaper."""
from __future__ import annotations

import importlib.util

import pytest

from bench import coldstart


def _runtime_importable() -> str | None:
    try:
        import runtime

        runtime.compile  # noqa: B018 - the lazy attribute imports the executor
    except (ImportError, SyntaxError, AttributeError) as exc:
        return f"runtime.compile is not importable yet: {type(exc).__name__}: {exc}"
    return None


@pytest.mark.parametrize("contender", ["reference", "cpu"])
def test_cold_then_warm_first_run(contender, tmp_path):
    reason = _runtime_importable()
    if reason:
        pytest.skip(reason)
    cold, warm = coldstart.cold_and_warm(contender, tokens=1, cache=tmp_path)
    for r in (cold, warm):
        assert not r.get("error"), r.get("stderr_tail")
        assert r["cache_dir"] == str(tmp_path)
    assert (tmp_path / "numba").is_dir() or contender == "reference"
    if contender == "cpu" and importlib.util.find_spec("numba") is not None:
        # A warm cache loads compiled kernels instead of compiling them again.
        assert warm["first_run_s"] + warm["compile_s"] < cold["first_run_s"] + cold["compile_s"], (cold, warm)
