"""Where a seed run's time goes: per kernel group (``trace=True``), the binding checks (full,
and as repeated runs do them), and
group 2 into a reused vs a fresh output array (first touch). One process, cpu backend.

    python bench/lab/trace_seed.py 8192
"""
from __future__ import annotations

import sys
import time
from pathlib import Path

import numpy as np

import runtime
from runtime.execution.bindings import bind_values

SEED = Path(__file__).resolve().parents[2] / "examples" / "seed-lora-silu.program.json"


def median_ms(fn, reps: int) -> float:
    fn()
    times = []
    for _ in range(reps):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return 1e3 * float(np.median(times))


def main(T: int, reps: int = 20) -> None:
    rng = np.random.default_rng(0)
    x = rng.standard_normal((1, T, 1024), dtype=np.float32)
    base = rng.standard_normal((1, T, 1024), dtype=np.float32)
    banks = {"lora.A": (rng.standard_normal((32, 1024)) * 0.03).astype(np.float32),
             "lora.B": (rng.standard_normal((1024, 32)) * 0.1).astype(np.float32)}
    inputs = {"x": x, "base": base, "lora.gain": np.float32(0.7)}
    exe = runtime.compile(SEED, "cpu", tiered=False)
    exe.run(inputs=inputs, banks=banks)
    per_group: dict[str, list[float]] = {}
    for _ in range(reps):
        for rec in exe.run(inputs=inputs, banks=banks, trace=True).trace:
            per_group.setdefault("+".join(rec["instructions"]), []).append(rec["ms"])
    print(f"T={T}: whole run {median_ms(lambda: exe.run(inputs=inputs, banks=banks), reps):.2f} ms")
    for name, ms in per_group.items():
        print(f"  group {name}: {np.median(ms):.2f} ms")
    print(f"  binding checks, full path: {median_ms(lambda: bind_values(exe.program, inputs, banks), reps):.2f} ms")
    print(f"  binding checks as a repeated run does them (structure known; the finiteness of "
          f"{sorted(next(iter(exe._plans.values())).deferred_finite)} left to the kernel): "
          f"{median_ms(lambda: exe._binder.bind(inputs, banks), reps):.2f} ms")
    compiled = next(iter(exe._plans.values()))
    launch = compiled.launches[-1]
    values = {**inputs, **banks, "lora.gain": np.asarray(inputs["lora.gain"]),
              compiled.launches[0].output: rng.standard_normal((1, T, 32), dtype=np.float32)}
    extras = [align(values[s]) for s, align in zip(launch.extras, launch.aligners)]
    out = np.empty(launch.output_type.shape, np.float32)
    run = lambda o: launch.kernel([values[s] for s in launch.inputs], extras, o)
    print(f"  last group into a reused output: {median_ms(lambda: run(out), reps):.2f} ms")
    print(f"  last group into a fresh output:  "
          f"{median_ms(lambda: run(np.empty(launch.output_type.shape, np.float32)), reps):.2f} ms")


if __name__ == "__main__":
    main(int(sys.argv[1]) if len(sys.argv) > 1 else 8192)
