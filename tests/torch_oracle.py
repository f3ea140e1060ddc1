"""A small torch re-implementation of the format's atoms (named axes by einsum and permutes),
so torch.autograd can check the gradient programs (tests/test_autodiff.py). Float64 only; it
covers the atoms those tests differentiate and refuses the others."""
from __future__ import annotations

import torch
import torch.nn.functional as F

LETTERS = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ"


def _align(value, axes, target):
    """``value`` (axes ``axes``, a subset of ``target``) viewed with ``target``'s axes, extent 1
    where it lacks one."""
    order = [a for a in target if a in axes]
    v = value.permute([axes.index(a) for a in order]) if order else value
    shape = [v.shape[order.index(a)] if a in axes else 1 for a in target]
    return v.reshape(shape)


MAPS = {
    "gelu": lambda x: F.gelu(x), "relu": torch.relu, "rsqrt": torch.rsqrt, "sigmoid": torch.sigmoid,
    "silu": F.silu, "tanh": torch.tanh, "abs": torch.abs, "exp": torch.exp, "expm1": torch.expm1,
    "log": torch.log, "log1p": torch.log1p, "softplus": lambda x: F.softplus(x, threshold=20.0),
    "reciprocal": torch.reciprocal, "sin": torch.sin, "cos": torch.cos,
}


def interpret(program: dict):
    """``fn(**values) -> {output slot: tensor}`` computing ``program`` with torch ops."""
    axes = {s["slot_id"]: list(s["value_type"]["axes"]) for s in program["slots"]}

    def fn(**values):
        env = dict(values)
        for ins in program["instructions"]:
            name = ins["atom_ref"].split("@")[0].rpartition("/")[2].removeprefix("formula-atom-")
            version = ins["atom_ref"].rpartition("@")[2]
            a = ins["attributes"]
            xs = [env[s] for s in ins["input_slots"]]
            ax = [axes[s] for s in ins["input_slots"]]
            out_axes = axes[ins["output_slot"]]
            env[ins["output_slot"]] = _atom(name, version, a, xs, ax, out_axes)
        return {o: env[o] for o in program["outputs"]}
    return fn


def _atom(name, version, a, xs, ax, out_axes):
    if name == "contract":
        labels: dict[str, str] = {}
        for axis in ax[0]:
            labels.setdefault(axis, LETTERS[len(labels)])
        pairs = {r: l for l, r in a["reduce_axes"]}
        right = []
        for axis in ax[1]:
            if axis in pairs:
                right.append(labels[pairs[axis]])
            else:
                right.append(labels.setdefault(axis, LETTERS[len(labels)]))
        spec = f"{''.join(labels[x] for x in ax[0])},{''.join(right)}->{''.join(labels[x] for x in out_axes)}"
        return torch.einsum(spec, xs[0], xs[1])
    if name == "scale":
        return xs[0] * _align(xs[1], ax[1], ax[0])
    if name == "add":
        return xs[0] + xs[1]
    if name == "scalar-map":
        return MAPS[a["mode"]](xs[0])
    if name == "reduce":
        d = ax[0].index(a["axis"])
        mode = a["mode"]
        if mode == "sum":
            return xs[0].sum(d)
        if mode == "mean":
            return xs[0].mean(d)
        if mode == "amax":
            return xs[0].amax(d)
        return torch.logsumexp(xs[0], d)
    if name == "reshape":
        sizes = [int(s) if isinstance(s, int) else -1 for s in a["output_sizes"]]
        return xs[0].reshape(sizes)
    if name == "permute":
        return xs[0].permute([ax[0].index(x) for x in out_axes])
    if name == "broadcast":
        v = _align(xs[0], ax[0], out_axes)
        return v.expand([s if isinstance(s, int) else -1 for s in a["output_sizes"]])
    if name == "slice":
        d = ax[0].index(a["axis"])
        index = [slice(None)] * len(ax[0])
        index[d] = slice(a["start"], a["stop"], a["step"])
        return xs[0][tuple(index)]
    if name == "concat":
        return torch.cat(xs, ax[0].index(a["axis"]))
    if name == "select":
        return torch.where(_align(xs[0], ax[0], ax[1]), xs[1], xs[2])
    if name == "cast":
        return xs[0].to(torch.float32 if a["dtype"] == "float32" else torch.float64).to(torch.float64)
    if name == "masked-softmax":
        d = ax[0].index(a["axis"])
        m = _align(xs[1], ax[1], ax[0]).expand_as(xs[0])
        logits = xs[0].masked_fill(~m, float("-inf"))
        return torch.nan_to_num(torch.softmax(logits, d), nan=0.0) * m
    if name in ("gather",):
        d = ax[0].index(a["axis"])
        index = xs[1].reshape(-1)
        return torch.index_select(xs[0], d, index)
    raise NotImplementedError(f"torch oracle: atom {name}@{version}")
