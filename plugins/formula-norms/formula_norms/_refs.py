"""References of this plugin's atoms: ``formula-norms/formula-atom-<name>@<version>``.

The owner is the distribution name, so a reference says where its implementation comes
from, and ``runtime/known_plugins.json`` can tell users what to ``pip install``."""
from __future__ import annotations

OWNER = "formula-norms"


def refs_for(name: str, version: int = 1) -> tuple[str, ...]:
    return (f"{OWNER}/formula-atom-{name}@{version}",)
