"""One-instruction programs per atom family, each with its NumPy peer and a BLAS-free check.

Shapes are small enough for a case to run in well under a second per call, large enough
that per-call overhead is not the whole story. Everything is float32 (one dtype keeps the
number of numba compilations low). ``numpy`` is the peer as a NumPy user would write it;
``expect`` is what results are checked against inside the runtime's process, written
without BLAS so the check wakes no OpenBLAS pool next to Numba's threads.
"""
from __future__ import annotations

import math
from collections.abc import Callable, Mapping

import attrs
import numpy as np

from bench.programs import Builder

ACC = {"accumulation_dtype": "float32"}
Values = dict[str, dict[str, np.ndarray]]


@attrs.frozen
class AtomCase:
    name: str  # "<atom>-<variant>", the benchmark group is "atom-<name>"
    build: Callable[[], dict]  # -> program dict (one instruction, output "%0")
    data: Callable[[np.random.Generator], Values]  # -> {"inputs": ..., "banks": ...}
    numpy: Callable[[Values], Callable[[], np.ndarray]]  # -> the peer's zero-arg callable
    expect: Callable[[Values], np.ndarray] | None = None  # None: the peer's result is BLAS-free
    rtol: float = 1e-5
    atol: float = 1e-5


def _normal(rng, shape, scale=1.0):
    a = rng.standard_normal(shape, dtype=np.float32)
    return a * np.float32(scale) if scale != 1.0 else a


def _one(atom, inputs: Mapping[str, dict], attrs_: dict, out_axes: dict,
         banks: Mapping[str, dict] = (), dtypes: Mapping[str, str] | None = None):
    def build():
        b = Builder("float32")
        slots = []
        for name, axes in inputs.items():
            slots.append(b.input(name, axes, (dtypes or {}).get(name)))
        for name, axes in dict(banks).items():
            slots.append(b.bank(name, axes))
        return b.build([b.op(atom, slots, attrs_, out_axes)])
    return build


def _einsum(spec: str, *names: str):
    def expect(v):
        ops = [({**v["inputs"], **v["banks"]})[n].astype(np.float64) for n in names]
        return np.einsum(spec, *ops, optimize=False)
    return expect


def _inputs(**arrays):
    return {"inputs": arrays, "banks": {}}


# --- contract ---------------------------------------------------------------------------
T, DIN, DOUT = 1024, 512, 256
contract_matmul = AtomCase(
    "contract-matmul",
    _one("contract", {"x": {"T": T, "Din": DIN}},
         {"reduce_axes": [["Din", "Din"]], "output_axes": ["T", "Dout"], **ACC},
         {"T": T, "Dout": DOUT}, banks={"w": {"Dout": DOUT, "Din": DIN}}),
    lambda rng: {"inputs": {"x": _normal(rng, (T, DIN))},
                 "banks": {"w": _normal(rng, (DOUT, DIN), DIN ** -0.5)}},
    lambda v: (lambda x=v["inputs"]["x"], w=v["banks"]["w"]: x @ w.T),
    _einsum("td,od->to", "x", "w"), rtol=1e-4, atol=1e-4)

H, TQ, SK, DH = 8, 256, 256, 64
contract_batched = AtomCase(
    "contract-batched",
    _one("contract", {"q": {"H": H, "T": TQ, "D": DH}, "k": {"H": H, "S": SK, "D": DH}},
         {"reduce_axes": [["D", "D"]], "output_axes": ["H", "T", "S"], **ACC},
         {"H": H, "T": TQ, "S": SK}),
    lambda rng: _inputs(q=_normal(rng, (H, TQ, DH)), k=_normal(rng, (H, SK, DH), DH ** -0.5)),
    lambda v: (lambda q=v["inputs"]["q"], k=v["inputs"]["k"]: q @ k.transpose(0, 2, 1)),
    _einsum("htd,hsd->hts", "q", "k"), rtol=1e-4, atol=1e-4)

# --- elementwise --------------------------------------------------------------------------
N, D = 1024, 1024
_square = {"T": N, "D": D}


def _silu(v):
    x = v["inputs"]["x"]
    return lambda: x * (1 / (1 + np.exp(-x)))


def _gelu(v):
    from scipy.special import erf  # NumPy has no erf; scipy is a runtime dependency

    x = v["inputs"]["x"]
    c = np.float32(1 / math.sqrt(2))
    return lambda: np.float32(0.5) * x * (1 + erf(x * c))


scalar_silu = AtomCase("scalar-map-silu", _one("scalar-map", {"x": _square}, {"mode": "silu"}, _square),
                       lambda rng: _inputs(x=_normal(rng, (N, D), 3.0)), _silu)
scalar_gelu = AtomCase("scalar-map-gelu", _one("scalar-map", {"x": _square}, {"mode": "gelu"}, _square),
                       lambda rng: _inputs(x=_normal(rng, (N, D), 3.0)), _gelu)
add = AtomCase("add", _one("add", {"a": _square, "b": _square}, dict(ACC), _square),
               lambda rng: _inputs(a=_normal(rng, (N, D)), b=_normal(rng, (N, D))),
               lambda v: (lambda a=v["inputs"]["a"], b=v["inputs"]["b"]: a + b))
scale = AtomCase("scale-row", _one("scale", {"x": _square, "f": {"D": D}}, {"factor_axes": ["D"], **ACC}, _square),
                 lambda rng: _inputs(x=_normal(rng, (N, D)), f=_normal(rng, (D,))),
                 lambda v: (lambda x=v["inputs"]["x"], f=v["inputs"]["f"]: x * f))

# --- reduce, softmax ----------------------------------------------------------------------
reduce_sum = AtomCase("reduce-sum-last",
                      _one("reduce", {"x": _square}, {"axis": "D", "mode": "sum", **ACC}, {"T": N}),
                      lambda rng: _inputs(x=_normal(rng, (N, D))),
                      lambda v: (lambda x=v["inputs"]["x"]: x.sum(axis=1)),
                      lambda v: v["inputs"]["x"].astype(np.float64).sum(axis=1), rtol=1e-4, atol=1e-4)

SH, ST = 8, 128
_logits = {"H": SH, "T": ST, "S": ST}


def _masked_softmax(v):
    z, mask = v["inputs"]["z"], v["inputs"]["mask"]
    minus_inf = np.float32(-np.inf)

    def run():
        m = np.where(mask, z, minus_inf)
        e = np.exp(m - m.max(axis=-1, keepdims=True))
        return e / e.sum(axis=-1, keepdims=True)
    return run


masked_softmax = AtomCase(
    "masked-softmax-causal",
    _one("masked-softmax", {"z": _logits, "mask": {"T": ST, "S": ST}}, {"axis": "S", **ACC}, _logits,
         dtypes={"mask": "boolean"}),
    lambda rng: _inputs(z=_normal(rng, (SH, ST, ST), 2.0), mask=np.tril(np.ones((ST, ST), dtype=bool))),
    _masked_softmax, rtol=1e-5, atol=1e-6)

reduce_lse = AtomCase("reduce@2-logsumexp-last",
                      _one("reduce@2", {"x": _square}, {"axis": "D", "mode": "logsumexp", **ACC}, {"T": N}),
                      lambda rng: _inputs(x=_normal(rng, (N, D), 3.0)),
                      lambda v: (lambda x=v["inputs"]["x"]: (lambda m: m[:, 0] + np.log(
                          np.exp(x - m).sum(axis=1)))(x.max(axis=1, keepdims=True))),
                      rtol=1e-5, atol=1e-5)

reduce_amax = AtomCase("reduce@2-amax-last",
                       _one("reduce@2", {"x": _square}, {"axis": "D", "mode": "amax", **ACC}, {"T": N}),
                       lambda rng: _inputs(x=_normal(rng, (N, D))),
                       lambda v: (lambda x=v["inputs"]["x"]: x.max(axis=1)))
reduce_amax_first = AtomCase("reduce@2-amax-first",
                             _one("reduce@2", {"x": _square}, {"axis": "T", "mode": "amax", **ACC}, {"D": D}),
                             lambda rng: _inputs(x=_normal(rng, (N, D))),
                             lambda v: (lambda x=v["inputs"]["x"]: x.max(axis=0)))

# --- position ------------------------------------------------------------------------------
RB, RS, RH, RD = 2, 256, 8, 64
_qkv = {"B": RB, "S": RS, "H": RH, "D": RD}


def _rotary(v):
    """Adjacent pairs rotated by position × base^(−2i/D), as a NumPy user writes it."""
    x, pos = v["inputs"]["q"], v["inputs"]["pos"]
    omega = np.exp(np.arange(0, RD, 2, dtype=np.float32) * np.float32(-math.log(10000.0) / RD))

    def run():
        theta = pos.astype(np.float32)[:, :, None, None] * omega  # [B, S, 1, D/2]
        c, s = np.cos(theta), np.sin(theta)
        x0, x1 = x[..., 0::2], x[..., 1::2]
        out = np.empty_like(x)
        out[..., 0::2] = x0 * c - x1 * s
        out[..., 1::2] = x0 * s + x1 * c
        return out
    return run


rotary = AtomCase(
    "position-rotary-heads",
    _one("position-rotary", {"q": _qkv, "pos": {"B": RB, "S": RS}}, {"feature_axis": "D", "base": 10000.0},
         _qkv, dtypes={"pos": "int64"}),
    lambda rng: _inputs(q=_normal(rng, (RB, RS, RH, RD)), pos=np.tile(np.arange(RS), (RB, 1))),
    _rotary, rtol=1e-4, atol=1e-4)

# --- indexing, layout -----------------------------------------------------------------------
V, DE, NT = 8192, 256, 4096
lookup = AtomCase(
    "lookup-rows",
    _one("lookup", {"table": {"V": V, "D": DE}, "ids": {"T": NT}}, {"table_axis": "V", "output_axes": ["T", "D"]},
         {"T": NT, "D": DE}, dtypes={"ids": "int64"}),
    lambda rng: _inputs(table=_normal(rng, (V, DE)), ids=rng.integers(0, V, NT, dtype=np.int64)),
    lambda v: (lambda t=v["inputs"]["table"], i=v["inputs"]["ids"]: np.take(t, i, axis=0)))

GJ = 64
gather = AtomCase(
    "gather-last",
    _one("gather", {"x": _square, "idx": {"T": N, "J": GJ}}, {"axis": "D", "index_axis": "J"}, {"T": N, "J": GJ},
         dtypes={"idx": "int64"}),
    lambda rng: _inputs(x=_normal(rng, (N, D)), idx=rng.integers(0, D, (N, GJ), dtype=np.int64)),
    lambda v: (lambda x=v["inputs"]["x"], i=v["inputs"]["idx"]: np.take_along_axis(x, i, axis=1)))

PB, PS, PH, PD = 4, 256, 8, 64
permute = AtomCase(
    "permute-heads",
    _one("permute", {"x": {"B": PB, "S": PS, "H": PH, "D": PD}}, {"output_axes": ["B", "H", "S", "D"]},
         {"B": PB, "H": PH, "S": PS, "D": PD}),
    lambda rng: _inputs(x=_normal(rng, (PB, PS, PH, PD))),
    lambda v: (lambda x=v["inputs"]["x"]: np.ascontiguousarray(x.transpose(0, 2, 1, 3))))

# --- §3b: segment, window --------------------------------------------------------------------
SN, SD, SG = 16384, 64, 256


def _segment_mean(v):
    x, ids, m = v["inputs"]["x"], v["inputs"]["ids"], v["inputs"]["valid"]

    def run():
        sums = np.zeros((SG, SD), np.float32)
        np.add.at(sums, ids[m], x[m])
        counts = np.bincount(ids[m], minlength=SG).astype(np.float32)[:, None]
        return np.where(counts > 0, sums / np.maximum(counts, 1), np.float32(0))
    return run


segment_mean = AtomCase(
    "segment-mean-rows",
    _one("segment@1", {"x": {"N": SN, "D": SD}, "ids": {"N": SN}, "valid": {"N": SN}},
         {"axis": "N", "segment_axis": "G", "num_segments": SG, "mode": "mean", **ACC}, {"G": SG, "D": SD},
         dtypes={"ids": "int64", "valid": "boolean"}),
    lambda rng: _inputs(x=_normal(rng, (SN, SD)), ids=rng.integers(0, SG, SN, dtype=np.int64),
                        valid=rng.random(SN) < 0.9),
    _segment_mean, rtol=1e-4, atol=1e-5)

WB, WT, WK = 64, 4096, 4
window = AtomCase(
    "window-causal",
    _one("window@1", {"x": {"B": WB, "T": WT}},
         {"axis": "T", "output_axis": "P", "window_axis": "K", "kernel_size": WK, "stride": 1, "dilation": 1,
          "padding": [WK - 1, 0], "output_size": None}, {"B": WB, "P": WT, "K": WK}),
    lambda rng: _inputs(x=_normal(rng, (WB, WT))),
    lambda v: (lambda x=v["inputs"]["x"]: np.lib.stride_tricks.sliding_window_view(
        np.pad(x, ((0, 0), (WK - 1, 0))), WK, axis=1).copy()))

CASES = (contract_matmul, contract_batched, scalar_silu, scalar_gelu, add, scale, reduce_sum,
         masked_softmax, lookup, gather, permute, segment_mean, window, reduce_lse, reduce_amax,
         reduce_amax_first, rotary)
