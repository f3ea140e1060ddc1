"""rms-norm and layer-norm over one named axis.

    rms-norm:   y = x / sqrt(mean(x², axis) + epsilon)
    layer-norm: y = (x - mean(x, axis)) / sqrt(mean((x - mean)², axis) + epsilon)

computed in the accumulation dtype (SPEC §3 ``acc``) and cast back to the operand dtype; the
output type is the operand's. Neither has affine parameters: a weight is the built-in
``scale`` atom and a bias the built-in ``add``, which the planner fuses as elementwise steps,
so one pair of norm atoms serves every affine variant (with or without bias, per-axis weights).
"""
from __future__ import annotations

import math

import numpy as np

from runtime.plugins.atomspec import AtomSpec, InferContext, Node, axes_except
from runtime.plugins.kernel import Kernel, KernelRequest, plain_kernel
from runtime.core.types import TensorType, accumulation_dtype, numpy_dtype
from runtime.toolkit import KERNEL_FLOATS, check_dtypes, launch_config, parallel_threshold, readonly_c, rows_shape

from .gradients import norm_vjp
from ._refs import refs_for

ATTRIBUTES = frozenset({"axis", "epsilon", "accumulation_dtype"})


def infer_norm(ctx: InferContext) -> TensorType:
    """Validate axis, epsilon and accumulation; the output has the operand's type."""
    ctx.axis_of("axis", 0)
    epsilon = ctx.attr_number("epsilon", minimum_exclusive=0.0)
    if not math.isfinite(epsilon):
        ctx.bad_attr("epsilon", f"expected a finite number > 0, got {epsilon}")
    ctx.accumulation()
    ctx.require_dtype(0, "floating")
    t = ctx.operands[0]
    return ctx.output(t.axes, t.sizes)


# --- reference: the oracle --------------------------------------------------------------
def _reference(kind: str):
    def factory(request: KernelRequest) -> Kernel:
        node = request.node
        axis = node.input_types[0].axes.index(node.attributes["axis"])
        epsilon = float(node.attributes["epsilon"])
        acc = numpy_dtype(accumulation_dtype(node.input_types[0].dtype,
                                             node.attributes["accumulation_dtype"]))

        def run(inputs, out):
            x = np.asarray(inputs[0]).astype(acc)  # always a copy: the input stays untouched
            n = x.shape[axis]
            if kind == "rms-norm":
                ms = np.sum(x * x, axis=axis, keepdims=True, dtype=acc) / n
                y = x / np.sqrt(ms + epsilon)
            else:
                mu = np.sum(x, axis=axis, keepdims=True, dtype=acc) / n
                d = x - mu
                var = np.sum(d * d, axis=axis, keepdims=True, dtype=acc) / n
                y = d / np.sqrt(var + epsilon)
            out[...] = y.astype(out.dtype, copy=False)
        return plain_kernel(run)
    return factory


def _kernel_dtype(node: Node, backend: str) -> np.dtype:
    """The dtype the compiled kernels run in; float16/bfloat16 only on the reference oracle."""
    check_dtypes(node, backend, KERNEL_FLOATS, node.input_types[:1])
    return np.dtype(node.input_types[0].dtype)


# --- cpu: numba njit --------------------------------------------------------------------
def _cpu(kind: str):
    def factory(request: KernelRequest) -> Kernel:
        node = request.node
        from . import _cpu

        dt = _kernel_dtype(node, "cpu")
        shape3 = rows_shape(node.input_types[0], node.attributes["axis"])
        eps, inv_n, zero = dt.type(node.attributes["epsilon"]), dt.type(1.0 / shape3[1]), dt.type(0)
        twins = _cpu.NORMS[kind]
        kernel = twins.pick(node.output_type.elements >= parallel_threshold() and shape3[0] > 1)

        def run(inputs, out):
            kernel(readonly_c(inputs[0]).reshape(shape3), out.reshape(shape3), eps, inv_n, zero)
        return plain_kernel(run, warm=twins.warm)
    return factory


# --- cuda: numba.cuda (imported here, lazily) ---------------------------------------------
def _cuda(kind: str):
    def factory(request: KernelRequest) -> Kernel:
        node = request.node
        dt = _kernel_dtype(node, "cuda")
        from . import _cuda

        shape3 = rows_shape(node.input_types[0], node.attributes["axis"])
        eps, inv_n, zero = dt.type(node.attributes["epsilon"]), dt.type(1.0 / shape3[1]), dt.type(0)
        kernel = _cuda.NORMS[kind]
        blocks, threads = launch_config(shape3[0] * shape3[2])

        def run(inputs, out):
            kernel[blocks, threads](inputs[0].reshape(shape3), out.reshape(shape3), eps, inv_n, zero)
        return plain_kernel(run)
    return factory


def _spec(name: str, summary: str) -> AtomSpec:
    return AtomSpec(
        name=name, refs=refs_for(name), inputs=("value",), attributes=ATTRIBUTES,
        dtypes={"value": "floating"},
        infer=infer_norm,
        kernels={"reference": _reference(name), "cpu": _cpu(name), "cuda": _cuda(name)},
        free_axes=axes_except("axis"), vjp=norm_vjp, differentiable=(0,), summary=summary)


SPECS = [
    _spec("rms-norm", "x / sqrt(mean(x², axis) + epsilon) over one named axis"),
    _spec("layer-norm", "(x - mean) / sqrt(var + epsilon) over one named axis, no affine"),
]
