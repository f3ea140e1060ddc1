"""A tiered executable's kernels compile in a worker process (runtime.execution.compile_worker),
which fills the disk cache while the caller's first-tier runs keep its GIL; the caller then
loads the plan. Each case is a fresh interpreter on an empty cache of its own (the tests'
conftest turns the worker off for every other test)."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

import runtime
from runtime.plugins.registry import Registry, default_registry

ROOT = Path(__file__).resolve().parents[1]

# a tiered run of a small program, then wait_compiled and a run on the compiled tier: prints
# the tiers, whether the results agree, and how many kernels this process compiled itself
SCRIPT = r"""
import json, os
import numpy as np
import runtime
from runtime.build import ProgramBuilder
from runtime.kernels import compilelog

b = ProgramBuilder()
x = b.input("x", {"T": "T", "D": 32})
y = b.op("scalar-map", [x], {"mode": "silu"})
z = b.op("reduce@2", [y], {"axis": "D", "mode": "sum", "accumulation_dtype": "float32"})
exe = runtime.compile(b.build(outputs=[z]), "cpu", tiered=True)
compilelog.install()
if os.environ.get("SHRINK_LIMIT"):  # (after loading: the worker's load of the program fails)
    os.environ["FORMULA_MAX_PROGRAM_BYTES"] = "10"
x = np.random.default_rng(0).standard_normal((16, 32)).astype(np.float32)
first = exe.run(inputs={"x": x})
assert exe.wait_compiled(timeout=300)
second = exe.run(inputs={"x": x})
print(json.dumps({"tiers": [first.tier, second.tier], "compiled_here": compilelog.total(),
                  "agree": bool(np.allclose(first[z], second[z], rtol=1e-5, atol=1e-5))}))
"""


def _run(tmp_path: Path, **env: str) -> dict:
    full = {k: v for k, v in os.environ.items() if k not in ("NUMBA_CACHE_DIR", "FORMULA_TIERED")}
    full.update(FORMULA_CACHE_DIR=str(tmp_path / "cache"), PYTHONPATH=str(ROOT), **env)
    done = subprocess.run([sys.executable, "-c", SCRIPT], env=full, cwd=ROOT, capture_output=True,
                          text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.splitlines()[-1])


def test_the_worker_compiles_and_the_caller_only_loads(tmp_path):
    got = _run(tmp_path, FORMULA_COMPILE_WORKER="1")
    assert got["tiers"] == ["reference", "cpu"] and got["agree"]
    assert got["compiled_here"] == 0, got  # every kernel came from the worker's cache entries
    assert any((tmp_path / "cache" / "ready").iterdir())  # (the plan is marked ready)


def test_without_the_worker_the_caller_compiles(tmp_path):
    got = _run(tmp_path, FORMULA_COMPILE_WORKER="0")
    assert got["tiers"] == ["reference", "cpu"] and got["agree"]
    assert got["compiled_here"] > 0


def test_a_failed_worker_leaves_the_compile_to_the_caller(tmp_path):
    """The worker cannot load the program (its size limit is 10 bytes): the caller compiles."""
    got = _run(tmp_path, FORMULA_COMPILE_WORKER="1", SHRINK_LIMIT="1")
    assert got["tiers"] == ["reference", "cpu"] and got["agree"]
    assert got["compiled_here"] > 0


def test_only_a_registry_a_new_process_rebuilds_gets_a_worker(monkeypatch):
    from runtime.plugins import registry as registries

    monkeypatch.setattr(registries, "_default", Registry())  # (other tests register plugins in theirs)
    assert default_registry().reproducible
    assert not Registry(builtins=("atoms",)).reproducible  # (other built-ins)
    assert not Registry(autoload=False).reproducible  # (the environment autoloads)

    class Extra:
        pass

    registry = Registry()
    assert registry.reproducible
    registry.register(Extra())
    assert not registry.reproducible  # a plugin registered in code: a worker would lack it
    program = ROOT / "examples" / "seed-lora-silu.program.json"
    assert runtime.compile(program, "cpu", tiered=True)._tiers._worker
    assert not runtime.compile(program, "cpu", registry=registry, tiered=True)._tiers._worker


def test_the_worker_is_not_asked_for_values_over_its_bound(monkeypatch):
    from runtime.execution import compile_worker

    started = []
    monkeypatch.setattr(compile_worker.subprocess, "Popen", lambda *a, **k: started.append(a))
    program = runtime.load_program(ROOT / "examples" / "seed-lora-silu.program.json")
    assert compile_worker.fill_in_worker(program, "cpu", None, {"B": 1, "S": 4}, {}, False,
                                         compile_worker.WORKER_MAX_BYTES + 1, 10) is False
    assert started == []


@pytest.mark.parametrize("dtype", ["bfloat16", "float16", "float64"])
def test_fill_cache_takes_every_float_dtype_and_resident_banks(dtype):
    """What a worker runs, here in-process: random values of each binding's dtype (bfloat16 by
    its name too), the banks resident when the caller's are."""
    from runtime.execution.compile_worker import fill_cache

    exe = runtime.compile(ROOT / "examples" / "seed-lora-silu.program.json", "cpu", tiered=False)
    floating = {b.name: dtype for b in exe.program.bindings if b.value_type.dtype == "floating"}
    fill_cache(exe, {"B": 1, "S": 8}, floating, resident=True)
    assert exe.wait_compiled(timeout=60)
    (key,) = exe._plans.keys()
    assert dict(key.dtypes) == floating and key.resident  # (the plan the caller's runs key)
