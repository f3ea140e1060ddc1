"""scalar-map-vjp@1 (SPEC §3c): ȳ·f′(x) for every scalar-map@2 mode as a two-operand
:class:`ScalarOp` (it joins the epilogue of the contraction producing ȳ). As scalar-map@2's
expressions, the expressions never raise in plain Python or under Numba's Python error model:
every division and every ``math`` call that could raise is guarded."""
from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from runtime.core.types import TensorType
from runtime.plugins.atomspec import AtomSpec, InferContext, ScalarOp, every_axis
from runtime.plugins.kernel import Kernel, KernelRequest, plain_kernel

from ._grad import SCALAR_MAP_VJP_REF, require_pair
from .elementwise import MODES_V2, _acc, _cpu as _elementwise_cpu, _cuda as _elementwise_cuda

# {0} is x, {1} is ȳ. exp(-|x|) <= 1 never overflows; sigmoid and 1 - sigmoid from it alone.
_E = "math.exp(-abs({0}))"
_SIGMOID = "((1.0 if {0} >= 0.0 else " + _E + ") / (1.0 + " + _E + "))"
_ONE_MINUS_SIGMOID = "((" + _E + " if {0} >= 0.0 else 1.0) / (1.0 + " + _E + "))"
_INV_SQRT = "(1.0 / math.sqrt({0}))"
VJP_EXPRS = {
    # Φ(x) + x·φ(x), Φ as ½(1 + erf) as torch's gelu backward: erf and exp vectorise on cpu
    # (vmath; erfc would keep the whole loop scalar); x·φ(x) is 0 beyond |x| = 40 (where x·x
    # would only make inf·0 of an infinite x)
    "gelu": "({1} * (0.5 * (1.0 + math.erf(0.7071067811865476 * {0})) + "
            "(({0} * 0.3989422804014327 * math.exp(-0.5 * {0} * {0})) if abs({0}) < 40.0 else 0.0)))",
    # relu′(0) = abs′(0) = 0: a select (ȳ = ±inf still gives 0 there); x - x keeps a NaN x NaN
    "relu": "({1} if {0} > 0.0 else ({0} - {0}))",
    "abs": "({1} if {0} > 0.0 else ((-{1}) if {0} < 0.0 else ({0} - {0})))",
    # -½·x^(-3/2) as (1/√x)³ (x·√x could underflow to 0); ±0 gives ∓inf·ȳ as torch's
    # -½·ȳ·rsqrt(x)³ does, x < 0 NaN
    "rsqrt": "((-0.5 * {1} * (" + _INV_SQRT + " * " + _INV_SQRT + " * " + _INV_SQRT + ")) if {0} > 0.0 else "
             "(((-{1}) * math.copysign(math.inf, {0})) if {0} == 0.0 else math.nan))",
    "sigmoid": "({1} * (" + _E + " / ((1.0 + " + _E + ") * (1.0 + " + _E + "))))",
    "silu": "({1} * (" + _SIGMOID + " * (1.0 + {0} * " + _ONE_MINUS_SIGMOID + ")))",
    "tanh": "({1} * (1.0 - math.tanh({0}) * math.tanh({0})))",
    "exp": "({1} * (math.inf if {0} > 709.78 else math.exp({0})))",
    "expm1": "({1} * (math.inf if {0} > 709.78 else math.exp({0})))",
    "log": "(({1} / {0}) if {0} != 0.0 else ({1} * math.copysign(math.inf, {0})))",
    "log1p": "(({1} / (1.0 + {0})) if (1.0 + {0}) != 0.0 else ({1} * math.inf))",
    "softplus": "({1} if {0} > 20.0 else ({1} * " + _SIGMOID + "))",
    "reciprocal": "(((-{1}) / ({0} * {0})) if ({0} * {0}) != 0.0 else ((-{1}) * math.inf))",
    "sin": "({1} * (math.cos({0}) if math.isfinite({0}) else math.nan))",
    "cos": "((-{1}) * (math.sin({0}) if math.isfinite({0}) else math.nan))",
}
assert set(VJP_EXPRS) == set(MODES_V2)
# The same derivatives for generated CPU kernels (ScalarOp.cpu): exp, erf and tanh by
# runtime.kernels.vmath's vectorisable helpers
_VE = "_vexp(-abs({0}))"
_VSIGMOID = "((1.0 if {0} >= 0.0 else " + _VE + ") / (1.0 + " + _VE + "))"
_VONE_MINUS_SIGMOID = "((" + _VE + " if {0} >= 0.0 else 1.0) / (1.0 + " + _VE + "))"
VJP_CPU = {
    "gelu": "({1} * _vgelu_grad({0}))",  # (in float32 for float32 x: runtime.kernels.vmath)
    "sigmoid": "({1} * (" + _VE + " / ((1.0 + " + _VE + ") * (1.0 + " + _VE + "))))",
    "silu": "({1} * (" + _VSIGMOID + " * (1.0 + {0} * " + _VONE_MINUS_SIGMOID + ")))",
    "tanh": "({1} * (1.0 - _vtanh({0}) * _vtanh({0})))",
    "exp": "({1} * (math.inf if {0} > 709.78 else _vexp({0})))",
    "expm1": "({1} * (math.inf if {0} > 709.78 else _vexp({0})))",
    "softplus": "({1} if {0} > 20.0 else ({1} * " + _VSIGMOID + "))",
}


def infer_scalar_map_vjp(ctx: InferContext) -> TensorType:
    ctx.attr_str("mode", MODES_V2)
    ctx.accumulation()
    t = require_pair(ctx)
    return ctx.output(t.axes, t.sizes)


def _erfc(x: np.ndarray) -> np.ndarray:
    from scipy.special import erfc  # scipy is a hard dependency (numba's BLAS needs it)

    return erfc(x)


def scalar_map_vjp_numpy(mode: str, x: np.ndarray, g: np.ndarray) -> np.ndarray:
    """ȳ·f′(x) in x's dtype, with SPEC §3c's conventions, written like the ScalarOps it checks."""
    with np.errstate(all="ignore"):
        if mode == "gelu":
            tail = np.where(np.abs(x) < 40, x * 0.3989422804014327 * np.exp(-0.5 * x * x), 0)
            return g * (0.5 * _erfc(-0.7071067811865476 * x) + tail)
        if mode == "relu":
            return np.where(x > 0, g, x - x)
        if mode == "abs":
            return np.where(x > 0, g, np.where(x < 0, -g, x - x))
        if mode == "rsqrt":
            r = 1 / np.sqrt(x)
            return np.where(x > 0, -0.5 * g * (r * r * r),
                            np.where(x == 0, -g * np.copysign(np.inf, x).astype(x.dtype), np.nan))
        if mode == "tanh":
            t = np.tanh(x)
            return g * (1 - t * t)
        if mode in ("exp", "expm1"):
            return g * np.exp(x)
        if mode == "log":
            return np.where(x != 0, g / x, g * np.copysign(np.inf, x).astype(x.dtype))
        if mode == "log1p":
            d = 1 + x
            return np.where(d != 0, g / d, g * np.inf)
        if mode == "reciprocal":
            s = x * x
            return np.where(s != 0, -g / s, -g * np.inf)
        if mode == "sin":
            return g * np.cos(x)
        if mode == "cos":
            return -g * np.sin(x)
        e = np.exp(-np.abs(x))
        sigmoid = np.where(x >= 0, 1, e) / (1 + e)
        if mode == "sigmoid":
            return g * (e / ((1 + e) * (1 + e)))
        if mode == "silu":
            return g * (sigmoid * (1 + x * (np.where(x >= 0, e, 1) / (1 + e))))
        if mode == "softplus":
            return np.where(x > 20, g, g * sigmoid)
    raise ValueError(mode)


def _ref_scalar_map_vjp(request: KernelRequest) -> Kernel:
    node = request.node
    mode, acc = node.attributes["mode"], _acc(node)

    def run(inputs: Sequence[np.ndarray], out: np.ndarray) -> None:
        x, g = (np.asarray(v).astype(acc) for v in inputs)
        with np.errstate(all="ignore"):  # overflow in the final rounding gives ±inf
            out[...] = scalar_map_vjp_numpy(mode, x, g)
    return plain_kernel(run)


SPECS = [
    AtomSpec(name="scalar-map-vjp", refs=(SCALAR_MAP_VJP_REF,), inputs=("value", "cotangent"),
             dtypes={"value": "floating", "cotangent": "floating"},
             attributes=frozenset({"mode", "accumulation_dtype"}), infer=infer_scalar_map_vjp,
             kernels={"reference": _ref_scalar_map_vjp, "cpu": _elementwise_cpu,
                      "cuda": _elementwise_cuda},
             elementwise=lambda node: ScalarOp(VJP_EXPRS[node.attributes["mode"]],
                                                cpu=VJP_CPU.get(node.attributes["mode"])), inplace=1,
             free_axes=every_axis,
             summary="ȳ·f′(x) for every scalar-map@2 mode, elementwise; in c(acc, d), rounded once"),
]
