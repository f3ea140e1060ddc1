"""Where the first run at a new extent goes, in one process: the transformer block of
bench/first_result.py (``new_extent``), warmed at S=64, then at each new S the first run split
into the binding checks, the plan build (its schedule part apart), taking the arena and the
execution, against the same run's next two.

    python bench/lab/new_extent_cost.py [--extents 100,300,77] [--runs 3] [--drivers] [--new-banks] [--fresh-arenas]

Each run's line also gives the page faults it took (``getrusage``'s minor faults), and a first
run's line the plan build's kernel factories, per anchor atom (``chain``: an anchorless chain).
``--fresh-arenas``: every new plan allocates its own arena (``TAKE_ARENA_BYTES`` out of reach).
"""
from __future__ import annotations

import argparse
import collections
import resource
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from bench import first_result, transformer  # noqa: E402


def main() -> None:
    import runtime
    from runtime.execution import bindings, compiled, launches

    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--extents", default="100,300,77")
    p.add_argument("--runs", type=int, default=3, help="runs at each extent")
    p.add_argument("--drivers", action="store_true",
                   help="S=64 runs until its plan's compiled drivers build (DRIVER_AFTER_RUNS), not 3 times")
    p.add_argument("--fresh-arenas", action="store_true", help="no plan takes another's idle arena")
    p.add_argument("--new-banks", action="store_true",
                   help="new bank arrays at each extent too (by default the first extent's: a served "
                        "program keeps its weights)")
    args = p.parse_args()
    spent: collections.Counter = collections.Counter()
    factories: collections.Counter = collections.Counter()
    if args.fresh_arenas:
        compiled.TAKE_ARENA_BYTES = 1 << 62

    def timed(cls, name: str, tag: str) -> None:
        original = getattr(cls, name)

        def wrapper(self, *a, **k):
            started = time.perf_counter()
            try:
                return original(self, *a, **k)
            finally:
                spent[tag] += (time.perf_counter() - started) * 1e3
        setattr(cls, name, wrapper)

    timed(bindings.Binder, "bind", "bind")
    timed(compiled.PlanBuilder, "build", "build")
    timed(compiled.PlanBuilder, "schedule", "schedule")
    timed(compiled.CompiledPlan, "acquire_arena", "arena")
    timed(launches.Launcher, "execute", "execute")
    launch = compiled.PlanBuilder._launch

    def factory(self, group, *a, **k):
        started = time.perf_counter()
        try:
            return launch(self, group, *a, **k)
        finally:
            factories[group.anchor.atom.name if group.anchor is not None else "chain"] += \
                (time.perf_counter() - started) * 1e3
    compiled.PlanBuilder._launch = factory
    dims = first_result.BLOCK_DIMS
    exe = runtime.compile(transformer.transformer_block_program(full=True, dims=dims), "cpu")
    data = transformer.transformer_block_data(64, full=True, dims=dims)
    for _ in range(compiled.DRIVER_AFTER_RUNS if args.drivers else 3):
        exe.run(**data)
    exe.wait_compiled()
    exe.warm()
    banks = data["banks"]
    for s in (int(v) for v in args.extents.split(",")):
        if args.new_banks:
            data = transformer.transformer_block_data(s, full=True, dims=dims)
        else:  # (only the inputs made: a whole new set of weights would evict the served ones)
            data = {"inputs": transformer.transformer_block_inputs(s, dims["D"], np.random.default_rng(s)),
                    "banks": banks}
        for k in range(args.runs):
            spent.clear()
            factories.clear()
            faults = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
            started = time.perf_counter()
            exe.run(**data)
            total = (time.perf_counter() - started) * 1e3
            faults = resource.getrusage(resource.RUSAGE_SELF).ru_minflt - faults
            parts = ", ".join(f"{tag} {spent[tag]:.2f}" + (f" (schedule {spent['schedule']:.2f})" if tag == "build" else "")
                              for tag in ("bind", "build", "arena", "execute") if tag in spent)
            print(f"S={s} run {k + 1}: {total:.2f} ms ({parts}; {faults} page faults)")
            if factories:
                print("    kernel factories: " + ", ".join(f"{name} {ms:.2f}" for name, ms in factories.most_common()))


if __name__ == "__main__":
    main()
