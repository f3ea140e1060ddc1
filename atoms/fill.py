"""fill@1 (SPEC §3c): a constant over some of the reference's axes, whose values it never
reads. When its axes are the reference's, in order, it is a constant :class:`ScalarOp`, so the
planner fuses it into its reader's chain and it never reaches memory; otherwise its own kernel
stores the constant's bits (every dtype, half included, with no conversion)."""
from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np
from numba import njit, prange

from runtime.core.errors import json_kind
from runtime.core.types import TensorType, is_float, numpy_dtype
from runtime.plugins.atomspec import AtomSpec, InferContext, Linear, Node, ScalarOp, every_axis
from runtime.plugins.kernel import CompiledCall, Kernel, KernelRequest, const_array, flat_output, plain_kernel
from runtime.toolkit import Twins

from . import _rows
from ._grad import FILL_REF, HALF_NATIVE, _compilable, _kernels
from .layout import BITS, out_bits

FILL_DTYPES = ("floating", "float16", "bfloat16", "float32", "float64", "int64", "boolean")
INT64_MIN, INT64_MAX = -(1 << 63), (1 << 63) - 1


def fill_dtype(dtype: str, reference: str) -> str:
    """SPEC §3c: ``floating`` is the reference's float dtype, or float32 for another reference."""
    if dtype != "floating":
        return dtype
    return reference if is_float(reference) else "float32"


def _shown(v: int | float) -> str:
    """``v`` for a message: a huge integer by its size (its digits could be thousands, and
    Python refuses to print more than 4300)."""
    return f"an integer of {v.bit_length()} bits" if isinstance(v, int) and abs(v) >= 1 << 80 else repr(v)


def _fill_value(ctx: InferContext, dtype: str) -> None:
    v = ctx.attributes["value"]
    if dtype == "boolean":
        if not isinstance(v, bool):
            ctx.bad_attr("value", f"a boolean fill takes a JSON bool, got {json_kind(v)}")
        return
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        ctx.bad_attr("value", f"expected a number, got {json_kind(v)}")
    if dtype == "int64":
        if not isinstance(v, int):
            ctx.bad_attr("value", f"an int64 fill takes a JSON integer, got {v!r}")
        if not INT64_MIN <= v <= INT64_MAX:
            ctx.bad_attr("value", f"{_shown(v)} is outside int64's range")
        return
    try:
        finite = math.isfinite(float(v))
    except OverflowError:  # an integer beyond every double: JSON would give inf
        finite = False
    if not finite:
        ctx.bad_attr("value", f"expected a finite number, got {_shown(v)}")


def infer_fill(ctx: InferContext) -> TensorType:
    t = ctx.operands[0]
    axes = ctx.attr_axes("axes")
    for axis in axes:
        if axis not in t.axes:
            ctx.bad_attr("axes", f"reference has no axis {axis!r} (axes {list(t.axes)})")
    dtype = ctx.attr_str("dtype", FILL_DTYPES)
    _fill_value(ctx, dtype)
    return ctx.output(axes, [t.size_of(a) for a in axes], dtype=fill_dtype(dtype, t.dtype))


def fill_constant(node: Node) -> np.ndarray:
    """The value rounded once to the output dtype (a 0-d array): the JSON double, overflowing to
    ±inf as cast@1 does; an int64 or a bool as it is."""
    dt = numpy_dtype(node.output_type.dtype)
    v = node.attributes["value"]
    if dt.kind == "f":
        with np.errstate(over="ignore"):
            return np.array(float(v), np.float64).astype(dt)
    return np.array(v, dt)


def _literal(node: Node) -> str:
    """The constant as an expression every backend's chain code compiles, exactly."""
    c = fill_constant(node)
    dtype = node.output_type.dtype
    if dtype == "boolean":
        return "True" if bool(c) else "False"
    if dtype == "int64":
        v = int(c)  # the most negative int64 has no positive literal of its own type
        return f"np.int64({v})" if v > INT64_MIN else "(np.int64(-9223372036854775807) - np.int64(1))"
    f = float(c)
    if math.isinf(f):
        return "math.inf" if f > 0 else "(-math.inf)"
    return f"np.{dtype}({f!r})"


def fill_op(node: Node) -> ScalarOp | None:
    """A constant chain step when the output has the reference's axes and extents in order (the
    chain then reads the reference at the output's index, and fuses into its reader); None
    otherwise, and for half types, which chains never hold (fill runs its own kernel then)."""
    t, o = node.input_types[0], node.output_type
    if t.axes != o.axes or t.shape != o.shape or "float16" in (t.dtype, o.dtype) or \
            "bfloat16" in (t.dtype, o.dtype):
        return None
    return ScalarOp(_literal(node))


def _ref_fill(request: KernelRequest) -> Kernel:
    node = request.node
    c = fill_constant(node)

    def run(inputs: Sequence[np.ndarray], out: np.ndarray) -> None:
        out[...] = c
    return plain_kernel(run)


def _fill_bits(node: Node) -> np.ndarray:
    c = fill_constant(node).reshape(1)
    return c.view(BITS[c.itemsize])


@njit(cache=True, nogil=True)
def fill_serial(dst, bits):
    value = bits[0]
    for i in range(dst.shape[0]):
        dst[i] = value


@njit(cache=True, nogil=True, parallel=True)
def fill_parallel(dst, bits):
    value = bits[0]
    for i in prange(dst.shape[0]):
        dst[i] = value


FILL = Twins(fill_serial, fill_parallel)


def _cpu_fill(request: KernelRequest) -> Kernel:
    node = request.node
    bits = _fill_bits(node)
    kernel = FILL.pick(node.output_type.elements >= _rows.PARALLEL_MIN_ELEMENTS)

    def run(inputs: Sequence[np.ndarray], out: np.ndarray) -> None:
        kernel(out_bits(out), bits)
    compiled = None
    if _compilable(node.output_type):  # the reference is no parameter: its type does not matter
        compiled = CompiledCall(kernel, (flat_output(view=bits.dtype.name), const_array(bits)))
    return plain_kernel(run, warm=FILL.warm, compiled=compiled)


def _cuda_fill(request: KernelRequest) -> Kernel:
    from numba import cuda

    from atoms.cuda import fill as device  # numba.cuda loads with the first cuda kernel
    from runtime.toolkit.cuda import SpaceKernel

    node = request.node
    kernel = SpaceKernel.of(device.fill)
    bits = cuda.to_device(_fill_bits(node))
    n = max(1, node.output_type.elements)

    def run(inputs, out) -> None:
        kernel([out_bits(out), bits, n], n)
    return plain_kernel(run)


def linear_fill(node: Node) -> Linear | None:
    """A fill of 0 is linear in no operand (a sum over any free axis: scatter-add's zero base)."""
    value = node.attributes["value"]
    return Linear((), True) if value == 0 and not isinstance(value, bool) else None


SPECS = [
    AtomSpec(name="fill", refs=(FILL_REF,), inputs=("reference",), dtypes={"reference": "any"},
             attributes=frozenset({"axes", "dtype", "value"}), infer=infer_fill,
             kernels=_kernels(_ref_fill, _cpu_fill, _cuda_fill), elementwise=fill_op,
             half_native=HALF_NATIVE, inplace=0, free_axes=every_axis, types_only=(0,), linear=linear_fill,
             summary="a constant over some of the reference's axes (its values are never read)"),
]
