"""Per-run time of bench/blocks.py's quick-size cases on the cpu backend (one process,
``exe.run`` medians): at these extents the kernels do next to nothing, so this is what the
runtime itself costs per run (launching kernel groups from Python or compiled drivers,
views, checks). Also how the plan runs (compiled segments, launches from Python) and how
long the drivers took to be ready after the run that started them (a compile with an empty
``FORMULA_CACHE_DIR``, a disk-cache load otherwise).

    python bench/lab/run_overhead.py [--runs 500]
"""
from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from bench import blocks  # noqa: E402


def main() -> None:
    import runtime
    from runtime.execution.compiled import DRIVER_AFTER_RUNS

    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--runs", type=int, default=500)
    args = p.parse_args()
    for case in blocks.cases(quick=True):
        if case.kind != "block":
            continue
        values = blocks.data(case)
        exe = runtime.compile(blocks.program(case), "cpu", tiered=False)
        banks = exe.load_banks(values["banks"])
        for _ in range(DRIVER_AFTER_RUNS):
            exe.run(inputs=values["inputs"], banks=banks)
        started = time.perf_counter()
        exe.wait_compiled()  # (the compiled drivers build in the background)
        waited = time.perf_counter() - started
        times = []
        for _ in range(args.runs):
            t = time.perf_counter()
            exe.run(inputs=values["inputs"], banks=banks)
            times.append(time.perf_counter() - t)
        plan = exe.plan({})  # (static extents)
        groups = len(plan.groups) - len(getattr(plan, "views", ()))  # (trees before views had none)
        driver = next(iter(exe._plans.values())).driver()
        parts = driver.parts if driver is not None else range(groups)
        segments = sum(not isinstance(p, int) for p in parts)
        print(f"{case.name}: {statistics.median(times) * 1e6:.1f} µs per run, {groups} kernel groups, "
              f"{segments} compiled segment(s), {len(parts) - segments} launched from Python; "
              f"waited {waited:.2f} s for the drivers after run {DRIVER_AFTER_RUNS}")


if __name__ == "__main__":
    main()
