"""Full garbage collections during a cold compile of the transformer block (empty kernel cache,
a fresh process each): how many ran, on which thread, and for how long, with the third
threshold that background compiles raise (``runtime.execution.background.GC_GEN2_THRESHOLD``)
set to each value given: the measurement behind it (docs/performance.md, tuning log).

    python bench/lab/compile_gc.py [--thresholds 10,100]
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]

CHILD = """
import gc, json, sys, threading, time
sys.path.insert(0, {repo!r})
from runtime.execution import background
background.GC_GEN2_THRESHOLD = {threshold}
from bench import transformer
from bench.first_result import BLOCK_DIMS
import runtime
log, started = [], {{}}
def watch(phase, info):
    if info["generation"] == 2:
        if phase == "start":
            started["t"] = time.perf_counter()
        else:
            log.append((threading.current_thread().name, (time.perf_counter() - started["t"]) * 1e3))
gc.callbacks.append(watch)
t0 = time.perf_counter()
exe = runtime.compile(transformer.transformer_block_program(full=True, dims=BLOCK_DIMS), "cpu")
data = transformer.transformer_block_data(64, full=True, dims=BLOCK_DIMS)
for _ in range(3):
    exe.run(**data)
exe.wait_compiled()
exe.warm()
print(json.dumps({{"ready_s": time.perf_counter() - t0, "collections": log}}))
"""


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--thresholds", default="10,100")
    args = p.parse_args()
    for threshold in map(int, args.thresholds.split(",")):
        with tempfile.TemporaryDirectory() as cache:
            env = {k: v for k, v in os.environ.items() if k not in ("NUMBA_CACHE_DIR", "FORMULA_TIERED")}
            env["FORMULA_CACHE_DIR"] = cache
            done = subprocess.run([sys.executable, "-c", CHILD.format(repo=str(REPO), threshold=threshold)],
                                  env=env, capture_output=True, text=True, check=True)
        got = json.loads(done.stdout.splitlines()[-1])
        ms = [m for _, m in got["collections"]]
        threads = sorted({name for name, _ in got["collections"]})
        print(f"threshold {threshold}: ready in {got['ready_s']:.1f} s; {len(ms)} full collections, "
              f"{sum(ms):.0f} ms in all, the longest {max(ms, default=0):.0f} ms, on {threads}", flush=True)


if __name__ == "__main__":
    main()
