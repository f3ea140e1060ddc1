"""The gradient and training benchmarks' own plumbing (bench/training.py, bench/run.py --fresh,
bench/report.py's training tables): case sizes, what --fresh measures, the tables' cells."""
from __future__ import annotations

import math
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench import report, run, training  # noqa: E402


def test_cases_resolve_to_the_issue_sizes_and_shrink_when_quick():
    assert training.resolve("seed-T8192").sizes == {"T": 8192}
    assert training.resolve("mlp-T4096").sizes == {"T": 4096, "D": 1024, "F": 4096}
    block = training.resolve("block-B4-S512")
    assert (block.kind, block.sizes["B"], block.sizes["S"], block.sizes["D"]) == ("block", 4, 512, 512)
    quick = training.resolve("block-B4-S512", quick=True)
    assert (quick.sizes["B"], quick.sizes["S"], quick.sizes["D"]) == (2, 16, 64)
    assert training.resolve("seed-T256", quick=True).sizes == {"T": 16}
    values = training.data(training.resolve("mlp-T4096", quick=True))
    assert training.wrt(training.resolve("mlp-T4096", quick=True), values) == ["w1", "w2"]
    assert values["cotangent"].shape == values["target"].shape == (64, 64)


def test_fresh_rows_and_the_default_suites():
    rows = training.fresh_rows(["train", "remat"], ["cpu", "torch"])
    assert ("cpu", "seed-T8192", "save-all") in rows and ("torch", "block-B1-S512", "save-all") in rows
    assert [r for r in rows if r[1] == "block-B4-S512"] == [
        ("cpu", "block-B4-S512", "save-all"), ("cpu", "block-B4-S512", "save-contractions"),
        ("cpu", "block-B4-S512", "save-inputs"), ("torch", "block-B4-S512", "save-all")]
    assert training.fresh_rows(["grad"], ["cpu", "torch"]) == []
    assert run.parse_args([]).suites == "seed,atoms,blocks"  # the training suites only when named
    args = run.parse_args(["--suites", "grad,train,remat", "--fresh", "--fresh-cold"])
    assert args.fresh and args.fresh_cold and run.SUITES["remat"] == "bench/test_remat.py"


def _bench(contender, group, suite, median, **extra):
    return {"name": f"t[{contender}]", "fullname": "x", "group": group,
            "extra_info": {"suite": suite, "contender": contender, **extra},
            "stats": {"median": median, "data": [median]}, "options": {}}


def test_training_tables():
    benches = [_bench("cpu", "grad-seed-T8192", "grad", 0.010, mode="forward"),
               _bench("cpu", "grad-seed-T8192", "grad", 0.015, mode="backward"),
               _bench("cpu", "grad-seed-T8192", "grad", 0.020, mode="fwdbwd"),
               _bench("cpu", "grad-seed-T8192", "grad", 0.025, mode="split"),
               _bench("torch", "grad-seed-T8192", "grad", 0.012, mode="forward"),
               _bench("torch", "grad-seed-T8192", "grad", 0.030, mode="fwdbwd"),
               _bench("torch", "grad-seed-T8192", "grad", 0.018, mode="backward"),
               _bench("cpu", "grad-block-B1-S128", "grad", 0.004, mode="forward"),
               _bench("cpu", "train-mlp-T4096", "train", 0.100, case="mlp-T4096"),
               _bench("torch", "train-mlp-T4096", "train", 0.090, case="mlp-T4096"),
               _bench("cpu", "remat-block-B4-S512", "remat", 0.050, remat="save-all", saved_bytes=3 << 20),
               _bench("cpu", "remat-block-B4-S512", "remat", 0.060, remat="save-inputs", saved_bytes=0),
               _bench("torch", "remat-block-B4-S512", "remat", 0.055, remat="autograd", saved_bytes=None)]
    runs = [{"contender": "cpu+torch", "command": "c", "returncode": 0, "seconds": 1.0, "output_tail": "",
             "benchmark_json": {"benchmarks": benches},
             "meta": {"skipped": [], "failed": [], "passed": [], "environment": None}}]
    merged = run.merge(runs, [], ["bench/run.py"], {"env": {}})
    fresh = {"first_step_s": 3.5, "peak_rss_mib": 700.0, "saved_bytes": 1 << 20, "cache": "as-is"}
    merged["training_fresh"] = [
        {"contender": "cpu", "case": "mlp-T4096", "remat": "save-all", **fresh},
        {"contender": "torch", "case": "mlp-T4096", "remat": None, **fresh, "first_step_s": 0.25,
         "peak_rss_mib": 650.0, "saved_bytes": None},
        {"contender": "cpu", "case": "mlp-T4096", "remat": "save-all", **fresh, "first_step_s": 40.0, "cache": "cold"},
        {"contender": "cpu", "case": "block-B4-S512", "remat": "save-inputs", **fresh, "peak_rss_mib": 500.0},
        {"contender": "cpu", "case": "block-B4-S512", "remat": "save-all", "error": "boom", "cache": "as-is"}]
    text = report.render(merged)
    assert ("| seed-T8192 | 10.00 | 15.00 | 20.00 | 25.00 | 12.00 | 30.00 | 18.00 | 1.50× | 1.50× (≥ 1.0) "
            "| 1.20× |") in text
    assert text.index("| seed-T8192 |") < text.index("| block-B1-S128 |")
    assert ("| mlp-T4096 | 100 | 90.00 | 0.90× (≥ 1.0) | 3.50 (cold caches 40.00) | 0.25 | 700.0 | 650.0 "
            "| 1.0 |") in text
    assert "| cpu `save-all` | 50.00 | 3.0 | — | — |" in text  # its fresh process failed
    assert "| cpu `save-inputs` | 60.00 | 0.0 | 500.0 | 3.50 |" in text
    assert "| torch eager (autograd) | 55.00 | — | — | — |" in text
    assert text.index("| cpu `save-inputs` |") < text.index("| torch eager (autograd) |")


@pytest.mark.parametrize("name", ["seed-T256", "mlp-T4096", "block-B1-S128"])
def test_the_torch_side_computes_what_the_programs_do(name):
    """At the quick sizes, torch's forward and gradients equal the runtime's reference backend on
    the same programs, and three training steps follow the same losses: the benchmarks compare
    like with like."""
    pytest.importorskip("torch", reason="the torch contender needs PyTorch")
    import runtime

    case = training.resolve(name, quick=True)
    values = training.data(case)
    names = training.wrt(case, values)
    g = runtime.vjp(training.program(case), wrt=names)
    (cot,) = g.cotangents.values()
    got = runtime.execute(g.program, inputs={**values["inputs"], cot: values["cotangent"]},
                          banks=values["banks"], backend="reference")
    theirs = training.torch_grad(case, values)
    training.check_output(case, values, theirs.output(), training.expected_output(case, values))
    training.check_gradients(theirs.gradients(), {n: got[g.gradients[n]] for n in names}, f"torch, {name}")
    ours, ref = (training.trainer(c, case, values) for c in ("reference", "torch"))
    for _ in range(3):
        a, b = ours.step(), ref.step()
        assert math.isclose(a, b, rel_tol=1e-3), (a, b)
