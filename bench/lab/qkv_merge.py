"""Issue 38 item 3, q/k/v as one contraction: is one x·[Wq; Wk; Wv]ᵀ faster on the cpu backend than
three x·Wᵀ sharing x? One process, both programs side by side (alternating runs, medians), with
the banks passed per run and loaded once (``load_banks``: resident packs, as a served program
runs them).

    python bench/lab/qkv_merge.py [--tokens 128,512] [--runs 300]

Three contractions of [S, 512]·[8, 64, 512] against one of [S, 512]·[3, 8, 64, 512]; the
merged one's output is [S, 3, 8, 64] (a planner rewrite would hand out its three slices).
"""
from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
import runtime  # noqa: E402
from runtime.build import ProgramBuilder  # noqa: E402

ACC = {"accumulation_dtype": "float32"}
D, H, DH = 512, 8, 64


def three(s: int) -> dict:
    b = ProgramBuilder("float32")
    x = b.input("x", {"S": s, "D": D})
    ws = [b.bank(n, {"H": H, "Dh": DH, "D": D}) for n in ("wq", "wk", "wv")]
    return b.build([b.op("contract", [x, w], {"reduce_axes": [["D", "D"]], "output_axes": ["S", "H", "Dh"], **ACC})
                    for w in ws])


def one(s: int) -> dict:
    b = ProgramBuilder("float32")
    x = b.input("x", {"S": s, "D": D})
    w = b.bank("w", {"Q": 3, "H": H, "Dh": DH, "D": D})
    return b.build([b.op("contract", [x, w], {"reduce_axes": [["D", "D"]], "output_axes": ["S", "Q", "H", "Dh"],
                                              **ACC})])


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--tokens", default="128,512")
    p.add_argument("--runs", type=int, default=300)
    args = p.parse_args()
    rng = np.random.default_rng(0)
    for s in map(int, args.tokens.split(",")):
        x = rng.standard_normal((s, D), np.float32)
        w = rng.standard_normal((3, H, DH, D), np.float32)
        e3, e1 = runtime.compile(three(s), "cpu", tiered=False), runtime.compile(one(s), "cpu", tiered=False)
        b3, b1 = {"wq": w[0], "wk": w[1], "wv": w[2]}, {"w": w}
        cases = {"three, banks per run": (e3, b3), "one, banks per run": (e1, b1)}
        for _ in range(20):
            for exe, banks in cases.values():
                exe.run(inputs={"x": x}, banks=banks)
        e3.wait_compiled()
        e1.wait_compiled()
        cases.update({"three, loaded banks": (e3, e3.load_banks(b3)), "one, loaded banks": (e1, e1.load_banks(b1))})
        times: dict[str, list[float]] = {k: [] for k in cases}
        for _ in range(args.runs):
            for name, (exe, banks) in cases.items():
                t = time.perf_counter()
                exe.run(inputs={"x": x}, banks=banks)
                times[name].append(time.perf_counter() - t)
        print(f"S={s}: " + ", ".join(f"{k} {statistics.median(v) * 1e3:.3f} ms" for k, v in times.items()), flush=True)


if __name__ == "__main__":
    main()
