"""The fused RMS norm against the unfused plan (``FORMULA_FUSED_NORMS=1`` against ``0``), one
process, both executables side by side (alternating runs, medians), banks loaded once: the
blocks of bench/blocks.py.

    python bench/lab/fused_norm_ab.py B1-S128 B1-S512 B4-S512 B1-S2048
"""
from __future__ import annotations

import os
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from bench import blocks  # noqa: E402


def main(names: list[str]) -> None:
    import runtime

    for name in names or ["B1-S128", "B1-S512"]:
        case = next(c for c in blocks.cases() if c.name == name)
        program, data = blocks.program(case), blocks.data(case)
        exes = {}
        for flag in ("0", "1"):
            os.environ["FORMULA_FUSED_NORMS"] = flag  # (read when the plan is built)
            exe = runtime.compile(program, "cpu", tiered=False)
            banks = exe.load_banks(data["banks"])
            for _ in range(12):
                exe.run(inputs=data["inputs"], banks=banks)
            exe.wait_compiled()
            kinds = [g.kind for g in next(iter(exe._plans.values())).plan.kernel_groups]
            assert ("fused-rms-norm" in kinds) == (flag == "1"), kinds
            exes[flag] = (exe, banks)
        times: dict[str, list[float]] = {"unfused": [], "fused": []}
        reps = max(20, int(0.6 / max(1e-4, _once(*exes["1"], data))))
        for _ in range(reps):
            for flag, label in (("0", "unfused"), ("1", "fused")):
                exe, banks = exes[flag]
                t = time.perf_counter()
                exe.run(inputs=data["inputs"], banks=banks)
                times[label].append(time.perf_counter() - t)
        med = {k: statistics.median(v) * 1e3 for k, v in times.items()}
        print(f"{name}: unfused {med['unfused']:.3f} ms, fused {med['fused']:.3f} ms "
              f"({med['unfused'] / med['fused']:.3f}x)", flush=True)


def _once(exe, banks, data) -> float:
    t = time.perf_counter()
    exe.run(inputs=data["inputs"], banks=banks)
    return time.perf_counter() - t


if __name__ == "__main__":
    main(sys.argv[1:])
