"""Where a general program's time goes on the cpu backend: per kernel group (``trace=True``),
medians over repeated runs, largest first, with each group's share of their sum. ``--noisy``
traces each case again under bench/run.py's noisy neighbour and adds each group's slowdown.

    python bench/lab/trace_blocks.py B1-S2048 attention-B4-H8-S512 --reps 5 [--noisy]
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from bench import blocks  # noqa: E402


def trace(case_name: str, reps: int) -> list[tuple[str, float]]:
    """(group, median ms) per kernel group, largest first."""
    import runtime

    case = next(c for c in blocks.cases() if c.name == case_name)
    values = blocks.data(case)
    exe = runtime.compile(blocks.program(case), "cpu", tiered=False)
    banks = exe.load_banks(values["banks"])
    exe.run(inputs=values["inputs"], banks=banks)
    atoms = {}
    for ins in blocks.program(case)["instructions"]:
        atom = ins["atom_ref"].split("/")[-1].removeprefix("formula-atom-")
        atoms[ins["instruction_id"]] = atoms[ins["output_slot"]] = atom
    per: dict[str, list[float]] = {}
    for _ in range(reps):
        for rec in exe.run(inputs=values["inputs"], banks=banks, trace=True).trace:
            names = "+".join(f"{s}:{atoms.get(s, '?')}" for s in rec["instructions"])
            per.setdefault(names, []).append(rec["ms"])
    return sorted(((k, float(np.median(v))) for k, v in per.items()), key=lambda kv: -kv[1])


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("cases", nargs="+", help=f"of: {', '.join(c.name for c in blocks.cases())}")
    p.add_argument("--reps", type=int, default=5)
    p.add_argument("--noisy", action="store_true", help="trace again beside a CPU-bound process on one core")
    args = p.parse_args(argv)
    for name in args.cases:
        rows = trace(name, args.reps)
        total = sum(ms for _, ms in rows)
        noisy = {}
        if args.noisy:
            from bench.run import neighbour

            with neighbour():
                noisy = dict(trace(name, args.reps))
        print(f"{name}: {len(rows)} kernel groups, {total:.1f} ms in all"
              + (f"; {sum(noisy.values()):.1f} ms beside the neighbour" if noisy else ""))
        for group, ms in rows:
            slower = f" {noisy[group]:9.2f} ms {noisy[group] / ms:5.2f}x" if group in noisy else ""
            print(f"  {ms:9.2f} ms {100 * ms / total:5.1f} %{slower}  {group}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
