"""A pre-norm transformer block as one formula program, with its data.

RMS norm (``reduce@2`` mean of x·x, then rsqrt), causal multi-head attention with rotary
positions on queries and keys, and a gated MLP ``(silu(h·W1ᵀ) · softplus(h·W3ᵀ))·W2ᵀ`` whose
down projection runs in a float16 section (``cast@1`` there and back).

``full=False`` builds what runs before the scalar-map@2 and cast@1 atoms exist: rsqrt and
silu through scalar-map@1, the gate without softplus, the down projection in float32.

``python -m bench.transformer`` rewrites ``examples/transformer-block.program.json``.
"""
from __future__ import annotations

import json
import math
from typing import Any

import numpy as np

from bench.programs import REPO, Builder

EXAMPLE_PATH = REPO / "examples" / "transformer-block.program.json"
DIMS = {"D": 64, "H": 4, "Dh": 16, "F": 128}
EPSILON = 1e-6
ACC = {"accumulation_dtype": "float32"}


def _contract(b: Builder, left: str, right: str, pairs, out_axes: dict, dtype: str | None = None) -> str:
    return b.op("contract", [left, right], {"reduce_axes": [list(p) for p in pairs],
                                           "output_axes": list(out_axes), **ACC}, out_axes, dtype)


def _scalar(b: Builder, x: str, mode: str, axes: dict, full: bool) -> str:
    if full:
        return b.op("scalar-map@2", [x], {"mode": mode, **ACC}, axes)
    return b.op("scalar-map", [x], {"mode": mode}, axes)


def _rms_norm(b: Builder, x: str, gain: str, eps: str, t: str, d: int, full: bool) -> str:
    rows, square = {"T": t}, {"T": t, "D": d}
    sq = b.op("scale", [x, x], {"factor_axes": ["T", "D"], **ACC}, square)
    ms = b.op("reduce@2", [sq], {"axis": "D", "mode": "mean", **ACC}, rows)
    shifted = b.op("add", [ms, b.op("broadcast", [eps], {"output_axes": ["T"], "output_sizes": [t]}, rows)],
                   dict(ACC), rows)
    inv = _scalar(b, shifted, "rsqrt", rows, full)
    return b.op("scale", [b.op("scale", [x, inv], {"factor_axes": ["T"], **ACC}, square), gain],
                {"factor_axes": ["D"], **ACC}, square)


def transformer_block_program(full: bool = True, dims: dict[str, int] | None = None, tokens: str = "T") -> dict:
    """The block over ``tokens`` rows (a symbol by default); its one output is [T, D]."""
    d, h, dh, f = (dict(DIMS, **(dims or {}))[k] for k in ("D", "H", "Dh", "F"))
    t = tokens
    b = Builder("float32")
    x = b.input("x", {"T": t, "D": d})
    pos = b.input("positions", {"T": t}, "int64")
    mask = b.input("causal_mask", {"T": t, "S": t}, "boolean")
    eps = b.input("epsilon", {})
    g1, g2 = b.bank("norm1_gain", {"D": d}), b.bank("norm2_gain", {"D": d})
    wq, wk, wv = (b.bank(name, {"H": h, "Dh": dh, "D": d}) for name in ("wq", "wk", "wv"))
    wo = b.bank("wo", {"D": d, "H": h, "Dh": dh})
    w1, w3 = b.bank("w1", {"F": f, "D": d}), b.bank("w3", {"F": f, "D": d})
    w2 = b.bank("w2", {"D": d, "F": f}, "float16" if full else None)

    heads, keys = {"T": t, "H": h, "Dh": dh}, {"S": t, "H": h, "Dh": dh}
    hn = _rms_norm(b, x, g1, eps, t, d, full)
    q, k, v = (_contract(b, hn, w, [("D", "D")], heads) for w in (wq, wk, wv))  # wq is prescaled by Dh^-1/2
    rotary = {"feature_axis": "Dh", "base": 10000.0}
    q = b.op("position-rotary", [q, pos], rotary, heads)
    k = b.op("position-rotary", [k, pos], rotary, heads)
    as_keys = {"output_axes": ["S", "H", "Dh"], "output_sizes": [t, h, dh]}
    k, v = (b.op("reshape", [z], as_keys, keys) for z in (k, v))
    scores = _contract(b, q, k, [("Dh", "Dh")], {"T": t, "H": h, "S": t})
    p = b.op("masked-softmax", [scores, mask], {"axis": "S", **ACC}, {"T": t, "H": h, "S": t})
    att = _contract(b, p, v, [("S", "S")], heads)
    o = _contract(b, att, wo, [("H", "H"), ("Dh", "Dh")], {"T": t, "D": d})
    x2 = b.op("add", [x, o], dict(ACC), {"T": t, "D": d})

    h2 = _rms_norm(b, x2, g2, eps, t, d, full)
    hidden = {"T": t, "F": f}
    gate = _scalar(b, _contract(b, h2, w1, [("D", "D")], hidden), "silu", hidden, full)
    up = _contract(b, h2, w3, [("D", "D")], hidden)
    if full:
        up = _scalar(b, up, "softplus", hidden, full)
    m = b.op("scale", [gate, up], {"factor_axes": ["T", "F"], **ACC}, hidden)
    if full:  # the down projection in float16, accumulated in float32
        m = b.op("cast", [m], {"dtype": "float16"}, hidden, "float16")
        down = _contract(b, m, w2, [("F", "F")], {"T": t, "D": d}, "float16")
        down = b.op("cast", [down], {"dtype": "float32"}, {"T": t, "D": d})
    else:
        down = _contract(b, m, w2, [("F", "F")], {"T": t, "D": d})
    return b.build([b.op("add", [x2, down], dict(ACC), {"T": t, "D": d})])


def transformer_block_data(tokens: int, full: bool = True, dims: dict[str, int] | None = None,
                           seed: int = 0) -> dict[str, dict[str, Any]]:
    """Inputs and banks: x ~ N(0, 1), weights scaled by 1/sqrt(fan-in), a causal mask."""
    d, h, dh, f = (dict(DIMS, **(dims or {}))[k] for k in ("D", "H", "Dh", "F"))
    rng = np.random.default_rng(seed)

    def normal(shape, fan_in):
        return (rng.standard_normal(shape) / math.sqrt(fan_in)).astype(np.float32)

    banks = {"norm1_gain": 1 + normal((d,), 16), "norm2_gain": 1 + normal((d,), 16),
             "wq": normal((h, dh, d), d) / np.float32(math.sqrt(dh)), "wk": normal((h, dh, d), d),
             "wv": normal((h, dh, d), d), "wo": normal((d, h, dh), d), "w1": normal((f, d), d),
             "w3": normal((f, d), d), "w2": normal((d, f), f)}
    if full:
        banks["w2"] = banks["w2"].astype(np.float16)
    return {"inputs": transformer_block_inputs(tokens, d, rng), "banks": banks}


def transformer_block_inputs(tokens: int, d: int, rng: np.random.Generator) -> dict[str, Any]:
    """The block's inputs alone (a served program's next request at a new length brings these,
    not a new set of weights: making one would also evict the served weights from the caches)."""
    return {"x": rng.standard_normal((tokens, d)).astype(np.float32),
            "positions": np.arange(tokens, dtype=np.int64),
            "causal_mask": np.tril(np.ones((tokens, tokens), dtype=bool)),
            "epsilon": np.float32(EPSILON)}


def write_example(full: bool = True) -> None:
    EXAMPLE_PATH.write_text(json.dumps(transformer_block_program(full), indent=1) + "\n")


if __name__ == "__main__":
    write_example()
