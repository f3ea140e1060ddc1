"""The observe atoms (SPEC §3b): a value [b,n,d] seen by every state [b,t,s], out [b,t,n,d].

identity: ``mask ? value·a : 0``; affine: a tanh-bounded affine map whose coefficients come from
``states·weightᵀ + bias``; fourier: a circular sub-pixel shift of the value's [H, W] image by
each state's (dx, dy). Fourier's shift is the circulant ``Re IDFT(DFT(img)·phase)`` written as
matrix products: along an axis of length L it is Σ_l' g(l − l') img[l'] with
g(m) = (1/L) Σ_k e^{2πi f_L(k)(m − shift)}, tabulated per (b, t) for m in (−L, L).
"""
from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np
from numba import njit, prange

from runtime.plugins.atomspec import AtomSpec, InferContext, Node, every_axis
from runtime.plugins.kernel import Kernel, KernelRequest, plain_kernel
from runtime.core.errors import fail, json_kind
from runtime.core.types import TensorType, is_float, numpy_dtype
from runtime.toolkit import launch_config, no_kernel

from ._refs import refs_for

STATE_WIDTH = {"cartesian": 2, "polar": 3}
POLICIES = ("safe_training", "fullgraph_forward")  # compile_policy never changes values


# --- infer -------------------------------------------------------------------------------

def _observed(ctx: InferContext) -> TensorType:
    """The rules shared by the three atoms; returns the output type (b, t, n, d)."""
    value, states, mask, activity = ctx.operands[:4]
    ctx.require_dtype(0, "floating")
    ctx.require_dtype(1, "floating")
    for k, t in ((0, value), (1, states)):
        if t.rank != 3:
            ctx.mismatch(f"{ctx.atom.inputs[k]} must have rank 3, got axes {list(t.axes)}", k)
    b, n, d = value.axes
    if states.axes[0] != b:
        ctx.mismatch(f"states' first axis must be the value's {b!r}, got {states.axes[0]!r}", 1)
    ctx.require_extent(value.sizes[0], states.sizes[0], f"axis {b!r} of value and states", 1)
    t_axis = states.axes[1]
    if t_axis in value.axes:
        ctx.mismatch(f"states' axis {t_axis!r} is also a value axis (axes {list(value.axes)})", 1)
    if mask.dtype != "boolean":
        ctx.mismatch(f"mask must be boolean, got {mask.dtype}", 2)
    if activity.dtype != "boolean" and not is_float(activity.dtype):
        ctx.mismatch(f"activity must be boolean or floating, got {activity.dtype}", 3)
    for k, t, like, what in ((2, mask, value, "value"), (3, activity, states, "states")):
        want = like.axes[:2]
        if t.axes != want:
            ctx.mismatch(f"{ctx.atom.inputs[k]} must have exactly the axes {list(want)} of {what}, "
                         f"got {list(t.axes)}", k)
        for axis, a, e in zip(want, t.sizes, like.sizes):
            ctx.require_extent(a, e, f"{ctx.atom.inputs[k]} axis {axis!r} and {what}'s", k)
    return ctx.output((b, t_axis, n, d), (value.sizes[0], states.sizes[1], value.sizes[1], value.sizes[2]))


def _finite_positive(ctx: InferContext, key: str) -> float:
    v = ctx.attr_number(key, 0.0)
    if not math.isfinite(v):
        ctx.bad_attr(key, f"expected a finite number > 0, got {v}")
    return v


def infer_identity(ctx: InferContext) -> TensorType:
    return _observed(ctx)


def infer_affine(ctx: InferContext) -> TensorType:
    _finite_positive(ctx, "scale")
    out = _observed(ctx)
    value, states, _, _, weight, bias = ctx.operands
    ctx.require_dtype(4, "floating")
    ctx.require_dtype(5, "floating")
    d, s = value.sizes[2], states.sizes[2]
    if not isinstance(d, int) or not isinstance(s, int):
        ctx.mismatch(f"the value's last extent and the states' must be static, got {d} and {s}")
    if weight.rank != 2 or weight.axes[1] != states.axes[2]:
        ctx.mismatch(f"weight must have axes [w, {states.axes[2]!r}], got {list(weight.axes)}", 4)
    if weight.sizes != (2 * d, s):
        ctx.mismatch(f"weight must have extents [{2 * d}, {s}] (2·d, s), got {list(weight.sizes)}", 4)
    if bias.axes != weight.axes[:1] or bias.sizes != (2 * d,):
        ctx.mismatch(f"bias must have axes [{weight.axes[0]!r}] of extent {2 * d}, got "
                     f"{bias.describe()}", 5)
    dtypes = {ctx.operands[k].dtype for k in (0, 1, 4, 5)}
    concrete = dtypes - {"floating"}
    if len(concrete) > 1:
        code = "binding_dtype" if ctx.planning else "type_mismatch"  # §3b.3 item 3
        fail(code, ctx.path, f"{ctx.atom.name}: value, states, weight and bias must share one dtype, "
                             f"got {sorted(concrete)}")
    return out


def infer_fourier(ctx: InferContext) -> TensorType:
    shape = ctx.attributes["spatial_shape"]
    if not isinstance(shape, list) or len(shape) != 2 or \
            any(isinstance(v, bool) or not isinstance(v, int) or v < 1 for v in shape):
        ctx.bad_attr("spatial_shape", f"expected two integers >= 1, got {json_kind(shape)}"
                     if not isinstance(shape, list) else f"expected two integers >= 1, got {shape}")
    mode = ctx.attr_str("state_mode", tuple(STATE_WIDTH))
    _finite_positive(ctx, "direction_epsilon")
    ctx.attr_str("compile_policy", POLICIES)
    out = _observed(ctx)
    value, states = ctx.operands[:2]
    if value.sizes[1] != shape[0] * shape[1]:
        ctx.mismatch(f"the value's axis {value.axes[1]!r} must have the static extent "
                     f"H·W = {shape[0] * shape[1]}, got {value.sizes[1]}", 0)
    if states.sizes[2] != STATE_WIDTH[mode]:
        ctx.mismatch(f"{mode} states need {STATE_WIDTH[mode]} entries on {states.axes[2]!r}, "
                     f"got {states.sizes[2]}", 1)
    return out


# --- reference ---------------------------------------------------------------------------

def _activity(activity: np.ndarray, dtype: np.dtype) -> np.ndarray:
    """The activity in the value's dtype, [b, t, 1, 1]."""
    return np.asarray(activity).astype(dtype)[:, :, None, None]


def _finish(shifted: np.ndarray, mask: np.ndarray, activity: np.ndarray, out: np.ndarray) -> None:
    """out = mask ? shifted·a : 0 in out's dtype; ``shifted`` [b, t|1, n, d]."""
    a = _activity(activity, out.dtype)
    with np.errstate(all="ignore"):
        out[...] = np.where(np.asarray(mask)[:, None, :, None], shifted.astype(out.dtype) * a, 0)


def _ref_identity(request: KernelRequest) -> Kernel:
    def run(inputs: Sequence[np.ndarray], out: np.ndarray) -> None:
        value, _, mask, activity = inputs
        _finish(np.asarray(value)[:, None], mask, activity, out)
    return plain_kernel(run)


def _ref_affine(request: KernelRequest) -> Kernel:
    node = request.node
    d = node.input_types[0].shape[2]
    scale = float(node.attributes["scale"])

    def run(inputs: Sequence[np.ndarray], out: np.ndarray) -> None:
        value, states, mask, activity, weight, bias = (np.asarray(x) for x in inputs)
        dt = value.dtype
        with np.errstate(all="ignore"):
            z = (np.einsum("bts,ws->btw", states, weight) + bias).astype(dt)
            sc = dt.type(scale)
            alpha, beta = np.tanh(z[..., :d])[:, :, None, :], np.tanh(z[..., d:])[:, :, None, :]
            y = value[:, None] * (dt.type(1) + sc * alpha) + sc * beta
        _finish(y, mask, activity, out)
    return plain_kernel(run)


def fourier_compute_dtype(dtype: str) -> np.dtype:
    return np.dtype(np.float64 if dtype == "float64" else np.float32)


def shifts_numpy(states: np.ndarray, polar: bool, eps: float) -> tuple[np.ndarray, np.ndarray]:
    """(dx, dy) per (b, t) from the states (in the compute dtype)."""
    if not polar:
        return states[..., 0], states[..., 1]
    v = states[..., 1:3]
    norm = np.sqrt((v * v).sum(axis=-1))
    big = norm > eps
    u = np.where(big[..., None], v / np.where(big, norm, 1)[..., None], 0)
    return states[..., 0] * u[..., 0], states[..., 0] * u[..., 1]


def frequencies(n: int) -> np.ndarray:
    """f_n(k) = k/n for k < ⌈n/2⌉, else (k − n)/n."""
    k = np.arange(n)
    return np.where(k < -(-n // 2), k, k - n) / n


def _ref_fourier(request: KernelRequest) -> Kernel:
    node = request.node
    h, w = node.attributes["spatial_shape"]
    polar = node.attributes["state_mode"] == "polar"
    eps = float(node.attributes["direction_epsilon"])
    c = fourier_compute_dtype(node.input_types[0].dtype)
    fh, fw = frequencies(h).astype(c), frequencies(w).astype(c)

    def run(inputs: Sequence[np.ndarray], out: np.ndarray) -> None:
        value, states, mask, activity = (np.asarray(x) for x in inputs)
        b, _, d = value.shape
        img = value.astype(c).reshape(b, h, w, d)
        dx, dy = shifts_numpy(states.astype(c), polar, c.type(eps))
        spectrum = np.fft.fft2(img, axes=(1, 2))[:, None]  # [b, 1, h, w, d]
        phase = np.exp(-2j * np.pi * (dy[..., None, None] * fh[:, None] + dx[..., None, None] * fw))
        shifted = np.fft.ifft2(spectrum * phase[..., None], axes=(2, 3)).real.astype(c)
        with np.errstate(over="ignore"):
            rounded = shifted.reshape(b, -1, h * w, d).astype(out.dtype)
        _finish(rounded, mask, activity, out)
    return plain_kernel(run)


# --- cpu ---------------------------------------------------------------------------------
# Plain njit functions over flat (b, t) tasks, compiled once per dtype. The activity is
# converted to the value's dtype by storing it into the output (the store rounds like astype).
_OPTIONS = dict(cache=True, nogil=True, error_model="numpy", parallel=True)


@njit(**_OPTIONS)
def _identity_kernel(x, act, mask, out):
    nb, nt, nn, nd = out.shape
    for bt in prange(nb * nt):
        b, t = bt // nt, bt % nt
        out[b, t, 0, 0] = act[b, t]
        a = out[b, t, 0, 0]
        for n in range(nn):
            if mask[b, n]:
                for j in range(nd):
                    out[b, t, n, j] = x[b, n, j] * a
            else:
                for j in range(nd):
                    out[b, t, n, j] = 0


@njit(**_OPTIONS)
def _affine_kernel(x, states, act, mask, weight, bias, scale, out):
    nb, nt, nn, nd = out.shape
    ns = states.shape[2]
    one = scale / scale
    for bt in prange(nb * nt):
        b, t = bt // nt, bt % nt
        out[b, t, 0, 0] = act[b, t]
        a = out[b, t, 0, 0]
        for j in range(nd):
            za = bias[j]
            zb = bias[nd + j]
            for s in range(ns):
                za += states[b, t, s] * weight[j, s]
                zb += states[b, t, s] * weight[nd + j, s]
            gain = one + scale * math.tanh(za)
            shift = scale * math.tanh(zb)
            for n in range(nn):
                out[b, t, n, j] = (x[b, n, j] * gain + shift) * a if mask[b, n] else 0


@njit(**_OPTIONS)
def _fourier_tables(states, polar, eps, h, w, g):
    """g[bt, 0|1, :] = Re|Im g_H(m − dy) for m in (−H, H), then g_W(m − dx) for m in (−W, W)."""
    nb, nt = states.shape[0], states.shape[1]
    two_pi = 2 * math.pi
    for bt in prange(nb * nt):
        b, t = bt // nt, bt % nt
        s0 = states[b, t, 0]
        s1 = states[b, t, 1]
        if polar:
            s2 = states[b, t, 2]
            norm = math.sqrt(s1 * s1 + s2 * s2)
            dx, dy = (s0 * (s1 / norm), s0 * (s2 / norm)) if norm > eps else (s0 - s0, s0 - s0)
        else:
            dx, dy = s0, s1
        for axis in range(2):
            length, shift, base = (h, dy, 0) if axis == 0 else (w, dx, 2 * h - 1)
            half = (length + 1) // 2
            for m in range(-(length - 1), length):
                re = 0.0
                im = 0.0
                u = m - shift
                for k in range(length):
                    f = (k if k < half else k - length) / length
                    re += math.cos(two_pi * f * u)
                    im += math.sin(two_pi * f * u)
                g[bt, 0, base + m + length - 1] = re / length
                g[bt, 1, base + m + length - 1] = im / length


@njit(**_OPTIONS)
def _fourier_kernel(x, act, mask, g, h, w, out):
    nb, nt, nn, nd = out.shape
    for q in prange(nb * nt * nn):
        bt, p = q // nn, q % nn
        b, t = bt // nt, bt % nt
        if not mask[b, p]:
            for j in range(nd):
                out[b, t, p, j] = 0
            continue
        out[b, t, p, 0] = act[b, t]
        a = out[b, t, p, 0]
        r, c = p // w, p % w
        for j in range(nd):
            out[b, t, p, j] = 0
        for r2 in range(h):
            hr = g[bt, 0, r - r2 + h - 1]
            hi = g[bt, 1, r - r2 + h - 1]
            for c2 in range(w):
                wr = g[bt, 0, 2 * h - 1 + c - c2 + w - 1]
                wi = g[bt, 1, 2 * h - 1 + c - c2 + w - 1]
                k = hr * wr - hi * wi
                for j in range(nd):
                    out[b, t, p, j] += k * x[b, r2 * w + c2, j]
        for j in range(nd):
            out[b, t, p, j] = out[b, t, p, j] * a


def _check_device(node: Node, backend: str) -> None:
    for k, t in enumerate(node.input_types + (node.output_type,)):
        if t.dtype not in ("float32", "float64") and not (k in (2, 3) and t.dtype == "boolean"):
            raise no_kernel(node.atom.name, backend, t.dtype, node.path)


def _cpu_identity(request: KernelRequest) -> Kernel:
    node = request.node
    _check_device(node, "cpu")
    kernel = _identity_kernel

    def run(inputs: Sequence[np.ndarray], out: np.ndarray) -> None:
        value, _, mask, activity = inputs
        kernel(value, activity, mask, out)
    return plain_kernel(run)


def _cpu_affine(request: KernelRequest) -> Kernel:
    node = request.node
    _check_device(node, "cpu")
    kernel = _affine_kernel
    scale = numpy_dtype(node.input_types[0].dtype).type(node.attributes["scale"])

    def run(inputs: Sequence[np.ndarray], out: np.ndarray) -> None:
        value, states, mask, activity, weight, bias = inputs
        kernel(value, states, activity, mask, weight, bias, scale, out)
    return plain_kernel(run)


def fourier_scratch(node: Node, backend: str) -> int:
    """Bytes of the shift tables: per (b, t), real and imaginary g_H and g_W (on cuda made on
    the host from a host copy of the states, then copied to the device)."""
    b, t = node.input_types[1].shape[:2]
    h, w = node.attributes["spatial_shape"]
    c = fourier_compute_dtype(node.input_types[0].dtype)
    tables = b * t * 2 * (2 * h + 2 * w - 2) * c.itemsize
    return tables if backend != "cuda" else 2 * tables + node.input_types[1].nbytes


def _fourier_setup(node: Node):
    h, w = node.attributes["spatial_shape"]
    c = fourier_compute_dtype(node.input_types[0].dtype)
    b, t = node.output_type.shape[:2]
    return (h, w, node.attributes["state_mode"] == "polar", c.type(node.attributes["direction_epsilon"]),
            (b * t, 2, 2 * h + 2 * w - 2), c)


def _cpu_fourier(request: KernelRequest) -> Kernel:
    node = request.node
    _check_device(node, "cpu")
    h, w, polar, eps, table_shape, c = _fourier_setup(node)
    tables, kernel = _fourier_tables, _fourier_kernel

    def run(inputs: Sequence[np.ndarray], out: np.ndarray) -> None:
        value, states, mask, activity = inputs
        g = np.empty(table_shape, c)  # counted in the working bytes (AtomSpec.scratch_bytes)
        tables(states, polar, eps, h, w, g)
        kernel(value, activity, mask, g, h, w, out)
    return plain_kernel(run)


# --- cuda: one thread per (b, t) task or output element ----------------------------------

def _cuda_kernel(name: str):
    from atoms.cuda import observe as device  # numba.cuda is imported only when a cuda kernel is made

    return getattr(device, name)


def _launch(kernel, n: int, *args) -> None:
    blocks, threads = launch_config(n, max_blocks=None)  # (one thread per item: not grid-stride)
    kernel[blocks, threads](*args)


def _cuda_identity(request: KernelRequest) -> Kernel:
    node = request.node
    _check_device(node, "cuda")
    b, t, n, _ = node.output_type.shape

    def run(inputs, out) -> None:
        value, _, mask, activity = inputs
        _launch(_cuda_kernel("identity"), b * t * n, value, activity, mask, out)
    return plain_kernel(run)


def _cuda_affine(request: KernelRequest) -> Kernel:
    node = request.node
    _check_device(node, "cuda")
    b, t, _, d = node.output_type.shape
    scale = numpy_dtype(node.input_types[0].dtype).type(node.attributes["scale"])

    def run(inputs, out) -> None:
        value, states, mask, activity, weight, bias = inputs
        _launch(_cuda_kernel("affine"), b * t * d, value, states, activity, mask, weight, bias, scale, out)
    return plain_kernel(run)


def _cuda_fourier(request: KernelRequest) -> Kernel:
    from numba import cuda

    node = request.node
    _check_device(node, "cuda")
    h, w, polar, eps, table_shape, c = _fourier_setup(node)
    tables = _fourier_tables
    size = node.output_type.elements

    def run(inputs, out) -> None:
        value, states, mask, activity = inputs
        # the tables (O(b·t·(H+W)) numbers) are made on the host from the states, then copied
        g = np.empty(table_shape, c)
        tables(states.copy_to_host(), polar, eps, h, w, g)
        _launch(_cuda_kernel("fourier"), size, value, activity, mask, cuda.to_device(g), h, w, out)
    return plain_kernel(run)


OBSERVED = ("value", "states", "mask", "activity")


def _free_but(position: int):
    """``free_axes``: every output axis (b, t, n, d) but the one at ``position``, which the
    atom reads across (affine splits its coefficients at d; fourier shifts the image on n)."""
    def free(node: Node) -> frozenset[str]:
        axes = node.output_type.axes
        return frozenset(axes) - {axes[position]}
    return free

SPECS = [
    AtomSpec(name="observe-identity", refs=refs_for("observe-identity"), inputs=OBSERVED,
             dtypes={"value": "floating", "states": "floating", "mask": "boolean", "activity": "floating|boolean"},
             attributes=frozenset(), infer=infer_identity,
             free_axes=every_axis,
             kernels={"reference": _ref_identity, "cpu": _cpu_identity, "cuda": _cuda_identity},
             summary="value [b,n,d] seen by each state [b,t,s]: mask ? value·activity : 0"),
    AtomSpec(name="observe-affine", refs=refs_for("observe-affine"), inputs=OBSERVED + ("weight", "bias"),
             dtypes={"value": "floating", "states": "floating", "mask": "boolean", "activity": "floating|boolean", "weight": "floating", "bias": "floating"},
             attributes=frozenset({"scale"}), infer=infer_affine,
             free_axes=_free_but(3),
             kernels={"reference": _ref_affine, "cpu": _cpu_affine, "cuda": _cuda_affine},
             summary="value modulated by tanh of states·weightᵀ + bias, per state"),
    AtomSpec(name="observe-fourier", refs=refs_for("observe-fourier"), inputs=OBSERVED,
             dtypes={"value": "floating", "states": "floating", "mask": "boolean", "activity": "floating|boolean"},
             attributes=frozenset({"spatial_shape", "state_mode", "direction_epsilon", "compile_policy"}),
             infer=infer_fourier,
             kernels={"reference": _ref_fourier, "cpu": _cpu_fourier, "cuda": _cuda_fourier},
             scratch_bytes=fourier_scratch,
             free_axes=_free_but(2),
             summary="the value's [H, W] image shifted circularly by each state's (dx, dy)"),
]
