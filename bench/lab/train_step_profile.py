"""One training case's runtime.torch.Module step in this process, after its compiled drivers
are built: step times, then a cProfile of one step (forward and backward drivers, torch's
share).

    python bench/lab/train_step_profile.py mlp-T4096      # or seed-T8192, block-B1-S512
"""
from __future__ import annotations

import cProfile
import pstats
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from bench import training  # noqa: E402


def main(name: str) -> None:
    case = training.resolve(name)
    trainer = training.runtime_trainer("cpu", case, training.data(case))
    trainer.warm()
    times = []
    for _ in range(3):
        t = time.perf_counter()
        trainer.step()
        times.append(time.perf_counter() - t)
    print("step ms", [round(x * 1e3) for x in times])
    profile = cProfile.Profile()
    profile.enable()
    trainer.step()
    profile.disable()
    pstats.Stats(profile).sort_stats(sys.argv[2] if len(sys.argv) > 2 else "cumulative").print_stats(25)


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else "mlp-T4096")
