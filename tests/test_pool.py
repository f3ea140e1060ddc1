"""The result pool's reuse rule on every CPython the machine has (3.10-3.13 are supported):
a pooled value is reused only when nothing outside the pool refers to it."""
from __future__ import annotations

import glob
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

POOL = Path(__file__).resolve().parents[1] / "runtime" / "execution" / "pool.py"

# Standard library only: runs under any interpreter, loading pool.py by its path.
SCRIPT = r'''
import importlib.util, sys, weakref
spec = importlib.util.spec_from_file_location("pool", sys.argv[1])
pool = importlib.util.module_from_spec(spec); spec.loader.exec_module(pool)
p = pool.ResultPool()
make = lambda: bytearray(8)
a = p.take("y", make)
assert p.take("y", make) is not a, "reused while a name holds it"
a_id = id(a); del a
assert id(p.take("y", make)) == a_id, "not reused once unreferenced"
b = p.take("y", make)
held = [b]; b_id = id(b); del b
assert id(p.take("y", make)) != b_id, "reused while a container holds it"
held.clear()
c = p.take("y", make); view = memoryview(c); c_id = id(c); del c
assert id(p.take("y", make)) != c_id, "reused while a buffer export holds it"
view.release(); del view
class Box:  # weak references need an object that takes them
    pass
q = pool.ResultPool()
d = q.take("y", Box); ref = weakref.ref(d); d_id = id(d); del d
assert id(q.take("y", Box)) != d_id, "reused while a weak reference names it"
print("ok", sys.version_info[:2])
'''


def _interpreters() -> list[str]:
    found = {sys.executable}
    for minor in (10, 11, 12, 13):
        names = [shutil.which(f"python3.{minor}")]
        names += glob.glob(os.path.expanduser(f"~/.pyenv/versions/3.{minor}.*/bin/python3.{minor}"))
        found.update(n for n in names if n and "/shims/" not in n)  # pyenv shims may point nowhere
    return sorted({os.path.realpath(n): n for n in sorted(found, reverse=True)}.values())  # (stable ids for xdist)


@pytest.mark.parametrize("python", _interpreters())
def test_the_pool_reuses_only_unreferenced_values(python):
    run = subprocess.run([python, "-c", SCRIPT, str(POOL)], capture_output=True, text=True, timeout=60)
    assert run.returncode == 0, run.stderr
    assert run.stdout.startswith("ok")
