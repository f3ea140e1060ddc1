"""The tree's promises, checked statically: runtime modules import each other one way (no
cycle, function-level imports included), the core imports no concrete backend, the layers of
docs/architecture.md hold, and no patch file sits in the tree."""
from __future__ import annotations

import ast
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "runtime"


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _imports() -> dict[str, set[str]]:
    """module -> the runtime modules it imports anywhere in its body (``from . import x``
    counted as ``pkg.x`` when that is a module)."""
    modules = {_module_name(p): p for p in PACKAGE.rglob("*.py")}
    graph: dict[str, set[str]] = {}
    for name, path in modules.items():
        is_pkg = path.name == "__init__.py"
        package = name if is_pkg else name.rpartition(".")[0]
        targets: set[str] = set()
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Import):
                targets.update(a.name for a in node.names)
            elif isinstance(node, ast.ImportFrom):
                if node.level:
                    base = package.split(".")
                    base = base[:len(base) - node.level + 1]
                    stem = ".".join(base + ([node.module] if node.module else []))
                else:
                    stem = node.module or ""
                targets.add(stem)
                targets.update(f"{stem}.{a.name}" for a in node.names)
        graph[name] = {t for t in targets if t in modules and t != name}
    return graph


def _cycle(graph: dict[str, set[str]]) -> list[str] | None:
    state: dict[str, int] = {}
    stack: list[str] = []

    def visit(n: str) -> list[str] | None:
        state[n] = 1
        stack.append(n)
        for m in sorted(graph[n]):
            if m == "runtime" or n == "runtime":  # the package's lazy public names
                continue
            if state.get(m) == 1:
                return stack[stack.index(m):] + [m]
            if m not in state and (found := visit(m)):
                return found
        stack.pop()
        state[n] = 2
        return None

    for n in sorted(graph):
        if n not in state and (found := visit(n)):
            return found
    return None


def test_runtime_modules_have_no_import_cycle():
    cycle = _cycle(_imports())
    assert cycle is None, "import cycle: " + " -> ".join(cycle)


CONCRETE_BACKENDS = {"runtime.backends.cpu", "runtime.backends.cuda", "runtime.backends.reference",
                     "runtime.backends.cpu_codegen", "runtime.backends.cuda_codegen"}


def test_the_core_imports_no_concrete_backend():
    """The core asks a backend object; only the backends package (which registers them
    through the hook) names the concrete ones, and the kernel toolkit, which hands their
    code generators to atom plugins."""
    offenders = {m: sorted(t & CONCRETE_BACKENDS) for m, t in _imports().items()
                 if t & CONCRETE_BACKENDS and not m.startswith(("runtime.backends", "runtime.toolkit"))}
    assert not offenders, f"core modules importing concrete backends: {offenders}"


def test_no_patch_files_in_the_tree():
    try:
        tracked = subprocess.run(["git", "ls-files"], cwd=ROOT, capture_output=True, text=True,
                                 check=True).stdout.split()
    except (OSError, subprocess.CalledProcessError):
        pytest.skip("not a git checkout")
    assert not [f for f in tracked if f.endswith((".patch", ".diff"))]


# Lowest first: a module may import its own layer and the layers below it, never one above
# (docs/architecture.md draws them). The package itself and its top modules (api, cli,
# testing, build) sit above every layer.
LAYERS = ("core", "plugins", "program", "autodiff", "kernels", "plan", "backends", "execution")


def _layer(module: str) -> int:
    parts = module.split(".")
    if len(parts) >= 2 and parts[1] in LAYERS:
        return LAYERS.index(parts[1])
    return len(LAYERS)


def test_layers_import_one_way():
    upward = sorted(f"{m} -> {t}" for m, targets in _imports().items() for t in targets
                    if _layer(t) > _layer(m))
    assert not upward, "imports from a lower layer into a higher one: " + ", ".join(upward)


def test_every_runtime_module_sits_in_a_layer_or_is_a_top_module():
    top = {"runtime", "runtime.api", "runtime.cli", "runtime.testing", "runtime.build", "runtime.dask",
           "runtime.torch", "runtime.toolkit", "runtime.toolkit.cpu", "runtime.toolkit.cuda"}
    stray = sorted(m for m in _imports() if _layer(m) == len(LAYERS) and m not in top)
    assert not stray, f"modules outside the layers: {stray}"


def test_every_package_is_in_the_wheel():
    """setuptools lists packages one by one: a new package missing there installs from a
    checkout (editable) but not from a wheel."""
    tomllib = pytest.importorskip("tomllib", reason="Python 3.11+ reads TOML")
    listed = set(tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["packages"])
    found = {".".join(p.parent.relative_to(ROOT).parts) for top in ("runtime", "atoms")
             for p in (ROOT / top).rglob("__init__.py")}
    assert found - listed == set(), f"packages missing from pyproject.toml: {sorted(found - listed)}"
