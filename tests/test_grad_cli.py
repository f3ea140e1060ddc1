"""``formula grad``: the gradient program and manifest on disk, runnable by the other verbs."""
from __future__ import annotations

import json

import numpy as np

import runtime
from runtime.cli import main

SEED = "examples/seed-lora-silu.program.json"


def test_grad_writes_a_program_the_other_verbs_accept(tmp_path, capsys):
    out = tmp_path / "g.program.json"
    assert main(["grad", SEED, "--wrt", "lora.A", "--wrt", "lora.B", "--out", str(out),
                 "--dim", "B=2", "--dim", "S=64"]) == 0
    err = capsys.readouterr().err
    assert "instructions added" in err and "kept for the backward: 0.0 MiB (32,768 B) in 2 values" in err
    manifest = json.loads((tmp_path / "g.manifest.json").read_text())
    assert manifest["cotangents"] == {"%4": "cotangent.4"}
    assert set(manifest["gradients"]) == {"lora.A", "lora.B"}
    assert main(["validate", str(out)]) == 0
    assert main(["plan", str(out), "--dim", "B=2", "--dim", "S=64"]) == 0
    assert main(["run", str(out), "--random", "--dim", "B=1", "--dim", "S=4", "--backend", "reference"]) == 0
    g = runtime.vjp(SEED, ["lora.A", "lora.B"])
    assert json.loads(out.read_text()) == g.program


def test_grad_json_and_errors(tmp_path, capsys):
    out = tmp_path / "g.json"
    assert main(["grad", SEED, "--wrt", "x", "--out", str(out), "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["ok"] and report["gradients"] == {"x": report["gradients"]["x"]}
    assert report["saved"] == ["%0"] and report["saved_bytes"] is None  # no --dim for B and S
    assert main(["grad", SEED, "--wrt", "lora.a", "--out", str(out), "--json"]) == 1
    report = json.loads(capsys.readouterr().out)
    assert report["error"]["code"] == "binding_keys" and report["error"]["path"] == "$.wrt[0]"
    assert main(["grad", SEED, "--wrt", "x", "--out", str(tmp_path / "missing" / "g.json")]) == 1
    assert "[schema] $.out" in capsys.readouterr().err


def test_grad_of_a_scalar_output_takes_no_cotangent(tmp_path):
    b = runtime.ProgramBuilder("float64")
    x = b.input("x", {"T": 3})
    loss = b.op("reduce@2", [x], {"axis": "T", "mode": "sum", "accumulation_dtype": "float32"})
    src = tmp_path / "p.json"
    src.write_text(json.dumps(b.build([loss])))
    out = tmp_path / "g.program.json"
    assert main(["grad", str(src), "--wrt", "x", "--output", loss, "--out", str(out)]) == 0
    manifest = json.loads((tmp_path / "g.manifest.json").read_text())
    assert manifest["cotangents"] == {}
    r = runtime.execute(str(out), inputs={"x": np.arange(3.0)}, backend="reference")
    np.testing.assert_array_equal(r[manifest["gradients"]["x"]], np.ones(3))
