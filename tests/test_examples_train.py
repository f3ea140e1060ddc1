"""The training examples (examples/fit_lora.py, examples/fit_transformer.py) run as the README
shows them, with fewer steps, and their loss falls (skips without torch)."""
from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

import runtime

REPO = Path(__file__).resolve().parent.parent
EXAMPLES = REPO / "examples"


def _losses(script: str, *args: str) -> list[float]:
    proc = subprocess.run([sys.executable, str(EXAMPLES / script), *args], cwd=REPO, capture_output=True,
                          text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    losses = [float(m) for m in re.findall(r"^step +\d+ +loss ([0-9.]+)", proc.stdout, re.M)]
    assert len(losses) >= 3, proc.stdout
    return losses


@pytest.mark.slow  # (CI runs the slow set after the suite: README)
def test_fit_lora_loss_falls():
    pytest.importorskip("torch", reason="runtime.torch needs PyTorch (pip install torch==2.13.0+cpu)")
    losses = _losses("fit_lora.py", "--steps", "30", "--every", "10")
    assert losses[-1] < 0.3 * losses[0], losses


@pytest.mark.slow  # (CI runs the slow set after the suite: README)
def test_fit_transformer_loss_falls():
    pytest.importorskip("torch", reason="runtime.torch needs PyTorch (pip install torch==2.13.0+cpu)")
    losses = _losses("fit_transformer.py", "--steps", "30", "--every", "10")
    assert losses[0] > 3.5 and losses[-1] < 2.2, losses  # from about ln 64 towards the chain's 1.36


def test_the_tiny_lm_program_is_what_its_builder_makes_and_splits():
    sys.path.insert(0, str(EXAMPLES))
    try:
        import fit_transformer
    finally:
        sys.path.remove(str(EXAMPLES))
    program = fit_transformer.build_program()
    assert json.loads((EXAMPLES / "tiny-lm.program.json").read_text()) == program  # --write keeps it so
    banks = list(fit_transformer.initial_banks())
    assert banks == [b["name"] for b in program["bindings"] if b["kind"] == "bank"]
    split = runtime.vjp(program, wrt=banks).split()
    assert len(split.backward["bindings"]) > 32  # past the forward's max_bindings: the limits grew with it
    runtime.load_program(split.backward)
