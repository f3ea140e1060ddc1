"""Interleaved rounds: whole vs chunked runs of the seed (float32, B=16, S=512), min and median ms.

    NUMBA_NUM_THREADS=1 python bench/lab/ab_chunked.py [ROUNDS]     (from the repository root)

Cases: the whole run; ``chunks="auto"`` under max_working_bytes a quarter of the whole working
set; slices of 4 and of 1 batch rows. Every case's result is checked bit for bit against the
whole run's first.
"""
from __future__ import annotations

import json
import sys
import time
from pathlib import Path

import numpy as np

import runtime

SEED = Path(__file__).resolve().parents[2] / "examples" / "seed-lora-silu.program.json"
B, S = 16, 512


def main(rounds: int) -> None:
    doc = json.loads(SEED.read_text())
    rng = np.random.default_rng(0)
    inputs = {"x": rng.standard_normal((B, S, 1024), dtype=np.float32),
              "base": rng.standard_normal((B, S, 1024), dtype=np.float32), "lora.gain": np.float32(0.5)}
    banks = {"lora.A": (rng.standard_normal((32, 1024)) * 0.03).astype(np.float32),
             "lora.B": (rng.standard_normal((1024, 32)) * 0.03).astype(np.float32)}
    big = runtime.compile(doc, backend="cpu", tiered=False)
    whole_bytes = big.plan({"B": B, "S": S}).working_bytes
    doc["limits"]["max_working_bytes"] = whole_bytes // 4
    small = runtime.compile(doc, backend="cpu", tiered=False)
    rb, rs = big.load_banks(banks), small.load_banks(banks)
    cases = {"whole": lambda: big.run(inputs=inputs, banks=rb),
             "auto (limit = whole/4)": lambda: small.run(inputs=inputs, banks=rs, chunks="auto"),
             "chunks=4": lambda: big.run(inputs=inputs, banks=rb, chunks=4),
             "chunks=1": lambda: big.run(inputs=inputs, banks=rb, chunks=1)}
    expected = cases["whole"]()["%4"].copy()
    for name, run in cases.items():  # checked, then warm
        assert np.array_equal(run()["%4"], expected), name
        run()
    times: dict[str, list[float]] = {name: [] for name in cases}
    for _ in range(rounds):
        for name, run in cases.items():
            started = time.perf_counter()
            run()
            times[name].append((time.perf_counter() - started) * 1e3)
    c = small.run(inputs=inputs, banks=rs, chunks="auto").plan.chunking
    print(f"whole working set {whole_bytes / 2**20:.1f} MiB; auto: {c.count} slices of {c.size} along {c.symbol}")
    for name, v in times.items():
        v.sort()
        print(f"{name:<24} min {v[0]:7.2f}  median {v[len(v) // 2]:7.2f}")


if __name__ == "__main__":
    main(int(sys.argv[1]) if len(sys.argv) > 1 else 30)
