"""What the gradient atoms (SPEC §3c; atoms/gradient.py) share: their references, the checks
of a cotangent against the type it is the cotangent of, and the helpers of their row kernels."""
from __future__ import annotations

import math

import numpy as np

from runtime.core.errors import fail
from runtime.core.types import HALF_DTYPES, TensorType, dtypes_compatible, is_float
from runtime.plugins.atomspec import AtomSpec, InferContext, Node
from runtime.toolkit import KERNEL_FLOATS, check_dtypes

from . import _rows
from .elementwise import require_identical
from .layout import flat_view

OWNER = "formula-runtime"


def gradient_ref(name: str) -> str:
    """``formula-runtime/formula-atom-<name>@1`` (SPEC §3c)."""
    return f"{OWNER}/formula-atom-{name}@1"


FILL_REF = gradient_ref("fill")
SCALAR_MAP_VJP_REF = gradient_ref("scalar-map-vjp")
MASKED_SOFTMAX_VJP_REF = gradient_ref("masked-softmax-vjp")
SLICE_VJP_REF = gradient_ref("slice-vjp")
WINDOW_VJP_REF = gradient_ref("window-vjp")

HALF_NATIVE = frozenset({"cpu", "cuda"})  # kernels that store raw bits: no widening needed


# --- shared checks ------------------------------------------------------------------------------

def require_cotangent(ctx: InferContext, operand: int, want: TensorType, what: str) -> None:
    """SPEC §3c: a cotangent is floating and of exactly ``want``'s type (axes in order, extents,
    dtype, domain). Two float dtypes that differ only once ``floating`` bindings are bound are
    the caller's binding: ``binding_dtype`` (§3b.2)."""
    t = ctx.operands[operand]
    name = ctx.atom.inputs[operand]
    ctx.require_dtype(operand, "floating")
    if t.axes != want.axes:
        ctx.mismatch(f"{name} must have the axes of {what}, {list(want.axes)}, got {list(t.axes)}", operand)
    for axis, got, expected in zip(t.axes, t.sizes, want.sizes):
        ctx.require_extent(got, expected, f"{name} axis {axis!r} against {what}", operand)
    require_same_float(ctx, operand, t.dtype, want.dtype, what)
    if t.domain != want.domain:
        ctx.mismatch(f"{name} is in domain {t.domain!r} but {what} is in {want.domain!r}", operand)


def require_same_float(ctx: InferContext, operand: int, got: str, want: str, what: str) -> None:
    name = ctx.atom.inputs[operand]
    if ctx.planning and got != want and is_float(got) and is_float(want):
        fail("binding_dtype", f"{ctx.path}.input_slots[{operand}]",
             f"{ctx.atom.name}: {name} is bound as {got} but {what} as {want}; floating operands "
             "that must agree need one float dtype")
    if not dtypes_compatible(got, want):
        ctx.mismatch(f"{name} is {got} but {what} is {want}", operand)


def require_pair(ctx: InferContext) -> TensorType:
    """Operands 0 and 1 floating and identical (x and ȳ, y and ȳ); returns operand 0's type."""
    ctx.require_dtype(0, "floating")
    ctx.require_dtype(1, "floating")
    t, g = ctx.operands
    require_same_float(ctx, 1, g.dtype, t.dtype, ctx.atom.inputs[0])
    require_identical(ctx, 0, 1)
    return t


def _on(ctx: InferContext, shim: AtomSpec, operand: int) -> InferContext:
    """``ctx`` seen by an atom whose one operand is ``operand`` (the forward atom's input),
    so the forward's own ``infer`` checks the shared attributes with the same codes and paths."""
    return InferContext(shim, ctx.path, ctx.attributes, (ctx.operands[operand],),
                        (ctx.operand_slots[operand],), ctx.dims, planning=ctx.planning)


# --- row helpers ----------------------------------------------------------------------------------

def _float_kernel_dtype(node: Node, backend: str) -> None:
    """Row kernels that compute take float32 or float64 (the planner widens half operands)."""
    check_dtypes(node, backend, KERNEL_FLOATS)


def _compilable(*types: TensorType) -> bool:
    """Whether compiled code (runtime.execution.driver) can call a kernel over these types:
    static and non-empty, of a dtype Numba has (no half)."""
    return all(t.is_static and t.elements and t.dtype not in HALF_DTYPES for t in types)


def _flat(x: np.ndarray) -> tuple[np.ndarray, int, tuple[int, ...]]:
    """``flat_view`` in the array's own dtype (a read-only 1-D view, its origin and strides)."""
    x = np.asarray(x)
    bits, origin, strides = flat_view(x)
    return bits.view(x.dtype), origin, strides


def _flat_out(out: np.ndarray) -> np.ndarray:
    return out.reshape((max(1, out.size),))


def _device_flat(x):
    """A device operand as a flat C-order array of its own dtype (a strided one copied first)."""
    if not x.is_c_contiguous():
        from numba import cuda

        x = cuda.to_device(np.ascontiguousarray(x.copy_to_host()))
    return x.reshape((max(1, math.prod(x.shape)),))


def _row_space(space: TensorType, axis: str, members) -> _rows.Rows:
    names = [a for a in space.axes if a != axis]
    return _rows.rows(space, axis, [(t, names, strides) for t, strides in members])


# --- kernels by backend ---------------------------------------------------------------------------

def _kernels(reference, cpu, cuda) -> dict:
    return {"reference": reference, "cpu": cpu, "cuda": cuda}
