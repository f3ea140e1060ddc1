"""Where a warm seed run's time goes: each fused group alone, both (the compiled driver's
call, no Python), the whole ``exe.run``, and the Python around the driver within each of
those runs (its time minus its own ``Driver.run``), interleaved call by call in one process
(µs; the 10th percentile is the quiet figure on this noisy machine).

    python bench/experiments/seed_kernel_split.py [T] [calls]
"""
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

import runtime  # noqa: E402
from bench.ab_seed import SEED, seed_values  # noqa: E402
from runtime import driver  # noqa: E402
from runtime.driver import build_driver  # noqa: E402


def main(T: int, calls: int) -> None:
    inputs, banks = seed_values(T)
    exe = runtime.compile(SEED, "cpu")
    resident = exe.load_banks(banks)
    for _ in range(5):
        exe.run(inputs=inputs, banks=resident)
    bound = exe._binder.bind(inputs, resident)
    compiled = exe._by_structure[bound.structure]
    values = dict(bound.values)
    values.update(compiled.acquire_arena())
    values["%4"] = np.empty((1, T, 1024), np.float32)
    bindings = frozenset(s for s, b in compiled.plan.buffers.items() if b.kind in ("input", "bank"))
    drivers = {"group 1": build_driver(compiled.launches[:1], bindings),
               "group 2": build_driver(compiled.launches[1:], bindings),
               "both (driver)": build_driver(compiled.launches, bindings)}
    calls_of = {name: (d.call, [values[s] for s in d.slots] + list(d.constants)
                       + [derive(values[s]) for s, derive in d.derived]) for name, d in drivers.items()}
    times = {name: [] for name in [*calls_of, "exe.run", "Python around the driver"]}
    inner = []
    plain_run = driver.Driver.run

    def timed_run(self, values):
        t0 = time.perf_counter()
        found = plain_run(self, values)
        inner.append(time.perf_counter() - t0)
        return found
    driver.Driver.run = timed_run
    for _ in range(calls):
        for name, (call, args) in calls_of.items():
            t0 = time.perf_counter()
            call(*args)
            times[name].append(time.perf_counter() - t0)
        t0 = time.perf_counter()
        result = exe.run(inputs=inputs, banks=resident)
        times["exe.run"].append(time.perf_counter() - t0)
        times["Python around the driver"].append(times["exe.run"][-1] - inner[-1])
        del result
    driver.Driver.run = plain_run
    for name, v in times.items():
        v = np.array(v) * 1e6
        print(f"T={T} {name}: p10 {np.percentile(v, 10):.1f}  p50 {np.median(v):.1f} µs")


if __name__ == "__main__":
    main(int(sys.argv[1]) if len(sys.argv) > 1 else 256, int(sys.argv[2]) if len(sys.argv) > 2 else 3000)
