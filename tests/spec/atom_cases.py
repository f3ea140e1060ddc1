"""One-instruction programs for every atom of SPEC §3, with hand-computed expected results.

``one(...)`` builds a program of one instruction over fresh input bindings; ``VALID`` lists
(case id, program factory, inputs, expected outputs) with values small enough to compute by
hand (or with a one-line NumPy expression that restates the spec's formula directly).
"""
from __future__ import annotations

import math

import numpy as np

from .builders import ProgramBuilder

ACT = "activation"


def one(atom: str, operands, attributes, out_axes, out_sizes, out_dtype="float32",
        out_domain="anonymous"):
    """Program: ``%0 = atom(*operands)``; operand = (name, axes, sizes, dtype[, domain])."""
    b = ProgramBuilder()
    for name, axes, sizes, dtype, *domain in operands:
        b.input(name, axes, sizes, dtype, *(domain or ["anonymous"]))
    b.op(atom, [o[0] for o in operands], attributes, out_axes, out_sizes, out_dtype, out_domain)
    return b.build()


def f32(*shape, start=1.0):
    return (np.arange(int(np.prod(shape)), dtype=np.float32) + np.float32(start)).reshape(shape)


def _sigmoid(z):
    return 1.0 / (1.0 + np.exp(-z))


X23 = f32(2, 3)
W43 = f32(4, 3, start=-5.0)
ROW3 = np.array([2.0, -1.0, 0.5], np.float32)
V42 = f32(4, 2)
IDX3 = np.array([3, 0, 3], np.int64)
MAP_IN = np.array([-2.0, -0.5, 0.25, 1.0, 3.0], np.float32)
POS_IN = np.array([0.25, 1.0, 4.0, 9.0, 100.0], np.float32)

SCALAR_MAP = {
    "gelu": lambda z: np.array([0.5 * v * (1 + math.erf(v / math.sqrt(2))) for v in z.astype(np.float64)]),
    "relu": lambda z: np.maximum(z, 0),
    "rsqrt": lambda z: 1 / np.sqrt(z.astype(np.float64)),
    "sigmoid": lambda z: _sigmoid(z.astype(np.float64)),
    "silu": lambda z: z * _sigmoid(z.astype(np.float64)),
    "tanh": lambda z: np.tanh(z.astype(np.float64)),
}


def _softmax_expected():
    logits = np.array([[1.0, 2.0, 3.0], [0.0, 5.0, -1.0], [4.0, 4.0, 4.0]], np.float32)
    mask = np.array([[True, True, True], [True, False, True], [False, False, False]])
    out = np.zeros((3, 3))
    e = np.exp(np.array([1.0, 2.0, 3.0]) - 3.0)
    out[0] = e / e.sum()
    e = np.exp(np.array([0.0, -1.0]))
    out[1, [0, 2]] = e / e.sum()
    return logits, mask, out  # row 2 fully masked: all zeros


SM_LOGITS, SM_MASK, SM_OUT = _softmax_expected()


def _cases():
    c = []
    add = lambda *a: c.append(a)  # noqa: E731
    # contract: x[M,K] · w[N,K]ᵀ, in both output orders; differently named reduced pair; batch axis
    add("contract", lambda: one("contract", [("x", ["M", "K"], [2, 3], "float32"),
                                             ("w", ["N", "K"], [4, 3], "float32")],
                                {"reduce_axes": [["K", "K"]], "output_axes": ["M", "N"],
                                 "accumulation_dtype": "float32"}, ["M", "N"], [2, 4]),
        {"x": X23, "w": W43}, X23 @ W43.T)
    add("contract-permuted-out", lambda: one(
        "contract", [("x", ["M", "K"], [2, 3], "float32"), ("w", ["N", "K"], [4, 3], "float32")],
        {"reduce_axes": [["K", "K"]], "output_axes": ["N", "M"], "accumulation_dtype": ACT},
        ["N", "M"], [4, 2]), {"x": X23, "w": W43}, (X23 @ W43.T).T)
    add("contract-renamed-pair", lambda: one(
        "contract", [("x", ["M", "K"], [2, 3], "float32"), ("w", ["J", "N"], [3, 4], "float32")],
        {"reduce_axes": [["K", "J"]], "output_axes": ["M", "N"], "accumulation_dtype": ACT},
        ["M", "N"], [2, 4]), {"x": X23, "w": W43.T.copy()}, X23 @ W43.T)
    bx, bw = f32(2, 2, 3), f32(2, 3, 2, start=-3.0)
    add("contract-batch", lambda: one(
        "contract", [("x", ["B", "M", "K"], [2, 2, 3], "float32"),
                     ("w", ["B", "K", "N"], [2, 3, 2], "float32")],
        {"reduce_axes": [["K", "K"]], "output_axes": ["B", "M", "N"], "accumulation_dtype": ACT},
        ["B", "M", "N"], [2, 2, 2]), {"x": bx, "w": bw}, np.einsum("bmk,bkn->bmn", bx, bw))
    # scale: factor broadcast by axis name; 0-d factor
    add("scale", lambda: one("scale", [("v", ["N", "M"], [2, 3], "float32"),
                                       ("f", ["M"], [3], "float32")],
                             {"factor_axes": ["M"], "accumulation_dtype": ACT}, ["N", "M"], [2, 3]),
        {"v": X23, "f": ROW3}, X23 * ROW3[None, :])
    add("scale-0d", lambda: one("scale", [("v", ["N", "M"], [2, 3], "float32"),
                                          ("f", [], [], "float32")],
                                {"factor_axes": [], "accumulation_dtype": "float32"},
                                ["N", "M"], [2, 3]),
        {"v": X23, "f": np.float32(-2.0)}, X23 * -2.0)
    add("add", lambda: one("add", [("a", ["N", "M"], [2, 3], "float32"),
                                   ("b", ["N", "M"], [2, 3], "float32")],
                           {"accumulation_dtype": ACT}, ["N", "M"], [2, 3]),
        {"a": X23, "b": X23 * 10}, X23 * 11)
    add("reduce", lambda: one("reduce", [("v", ["N", "M"], [2, 3], "float32")],
                              {"axis": "M", "mode": "sum", "accumulation_dtype": "float32"},
                              ["N"], [2]), {"v": X23}, np.array([6.0, 15.0]))
    lse = np.array([[1e4, -1e4, 1e4], [1.0, 2.0, 3.0]], np.float32)
    add("reduce@2-logsumexp", lambda: one("reduce@2", [("v", ["N", "M"], [2, 3], "float32")],
                                          {"axis": "M", "mode": "logsumexp", "accumulation_dtype": "float32"},
                                          ["N"], [2]),
        {"v": lse}, np.array([1e4 + math.log(2), 3 + math.log(1 + math.exp(-1) + math.exp(-2))]))
    add("reduce@2-mean", lambda: one("reduce@2", [("v", ["N", "M"], [2, 3], "float32")],
                                     {"axis": "N", "mode": "mean", "accumulation_dtype": ACT}, ["M"], [3]),
        {"v": X23}, X23.mean(axis=0))
    add("position-sinusoidal", lambda: one(
        "position-sinusoidal", [("p", ["S"], [2], "int64")],
        {"feature_axis": "F", "feature_size": 3, "dtype": "floating", "base": 100.0},
        ["S", "F"], [2, 3], "floating"), {"p": np.array([0, 2], np.int64)},
        np.array([[0, 1, 0], [math.sin(2), math.cos(2), math.sin(2 * 100 ** (-2 / 3))]]))
    add("position-relative", lambda: one(
        "position-relative", [("a", ["I"], [2], "float32"), ("b", ["J"], [3], "float32")], {},
        ["I", "J"], [2, 3]), {"a": ROW3[:2], "b": ROW3}, ROW3[:2, None] - ROW3[None, :])
    add("position-rotary", lambda: one(
        "position-rotary", [("v", ["S", "F"], [2, 2], "float32"), ("p", ["S"], [2], "float32")],
        {"feature_axis": "F", "base": 10000.0}, ["S", "F"], [2, 2]),
        {"v": np.array([[1, 2], [1, 0]], np.float32), "p": np.array([0, 0.5], np.float32)},
        np.array([[1, 2], [math.cos(0.5), math.sin(0.5)]]))
    obs = [("v", ["B", "N", "D"], [1, 4, 1], "float32"), ("s", ["B", "T", "S"], [1, 1, 2], "float32"),
           ("m", ["B", "N"], [1, 4], "boolean"), ("a", ["B", "T"], [1, 1], "boolean")]
    obs_in = {"v": f32(1, 4, 1), "s": np.array([[[1.0, 1.0]]], np.float32),
              "m": np.array([[True, True, False, True]]), "a": np.array([[True]])}
    add("observe-identity", lambda: one("observe-identity", obs, {}, ["B", "T", "N", "D"], [1, 1, 4, 1]),
        obs_in, np.array([1.0, 2.0, 0.0, 4.0]).reshape(1, 1, 4, 1))
    add("observe-fourier", lambda: one(  # a 2x2 image rolled by one pixel each way
        "observe-fourier", obs, {"spatial_shape": [2, 2], "state_mode": "cartesian",
                                 "direction_epsilon": 1e-6, "compile_policy": "safe_training"},
        ["B", "T", "N", "D"], [1, 1, 4, 1]), obs_in, np.array([4.0, 3.0, 0.0, 1.0]).reshape(1, 1, 4, 1))
    add("reshape", lambda: one("reshape", [("v", ["N", "M"], [2, 3], "float32")],
                               {"output_axes": ["P", "Q"], "output_sizes": [3, 2]},
                               ["P", "Q"], [3, 2]), {"v": X23}, X23.reshape(3, 2))
    add("permute", lambda: one("permute", [("v", ["N", "M"], [2, 3], "float32")],
                               {"output_axes": ["M", "N"]}, ["M", "N"], [3, 2]),
        {"v": X23}, X23.T)
    add("gather", lambda: one("gather", [("v", ["N", "D"], [4, 2], "float32"),
                                         ("i", ["J"], [3], "int64")],
                              {"axis": "N", "index_axis": "J"}, ["J", "D"], [3, 2]),
        {"v": V42, "i": IDX3}, V42[[3, 0, 3]])
    bi = np.array([[2, 0], [1, 1]], np.int64)
    add("gather-batched", lambda: one("gather", [("v", ["B", "N"], [2, 3], "float32"),
                                                 ("i", ["B", "J"], [2, 2], "int64")],
                                      {"axis": "N", "index_axis": "J"}, ["B", "J"], [2, 2]),
        {"v": X23, "i": bi}, np.array([[3.0, 1.0], [5.0, 5.0]]))
    upd = np.array([[-1.0, -2.0], [-3.0, -4.0]], np.float32)
    scattered = V42.copy()
    scattered[2], scattered[0] = upd[0], upd[1]
    add("scatter", lambda: one("scatter", [("b", ["N", "D"], [4, 2], "float32"),
                                           ("i", ["J"], [2], "int64"),
                                           ("u", ["J", "D"], [2, 2], "float32")],
                               {"axis": "N", "index_axis": "J", "mode": "replace"},
                               ["N", "D"], [4, 2]),
        {"b": V42, "i": np.array([2, 0], np.int64), "u": upd}, scattered)
    for mode, fn in SCALAR_MAP.items():
        z = POS_IN if mode == "rsqrt" else MAP_IN
        add(f"scalar-map-{mode}", (lambda m=mode: one(
            "scalar-map", [("v", ["N"], [5], "float32")], {"mode": m}, ["N"], [5])),
            {"v": z}, fn(z))
    add("broadcast", lambda: one("broadcast", [("v", ["N", "M"], [1, 3], "float32")],
                                 {"output_axes": ["P", "N", "M"], "output_sizes": [2, 4, 3]},
                                 ["P", "N", "M"], [2, 4, 3]),
        {"v": ROW3[None, :]}, np.broadcast_to(ROW3, (2, 4, 3)))
    mask = np.array([[True, False, True], [False, False, True]])
    add("select", lambda: one("select", [("m", ["N", "M"], [2, 3], "boolean"),
                                         ("t", ["N", "M"], [2, 3], "float32"),
                                         ("f", ["N", "M"], [2, 3], "float32")],
                              {}, ["N", "M"], [2, 3]),
        {"m": mask, "t": X23, "f": -X23}, np.where(mask, X23, -X23))
    add("select-broadcast-mask", lambda: one(
        "select", [("m", ["M"], [3], "boolean"), ("t", ["N", "M"], [2, 3], "float32"),
                   ("f", ["N", "M"], [2, 3], "float32")], {}, ["N", "M"], [2, 3]),
        {"m": mask[0], "t": X23, "f": -X23}, np.where(mask[0][None, :], X23, -X23))
    li = np.array([[4, 0, 1], [1, 1, 3]], np.int64)
    table = f32(5, 2)
    add("lookup", lambda: one("lookup", [("t", ["V", "D"], [5, 2], "float32"),
                                         ("i", ["B", "T"], [2, 3], "int64")],
                              {"table_axis": "V", "output_axes": ["B", "T", "D"]},
                              ["B", "T", "D"], [2, 3, 2]),
        {"t": table, "i": li}, table[li])
    add("lookup-permuted", lambda: one("lookup", [("t", ["V", "D"], [5, 2], "float32"),
                                                  ("i", ["B", "T"], [2, 3], "int64")],
                                       {"table_axis": "V", "output_axes": ["D", "B", "T"]},
                                       ["D", "B", "T"], [2, 2, 3]),
        {"t": table, "i": li}, np.moveaxis(table[li], 2, 0))
    v52 = f32(5, 2)
    add("slice", lambda: one("slice", [("v", ["N", "M"], [5, 2], "float32")],
                             {"axis": "N", "start": 1, "stop": 4, "step": 2}, ["N", "M"], [2, 2]),
        {"v": v52}, v52[1:4:2])
    add("slice-open-stop", lambda: one("slice", [("v", ["N", "M"], [5, 2], "float32")],
                                       {"axis": "N", "start": 2, "stop": None, "step": 1},
                                       ["N", "M"], [3, 2]), {"v": v52}, v52[2:])
    add("slice-stop-past-end", lambda: one("slice", [("v", ["N", "M"], [5, 2], "float32")],
                                           {"axis": "M", "start": 1, "stop": 9, "step": 1},
                                           ["N", "M"], [5, 1]), {"v": v52}, v52[:, 1:9])
    r13 = ROW3[None, :]
    add("concat", lambda: one("concat", [("a", ["N", "M"], [2, 3], "float32"),
                                         ("b", ["N", "M"], [1, 3], "float32")],
                              {"axis": "N"}, ["N", "M"], [3, 3]),
        {"a": X23, "b": r13}, np.concatenate([X23, r13]))
    add("masked-softmax", lambda: one("masked-softmax", [("l", ["N", "M"], [3, 3], "float32"),
                                                         ("m", ["N", "M"], [3, 3], "boolean")],
                                      {"axis": "M", "accumulation_dtype": "float32"},
                                      ["N", "M"], [3, 3]),
        {"l": SM_LOGITS, "m": SM_MASK}, SM_OUT)
    # §3b: gather@2 with repeated indices, scatter@2 add (repeats accumulate), segment with an
    # empty group and an out-of-range inactive id, window with padding, dilation and stride
    gi = np.array([3, 3, 0], np.int64)
    add("gather@2-repeats", lambda: one("gather@2", [("v", ["N", "M"], [4, 2], "float32"),
                                                     ("i", ["J"], [3], "int64")],
                                        {"axis": "N", "index_axis": "J"}, ["J", "M"], [3, 2]),
        {"v": V42, "i": gi}, V42[gi])
    add("scatter@2-add", lambda: one("scatter@2", [("b", ["N", "M"], [4, 2], "float32"),
                                                   ("i", ["J"], [3], "int64"),
                                                   ("u", ["J", "M"], [3, 2], "float32")],
                                     {"axis": "N", "index_axis": "J", "mode": "add",
                                      "accumulation_dtype": "float32"}, ["N", "M"], [4, 2]),
        {"b": V42, "i": gi, "u": X23.T.copy()},
        V42 + np.array([[3, 6], [0, 0], [0, 0], [1 + 2, 4 + 5]], np.float32))
    seg_v = np.array([[1.0, 2.0, 3.0, 4.0], [5.0, 6.0, 7.0, 8.0]], np.float32)
    add("segment-sum", lambda: one("segment", [("v", ["B", "N"], [2, 4], "float32"),
                                               ("s", ["N"], [4], "int64"), ("m", ["N"], [4], "boolean")],
                                   {"axis": "N", "segment_axis": "G", "num_segments": 3, "mode": "sum",
                                    "accumulation_dtype": "float32"}, ["B", "G"], [2, 3]),
        {"v": seg_v, "s": np.array([2, 0, 2, 9], np.int64), "m": np.array([True, True, True, False])},
        np.array([[2.0, 0.0, 4.0], [6.0, 0.0, 12.0]]))
    win_v = np.arange(1.0, 6.0, dtype=np.float32)
    add("window-pad-dilate-stride", lambda: one(
        "window", [("v", ["N"], [5], "float32")],
        {"axis": "N", "output_axis": "P", "window_axis": "K", "kernel_size": 2, "stride": 2,
         "dilation": 2, "padding": [1, 1], "output_size": None}, ["P", "K"], [3, 2]),
        {"v": win_v}, np.array([[0.0, 2.0], [2.0, 4.0], [4.0, 0.0]]))
    # §3c: the atoms for gradients
    grad = "formula-runtime/formula-atom-{}@1".format
    add("fill-floating-of-int64", lambda: one(grad("fill"), [("r", ["N", "M"], [2, 3], "int64")],
                                              {"axes": ["M"], "dtype": "floating", "value": -1.5}, ["M"], [3]),
        {"r": np.zeros((2, 3), np.int64)}, np.full(3, -1.5))
    sig = _sigmoid(MAP_IN.astype(np.float64))
    silu_grad = POS_IN * (sig * (1 + MAP_IN * (1 - sig)))  # ȳ·σ(1 + x(1 − σ))
    add("scalar-map-vjp-silu", lambda: one(grad("scalar-map-vjp"), [("x", ["N"], [5], "float32"),
                                                                    ("g", ["N"], [5], "float32")],
                                           {"mode": "silu", "accumulation_dtype": "float32"}, ["N"], [5]),
        {"x": MAP_IN, "g": POS_IN}, silu_grad)
    sm_g = f32(3, 3, start=-4.0)
    sm_y = SM_OUT.astype(np.float32)
    add("masked-softmax-vjp", lambda: one(grad("masked-softmax-vjp"), [("y", ["N", "M"], [3, 3], "float32"),
                                                                       ("g", ["N", "M"], [3, 3], "float32")],
                                          {"axis": "M", "accumulation_dtype": "float32"}, ["N", "M"], [3, 3]),
        {"y": sm_y, "g": sm_g}, sm_y * (sm_g - (sm_y * sm_g).sum(axis=1, keepdims=True)))
    g22 = f32(2, 2)
    add("slice-vjp", lambda: one(grad("slice-vjp"), [("g", ["N", "M"], [2, 2], "float32"),
                                                     ("v", ["N", "M"], [5, 2], "float32")],
                                 {"axis": "N", "start": 1, "stop": 4, "step": 2}, ["N", "M"], [5, 2]),
        {"g": g22, "v": v52}, np.array([[0, 0], [1, 2], [0, 0], [3, 4], [0, 0]], np.float32))
    add("window-vjp-pad-dilate-stride", lambda: one(
        grad("window-vjp"), [("g", ["P", "K"], [3, 2], "float32"), ("v", ["N"], [5], "float32")],
        {"axis": "N", "output_axis": "P", "window_axis": "K", "kernel_size": 2, "stride": 2,
         "dilation": 2, "padding": [1, 1], "output_size": None}, ["N"], [5]),
        {"g": f32(3, 2), "v": win_v}, np.array([0.0, 2.0 + 3.0, 0.0, 4.0 + 5.0, 0.0]))  # taps -1,1 | 1,3 | 3,5
    return c


VALID = _cases()
