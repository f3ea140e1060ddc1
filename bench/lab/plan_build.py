"""The plan build of a new extent alone: the transformer block of bench/first_result.py, its
kernels loaded at S=64, then its plan built (``PlanBuilder.build``: the schedule and the kernel
factories, nothing compiled, nothing run) at ``--count`` new extents in turn; the median ms of a
build and of its schedule.

    python bench/lab/plan_build.py [--count 40] [--rounds 5]

Each round builds the extents S = 65 .. 64 + count again (a new builder cache: nothing is
found built); the figure is the median over rounds of each round's mean.
"""
from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from bench import first_result, transformer  # noqa: E402


def main() -> None:
    import runtime
    from runtime.execution import compiled

    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--count", type=int, default=40)
    p.add_argument("--rounds", type=int, default=5)
    args = p.parse_args()
    dims = first_result.BLOCK_DIMS
    exe = runtime.compile(transformer.transformer_block_program(full=True, dims=dims), "cpu", tiered=False)
    data = transformer.transformer_block_data(64, full=True, dims=dims)
    for _ in range(3):
        exe.run(**data)
    exe.wait_compiled()
    exe.warm()
    builder = exe._builder
    spent = {"schedule": 0.0}
    schedule = compiled.PlanBuilder.schedule

    def timed(self, *a, **k):
        started = time.perf_counter()
        try:
            return schedule(self, *a, **k)
        finally:
            spent["schedule"] += time.perf_counter() - started
    compiled.PlanBuilder.schedule = timed
    builds, schedules = [], []
    for _ in range(args.rounds):
        spent["schedule"] = 0.0
        started = time.perf_counter()
        for s in range(65, 65 + args.count):
            builder.build({"T": s}, {}, frozenset())
        builds.append((time.perf_counter() - started) * 1e3 / args.count)
        schedules.append(spent["schedule"] * 1e3 / args.count)
    print(f"a build {statistics.median(builds):.2f} ms (its schedule {statistics.median(schedules):.2f} ms), "
          f"median of {args.rounds} rounds of {args.count} extents")


if __name__ == "__main__":
    main()
