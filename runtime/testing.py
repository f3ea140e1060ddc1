"""Test helpers for formula-runtime and its plugins, shipped as the ``formula_runtime``
pytest plugin (entry point ``pytest11``): fixtures that register a plugin for one test, and
a backend-equivalence assertion against the ``reference`` oracle."""
from __future__ import annotations

import pytest

from . import registry as _registry


@pytest.fixture
def formula_registry():
    """The process-wide registry (built-ins and installed plugins)."""
    return _registry.default_registry()


@pytest.fixture
def register_plugin(formula_registry):
    """``register_plugin(obj, name=...)`` registers a plugin object for this test only."""
    added: list[str] = []

    def register(plugin, name: str | None = None, distribution: str | None = None):
        info = _registry.PluginInfo(name or getattr(plugin, "__name__", type(plugin).__name__),
                                    distribution, None)
        formula_registry.register(plugin, info)
        added.append(info.name)
        return info

    try:
        yield register
    finally:
        for name in reversed(added):
            formula_registry.unregister(name)
