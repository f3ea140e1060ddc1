"""Fit a tiny language model (examples/tiny-lm.program.json) with cross-entropy and AdamW.

The program is token embeddings (lookup), one pre-norm transformer block (RMS norm, causal
4-head attention, gelu MLP), a final RMS norm and the logits against an unembedding bank; its
banks are the weights. runtime.torch.Module makes them torch parameters, the program and its
gradient run on the runtime's cpu backend, and torch computes the loss (F.cross_entropy on the
program's logits) and the AdamW update. The text comes from a random Markov chain over 64
tokens with two likely successors per token, so the loss falls from ln 64 ≈ 4.16 towards the
chain's entropy (printed).

    python examples/fit_transformer.py                 # 150 steps, well under a minute

Each line prints the mean loss of the steps since the line before.
    python examples/fit_transformer.py --steps 20      # fewer
    python examples/fit_transformer.py --write         # rebuild examples/tiny-lm.program.json
"""
from __future__ import annotations

import argparse
import math
import sys
import time
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
PROGRAM = HERE / "tiny-lm.program.json"
DIMS = {"V": 64, "D": 64, "H": 4, "Dh": 16, "F": 256}
ACC = {"accumulation_dtype": "float32"}


def build_program() -> dict:
    """The tiny LM over symbolic batch B and length S (K: the keys' axis, S renamed)."""
    from runtime import ProgramBuilder

    v, d, h, dh, f = (DIMS[k] for k in ("V", "D", "H", "Dh", "F"))
    b = ProgramBuilder("float32")
    ids = b.input("ids", {"B": "B", "S": "S"}, "int64")
    mask = b.input("causal_mask", {"S": "S", "K": "S"}, "boolean")
    eps = b.input("epsilon", {})
    qscale = b.input("query_scale", {})  # Dh^-1/2: programs hold no literals
    emb = b.bank("embedding", {"V": v, "D": d})
    g1, g2, gf = (b.bank(n, {"D": d}) for n in ("norm1_gain", "norm2_gain", "final_gain"))
    wq, wk, wv = (b.bank(n, {"H": h, "Dh": dh, "D": d}) for n in ("wq", "wk", "wv"))
    wo = b.bank("wo", {"D": d, "H": h, "Dh": dh})
    w1, w2 = b.bank("w1", {"F": f, "D": d}), b.bank("w2", {"D": d, "F": f})
    unembed = b.bank("unembed", {"V": v, "D": d})

    def contract(left, right, pairs, out_axes):
        return b.op("contract", [left, right], {"reduce_axes": [list(p) for p in pairs],
                                               "output_axes": out_axes, **ACC})

    def rms_norm(x, gain):  # x · rsqrt(mean(x²) + eps) · gain over D
        ms = b.op("reduce@2", [b.op("scale", [x, x], {"factor_axes": ["B", "S", "D"], **ACC})],
                  {"axis": "D", "mode": "mean", **ACC})
        eps_rows = b.op("broadcast", [eps], {"output_axes": ["B", "S"], "output_sizes": ["B", "S"]})
        inv = b.op("scalar-map@2", [b.op("add", [ms, eps_rows], dict(ACC))], {"mode": "rsqrt", **ACC})
        normed = b.op("scale", [x, inv], {"factor_axes": ["B", "S"], **ACC})
        return b.op("scale", [normed, gain], {"factor_axes": ["D"], **ACC})

    x = b.op("lookup", [emb, ids], {"table_axis": "V", "output_axes": ["B", "S", "D"]})
    hn = rms_norm(x, g1)
    heads = ["B", "S", "H", "Dh"]
    q = b.op("scale", [contract(hn, wq, [("D", "D")], heads), qscale], {"factor_axes": [], **ACC})
    as_keys = {"output_axes": ["B", "K", "H", "Dh"], "output_sizes": ["B", "S", h, dh]}
    k, vv = (b.op("reshape", [contract(hn, w, [("D", "D")], heads)], as_keys) for w in (wk, wv))
    scores = contract(q, k, [("Dh", "Dh")], ["B", "H", "S", "K"])
    p = b.op("masked-softmax", [scores, mask], {"axis": "K", **ACC})
    att = contract(p, vv, [("K", "K")], heads)
    x2 = b.op("add", [x, contract(att, wo, [("H", "H"), ("Dh", "Dh")], ["B", "S", "D"])], dict(ACC))
    hidden = b.op("scalar-map", [contract(rms_norm(x2, g2), w1, [("D", "D")], ["B", "S", "F"])], {"mode": "gelu"})
    x3 = b.op("add", [x2, contract(hidden, w2, [("F", "F")], ["B", "S", "D"])], dict(ACC))
    logits = contract(rms_norm(x3, gf), unembed, [("D", "D")], ["B", "S", "V"])
    return b.build([logits])


def initial_banks(seed: int = 0) -> dict[str, np.ndarray]:
    """Weights scaled by 1/sqrt(fan-in); gains 1."""
    rng = np.random.default_rng(seed)
    v, d, h, dh, f = (DIMS[k] for k in ("V", "D", "H", "Dh", "F"))

    def normal(shape, fan_in):
        return (rng.standard_normal(shape) / math.sqrt(fan_in)).astype(np.float32)

    ones = np.ones(d, np.float32)
    return {"embedding": normal((v, d), 1), "norm1_gain": ones, "norm2_gain": ones.copy(),
            "final_gain": ones.copy(), "wq": normal((h, dh, d), d), "wk": normal((h, dh, d), d),
            "wv": normal((h, dh, d), d), "wo": normal((d, h, dh), h * dh), "w1": normal((f, d), d),
            "w2": normal((d, f), f), "unembed": normal((v, d), d)}


def markov_chain(seed: int = 1) -> tuple[np.ndarray, float]:
    """Transition probabilities (each token: two successors at 0.45, the rest share 0.1) and
    the chain's entropy rate in nats, the loss a perfect model reaches."""
    rng = np.random.default_rng(seed)
    v = DIMS["V"]
    probs = np.full((v, v), 0.1 / (v - 2))
    for t in range(v):
        probs[t, rng.choice(v, 2, replace=False)] = 0.45
    row_entropy = -(probs * np.log(probs)).sum(1)
    stationary = np.linalg.matrix_power(probs.T, 200) @ np.full(v, 1 / v)
    return probs, float(stationary @ row_entropy)


def sample(probs: np.ndarray, rng: np.random.Generator, batch: int, length: int) -> np.ndarray:
    """``batch`` token sequences of ``length + 1`` from the chain."""
    cum = probs.cumsum(1)
    seq = np.empty((batch, length + 1), np.int64)
    seq[:, 0] = rng.integers(0, probs.shape[0], batch)
    for t in range(length):
        u = rng.random(batch)[:, None]
        seq[:, t + 1] = np.minimum((u > cum[seq[:, t]]).sum(1), probs.shape[0] - 1)
    return seq


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--steps", type=int, default=150)
    p.add_argument("--batch", type=int, default=16)
    p.add_argument("--length", type=int, default=32)
    p.add_argument("--lr", type=float, default=3e-3)
    p.add_argument("--backend", default="cpu")
    p.add_argument("--every", type=int, default=10, help="print the loss every this many steps")
    p.add_argument("--write", action="store_true", help=f"rebuild {PROGRAM.name} and exit")
    args = p.parse_args(argv)
    if args.write:
        import json

        PROGRAM.write_text(json.dumps(build_program(), indent=1) + "\n")
        print(f"wrote {PROGRAM}")
        return 0

    import torch
    import torch.nn.functional as F

    import runtime.torch

    torch.manual_seed(0)
    t0 = time.perf_counter()
    module = runtime.torch.Module(PROGRAM, banks=initial_banks(), backend=args.backend)
    opt = torch.optim.AdamW(module.parameters(), lr=args.lr, weight_decay=0.01)
    probs, floor = markov_chain()
    rng = np.random.default_rng(2)
    fixed = {"causal_mask": np.tril(np.ones((args.length, args.length), dtype=bool)),
             "epsilon": np.float32(1e-6), "query_scale": np.float32(DIMS["Dh"] ** -0.5)}
    print(f"tiny LM: {sum(q.numel() for q in module.parameters())} parameters in {len(module.banks)} banks; "
          f"loss starts near ln {DIMS['V']} = {math.log(DIMS['V']):.2f}, the chain's entropy is {floor:.2f}")
    window: list[float] = []  # each batch is fresh text: the mean since the last line reads steadier
    for step in range(1, args.steps + 1):
        seq = torch.from_numpy(sample(probs, rng, args.batch, args.length))
        logits = module(ids=seq[:, :-1].contiguous(), **fixed)[module.program.outputs[0]]
        loss = F.cross_entropy(logits.reshape(-1, DIMS["V"]), seq[:, 1:].reshape(-1))
        opt.zero_grad()
        loss.backward()
        opt.step()
        window.append(loss.item())
        if step == 1 or step % args.every == 0 or step == args.steps:
            print(f"step {step:4d}  loss {sum(window) / len(window):.4f}  ({time.perf_counter() - t0:.1f} s)",
                  flush=True)
            window.clear()
    return 0


if __name__ == "__main__":
    sys.exit(main())
