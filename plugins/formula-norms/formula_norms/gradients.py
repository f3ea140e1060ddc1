"""Gradient rules of the plugin's atoms (SPEC §3c), written with the built-in atoms so the
backward is planned and fused like any program, and so a gradient of a gradient works.

    rms-norm:   x̄ = r·(ȳ − y·mean(ȳ⊙y)),            r = (mean(x²) + ε)^(−½)
    layer-norm: x̄ = r·(ȳ − mean(ȳ) − y·mean(ȳ⊙y)),  r = (var(x) + ε)^(−½)
    softplus:   x̄ = ȳ·σ(x)
    gelu-tanh:  x̄ = ȳ·½(1 + t) + ȳ·½x·c(1 + 3a·x²)·(1 − t²),  t = tanh(c(x + a·x³))
"""
from __future__ import annotations

C = 0.7978845608028654  # sqrt(2 / pi)
A = 0.044715


def _mean(ctx, value, axis):
    return ctx.op("reduce@2", [value], {"axis": axis, "mode": "mean", "accumulation_dtype": "float32"})


def _inverse_deviation(ctx, centred, axis):
    """(mean(centred²) + ε)^(−½) over ``axis`` (the axis removed)."""
    ms = _mean(ctx, ctx.mul(centred, centred), axis)
    return ctx.map(ctx.add(ms, ctx.fill(ms, float(ctx.attributes["epsilon"]))), "rsqrt")


def norm_vjp(ctx):
    x, y, ybar = ctx.inputs[0], ctx.output, ctx.cotangent
    axis = ctx.attributes["axis"]
    t = ctx.type_of(x)
    layer = ctx.atom.name == "layer-norm"
    centred = ctx.sub(x, ctx.broadcast_to(_mean(ctx, x, axis), t)) if layer else x
    r = _inverse_deviation(ctx, centred, axis)
    inner = ctx.sub(ybar, ctx.mul(y, _mean(ctx, ctx.mul(ybar, y), axis)))
    if layer:
        inner = ctx.sub(inner, ctx.broadcast_to(_mean(ctx, ybar, axis), t))
    return {0: ctx.mul(inner, r)}


def activation_vjp(ctx):
    x, ybar = ctx.inputs[0], ctx.cotangent
    if ctx.attributes["mode"] == "softplus":
        return {0: ctx.mul(ybar, ctx.map(x, "sigmoid"))}
    x2 = ctx.mul(x, x)
    u = ctx.mul(ctx.add(x, ctx.mul(ctx.mul(x2, x), ctx.scalar(x, A))), ctx.scalar(x, C))
    half_one_plus_t = ctx.mul(ctx.add(ctx.fill(x, 1.0), ctx.map(u, "tanh")), ctx.scalar(x, 0.5))
    du = ctx.mul(ctx.add(ctx.fill(x, 1.0), ctx.mul(x2, ctx.scalar(x, 3 * A))), ctx.scalar(x, 0.5 * C))
    through_tanh = ctx.map_vjp(u, ctx.mul(ctx.mul(ybar, x), du), "tanh")
    return {0: ctx.add(ctx.mul(ybar, half_one_plus_t), through_tanh)}
