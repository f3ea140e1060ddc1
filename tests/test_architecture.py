"""The tree's promises, checked statically: runtime modules import each other one way (no
cycle, function-level imports included), the core imports no concrete backend, the layers of
docs/architecture.md hold, atom plugins (atoms/ and plugins/) import only the public API and the
kernel toolkit, and no patch file sits in the tree."""
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


# --- what an atom plugin may import (docs/writing-plugins.md) ----------------------------------

# The public API and the kernel toolkit: the package's own names (``import runtime``), and a
# module here or under a package here; of each, the names without a leading underscore.
PUBLIC = ("runtime.core", "runtime.plugins.atomspec", "runtime.plugins.kernel", "runtime.plugins.hookspecs",
          "runtime.build", "runtime.testing", "runtime.toolkit")
# Modules of atoms/ allowed more, each for its reason (none today).
PRIVATE_USES: dict[str, set[str]] = {}


def _plugin_sources() -> list[Path]:
    """The built-in atoms and every plugin's sources and tests under plugins/ (not their
    build output)."""
    skip = {"build", "dist", ".venv", "__pycache__"}
    files = list((ROOT / "atoms").rglob("*.py")) + list((ROOT / "plugins").rglob("*.py"))
    return sorted(f for f in files if not skip.intersection(f.relative_to(ROOT).parts))


def _runtime_imports(path: Path) -> list[tuple[int, str, str | None]]:
    """(line, module, name) of every runtime import in ``path``, function-level ones included:
    ``from runtime.x import y`` gives ``("runtime.x.y", ...)`` when ``runtime.x.y`` is a
    module, else ``("runtime.x", "y")``."""
    found = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found += [(node.lineno, a.name, None) for a in node.names if a.name.split(".")[0] == "runtime"]
        elif isinstance(node, ast.ImportFrom) and not node.level and (node.module or "").split(".")[0] == "runtime":
            for a in node.names:
                sub = f"{node.module}.{a.name}"
                is_module = (ROOT / Path(*sub.split("."))).with_suffix(".py").is_file() or \
                    (ROOT / Path(*sub.split(".")) / "__init__.py").is_file()
                found.append((node.lineno, sub, None) if is_module else (node.lineno, node.module, a.name))
    return sorted(found)


def _allowed(module: str, name: str | None) -> bool:
    public = module == "runtime" or any(module == p or module.startswith(p + ".") for p in PUBLIC)
    return public and not (name or "").startswith("_") and not module.split(".")[-1].startswith("_")


def _plugin_offences(paths) -> list[str]:
    offences = []
    for path in paths:
        rel = path.relative_to(ROOT).as_posix() if path.is_relative_to(ROOT) else str(path)
        for line, module, name in _runtime_imports(path):
            if not _allowed(module, name) and module not in PRIVATE_USES.get(rel, set()):
                offences.append(f"{rel}:{line} imports {module}{'.' + name if name else ''}")
    return offences


def test_atom_plugins_import_only_the_public_api_and_the_toolkit():
    """atoms/ and plugins/ are plugins like any third party's: what they need of the runtime
    is the public API or the kernel toolkit (runtime.toolkit), so a plugin author can see
    what they may use."""
    offences = _plugin_offences(_plugin_sources())
    assert not offences, "atom plugins reaching into the runtime's internals (use runtime.toolkit):\n" + \
        "\n".join(offences)


def test_the_plugin_import_rule_catches_internals(tmp_path):
    """The check fails on a private import, function-level ones and ``from runtime.x import
    module`` included, and passes the public ones."""
    bad = tmp_path / "bad.py"
    bad.write_text("from runtime.execution.bindings import value_is_finite\n"
                   "def f():\n    from runtime.backends import cpu_codegen\n"
                   "from runtime.plugins.atomspec import _json_kind\n"
                   "import runtime.kernels.twins\n")
    good = tmp_path / "good.py"
    good.write_text("import runtime\nfrom runtime.core.types import TensorType\n"
                    "from runtime.plugins import kernel\nfrom runtime.toolkit import Twins, no_kernel\n"
                    "from runtime.toolkit import cpu as cg\nfrom runtime.testing import run_kernel\n")
    found = [o.split(" imports ")[1] for o in _plugin_offences([bad])]
    assert found == ["runtime.execution.bindings.value_is_finite", "runtime.backends.cpu_codegen",
                     "runtime.plugins.atomspec._json_kind", "runtime.kernels.twins"]
    assert _plugin_offences([good]) == []
