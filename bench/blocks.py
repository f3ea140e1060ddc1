"""General programs against ONNX Runtime, NumPy and PyTorch: a transformer block, attention
alone, a wide MLP and the §3b gated block (issue 20).

Every case is one formula program plus the same computation written for each peer:

- ``block``: embedding lookup, RMS norm, causal multi-head attention (queries prescaled by
  Dh^-1/2), output projection, residual, RMS norm, MLP D→F→D with exact gelu, residual;
  D=512, 8 heads of 64, F=2048 at (B, S) ∈ {(1,128), (1,512), (4,512), (1,2048)};
- ``attention``: q·kᵀ → causal masked softmax → ·v at B=4, H=8, S=512, Dh=64;
- ``mlp``: gelu(x·W1ᵀ)·W2ᵀ at T=4096, 1024→4096→1024, in float32 and in float16 (peers:
  ONNX Runtime and PyTorch; NumPy has no BLAS for float16);
- ``biased``: the block as GPT-2 writes it: layer norms with a bias (the mean subtracted
  through a broadcast), a bias on every projection, at (B, S) = (1, 512);
- ``gated``: ``bench.transformer``'s full block (rotary, silu·softplus gate, a float16 down
  projection) at D=512, 8×64, F=2048, T=512; its peers are ONNX Runtime and PyTorch (rotary
  written with their own operations) and the reference backend, which stands for NumPy.

ONNX Runtime gets the same graph through ``onnx.helper`` with every weight an initializer
(stored transposed, as deployed ONNX models hold them) and all graph optimisations on;
PyTorch runs eager with ``torch.set_num_threads(2)`` when it is installed.
``quick=True`` shrinks every case (D=64, S≤32) so CI checks all contenders in seconds.

``python bench/blocks.py rss`` prints each contender's peak RSS on the block at (4, 512),
each in a fresh process (``--contenders``, ``--case``).
"""
from __future__ import annotations

import argparse
import json
import math
import resource
import subprocess
import sys
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import attrs
import numpy as np

REPO = Path(__file__).resolve().parent.parent
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from bench.programs import Builder  # noqa: E402

ACC = {"accumulation_dtype": "float32"}
BLOCK_DIMS = {"D": 512, "H": 8, "Dh": 64, "F": 2048, "V": 4096}
QUICK_DIMS = {"D": 64, "H": 4, "Dh": 16, "F": 256, "V": 256}
BLOCK_SIZES = ((1, 128), (1, 512), (4, 512), (1, 2048))
QUICK_SIZES = ((1, 8), (1, 16), (2, 16), (1, 32))  # one per BLOCK_SIZES entry
BLOCK_PEERS = ("numpy", "onnxruntime", "torch")
Values = dict[str, dict[str, Any]]
Fn = Callable[[], Any]


@attrs.frozen
class BlockCase:
    """One benchmark case: its program, data and every contender's computation."""

    name: str  # benchmark group "block-<name>"
    kind: str  # block, attention, mlp, gated
    sizes: Mapping[str, int]
    peers: tuple[str, ...]  # the peers that compute it (others are skipped with a reason)
    rtol: float = 2e-3
    atol: float = 2e-3
    dtype: str = "float32"  # of every floating input, bank and the result
    why_not: str = ""  # why the other peers are left out, when it is not just a missing graph


def cases(quick: bool = False) -> list[BlockCase]:
    """All cases at benchmark sizes, or shrunk for a quick (CI) run."""
    d = QUICK_DIMS if quick else BLOCK_DIMS
    out = [BlockCase(f"B{b}-S{s}", "block", {**d, "B": b, "S": s}, BLOCK_PEERS)
           for b, s in (QUICK_SIZES if quick else BLOCK_SIZES)]
    out.append(BlockCase("biased-B{B}-S{S}".format(**(sz := {**d, "B": 1, "S": 16 if quick else 512})), "biased",
                         sz, BLOCK_PEERS))
    att = {"B": 2, "H": 2, "S": 32, "Dh": 16} if quick else {"B": 4, "H": 8, "S": 512, "Dh": 64}
    out.append(BlockCase("attention-B{B}-H{H}-S{S}".format(**att), "attention", att, BLOCK_PEERS))
    mlp = {"T": 64, "D": 64, "F": 256} if quick else {"T": 4096, "D": 1024, "F": 4096}
    out.append(BlockCase("mlp-T{T}-D{D}-F{F}".format(**mlp), "mlp", mlp, BLOCK_PEERS))
    # float16 storage (the runtime computes in float32, SPEC §3b.1); rounding sets the tolerance
    out.append(BlockCase("mlp-T{T}-D{D}-F{F}-float16".format(**mlp), "mlp", mlp, ("onnxruntime", "torch"),
                         rtol=1e-2, atol=1e-2, dtype="float16",
                         why_not="NumPy has no BLAS for float16 (its matmul loops in C, minutes at this size)"))
    gated = {"T": 32, "D": 64, "H": 4, "Dh": 16, "F": 128} if quick else {"T": 512, **{k: BLOCK_DIMS[k] for k in "D H Dh F".split()}}
    # the float16 down projection's rounding sets the tolerance, as in bench/test_transformer.py
    out.append(BlockCase("gated-T{T}".format(**gated), "gated", gated, ("reference", "onnxruntime", "torch"),
                         rtol=1e-2, atol=1e-2, why_not="no NumPy form of it is written: the reference backend "
                                                       "(NumPy) stands for NumPy"))
    return out


# --- programs --------------------------------------------------------------------------------

def _contract(b: Builder, left: str, right: str, pairs, out_axes: Mapping[str, int]) -> str:
    return b.op("contract", [left, right], {"reduce_axes": [list(p) for p in pairs],
                                           "output_axes": list(out_axes), **ACC}, out_axes)


def _rms_norm(b: Builder, x: str, gain: str, eps: str, rows: Mapping[str, int], d: int) -> str:
    """x · rsqrt(mean(x²) + eps) · gain over the last axis D."""
    full = {**rows, "D": d}
    sq = b.op("scale", [x, x], {"factor_axes": list(full), **ACC}, full)
    ms = b.op("reduce@2", [sq], {"axis": "D", "mode": "mean", **ACC}, rows)
    inv = b.op("scalar-map@2", [b.op("add", [ms, _broadcast(b, eps, rows)], dict(ACC), rows)],
               {"mode": "rsqrt", **ACC}, rows)
    normed = b.op("scale", [x, inv], {"factor_axes": list(rows), **ACC}, full)
    return b.op("scale", [normed, gain], {"factor_axes": ["D"], **ACC}, full)


def _broadcast(b: Builder, x: str, axes: Mapping[str, int]) -> str:
    return b.op("broadcast", [x], {"output_axes": list(axes), "output_sizes": list(axes.values())}, axes)


def _layer_norm(b: Builder, x: str, gain: str, bias: str, eps: str, neg: str, rows: Mapping[str, int], d: int) -> str:
    """(x − mean) · rsqrt(mean((x − mean)²) + eps) · gain + bias over the last axis D."""
    full = {**rows, "D": d}
    mean = b.op("reduce@2", [x], {"axis": "D", "mode": "mean", **ACC}, rows)
    centred = b.op("add", [x, _broadcast(b, b.op("scale", [mean, neg], {"factor_axes": [], **ACC}, rows), full)],
                   dict(ACC), full)
    sq = b.op("scale", [centred, centred], {"factor_axes": list(full), **ACC}, full)
    var = b.op("reduce@2", [sq], {"axis": "D", "mode": "mean", **ACC}, rows)
    inv = b.op("scalar-map@2", [b.op("add", [var, _broadcast(b, eps, rows)], dict(ACC), rows)],
               {"mode": "rsqrt", **ACC}, rows)
    normed = b.op("scale", [b.op("scale", [centred, inv], {"factor_axes": list(rows), **ACC}, full), gain],
                  {"factor_axes": ["D"], **ACC}, full)
    return b.op("add", [normed, _broadcast(b, bias, full)], dict(ACC), full)


def _attention(b: Builder, q: str, k: str, v: str, mask: str, bsz: int, h: int, s: int, dh: int) -> str:
    """q [B,S,H,Dh], k and v [B,K,H,Dh] (K = S), mask [S,K] → [B,S,H,Dh]."""
    scores = _contract(b, q, k, [("Dh", "Dh")], {"B": bsz, "H": h, "S": s, "K": s})
    p = b.op("masked-softmax", [scores, mask], {"axis": "K", **ACC}, {"B": bsz, "H": h, "S": s, "K": s})
    return _contract(b, p, v, [("K", "K")], {"B": bsz, "S": s, "H": h, "Dh": dh})


def block_program(z: Mapping[str, int]) -> dict:
    bsz, s, d, h, dh, f, vocab = (z[k] for k in ("B", "S", "D", "H", "Dh", "F", "V"))
    b = Builder("float32")
    ids = b.input("ids", {"B": bsz, "S": s}, "int64")
    mask = b.input("causal_mask", {"S": s, "K": s}, "boolean")
    eps = b.input("epsilon", {})
    emb = b.bank("embedding", {"V": vocab, "D": d})
    g1, g2 = b.bank("norm1_gain", {"D": d}), b.bank("norm2_gain", {"D": d})
    wq, wk, wv = (b.bank(n, {"H": h, "Dh": dh, "D": d}) for n in ("wq", "wk", "wv"))
    wo = b.bank("wo", {"D": d, "H": h, "Dh": dh})
    w1, w2 = b.bank("w1", {"F": f, "D": d}), b.bank("w2", {"D": d, "F": f})
    rows, full = {"B": bsz, "S": s}, {"B": bsz, "S": s, "D": d}
    x = b.op("lookup", [emb, ids], {"table_axis": "V", "output_axes": ["B", "S", "D"]}, full)
    hn = _rms_norm(b, x, g1, eps, rows, d)
    heads, keys = {"B": bsz, "S": s, "H": h, "Dh": dh}, {"B": bsz, "K": s, "H": h, "Dh": dh}
    q, k, v = (_contract(b, hn, w, [("D", "D")], heads) for w in (wq, wk, wv))
    as_keys = {"output_axes": list(keys), "output_sizes": list(keys.values())}
    k, v = (b.op("reshape", [t], as_keys, keys) for t in (k, v))
    att = _attention(b, q, k, v, mask, bsz, h, s, dh)
    x2 = b.op("add", [x, _contract(b, att, wo, [("H", "H"), ("Dh", "Dh")], full)], dict(ACC), full)
    h2 = _rms_norm(b, x2, g2, eps, rows, d)
    hidden = {"B": bsz, "S": s, "F": f}
    m = b.op("scalar-map", [_contract(b, h2, w1, [("D", "D")], hidden)], {"mode": "gelu"}, hidden)
    return b.build([b.op("add", [x2, _contract(b, m, w2, [("F", "F")], full)], dict(ACC), full)])


def biased_program(z: Mapping[str, int]) -> dict:
    """The block with layer norms and a bias on every projection (GPT-2's form)."""
    bsz, s, d, h, dh, f, vocab = (z[k] for k in ("B", "S", "D", "H", "Dh", "F", "V"))
    b = Builder("float32")
    ids = b.input("ids", {"B": bsz, "S": s}, "int64")
    mask = b.input("causal_mask", {"S": s, "K": s}, "boolean")
    eps, neg = b.input("epsilon", {}), b.input("minus_one", {})
    emb = b.bank("embedding", {"V": vocab, "D": d})
    ln = {n: b.bank(n, {"D": d}) for n in ("ln1_gain", "ln1_bias", "ln2_gain", "ln2_bias", "bo", "b2")}
    wq, wk, wv = (b.bank(n, {"H": h, "Dh": dh, "D": d}) for n in ("wq", "wk", "wv"))
    bq, bk, bv = (b.bank(n, {"H": h, "Dh": dh}) for n in ("bq", "bk", "bv"))
    wo = b.bank("wo", {"D": d, "H": h, "Dh": dh})
    w1, b1, w2 = b.bank("w1", {"F": f, "D": d}), b.bank("b1", {"F": f}), b.bank("w2", {"D": d, "F": f})
    rows, full = {"B": bsz, "S": s}, {"B": bsz, "S": s, "D": d}
    x = b.op("lookup", [emb, ids], {"table_axis": "V", "output_axes": ["B", "S", "D"]}, full)
    hn = _layer_norm(b, x, ln["ln1_gain"], ln["ln1_bias"], eps, neg, rows, d)
    heads, keys = {"B": bsz, "S": s, "H": h, "Dh": dh}, {"B": bsz, "K": s, "H": h, "Dh": dh}
    q, k, v = (b.op("add", [_contract(b, hn, w, [("D", "D")], heads), _broadcast(b, bias, heads)], dict(ACC), heads)
               for w, bias in ((wq, bq), (wk, bk), (wv, bv)))
    as_keys = {"output_axes": list(keys), "output_sizes": list(keys.values())}
    k, v = (b.op("reshape", [t], as_keys, keys) for t in (k, v))
    att = _attention(b, q, k, v, mask, bsz, h, s, dh)
    o = b.op("add", [_contract(b, att, wo, [("H", "H"), ("Dh", "Dh")], full), _broadcast(b, ln["bo"], full)],
             dict(ACC), full)
    x2 = b.op("add", [x, o], dict(ACC), full)
    h2 = _layer_norm(b, x2, ln["ln2_gain"], ln["ln2_bias"], eps, neg, rows, d)
    hidden = {"B": bsz, "S": s, "F": f}
    up = b.op("add", [_contract(b, h2, w1, [("D", "D")], hidden), _broadcast(b, b1, hidden)], dict(ACC), hidden)
    m = b.op("scalar-map", [up], {"mode": "gelu"}, hidden)
    down = b.op("add", [_contract(b, m, w2, [("F", "F")], full), _broadcast(b, ln["b2"], full)], dict(ACC), full)
    return b.build([b.op("add", [x2, down], dict(ACC), full)])


def attention_program(z: Mapping[str, int]) -> dict:
    bsz, h, s, dh = z["B"], z["H"], z["S"], z["Dh"]
    b = Builder("float32")
    q = b.input("q", {"B": bsz, "S": s, "H": h, "Dh": dh})
    k, v = (b.input(n, {"B": bsz, "K": s, "H": h, "Dh": dh}) for n in ("k", "v"))
    mask = b.input("causal_mask", {"S": s, "K": s}, "boolean")
    return b.build([_attention(b, q, k, v, mask, bsz, h, s, dh)])


def mlp_program(z: Mapping[str, int], dtype: str = "float32") -> dict:
    t, d, f = z["T"], z["D"], z["F"]
    b = Builder(dtype)
    x = b.input("x", {"T": t, "D": d})
    w1, w2 = b.bank("w1", {"F": f, "D": d}), b.bank("w2", {"D": d, "F": f})
    m = b.op("scalar-map", [_contract(b, x, w1, [("D", "D")], {"T": t, "F": f})], {"mode": "gelu"}, {"T": t, "F": f})
    return b.build([_contract(b, m, w2, [("F", "F")], {"T": t, "D": d})])


def program(case: BlockCase) -> dict:
    if case.kind == "gated":
        from bench.transformer import transformer_block_program

        dims = {k: case.sizes[k] for k in ("D", "H", "Dh", "F")}
        return transformer_block_program(True, dims, tokens=case.sizes["T"])
    if case.kind == "mlp":
        return mlp_program(case.sizes, case.dtype)
    return {"block": block_program, "biased": biased_program, "attention": attention_program}[case.kind](case.sizes)


# --- data ----------------------------------------------------------------------------------------

def data(case: BlockCase, seed: int = 0) -> Values:
    """Inputs and banks; weights scaled by 1/sqrt(fan-in), queries prescaled by Dh^-1/2."""
    z, rng = case.sizes, np.random.default_rng(seed)
    if case.kind == "gated":
        from bench.transformer import transformer_block_data

        return transformer_block_data(z["T"], True, {k: z[k] for k in ("D", "H", "Dh", "F")}, seed)

    def normal(shape, fan_in=1):
        return (rng.standard_normal(shape) / math.sqrt(fan_in)).astype(case.dtype)

    if case.kind == "mlp":
        return {"inputs": {"x": normal((z["T"], z["D"]))},
                "banks": {"w1": normal((z["F"], z["D"]), z["D"]), "w2": normal((z["D"], z["F"]), z["F"])}}
    s = z["S"]
    mask = np.tril(np.ones((s, s), dtype=bool))
    if case.kind == "attention":
        shape = (z["B"], s, z["H"], z["Dh"])
        return {"inputs": {"q": normal(shape, z["Dh"]), "k": normal(shape), "v": normal(shape),
                           "causal_mask": mask}, "banks": {}}
    d, h, dh, f = z["D"], z["H"], z["Dh"], z["F"]
    banks = {"embedding": normal((z["V"], d)), "norm1_gain": 1 + normal((d,), 16),
             "norm2_gain": 1 + normal((d,), 16), "wq": normal((h, dh, d), d) / np.float32(math.sqrt(dh)),
             "wk": normal((h, dh, d), d), "wv": normal((h, dh, d), d), "wo": normal((d, h, dh), d),
             "w1": normal((f, d), d), "w2": normal((d, f), f)}
    inputs = {"ids": rng.integers(0, z["V"], (z["B"], s), dtype=np.int64), "causal_mask": mask,
              "epsilon": np.float32(1e-6)}
    if case.kind == "biased":  # layer norms' gains and biases; a bias per projection (q's prescaled)
        banks.update({"ln1_gain": banks.pop("norm1_gain"), "ln2_gain": banks.pop("norm2_gain"),
                      "ln1_bias": normal((d,), 16), "ln2_bias": normal((d,), 16),
                      "bq": normal((h, dh), 16) / np.float32(math.sqrt(dh)), "bk": normal((h, dh), 16),
                      "bv": normal((h, dh), 16), "bo": normal((d,), 16), "b1": normal((f,), 16),
                      "b2": normal((d,), 16)})
        inputs["minus_one"] = np.float32(-1)
    return {"inputs": inputs, "banks": banks}


# --- NumPy ------------------------------------------------------------------------------------------

def _gelu_np(x):
    from scipy.special import erf  # NumPy has no erf; scipy is a runtime dependency

    return 0.5 * x * (1 + erf(x * x.dtype.type(1 / math.sqrt(2))))


def _softmax_np(scores, mask):
    z = np.where(mask, scores, -np.inf)
    z = np.exp(z - z.max(axis=-1, keepdims=True))
    return z / z.sum(axis=-1, keepdims=True)


def _attention_np(q, k, v, mask):
    """q, k, v [B,S,H,Dh] → [B,S,H,Dh]."""
    q, k, v = (t.transpose(0, 2, 1, 3) for t in (q, k, v))
    return (_softmax_np(q @ k.transpose(0, 1, 3, 2), mask) @ v).transpose(0, 2, 1, 3)


def _rms_np(x, gain, eps):
    return x / np.sqrt((x * x).mean(axis=-1, keepdims=True) + eps) * gain


def _layer_norm_np(x, gain, bias, eps):
    centred = x - x.mean(axis=-1, keepdims=True)
    return centred / np.sqrt((centred * centred).mean(axis=-1, keepdims=True) + eps) * gain + bias


def numpy_fn(case: BlockCase, v: Values, dtype=None) -> Fn:
    """The case as a NumPy user writes it (``dtype``: evaluate in another dtype, e.g. float64
    for the expected values)."""
    cast = (lambda a: a.astype(dtype) if a.dtype.kind == "f" else a) if dtype else (lambda a: a)
    i = {k: cast(np.asarray(a)) for k, a in v["inputs"].items()}
    w = {k: cast(np.asarray(a)) for k, a in v["banks"].items()}
    if case.kind == "mlp":
        w1t, w2t = w["w1"].T.copy(), w["w2"].T.copy()
        return lambda: _gelu_np(i["x"] @ w1t) @ w2t
    if case.kind == "attention":
        return lambda: _attention_np(i["q"], i["k"], i["v"], i["causal_mask"])
    if case.kind not in ("block", "biased"):
        raise ValueError(case.kind)
    z = case.sizes
    bsz, s, d, h, dh = z["B"], z["S"], z["D"], z["H"], z["Dh"]
    wqkv = np.concatenate([w[n].reshape(h * dh, d) for n in ("wq", "wk", "wv")]).T.copy()
    wot, w1t, w2t = w["wo"].reshape(d, h * dh).T.copy(), w["w1"].T.copy(), w["w2"].T.copy()
    biased = case.kind == "biased"
    if biased:
        w["bqkv"] = np.concatenate([w[n].reshape(h * dh) for n in ("bq", "bk", "bv")])

    def norm(x, k):  # layer k's norm: RMS, or for the biased block a layer norm with a bias
        if biased:
            return _layer_norm_np(x, w[f"ln{k}_gain"], w[f"ln{k}_bias"], i["epsilon"])
        return _rms_np(x, w[f"norm{k}_gain"], i["epsilon"])

    def bias(y, name):
        return y + w[name] if biased else y

    def run():
        x = w["embedding"][i["ids"]]
        qkv = bias(norm(x, 1) @ wqkv, "bqkv").reshape(bsz, s, 3, h, dh)
        att = _attention_np(qkv[:, :, 0], qkv[:, :, 1], qkv[:, :, 2], i["causal_mask"])
        x2 = x + bias(att.reshape(bsz, s, h * dh) @ wot, "bo")
        return x2 + bias(_gelu_np(bias(norm(x2, 2) @ w1t, "b1")) @ w2t, "b2")

    return run


def expected(case: BlockCase, v: Values) -> np.ndarray:
    """What every contender is checked against: NumPy in float64 (the reference backend for
    the gated block)."""
    if case.kind == "gated":
        from bench.contenders import prepare_runtime

        return np.asarray(prepare_runtime("reference", program(case), v["inputs"], v["banks"],
                                          program(case)["outputs"][0])())
    return numpy_fn(case, v, np.float64)()


# --- ONNX Runtime ---------------------------------------------------------------------------------

def onnx_model(case: BlockCase, v: Values):
    """The case as one ONNX graph (opset 17), weights as initializers."""
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    z, fdt = case.sizes, {"float32": TensorProto.FLOAT, "float16": TensorProto.FLOAT16}[case.dtype]
    scalar = np.dtype(case.dtype).type
    nodes, inits = [], []

    def init(name, array):
        inits.append(numpy_helper.from_array(np.ascontiguousarray(array), name))
        return name

    def node(op, ins, out, **attrs_):
        nodes.append(helper.make_node(op, ins, [out], **attrs_))
        return out

    def gelu(x, tag):
        e = node("Erf", [node("Div", [x, init(f"{tag}_sqrt2", scalar(math.sqrt(2)))], f"{tag}_d")], f"{tag}_e")
        one_plus = node("Add", [e, init(f"{tag}_one", scalar(1))], f"{tag}_a")
        half_x = node("Mul", [x, init(f"{tag}_half", scalar(0.5))], f"{tag}_h")
        return node("Mul", [half_x, one_plus], f"{tag}_g")

    def heads(x, tag):  # [B,S,H*Dh] -> [B,H,S,Dh]
        shape = init(f"{tag}_shape", np.array([0, 0, z["H"], z["Dh"]], dtype=np.int64))
        return node("Transpose", [node("Reshape", [x, shape], f"{tag}_r")], f"{tag}_t", perm=[0, 2, 1, 3])

    def attention(q, k, v_, mask, tag):  # [B,H,S,Dh] each
        scores = node("MatMul", [q, node("Transpose", [k], f"{tag}_kt", perm=[0, 1, 3, 2])], f"{tag}_s")
        neg = init(f"{tag}_neg", np.float32(-np.inf))
        p = node("Softmax", [node("Where", [mask, scores, neg], f"{tag}_w")], f"{tag}_p", axis=-1)
        return node("MatMul", [p, v_], f"{tag}_o")

    def rms(x, gain, tag):
        ms = node("ReduceMean", [node("Mul", [x, x], f"{tag}_sq")], f"{tag}_ms", axes=[-1], keepdims=1)
        inv = node("Reciprocal", [node("Sqrt", [node("Add", [ms, "epsilon"], f"{tag}_e")], f"{tag}_r")], f"{tag}_i")
        return node("Mul", [node("Mul", [x, inv], f"{tag}_n"), init(f"{tag}_g", gain)], f"{tag}_o")

    if case.kind == "mlp":
        inputs = [helper.make_tensor_value_info("x", fdt, ["T", z["D"]])]
        h = gelu(node("MatMul", ["x", init("w1t", v["banks"]["w1"].T)], "h"), "g")
        out = node("MatMul", [h, init("w2t", v["banks"]["w2"].T)], "out")
        out_shape = ["T", z["D"]]
    elif case.kind == "attention":
        inputs = [helper.make_tensor_value_info(n, fdt, ["B", "S", z["H"], z["Dh"]]) for n in ("q", "k", "v")]
        inputs.append(helper.make_tensor_value_info("causal_mask", TensorProto.BOOL, ["S", "S"]))
        q, k, v_ = (node("Transpose", [n], f"{n}_t", perm=[0, 2, 1, 3]) for n in ("q", "k", "v"))
        out = node("Transpose", [attention(q, k, v_, "causal_mask", "a")], "out", perm=[0, 2, 1, 3])
        out_shape = ["B", "S", z["H"], z["Dh"]]
    elif case.kind == "gated":
        inputs, out = _onnx_gated(z, v, node, init, rms)
        out_shape = ["T", z["D"]]
    else:
        inputs, out = _onnx_block(case, v, fdt, node, init, heads, attention, gelu, rms)
        out_shape = ["B", "S", z["D"]]
    graph = helper.make_graph(nodes, f"formula_bench_{case.kind}", inputs,
                              [helper.make_tensor_value_info(out, fdt, out_shape)], initializer=inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)],
                              producer_name="formula-runtime-bench")
    model.ir_version = 8
    onnx.checker.check_model(model)
    return model


def _onnx_block(case: BlockCase, v: Values, fdt, node, init, heads, attention, gelu, rms):
    """The block as ONNX nodes; the biased one with LayerNormalization (opset 17, as PyTorch
    exports it) and MatMul then Add of each bias (ORT fuses them), taking epsilon as an attribute."""
    from onnx import TensorProto, helper

    z, w, biased = case.sizes, v["banks"], case.kind == "biased"
    d, h, dh = z["D"], z["H"], z["Dh"]
    inputs = [helper.make_tensor_value_info("ids", TensorProto.INT64, ["B", "S"]),
              helper.make_tensor_value_info("causal_mask", TensorProto.BOOL, ["S", "S"])]
    if not biased:
        inputs.append(helper.make_tensor_value_info("epsilon", fdt, []))

    def norm(x, k):
        if not biased:
            return rms(x, w[f"norm{k}_gain"], f"n{k}")
        return node("LayerNormalization", [x, init(f"ln{k}_g", w[f"ln{k}_gain"]), init(f"ln{k}_b", w[f"ln{k}_bias"])],
                    f"ln{k}_o", axis=-1, epsilon=float(v["inputs"]["epsilon"]))

    def linear(x, weight, bias, tag):  # weight [out, in], stored transposed
        y = node("MatMul", [x, init(f"{tag}_wt", weight.T)], f"{tag}_m")
        return node("Add", [y, init(f"{tag}_b", bias)], tag) if biased else y

    x = node("Gather", [init("embedding", w["embedding"]), "ids"], "x", axis=0)
    hn = norm(x, 1)
    q, k, v_ = (heads(linear(hn, w[n].reshape(h * dh, d), biased and w["b" + n[1]].reshape(h * dh), f"{n}_p"), n)
                for n in ("wq", "wk", "wv"))
    att = node("Transpose", [attention(q, k, v_, "causal_mask", "a")], "att_t", perm=[0, 2, 1, 3])
    att = node("Reshape", [att, init("att_shape", np.array([0, 0, h * dh], dtype=np.int64))], "att")
    x2 = node("Add", [x, linear(att, w["wo"].reshape(d, h * dh), biased and w["bo"], "o")], "x2")
    hid = gelu(linear(norm(x2, 2), w["w1"], biased and w["b1"], "h1"), "g")
    return inputs, node("Add", [x2, linear(hid, w["w2"], biased and w["b2"], "down")], "out")


def _onnx_gated(z, v: Values, node, init, rms):
    """bench.transformer's block as ONNX nodes: rotary on interleaved pairs (θ = position · ω
    in float32, as position-rotary), causal softmax attention over [H, T, S], the gated MLP with
    Sigmoid·x and Softplus, the down projection in float16 (Cast there and back)."""
    from onnx import TensorProto, helper

    from atoms.position import frequencies

    d, h, dh, w = z["D"], z["H"], z["Dh"], v["banks"]
    inputs = [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["T", d]),
              helper.make_tensor_value_info("positions", TensorProto.INT64, ["T"]),
              helper.make_tensor_value_info("causal_mask", TensorProto.BOOL, ["T", "S"]),
              helper.make_tensor_value_info("epsilon", TensorProto.FLOAT, [])]
    omega = frequencies(dh, 10000.0, np.dtype(np.float32)).reshape(1, dh // 2)
    pos = node("Unsqueeze", [node("Cast", ["positions"], "pos_f", to=TensorProto.FLOAT),
                             init("axis1", np.array([1], np.int64))], "pos_c")
    theta = node("Mul", [pos, init("omega", omega)], "theta")  # [T, Dh/2]
    as_pairs = init("pairs_shape", np.array([0, 1, dh // 2, 1], np.int64))
    cs = node("Reshape", [node("Cos", [theta], "cos"), as_pairs], "cos4")
    sn = node("Reshape", [node("Sin", [theta], "sin"), as_pairs], "sin4")

    def project(x, name):  # [T, D] -> [T, H, Dh]
        flat = node("MatMul", [x, init(f"{name}t", w[name].reshape(h * dh, d).T)], f"{name}_p")
        return node("Reshape", [flat, init(f"{name}_shape", np.array([0, h, dh], np.int64))], f"{name}_h")

    def rotary(x, tag):  # interleaved pairs (x0, x1) -> (x0 cos - x1 sin, x0 sin + x1 cos)
        x4 = node("Reshape", [x, init(f"{tag}_s4", np.array([0, h, dh // 2, 2], np.int64))], f"{tag}_4")
        x0 = node("Slice", [x4, init(f"{tag}_z", np.array([0], np.int64)), init(f"{tag}_o", np.array([1], np.int64)),
                            init(f"{tag}_ax", np.array([3], np.int64))], f"{tag}_x0")
        x1 = node("Slice", [x4, f"{tag}_o", init(f"{tag}_t", np.array([2], np.int64)), f"{tag}_ax"], f"{tag}_x1")
        y0 = node("Sub", [node("Mul", [x0, cs], f"{tag}_a"), node("Mul", [x1, sn], f"{tag}_b")], f"{tag}_y0")
        y1 = node("Add", [node("Mul", [x0, sn], f"{tag}_c"), node("Mul", [x1, cs], f"{tag}_d")], f"{tag}_y1")
        y = node("Concat", [y0, y1], f"{tag}_y", axis=3)
        return node("Reshape", [y, init(f"{tag}_s3", np.array([0, h, dh], np.int64))], f"{tag}_r")

    hn = rms("x", w["norm1_gain"], "n1")
    q = node("Transpose", [rotary(project(hn, "wq"), "rq")], "q_t", perm=[1, 0, 2])  # [H, T, Dh]
    k = node("Transpose", [rotary(project(hn, "wk"), "rk")], "k_t", perm=[1, 2, 0])  # [H, Dh, S]
    v_ = node("Transpose", [project(hn, "wv")], "v_t", perm=[1, 0, 2])  # [H, S, Dh]
    scores = node("Where", ["causal_mask", node("MatMul", [q, k], "scores"), init("neg", np.float32(-np.inf))], "masked")
    att = node("MatMul", [node("Softmax", [scores], "p", axis=-1), v_], "att")  # [H, T, Dh]
    att = node("Reshape", [node("Transpose", [att], "att_t", perm=[1, 0, 2]),
                           init("att_shape", np.array([0, h * dh], np.int64))], "att_r")
    x2 = node("Add", ["x", node("MatMul", [att, init("wot", w["wo"].reshape(d, h * dh).T)], "o")], "x2")
    h2 = rms(x2, w["norm2_gain"], "n2")
    gate = node("MatMul", [h2, init("w1t", w["w1"].T)], "gate")
    up = node("Softplus", [node("MatMul", [h2, init("w3t", w["w3"].T)], "up_p")], "up")
    m = node("Mul", [node("Mul", [gate, node("Sigmoid", [gate], "sig")], "silu"), up], "m")
    m16 = node("Cast", [m], "m16", to=TensorProto.FLOAT16)
    down = node("Cast", [node("MatMul", [m16, init("w2t", w["w2"].T)], "down16")], "down", to=TensorProto.FLOAT)
    return inputs, node("Add", [x2, down], "out")


def onnxruntime_session(case: BlockCase, v: Values, profile_prefix: str | None = None, threads: int | None = None):
    """The case's ONNX Runtime CPU session, every graph optimisation on (ORT_ENABLE_ALL);
    ``profile_prefix``: with ORT's own per-node profiling, written there; ``threads``: its
    intra-op threads (default: ORT's, one per core)."""
    import onnxruntime as ort

    opts = ort.SessionOptions()
    opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    if threads is not None:
        opts.intra_op_num_threads = threads
    if profile_prefix is not None:
        opts.enable_profiling = True
        opts.profile_file_prefix = profile_prefix
    return ort.InferenceSession(onnx_model(case, v).SerializeToString(), opts, providers=["CPUExecutionProvider"])


def onnxruntime_feeds(session, v: Values) -> dict[str, np.ndarray]:
    """The inputs the session's graph takes (the biased block's takes its epsilon as an
    attribute, and no minus one)."""
    names = {i.name for i in session.get_inputs()}
    return {n: np.ascontiguousarray(a) for n, a in v["inputs"].items() if n in names}


def onnxruntime_fn(case: BlockCase, v: Values) -> Fn:
    """ONNX Runtime CPU (``onnxruntime_session``), inputs bound once."""
    session = onnxruntime_session(case, v)
    keep = onnxruntime_feeds(session, v)
    binding = session.io_binding()
    for name, value in keep.items():
        binding.bind_cpu_input(name, value)
    binding.bind_output(session.get_outputs()[0].name, "cpu")

    def run():
        session.run_with_iobinding(binding)
        return binding.copy_outputs_to_cpu()[0]

    run.keep_alive = (keep, session, binding)  # type: ignore[attr-defined]
    return run


# --- PyTorch ----------------------------------------------------------------------------------

def torch_fn(case: BlockCase, v: Values) -> Fn:
    """PyTorch eager, two threads, inference mode, tensors over the NumPy arrays."""
    import torch

    torch.set_num_threads(2)
    t = {k: torch.from_numpy(np.ascontiguousarray(a)) for k, a in {**v["inputs"], **v["banks"]}.items()}
    gelu, sdpa = torch.nn.functional.gelu, torch.nn.functional.scaled_dot_product_attention

    def attention(q, k, v_, mask):  # [B,S,H,Dh]; queries are prescaled, hence scale=1
        q, k, v_ = (x.transpose(1, 2) for x in (q, k, v_))
        return sdpa(q, k, v_, attn_mask=mask, scale=1.0).transpose(1, 2)

    def rms(x, gain):
        return x * torch.rsqrt((x * x).mean(-1, keepdim=True) + t["epsilon"]) * gain

    if case.kind == "mlp":
        def compute():
            return gelu(t["x"] @ t["w1"].T) @ t["w2"].T
    elif case.kind == "gated":
        from atoms.position import frequencies

        z = case.sizes
        d, h, dh = z["D"], z["H"], z["Dh"]
        omega = torch.from_numpy(frequencies(dh, 10000.0, np.dtype(np.float32)))
        w = {n: t[n].reshape(h * dh, d).T.contiguous() for n in ("wq", "wk", "wv")}
        wot = t["wo"].reshape(d, h * dh).T.contiguous()
        w1t, w3t, w2t = t["w1"].T.contiguous(), t["w3"].T.contiguous(), t["w2"].T.contiguous()
        silu, softplus = torch.nn.functional.silu, torch.nn.functional.softplus

        def rotary(x, cs, sn):  # [T, H, Dh], interleaved pairs
            x0, x1 = x[..., 0::2], x[..., 1::2]
            return torch.stack((x0 * cs - x1 * sn, x0 * sn + x1 * cs), dim=-1).flatten(-2)

        def compute():
            x = t["x"]
            theta = (t["positions"].to(torch.float32)[:, None] * omega)[:, None, :]  # [T, 1, Dh/2]
            cs, sn = torch.cos(theta), torch.sin(theta)
            hn = rms(x, t["norm1_gain"])
            q, k, v_ = ((hn @ w[n]).reshape(-1, h, dh) for n in ("wq", "wk", "wv"))
            q, k = rotary(q, cs, sn), rotary(k, cs, sn)
            att = sdpa(q.transpose(0, 1), k.transpose(0, 1), v_.transpose(0, 1), attn_mask=t["causal_mask"], scale=1.0)
            x2 = x + att.transpose(0, 1).reshape(-1, h * dh) @ wot
            h2 = rms(x2, t["norm2_gain"])
            m = silu(h2 @ w1t) * softplus(h2 @ w3t)
            return x2 + (m.to(torch.float16) @ w2t).to(torch.float32)
    elif case.kind == "attention":
        def compute():
            return attention(t["q"], t["k"], t["v"], t["causal_mask"])
    elif case.kind == "biased":  # as a PyTorch user writes GPT-2's block (nn.LayerNorm, nn.Linear)
        z = case.sizes
        bsz, s, d, h, dh = z["B"], z["S"], z["D"], z["H"], z["Dh"]
        wqkv = torch.cat([t[n].reshape(h * dh, d) for n in ("wq", "wk", "wv")])
        bqkv = torch.cat([t[n].reshape(h * dh) for n in ("bq", "bk", "bv")])
        wo, eps = t["wo"].reshape(d, h * dh), float(v["inputs"]["epsilon"])
        linear, layer_norm = torch.nn.functional.linear, torch.nn.functional.layer_norm

        def compute():
            x = t["embedding"][t["ids"]]
            hn = layer_norm(x, (d,), t["ln1_gain"], t["ln1_bias"], eps)
            qkv = linear(hn, wqkv, bqkv).reshape(bsz, s, 3, h, dh)
            att = attention(qkv[:, :, 0], qkv[:, :, 1], qkv[:, :, 2], t["causal_mask"])
            x2 = x + linear(att.reshape(bsz, s, h * dh), wo, t["bo"])
            hid = gelu(linear(layer_norm(x2, (d,), t["ln2_gain"], t["ln2_bias"], eps), t["w1"], t["b1"]))
            return x2 + linear(hid, t["w2"], t["b2"])
    else:
        z = case.sizes
        bsz, s, d, h, dh = z["B"], z["S"], z["D"], z["H"], z["Dh"]
        wqkv = torch.cat([t[n].reshape(h * dh, d) for n in ("wq", "wk", "wv")]).T.contiguous()
        wot = t["wo"].reshape(d, h * dh).T.contiguous()

        def compute():
            x = t["embedding"][t["ids"]]
            qkv = (rms(x, t["norm1_gain"]) @ wqkv).reshape(bsz, s, 3, h, dh)
            att = attention(qkv[:, :, 0], qkv[:, :, 1], qkv[:, :, 2], t["causal_mask"])
            x2 = x + att.reshape(bsz, s, h * dh) @ wot
            return x2 + gelu(rms(x2, t["norm2_gain"]) @ t["w1"].T) @ t["w2"].T

    def run():
        with torch.inference_mode():
            return compute().numpy()

    return run


PEER_FNS = {"numpy": numpy_fn, "onnxruntime": onnxruntime_fn, "torch": torch_fn}


def prepare(contender: str, case: BlockCase, v: Values) -> Fn:
    """The zero-argument callable for any contender; Unavailable when it cannot run here."""
    from bench.contenders import RUNTIME_BACKENDS, Unavailable, peer_unavailable, prepare_runtime

    if contender in RUNTIME_BACKENDS:
        p = program(case)
        return prepare_runtime(contender, p, v["inputs"], v["banks"], p["outputs"][0])
    if contender not in case.peers:
        raise Unavailable(f"{contender}: " + (case.why_not or f"no {case.kind} graph is written for this "
                                              f"peer (peers: {', '.join(case.peers)})"))
    reason = peer_unavailable(contender)
    if reason:
        raise Unavailable(reason)
    return PEER_FNS[contender](case, v)


# --- peak RSS -------------------------------------------------------------------------------------

def _rss_child(contender: str, case_name: str, runs: int) -> None:
    """In a fresh process: prepare, run ``runs`` times, print the peak RSS as JSON."""
    case = next(c for c in cases() if c.name == case_name)
    v = data(case)
    base = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    fn = prepare(contender, case, v)
    for _ in range(runs):
        fn()
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss  # KiB on Linux
    print(json.dumps({"contender": contender, "case": case_name, "peak_rss_mib": round(peak / 1024, 1),
                      "data_rss_mib": round(base / 1024, 1)}))


def peak_rss(contenders: list[str], case_name: str = "B4-S512", runs: int = 3) -> list[dict[str, Any]]:
    """Each contender's peak RSS on one case, each in a fresh process."""
    rows = []
    for c in contenders:
        proc = subprocess.run([sys.executable, __file__, "rss-child", c, case_name, str(runs)],
                              cwd=REPO, capture_output=True, text=True)
        lines = proc.stdout.strip().splitlines()
        rows.append(json.loads(lines[-1]) if proc.returncode == 0 and lines else
                    {"contender": c, "case": case_name, "error": (proc.stderr.strip().splitlines() or ["?"])[-1]})
    return rows


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description="Peak RSS per contender on a block case (fresh process each).")
    sub = p.add_subparsers(dest="cmd", required=True)
    r = sub.add_parser("rss")
    r.add_argument("--contenders", default="cpu,numpy,onnxruntime,torch")
    r.add_argument("--case", default="B4-S512")
    r.add_argument("--runs", type=int, default=3)
    c = sub.add_parser("rss-child")
    c.add_argument("contender")
    c.add_argument("case")
    c.add_argument("runs", type=int)
    args = p.parse_args(argv)
    if args.cmd == "rss-child":
        _rss_child(args.contender, args.case, args.runs)
        return 0
    for row in peak_rss([x.strip() for x in args.contenders.split(",") if x.strip()], args.case, args.runs):
        print(json.dumps(row))
    return 0


if __name__ == "__main__":
    sys.exit(main())
