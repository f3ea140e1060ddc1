"""The plugin registry: atoms by reference, backends by name, kernels per (atom, backend).

Built-in atoms (``atoms``), built-in backends (``runtime.backends``) and third-party plugins
from the ``formula_runtime.plugins`` entry-point group are registered the same way. A plugin
that fails to import or declares a malformed spec is recorded as a problem and skipped; two
plugins claiming one reference is ``plugin_conflict`` naming both.
"""
from __future__ import annotations

import difflib
import importlib.metadata
import json
import threading
from collections.abc import Iterable
from pathlib import Path

import attrs
import pluggy

from runtime.plugins import failures, hookspecs
from runtime.plugins.atomspec import AtomSpec, inplace_operands
from runtime.plugins.expressions import probe
from runtime.core import settings
from runtime.core.errors import FormulaError, did_you_mean, fail
from runtime.core.refs import is_ref
from runtime.core.types import DTYPE_CLASSES, dtype_class_members

BUILTIN_PLUGINS = ("atoms", "runtime.backends", "runtime.execution.banks")
DISABLE_AUTOLOAD_ENV = settings.DISABLE_PLUGIN_AUTOLOAD.name


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
        # (atom ref, backend) -> kernels a plugin registered for an atom it may not own
        self.kernels: dict[tuple[str, str], KernelEntry] = {}
        self._merged: dict[str, AtomSpec] = {}  # ref -> its spec with registered kernels in
        # atom ref -> a gradient rule a plugin registered for it (formula_register_vjps)
        self.vjps: dict[str, VjpEntry] = {}
        self.plugins: dict[str, PluginInfo] = {}
        self.problems: list[PluginProblem] = []
        # plugin name -> what is wrong with a plugin that loaded (a refused ScalarOp expression)
        self.atom_problems: dict[str, list[str]] = {}
        builtins = tuple(builtins)
        for module_name in builtins:
            module = importlib.import_module(module_name)
            self.register(module, PluginInfo(module_name, "formula-runtime", _own_version()))
        if autoload is None:
            autoload = not settings.DISABLE_PLUGIN_AUTOLOAD.read()
        if autoload:
            self._load_entry_points()
        # a new process rebuilds this registry from the environment (the built-ins and the
        # entry points, nothing registered or removed since): a compile worker can serve it
        self.reproducible = builtins == tuple(BUILTIN_PLUGINS) and autoload == (not settings.DISABLE_PLUGIN_AUTOLOAD.read())

    # --- registration -------------------------------------------------------------------
    def register(self, plugin: object, info: PluginInfo | None = None) -> PluginInfo:
        """Register a plugin object (module or instance with hookimpls) and collect its atoms."""
        info = info or PluginInfo(getattr(plugin, "__name__", type(plugin).__name__))
        self.reproducible = False  # (until __init__ ends: what it registers is reproducible)
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
            kernels: list[KernelEntry] = []
            vjps: list[VjpEntry] = []
            self._own_hook(plugin, "formula_register_atoms")(register=atoms.append)
            self._own_hook(plugin, "formula_register_backends")(register=backends.append)
            self._own_hook(plugin, "formula_register_kernels")(
                register=lambda atom_ref, backend, kernel=None, anchors=False: kernels.append(
                    _kernel_entry(atom_ref, backend, kernel, anchors, info)))
            self._own_hook(plugin, "formula_register_vjps")(
                register=lambda atom_ref, rule=None, differentiable=(0,): vjps.append(
                    _vjp_entry(atom_ref, rule, differentiable, info)))
            for spec in atoms:
                _check_spec(spec, info)
            self._claim_atoms(atoms, info)
            self._claim_kernels(kernels, info)
            self._claim_vjps(vjps, atoms, info)
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
        for entry in kernels:
            self.kernels[entry.atom_ref, entry.backend] = entry
        for entry in vjps:
            self.vjps[entry.atom_ref] = entry
        self._merged.clear()
        self.plugins[info.name] = info
        problems = [f"atom {spec.ref}: {why}" for spec in atoms if (why := probe(spec))]
        if problems:  # (its atoms stay usable on reference; a plan on a fusing backend raises)
            self.atom_problems[info.name] = problems
        return info

    def _own_hook(self, plugin: object, name: str):
        """The hook ``name`` called through pluggy on ``plugin``'s implementation alone, so
        what ``register`` receives is attributed to it."""
        others = [p for p in self.pm.get_plugins() if p is not plugin]
        return self.pm.subset_hook_caller(name, remove_plugins=others)

    def raising_plugin(self, hook, exc: BaseException) -> str:
        """Which plugin's implementation of ``hook`` raised ``exc`` (from its traceback)."""
        codes = {impl.function.__code__: impl.plugin_name for impl in hook.get_hookimpls()
                 if hasattr(impl.function, "__code__")}
        tb, name = exc.__traceback__, None
        while tb is not None:  # the innermost hook implementation on the stack
            name = codes.get(tb.tb_frame.f_code, name)
            tb = tb.tb_next
        info = self.plugins.get(name) if name else None
        return info.describe() if info else (name or "?")

    def unregister(self, name: str) -> None:
        """Remove a plugin and everything it registered (used by the test fixture)."""
        info = self.plugins.pop(name)
        self.reproducible = False
        self.atom_problems.pop(name, None)
        plugin = self.pm.get_plugin(name)
        if plugin is not None:
            self.pm.unregister(plugin)
        for ref in [r for r, owner in self.atom_owner.items() if owner == info]:
            del self.atoms[ref], self.atom_owner[ref]
        self.kernels = {key: e for key, e in self.kernels.items() if e.owner != info}
        self.vjps = {ref: e for ref, e in self.vjps.items() if e.owner != info}
        self._merged.clear()

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
            failures.own(spec, info.describe())

    def _claim_kernels(self, kernels: list[KernelEntry], info: PluginInfo) -> None:
        seen: set[tuple[str, str]] = set()
        for entry in kernels:
            key = (entry.atom_ref, entry.backend)
            owner = self.kernels.get(key)
            if owner is not None or key in seen:
                other = owner.owner.describe() if owner else info.describe()
                fail("plugin_conflict", f"plugins.{info.name}",
                     f"kernels for atom {entry.atom_ref} on backend {entry.backend!r} are "
                     f"registered by {other} and by {info.describe()}")
            seen.add(key)

    def _claim_vjps(self, vjps: list["VjpEntry"], atoms: list[AtomSpec], info: PluginInfo) -> None:
        """One gradient rule per atom: a hook's rule for a ref that already has one (another
        hook's, or the atom's own ``AtomSpec.vjp``) is ``plugin_conflict`` naming both."""
        own = {ref: spec for spec in atoms for ref in spec.refs}
        seen: set[str] = set()
        for entry in vjps:
            spec = own.get(entry.atom_ref) or self.atoms.get(entry.atom_ref)
            for ref in spec.refs if spec is not None else (entry.atom_ref,):
                if ref in seen:
                    other = info.describe()
                elif ref in self.vjps:
                    other = self.vjps[ref].owner.describe()
                elif spec is not None and spec.vjp is not None:
                    other = (info if ref in own else self.atom_owner[ref]).describe()
                else:
                    other = None
                if other:
                    fail("plugin_conflict", f"plugins.{info.name}",
                         f"gradient rules for atom {ref} are registered by {other} and by {info.describe()}")
                seen.add(ref)
        for spec in atoms:  # an atom arriving with its own rule after another plugin gave one
            for ref in spec.refs:
                if spec.vjp is not None and ref in self.vjps:
                    fail("plugin_conflict", f"plugins.{info.name}",
                         f"gradient rules for atom {ref} are registered by "
                         f"{self.vjps[ref].owner.describe()} and by {info.describe()}")

    def vjp_rule(self, spec: AtomSpec) -> tuple[object, tuple[int, ...], PluginInfo | None] | None:
        """The gradient rule of ``spec``: (rule, differentiable operands, the plugin that gave
        it), a hook's before the atom's own; None when it has none."""
        for ref in spec.refs:
            entry = self.vjps.get(ref)
            if entry is not None:
                return entry.rule, entry.differentiable, entry.owner
        if spec.vjp is not None:
            return spec.vjp, tuple(spec.differentiable), self.atom_owner.get(spec.ref)
        return None

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
        """The atom registered under ``ref``, with the kernels plugins registered for it
        (``formula_register_kernels``) in place of its own for those backends."""
        merged = self._merged.get(ref)
        if merged is not None:
            return merged
        spec = self.atoms.get(ref)
        if spec is not None:
            merged = self._merged[ref] = self._with_kernels(spec)
            return merged
        family = ref.split("@", 1)[0]
        if family.rpartition("/")[2].removeprefix("formula-atom-").startswith("neural-plasticity"):
            fail("unknown_atom", path, f"{ref} is an effect atom (neural-plasticity*): effect atoms update "
                                       f"state outside the program's outputs and are not executed by "
                                       f"this runtime (SPEC §3b.3 item 5; arti refuses them too)")
        same_family = sorted(r for r in self.atoms if r.split("@", 1)[0] == family)
        close = same_family or difflib.get_close_matches(ref, list(self.atoms), n=3, cutoff=0.6)
        hint = f"; registered references close to it: {', '.join(close)}" if close else ""
        hint += self._plugin_hint(family)
        fail("unknown_atom", path, f"no plugin registers atom {ref}{hint}")

    def _with_kernels(self, spec: AtomSpec) -> AtomSpec:
        entries = [e for (ref, _), e in self.kernels.items() if ref in spec.refs]
        if not entries:
            return spec
        kernels, anchors = dict(spec.kernels), set(spec.anchors)
        for e in entries:  # each replaces the atom's kernel on its backend, epilogues included
            kernels[e.backend] = e.kernel
            (anchors.add if e.anchors else anchors.discard)(e.backend)
        merged = attrs.evolve(spec, kernels=kernels, anchors=frozenset(anchors))
        failures.own(merged, failures.owner_of(spec) or "?", {e.backend: e.owner.describe() for e in entries})
        return merged

    def kernel_owner(self, spec: AtomSpec, backend: str) -> PluginInfo | None:
        """The plugin that registered ``spec``'s kernels for ``backend`` through
        ``formula_register_kernels``, or None when they are the atom's own."""
        for ref in spec.refs:
            entry = self.kernels.get((ref, backend))
            if entry is not None:
                return entry.owner
        return None

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
                 f"unknown backend {name!r}{did_you_mean(str(name), self.backends)}; "
                 f"registered: {', '.join(sorted(self.backends))}")
        reason = backend.unavailable_reason()
        if reason:
            fail("backend_unavailable", path, f"backend {name!r} cannot run here: {reason}")
        return backend


@attrs.frozen
class KernelEntry:
    """Kernels a plugin registered for one (atom reference, backend) pair."""

    atom_ref: str
    backend: str
    kernel: object  # factory(request) -> Kernel, as AtomSpec.kernels
    anchors: bool  # the kernel takes epilogues (AtomSpec.anchors)
    owner: PluginInfo


def _kernel_entry(atom_ref, backend, kernel, anchors, info: PluginInfo) -> KernelEntry:
    where = f"plugin {info.describe()}"
    if not isinstance(atom_ref, str) or not is_ref(atom_ref):
        raise ValueError(f"{where} registered kernels for a malformed atom reference {atom_ref!r}")
    if not isinstance(backend, str) or not backend:
        raise ValueError(f"{where} registered kernels for atom {atom_ref} on backend {backend!r}, "
                         "which is not a backend name")
    if kernel is None:
        raise ValueError(f"{where} registered no kernel for atom {atom_ref} on {backend!r}")
    if not callable(kernel):
        raise TypeError(f"{where}: the kernel for atom {atom_ref} on {backend!r} is not callable")
    if not isinstance(anchors, bool):
        raise TypeError(f"{where}: anchors= for atom {atom_ref} on {backend!r} must be True or False")
    return KernelEntry(atom_ref, backend, kernel, anchors, info)


@attrs.frozen
class VjpEntry:
    """A gradient rule a plugin registered for one atom reference (formula_register_vjps)."""

    atom_ref: str
    rule: object  # rule(ctx) -> {operand position: slot}, as AtomSpec.vjp
    differentiable: tuple[int, ...]
    owner: PluginInfo


def _vjp_entry(atom_ref, rule, differentiable, info: PluginInfo) -> VjpEntry:
    where = f"plugin {info.describe()}"
    if not isinstance(atom_ref, str) or not is_ref(atom_ref):
        raise ValueError(f"{where} registered a gradient rule for a malformed atom reference {atom_ref!r}")
    if not callable(rule):
        raise TypeError(f"{where}: the gradient rule for atom {atom_ref} is not callable")
    positions = tuple(differentiable) if isinstance(differentiable, (tuple, list)) else None
    if not positions or not all(isinstance(i, int) and not isinstance(i, bool) and i >= 0
                                for i in positions):
        raise ValueError(f"{where}: differentiable= for atom {atom_ref} must be a non-empty list "
                         f"of operand positions, got {differentiable!r}")
    return VjpEntry(atom_ref, rule, positions, info)


def _known_plugin_families() -> dict[str, str]:
    """Atom families (ref before '@') that installable plugins provide, for unknown_atom hints.

    Data, not code: ``runtime/plugins/known_plugins.json`` maps a family to a pip distribution."""
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
    inplace = inplace_operands(spec) if spec.inplace is None or isinstance(spec.inplace, (int, tuple)) \
        else (spec.inplace,)  # (anything else is refused below)
    if not all(isinstance(k, int) and not isinstance(k, bool) and 0 <= k < len(spec.inputs) for k in inplace) \
            or (isinstance(spec.inplace, tuple) and not inplace):
        raise ValueError(f"{where}: atom {spec.name!r} declares inplace operand {spec.inplace!r}; "
                         f"expected an operand position (0 to {len(spec.inputs) - 1}) or a tuple of them")
    if not isinstance(spec.view, bool) or (spec.view and len(spec.inputs) != 1):
        raise ValueError(f"{where}: atom {spec.name!r} declares view={spec.view!r}; a view atom has "
                         f"exactly one operand (it has {len(spec.inputs)})")
    if spec.vjp is not None and not callable(spec.vjp):
        raise TypeError(f"{where}: atom {spec.name!r} has a gradient rule that is not callable")
    if not all(isinstance(i, int) and 0 <= i < len(spec.inputs) for i in spec.differentiable):
        raise ValueError(f"{where}: atom {spec.name!r} declares differentiable operands "
                         f"{spec.differentiable!r}; it has {len(spec.inputs)} inputs")
    for operand, expr in spec.dtypes.items():
        if operand not in spec.inputs:
            raise ValueError(f"{where}: atom {spec.name!r} declares dtypes of {operand!r}, "
                             f"which is not one of its inputs {list(spec.inputs)}")
        try:
            dtype_class_members(expr)
        except (KeyError, AttributeError):
            raise ValueError(f"{where}: atom {spec.name!r} declares {operand!r} as {expr!r}; "
                             f"expected one of {sorted(DTYPE_CLASSES)} or two joined by '|'") from None


def _own_version() -> str:
    try:
        return importlib.metadata.version("formula-runtime")
    except importlib.metadata.PackageNotFoundError:
        return "0+unknown"


_default: Registry | None = None
_default_lock = threading.Lock()


def is_default_registry(registry: Registry) -> bool:
    """Whether ``registry`` is the process's default one (without making the default)."""
    return registry is _default


def default_registry() -> Registry:
    global _default
    with _default_lock:
        if _default is None:
            _default = Registry()
        return _default
