"""The benchmark harness itself: program builder, result checks, process isolation, merge
and report. Fast: no timing, one small pytest subprocess."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from bench import programs, report, run
from bench.atom_cases import CASES
from bench.test_seed import SeedCase, check_seed
from runtime import FormulaError
from runtime.program import loader

REPO = Path(__file__).resolve().parent.parent


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.name)
def test_atom_programs_follow_spec_records(case):
    program = case.build()
    loader.program(program)  # SPEC §2 record shapes, names, refs, limits
    ids = {s["slot_id"]: s for s in program["slots"]}
    for b in program["bindings"]:
        assert ids[b["name"]]["producer"] == b["kind"]
        assert ids[b["name"]]["role"] == ("input" if b["kind"] == "input" else "bank_operand")
    assert ids["%0"]["role"] == "output" and program["outputs"] == ["%0"]
    assert program["instructions"][0]["atom_ref"].rsplit("@", 1)[1].isdigit()


def test_atom_programs_validate_against_the_atoms():
    import runtime

    try:
        import atoms

        atoms.all_specs()
    except ImportError as exc:
        pytest.skip(f"built-in atom modules are not in the tree yet: {exc}")
    for case in CASES:
        try:
            runtime.load_program(case.build())
        except FormulaError as exc:
            pytest.fail(f"{case.name}: {exc}")


def test_seed_dtype_rewrite_keeps_accumulation():
    p = programs.seed_program("float64")
    loader.program(p)
    types = [s["value_type"]["dtype"] for s in p["slots"]]
    assert set(types) == {"float64"}
    assert all(i["attributes"].get("accumulation_dtype", "float32") == "float32" for i in p["instructions"])
    with pytest.raises(ValueError, match="float16"):
        programs.seed_program("float16")


def test_seed_check_accepts_the_formula_and_rejects_a_wrong_result():
    data = programs.seed_data(5, "float32")
    i, b = data["inputs"], data["banks"]
    h = i["x"] @ b["lora.A"].T
    good = i["base"] + i["lora.gain"] * ((h / (1 + np.exp(-h))) @ b["lora.B"].T)
    case = SeedCase("numpy", "float32", 5)
    check_seed(good, data, case)
    wrong = good.copy()
    wrong[0, 4, 7] += 1e-2
    with pytest.raises(AssertionError):
        check_seed(wrong, data, case)
    with pytest.raises(AssertionError):
        check_seed(good.astype(np.float64), data, case)


def test_peer_processes_are_clean_and_record_their_environment(tmp_path):
    meta = tmp_path / "meta.json"
    cmd = run.pytest_command("numpy", ["bench/test_seed.py"], tmp_path / "b.json", meta,
                             "T1 and float32", quick=True, extra=[])
    assert "no:formula_runtime" in cmd
    proc = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    m = json.loads(meta.read_text())
    assert m["passed"] == ["bench/test_seed.py::test_seed[numpy-float32-T1]"]
    env = m["environment"]
    assert "numba" not in env["modules_loaded"] and "runtime" not in env["modules_loaded"]
    assert any(p.get("internal_api") == "openblas" for p in env["thread_pools"])
    assert env["env"]["OPENBLAS_CORETYPE"] == __import__("os").environ.get("OPENBLAS_CORETYPE")


def test_unknown_contender_is_a_usage_error():
    proc = subprocess.run([sys.executable, "-m", "pytest", "bench/test_seed.py", "-q",
                           "-p", "no:cacheprovider", "--bench-contenders=nump"],
                          cwd=REPO, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 4 and "nump" in proc.stderr


def _bench(contender, group, suite, median):
    return {"name": f"test[{contender}]", "fullname": f"x::test[{contender}]", "group": group,
            "extra_info": {"suite": suite, "contender": contender},
            "stats": {"median": median, "data": [median] * 3}, "options": {}}


def test_merge_and_report():
    runs = [
        {"contender": "cpu", "command": "c", "returncode": 0, "seconds": 1.0, "output_tail": "",
         "benchmark_json": {"benchmarks": [_bench("cpu", "seed-float32-T256", "seed", 0.002),
                                           _bench("cpu", "seed-float32-T8192", "seed", 0.010),
                                           _bench("cpu", "atom-add", "atoms", 0.0001)]},
         "meta": {"skipped": [], "failed": [], "passed": ["a", "b", "c"],
                  "environment": {"thread_pools": [], "modules_loaded": ["runtime", "numba"]}}},
        {"contender": "numpy", "command": "n", "returncode": 0, "seconds": 1.0, "output_tail": "",
         "benchmark_json": {"benchmarks": [_bench("numpy", "seed-float32-T256", "seed", 0.003),
                                           _bench("numpy", "atom-add", "atoms", 0.0002)]},
         "meta": {"skipped": [], "failed": [], "passed": ["a"], "environment": None}},
        {"contender": "torch", "command": "t", "returncode": 0, "seconds": 1.0, "output_tail": "",
         "benchmark_json": None,
         "meta": {"skipped": [{"nodeid": "x", "reason": "Skipped: torch: package 'torch' is not installed"}] * 2,
                  "failed": [], "passed": [], "environment": None}},
    ]
    merged = run.merge(runs, [], ["bench/run.py"], {"versions": {"numpy": "2"}, "env": {}})
    assert len(merged["benchmarks"]) == 5
    assert all("data" not in b["stats"] for b in merged["benchmarks"])
    text = report.render(merged, source="r.json")
    cells = [[c.strip() for c in line.strip("|").split("|")] for line in text.splitlines()
             if line.startswith("| ")]
    assert cells[0][:3] == ["case", "formula cpu ms", "NumPy (as written) ms"]
    assert ["float32 T=256", "2.00", "3.00", "1.50×"] in cells
    assert ["float32 T=8192", "10.00", "—", "—"] in cells  # numpy did not run at T=8192
    assert ["add", "0.100", "0.200", "2.00×"] in cells
    assert "`torch`: 2 case(s) skipped: torch: package 'torch' is not installed" in text


def test_rounds_report_the_median_round_per_case():
    def one_round(cpu_s, numpy_s):
        return [{"contender": c, "command": c, "returncode": 0, "seconds": 1.0, "output_tail": "",
                 "benchmark_json": {"benchmarks": [_bench(c, "seed-float32-T256", "seed", s)]},
                 "meta": {"skipped": [], "failed": [], "passed": ["a"], "environment": None}}
                for c, s in (("cpu", cpu_s), ("numpy", numpy_s))]
    rounds = [run.merge(one_round(*times), [], [], {})["benchmarks"]
              for times in ((0.002, 0.009), (0.004, 0.003), (0.003, 0.006))]
    chosen = {b["contender"]: b for b in run.median_round(rounds)}
    assert chosen["cpu"]["stats"]["median"] == 0.003 and chosen["numpy"]["stats"]["median"] == 0.006
    assert chosen["cpu"]["round_medians"] == [0.002, 0.004, 0.003]
    merged = run.merge(one_round(0.002, 0.009), [], ["bench/run.py"], {"env": {}})
    merged["benchmarks"], merged["rounds"] = list(chosen.values()), 3
    text = report.render(merged)
    assert "**Rounds.** Every contender ran in 3 rounds" in text
    assert "| float32 T=256 | 3.00 | 6.00 | 2.00× |" in text
    assert run.parse_args(["--rounds", "3"]).rounds == 3


@pytest.mark.slow  # (CI runs the slow set after the suite: README)
def test_ab_seed_variants_build_and_compute_the_seed():
    """Every side-by-side variant of bench/lab/ab_seed.py builds (its patch names something that
    exists) and still computes the seed; the switched-off mechanisms change speed only."""
    from bench.lab import ab_seed

    inputs, banks = ab_seed.seed_values(300)
    table = ab_seed.variants(inputs, banks)
    assert {"baseline", "kernel by kernel", "BLAS tiles", "B packed per call", "x·Aᵀ on dot",
            "remainder rows one by one"} <= set(table)
    want = table["baseline"][0].run(inputs=inputs, banks=table["baseline"][2])["%4"]
    for name, (exe, _, run_banks) in table.items():
        got = exe.run(inputs=inputs, banks=run_banks)["%4"]
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=2e-6 * np.abs(want).max(), err_msg=name)


def test_reproduce_command_works_in_a_clone():
    recorded = ("/work/x/.venv/bin/python bench/run.py --rounds 5 --out bench/results/s14.json "
                "--report /tmp/r.md -k 'T256 and float32' --out=elsewhere.json")
    assert report.reproduce_command(recorded) == (
        "python bench/run.py --rounds 5 -k 'T256 and float32' --out bench/results/run.json")


def test_report_blocks_peak_rss_and_noisy_neighbour_tables():
    def one(c, quiet_s):
        return {"contender": c, "command": c, "returncode": 0, "seconds": 1.0, "output_tail": "",
                "benchmark_json": {"benchmarks": [_bench(c, "block-B1-S128", "blocks", quiet_s),
                                                  _bench(c, "block-mlp-T64", "blocks", 2 * quiet_s)]},
                "meta": {"skipped": [], "failed": [], "passed": ["a"], "environment": None}}
    quiet = run.merge([one("cpu", 0.010), one("onnxruntime", 0.020)], [], ["bench/run.py"], {"env": {}})
    quiet["peak_rss"] = [{"contender": "cpu", "case": "B4-S512", "peak_rss_mib": 300.5, "data_rss_mib": 70.0},
                         {"contender": "onnxruntime", "case": "B4-S512", "error": "boom"}]
    noisy = run.merge([one("cpu", 0.030), one("onnxruntime", 0.040)], [], ["bench/run.py", "--noisy"], {"env": {}})
    text = report.render(quiet, noisy=noisy)
    assert "| B1-S128 | 10.00 | 20.00 | 2.00× |" in text  # blocks first, by tokens
    assert text.index("| B1-S128 |") < text.index("| mlp-T64 |")
    assert "| formula cpu | 300.5 | 70.0 |" in text and "| ONNX Runtime | failed: boom | |" in text
    assert "| B1-S128 | 3.00× (10.00 → 30.00 ms) | 2.00× (20.00 → 40.00 ms) |" in text
    args = run.parse_args(["--noisy", "--rss", "--suites", "blocks"])
    assert args.noisy and args.rss and run.SUITES["blocks"] == "bench/test_blocks.py"


def test_noisy_neighbour_runs_on_one_core_and_stops():
    proc = run.start_neighbour()
    try:
        import os
        import time

        time.sleep(0.5)
        assert proc.poll() is None
        assert os.sched_getaffinity(proc.pid) == {max(os.sched_getaffinity(0))}
    finally:
        proc.kill()
        proc.wait()
