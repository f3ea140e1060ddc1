"""The ``formula`` console script, driven through ``main([...])``."""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from safetensors.numpy import save_file

from runtime import FormulaError
from runtime.program import loader
from runtime.cli import main, summary
from runtime.execution.values import random_values, read_arrays
from runtime.testing import ProgramBuilder

SEED = str(Path(__file__).resolve().parents[1] / "examples" / "seed-lora-silu.program.json")
DIMS = ["--dim", "B=1", "--dim", "S=2"]


def seed_values(seed=0):
    rng = np.random.default_rng(seed)
    inputs = {"base": rng.standard_normal((1, 2, 1024)).astype(np.float32),
              "x": rng.standard_normal((1, 2, 1024)).astype(np.float32),
              "lora.gain": np.float32(0.75)}
    banks = {"A": (rng.standard_normal((32, 1024)) / 32).astype(np.float32),
             "B": (rng.standard_normal((1024, 32)) / 8).astype(np.float32)}
    return inputs, banks


def seed_expected(inputs, banks):
    x, a, b = (v.astype(np.float64) for v in (inputs["x"], banks["A"], banks["B"]))
    h = x @ a.T
    return inputs["base"] + float(inputs["lora.gain"]) * ((h / (1 + np.exp(-h))) @ b.T)


def test_version(capsys):
    assert main(["--version"]) == 0
    assert "formula-runtime" in capsys.readouterr().out


def test_usage_errors_exit_2_without_traceback(capsys):
    assert main(["run", SEED, "--dim", "B"]) == 2
    err = capsys.readouterr().err
    assert "SYMBOL=EXTENT" in err and "Traceback" not in err
    assert main(["plan", SEED, "--dim", "B=0"]) == 2
    assert main([]) == 2


def test_validate_prints_summary(capsys):
    from runtime import load_program

    assert main(["validate", SEED]) == 0
    out = capsys.readouterr().out
    assert load_program(SEED).fingerprint in out
    assert "symbols       B, S" in out and "bundle lora members ['member-000']" in out
    assert "instructions  5" in out and "outputs       %4: float32[B=B, S=S, Dout=1024]" in out


def test_validate_errors_exit_1_with_code_and_path(tmp_path, capsys):
    bad = tmp_path / "bad.json"
    bad.write_text("{not json")
    assert main(["validate", str(bad)]) == 1
    assert capsys.readouterr().err.startswith("error [schema] $:")
    doc = json.loads(Path(SEED).read_text())
    doc["instructions"][0]["atom_ref"] = "arti/formula-atom-nope@1"
    bad.write_text(json.dumps(doc))
    assert main(["validate", str(bad)]) == 1
    assert capsys.readouterr().err.startswith("error [unknown_atom] $.instructions[0].atom_ref:")
    assert main(["validate", str(tmp_path / "missing.json")]) == 1
    assert "error [program_unreadable]" in capsys.readouterr().err


def test_run_random(capsys):
    assert main(["run", SEED, "--random", *DIMS, "--seed", "3"]) == 0
    out = capsys.readouterr().out
    assert "%4  float32[1, 2, 1024]  min" in out and "time" in out


@pytest.mark.parametrize("fmt", ["npz", "safetensors"])
def test_run_with_files_matches_numpy(tmp_path, capsys, fmt):
    inputs, banks = seed_values()
    np.savez(tmp_path / "in.npz", **inputs)
    store = {"A/member-000": banks["A"], "B/member-000": banks["B"]}
    bank_file = tmp_path / f"banks.{fmt}"
    if fmt == "npz":
        np.savez(bank_file, **store)
    else:
        save_file(store, str(bank_file))
    out = tmp_path / "out.npz"
    assert main(["run", SEED, "--inputs", str(tmp_path / "in.npz"), "--banks", str(bank_file),
                 "--out", str(out)]) == 0, capsys.readouterr().err
    with np.load(out) as z:
        np.testing.assert_allclose(z["%4"], seed_expected(inputs, banks), rtol=2e-4, atol=2e-5)


def test_run_random_fills_only_what_files_do_not_give(tmp_path, capsys):
    inputs, banks = seed_values()
    bank_file = tmp_path / "banks.safetensors"
    save_file({"A/member-000": banks["A"], "B/member-000": banks["B"]}, str(bank_file))
    assert main(["run", SEED, "--banks", str(bank_file), "--random", *DIMS]) == 0
    np.savez(tmp_path / "in.npz", **inputs)
    assert main(["run", SEED, "--inputs", str(tmp_path / "in.npz"), "--random"]) == 0  # dims from x


def test_run_errors(tmp_path, capsys):
    assert main(["run", SEED, *DIMS]) == 1
    assert capsys.readouterr().err.startswith("error [binding_keys] $.inputs:")
    assert main(["run", SEED, "--random", "--dim", "B=1"]) == 1
    assert "error [binding_shape] $.dims:" in capsys.readouterr().err
    assert main(["run", SEED, "--random", *DIMS, "--banks", str(tmp_path / "w.bin")]) == 1
    assert "error [bank_store] $.banks:" in capsys.readouterr().err
    assert main(["run", SEED, "--inputs", str(tmp_path / "in.txt")]) == 1
    assert "error [schema] $.inputs:" in capsys.readouterr().err
    assert main(["run", SEED, "--random", *DIMS, "--backend", "nope"]) == 1
    assert "error [backend_unavailable]" in capsys.readouterr().err


def test_plan_text_and_json(capsys):
    assert main(["plan", SEED, "--dim", "B=4", "--dim", "S=16"]) == 0
    assert capsys.readouterr().out.strip()
    assert main(["plan", SEED, "--dim", "B=4", "--dim", "S=16", "--json"]) == 0
    assert isinstance(json.loads(capsys.readouterr().out), dict)
    assert main(["plan", SEED, "--dim", "B=4"]) == 1
    assert "error [binding_shape] $.dims" in capsys.readouterr().err


def test_bench(capsys):
    assert main(["bench", SEED, *DIMS, "--repeat", "2", "--warmup", "0"]) == 0
    out = capsys.readouterr().out
    assert "first run" in out and "median" in out and "banks loaded once" in out
    assert main(["bench", SEED, *DIMS, "--repeat", "1", "--banks-per-run"]) == 0
    assert "banks passed per run" in capsys.readouterr().out
    assert main(["bench", SEED, *DIMS, "--repeat", "0"]) == 2  # a usage error, before any work


def test_atoms_and_plugins(capsys):
    assert main(["atoms"]) == 0
    assert "contract" in capsys.readouterr().out
    assert main(["plugins"]) == 0
    assert "runtime.execution.banks" in capsys.readouterr().out


# --- helpers, without the API --------------------------------------------------------------
def bundle_program():
    b = ProgramBuilder()
    b.input("x", {"T": "T", "D": 4}, dtype="floating")
    b.input("idx", {"T": "T"}, dtype="int64")
    b.input("m", {"D": 4}, dtype="boolean")
    b.bank("lora.A", {"K": 3, "D": 4}, partition_id="A", bundle_id="lora", member_ids=["a", "b", "c"])
    return loader.program(b.build(outputs=[]))


def test_random_values_follow_declared_types():
    prog = bundle_program()
    inputs, banks = random_values(prog, {"T": 5}, seed=1, int_high=3)
    assert inputs["x"].dtype == np.float32 and inputs["x"].shape == (5, 4)
    assert inputs["idx"].dtype == np.int64 and set(np.unique(inputs["idx"])) <= {0, 1, 2}
    assert inputs["m"].dtype == np.bool_ and banks["lora.A"].shape == (3, 4)
    a, _ = random_values(prog, {"T": 5}, seed=1)
    b, _ = random_values(prog, {"T": 5}, seed=1)
    np.testing.assert_array_equal(a["x"], b["x"])
    with pytest.raises(FormulaError) as info:
        random_values(prog, {})
    assert info.value.code == "binding_shape" and "'T'" in info.value.message


def test_summary_and_read_arrays(tmp_path):
    lines = "\n".join(summary(bundle_program()))
    assert "bank  lora.A: float32[K=3, D=4]@anonymous  partition A, bundle lora members" in lines
    np.savez(tmp_path / "a.npz", x=np.ones(2))
    save_file({"y": np.zeros(3, np.float32)}, str(tmp_path / "b.safetensors"))
    assert set(read_arrays(str(tmp_path / "a.npz"), "$.inputs")) == {"x"}
    assert read_arrays(str(tmp_path / "b.safetensors"), "$.inputs")["y"].shape == (3,)
    (tmp_path / "c.npz").write_bytes(b"junk")
    with pytest.raises(FormulaError) as info:
        read_arrays(str(tmp_path / "c.npz"), "$.inputs")
    assert (info.value.code, info.value.path) == ("schema", "$.inputs")


def test_lora_program_with_a_member_axis_runs_from_safetensors_through_the_cli(tmp_path, capsys):
    """Two LoRA members (axis K) summed: weights stored per member as <partition>/<member>."""
    import json

    b = ProgramBuilder()
    x = b.input("x", {"T": "T", "D": 16})
    base = b.input("base", {"T": "T", "E": 12})
    members = ["m0", "m1"]
    A = b.bank("lora.A", {"K": 2, "R": 4, "D": 16}, source_ref="arti/formula-operand-bank@1",
               partition_id="A", bundle_id="lora", member_ids=members)
    B = b.bank("lora.B", {"K": 2, "E": 12, "R": 4}, source_ref="arti/formula-operand-bank@1",
               partition_id="B", bundle_id="lora", member_ids=members)
    h = b.op("contract", [x, A], {"reduce_axes": [["D", "D"]], "output_axes": ["T", "K", "R"],
                                  "accumulation_dtype": "float32"})
    h = b.op("scalar-map", [h], {"mode": "silu"})
    y = b.op("contract", [h, B], {"reduce_axes": [["R", "R"]], "output_axes": ["T", "K", "E"],
                                  "accumulation_dtype": "float32"})
    y = b.op("reduce", [y], {"axis": "K", "mode": "sum", "accumulation_dtype": "float32"})
    out = b.op("add", [base, y], {"accumulation_dtype": "float32"})
    prog = tmp_path / "lora-k.program.json"
    prog.write_text(json.dumps(b.build(outputs=[out])))
    rng = np.random.default_rng(7)
    xs, bs = rng.standard_normal((5, 16), dtype=np.float32), rng.standard_normal((5, 12), dtype=np.float32)
    a = rng.standard_normal((2, 4, 16), dtype=np.float32)
    w = rng.standard_normal((2, 12, 4), dtype=np.float32)
    save_file({f"A/{m}": a[k] for k, m in enumerate(members)} | {f"B/{m}": w[k] for k, m in enumerate(members)},
              str(tmp_path / "weights.safetensors"))
    np.savez(tmp_path / "in.npz", x=xs, base=bs)
    assert main(["run", str(prog), "--inputs", str(tmp_path / "in.npz"), "--banks",
                 str(tmp_path / "weights.safetensors"), "--out", str(tmp_path / "out.npz")]) == 0, \
        capsys.readouterr().err
    hh = np.einsum("td,krd->tkr", xs, a)
    hh = hh / (1 + np.exp(-hh))
    want = bs + np.einsum("tkr,ker->te", hh, w)
    with np.load(tmp_path / "out.npz") as z:
        np.testing.assert_allclose(z[out], want, rtol=1e-4, atol=1e-4)


def test_plan_over_max_working_bytes_is_reported_with_its_verdict(tmp_path, capsys):
    prog = json.loads(Path(SEED).read_text())
    prog["limits"]["max_working_bytes"] = 1 << 20
    path = tmp_path / "small.program.json"
    path.write_text(json.dumps(prog))
    assert main(["plan", str(path), "--dim", "B=4", "--dim", "S=2048"]) == 1
    out = capsys.readouterr().out
    assert "EXCEEDS max_working_bytes" in out and "[1]" in out  # the whole schedule, then the verdict
    assert main(["plan", str(path), "--dim", "B=4", "--dim", "S=2048", "--json"]) == 1
    report = json.loads(capsys.readouterr().out)
    assert report["ok"] is False and report["plan"]["verdict"] == "exceeds"
    assert report["plan"]["fits"] is False
    import runtime

    exe = runtime.compile(prog, "cpu")
    assert exe.plan({"B": 4, "S": 2048}, enforce=False).verdict == "exceeds"
    with pytest.raises(FormulaError) as err:  # running (and the default plan) still refuses it
        exe.plan({"B": 4, "S": 2048})
    assert (err.value.code, err.value.path) == ("limit_exceeded", "$.limits.max_working_bytes")
    assert main(["plan", str(path), "--dim", "B=1", "--dim", "S=1"]) == 0
    assert "fits" in capsys.readouterr().out


# --- arguments are checked before any work ------------------------------------------------
def _error(capsys) -> str:
    err = capsys.readouterr().err
    assert "Traceback" not in err
    return err


@pytest.fixture
def no_work(monkeypatch):
    """Fails the test if a run, a plan or value generation starts."""
    import runtime.cli as cli
    from runtime.execution import values
    from runtime.execution.executor import Executable

    def refuse(*args, **kwargs):
        raise AssertionError("work started before the arguments were checked")

    monkeypatch.setattr(Executable, "run", refuse)
    monkeypatch.setattr(Executable, "plan", refuse)
    monkeypatch.setattr(cli, "random_values", refuse)  # (bench, compile)
    monkeypatch.setattr(values, "random_values", refuse)  # (run: values.run_values)
    monkeypatch.setattr(values, "read_arrays", refuse)


@pytest.mark.parametrize("verb", ["run", "plan", "bench"])
def test_repeated_and_unknown_dims(verb, capsys, no_work):
    extra = ["--random"] if verb == "run" else []
    assert main([verb, SEED, *extra, "--dim", "B=1", "--dim", "S=2", "--dim", "B=3"]) == 1
    err = _error(capsys)
    assert err.startswith("error [duplicate] $.dims.B:") and "given twice (1 and 3)" in err
    assert main([verb, SEED, *extra, "--dim", "B=1", "--dim", "S=2", "--dim", "T=3"]) == 1
    err = _error(capsys)
    assert err.startswith("error [binding_keys] $.dims.T:") and "no symbol 'T'" in err
    assert main([verb, SEED, *extra, "--dim", "b=2", "--dim", "S=2"]) == 1
    assert "did you mean 'B'?" in _error(capsys)


@pytest.mark.parametrize("verb", ["run", "plan", "bench"])
def test_backend_comes_from_the_registry(verb, capsys, no_work):
    assert main([verb, SEED, *DIMS, "--backend", "cpx"]) == 1
    err = _error(capsys)
    assert err.startswith("error [backend_unavailable] $.backend:")
    assert "unknown backend 'cpx' (did you mean 'cpu'?)" in err and "reference" in err


def test_out_is_checked_before_running(tmp_path, capsys, no_work):
    base = ["run", SEED, "--random", *DIMS]
    assert main([*base, "--out", str(tmp_path / "out.txt")]) == 1
    assert _error(capsys).startswith("error [schema] $.out:")
    assert main([*base, "--out", str(tmp_path / "missing" / "out.npz")]) == 1
    assert "does not exist" in _error(capsys)
    (tmp_path / "d.npz").mkdir()
    assert main([*base, "--out", str(tmp_path / "d.npz")]) == 1
    assert "is a directory" in _error(capsys)


def test_missing_value_files_are_named(tmp_path, capsys, no_work):
    assert main(["run", SEED, "--inputs", str(tmp_path / "none.npz"), "--random"]) == 1
    assert _error(capsys).startswith("error [schema] $.inputs:")
    assert main(["run", SEED, "--banks", str(tmp_path / "none.npz"), "--random", *DIMS]) == 1
    assert _error(capsys).startswith("error [bank_store] $.banks:")


def test_run_without_values_suggests_inputs_or_random(capsys, no_work):
    assert main(["run", SEED, *DIMS]) == 1
    err = _error(capsys)
    assert err.startswith("error [binding_keys] $.inputs:") and "--inputs" in err and "--random" in err


@pytest.mark.parametrize("args", [["run", SEED, "--random", "--seed", "-1"],
                                  ["bench", SEED, "--seed", "x"],
                                  ["run", SEED, "--random", "--int-high", "0"],
                                  ["bench", SEED, "--warmup", "-1"]])
def test_numeric_arguments_are_usage_errors(args, capsys, no_work):
    assert main(args) == 2
    err = _error(capsys)
    assert "usage: formula" in err and ("must be ≥" in err or "expected an integer" in err)


# --- --json on every verb ------------------------------------------------------------------
README = Path(__file__).resolve().parents[1] / "README.md"


def _json(capsys) -> dict:
    """The --json answer, checked against its row in the README's table of shapes."""
    doc = json.loads(capsys.readouterr().out)
    assert list(doc)[:2] == ["command", "ok"]
    verb = "any, on error" if "error" in doc else f"`{doc['command']}`"
    (row,) = [line for line in README.read_text().splitlines() if line.startswith(f"| {verb} |")]
    undocumented = [key for key in doc if f'"{key}"' not in row]
    assert not undocumented, f"README does not document {undocumented} of {verb}"
    for key in ("summary", "plan"):
        for inner in doc.get(key) or {}:
            assert f'"{inner}"' in row, (key, inner)
    for item in (doc.get("atoms") or doc.get("plugins") or [])[:1]:
        assert all(f'"{k}"' in row for k in item), (verb, item)
    return doc


def test_json_validate_and_errors(tmp_path, capsys):
    assert main(["validate", SEED, "--json"]) == 0
    doc = _json(capsys)
    assert doc["command"] == "validate" and doc["ok"] and doc["program"] == SEED
    s = doc["summary"]
    assert s["symbols"] == ["B", "S"] and s["instructions"] == 5
    assert [o["slot"] for o in s["outputs"]] == ["%4"]
    assert s["outputs"][0]["type"].startswith("float32[B=B, S=S, Dout=1024]")
    assert {b["name"] for b in s["bindings"] if b["kind"] == "bank"} == {"lora.A", "lora.B"}
    bad = tmp_path / "bad.json"
    bad.write_text("{not json")
    assert main(["validate", str(bad), "--json"]) == 1
    doc = _json(capsys)
    assert doc["ok"] is False and doc["error"]["code"] == "schema" and doc["error"]["path"] == "$"
    assert main(["run", SEED, "--json", "--random", "--dim", "B=1", "--dim", "B=2"]) == 1
    assert _json(capsys)["error"]["code"] == "duplicate"


def test_json_run_plan_bench(tmp_path, capsys):
    out = tmp_path / "o.npz"
    assert main(["run", SEED, "--random", *DIMS, "--json", "--out", str(out)]) == 0
    doc = _json(capsys)
    assert doc["backend"] == "cpu" and doc["dims"] == {"B": 1, "S": 2} and doc["out"] == str(out)
    assert set(doc["outputs"]["%4"]) == {"dtype", "shape", "min", "max", "mean"}
    assert doc["outputs"]["%4"]["shape"] == [1, 2, 1024] and doc["ms"] > 0
    assert set(np.load(out).files) == {"%4"}
    assert main(["plan", SEED, *DIMS, "--json"]) == 0
    doc = _json(capsys)
    assert doc["ok"] and doc["plan"]["dims"] == {"B": 1, "S": 2} and doc["plan"]["schedule"]
    assert main(["bench", SEED, *DIMS, "--repeat", "2", "--warmup", "0", "--json"]) == 0
    doc = _json(capsys)
    assert (doc["repeat"], doc["warmup"], doc["banks"]) == (2, 0, "loaded once")
    assert len(doc["times_ms"]) == 2 and doc["min_ms"] <= doc["median_ms"] <= doc["max_ms"]
    assert {"first_ms", "backend", "dims", "program"} <= set(doc)


def test_json_atoms_and_plugins(capsys):
    from runtime.plugins import diagnostics
    from runtime.plugins.registry import default_registry

    assert main(["atoms", "--json"]) == 0
    doc = _json(capsys)
    assert doc["atoms"] == json.loads(json.dumps(diagnostics.atoms_table(default_registry())))
    assert main(["plugins", "--json"]) == 0
    doc = _json(capsys)
    names = {p["name"] for p in doc["plugins"]}
    assert {"atoms", "runtime.backends"} <= names
    assert doc["ok"] == all(p["status"] == "loaded" and not p["problems"] for p in doc["plugins"])


def test_compile_notice_goes_to_stderr(capsys, monkeypatch):
    """A kernel compiling (a cache miss) is announced on stderr and totalled."""
    from runtime.cli import _compile_feedback
    from runtime.kernels.compilelog import log

    with _compile_feedback():
        log.info("compiling %s", "m.kernel")
        log.debug("compiled %s in %.2f s", "m.kernel", 0.5)
        log.info("compiling %s", "m.other")
    err = capsys.readouterr().err
    assert err.count("compiling kernels") == 1 and "compiled 2 kernels in" in err
    with _compile_feedback():  # nothing compiled (cache hits): nothing said
        pass
    assert capsys.readouterr().err == ""


def test_compile_notice_counts_live_on_a_terminal():
    import io

    from runtime.kernels.compilelog import CompileNotice, log

    class Terminal(io.StringIO):
        def isatty(self):
            return True

    stream = Terminal()
    notice = CompileNotice(stream)
    log.addHandler(notice)
    level = log.level
    log.setLevel("INFO")
    try:
        log.info("compiling %s", "m.kernel")
        log.info("compiling %s", "m.other")
    finally:
        log.removeHandler(notice)
        log.setLevel(level)
    notice.finish()
    text = stream.getvalue()
    assert "\r  1 compiled" in text and "\r  2 compiled" in text and "m.other" in text
    assert text.endswith("compiled 2 kernels in 0.0 s\n")
    assert max(len(part) for part in text.split("\r")[1:]) <= 100  # the live line fits a terminal


@pytest.mark.parametrize("dims", [["B=100000000000", "S=1"], ["B=4096", "S=4096"]])
def test_run_random_checks_limits_before_generating_anything(capsys, dims):
    import resource
    import time

    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    t0 = time.perf_counter()
    argv = ["run", SEED, "--random"] + [a for d in dims for a in ("--dim", d)]
    assert main(argv) == 1
    assert time.perf_counter() - t0 < 5
    assert resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before < 200 * 1024  # KiB: < 200 MB
    err = capsys.readouterr().err
    assert "[limit_exceeded]" in err and "internal error" not in err


@pytest.mark.parametrize("kind", ["device", "directory", "surrogate"])
def test_validate_refuses_hostile_program_files_without_internal_errors(capsys, tmp_path, kind):
    if kind == "device":
        target, code = "/dev/zero", "program_unreadable"
    elif kind == "directory":
        target, code = str(tmp_path), "program_unreadable"
    else:
        prog = json.loads(Path(SEED).read_text())
        prog["bindings"][2]["partition_id"] = "A\ud800"
        target, code = str(tmp_path / "p.json"), "schema"
        Path(target).write_text(json.dumps(prog))
    assert main(["validate", target]) == 1
    err = capsys.readouterr().err
    assert f"[{code}]" in err and "internal error" not in err


def test_run_inputs_file_is_measured_by_its_headers_before_it_is_read(tmp_path, capsys):
    import zipfile

    from numpy.lib import format as npformat

    path = tmp_path / "in.npz"
    with zipfile.ZipFile(path, "w", compression=zipfile.ZIP_DEFLATED) as zf:
        with zf.open("x.npy", "w", force_zip64=True) as f:  # declares 4 GiB, holds 1 MiB of zeros
            npformat.write_array_header_1_0(f, {"descr": "<f4", "fortran_order": False, "shape": (1 << 30,)})
            f.write(bytes(1 << 20))
    assert main(["run", SEED, "--inputs", str(path), "--random"]) == 1
    err = capsys.readouterr().err
    assert "[limit_exceeded] $.inputs.x" in err and "internal error" not in err


def test_run_random_checks_the_whole_plan_against_the_memory_ceiling(monkeypatch, capsys):
    # bindings 768 KiB fit 1 MiB; with the 256 KiB output the working set does not
    monkeypatch.setenv("FORMULA_MEMORY_LIMIT", "1M")
    assert main(["run", SEED, "--random", "--dim", "B=1", "--dim", "S=64"]) == 1
    err = capsys.readouterr().err
    assert "[limit_exceeded]" in err and "working set" in err and "runtime memory limit" in err


def test_a_reader_that_leaves_early_is_no_error():
    """`formula atoms | head -1`: the closed pipe ends the command quietly (status 141)."""
    import subprocess
    import sys

    proc = subprocess.Popen([sys.executable, "-m", "runtime.cli", "atoms"], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE)
    proc.stdout.close()  # the reader is gone before the first line is written
    err = proc.stderr.read().decode()
    assert proc.wait() == 141 and err == "", err
