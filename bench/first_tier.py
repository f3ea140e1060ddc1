"""The first tier's speed against plain NumPy: ``python bench/first_tier.py [--runs 7] [--json]``.

While a plan's kernels compile, a tiered executable runs on its private ``reference``
executable, whose contraction takes BLAS (``np.matmul``) there instead of the oracle's
``np.einsum`` (``runtime.kernels.tiers``). For the seed at T=4096 and the block at (1, 512),
in this process (nothing compiled: the reference backend compiles nothing), the median of
``--runs`` runs of: the same computation in plain NumPy (bench/contenders.seed_numpy,
bench/blocks.numpy_fn), the first tier, and the oracle (``backend="reference"``).

``--fresh``: instead, runs 1-6 of a tiered ``cpu`` executable in a fresh process on an empty
cache (the issue's measure: the median of runs 2-6 against NumPy), with each run's tier.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))


def _cases():
    from bench import blocks, contenders, programs

    seed = programs.seed_data(4096, "float32")
    block = next(c for c in blocks.cases() if c.name == "B1-S512")
    bdata = blocks.data(block)
    return {"seed-T4096": (programs.seed_program("float32"), seed, contenders.seed_numpy(seed)),
            "block-B1-S512": (blocks.program(block), bdata, blocks.numpy_fn(block, bdata))}


def _median_ms(fn, runs: int) -> float:
    times = []
    for _ in range(runs):
        start = time.perf_counter()
        fn()
        times.append((time.perf_counter() - start) * 1e3)
    return statistics.median(times)


def in_process(runs: int) -> dict:
    import runtime
    from runtime.kernels.tiers import running_first_tier

    out = {}
    for name, (program, data, numpy_run) in _cases().items():
        exe = runtime.compile(program, "reference")

        def run():
            return exe.run(inputs=data["inputs"], banks=data["banks"])

        def first_tier():
            with running_first_tier():
                return run()

        numpy_run(), first_tier(), run()  # (warm: memory, BLAS threads)
        got = {"numpy_ms": _median_ms(numpy_run, runs), "first_tier_ms": _median_ms(first_tier, runs),
               "reference_ms": _median_ms(run, runs)}
        got["first_tier_vs_numpy"] = got["first_tier_ms"] / got["numpy_ms"]
        out[name] = got
    return out


CHILD = """
import json, sys, time
sys.path.insert(0, {repo!r})
import runtime
from bench.first_tier import _cases
name = sys.argv[1]
program, data, numpy_run = _cases()[name]
exe = runtime.compile(program, "cpu", tiered=True)
runs = []
for _ in range(6):
    start = time.perf_counter()
    result = exe.run(inputs=data["inputs"], banks=data["banks"])
    runs.append([(time.perf_counter() - start) * 1e3, result.tier])
numpy_run()
start = time.perf_counter()
for _ in range(5):
    numpy_run()
print(json.dumps({{"runs": runs, "numpy_ms": (time.perf_counter() - start) * 200}}))
"""


def fresh() -> dict:
    out = {}
    for name in ("seed-T4096", "block-B1-S512"):
        with tempfile.TemporaryDirectory() as cache:
            env = {k: v for k, v in os.environ.items() if k not in ("NUMBA_CACHE_DIR", "FORMULA_TIERED")}
            env["FORMULA_CACHE_DIR"] = cache
            done = subprocess.run([sys.executable, "-c", CHILD.format(repo=str(REPO)), name], env=env,
                                  capture_output=True, text=True, check=True)
        got = json.loads(done.stdout.splitlines()[-1])
        got["median_runs_2_6_ms"] = statistics.median(ms for ms, _ in got["runs"][1:])
        got["vs_numpy"] = got["median_runs_2_6_ms"] / got["numpy_ms"]
        out[name] = got
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=7)
    parser.add_argument("--fresh", action="store_true", help="runs 1-6 of a fresh process, empty cache")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args(argv)
    result = fresh() if args.fresh else in_process(args.runs)
    if args.json:
        print(json.dumps(result, indent=1))
    else:
        for name, got in result.items():
            print(name, {k: (round(v, 2) if isinstance(v, float) else v) for k, v in got.items()})
    return 0


if __name__ == "__main__":
    sys.exit(main())
