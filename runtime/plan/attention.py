"""Fused attention (issue 20 item 4): ``contract → [elementwise chain] → masked-softmax →
contract`` rewritten, when it is safe, into one planner-made node whose CPU kernel streams
over blocks of query rows and never writes the [rows, keys] scores
(:mod:`runtime.kernels.attention`).

Atoms are recognised by their ``AtomSpec.role`` ("contraction", "masked-softmax"), never by
name. The pattern, on the slots of one program:

- ``s = contract(q, k)`` summing exactly one axis pair (the head dim); the softmax axis is a
  kept axis of ``k`` only, and ``k`` keeps no other axis of its own;
- optionally elementwise nodes on ``s``, each reading the chain value once at the scores'
  very axes and extents, every other operand a single element (a scale, say);
- ``p = masked-softmax(s', mask, axis=K)``;
- ``o = contract(p, v)`` (either side) summing exactly ``[K, v's key axis]``, ``v`` holding no
  query axis.

Safe only when every intermediate has exactly one reader and is not an output, and every
value is float32 (or every value float64) computed in that dtype; the caller leaves the
rewrite out when outputs are checked (the replay of a group names the first instruction
that made a NaN, which needs the unfused nodes).
"""
from __future__ import annotations

from collections.abc import Sequence

import attrs
import numpy as np

from runtime.core import settings
from runtime.core.types import TensorType, accumulation_dtype, numpy_dtype
from runtime.kernels.layout import c_strides, keepdims_order
from runtime.plan import patterns
from runtime.plan.fusion import CHAIN, EMPTY_EPILOGUE, Epilogue, EpilogueStep
from runtime.plugins.atomspec import AtomSpec, Node
from runtime.plugins.expressions import scalar_op
from runtime.plugins.kernel import (FLAT_OUTPUT, CompiledCall, Counts, Kernel, KernelRequest, const_array,
                                    const_int, flat_input, plain_kernel)

CONTRACTION, MASKED_SOFTMAX = "contraction", "masked-softmax"
DTYPES = ("float32", "float64")


@attrs.frozen
class Form:
    """How the operands' axes map onto the kernel's (batch, query row, key, head, value)."""

    batch: tuple[str, ...]  # axes of q and k both (and of the scores), in scores order
    query: tuple[str, ...]  # q's own kept axes, in scores order
    q_head: str
    k_head: str
    k_key: str  # the softmax axis (k's own kept axis, by its name in k and the scores)
    v_key: str  # v's axis summed against it
    values: tuple[str, ...]  # v's own axes, in v's order
    scores: TensorType  # the softmax's logits type (where the mask is broadcast)
    chain: Epilogue  # the elementwise steps on the scores (empty: none)
    dtype: str


def _infer_unused(ctx):  # the planner builds these nodes with their types; no program names them
    raise AssertionError("fused attention is a planner-made node")


def _role(node: Node | None) -> str | None:
    return None if node is None else node.atom.role


def _computes_in(node: Node, dt: str) -> bool:
    acc = node.attributes.get("accumulation_dtype", "activation")
    return accumulation_dtype(dt, acc) == dt


def find(nodes: Sequence[Node], outputs: Sequence[str], backend: str) -> list[tuple[tuple[Node, ...], Node]]:
    """Each match: (the nodes it replaces in program order, the fused node). Only for a
    backend the fused node has a kernel for, and unless FORMULA_FUSED_ATTENTION=0 (the
    unfused plan, for comparisons)."""
    if backend not in ATTENTION.kernels or not settings.FUSED_ATTENTION.read():
        return []
    return patterns.find(nodes, outputs, _match)


def _match(o: Node, graph: patterns.Graph):
    producer, single = graph.producer, graph.single
    if _role(o) != CONTRACTION or len(o.attributes["reduce_axes"]) != 1:
        return None
    (a, b), = o.attributes["reduce_axes"]
    for side in (0, 1):
        p = producer.get(o.input_slots[side])
        if _role(p) == MASKED_SOFTMAX and single(p.output_slot) and o.input_slots[1 - side] != p.output_slot:
            key, v_key = (a, b) if side == 0 else (b, a)
            if p.attributes["axis"] == key:
                break
    else:
        return None
    v_slot, vt = o.input_slots[1 - side], o.input_types[1 - side]
    chain: list[Node] = []
    cur = p.input_slots[0]
    while True:
        n = producer.get(cur)
        if n is None or not single(cur):
            return None
        if _role(n) == CONTRACTION:
            break
        out = n.output_type
        whole = [j for j, t in enumerate(n.input_types) if t.axes == out.axes and t.shape == out.shape]
        if n.atom.elementwise is None or len(whole) != 1:
            return None
        k = whole[0]
        if n.input_slots.count(n.input_slots[k]) != 1 or \
                any(t.elements != 1 for j, t in enumerate(n.input_types) if j != k):
            return None
        chain.insert(0, n)
        cur = n.input_slots[k]
    s = producer[cur]
    if len(s.attributes["reduce_axes"]) != 1:
        return None
    (ha, hb), = s.attributes["reduce_axes"]
    lt, rt = s.input_types
    kept_l = [x for x in lt.axes if x != ha]
    kept_r = [x for x in rt.axes if x != hb]
    if key in kept_r and key not in kept_l:
        qs, ks, qt, kt, q_head, k_head = 0, 1, lt, rt, ha, hb
        own_k = [x for x in kept_r if x not in kept_l]
    elif key in kept_l and key not in kept_r:
        qs, ks, qt, kt, q_head, k_head = 1, 0, rt, lt, hb, ha
        own_k = [x for x in kept_l if x not in kept_r]
    else:
        return None
    if own_k != [key]:
        return None
    scores = s.output_type
    batch = tuple(x for x in scores.axes if x in qt.axes and x in kt.axes)
    query = tuple(x for x in scores.axes if x in qt.axes and x not in kt.axes)
    if any(x in query or x == key for x in vt.axes if x != v_key):
        return None
    values = tuple(x for x in vt.axes if x != v_key and x not in batch)
    dt = o.output_type.dtype
    every = [s, *chain, p, o]
    types = [qt, kt, vt, *(n.output_type for n in every)]
    if dt not in DTYPES or any(t.dtype != dt for t in types) or not all(_computes_in(n, dt) for n in every):
        return None
    if any(t.dtype != dt for n in chain for t in n.input_types):
        return None
    mask_slot, mask_type = p.input_slots[1], p.input_types[1]
    epilogue = _chain(chain, cur)
    form = Form(batch, query, q_head, k_head, key, v_key, values, p.input_types[0], epilogue, dt)
    slots = (s.input_slots[qs], s.input_slots[ks], v_slot, mask_slot, *epilogue.extra_slots)
    in_types = (qt, kt, vt, mask_type, *epilogue.extra_types)
    fused = Node(o.index, f"{o.instruction_id}~attention", ATTENTION, {"form": form}, slots,
                 o.output_slot, in_types, o.output_type, o.path)
    return tuple(every), fused


def _chain(chain: Sequence[Node], first: str) -> Epilogue:
    if not chain:
        return EMPTY_EPILOGUE
    extras: list[str] = []
    types: list[TensorType] = []
    steps = []
    value = first
    for n in chain:
        sources = []
        for slot, t in zip(n.input_slots, n.input_types):
            if slot == value:
                sources.append(CHAIN)
                continue
            if slot not in extras:
                extras.append(slot)
                types.append(t)
            sources.append(extras.index(slot))
        steps.append(EpilogueStep(n, scalar_op(n, "cpu"), tuple(sources)))  # (ATTENTION runs on cpu only)
        value = n.output_slot
    return Epilogue(tuple(steps), tuple(extras), tuple(types))


# --- the kernel -------------------------------------------------------------------------------

def _cpu(request: KernelRequest) -> Kernel:
    from runtime.kernels import attention as ak  # (numba: imported only once a plan needs it)

    node = request.node
    form: Form = node.attributes["form"]
    qt, kt, vt, mt = node.input_types[:4]
    chain: list[str] = []
    if not form.chain.empty:
        lines, result = form.chain.emit("x", [f"cs[{k}]" for k in range(form.chain.n_extra)], cpu=True)
        chain = lines + [f"x = {result}"]
    kernel = ak.attention_kernel(form.dtype, chain, form.chain.n_extra)
    dtype = np.dtype(form.dtype)
    order, _ = keepdims_order(mt, form.scores)
    cache: dict = {}

    def run(inputs: Sequence[np.ndarray], out: np.ndarray) -> None:
        q, k, v, mask, *scalars = (np.asarray(x) for x in inputs)
        m = _mask_rows(mask, mt, order, form)
        qf, qs = ak.flat(q)
        kf, ks = ak.flat(k)
        vf, vs = ak.flat(v)
        target = out if out.flags.c_contiguous and out.dtype == dtype else np.empty(out.shape, dtype)
        os_ = tuple(s // dtype.itemsize for s in target.strides)
        key = (q.shape, qs, k.shape, ks, v.shape, vs, m.shape, out.shape, os_)
        tables, (nb, nq, nk, nd, ne) = ak.cached(cache, key, lambda: _tables(
            form, node, q.shape, qs, k.shape, ks, v.shape, vs, m.shape, out.shape, os_))
        mk = m.reshape(-1, nk) if nk else np.zeros((1, 0), np.bool_)
        lo, hi, dense = ak.spans(mk)
        cs = np.array([np.asarray(x).reshape(-1)[0] for x in scalars] or [0], dtype)
        bq = ak.row_ceiling(nq)
        qb, qi, qsd, kb, ksj, ksd, vb, vsj, ve, mrb, mrq, ob, oq, oe, ec = tables
        args = (qf, qb, qi, qsd, kf, kb, ksj, ksd, vf, vb, vsj, ve, mrb, mrq, mk.reshape(-1), lo, hi,
                dense, cs, target.reshape(-1), ob, oq, oe, ec, nq, nk, nd, ne, bq, *flags)
        bad = kernel(args, nb * nq * nk * nd, nb * -(-nq // bq))
        if target is not out:
            out[...] = target
        return bad

    # q, k and v are read in full (every element at least once): the kernel may count them
    counted = tuple(k for k in (0, 1, 2) if k in request.count_inputs)
    flags = tuple(k in counted for k in (0, 1, 2))
    return plain_kernel(run, Counts(inputs=counted), warm=kernel.warm,
                        compiled=_compiled(node, form, kernel, flags))


def _compiled(node: Node, form: Form, kernel, flags) -> CompiledCall | None:
    """How compiled code runs the kernel for C-contiguous operands: the tables of that layout,
    when the mask's rows are its own C-order elements (no transpose, no broadcast along the
    keys) and nothing is empty."""
    from runtime.kernels import attention as ak

    qt, kt, vt, mt = node.input_types[:4]
    ot, dtype = node.output_type, np.dtype(form.dtype)
    if not all(t.is_static and t.elements for t in (*node.input_types, ot)) or np.dtype(numpy_dtype(ot.dtype)) != dtype:
        return None
    lt, seq = form.scores, (*form.batch, *form.query, form.k_key)
    nk_scores = lt.shape[lt.axes.index(form.k_key)]
    whole = [a for a, n in zip(mt.axes, mt.shape) if n > 1]  # (extent-1 axes move no element)
    if form.k_key not in mt.axes or mt.size_of(form.k_key) != nk_scores or whole != [a for a in seq if a in whole]:
        return None  # _mask_rows would transpose or broadcast the mask: no reshape of its buffer
    _, keep = keepdims_order(mt, lt)
    rows_shape = tuple(keep[lt.axes.index(a)] for a in seq)
    strides = [tuple(c_strides(t.shape)) for t in (qt, kt, vt)]
    tables, (nb, nq, nk, nd, ne) = _tables(form, node, qt.shape, strides[0], kt.shape, strides[1], vt.shape,
                                           strides[2], rows_shape, ot.shape, tuple(c_strides(ot.shape)))
    bq = ak.row_ceiling(nq)
    work, tasks = nb * nq * nk * nd, nb * -(-nq // bq)
    qb, qi, qsd, kb, ksj, ksd, vb, vsj, ve, mrb, mrq, ob, oq, oe, ec = tables
    data = dict(unaligned=True)
    params = (flat_input(0, **data), const_array(qb), const_array(qi), const_int(qsd),
              flat_input(1, **data), const_array(kb), const_int(ksj), const_int(ksd),
              flat_input(2, **data), const_array(vb), const_int(vsj), const_array(ve),
              const_array(mrb), const_array(mrq), flat_input(3), const_int(nk), FLAT_OUTPUT,
              const_array(ob), const_array(oq), const_array(oe), const_int(ec),
              *map(const_int, (nq, nk, nd, ne, bq, *flags)),
              *(flat_input(4 + k) for k in range(form.chain.n_extra)))
    parallel = kernel.is_parallel(work, tasks)
    return CompiledCall(lambda: (kernel.parallel_module() if parallel else kernel.serial_module).call, params)


def _mask_rows(mask: np.ndarray, mt: TensorType, order, form: Form) -> np.ndarray:
    """The mask as a C-contiguous array over (batch axes, query axes, key), extent 1 where it
    is broadcast, the key axis whole: its rows are the distinct mask rows (its own size)."""
    lt = form.scores
    _, keep = keepdims_order(mt, lt, mask.shape)
    aligned = (mask.transpose(order) if mt.rank > 1 else mask).reshape(keep)
    rows = aligned.transpose([lt.axes.index(a) for a in (*form.batch, *form.query, form.k_key)])
    nk = lt.shape[lt.axes.index(form.k_key)]
    if rows.shape[-1] != nk:
        rows = np.broadcast_to(rows, rows.shape[:-1] + (nk,))
    return np.ascontiguousarray(rows)


def _offsets(axes: Sequence[str], shape, strides, over_axes: Sequence[str], extents: Sequence[int]) -> np.ndarray:
    """Element offsets over ``over_axes`` (of these extents) of an array with ``axes``, ``shape``
    and element ``strides``: 0 along an axis it lacks or holds with extent 1 (broadcast)."""
    st = [strides[axes.index(a)] if a in axes and shape[axes.index(a)] != 1 else 0 for a in over_axes]
    off = np.zeros(1, np.int64)
    for n, s in zip(extents, st):
        off = (off[:, None] + np.arange(n, dtype=np.int64) * s).ravel()
    return off


def _tables(form: Form, node: Node, qshape, qs, kshape, ks, vshape, vs, mshape, oshape, os_):
    """The kernel's offset tables and strides for one layout, and (nb, nq, nk, nd, ne)."""
    qt, kt, vt = node.input_types[:3]
    ot = node.output_type
    nb_ext = [qshape[qt.axes.index(a)] for a in form.batch]
    nq_ext = [qshape[qt.axes.index(a)] for a in form.query]
    ne_ext = [vshape[vt.axes.index(a)] for a in form.values]
    nk = kshape[kt.axes.index(form.k_key)]
    nd = qshape[qt.axes.index(form.q_head)]
    m_axes = (*form.batch, *form.query, form.k_key)  # the mask rows' array, C-contiguous
    m_rows = [s // nk for s in c_strides(mshape)] if nk else [0] * len(mshape)
    tables = (_offsets(qt.axes, qshape, qs, form.batch, nb_ext), _offsets(qt.axes, qshape, qs, form.query, nq_ext),
              qs[qt.axes.index(form.q_head)],
              _offsets(kt.axes, kshape, ks, form.batch, nb_ext), ks[kt.axes.index(form.k_key)],
              ks[kt.axes.index(form.k_head)],
              _offsets(vt.axes, vshape, vs, form.batch, nb_ext), vs[vt.axes.index(form.v_key)],
              _offsets(vt.axes, vshape, vs, form.values, ne_ext),
              _offsets(m_axes, mshape, m_rows, form.batch, nb_ext),
              _offsets(m_axes, mshape, m_rows, form.query, nq_ext),
              _offsets(ot.axes, oshape, os_, form.batch, nb_ext),
              _offsets(ot.axes, oshape, os_, form.query, nq_ext),
              _offsets(ot.axes, oshape, os_, form.values, ne_ext))
    ne = int(np.prod(ne_ext, dtype=np.int64))
    contiguous = int(np.array_equal(tables[-1], np.arange(ne)))  # the values' axes: whole vectors stored
    tables += (contiguous,)
    count = (int(np.prod(nb_ext, dtype=np.int64)), int(np.prod(nq_ext, dtype=np.int64)), nk, nd,
             int(np.prod(ne_ext, dtype=np.int64)))
    return tables, count


def _scratch(node: Node, backend: str) -> int:
    from runtime.kernels import attention as ak

    form: Form = node.attributes["form"]
    qt, kt, vt = node.input_types[:3]
    nb = int(np.prod([qt.size_of(a) for a in form.batch], dtype=np.int64))
    nq = int(np.prod([qt.size_of(a) for a in form.query], dtype=np.int64))
    ne = int(np.prod([vt.size_of(a) for a in form.values], dtype=np.int64))
    return ak.scratch_bytes(nb, nq, kt.size_of(form.k_key), qt.size_of(form.q_head), ne,
                            np.dtype(form.dtype).itemsize, ak.threads())


ATTENTION = AtomSpec("fused-attention", ("formula-runtime/fused-attention@1",), ("q", "k", "v", "mask"),
                     frozenset(), _infer_unused, kernels={"cpu": _cpu}, scratch_bytes=_scratch,
                     summary="q·kᵀ → scalar chain → masked-softmax → ·v in one streaming kernel (planner-made)")

