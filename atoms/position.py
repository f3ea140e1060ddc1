"""The position atoms (SPEC §3b): sinusoidal features, relative differences, rotary embeddings.

Sinusoidal and rotary compute in ``c`` (float32 for a half result dtype, the result dtype
otherwise): coordinates are converted to ``c``, the pair frequencies ω_i = exp(−ln(base)·2i/W)
are evaluated in ``c`` as arti does, and the result is rounded once. The frequency table of a
node (⌈W/2⌉ numbers of the attributes, not of the data) is built when its kernel is made.
"""
from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np

from runtime.plugins.atomspec import AtomSpec, InferContext, Node, ScalarOp, axes_except, every_axis
from runtime.plugins.kernel import Kernel, KernelRequest, plain_kernel
from runtime.core.errors import json_kind
from runtime.toolkit import align_to
from runtime.core.types import NAME_RE, TensorType

from ._refs import refs_for
from .elementwise import _cpu as _elementwise_cpu, _cuda as _elementwise_cuda

COORDINATE_DTYPES = ("int64", "float16", "bfloat16", "float32", "float64")
RESULT_DTYPES = ("floating", "float16", "bfloat16", "float32", "float64")


# --- infer -------------------------------------------------------------------------------

def _feature_axis(ctx: InferContext) -> str:
    axis = ctx.attributes["feature_axis"]
    if not isinstance(axis, str):
        ctx.bad_attr("feature_axis", f"expected an axis name, got {json_kind(axis)}")
    if not NAME_RE.match(axis):
        ctx.bad_attr("feature_axis", f"{axis!r} is not an axis name ({NAME_RE.pattern})")
    return axis


def _base(ctx: InferContext) -> float:
    v = ctx.attributes["base"]
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        ctx.bad_attr("base", f"expected a number, got {json_kind(v)}")
    if not math.isfinite(v) or not v > 1:
        ctx.bad_attr("base", f"expected a finite number > 1, got {v}")
    return float(v)


def _require_coordinates(ctx: InferContext, operand: int) -> None:
    ctx.require_dtype(operand, COORDINATE_DTYPES, " (a coordinate operand)")


def infer_sinusoidal(ctx: InferContext) -> TensorType:
    axis = _feature_axis(ctx)
    t = ctx.operands[0]
    if axis in t.axes:
        ctx.bad_attr("feature_axis", f"{axis!r} is already an axis of coordinates (axes {list(t.axes)})")
    width = ctx.attr_int("feature_size", 1)
    dtype = ctx.attr_str("dtype", RESULT_DTYPES)
    _base(ctx)
    _require_coordinates(ctx, 0)
    if dtype == "floating" and ctx.planning:  # the run-time d (SPEC): coordinates' or float32
        dtype = t.dtype if t.dtype != "int64" else "float32"
    return ctx.output(t.axes + (axis,), t.sizes + (width,), dtype=dtype)


def infer_relative(ctx: InferContext) -> TensorType:
    _require_coordinates(ctx, 0)
    _require_coordinates(ctx, 1)
    left, right = ctx.operands
    if left.dtype != right.dtype:
        ctx.mismatch(f"left is {left.dtype} but right is {right.dtype}", 1)
    if left.domain != right.domain:
        ctx.mismatch(f"left is in domain {left.domain!r} but right is in {right.domain!r}", 1)
    for axis, size in zip(right.axes, right.sizes):
        if axis in left.axes:
            ctx.require_extent(left.size_of(axis), size, f"shared axis {axis!r} of left and right", 1)
    extra = [k for k, a in enumerate(right.axes) if a not in left.axes]
    return ctx.output(left.axes + tuple(right.axes[k] for k in extra),
                      left.sizes + tuple(right.sizes[k] for k in extra))


def infer_rotary(ctx: InferContext) -> TensorType:
    axis = _feature_axis(ctx)
    value, coords = ctx.operands
    if axis not in value.axes:
        ctx.bad_attr("feature_axis", f"value has no axis {axis!r} (axes {list(value.axes)})")
    _base(ctx)
    ctx.require_dtype(0, "floating")
    _require_coordinates(ctx, 1)
    if value.domain != coords.domain:
        ctx.mismatch(f"value is in domain {value.domain!r} but coordinates are in {coords.domain!r}", 1)
    width = value.size_of(axis)
    if not isinstance(width, int) or width % 2:
        ctx.mismatch(f"the feature axis {axis!r} must have a static even extent, got {width}", 0)
    for a, size in zip(coords.axes, coords.sizes):
        if a == axis or a not in value.axes:
            ctx.mismatch(f"coordinates axis {a!r} must be a value axis other than the feature "
                         f"axis {axis!r} (value axes {list(value.axes)})", 1)
        if size != value.size_of(a):  # the same declared extent (SPEC), not merely compatible
            ctx.mismatch(f"coordinates axis {a!r} has extent {size} but the value's is "
                         f"{value.size_of(a)}", 1)
    return ctx.output(value.axes, value.sizes)


# --- shared ------------------------------------------------------------------------------

def compute_dtype(result: str) -> np.dtype:
    """``c`` of sinusoidal and rotary: float32 for a half result dtype, the result's otherwise."""
    return np.dtype(np.float64 if result == "float64" else np.float32)


def frequencies(width: int, base: float, c: np.dtype) -> np.ndarray:
    """ω_i = exp(−ln(base)·2i/W) for i < ⌈W/2⌉, evaluated in ``c`` (the even indices 2i and
    the scalar −ln(base)/W in ``c``, one product and one exp there, as arti's torch code)."""
    return np.exp(np.arange(0, width, 2).astype(c) * c.type(-math.log(base) / width))


def _node_frequencies(node: Node, width: int) -> np.ndarray:
    return frequencies(width, float(node.attributes["base"]), compute_dtype(node.output_type.dtype))


# --- reference ---------------------------------------------------------------------------

def _ref_sinusoidal(request: KernelRequest) -> Kernel:
    node = request.node
    width = node.attributes["feature_size"]
    omega = _node_frequencies(node, width)
    c = omega.dtype

    def run(inputs: Sequence[np.ndarray], out: np.ndarray) -> None:
        theta = np.asarray(inputs[0]).astype(c)[..., None] * omega
        with np.errstate(all="ignore"):
            out[..., 0::2] = np.sin(theta)
            out[..., 1::2] = np.cos(theta)[..., :width // 2]  # odd W: the last cosine dropped
    return plain_kernel(run)


def _ref_relative(request: KernelRequest) -> Kernel:
    node = request.node
    lt, rt = node.input_types
    target = node.output_type
    c = np.dtype(np.int64) if lt.dtype == "int64" else compute_dtype(lt.dtype)

    def run(inputs: Sequence[np.ndarray], out: np.ndarray) -> None:
        left, right = (align_to(np.asarray(x), t, target).astype(c) for x, t in zip(inputs, (lt, rt)))
        with np.errstate(all="ignore"):
            out[...] = left - right
    return plain_kernel(run)


def _rotary_layout(node: Node) -> tuple[int, int, TensorType]:
    """(feature position, W, the pair space: the value's type with W/2 on the feature axis)."""
    vt = node.input_types[0]
    position = vt.axes.index(node.attributes["feature_axis"])
    width = vt.shape[position]
    sizes = list(vt.shape)
    sizes[position] = width // 2
    return position, width, vt.evolve(sizes=tuple(sizes))


def _ref_rotary(request: KernelRequest) -> Kernel:
    node = request.node
    vt, ct = node.input_types
    position, width, pairs = _rotary_layout(node)
    omega = _node_frequencies(node, width)
    c = omega.dtype

    def run(inputs: Sequence[np.ndarray], out: np.ndarray) -> None:
        value, coords = inputs
        p = np.moveaxis(align_to(np.asarray(coords), ct, pairs), position, -1).astype(c)
        theta = p * omega  # [..., W/2]
        x = np.moveaxis(np.asarray(value).astype(c), position, -1)
        x0, x1 = x[..., 0::2], x[..., 1::2]
        cs, sn = np.cos(theta), np.sin(theta)
        y = np.empty_like(x)
        with np.errstate(all="ignore"):
            y[..., 0::2] = x0 * cs - x1 * sn
            y[..., 1::2] = x0 * sn + x1 * cs
        out[...] = np.moveaxis(y, -1, position)
    return plain_kernel(run)


# --- cpu / cuda: generated loop nests over the pair space --------------------------------
# Coordinates are converted to c by storing them into the output element the pair writes
# (the store rounds as NumPy's astype does) and reading it back: Numba's arithmetic would
# otherwise widen an int64 or float64 coordinate times a float32 frequency to float64.

def _pair_indices(i: str, one: str) -> tuple[str, str]:
    """The feature indices 2i and 2i+1 of pair ``i``; ``one`` is 1 in the index type (the CPU's
    indices are unsigned, and an unsigned index times a signed literal would be a float)."""
    return f"({i} + {i})", f"({i} + {i} + {one})"


def _sinusoidal_body(rank: int, width: int, one: str) -> list[str]:
    names = [f"i{k}" for k in range(rank)]
    lead, i = names[:-1], names[-1]
    f0, f1 = _pair_indices(i, one)
    a0, a1 = ", ".join(lead + [f0]), ", ".join(lead + [f1])
    coord = ", ".join(lead + ["0"])
    return [f"out[{a0}] = co[{coord}]",
            f"th = out[{a0}] * om[{i}]",
            f"out[{a0}] = math.sin(th)",
            f"if {f1} < {width}:",
            f"    out[{a1}] = math.cos(th)"]


def _rotary_body(rank: int, position: int, pattern: Sequence[bool], one: str) -> list[str]:
    names = [f"i{k}" for k in range(rank)]
    i = names[position]
    a0, a1 = (", ".join(names[:position] + [f] + names[position + 1:]) for f in _pair_indices(i, one))
    coord = ", ".join("0" if b else n for n, b in zip(names, pattern))
    return [f"out[{a0}] = co[{coord}]",
            f"th = out[{a0}] * om[{i}]",
            "cs = math.cos(th)",
            "sn = math.sin(th)",
            f"x0 = v[{a0}]",
            f"x1 = v[{a1}]",
            f"out[{a0}] = x0 * cs - x1 * sn",
            f"out[{a1}] = x0 * sn + x1 * cs"]


def _keepdims_coordinates(node: Node) -> tuple[TensorType, tuple[int, ...]]:
    """Sinusoidal: the coordinates' type and their shape in the pair space (a unit pair axis)."""
    ct = node.input_types[0]
    return ct, ct.shape + (1,)


def _cpu_sinusoidal(request: KernelRequest) -> Kernel:
    from runtime.toolkit import cpu as cg

    node = request.node
    width = node.attributes["feature_size"]
    ct, cshape = _keepdims_coordinates(node)
    out_dt = cg.numba_type(node.output_type.dtype, node.path, "position-sinusoidal")
    co_dt = cg.numba_type(ct.dtype, node.path, "position-sinusoidal")
    omega = _node_frequencies(node, width)
    rank = ct.rank + 1
    space = ct.shape + (len(omega),)
    args = [("co", co_dt, rank, False), ("om", out_dt, 1, False), ("out", out_dt, rank, True)]
    body = _sinusoidal_body(rank, width, "_u(1)")
    label = f"position-sinusoidal W={width} rank {rank} {out_dt} from {co_dt}"
    dims = [f"co.shape[{k}]" if k < rank - 1 else "om.shape[0]" for k in range(rank)]
    kernel = cg.NestKernel.loop("possin", label, args, dims, body)

    def run(inputs: Sequence[np.ndarray], out: np.ndarray) -> None:
        co = cg.contiguous(np.asarray(inputs[0])).reshape(cshape)
        kernel([co, omega, out.reshape(ct.shape + (width,))], space, math.prod(space) * 2)
    return plain_kernel(run, warm=kernel.warm)


def _cuda_sinusoidal(request: KernelRequest) -> Kernel:
    from numba import cuda

    from runtime.toolkit import cuda as cg

    node = request.node
    width = node.attributes["feature_size"]
    ct, cshape = _keepdims_coordinates(node)
    cg.numba_type(node.output_type.dtype, node.path, "position-sinusoidal", "cuda")
    cg.numba_type(ct.dtype, node.path, "position-sinusoidal", "cuda")
    omega = cuda.to_device(_node_frequencies(node, width))
    rank = ct.rank + 1
    source = cg.render(f"position-sinusoidal W={width} rank {rank}", ["co", "om", "out"],
                       [f"co.shape[{k}]" for k in range(rank - 1)] + ["om.shape[0]"],
                       _sinusoidal_body(rank, width, "1"))
    kernel = cg.SpaceKernel("cupossin", source)
    n = ct.elements * omega.shape[0]

    def run(inputs, out) -> None:
        kernel([inputs[0].reshape(cshape), omega, out.reshape(ct.shape + (width,))], n)
    return plain_kernel(run)


def _rotary_table_body(rank: int, position: int, pattern: Sequence[bool], one: str) -> list[str]:
    """The CPU's rotation: cos θ and sin θ read from tables (keepdims over the pair space)."""
    names = [f"i{k}" for k in range(rank)]
    i = names[position]
    a0, a1 = (", ".join(names[:position] + [f] + names[position + 1:]) for f in _pair_indices(i, one))
    at = ", ".join("0" if b and k != position else n for k, (n, b) in enumerate(zip(names, pattern)))
    return [f"cs = tc[{at}]",
            f"sn = ts[{at}]",
            f"x0 = v[{a0}]",
            f"x1 = v[{a1}]",
            f"out[{a0}] = x0 * cs - x1 * sn",
            f"out[{a1}] = x0 * sn + x1 * cs"]


def _rotary_tables(node: Node) -> tuple[tuple[int, ...], int]:
    """(keepdims shape of the cos/sin tables, elements of the converted coordinates)."""
    from runtime.toolkit.cpu import broadcast_axes

    _, ct = node.input_types
    position, width, pairs = _rotary_layout(node)
    pattern = broadcast_axes(ct, pairs)
    shape = tuple(1 if b and k != position else n for k, (n, b) in enumerate(zip(pairs.shape, pattern)))
    return shape, ct.elements


def rotary_scratch(node: Node, backend: str) -> int:
    """The CPU's tables: the coordinates in c, then cos θ and sin θ per (coordinate, pair);
    on a device, the frequency table it holds."""
    if backend != "cpu":
        return frequency_scratch(node, backend)
    shape, coords = _rotary_tables(node)
    return (2 * math.prod(shape) + coords) * compute_dtype(node.output_type.dtype).itemsize


def frequency_scratch(node: Node, backend: str) -> int:
    """A cuda kernel's frequency table, copied to the device when the kernel is made."""
    if backend != "cuda":
        return 0
    width = node.output_type.shape[-1] if node.atom.name == "position-sinusoidal" else \
        _rotary_layout(node)[1]
    return -(-width // 2) * compute_dtype(node.output_type.dtype).itemsize


def _cpu_rotary(request: KernelRequest) -> Kernel:
    """cos θ and sin θ are computed once per (coordinate, pair) with NumPy's vectorised sin and
    cos (the value's other axes, heads say, share them), then the rotation is one loop nest."""
    from runtime.toolkit import cpu as cg

    node = request.node
    vt, ct = node.input_types
    position, width, pairs = _rotary_layout(node)
    dt = cg.numba_type(vt.dtype, node.path, "position-rotary")
    cg.numba_type(ct.dtype, node.path, "position-rotary")
    omega = _node_frequencies(node, width)
    pattern = cg.broadcast_axes(ct, pairs)
    table_shape, _ = _rotary_tables(node)
    coord_shape = tuple(1 if k == position else n for k, n in enumerate(table_shape))
    omega_shape = tuple(len(omega) if k == position else 1 for k in range(vt.rank))
    omega = omega.reshape(omega_shape)
    slicer = tuple(slice(0, 1) if b else slice(None) for b in pattern)
    rank = vt.rank
    args = [("v", dt, rank, False), ("tc", dt, rank, False), ("ts", dt, rank, False), ("out", dt, rank, True)]
    body = _rotary_table_body(rank, position, pattern, "_u(1)")
    label = f"position-rotary feature axis {position} of rank {rank} {dt} by tables"
    dims = [f"{'tc' if k == position else 'out'}.shape[{k}]" for k in range(rank)]
    kernel = cg.NestKernel.loop("posrot", label, args, dims, body)
    space = pairs.shape

    def run(inputs: Sequence[np.ndarray], out: np.ndarray) -> None:
        value, coords = inputs
        p = align_to(np.asarray(coords), ct, pairs)[slicer].reshape(coord_shape).astype(omega.dtype, order="C")
        theta = p * omega
        cos = np.cos(theta)
        np.sin(theta, out=theta)
        kernel([cg.contiguous(value), cos, theta, out], space)
    return plain_kernel(run, warm=kernel.warm)


def _cuda_rotary(request: KernelRequest) -> Kernel:
    from numba import cuda

    from runtime.toolkit import cuda as cg

    node = request.node
    vt, ct = node.input_types
    position, width, pairs = _rotary_layout(node)
    cg.numba_type(vt.dtype, node.path, "position-rotary", "cuda")
    cg.numba_type(ct.dtype, node.path, "position-rotary", "cuda")
    omega = cuda.to_device(_node_frequencies(node, width))
    pattern = cg.broadcast_axes(ct, pairs)
    rank = vt.rank
    source = cg.render(f"position-rotary feature axis {position} of rank {rank}",
                       ["v", "co", "om", "out"],
                       [f"out.shape[{k}]" if k != position else "om.shape[0]" for k in range(rank)],
                       _rotary_body(rank, position, pattern, "1"))
    kernel = cg.SpaceKernel("cuposrot", source)
    n = pairs.elements

    def run(inputs, out) -> None:
        value, coords = inputs
        kernel([value, cg.align_device(coords, ct, pairs), omega, out], n)
    return plain_kernel(run)


SPECS = [
    AtomSpec(name="position-sinusoidal", refs=refs_for("position-sinusoidal"),
             dtypes={"coordinates": "coordinate"},
             inputs=("coordinates",),
             attributes=frozenset({"feature_axis", "feature_size", "dtype", "base"}),
             infer=infer_sinusoidal,
             kernels={"reference": _ref_sinusoidal, "cpu": _cpu_sinusoidal, "cuda": _cuda_sinusoidal},
             scratch_bytes=frequency_scratch,
             free_axes=axes_except("feature_axis"),
             summary="interleaved sin/cos features of coordinates along a new last axis"),
    AtomSpec(name="position-relative", refs=refs_for("position-relative"), inputs=("left", "right"),
             dtypes={"left": "coordinate", "right": "coordinate"},
             attributes=frozenset(), infer=infer_relative,
             kernels={"reference": _ref_relative, "cpu": _elementwise_cpu, "cuda": _elementwise_cuda},
             elementwise=lambda node: ScalarOp("({0} - {1})"),
             free_axes=every_axis,
             summary="left - right broadcast by axis name (an outer difference over unshared axes)"),
    AtomSpec(name="position-rotary", refs=refs_for("position-rotary"), inputs=("value", "coordinates"),
             dtypes={"value": "floating", "coordinates": "coordinate"},
             attributes=frozenset({"feature_axis", "base"}), infer=infer_rotary,
             kernels={"reference": _ref_rotary, "cpu": _cpu_rotary, "cuda": _cuda_rotary},
             scratch_bytes=rotary_scratch,
             free_axes=axes_except("feature_axis"),
             summary="rotary embedding: adjacent feature pairs rotated by coordinate x frequency"),
]
