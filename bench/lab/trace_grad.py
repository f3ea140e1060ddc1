"""Where a gradient's time goes on the cpu backend: the split backward (save-all) of one
bench/training.py case, the whole vjp program with ``--whole``, the split forward (which keeps
what the backward reads) with ``--forward`` or the plain program with ``--plain``, per kernel group
(``trace=True``), medians over repeated runs, largest first; then the untraced run's median.

    python bench/lab/trace_grad.py block-B1-S512 [--whole | --forward | --plain] [--top 20] [--reps 7]
"""
from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from bench import training  # noqa: E402


def main() -> None:
    import runtime

    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("case", help=f"of: {', '.join(training.GRAD_CASES)}")
    mode = p.add_mutually_exclusive_group()
    mode.add_argument("--whole", action="store_true", help="the whole vjp program (forward and backward)")
    mode.add_argument("--forward", action="store_true", help="the split forward (save-all)")
    mode.add_argument("--plain", action="store_true", help="the program itself")
    p.add_argument("--top", type=int, default=20)
    p.add_argument("--reps", type=int, default=7)
    args = p.parse_args()
    case = training.resolve(args.case)
    values = training.data(case)
    prog = training.program(case)
    g = runtime.vjp(prog, wrt=training.wrt(case, values))
    inputs, banks = values["inputs"], values["banks"]
    if args.plain:
        program, given = prog, inputs
    elif args.whole:
        (cotangent,) = g.cotangents.values()
        program, given = g.program, {**inputs, cotangent: values["cotangent"]}
    elif args.forward:
        program, given = g.split("save-all").forward, inputs
    else:
        sp = g.split("save-all")
        forward = runtime.compile(sp.forward, "cpu")
        kept = training._saved(forward.run(inputs=inputs, banks=forward.load_banks(
            {n: banks[n] for n in training._bank_names(sp.forward)})), sp)
        program = sp.backward
        given = {**{n: inputs[n] for n in sp.bindings if n in inputs}, **{n: np.array(a) for n, a in kept.items()},
                 sp.cotangents[prog["outputs"][0]]: values["cotangent"]}
    exe = runtime.compile(program, "cpu")
    resident = exe.load_banks({n: banks[n] for n in training._bank_names(program)})
    for _ in range(10):  # (the kernels compile on the first run, the compiled drivers after a few)
        exe.run(inputs=given, banks=resident)
    exe.wait_compiled()
    groups: dict[int, tuple[dict, list[float]]] = {}
    for _ in range(args.reps):
        for k, record in enumerate(exe.run(inputs=given, banks=resident, trace=True).trace):
            groups.setdefault(k, (record, []))[1].append(record["ms"])
    rows = sorted(((statistics.median(ms), record) for record, ms in groups.values()), key=lambda r: -r[0])
    for ms, record in rows[:args.top]:
        atoms = "+".join(a.split("/")[-1].split("@")[0].replace("formula-atom-", "") for a in record["atoms"])
        print(f"{ms:8.3f} ms  {record['output']:>10}  {atoms}")
    times = []
    for _ in range(15):
        started = time.perf_counter()
        exe.run(inputs=given, banks=resident)
        times.append((time.perf_counter() - started) * 1e3)
    print(f"{len(rows)} groups, {sum(ms for ms, _ in rows):.2f} ms traced; a run untraced: {statistics.median(times):.2f} ms")


if __name__ == "__main__":
    main()
