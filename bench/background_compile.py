"""A run's slowdown while a background compile runs: ``python bench/background_compile.py``.

Each measurement is a fresh process on an empty cache: the seed (float32, T=8192) compiled and
warmed in the foreground, its drivers built; then 15 timed runs alone, then runs timed while a
tiered executable of the float64 seed compiles its kernels in the background (every run until
that compile is done, at most 40). Both medians, their ratio, and how long the background
compile took, per ``FORMULA_COMPILE_NICE`` value (``--nice 0,10``: 0 is the caller's priority),
the values alternated ``--rounds`` times.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent

CHILD = r"""
import json, statistics, sys, time
sys.path.insert(0, {repo!r})
import runtime
from bench import programs

tokens = {tokens}
exe = runtime.compile(programs.seed_program("float32"), "cpu", tiered=False)
data = programs.seed_data(tokens, "float32")
for _ in range(10):
    exe.run(inputs=data["inputs"], banks=data["banks"])
exe.wait_compiled()  # (the foreground plan's drivers, built from its eighth run)

def timed():
    start = time.perf_counter()
    exe.run(inputs=data["inputs"], banks=data["banks"])
    return (time.perf_counter() - start) * 1e3

alone = [timed() for _ in range(15)]
other = runtime.compile(programs.seed_program("float64"), "cpu", tiered=True)
wide = programs.seed_data(16, "float64")
other.run(inputs=wide["inputs"], banks=wide["banks"])  # on the tier: the compile starts now
started = time.perf_counter()
during = []
while not other.wait_compiled(timeout=0) and len(during) < 40:
    during.append(timed())
other.wait_compiled()
compile_s = time.perf_counter() - started
print(json.dumps({{"alone_ms": statistics.median(alone), "during_ms": statistics.median(during) if during else None,
                  "runs_during": len(during), "compile_s": compile_s}}))
"""


def measure(nice: int, tokens: int) -> dict:
    with tempfile.TemporaryDirectory() as cache:
        env = {k: v for k, v in os.environ.items() if k not in ("NUMBA_CACHE_DIR", "FORMULA_TIERED")}
        env.update(FORMULA_CACHE_DIR=cache, FORMULA_COMPILE_NICE=str(nice))
        done = subprocess.run([sys.executable, "-c", CHILD.format(repo=str(REPO), tokens=tokens)], env=env,
                              capture_output=True, text=True, check=True)
    got = json.loads(done.stdout.splitlines()[-1])
    got["nice"] = nice
    if got["during_ms"] is not None:
        got["slowdown"] = got["during_ms"] / got["alone_ms"]
    return got


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nice", default="0,10", help="FORMULA_COMPILE_NICE values, alternated")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--tokens", type=int, default=8192)
    args = parser.parse_args(argv)
    results = []
    for _ in range(args.rounds):
        for nice in (int(v) for v in args.nice.split(",")):
            results.append(measure(nice, args.tokens))
            print(json.dumps({k: round(v, 3) if isinstance(v, float) else v for k, v in results[-1].items()}),
                  flush=True)
    for nice in sorted({r["nice"] for r in results}):
        slow = [r["slowdown"] for r in results if r["nice"] == nice and "slowdown" in r]
        if slow:
            print(f"nice {nice}: median slowdown {statistics.median(slow):.2f}x over {len(slow)} processes")
    return 0


if __name__ == "__main__":
    sys.exit(main())
