"""Fit the seed's LoRA adapter (examples/seed-lora-silu.program.json) to a target with AdamW.

The program computes ``base + gain · (silu(x·Aᵀ)·Bᵀ)``; its banks A and B are the adapter.
runtime.torch.Module makes them torch parameters and runs the program and its gradient on the
runtime's cpu backend; torch computes the mean squared error and the AdamW update. The target
comes from a hidden adapter of the same shape, so the loss can fall towards 0. B starts at 0, as
LoRA initialises it: the adapter starts as the identity on ``base``.

    python examples/fit_lora.py                 # 200 steps at 4 × 64 tokens, a few seconds
    python examples/fit_lora.py --steps 20
"""
from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np

PROGRAM = Path(__file__).resolve().parent / "seed-lora-silu.program.json"
DIN, DOUT, RANK = 1024, 1024, 32


def problem(batch: int, length: int, seed: int = 0) -> dict[str, np.ndarray]:
    """Inputs, the target a hidden adapter makes from them, and the adapter to start from."""
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((batch, length, DIN), dtype=np.float32)
    base = rng.standard_normal((batch, length, DOUT), dtype=np.float32)
    a_true = rng.standard_normal((RANK, DIN), dtype=np.float32) * np.float32(DIN ** -0.5)
    b_true = rng.standard_normal((DOUT, RANK), dtype=np.float32) * np.float32(RANK ** -0.5)
    h = x @ a_true.T
    target = base + np.float32(0.5) * ((h / (1 + np.exp(-h))) @ b_true.T)
    return {"x": x, "base": base, "target": target.astype(np.float32),
            "lora.A": rng.standard_normal((RANK, DIN), dtype=np.float32) * np.float32(DIN ** -0.5),
            "lora.B": np.zeros((DOUT, RANK), np.float32)}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--steps", type=int, default=200)
    p.add_argument("--batch", type=int, default=4)
    p.add_argument("--length", type=int, default=64)
    p.add_argument("--lr", type=float, default=1e-2)
    p.add_argument("--backend", default="cpu")
    p.add_argument("--every", type=int, default=20, help="print the loss every this many steps")
    args = p.parse_args(argv)

    import torch

    import runtime.torch

    t0 = time.perf_counter()
    data = problem(args.batch, args.length)
    module = runtime.torch.Module(PROGRAM, banks={"lora.A": data["lora.A"], "lora.B": data["lora.B"]},
                                  backend=args.backend)
    opt = torch.optim.AdamW(module.parameters(), lr=args.lr, weight_decay=0.0)
    x, base, target = (torch.from_numpy(data[k]) for k in ("x", "base", "target"))
    print(f"LoRA adapter: A {tuple(module.banks['lora.A'].shape)}, B {tuple(module.banks['lora.B'].shape)}, "
          f"{args.batch} × {args.length} tokens of width {DIN}")
    for step in range(1, args.steps + 1):
        out = module(x=x, base=base, **{"lora.gain": 0.5})["%4"]
        loss = ((out - target) ** 2).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
        if step == 1 or step % args.every == 0 or step == args.steps:
            print(f"step {step:4d}  loss {loss.item():.6f}  ({time.perf_counter() - t0:.1f} s)", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
