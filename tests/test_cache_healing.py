"""The compiled-kernel cache heals itself (issue D4): damaged entries are evicted and
recompiled, an unusable or loosely permissioned directory is not used, and two processes
compiling into one cache both stay correct."""
from __future__ import annotations

import json
import os
import stat
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from runtime.kernels import codegen

from .spec.builders import atom_ref, limits, ttype

ROOT = Path(__file__).resolve().parents[1]

# a distinct mode mix, so the generated kernel is this test's own (never warm from other tests)
MODES = ("softplus", "tanh", "silu")

RUN = """
import json, logging, sys
import numpy as np
logging.basicConfig(level=logging.WARNING, stream=sys.stderr)
import runtime
x = np.linspace(-2, 2, 16, dtype=np.float32)
y = runtime.execute(json.loads(sys.argv[1]), inputs={"x": x}, backend="cpu")["y"]
print(json.dumps(np.asarray(y, dtype=np.float64).tolist()))
"""


def _program() -> dict:
    slots = [{"slot_id": "x", "value_type": ttype(["N"], [16]), "producer": "input", "producer_id": "x",
              "role": "input"}]
    instructions, prev = [], "x"
    for i, mode in enumerate(("tanh", "silu")):
        out = "y" if i == 1 else f"t{i}"
        instructions.append({"instruction_id": f"i{i}", "step": i + 1, "atom_ref": atom_ref("scalar-map"),
                             "input_slots": [prev], "output_slot": out, "attributes": {"mode": mode}})
        slots.append({"slot_id": out, "value_type": ttype(["N"], [16]), "producer": "instruction",
                      "producer_id": f"i{i}", "role": "output" if out == "y" else "temporary"})
        prev = out
    return {"schema_ref": "arti/formula-program@2", "schema_version": 2,
            "bindings": [{"kind": "input", "name": "x", "value_type": ttype(["N"], [16])}],
            "slots": slots, "instructions": instructions, "outputs": ["y"], "limits": limits()}


def _expected() -> np.ndarray:
    t = np.tanh(np.linspace(-2, 2, 16, dtype=np.float32))
    return t / (1 + np.exp(-t))


def _start(cache: Path) -> subprocess.Popen:
    env = {k: v for k, v in os.environ.items() if not k.startswith("NUMBA_CACHE")}
    env["FORMULA_CACHE_DIR"] = str(cache)
    return subprocess.Popen([sys.executable, "-c", RUN, json.dumps(_program())], cwd=ROOT, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def _finish(proc: subprocess.Popen) -> str:
    out, err = proc.communicate(timeout=300)
    assert proc.returncode == 0, err
    np.testing.assert_allclose(json.loads(out), _expected(), rtol=1e-5, atol=1e-6)
    return err


def test_two_processes_compile_into_one_cache_then_a_damaged_cache_heals(tmp_path):
    cache = tmp_path / "cache"
    procs = [_start(cache), _start(cache)]  # both cold: they compile and save concurrently
    for p in procs:
        _finish(p)
    assert stat.S_IMODE(cache.stat().st_mode) == 0o700
    entries = sorted(cache.rglob("*.nbi")) + sorted(cache.rglob("*.nbc"))
    assert entries, "the runs left no Numba cache entries"
    for i, path in enumerate(entries):  # every kind of damage: truncated, garbage, empty
        data = path.read_bytes()
        path.write_bytes([data[: len(data) // 2], b"\x80\x04garbage" * 3, b""][i % 3])
    err = _finish(_start(cache))
    assert "evicted an unreadable Numba cache entry" in err
    _finish(_start(cache))  # and the recompiled entries serve the next process


@pytest.fixture
def fresh_cache_state(monkeypatch):
    monkeypatch.setattr(codegen, "_usable", {})
    return monkeypatch


def test_a_cache_path_that_is_a_file_falls_back_to_a_private_directory(tmp_path, fresh_cache_state, caplog):
    path = tmp_path / "not-a-dir"
    path.write_text("x")
    fresh_cache_state.setenv("FORMULA_CACHE_DIR", str(path))
    used = codegen.cache_dir()
    assert used != path and used.is_dir() and stat.S_IMODE(used.stat().st_mode) == 0o700
    assert "is not a directory" in caplog.text


def test_a_cache_directory_writable_by_others_is_refused(tmp_path, fresh_cache_state, caplog):
    loose = tmp_path / "loose"
    loose.mkdir()
    loose.chmod(0o777)
    fresh_cache_state.setenv("FORMULA_CACHE_DIR", str(loose))
    assert codegen.cache_dir() != loose
    assert "writable by other users" in caplog.text and "pickles" in caplog.text


def test_a_new_cache_directory_is_private(tmp_path, fresh_cache_state):
    fresh_cache_state.setenv("FORMULA_CACHE_DIR", str(tmp_path / "a" / "b"))
    assert codegen.cache_dir() == tmp_path / "a" / "b"
    assert stat.S_IMODE((tmp_path / "a" / "b").stat().st_mode) == 0o700


# a function of two overloads whose cache entries are swapped: each index entry names the
# other overload's code (what two processes saving overloads at once can leave)
SWAPPED = """
import json, logging, sys
import numpy as np
logging.basicConfig(level=logging.WARNING, stream=sys.stderr)
import runtime  # (the healing: runtime.kernels.codegen.heal_numba_cache)
from runtime.kernels.codegen import heal_numba_cache
heal_numba_cache()
sys.path.insert(0, sys.argv[1])
from twoways import count
print(json.dumps([int(count(np.array([1, 2, 3], np.uint32), np.uint32(2))),
                  int(count(np.array([1, 2, 3, 2], np.uint64), np.uint64(2)))]))
"""

TWOWAYS = """
import numpy as np
from numba import njit

@njit(cache=True)
def count(bits, value):
    n = 0
    for i in range(bits.size):
        n += bits[i] == value
    return n
"""


def test_an_entry_holding_another_overloads_code_is_evicted_not_called(tmp_path):
    (tmp_path / "twoways.py").write_text(TWOWAYS)
    env = {k: v for k, v in os.environ.items() if not k.startswith("NUMBA_CACHE")}
    env["NUMBA_CACHE_DIR"] = str(tmp_path / "numba")

    def run():
        done = subprocess.run([sys.executable, "-c", SWAPPED, str(tmp_path)], cwd=ROOT, env=env,
                              capture_output=True, text=True, timeout=300)
        assert done.returncode == 0, done.stderr[-3000:]
        assert json.loads(done.stdout.splitlines()[-1]) == [1, 2]
        return done.stderr

    run()  # both overloads compiled and saved
    data = sorted((tmp_path / "numba").rglob("*.nbc"))
    assert len(data) == 2, data
    first, second = (path.read_bytes() for path in data)
    data[0].write_bytes(second)
    data[1].write_bytes(first)
    assert "evicted an unreadable Numba cache entry" in run()  # (unswapped, the call failed: TypeError)
    assert "evicted" not in run()  # the recompiled entries serve the next process
