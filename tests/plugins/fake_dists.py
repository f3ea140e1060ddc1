"""Fake installed distributions for plugin-loading tests: a ``*.dist-info`` folder with an
``entry_points.txt`` in the ``formula_runtime.plugins`` group, and the module it names, on a
folder that the test puts on ``sys.path`` (so ``importlib.metadata`` finds it like a pip
install)."""
from __future__ import annotations

import sys
import textwrap
import uuid
from pathlib import Path

from runtime.plugins.hookspecs import ENTRY_POINT_GROUP

GOOD_PLUGIN = '''
from runtime.plugins.atomspec import AtomSpec
from runtime.plugins.hookspecs import hookimpl

def _infer(ctx):
    t = ctx.operands[0]
    return ctx.output(t.axes, t.sizes)

def _reference(node):
    def run(inputs, out):
        out[...] = 2 * inputs[0]
    return run

@hookimpl
def formula_register_atoms(register):
    register(AtomSpec(name="double", refs=("{owner}/formula-atom-double@1",), inputs=("value",),
                      attributes=frozenset(), infer=_infer, kernels={{"reference": _reference}}))
'''


def fake_dist(root: Path, dist: str, module_source: str, version: str = "1.0") -> str:
    """Write a distribution whose entry point is a fresh module; returns the entry-point name
    (= module name, unique per call so no test sees another's cached import)."""
    module = f"{dist.replace('-', '_')}_{uuid.uuid4().hex[:8]}"
    info = root / f"{dist.replace('-', '_')}-{version}.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {dist}\nVersion: {version}\n")
    (info / "entry_points.txt").write_text(f"[{ENTRY_POINT_GROUP}]\n{module} = {module}\n")
    (root / f"{module}.py").write_text(textwrap.dedent(module_source))
    return module


def forget_modules(prefixes: tuple[str, ...]) -> None:
    for name in [m for m in sys.modules if m.startswith(prefixes)]:
        del sys.modules[name]
