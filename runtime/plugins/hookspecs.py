"""The whole plugin surface of formula-runtime.

The registration hooks receive a ``register`` callback owned by the host, so the registry
knows which plugin provided what (for diagnostics and ``plugin_conflict`` messages naming
both sides). The host calls every hook through pluggy, so hook wrappers and tracing see it.
"""
from __future__ import annotations

import pluggy

PROJECT = "formula"
hookspec = pluggy.HookspecMarker(PROJECT)
hookimpl = pluggy.HookimplMarker(PROJECT)

ENTRY_POINT_GROUP = "formula_runtime.plugins"


@hookspec
def formula_register_atoms(register):
    """Call ``register(spec)`` with each :class:`runtime.plugins.atomspec.AtomSpec` the plugin provides."""


@hookspec
def formula_register_backends(register):
    """Call ``register(backend)`` with each :class:`runtime.backends.base.Backend` provided."""


@hookspec
def formula_register_kernels(register):
    """Call ``register(atom_ref, backend, kernel=factory, anchors=False)`` to give an atom a
    kernel on a backend, typically an atom another plugin owns (a ROCm backend's kernels for
    the built-in atoms). ``factory(request) -> Kernel`` (runtime.plugins.kernel) replaces the
    atom's own kernel for that backend; ``anchors=True`` when it takes epilogues."""


@hookspec
def formula_register_vjps(register):
    """Call ``register(atom_ref, rule, differentiable=(0, ...))`` to give an atom (typically
    one another plugin owns) its gradient rule: ``rule(ctx) -> {operand position: slot}``,
    as ``AtomSpec.vjp`` (SPEC §3c); ``differentiable`` lists the operand positions it serves.
    Two rules for one reference are ``plugin_conflict``."""


@hookspec(firstresult=True)
def formula_open_bank_store(location):
    """Return a bank store for ``location`` (a path, a URL…) if the plugin understands it,
    else None; the first store returned wins."""
