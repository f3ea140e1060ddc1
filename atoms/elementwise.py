"""Elementwise atoms: scalar-map, scale, add, select (SPEC §3); scalar-map@2, cast@1,
compare@1, boolean-binary@1 and boolean-not@1 (SPEC §3b).

Each declares a :class:`ScalarOp` so the planner can fuse it into chains and anchor
epilogues; on cpu/cuda the single-node kernel is the generic fused-elementwise kernel with a
one-step epilogue, so fused and unfused runs execute the very same scalar code. The scalar
expressions never raise in plain Python and never overflow to NaN (sigmoid/silu evaluate
``exp`` only on non-positive arguments; rsqrt guards 0 and negatives), so they behave the
same under any Numba error model. Note: float literals make Numba evaluate float32 chains in
float64 registers before the store rounds back; results stay within float32 rounding. The
exact gelu is the exception on CPU: its CPU form, vmath.vgelu, evaluates it in float32 (SPEC: c is
float32).
"""
from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from runtime.plugins.atomspec import AtomSpec, InferContext, Node, ScalarOp, every_axis, linear_in
from runtime.plugins.kernel import Counts, Kernel, KernelRequest, plain_kernel
from runtime.toolkit import Epilogue, EpilogueStep, KERNEL_DTYPES, align_to, check_dtypes, first_tier
from runtime.toolkit.cpu import vmath
from runtime.core.types import TensorType, accumulation_dtype, numpy_dtype

from ._refs import refs_for

MODES = ("gelu", "relu", "rsqrt", "sigmoid", "silu", "tanh")

SCALAR_EXPRS = {
    "gelu": vmath.GELU_EXPR,  # (0.5·x·(1 + erf(x/√2))), evaluated on CPU by vmath.vgelu
    "relu": "(0.0 if {0} <= 0.0 else {0})",  # -0.0 -> 0.0 and NaN -> NaN, as np.maximum(x, 0)
    "rsqrt": "((1.0 / math.sqrt({0})) if {0} > 0.0 else "
             "(math.copysign(math.inf, {0}) if {0} == 0.0 else math.nan))",
    # one exp of -|x| (<= 1, never overflows) and one division, branch-free: the compiler
    # merges the two identical exp calls and vectorises the select (2x faster than two exps)
    "sigmoid": "((1.0 if {0} >= 0.0 else math.exp(-abs({0}))) / (1.0 + math.exp(-abs({0}))))",
    "silu": "(({0} if {0} >= 0.0 else {0} * math.exp(-abs({0}))) / (1.0 + math.exp(-abs({0}))))",
    "tanh": "math.tanh({0})",
}
# The same functions for generated CPU kernels, by runtime.kernels.vmath's vectorisable
# helpers (ScalarOp.cpu): libm's exp, erf, tanh, log and log1p keep a loop scalar
SCALAR_CPU = {
    "gelu": "_vgelu({0})",
    "sigmoid": "((1.0 if {0} >= 0.0 else _vexp(-abs({0}))) / (1.0 + _vexp(-abs({0}))))",
    "silu": "(({0} if {0} >= 0.0 else {0} * _vexp(-abs({0}))) / (1.0 + _vexp(-abs({0}))))",
    "tanh": "_vtanh({0})",
}

# scalar-map@2 adds nine modes. The guards give IEEE results where plain Python's math
# raises instead (overflow, log of 0 or x < 0, sin/cos of inf), so every backend agrees.
MODES_V2 = MODES + ("abs", "exp", "expm1", "log", "log1p", "softplus", "reciprocal", "sin", "cos")
SCALAR_EXPRS_V2 = {
    **SCALAR_EXPRS,
    "abs": "abs({0})",
    "exp": "(math.inf if {0} > 709.0 else math.exp({0}))",
    "expm1": "(math.inf if {0} > 709.0 else math.expm1({0}))",
    "log": "(math.log({0}) if {0} > 0.0 else (-math.inf if {0} == 0.0 else math.nan))",
    "log1p": "(math.log1p({0}) if {0} > -1.0 else (-math.inf if {0} == -1.0 else math.nan))",
    "softplus": "({0} if {0} > 20.0 else math.log1p(math.exp({0})))",  # threshold: x > 20 strictly
    "reciprocal": "((1.0 / {0}) if {0} != 0.0 else math.copysign(math.inf, {0}))",
    "sin": "(math.sin({0}) if math.isfinite({0}) else math.nan)",
    "cos": "(math.cos({0}) if math.isfinite({0}) else math.nan)",
}
SCALAR_CPU_V2 = {
    **SCALAR_CPU,
    "exp": "(math.inf if {0} > 709.0 else _vexp({0}))",
    "log": "(_vlog({0}) if {0} > 0.0 else (-math.inf if {0} == 0.0 else math.nan))",
    "log1p": "(_vlog1p({0}) if {0} > -1.0 else (-math.inf if {0} == -1.0 else math.nan))",
    "softplus": "({0} if {0} > 20.0 else _vlog1p(_vexp({0})))",
}
CAST_DTYPES = ("float16", "bfloat16", "float32", "float64")
COMPARE_EXPRS = {"eq": "({0} == {1})", "ne": "({0} != {1})", "lt": "({0} < {1})", "le": "({0} <= {1})",
                 "gt": "({0} > {1})", "ge": "({0} >= {1})"}
BOOLEAN_EXPRS = {"and": "({0} & {1})", "or": "({0} | {1})", "xor": "({0} ^ {1})"}


# --- shared checks -----------------------------------------------------------------------

def require_numeric(ctx: InferContext, operand: int) -> None:
    if ctx.operands[operand].dtype == "boolean":
        ctx.mismatch(f"{ctx.atom.inputs[operand]} must be numeric, got boolean", operand)


def require_identical(ctx: InferContext, a: int, b: int) -> None:
    """SPEC: identical types (axis order, sizes, dtype, domain); symbols may still unify."""
    ta, tb = ctx.operands[a], ctx.operands[b]
    na, nb = ctx.atom.inputs[a], ctx.atom.inputs[b]
    if ta.axes != tb.axes:
        ctx.mismatch(f"{na} has axes {list(ta.axes)} but {nb} has {list(tb.axes)}", b)
    ctx.require_same_dtype_domain(a, b)
    for axis, sa, sb in zip(ta.axes, ta.sizes, tb.sizes):
        ctx.require_extent(sa, sb, f"axis {axis!r} of {na} and {nb}", b)


def require_mask(ctx: InferContext, mask: int, value: int) -> None:
    """A boolean mask whose axes are value axes with extent 1 or the value's (SPEC select)."""
    tm, tv = ctx.operands[mask], ctx.operands[value]
    name = ctx.atom.inputs[mask]
    if tm.dtype != "boolean":
        ctx.mismatch(f"{name} must be boolean, got {tm.dtype}", mask)
    if tm.domain != tv.domain:
        ctx.mismatch(f"{name} is in domain {tm.domain!r} but {ctx.atom.inputs[value]} is in "
                     f"{tv.domain!r}", mask)
    for axis, size in zip(tm.axes, tm.sizes):
        if axis not in tv.axes:
            ctx.mismatch(f"{name} axis {axis!r} is not an axis of {ctx.atom.inputs[value]} "
                         f"(axes {list(tv.axes)})", mask)
        if size != 1:
            ctx.require_extent(size, tv.size_of(axis), f"{name} axis {axis!r} (must be 1 or equal)", mask)


# --- infer -------------------------------------------------------------------------------

def infer_scalar_map(ctx: InferContext) -> TensorType:
    ctx.attr_str("mode", MODES)
    ctx.require_dtype(0, "floating")
    t = ctx.operands[0]
    return ctx.output(t.axes, t.sizes)


def infer_scalar_map_v2(ctx: InferContext) -> TensorType:
    ctx.attr_str("mode", MODES_V2)
    ctx.accumulation()
    ctx.require_dtype(0, "floating")
    t = ctx.operands[0]
    return ctx.output(t.axes, t.sizes)


def infer_cast(ctx: InferContext) -> TensorType:
    dtype = ctx.attr_str("dtype", CAST_DTYPES)
    ctx.require_dtype(0, "floating")
    t = ctx.operands[0]
    return ctx.output(t.axes, t.sizes, dtype=dtype)


def infer_compare(ctx: InferContext) -> TensorType:
    mode = ctx.attr_str("mode", tuple(COMPARE_EXPRS))
    require_identical(ctx, 0, 1)
    t = ctx.operands[0]
    if t.dtype == "boolean" and mode not in ("eq", "ne"):
        ctx.mismatch(f"boolean operands allow only 'eq' and 'ne', not {mode!r}", 0)
    return ctx.output(t.axes, t.sizes, dtype="boolean")


def infer_boolean_binary(ctx: InferContext) -> TensorType:
    ctx.attr_str("mode", tuple(BOOLEAN_EXPRS))
    ctx.require_dtype(0, "boolean")
    require_identical(ctx, 0, 1)
    t = ctx.operands[0]
    return ctx.output(t.axes, t.sizes)


def infer_boolean_not(ctx: InferContext) -> TensorType:
    ctx.require_dtype(0, "boolean")
    t = ctx.operands[0]
    return ctx.output(t.axes, t.sizes)


def infer_scale(ctx: InferContext) -> TensorType:
    value, factor = ctx.operands
    axes = ctx.attr_axes("factor_axes")
    ctx.accumulation()
    if axes != factor.axes:
        ctx.bad_attr("factor_axes", f"must list the factor's axes exactly, in order: "
                                    f"{list(factor.axes)}, got {list(axes)}")
    for axis in axes:
        if axis not in value.axes:
            ctx.bad_attr("factor_axes", f"value has no axis {axis!r} (axes {list(value.axes)})")
    require_numeric(ctx, 0)
    ctx.require_same_dtype_domain(0, 1)
    for axis, size in zip(factor.axes, factor.sizes):
        ctx.require_extent(size, value.size_of(axis), f"factor axis {axis!r}", 1)
    return ctx.output(value.axes, value.sizes)


def infer_add(ctx: InferContext) -> TensorType:
    ctx.accumulation()
    require_numeric(ctx, 0)
    require_identical(ctx, 0, 1)
    t = ctx.operands[0]
    return ctx.output(t.axes, t.sizes)


def infer_select(ctx: InferContext) -> TensorType:
    require_identical(ctx, 1, 2)
    require_mask(ctx, 0, 1)
    t = ctx.operands[1]
    return ctx.output(t.axes, t.sizes, like=1)


# --- reference kernels (the oracle) ------------------------------------------------------

def _erf(x: np.ndarray) -> np.ndarray:
    from scipy.special import erf  # scipy is a hard dependency (numba's BLAS needs it)

    return erf(x)


def scalar_map_numpy(mode: str, x: np.ndarray) -> np.ndarray:
    """The SPEC formulas in NumPy, in x's dtype, written like the ScalarOps they check."""
    with np.errstate(all="ignore"):
        if mode == "gelu":
            return 0.5 * x * (1.0 + _erf(x * 0.7071067811865476))
        if mode == "relu":
            return np.maximum(x, x.dtype.type(0))
        if mode == "rsqrt":
            return 1.0 / np.sqrt(x)
        if mode == "tanh":
            return np.tanh(x)
        e = np.exp(-np.abs(x))  # <= 1: never overflows
        if mode == "sigmoid":
            return np.where(x >= 0, 1.0 / (1.0 + e), e / (1.0 + e))
        if mode == "silu":
            return np.where(x >= 0, x / (1.0 + e), x * e / (1.0 + e))
        if mode in ("abs", "exp", "expm1", "log", "log1p", "sin", "cos"):
            return getattr(np, mode)(x)
        if mode == "softplus":
            return np.where(x > 20, x, np.log1p(np.exp(x)))
        if mode == "reciprocal":
            return 1.0 / x
    raise ValueError(mode)


def scalar_map_first_tier(mode: str, x: np.ndarray, out: np.ndarray | None = None) -> np.ndarray:
    """The first tier's branch-free sigmoid and silu (NumPy's ``where`` on a data-dependent
    mask mispredicts on random signs); within an ulp or two of the oracle's. Computed in
    ``out`` when given (x's dtype and shape, not x's memory): no temporary per step."""
    if mode not in ("sigmoid", "silu"):
        return scalar_map_numpy(mode, x)
    with np.errstate(all="ignore"):  # exp(-x) -> inf for x << 0: x / inf = -0, 1 / inf = 0
        d = np.negative(x, out=out)
        np.exp(d, out=d)
        d += 1
        return np.divide(x if mode == "silu" else 1, d, out=d)


def _acc(node: Node) -> np.dtype:
    """The compute dtype: c(acc, d), except that half operands always compute in float32 and
    round once (SPEC §3b.1: exact for 'float32', within tolerance of arti for 'activation')."""
    t = node.input_types[0] if node.atom.name != "select" else node.input_types[1]
    if t.dtype in ("float16", "bfloat16"):
        return np.dtype(np.float32)
    mode = node.attributes.get("accumulation_dtype", "activation")
    return numpy_dtype(accumulation_dtype(t.dtype, mode))


def _ref_scalar_map(request: KernelRequest) -> Kernel:
    node = request.node
    mode, acc = node.attributes["mode"], _acc(node)

    def run(inputs: Sequence[np.ndarray], out: np.ndarray) -> None:
        with np.errstate(all="ignore"):
            x = np.asarray(inputs[0]).astype(acc, copy=False)
            if not first_tier():
                out[...] = scalar_map_numpy(mode, x)
                return
            into = out if out.dtype == acc and out.shape == x.shape and not np.may_share_memory(x, out) else None
            got = scalar_map_first_tier(mode, x, into)  # (only sigmoid and silu compute in ``into``)
            if got is not out:
                out[...] = got
    return plain_kernel(run)


def _ref_cast(request: KernelRequest) -> Kernel:
    def run(inputs: Sequence[np.ndarray], out: np.ndarray) -> None:
        with np.errstate(all="ignore"):  # beyond the target's range: ±inf
            out[...] = np.asarray(inputs[0]).astype(out.dtype)  # one IEEE rounding, even for f64 -> half
    return plain_kernel(run)


def _ref_compare(request: KernelRequest) -> Kernel:
    node = request.node
    ufunc = {"eq": np.equal, "ne": np.not_equal, "lt": np.less, "le": np.less_equal,
             "gt": np.greater, "ge": np.greater_equal}[node.attributes["mode"]]

    def run(inputs: Sequence[np.ndarray], out: np.ndarray) -> None:
        out[...] = ufunc(np.asarray(inputs[0]), np.asarray(inputs[1]))
    return plain_kernel(run)


def _ref_boolean_binary(request: KernelRequest) -> Kernel:
    node = request.node
    ufunc = {"and": np.logical_and, "or": np.logical_or, "xor": np.logical_xor}[node.attributes["mode"]]

    def run(inputs: Sequence[np.ndarray], out: np.ndarray) -> None:
        out[...] = ufunc(np.asarray(inputs[0]), np.asarray(inputs[1]))
    return plain_kernel(run)


def _ref_boolean_not(request: KernelRequest) -> Kernel:
    def run(inputs: Sequence[np.ndarray], out: np.ndarray) -> None:
        out[...] = np.logical_not(np.asarray(inputs[0]))
    return plain_kernel(run)


def cast_expr(node: Node) -> str:
    """Round to the output dtype inside the chain: on cpu/cuda a half output is float32 here
    (the planner narrows it afterwards), and a chain keeps values in registers."""
    return "np.float64({0})" if node.output_type.dtype == "float64" else "np.float32({0})"


def _ref_scale(request: KernelRequest) -> Kernel:
    node = request.node
    vt, ft = node.input_types
    acc = _acc(node)

    def run(inputs: Sequence[np.ndarray], out: np.ndarray) -> None:
        value, factor = inputs
        f = align_to(np.asarray(factor), ft, vt)
        with np.errstate(all="ignore"):
            _into(np.multiply, np.asarray(value).astype(acc, copy=False), f.astype(acc, copy=False), out)
    return plain_kernel(run)


def _into(ufunc, a: np.ndarray, b: np.ndarray, out: np.ndarray) -> None:
    """``out[...] = ufunc(a, b)``, written straight into ``out`` when it has the operands'
    dtype (the same values, without a temporary as large as the output)."""
    if out.dtype == a.dtype == b.dtype:
        ufunc(a, b, out=out)
    else:
        out[...] = ufunc(a, b)


def _ref_add(request: KernelRequest) -> Kernel:
    node = request.node
    acc = _acc(node)

    def run(inputs: Sequence[np.ndarray], out: np.ndarray) -> None:
        with np.errstate(all="ignore"):  # overflow (in the cast back too) gives inf, as NumPy
            _into(np.add, np.asarray(inputs[0]).astype(acc, copy=False),
                  np.asarray(inputs[1]).astype(acc, copy=False), out)
    return plain_kernel(run)


def _ref_select(request: KernelRequest) -> Kernel:
    node = request.node
    mt, vt, _ = node.input_types

    def run(inputs: Sequence[np.ndarray], out: np.ndarray) -> None:
        mask, t, f = inputs
        out[...] = np.where(align_to(np.asarray(mask), mt, vt), t, f)
    return plain_kernel(run)


# --- cpu / cuda: the generic fused-elementwise kernel with one step ----------------------

def single_step(node: Node) -> Epilogue:
    """The node as a one-step anchorless chain reading each operand as an extra."""
    op = node.atom.elementwise(node)
    n = len(node.input_types)
    return Epilogue((EpilogueStep(node, op, tuple(range(n))),), node.input_slots, node.input_types)


def _unsupported(node: Node, backend: str) -> None:
    check_dtypes(node, backend, KERNEL_DTYPES)


def _cpu(request: KernelRequest) -> Kernel:
    """The node as a one-step chain: it counts the operands the request asks for (the chain
    kernel counts its extras, here the node's operands)."""
    from runtime.toolkit.cpu import elementwise_kernel

    node = request.node
    _unsupported(node, "cpu")
    chain = elementwise_kernel(KernelRequest(None, single_step(node), count_extras=request.count_inputs))
    types, target = node.input_types, node.output_type

    def run(inputs: Sequence[np.ndarray], extras, out: np.ndarray) -> int | None:
        return chain((), [align_to(x, t, target) for x, t in zip(inputs, types)], out)
    return Kernel(run, Counts(inputs=chain.counts.extras))


def _cuda(request: KernelRequest) -> Kernel:
    from runtime.toolkit.cuda import align_device, elementwise_kernel

    node = request.node
    _unsupported(node, "cuda")
    chain = elementwise_kernel(KernelRequest(None, single_step(node)))
    types, target = node.input_types, node.output_type

    def run(inputs, extras, out) -> None:
        chain((), [align_device(x, t, target) for x, t in zip(inputs, types)], out)
    return Kernel(run)


def _op(mode_of):
    return lambda node: ScalarOp(mode_of(node))


def _mode_op(exprs, cpu):
    """The ScalarOp of a node's mode: its expression in ``exprs``, its CPU form in ``cpu``."""
    def op(node):
        mode = node.attributes["mode"]
        return ScalarOp(exprs[mode], cpu=cpu.get(mode))
    return op


def _kernels(reference):
    return {"reference": reference, "cpu": _cpu, "cuda": _cuda}


SPECS = [
    AtomSpec(name="scalar-map", refs=refs_for("scalar-map"), inputs=("value",),
             dtypes={"value": "floating"},
             attributes=frozenset({"mode"}), infer=infer_scalar_map,
             kernels=_kernels(_ref_scalar_map),
             free_axes=every_axis, elementwise=_mode_op(SCALAR_EXPRS, SCALAR_CPU), inplace=0,
             summary="elementwise gelu (exact), relu, rsqrt, sigmoid, silu or tanh"),
    AtomSpec(name="scale", refs=refs_for("scale"), inputs=("value", "factor"),
             dtypes={"value": "numeric", "factor": "numeric"},
             attributes=frozenset({"factor_axes", "accumulation_dtype"}), infer=infer_scale,
             kernels=_kernels(_ref_scale), free_axes=every_axis, elementwise=_op(lambda node: "({0} * {1})"),
             inplace=0, linear=linear_in(0, 1, jointly=False),
             summary="value * factor, factor broadcast by axis name"),
    AtomSpec(name="add", refs=refs_for("add"), inputs=("left", "right"),
             dtypes={"left": "numeric", "right": "numeric"},
             attributes=frozenset({"accumulation_dtype"}), infer=infer_add,
             kernels=_kernels(_ref_add), free_axes=every_axis, elementwise=_op(lambda node: "({0} + {1})"),
             inplace=(0, 1), linear=linear_in(0, 1), summary="left + right of identical types"),
    AtomSpec(name="select", refs=refs_for("select"), inputs=("mask", "when_true", "when_false"),
             dtypes={"mask": "boolean", "when_true": "any", "when_false": "any"},
             attributes=frozenset(), infer=infer_select, kernels=_kernels(_ref_select),
             free_axes=every_axis, elementwise=_op(lambda node: "({1} if {0} else {2})"), inplace=1,
             summary="where(mask, when_true, when_false), mask broadcast by axis name"),
    AtomSpec(name="scalar-map", refs=refs_for("scalar-map", 2), inputs=("value",),
             dtypes={"value": "floating"},
             attributes=frozenset({"mode", "accumulation_dtype"}), infer=infer_scalar_map_v2,
             kernels=_kernels(_ref_scalar_map),
             free_axes=every_axis, elementwise=_mode_op(SCALAR_EXPRS_V2, SCALAR_CPU_V2), inplace=0,
             summary="elementwise: the six @1 modes, abs, exp, expm1, log, log1p, softplus, "
                     "reciprocal, sin, cos; computed in c(acc, d), rounded once"),
    AtomSpec(name="cast", refs=refs_for("cast"), inputs=("value",), attributes=frozenset({"dtype"}),
             dtypes={"value": "floating"},
             infer=infer_cast, kernels=_kernels(_ref_cast), elementwise=_op(cast_expr),
             free_axes=every_axis, linear=linear_in(0),  # (up to its rounding)
             summary="float dtype conversion: round to nearest even, beyond the range ±inf"),
    AtomSpec(name="compare", refs=refs_for("compare"), inputs=("left", "right"),
             dtypes={"left": "any", "right": "any"},
             attributes=frozenset({"mode"}), infer=infer_compare, kernels=_kernels(_ref_compare),
             free_axes=every_axis, elementwise=_op(lambda node: COMPARE_EXPRS[node.attributes["mode"]]),
             summary="elementwise eq, ne, lt, le, gt, ge of identical types -> boolean"),
    AtomSpec(name="boolean-binary", refs=refs_for("boolean-binary"), inputs=("left", "right"),
             dtypes={"left": "boolean", "right": "boolean"},
             attributes=frozenset({"mode"}), infer=infer_boolean_binary,
             kernels=_kernels(_ref_boolean_binary),
             free_axes=every_axis, elementwise=_op(lambda node: BOOLEAN_EXPRS[node.attributes["mode"]]), inplace=0,
             summary="elementwise and, or, xor of identical boolean types"),
    AtomSpec(name="boolean-not", refs=refs_for("boolean-not"), inputs=("value",),
             dtypes={"value": "boolean"},
             attributes=frozenset(), infer=infer_boolean_not, kernels=_kernels(_ref_boolean_not),
             free_axes=every_axis, elementwise=_op(lambda node: "(not {0})"), inplace=0, summary="elementwise not"),
]
