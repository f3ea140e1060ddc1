"""scalar-map-ext: activations the built-in ``scalar-map`` lacks, fusable as epilogues.

    gelu-tanh: 0.5·z·(1 + tanh(√(2/π)·(z + 0.044715·z³)))   (the tanh approximation of GELU)
    softplus:  log(1 + eʸ), evaluated stably as log1p(e^-|z|) + max(z, 0)

Declaring ``elementwise=`` hands the planner a scalar expression per mode, so a chain such as
``contract → scalar-map-ext → scale`` becomes one kernel; the per-backend kernels below run
the atom when it is not fused (the reference backend never fuses).
"""
from __future__ import annotations

import numpy as np

from runtime.plugins.atomspec import AtomSpec, InferContext, Node, ScalarOp, every_axis
from runtime.plugins.kernel import Kernel, KernelRequest, plain_kernel
from runtime.core.types import TensorType
from runtime.toolkit import KERNEL_FLOATS, check_dtypes, launch_config, readonly_c

from .gradients import activation_vjp
from ._refs import refs_for

_C = "0.7978845608028654"  # sqrt(2 / pi), spelled out so the expression is self-contained

# `{0}` is one element of the operand (a plain name); valid Python, njit and cuda device code.
EXPRESSIONS = {
    "gelu-tanh": f"0.5 * {{0}} * (1.0 + math.tanh({_C} * ({{0}} + 0.044715 * {{0}} * {{0}} * {{0}})))",
    "softplus": "math.log1p(math.exp(-abs({0}))) + ({0} if {0} > 0.0 else 0.0)",
}
# The same for generated CPU kernels (ScalarOp's cpu): the runtime's vectorisable tanh, log1p
# and exp, where libm's calls would keep the loop scalar
CPU_EXPRESSIONS = {
    "gelu-tanh": f"0.5 * {{0}} * (1.0 + _vtanh({_C} * ({{0}} + 0.044715 * {{0}} * {{0}} * {{0}})))",
    "softplus": "_vlog1p(_vexp(-abs({0}))) + ({0} if {0} > 0.0 else 0.0)",
}
MODES = tuple(EXPRESSIONS)


def infer_scalar_map_ext(ctx: InferContext) -> TensorType:
    ctx.attr_str("mode", MODES)
    ctx.require_dtype(0, "floating")
    t = ctx.operands[0]
    return ctx.output(t.axes, t.sizes)


def _elementwise(node: Node) -> ScalarOp:
    mode = node.attributes["mode"]
    return ScalarOp(EXPRESSIONS[mode], cpu=CPU_EXPRESSIONS[mode])


def _reference_values(mode: str, x: np.ndarray) -> np.ndarray:
    """The oracle, in the operand dtype (Python float constants are weak under NEP 50)."""
    if mode == "gelu-tanh":
        return 0.5 * x * (1.0 + np.tanh(0.7978845608028654 * (x + 0.044715 * x * x * x)))
    return np.log1p(np.exp(-np.abs(x))) + np.maximum(x, 0.0)


def _reference(request: KernelRequest) -> Kernel:
    node = request.node
    mode = node.attributes["mode"]

    def run(inputs, out):
        out[...] = _reference_values(mode, np.asarray(inputs[0]))
    return plain_kernel(run)


def _cpu(request: KernelRequest) -> Kernel:
    node = request.node
    from . import _cpu

    check_dtypes(node, "cpu", KERNEL_FLOATS, node.input_types[:1])
    kernel = _cpu.ACTIVATIONS[node.attributes["mode"]]

    def run(inputs, out):
        kernel(readonly_c(inputs[0]).reshape(-1), out.reshape(-1))
    return plain_kernel(run)


def _cuda(request: KernelRequest) -> Kernel:
    node = request.node
    check_dtypes(node, "cuda", KERNEL_FLOATS, node.input_types[:1])
    from . import _cuda

    kernel = _cuda.ACTIVATIONS[node.attributes["mode"]]
    n = node.output_type.elements
    blocks, threads = launch_config(n)

    def run(inputs, out):
        kernel[blocks, threads](inputs[0].reshape(n), out.reshape(n))
    return plain_kernel(run)


SPECS = [AtomSpec(
    name="scalar-map-ext", refs=refs_for("scalar-map-ext"), inputs=("value",),
    dtypes={"value": "floating"},
    attributes=frozenset({"mode"}), infer=infer_scalar_map_ext,
    kernels={"reference": _reference, "cpu": _cpu, "cuda": _cuda},
    elementwise=_elementwise, inplace=0, free_axes=every_axis, vjp=activation_vjp, differentiable=(0,),
    summary="elementwise gelu-tanh | softplus; fusable as an epilogue")]
