"""The whole plugin surface of formula-runtime.

Each hook receives a ``register`` callback owned by the host, so the registry knows which
plugin provided what (for diagnostics and ``plugin_conflict`` messages naming both sides).
"""
from __future__ import annotations

import pluggy

PROJECT = "formula"
hookspec = pluggy.HookspecMarker(PROJECT)
hookimpl = pluggy.HookimplMarker(PROJECT)

ENTRY_POINT_GROUP = "formula_runtime.plugins"


@hookspec
def formula_register_atoms(register):
    """Call ``register(spec)`` with each :class:`runtime.atomspec.AtomSpec` the plugin provides."""


@hookspec
def formula_register_backends(register):
    """Call ``register(backend)`` with each :class:`runtime.backends.base.Backend` provided."""


@hookspec
def formula_register_bank_stores(register):
    """Call ``register(opener)``: ``opener(location)`` returns a bank store for a location
    (a path, a URL…) it understands, or None to let the next opener try."""
