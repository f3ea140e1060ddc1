"""Per-run time of bench/blocks.py's quick-size cases on the cpu backend (one process,
``exe.run`` medians): at these extents the kernels do next to nothing, so this is what the
runtime itself costs per run (launching each kernel group from Python, views, checks).

    python bench/tools/run_overhead.py [--runs 500]
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

    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--runs", type=int, default=500)
    args = p.parse_args()
    for case in blocks.cases(quick=True):
        if case.kind != "block":
            continue
        values = blocks.data(case)
        exe = runtime.compile(blocks.program(case), "cpu", tiered=False)
        banks = exe.load_banks(values["banks"])
        for _ in range(5):
            exe.run(inputs=values["inputs"], banks=banks)
        times = []
        for _ in range(args.runs):
            t = time.perf_counter()
            exe.run(inputs=values["inputs"], banks=banks)
            times.append(time.perf_counter() - t)
        plan = exe.plan({})  # (static extents)
        groups = len(plan.groups) - len(getattr(plan, "views", ()))  # (trees before views had none)
        print(f"{case.name}: {statistics.median(times) * 1e6:.1f} µs per run, {groups} kernel groups")


if __name__ == "__main__":
    main()
