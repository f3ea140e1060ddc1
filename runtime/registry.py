"""The plugin registry: atoms by reference, backends by name, bank store openers.

Built-in atoms (``atoms``), built-in backends (``runtime.backends``) and third-party plugins
from the ``formula_runtime.plugins`` entry-point group are registered the same way. A plugin
that fails to import or declares a malformed spec is recorded as a problem and skipped; two
plugins claiming one reference is ``plugin_conflict`` naming both.
"""
from __future__ import annotations

import difflib
import importlib.metadata
import json
import os
import threading
from collections.abc import Iterable
from pathlib import Path

import attrs
import pluggy

from . import hookspecs
from .atomspec import AtomSpec
from .errors import FormulaError, fail
from .refs import is_ref

BUILTIN_PLUGINS = ("atoms", "runtime.backends", "runtime.banks")
DISABLE_AUTOLOAD_ENV = "FORMULA_DISABLE_PLUGIN_AUTOLOAD"


@attrs.frozen
class PluginInfo:
    name: str
    distribution: str | None = None
    version: str | None = None

    def describe(self) -> str:
        if self.distribution:
            version = f" {self.version}" if self.version else ""
            return f"{self.name} ({self.distribution}{version})"
        return self.name


@attrs.frozen
class PluginProblem:
    plugin: str
    error: str


class Registry:
    def __init__(self, autoload: bool | None = None, builtins: Iterable[str] = BUILTIN_PLUGINS):
        self.pm = pluggy.PluginManager(hookspecs.PROJECT)
        self.pm.add_hookspecs(hookspecs)
        self.atoms: dict[str, AtomSpec] = {}
        self.atom_owner: dict[str, PluginInfo] = {}
        self.backends: dict[str, object] = {}
        self.bank_openers: list[tuple[PluginInfo, object]] = []
        self.plugins: dict[str, PluginInfo] = {}
        self.problems: list[PluginProblem] = []
        for module_name in builtins:
            module = importlib.import_module(module_name)
            self.register(module, PluginInfo(module_name, "formula-runtime", _own_version()))
        if autoload is None:
            autoload = not os.environ.get(DISABLE_AUTOLOAD_ENV)
        if autoload:
            self._load_entry_points()

    # --- registration -------------------------------------------------------------------
    def register(self, plugin: object, info: PluginInfo | None = None) -> PluginInfo:
        """Register a plugin object (module or instance with hookimpls) and collect its atoms."""
        info = info or PluginInfo(getattr(plugin, "__name__", type(plugin).__name__))
        if info.name in self.plugins:
            fail("plugin_conflict", f"plugins.{info.name}",
                 f"plugin name {info.name!r} is registered twice")
        try:
            self.pm.register(plugin, name=info.name)
        except ValueError as exc:  # pluggy: the same object under another name
            raise FormulaError("plugin_conflict", f"plugins.{info.name}",
                               f"plugin {info.describe()} is already registered: {exc}") from exc
        try:
            self.pm.check_pending()
            atoms: list[AtomSpec] = []
            backends: list[object] = []
            openers: list[object] = []
            for impl_name, sink in (("formula_register_atoms", atoms),
                                    ("formula_register_backends", backends),
                                    ("formula_register_bank_stores", openers)):
                for impl in getattr(self.pm.hook, impl_name).get_hookimpls():
                    if impl.plugin is plugin:
                        impl.function(register=sink.append)
            for spec in atoms:
                _check_spec(spec, info)
            self._claim_atoms(atoms, info)
        except FormulaError:
            self.pm.unregister(plugin)
            raise
        except Exception as exc:  # a broken plugin must not take the runtime down
            self.pm.unregister(plugin)
            raise FormulaError("plugin_error", f"plugins.{info.name}",
                               f"plugin {info.describe()} failed to register: "
                               f"{type(exc).__name__}: {exc}") from exc
        for backend in backends:
            self.backends[backend.name] = backend
        self.bank_openers.extend((info, o) for o in openers)
        self.plugins[info.name] = info
        return info

    def unregister(self, name: str) -> None:
        """Remove a plugin and everything it registered (used by the test fixture)."""
        info = self.plugins.pop(name)
        plugin = self.pm.get_plugin(name)
        if plugin is not None:
            self.pm.unregister(plugin)
        for ref in [r for r, owner in self.atom_owner.items() if owner == info]:
            del self.atoms[ref], self.atom_owner[ref]
        self.bank_openers = [(i, o) for i, o in self.bank_openers if i != info]

    def _claim_atoms(self, atoms: list[AtomSpec], info: PluginInfo) -> None:
        seen: dict[str, AtomSpec] = {}
        for spec in atoms:
            for ref in spec.refs:
                owner = self.atom_owner.get(ref)
                if owner is not None or ref in seen:
                    other = owner.describe() if owner else info.describe()
                    fail("plugin_conflict", f"plugins.{info.name}",
                         f"atom reference {ref} is registered by {other} and by {info.describe()}")
                seen[ref] = spec
        for ref, spec in seen.items():
            self.atoms[ref] = spec
            self.atom_owner[ref] = info

    def _load_entry_points(self) -> None:
        for ep in importlib.metadata.entry_points(group=hookspecs.ENTRY_POINT_GROUP):
            dist = getattr(ep, "dist", None)
            info = PluginInfo(ep.name, dist.name if dist else None, dist.version if dist else None)
            if info.name in self.plugins:
                continue
            try:
                plugin = ep.load()
            except Exception as exc:
                self.problems.append(PluginProblem(info.describe(),
                                                   f"import failed: {type(exc).__name__}: {exc}"))
                continue
            try:
                self.register(plugin, info)
            except FormulaError as exc:
                if exc.code == "plugin_conflict":
                    raise
                self.problems.append(PluginProblem(info.describe(), exc.message))

    # --- lookup -------------------------------------------------------------------------
    def atom(self, ref: str, path: str) -> AtomSpec:
        spec = self.atoms.get(ref)
        if spec is not None:
            return spec
        family = ref.split("@", 1)[0]
        same_family = sorted(r for r in self.atoms if r.split("@", 1)[0] == family)
        close = same_family or difflib.get_close_matches(ref, list(self.atoms), n=3, cutoff=0.6)
        hint = f"; registered references close to it: {', '.join(close)}" if close else ""
        hint += self._plugin_hint(family)
        fail("unknown_atom", path, f"no plugin registers atom {ref}{hint}")

    def _plugin_hint(self, family: str) -> str:
        hint = ""
        known = _known_plugin_families().get(family)
        if known:
            hint += f" (it is provided by the {known} plugin: pip install {known})"
        if self.problems:
            hint += f" (plugins that failed to load: {', '.join(p.plugin for p in self.problems)})"
        return hint

    def backend(self, name: str, path: str = "$.backend"):
        backend = self.backends.get(name)
        if backend is None:
            fail("backend_unavailable", path,
                 f"unknown backend {name!r}; registered: {', '.join(sorted(self.backends))}")
        reason = backend.unavailable_reason()
        if reason:
            fail("backend_unavailable", path, f"backend {name!r} cannot run here: {reason}")
        return backend


def _known_plugin_families() -> dict[str, str]:
    """Atom families (ref before '@') that installable plugins provide, for unknown_atom hints.

    Data, not code: ``runtime/known_plugins.json`` maps a family to a pip distribution."""
    path = Path(__file__).with_name("known_plugins.json")
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return {}
    return {k: v for k, v in data.items() if isinstance(k, str) and isinstance(v, str)}


def _check_spec(spec: object, info: PluginInfo) -> None:
    where = f"plugin {info.describe()}"
    if not isinstance(spec, AtomSpec):
        raise TypeError(f"{where} registered {spec!r}, which is not an AtomSpec")
    if not spec.refs or not all(is_ref(r) for r in spec.refs):
        raise ValueError(f"{where}: atom {spec.name!r} has malformed references {spec.refs!r}")
    if not callable(spec.infer):
        raise TypeError(f"{where}: atom {spec.name!r} has no callable infer")
    if spec.inplace is not None and not 0 <= spec.inplace < len(spec.inputs):
        raise ValueError(f"{where}: atom {spec.name!r} declares inplace operand {spec.inplace}")


def _own_version() -> str:
    try:
        return importlib.metadata.version("formula-runtime")
    except importlib.metadata.PackageNotFoundError:
        return "0+unknown"


_default: Registry | None = None
_default_lock = threading.Lock()


def default_registry() -> Registry:
    global _default
    with _default_lock:
        if _default is None:
            _default = Registry()
        return _default
