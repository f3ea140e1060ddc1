"""What ``run(check_outputs=True)`` costs on the seed against an unchecked run (cpu, B=1):
both interleaved in one process, the best of two medians each.

    python bench/lab/output_check_cost.py [REPEATS]
"""
import statistics
import sys
import time
from pathlib import Path

import runtime
from runtime.testing import random_values

SEED = str(Path(__file__).resolve().parents[2] / "examples" / "seed-lora-silu.program.json")


def median_ms(exe, inputs, banks, check: bool, repeats: int) -> float:
    for _ in range(5):
        exe.run(inputs=inputs, banks=banks, check_outputs=check)
    times = []
    for _ in range(repeats):
        started = time.perf_counter()
        exe.run(inputs=inputs, banks=banks, check_outputs=check)
        times.append((time.perf_counter() - started) * 1e3)
    return statistics.median(times)


def main(repeats: int = 300) -> None:
    for s in (1, 64, 512):
        exe = runtime.compile(SEED, "cpu", tiered=False)
        inputs, banks = random_values(SEED, {"B": 1, "S": s}, seed=0)
        got = {False: [], True: []}
        for check in (False, True, False, True):
            got[check].append(median_ms(exe, inputs, banks, check, repeats))
        off, on = min(got[False]), min(got[True])
        print(f"S={s}: unchecked {off:.4f} ms, check_outputs {on:.4f} ms, ratio {on / off:.2f}")


if __name__ == "__main__":
    main(int(sys.argv[1]) if len(sys.argv) > 1 else 300)
