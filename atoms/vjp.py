"""Gradient rules of the built-in atoms (SPEC §3c), one function per atom, keyed by reference.

A rule reads the forward instruction through ``ctx`` (runtime.autodiff.VjpContext) and emits
atoms for the operands ``ctx.wants``: linear atoms by their transpose (contract, scale,
gather/scatter, slice/slice-vjp, window/window-vjp are adjoint pairs), the rest through the
gradient atoms (fill, scalar-map-vjp, masked-softmax-vjp). ``atoms/__init__.py`` attaches
each to its AtomSpec (``AtomSpec.vjp``, ``.differentiable``).
"""
from __future__ import annotations

import math
from collections.abc import Callable

import attrs

from runtime.core.errors import fail


@attrs.frozen
class Rule:
    fn: Callable
    differentiable: tuple[int, ...]


RULES: dict[str, Rule] = {}


def rule(*refs: str, differentiable: tuple[int, ...] = (0,)):
    def register(fn):
        for ref in refs:
            RULES[ref] = Rule(fn, differentiable)
        return fn
    return register


def arti(name: str, version: int = 1) -> str:
    return f"arti/formula-atom-{name}@{version}"


def own(name: str) -> str:
    return f"formula-runtime/formula-atom-{name}@1"


# --- linear and bilinear atoms ------------------------------------------------------------------

@rule(arti("contract"), differentiable=(0, 1))
def contract_vjp(ctx):
    pairs = [tuple(p) for p in ctx.attributes["reduce_axes"]]
    acc = ctx.attributes["accumulation_dtype"]
    grads = {}
    if ctx.wants(0):
        grads[0] = _contract_side(ctx, 0, 1, [(a, b) for a, b in pairs], acc)
    if ctx.wants(1):
        grads[1] = _contract_side(ctx, 1, 0, [(b, a) for a, b in pairs], acc)
    return grads


def _contract_side(ctx, me: int, other: int, pairs, acc: str) -> str:
    """The gradient of one side: ȳ contracted with the other side over the other side's own
    output axes; the other side's reduced axes come out under their partners' names."""
    tm, to = ctx.input_types[me], ctx.input_types[other]
    ybar, ty = ctx.cotangent, ctx.type_of(ctx.cotangent)
    partner = {mine: theirs for mine, theirs in pairs}  # my reduced axis -> the other's
    own_axes = [a for a in to.axes if a in ty.axes and a not in tm.axes]
    o = ctx.inputs[other]
    if own_axes:
        out_axes = [partner.get(a, a) for a in tm.axes]
        # the operand of the result's last (fastest) axis goes right, as N: the kernels write
        # rows of N (attention's dV = Pᵀ·dO: 0.16 against 0.28 ms at S=128, 36 against 43 at 2048)
        last = out_axes[-1] if out_axes else None
        operands = [o, ybar] if last in ty.axes and last not in to.axes else [ybar, o]
        g = ctx.op("contract", operands, {"reduce_axes": [[a, a] for a in own_axes],
                                          "output_axes": out_axes, "accumulation_dtype": acc})
        return ctx.rename(g, {theirs: mine for mine, theirs in pairs})
    # nothing to sum: an outer (or batched) product, ȳ repeated along my reduced axes
    spread = ctx.broadcast_to(ybar, tm)
    return ctx.mul(spread, ctx.rename(o, {theirs: mine for mine, theirs in pairs}), acc)


@rule(arti("scale"), differentiable=(0, 1))
def scale_vjp(ctx):
    tv, tf = ctx.input_types
    acc = ctx.attributes["accumulation_dtype"]
    grads = {}
    if ctx.wants(0):
        grads[0] = ctx.mul(ctx.cotangent, ctx.inputs[1], acc)
    if ctx.wants(1):
        extra = [a for a in tv.axes if a not in tf.axes]
        if extra:
            grads[1] = ctx.op("contract", [ctx.cotangent, ctx.inputs[0]],
                              {"reduce_axes": [[a, a] for a in extra], "output_axes": list(tf.axes),
                               "accumulation_dtype": acc})
        else:
            grads[1] = ctx.permute(ctx.mul(ctx.cotangent, ctx.inputs[0], acc), tf.axes)
    return grads


@rule(arti("add"), differentiable=(0, 1))
def add_vjp(ctx):
    return {i: ctx.cotangent for i in (0, 1) if ctx.wants(i)}


@rule(arti("reduce"))
def reduce_vjp(ctx):
    return {0: ctx.broadcast_to(ctx.cotangent, ctx.input_types[0])}


@rule(arti("reduce", 2))
def reduce2_vjp(ctx):
    x, tx = ctx.inputs[0], ctx.input_types[0]
    axis, mode = ctx.attributes["axis"], ctx.attributes["mode"]
    ybar = ctx.cotangent
    if mode == "sum":
        return {0: ctx.broadcast_to(ybar, tx)}
    if mode == "mean":  # ȳ / n, with n counted from ones (exact below 2^24)
        n = ctx.reduce_sum(ctx.fill(x, 1.0, axes=[axis]), [axis])
        return {0: ctx.mul(ctx.broadcast_to(ybar, tx), ctx.map(n, "reciprocal"))}
    if mode == "amax":  # ties share the cotangent evenly (torch's scale_grad_by_count)
        hit = ctx.ones_where(ctx.compare(x, ctx.broadcast_to(ctx.output, tx), "eq"), x)
        count = ctx.reduce_sum(hit, [axis])
        return {0: ctx.mul(hit, ctx.mul(ybar, ctx.map(count, "reciprocal")))}
    if mode == "logsumexp":  # ȳ · softmax(x)
        visible = ctx.fill(x, True, axes=(), dtype="boolean")
        p = ctx.op("masked-softmax", [x, visible], {"axis": axis, "accumulation_dtype": "float32"})
        return {0: ctx.mul(p, ybar)}
    raise ValueError(f"reduce@2 mode {mode!r}")


# --- layout ---------------------------------------------------------------------------------------

@rule(arti("reshape"))
def reshape_vjp(ctx):
    t = ctx.input_types[0]
    return {0: ctx.reshape(ctx.cotangent, t.axes, t.sizes)}


@rule(arti("permute"))
def permute_vjp(ctx):
    return {0: ctx.permute(ctx.cotangent, ctx.input_types[0].axes)}


@rule(arti("broadcast"))
def broadcast_vjp(ctx):
    return {0: ctx.unbroadcast(ctx.cotangent, ctx.input_types[0])}


SLICE_KEYS = ("axis", "start", "stop", "step")


@rule(arti("slice"))
def slice_vjp(ctx):
    attrs_ = {k: ctx.attributes[k] for k in SLICE_KEYS}
    return {0: ctx.op("slice-vjp", [ctx.cotangent, ctx.inputs[0]], attrs_)}


@rule(arti("concat"), differentiable=(0, 1))
def concat_vjp(ctx):
    axis = ctx.attributes["axis"]
    n = ctx.input_types[0].size_of(axis)
    grads = {}
    if ctx.wants(0):
        grads[0] = ctx.op("slice", [ctx.cotangent], {"axis": axis, "start": 0, "stop": n, "step": 1})
    if ctx.wants(1):
        grads[1] = ctx.op("slice", [ctx.cotangent], {"axis": axis, "start": n, "stop": None, "step": 1})
    return grads


# --- indexing -------------------------------------------------------------------------------------

@rule(arti("gather"), arti("gather", 2), "arti/fold@2")
def gather_vjp(ctx):
    """A scatter-add of ȳ into zeros: repeated indices accumulate."""
    x = ctx.inputs[0]
    return {0: ctx.op("scatter@2", [ctx.zeros(x), ctx.inputs[1], ctx.cotangent],
                      {"axis": ctx.attributes["axis"], "index_axis": ctx.attributes["index_axis"],
                       "mode": "add", "accumulation_dtype": "float32"})}


@rule(arti("scatter"), "arti/unfold@2", differentiable=(0, 2))
def scatter_vjp(ctx):
    """Replace: the base gets ȳ with the scattered positions zeroed, the updates gather(ȳ)."""
    where = {"axis": ctx.attributes["axis"], "index_axis": ctx.attributes["index_axis"]}
    grads = {}
    if ctx.wants(0):
        grads[0] = ctx.op("scatter", [ctx.cotangent, ctx.inputs[1], ctx.zeros(ctx.inputs[2])],
                          {**where, "mode": "replace"})
    if ctx.wants(2):
        grads[2] = ctx.op("gather", [ctx.cotangent, ctx.inputs[1]], where)
    return grads


@rule(arti("scatter", 2), differentiable=(0, 2))
def scatter_add_vjp(ctx):
    grads = {}
    if ctx.wants(0):
        grads[0] = ctx.cotangent
    if ctx.wants(2):
        grads[2] = ctx.op("gather@2", [ctx.cotangent, ctx.inputs[1]],
                          {"axis": ctx.attributes["axis"], "index_axis": ctx.attributes["index_axis"]})
    return grads


@rule(arti("lookup"))
def lookup_vjp(ctx):
    """ȳ's rows scatter-added into zeros at their indices (flattened to one index axis)."""
    table, indices = ctx.inputs
    tt, ti = ctx.input_types
    axis = ctx.attributes["table_axis"]
    p = tt.axes.index(axis)
    before, after = list(tt.axes[:p]), list(tt.axes[p + 1:])
    rows = ctx.permute(ctx.cotangent, before + list(ti.axes) + after)
    n = _product(ti.sizes) if ti.is_static else ctx.writer.fresh_symbol("N")
    flat = _fresh_axis(ctx, tt.axes)
    updates = ctx.reshape(rows, before + [flat] + after,
                          [tt.size_of(a) for a in before] + [n] + [tt.size_of(a) for a in after])
    index = ctx.reshape(indices, [flat], [n])
    return {0: ctx.op("scatter@2", [ctx.zeros(table), index, updates],
                      {"axis": axis, "index_axis": flat, "mode": "add", "accumulation_dtype": "float32"})}


def _product(sizes) -> int:
    return math.prod(sizes)


def _fresh_axis(ctx, taken) -> str:
    name, k = "rows", 0
    while name in taken:
        k += 1
        name = f"rows{k}"
    return name


# --- elementwise ----------------------------------------------------------------------------------

@rule(arti("select"), differentiable=(1, 2))
def select_vjp(ctx):
    mask, ybar = ctx.inputs[0], ctx.cotangent
    zero = ctx.zeros(ybar)
    grads = {}
    if ctx.wants(1):
        grads[1] = ctx.select(mask, ybar, zero)
    if ctx.wants(2):
        grads[2] = ctx.select(mask, zero, ybar)
    return grads


@rule(arti("scalar-map"), arti("scalar-map", 2))
def scalar_map_vjp(ctx):
    acc = ctx.attributes.get("accumulation_dtype", "float32")
    return {0: ctx.map_vjp(ctx.inputs[0], ctx.cotangent, ctx.attributes["mode"], acc)}


@rule(arti("cast"))
def cast_vjp(ctx):
    dtype = ctx.input_types[0].dtype
    if dtype == "floating":
        fail("not_differentiable", ctx.path,
             f"cast: the gradient goes back to the operand's dtype, and {ctx.inputs[0]} is typed "
             "'floating' (declare its concrete dtype to differentiate through this cast)")
    return {0: ctx.cast(ctx.cotangent, dtype)}


@rule(arti("masked-softmax"))
def masked_softmax_vjp(ctx):
    return {0: ctx.op("masked-softmax-vjp", [ctx.output, ctx.cotangent],
                      {"axis": ctx.attributes["axis"],
                       "accumulation_dtype": ctx.attributes["accumulation_dtype"]})}


# --- segment, window ------------------------------------------------------------------------------

@rule(arti("segment"))
def segment_vjp(ctx):
    x, ids, mask = ctx.inputs
    tx = ctx.input_types[0]
    a = ctx.attributes
    mode, axis = a["mode"], a["axis"]
    active = ctx.broadcast_to(mask, tx.evolve(dtype="boolean"))
    ids_full = ctx.broadcast_to(ids, tx.evolve(dtype="int64"))
    safe_ids = ctx.select(active, ids_full, ctx.zeros(ids_full))  # inactive ids may be anything

    def back(s: str) -> str:  # a per-group value at each entry's group
        return ctx.op("gather@2", [s, safe_ids], {"axis": a["segment_axis"], "index_axis": axis})

    def segment_sum(v: str) -> str:
        return ctx.op("segment", [v, ids, mask], {**a, "mode": "sum"})

    def per_member(s: str, counts: str) -> str:  # s / count, empty groups divided by 1
        empty = ctx.compare(counts, ctx.zeros(counts), "eq")
        return ctx.mul(s, ctx.map(ctx.select(empty, ctx.fill(counts, 1.0), counts), "reciprocal"))

    zero = ctx.zeros(x)
    ybar = ctx.cotangent
    if mode == "sum":
        return {0: ctx.select(active, back(ybar), zero)}
    if mode == "mean":
        return {0: ctx.select(active, back(per_member(ybar, segment_sum(ctx.fill(x, 1.0)))), zero)}
    if mode == "amax":
        top = ctx.compare(x, back(ctx.output), "eq")
        hit = ctx.ones_where(ctx.op("boolean-binary", [top, active], {"mode": "and"}), x)
        return {0: ctx.mul(hit, back(per_member(ybar, segment_sum(hit))))}
    if mode == "softmax":  # y ⊙ (ȳ − Σ_group ȳ⊙y), inactive entries 0
        p = ctx.mul(ybar, ctx.output)
        q = ctx.mul(ctx.output, back(segment_sum(p)))
        return {0: ctx.select(active, ctx.sub(p, q), zero)}
    raise ValueError(f"segment mode {mode!r}")


WINDOW_KEYS = ("axis", "output_axis", "window_axis", "kernel_size", "stride", "dilation", "padding",
               "output_size")


@rule(arti("window"))
def window_vjp(ctx):
    return {0: ctx.op("window-vjp", [ctx.cotangent, ctx.inputs[0]],
                      {k: ctx.attributes[k] for k in WINDOW_KEYS})}


# --- observe ----------------------------------------------------------------------------------------

def _activity(ctx, value: str) -> str:
    """The activity in the value's dtype (a boolean activity as 1/0)."""
    act, tv = ctx.inputs[3], ctx.type_of(value)
    if ctx.type_of(act).dtype == "boolean":  # ones made from the value: a 'floating' dtype follows it
        one = ctx.broadcast_to(ctx.fill(value, 1.0, axes=tv.axes[:1]),
                               ctx.type_of(act).evolve(dtype=tv.dtype))
        return ctx.select(act, one, ctx.zeros(one))
    return ctx.cast(act, tv.dtype) if tv.dtype != "floating" else act


def _activity_grad(ctx, g: str) -> str:
    t = ctx.input_types[3]
    return ctx.cast(g, t.dtype) if t.dtype != "floating" else g


@rule(arti("observe-identity"), differentiable=(0, 1, 3))
def observe_identity_vjp(ctx):
    value, _, mask, _ = ctx.inputs
    b, n, d = ctx.input_types[0].axes
    t = ctx.input_types[1].axes[1]
    ybar = ctx.cotangent
    grads = {}
    if ctx.wants(0):
        g = ctx.op("contract", [ybar, _activity(ctx, value)],
                   {"reduce_axes": [[t, t]], "output_axes": [b, n, d], "accumulation_dtype": "float32"})
        grads[0] = ctx.select(mask, g, ctx.zeros(value))
    if ctx.wants(3):  # states are read for their shape only: they get nothing
        shown = ctx.select(mask, value, ctx.zeros(value))
        grads[3] = _activity_grad(ctx, ctx.op("contract", [ybar, shown], {
            "reduce_axes": [[n, n], [d, d]], "output_axes": [b, t], "accumulation_dtype": "float32"}))
    return grads


@rule(arti("observe-affine"), differentiable=(0, 1, 3, 4, 5))
def observe_affine_vjp(ctx):
    """out = mask ? (x·(1 + k·tanh α) + k·tanh β)·a : 0, z = states·weightᵀ + bias = [α; β]."""
    value, states, mask, _, weight, bias = ctx.inputs
    tv, ts, tw = ctx.input_types[0], ctx.input_types[1], ctx.input_types[4]
    b, n, d = tv.axes
    t, s = ts.axes[1], ts.axes[2]
    w = tw.axes[0]
    width = tv.size_of(d)
    k = ctx.attributes["scale"]
    ybar = ctx.cotangent
    z = ctx.op("contract", [states, weight], {"reduce_axes": [[s, s]], "output_axes": [b, t, w],
                                              "accumulation_dtype": "activation"})
    z = ctx.add(z, ctx.broadcast_to(bias, ctx.type_of(z)), "activation")
    alpha = ctx.rename(ctx.op("slice", [z], {"axis": w, "start": 0, "stop": width, "step": 1}), {w: d})
    beta = ctx.rename(ctx.op("slice", [z], {"axis": w, "start": width, "stop": None, "step": 1}), {w: d})
    ta, tb = ctx.map(alpha, "tanh"), ctx.map(beta, "tanh")
    gain = ctx.add(ctx.fill(ta, 1.0), ctx.mul(ta, ctx.scalar(ta, k)))  # 1 + k·tanh α, [b, t, d]
    act = _activity(ctx, value)
    gbar = ctx.select(mask, ctx.mul(ybar, act), ctx.zeros(ybar))  # [b, t, n, d]
    grads = {}
    if ctx.wants(0):
        grads[0] = ctx.op("contract", [gbar, gain], {"reduce_axes": [[t, t]], "output_axes": [b, n, d],
                                                     "accumulation_dtype": "float32"})
    if ctx.wants(3):
        inner = ctx.add(ctx.mul(ctx.broadcast_to(value, ctx.type_of(ybar)), gain),
                        ctx.broadcast_to(ctx.mul(tb, ctx.scalar(tb, k)), ctx.type_of(ybar)))
        shown = ctx.select(mask, inner, ctx.zeros(inner))
        grads[3] = _activity_grad(ctx, ctx.op("contract", [ybar, shown], {
            "reduce_axes": [[n, n], [d, d]], "output_axes": [b, t], "accumulation_dtype": "float32"}))
    if ctx.wants(1) or ctx.wants(4) or ctx.wants(5):
        xg = ctx.op("contract", [gbar, value], {"reduce_axes": [[n, n]], "output_axes": [b, t, d],
                                                "accumulation_dtype": "float32"})
        abar = ctx.map_vjp(alpha, ctx.mul(xg, ctx.scalar(xg, k)), "tanh")
        bsum = ctx.reduce_sum(gbar, [n])
        bbar = ctx.map_vjp(beta, ctx.mul(bsum, ctx.scalar(bsum, k)), "tanh")
        zbar = ctx.op("concat", [ctx.rename(abar, {d: w}), ctx.rename(bbar, {d: w})], {"axis": w})
        if ctx.wants(5):
            grads[5] = ctx.reduce_sum(zbar, [b, t])
        if ctx.wants(4):
            grads[4] = ctx.op("contract", [zbar, states], {"reduce_axes": [[b, b], [t, t]],
                                                           "output_axes": [w, s], "accumulation_dtype": "float32"})
        if ctx.wants(1):
            grads[1] = ctx.op("contract", [zbar, weight], {"reduce_axes": [[w, w]], "output_axes": [b, t, s],
                                                           "accumulation_dtype": "float32"})
    return grads


# --- position -------------------------------------------------------------------------------------

@rule(arti("position-relative"), differentiable=(0, 1))
def position_relative_vjp(ctx):
    tl, tr = ctx.input_types
    ybar = ctx.cotangent
    grads = {}
    if ctx.wants(0):
        grads[0] = ctx.permute(ctx.reduce_sum(ybar, [a for a in tr.axes if a not in tl.axes]), tl.axes)
    if ctx.wants(1):
        summed = ctx.reduce_sum(ybar, [a for a in tl.axes if a not in tr.axes])
        grads[1] = ctx.neg(ctx.permute(summed, tr.axes))
    return grads


@rule(arti("position-rotary"), differentiable=(0, 1))
def position_rotary_vjp(ctx):
    """The value: a rotation by −θ (the rotary atom at the negated coordinates, which are not
    range-checked). Floating coordinates: Σ_i ω_i·(ȳ_2i+1·y_2i − ȳ_2i·y_2i+1) over the pairs,
    summed over the axes the coordinates are broadcast across."""
    value, p = ctx.inputs
    grads = {}
    if ctx.wants(0):
        if ctx.type_of(p).dtype == "int64":
            minus = ctx.mul(p, ctx.fill(p, -1, axes=()), "activation")
        else:
            minus = ctx.neg(p)
        grads[0] = ctx.op("position-rotary", [ctx.cotangent, minus], dict(ctx.attributes))
    if ctx.wants(1):
        axis = ctx.attributes["feature_axis"]
        width = ctx.type_of(value).size_of(axis)
        per_pair = _pair_terms(ctx, ctx.cotangent, ctx.output, axis, sign=-1)
        weighted = ctx.mul(per_pair, _frequencies(ctx, per_pair, axis, width, ctx.attributes["base"]))
        tp = ctx.type_of(p)
        summed = ctx.reduce_sum(weighted, [a for a in ctx.type_of(value).axes if a not in tp.axes])
        grads[1] = ctx.cast(ctx.permute(summed, tp.axes), tp.dtype)
    return grads


@rule(arti("position-sinusoidal"))
def position_sinusoidal_vjp(ctx):
    """Floating coordinates: Σ_i ω_i·(ȳ_2i·cos θ_i − ȳ_2i+1·sin θ_i). An odd W lacks the last
    cosine: the features are recomputed at W + 1 with the base that keeps every ω_i."""
    p = ctx.inputs[0]
    a = ctx.attributes
    axis, width, base = a["feature_axis"], a["feature_size"], float(a["base"])
    y, ybar = ctx.output, ctx.cotangent
    if width % 2:
        wider = {**a, "feature_size": width + 1, "base": base ** ((width + 1) / width)}
        y = ctx.op("position-sinusoidal", [p], wider)
        end = ctx.op("slice", [ybar], {"axis": axis, "start": 0, "stop": 1, "step": 1})
        ybar = ctx.op("concat", [ybar, ctx.zeros(end)], {"axis": axis})
        width, base = width + 1, wider["base"]
    per_pair = _pair_terms(ctx, ybar, y, axis, sign=1)
    weighted = ctx.mul(per_pair, _frequencies(ctx, per_pair, axis, width, base))
    tp = ctx.type_of(p)
    return {0: ctx.cast(ctx.permute(ctx.reduce_sum(weighted, [axis]), tp.axes), tp.dtype)}


def _pair_terms(ctx, ybar: str, y: str, axis: str, sign: int) -> str:
    """Per feature pair i: ȳ_2i·y_2i+1 − ȳ_2i+1·y_2i (sign 1) or its negation (sign −1)."""
    def half(v, start):
        return ctx.op("slice", [v], {"axis": axis, "start": start, "stop": None, "step": 2})

    first = ctx.mul(half(ybar, 0), half(y, 1))
    second = ctx.mul(half(ybar, 1), half(y, 0))
    return ctx.sub(first, second) if sign > 0 else ctx.sub(second, first)


def _frequencies(ctx, like: str, axis: str, width: int, base: float) -> str:
    """ω_i = base^(−2i/W) along ``axis`` of ``like`` (one entry per pair), built from i + 1 =
    #{j ≤ i}: a program has no literals, so the ramp is counted from axis-index comparisons."""
    t = ctx.type_of(like)
    pairs = t.size_of(axis)
    other = _fresh_axis(ctx, t.axes)
    i = ctx.op("axis-index", [like], {"axis": axis})
    j = ctx.rename(i, {axis: other})
    square = t.evolve(axes=(axis, other), sizes=(pairs, pairs), dtype="int64")
    below = ctx.compare(ctx.broadcast_to(i, square), ctx.broadcast_to(j, square), "ge")
    one = ctx.broadcast_to(ctx.fill(like, 1.0, axes=[axis]), square.evolve(dtype=t.dtype))
    ones = ctx.select(below, one, ctx.zeros(one))  # (from ``like``: a 'floating' dtype follows it)
    count = ctx.reduce_sum(ones, [other])  # i + 1, exact
    k = -2.0 * math.log(base) / width
    exponent = ctx.add(ctx.mul(count, ctx.scalar(count, k)), ctx.fill(count, -k))
    return ctx.map(exponent, "exp")


# --- the gradient atoms (so that vjp(vjp(P)) closes) -----------------------------------------------

@rule(own("fill"))
def fill_vjp(ctx):
    return {}  # a constant: its reference's values are never read


@rule(own("slice-vjp"), differentiable=(0, 1))
def slice_vjp_vjp(ctx):
    if not ctx.wants(0):
        return {}
    return {0: ctx.op("slice", [ctx.cotangent], {k: ctx.attributes[k] for k in SLICE_KEYS})}


@rule(own("window-vjp"), differentiable=(0, 1))
def window_vjp_vjp(ctx):
    if not ctx.wants(0):
        return {}
    return {0: ctx.op("window", [ctx.cotangent], {k: ctx.attributes[k] for k in WINDOW_KEYS})}


@rule(own("masked-softmax-vjp"), differentiable=(0, 1))
def masked_softmax_vjp_vjp(ctx):
    """out = y⊙ȳ − y·S, S = Σ ȳ⊙y: symmetric in ȳ, and c⊙(ȳ − S) − ȳ·Σ c⊙y for y."""
    y, ybar = ctx.inputs
    c = ctx.cotangent
    axis = ctx.attributes["axis"]
    grads = {}
    if ctx.wants(1):
        grads[1] = ctx.op("masked-softmax-vjp", [y, c], dict(ctx.attributes))
    if ctx.wants(0):
        ty = ctx.type_of(y)
        s = ctx.broadcast_to(ctx.reduce_sum(ctx.mul(ybar, y), [axis]), ty)
        t = ctx.reduce_sum(ctx.mul(c, y), [axis])
        grads[0] = ctx.sub(ctx.mul(c, ctx.sub(ybar, s)), ctx.mul(ybar, t))
    return grads


@rule(own("scalar-map-vjp"), differentiable=(0, 1))
def scalar_map_vjp_vjp(ctx):
    """ȳ·f′(x) is linear in ȳ (its gradient: c·f′(x)); for x it is c·ȳ·f″(x)."""
    x, ybar = ctx.inputs
    c = ctx.cotangent
    mode, acc = ctx.attributes["mode"], ctx.attributes["accumulation_dtype"]
    grads = {}
    if ctx.wants(1):
        grads[1] = ctx.map_vjp(x, c, mode, acc)
    if ctx.wants(0):
        second = _second_derivative(ctx, x, ctx.mul(c, ybar), mode)
        if second is not None:
            grads[0] = second
    return grads


def _second_derivative(ctx, x: str, u: str, mode: str) -> str | None:
    """u·f″(x) in atoms (None where f″ = 0: relu, abs)."""
    def const(v):
        return ctx.scalar(x, v)

    def one_minus_twice(s):  # 1 − 2s
        return ctx.add(ctx.fill(s, 1.0), ctx.mul(s, const(-2.0)))

    if mode in ("relu", "abs"):
        return None
    if mode in ("exp", "expm1"):
        return ctx.map_vjp(x, u, "exp")                       # f″ = eˣ
    if mode == "sin":
        return ctx.map_vjp(x, u, "cos")                       # −sin x
    if mode == "cos":
        return ctx.neg(ctx.mul(u, ctx.map(x, "cos")))         # −cos x
    if mode == "log":
        return ctx.map_vjp(x, u, "reciprocal")                # −1/x²
    if mode == "log1p":
        return ctx.map_vjp(ctx.add(x, ctx.fill(x, 1.0)), u, "reciprocal")
    if mode == "reciprocal":                                  # 2/x³
        r = ctx.map(x, "reciprocal")
        return ctx.mul(ctx.mul(u, ctx.mul(ctx.mul(r, r), r)), const(2.0))
    if mode == "rsqrt":                                       # ¾·x^(−5/2)
        r = ctx.map(x, "rsqrt")
        r2 = ctx.mul(r, r)
        return ctx.mul(ctx.mul(u, ctx.mul(ctx.mul(r2, r2), r)), const(0.75))
    if mode == "tanh":                                        # −2·tanh·(1 − tanh²)
        return ctx.map_vjp(x, ctx.mul(ctx.mul(u, ctx.map(x, "tanh")), const(-2.0)), "tanh")
    if mode == "sigmoid":                                     # σ′·(1 − 2σ)
        return ctx.map_vjp(x, ctx.mul(u, one_minus_twice(ctx.map(x, "sigmoid"))), "sigmoid")
    if mode == "silu":                                        # σ′·(2 + x(1 − 2σ))
        k = ctx.add(ctx.fill(x, 2.0), ctx.mul(x, one_minus_twice(ctx.map(x, "sigmoid"))))
        return ctx.map_vjp(x, ctx.mul(u, k), "sigmoid")
    if mode == "softplus":                                    # σ′ for x ≤ 20, else 0
        big = ctx.compare(x, ctx.fill(x, 20.0), "gt")
        return ctx.select(big, ctx.zeros(x), ctx.map_vjp(x, u, "sigmoid"))
    if mode == "gelu":                                        # φ(x)·(2 − x²)
        x2 = ctx.mul(x, x)
        phi = ctx.mul(ctx.map(ctx.mul(x2, const(-0.5)), "exp"), const(1.0 / math.sqrt(2.0 * math.pi)))
        return ctx.mul(u, ctx.mul(phi, ctx.sub(ctx.fill(x, 2.0), x2)))
    raise ValueError(f"scalar-map-vjp mode {mode!r}")
