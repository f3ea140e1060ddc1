"""The masked-softmax atom (SPEC §3): a numerically stable softmax over the visible entries
along one axis; masked entries are 0 and a fully masked row is all zeros (never NaN).

Stable: the row maximum over visible entries is subtracted before ``exp``, so every exponent
is <= 0 and the visible maximum contributes exactly 1, making the row sum >= 1.
"""
from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from runtime.plugins.atomspec import AtomSpec, InferContext, Node, axes_except
from runtime.plugins.kernel import Counts, Kernel, KernelRequest, plain_kernel
from runtime.toolkit import KERNEL_FLOATS, align_to, check_dtypes
from runtime.core.types import TensorType, accumulation_dtype, numpy_dtype

from ._refs import refs_for
from .elementwise import require_mask


def infer_masked_softmax(ctx: InferContext) -> TensorType:
    ctx.axis_of("axis", 0)
    ctx.accumulation()
    ctx.require_dtype(0, "floating")
    require_mask(ctx, 1, 0)
    t = ctx.operands[0]
    return ctx.output(t.axes, t.sizes)


def masked_softmax_numpy(x: np.ndarray, mask: np.ndarray, position: int) -> np.ndarray:
    """The oracle, in x's dtype; ``mask`` is broadcastable to x."""
    m = np.moveaxis(np.broadcast_to(mask, x.shape), position, -1)
    x = np.moveaxis(x, position, -1)
    with np.errstate(all="ignore"):
        visible = m.any(axis=-1, keepdims=True)
        mx = np.where(visible, np.where(m, x, -np.inf).max(axis=-1, keepdims=True), 0)
        e = np.exp(np.where(m, x - mx, -np.inf))  # exponents <= 0; masked -> exp(-inf) = 0
        s = e.sum(axis=-1, keepdims=True)
        # hidden entries 0; visible ones e / s: a NaN or ±inf among them gives NaN (IEEE, as cpu)
        res = np.where(m, e / np.where(visible, s, 1), 0).astype(x.dtype)
    return np.moveaxis(res, -1, position)


def _reference(request: KernelRequest) -> Kernel:
    node = request.node
    lt, mt = node.input_types
    position = lt.axes.index(node.attributes["axis"])
    acc = numpy_dtype(accumulation_dtype(lt.dtype, node.attributes["accumulation_dtype"]))

    def run(inputs: Sequence[np.ndarray], out: np.ndarray) -> None:
        logits, mask = inputs
        m = align_to(np.asarray(mask), mt, lt)
        out[...] = masked_softmax_numpy(np.asarray(logits).astype(acc), m, position)
    return plain_kernel(run)


def _check_device(node: Node, backend: str) -> None:
    check_dtypes(node, backend, KERNEL_FLOATS, node.input_types[:1])


def _indexing(position: int, space_rank: int, mask_broadcast: Sequence[bool], wrap):
    """(at, mat, n): the subscripts of the logits and of the mask at softmax index ``k`` (an
    expression) of the current index-space element, and the softmax extent."""
    names = [f"i{k}" for k in range(space_rank)]

    def at(k: str) -> str:
        return ", ".join(names[:position] + [wrap(k)] + names[position:])

    def mat(k: str) -> str:
        full = names[:position] + [wrap(k)] + names[position:]
        return ", ".join("0" if b else i for i, b in zip(full, mask_broadcast))
    return at, mat, f"lg.shape[{position}]"


def _row_maximum(at, mat, n: str, check: bool = False, span: bool = False) -> list[str]:
    """``mx``: the row's maximum over visible entries, ``found``: whether there is one; with
    ``check``, ``bad`` set by a NaN or ±inf in any entry, masked ones too (SPEC §4); with
    ``span``, ``lo``/``hi``: the first visible entry and one past the last."""
    return [f"mx = lg[{at('0')}]",
            "found = False",
            *(["lo = 0", "hi = 0"] if span else []),
            f"for k in range({n}):",
            f"    x = lg[{at('k')}]",
            *(["    bad |= (x - x) != 0"] if check else []),
            f"    if mk[{mat('k')}]:",
            "        if (not found) or x > mx:",
            "            mx = x",
            *(["        if not found:", "            lo = k", "        hi = k + 1"] if span else []),
            "        found = True"]


def _body(position: int, space_rank: int, mask_broadcast: Sequence[bool], wrap) -> list[str]:
    """Per index-space element: the three passes over the softmax axis (max, exp+sum, scale)."""
    at, mat, n = _indexing(position, space_rank, mask_broadcast, wrap)
    return _row_maximum(at, mat, n) + [
        "if found:",
        "    s = 0.0",
        f"    for k in range({n}):",
        f"        if mk[{mat('k')}]:",
        f"            e = math.exp(lg[{at('k')}] - mx)",
        f"            out[{at('k')}] = e",
        "            s += e",
        "        else:",
        f"            out[{at('k')}] = 0.0",
        f"    for k in range({n}):",
        f"        out[{at('k')}] = out[{at('k')}] / s",
        "else:",
        f"    for k in range({n}):",
        f"        out[{at('k')}] = 0.0",
    ]


def _cpu_body(position: int, space_rank: int, mask_broadcast: Sequence[bool], wrap, check: bool = False) -> list[str]:
    """``_body`` shaped for the CPU's vector units, over the row's visible span only (entries
    before the first visible one and after the last are written 0 with no ``exp``: a causal
    mask hides half of them): the exponentials of the span in one loop with no branch and no
    sum (``exp`` of every entry, masked ones then replaced by 0: a select), so it vectorises;
    then the sum in four interleaved float64 partial sums (a single chain waits for each
    addition), then the division."""
    at, mat, n = _indexing(position, space_rank, mask_broadcast, wrap)
    return _row_maximum(at, mat, n, check, span=True) + [
        "if found:",
        "    for k in range(lo):",
        f"        out[{at('k')}] = 0.0",
        f"    for k in range(hi, {n}):",
        f"        out[{at('k')}] = 0.0",
        "    for k in range(lo, hi):",
        f"        e = _vexp(lg[{at('k')}] - mx)",  # (runtime.kernels.vmath: it vectorises)
        f"        out[{at('k')}] = e if mk[{mat('k')}] else 0.0",
        "    s0 = 0.0",
        "    s1 = 0.0",
        "    s2 = 0.0",
        "    s3 = 0.0",
        "    k = lo",
        "    while k + 4 <= hi:",
        f"        s0 += out[{at('k')}]",
        f"        s1 += out[{at('k + 1')}]",
        f"        s2 += out[{at('k + 2')}]",
        f"        s3 += out[{at('k + 3')}]",
        "        k += 4",
        "    while k < hi:",
        f"        s0 += out[{at('k')}]",
        "        k += 1",
        "    s = (s0 + s1) + (s2 + s3)",
        "    for k in range(lo, hi):",
        f"        out[{at('k')}] = out[{at('k')}] / s",
        "else:",
        f"    for k in range({n}):",
        f"        out[{at('k')}] = 0.0",
    ]


def _layout(node: Node):
    lt, mt = node.input_types
    position = lt.axes.index(node.attributes["axis"])
    lead = lt.rank == 1  # a leading unit axis gives a rank-1 softmax a non-empty index space
    pattern = list(_broadcast(mt, lt))
    if lead:
        pattern = [True] + pattern
    return position + lead, lt.rank + lead, lead, pattern


def _broadcast(mt: TensorType, lt: TensorType):
    """As ``cpu_codegen.broadcast_axes``: an axis of extent 1 in both is not broadcast."""
    present = dict(zip(mt.axes, mt.sizes))
    return tuple(a not in present or (present[a] == 1 and e != 1) for a, e in zip(lt.axes, lt.shape))


def _keepdims(mask: np.ndarray, mt: TensorType, lt: TensorType) -> np.ndarray:
    """The mask with the logits' rank and axis order, extent 1 where broadcast (a view)."""
    order = sorted(range(mt.rank), key=lambda i: lt.axes.index(mt.axes[i]))
    present = {mt.axes[i]: mt.shape[i] for i in range(mt.rank)}
    moved = mask.transpose(order) if mt.rank > 1 else mask
    return moved.reshape(tuple(present.get(a, 1) for a in lt.axes))


def _cpu(request: KernelRequest) -> Kernel:
    """Asked to count the logits (``count_inputs`` has 0), the kernel also counts their NaN
    and ±inf entries (masked ones too), read in the pass that finds each row's maximum."""
    from runtime.toolkit import cpu as cg

    node = request.node
    _check_device(node, "cpu")
    lt, mt = node.input_types
    position, rank, lead, pattern = _layout(node)
    dt = cg.numba_type(lt.dtype, node.path, "masked-softmax")
    space = [k for k in range(rank) if k != position]
    check = 0 in request.count_inputs
    body = _cpu_body(position, len(space), pattern, lambda k: f"_u({k})", check)
    flag = "bad" if check else None
    args = [("lg", dt, rank, False), ("mk", "boolean", rank, False), ("out", dt, rank, True)]
    label = f"masked-softmax axis {position} of rank {rank} {dt}{' counting' if check else ''}"
    dims = [f"lg.shape[{k}]" for k in space]
    kernel = cg.NestKernel.loop("softmax", label, args, dims, body, flag)
    shape = ((1,) if lead else ()) + lt.shape
    space_shape = tuple(shape[k] for k in space)
    work = lt.elements

    def run(inputs: Sequence[np.ndarray], out: np.ndarray) -> int | None:
        logits, mask = inputs
        m = cg.contiguous(_keepdims(np.asarray(mask), mt, lt))
        lg = cg.contiguous(logits)
        if lead:
            lg, m, out = lg.reshape(shape), m.reshape((1,) + m.shape), out.reshape(shape)
        return kernel([lg, m, out], space_shape, work)
    return plain_kernel(run, Counts(inputs=(0,) if check else ()), warm=kernel.warm)


def _cuda(request: KernelRequest) -> Kernel:
    from runtime.toolkit import cuda as cg

    node = request.node
    _check_device(node, "cuda")
    lt, mt = node.input_types
    position, rank, lead, pattern = _layout(node)
    space = [k for k in range(rank) if k != position]
    body = _body(position, len(space), pattern, lambda k: k)
    source = cg.render(f"masked-softmax axis {position} of rank {rank}", ["lg", "mk", "out"],
                       [f"lg.shape[{k}]" for k in space], body)
    kernel = cg.SpaceKernel("cusoftmax", source)
    shape = ((1,) if lead else ()) + lt.shape
    n = max(1, lt.elements // lt.shape[position - lead])

    def run(inputs, out) -> None:
        logits, mask = inputs
        m = cg.align_device(mask, mt, lt)
        if lead:
            logits, m, out = logits.reshape(shape), m.reshape((1,) + tuple(m.shape)), out.reshape(shape)
        kernel([logits, m, out], n)
    return plain_kernel(run)


SPECS = [
    AtomSpec(name="masked-softmax", refs=refs_for("masked-softmax"), inputs=("logits", "mask"),
             dtypes={"logits": "floating", "mask": "boolean"},
             attributes=frozenset({"axis", "accumulation_dtype"}), infer=infer_masked_softmax,
             kernels={"reference": _reference, "cpu": _cpu, "cuda": _cuda},
             free_axes=axes_except("axis"), role="masked-softmax",
             summary="stable softmax over visible entries along an axis; masked entries 0"),
]
