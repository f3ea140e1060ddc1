"""Meta-test: every SPEC §6 code a program or an input can trigger is asserted somewhere in
this suite (plugin_conflict belongs to the registry's own tests)."""
from __future__ import annotations

from pathlib import Path

from .builders import SPEC_CODES

HERE = Path(__file__).resolve().parent
NOT_HERE = {"plugin_conflict"}


def test_every_spec_code_is_asserted():
    text = "\n".join(p.read_text() for p in HERE.glob("test_*.py") if p.name != "test_coverage.py")
    missing = sorted(c for c in SPEC_CODES - NOT_HERE if f'"{c}"' not in text)
    assert not missing, f"no test asserts code(s) {missing}"
