"""The fused attention kernel for the CPU: ``softmax_mask(chain(q·kᵀ))·v`` in one streaming pass
per (batch, block of query rows), the [rows, keys] scores never written to memory whole.

Layout-free: every operand is read through element-offset tables (one per group of axes:
batch, query rows, values) and two strides (key, head), so any axis order and any stride
takes the same compiled kernel; the per-call work in Python is the tables and the spans.
The keys are packed once per call, transposed ([batch, head, key], zero-padded) so that a
register tile of 4 query rows × 2 vectors of keys runs on broadcast-FMA; the values are
packed [batch, key, value] for the 4 rows × 2 vectors tile of p·v.

Each query row's visible span [lo, hi) comes from its mask row (computed once per distinct
mask row, so a mask broadcast over batch and heads costs one pass over its own size): scores
are computed only inside the union of a tile's spans, entries of a row outside its span or
masked inside it weigh 0, and a row with no visible entry gives zeros (SPEC §3
masked-softmax). Every score is one dot product summed over the head dim in order, and
every output element one sum over the keys in order, whatever the tile a row falls in: a
slice of the rows computes each row exactly as the whole run does.

Extent-generic: extents are arguments of one explicitly typed entry per (dtype, chain), so a
new sequence length compiles nothing; a parallel twin (``prange`` over batch × query blocks)
is built on first need or by :meth:`AttentionKernel.warm`.
"""
from __future__ import annotations

import os
import threading
from collections.abc import Sequence

import numpy as np
from llvmlite import ir
from numba import njit, types
from numba.extending import intrinsic

from runtime.kernels import simd, vmath
from runtime.kernels.codegen import configure_numba_cache, load_generated

# Below this many multiply-adds (rows × visible keys × head dim, as if unmasked) a call runs
# on one thread: a parallel region costs more than it saves. FORMULA_ATTENTION_PARALLEL_MIN
# overrides it.
PARALLEL_MIN_MACS = int(os.environ.get("FORMULA_ATTENTION_PARALLEL_MIN", 1 << 21))
BLOCK_ROWS = 32  # query rows per task: keys packed in cache are reused by this many rows
TILE_ROWS = 4  # rows of a register tile (4 rows × 2 vectors: 8 accumulators)
DYNAMIC_CHUNKS = 16  # chunks per parallel call (dynamic scheduling: a causal mask's tasks differ)
VERSION = 3


def _define_max(dtype, suffix: str):
    """``vmax`` (lane-wise maximum, the first operand where they compare unordered) and
    ``hmax`` (the largest lane) on :mod:`runtime.kernels.simd` vectors: a row maximum at
    vector speed, where a scalar maximum is one long dependency chain."""
    lanes = simd.VECTOR_BYTES // (4 if dtype == types.float32 else 8)
    vt = simd.Vector(dtype, lanes)

    @intrinsic
    def vmax(typingctx, a, b):
        if not (a == vt and b == vt):
            return None

        def codegen(context, builder, sig, args):
            return builder.select(builder.fcmp_ordered(">", args[1], args[0]), args[1], args[0])
        return vt(a, b), codegen

    @intrinsic
    def hmax(typingctx, v):
        if v != vt:
            return None

        def codegen(context, builder, sig, args):
            x, width = args[0], lanes
            while width > 1:
                width //= 2
                lo = builder.shuffle_vector(x, x, ir.Constant(ir.VectorType(ir.IntType(32), width), list(range(width))))
                hi = builder.shuffle_vector(x, x, ir.Constant(ir.VectorType(ir.IntType(32), width),
                                                              list(range(width, 2 * width))))
                x = builder.select(builder.fcmp_ordered(">", hi, lo), hi, lo)
            return builder.extract_element(x, ir.Constant(ir.IntType(32), 0))
        return dtype(v), codegen

    globals()[f"vmax_{suffix}"], globals()[f"hmax_{suffix}"] = vmax, hmax


_define_max(types.float32, "f32x8")
_define_max(types.float64, "f64x4")


@njit(cache=True, nogil=True)
def spans(mask2d):
    """Per mask row: the first visible key, one past the last, and whether every key between
    them is visible (then the kernel reads no mask element)."""
    rows, n = mask2d.shape
    lo = np.zeros(rows, np.int64)
    hi = np.zeros(rows, np.int64)
    dense = np.zeros(rows, np.uint8)
    for r in range(rows):
        first, last, count = -1, -1, 0
        for j in range(n):
            if mask2d[r, j]:
                if first < 0:
                    first = j
                last = j
                count += 1
        if first >= 0:
            lo[r] = first
            hi[r] = last + 1
            dense[r] = 1 if count == last + 1 - first else 0
    return lo, hi, dense


_TEMPLATE = '''
def kernel(qf, qb, qi, qsd, kf, kb, ksj, ksd, vf, vb, vsj, ve, mrb, mrq, mk, slo, shi, sdense, cs,
           out, ob, oq, oe, ec, nq, nk, nd, ne, bq):
    nb = qb.shape[0]
    W = 2 * L
    nkp = nk + W
    nep = ((ne + W - 1) // W) * W
    kt = np.empty(max(nb * nd * nkp, 1), DT)
    vp = np.empty(max(nb * nk * nep, 1), DT)
    for b in LOOP(nb):
        base = b * nd * nkp
        for j in range(nk):
            src = kb[b] + j * ksj
            for d in range(nd):
                kt[base + d * nkp + j] = kf[src + d * ksd]
        for d in range(nd):
            kt[base + d * nkp + nk:base + (d + 1) * nkp] = 0.0
        vbase = b * nk * nep
        for j in range(nk):
            src = vb[b] + j * vsj
            row = vbase + j * nep
            for e in range(ne):
                vp[row + e] = vf[src + ve[e]]
            for e in range(ne, nep):
                vp[row + e] = 0.0
    nqb = (nq + bq - 1) // bq
    for t in LOOP(nb * nqb):
        b = t // nqb
        i0 = (t - b * nqb) * bq
        nr = min(bq, nq - i0)
        nr4 = ((nr + 3) // 4) * 4
        qk = np.zeros(nr4 * nd, DT)
        sc = np.empty(nr4 * nkp, DT)
        los = np.zeros(nr4, np.int64)
        his = np.zeros(nr4, np.int64)
        dns = np.zeros(nr4, np.uint8)
        mrs = np.zeros(nr4, np.int64)
        inv = np.zeros(nr4, DT)
        tmp = np.empty(4 * W, DT)
        for r in range(nr):
            i = i0 + r
            m = mrb[b] + mrq[i]
            mrs[r] = m
            los[r] = slo[m]
            his[r] = shi[m]
            dns[r] = sdense[m]
            src = qb[b] + qi[i]
            for d in range(nd):
                qk[r * nd + d] = qf[src + d * qsd]
        ktb = b * nd * nkp
        vbase = b * nk * nep
        for r0 in range(0, nr4, 4):
            jlo = nk
            jhi = 0
            for r in range(r0, r0 + 4):
                if his[r] > los[r]:
                    jlo = min(jlo, los[r])
                    jhi = max(jhi, his[r])
            if jhi <= jlo:
                for r in range(r0, min(r0 + 4, nr)):
                    for e in range(ne):
                        out[ob[b] + oq[i0 + r] + oe[e]] = 0.0
                continue
            q0 = r0 * nd
            j = jlo
            while j < jhi:
                a00 = vzero()
                a01 = vzero()
                a10 = vzero()
                a11 = vzero()
                a20 = vzero()
                a21 = vzero()
                a30 = vzero()
                a31 = vzero()
                p = ktb + j
                for d in range(nd):
                    k0 = vload(kt, p)
                    k1 = vload(kt, p + L)
                    x = vbcast(qk[q0 + d])
                    a00 = vfma(x, k0, a00)
                    a01 = vfma(x, k1, a01)
                    x = vbcast(qk[q0 + nd + d])
                    a10 = vfma(x, k0, a10)
                    a11 = vfma(x, k1, a11)
                    x = vbcast(qk[q0 + 2 * nd + d])
                    a20 = vfma(x, k0, a20)
                    a21 = vfma(x, k1, a21)
                    x = vbcast(qk[q0 + 3 * nd + d])
                    a30 = vfma(x, k0, a30)
                    a31 = vfma(x, k1, a31)
                    p += nkp
                s0 = r0 * nkp + j
                vstore(sc, s0, a00)
                vstore(sc, s0 + L, a01)
                vstore(sc, s0 + nkp, a10)
                vstore(sc, s0 + nkp + L, a11)
                vstore(sc, s0 + 2 * nkp, a20)
                vstore(sc, s0 + 2 * nkp + L, a21)
                vstore(sc, s0 + 3 * nkp, a30)
                vstore(sc, s0 + 3 * nkp + L, a31)
                j += W
            for r in range(r0, r0 + 4):
                row = r * nkp
                lo = los[r]
                hi = his[r]
                if hi <= lo:
                    sc[row + jlo:row + jhi] = 0.0
                    continue
                sc[row + jlo:row + lo] = 0.0
                sc[row + hi:row + jhi] = 0.0
                at = row + lo
                ni = hi - lo
                un = _u(ni)
                ua = _u(at)
CHAIN
                if dns[r]:
                    vm = vbcast(sc[at])
                    j = 0
                    while j + L <= ni:
                        vm = vmax(vm, vload(sc, at + j))
                        j += L
                    mx = hmax(vm)
                    while j < ni:
                        x = sc[at + j]
                        mx = x if x > mx else mx
                        j += 1
                    for u in range(un):
                        sc[ua + u] = math.exp(sc[ua + u] - mx)
                else:
                    mrow = _u(mrs[r] * nk + lo)
                    mx = sc[at]
                    for u in range(un):
                        x = sc[ua + u]
                        if mk[mrow + u] and x > mx:
                            mx = x
                    for u in range(un):
                        x = math.exp(sc[ua + u] - mx)
                        sc[ua + u] = x if mk[mrow + u] else 0.0
                one = vbcast(1.0)
                a00 = vzero()
                a01 = vzero()
                j = 0
                while j + W <= ni:
                    a00 = vfma(vload(sc, at + j), one, a00)
                    a01 = vfma(vload(sc, at + j + L), one, a01)
                    j += W
                tot = 0.0 + vhsum(a00) + vhsum(a01)
                while j < ni:
                    tot += sc[at + j]
                    j += 1
                inv[r] = 1.0 / tot
            p0 = r0 * nkp
            e0 = 0
            while e0 < nep:
                a00 = vzero()
                a01 = vzero()
                a10 = vzero()
                a11 = vzero()
                a20 = vzero()
                a21 = vzero()
                a30 = vzero()
                a31 = vzero()
                pv = vbase + jlo * nep + e0
                for j in range(jlo, jhi):
                    v0 = vload(vp, pv)
                    v1 = vload(vp, pv + L)
                    x = vbcast(sc[p0 + j])
                    a00 = vfma(x, v0, a00)
                    a01 = vfma(x, v1, a01)
                    x = vbcast(sc[p0 + nkp + j])
                    a10 = vfma(x, v0, a10)
                    a11 = vfma(x, v1, a11)
                    x = vbcast(sc[p0 + 2 * nkp + j])
                    a20 = vfma(x, v0, a20)
                    a21 = vfma(x, v1, a21)
                    x = vbcast(sc[p0 + 3 * nkp + j])
                    a30 = vfma(x, v0, a30)
                    a31 = vfma(x, v1, a31)
                    pv += nep
                top = min(W, ne - e0)
                if ec and top == W:
                    z = vzero()
                    at = ob[b] + oq[i0 + r0] + e0
                    vstore(out, at, vfma(a00, vbcast(inv[r0]), z))
                    vstore(out, at + L, vfma(a01, vbcast(inv[r0]), z))
                    if r0 + 1 < nr:
                        at = ob[b] + oq[i0 + r0 + 1] + e0
                        vstore(out, at, vfma(a10, vbcast(inv[r0 + 1]), z))
                        vstore(out, at + L, vfma(a11, vbcast(inv[r0 + 1]), z))
                    if r0 + 2 < nr:
                        at = ob[b] + oq[i0 + r0 + 2] + e0
                        vstore(out, at, vfma(a20, vbcast(inv[r0 + 2]), z))
                        vstore(out, at + L, vfma(a21, vbcast(inv[r0 + 2]), z))
                    if r0 + 3 < nr:
                        at = ob[b] + oq[i0 + r0 + 3] + e0
                        vstore(out, at, vfma(a30, vbcast(inv[r0 + 3]), z))
                        vstore(out, at + L, vfma(a31, vbcast(inv[r0 + 3]), z))
                else:
                    vstore(tmp, 0, a00)
                    vstore(tmp, L, a01)
                    vstore(tmp, W, a10)
                    vstore(tmp, W + L, a11)
                    vstore(tmp, 2 * W, a20)
                    vstore(tmp, 2 * W + L, a21)
                    vstore(tmp, 3 * W, a30)
                    vstore(tmp, 3 * W + L, a31)
                    for r in range(r0, min(r0 + 4, nr)):
                        at = ob[b] + oq[i0 + r]
                        f = inv[r]
                        for e in range(top):
                            out[at + oe[e0 + e]] = tmp[(r - r0) * W + e] * f
                e0 += W
'''


def _source(dt: str, chain: Sequence[str], parallel: bool) -> str:
    """Module source of the kernel for ``dt`` with the score ``chain`` (lines turning ``x`` into
    ``x``, with the chain's scalars ``cs[k]`` in scope)."""
    suffix = "f32x8" if dt == "float32" else "f64x4"
    data = f"_t.Array(_t.{dt}, 1, 'C', readonly=True, aligned=False)"
    table = "_t.Array(_t.int64, 1, 'C', readonly=True)"
    i64 = "_t.int64"
    sig = ", ".join([data, table, table, i64,  # q
                     data, table, i64, i64,  # k
                     data, table, i64, table,  # v
                     table, table, "_t.Array(_t.boolean, 1, 'C', readonly=True)",  # mask rows
                     table, table, "_t.Array(_t.uint8, 1, 'C', readonly=True)", data,  # spans, scalars
                     f"_t.Array(_t.{dt}, 1, 'C')", table, table, table, i64,  # out
                     i64, i64, i64, i64, i64])
    chain_lines = ["                for u in range(un):", "                    x = sc[ua + u]"]
    chain_lines += ["                    " + line for line in chain]
    chain_lines.append("                    sc[ua + u] = x")
    body = _TEMPLATE.replace("LOOP", "prange" if parallel else "range")
    body = body.replace("CHAIN\n", "\n".join(chain_lines) + "\n" if chain else "")
    head = [f'"""Generated by runtime.kernels.attention v{VERSION}: fused attention, {dt}'
            f'{", parallel" if parallel else ""}."""',
            "import math", "import numpy as np", "from numba import njit, prange, uint64 as _u, types as _t",
            simd.ops_import(dt), vmath.IMPORT,
            f"from runtime.kernels.attention import vmax_{suffix} as vmax, hmax_{suffix} as hmax", "",
            f"DT = np.{dt}", f"L = {simd.lanes(dt)}", "",
            f"@njit(_t.void({sig}), cache=True, parallel={parallel}, error_model='numpy', nogil=True)"]
    return "\n".join(head + vmath.cpu_code(body.strip("\n").split("\n"))) + "\n"


class AttentionKernel:
    """The compiled kernel for one dtype and chain: a serial entry and a parallel twin."""

    def __init__(self, dt: str, chain: Sequence[str] = ()):
        self._dt, self._chain = dt, tuple(chain)
        configure_numba_cache()
        self.serial = load_generated(_source(dt, self._chain, False), "attention").kernel
        self._parallel = None

    def parallel(self):
        if self._parallel is None:
            self._parallel = load_generated(_source(self._dt, self._chain, True), "attention_par").kernel
        return self._parallel

    def warm(self) -> None:
        self.parallel()

    def __call__(self, args: Sequence, work: int, tasks: int) -> None:
        if work < PARALLEL_MIN_MACS or tasks < 2:
            self.serial(*args)
            return
        import numba

        before = numba.set_parallel_chunksize(max(1, tasks // DYNAMIC_CHUNKS))
        try:
            self.parallel()(*args)
        finally:
            numba.set_parallel_chunksize(before)


def flat(x: np.ndarray) -> tuple[np.ndarray, tuple[int, ...]]:
    """(a 1-D view of the memory ``x`` spans, ``x``'s element strides): copies only an array
    with a negative or unaligned stride."""
    item = x.itemsize
    if any(s < 0 or s % item for s in x.strides):
        x = np.ascontiguousarray(x)
    strides = tuple(s // item for s in x.strides)
    span = 1 + sum((n - 1) * s for n, s in zip(x.shape, strides)) if x.size else 1
    if x.size == 0:
        return np.zeros(1, x.dtype), strides
    view = np.lib.stride_tricks.as_strided(x, shape=(span,), strides=(item,), writeable=False)
    return view, strides


def table(extents: Sequence[int], strides: Sequence[int]) -> np.ndarray:
    """Element offsets of every index over axes of these extents and strides, row-major."""
    off = np.zeros(1, np.int64)
    for n, s in zip(extents, strides):
        off = (off[:, None] + np.arange(n, dtype=np.int64) * s).ravel()
    return off


_tables_lock = threading.Lock()


def cached(cache: dict, key, make):
    """``cache[key]``, made once (a few small tables per layout; bounded)."""
    got = cache.get(key)
    if got is None:
        got = make()
        with _tables_lock:
            if len(cache) > 64:
                cache.clear()
            cache[key] = got
    return got


def row_ceiling(nq: int) -> int:
    """Query rows per task: :data:`BLOCK_ROWS`, fewer for a short sequence."""
    return max(TILE_ROWS, min(BLOCK_ROWS, -(-nq // TILE_ROWS) * TILE_ROWS))


def scratch_bytes(nb: int, nq: int, nk: int, nd: int, ne: int, itemsize: int, threads: int) -> int:
    """What one call allocates besides its operands: the packed keys and values, and per
    running task its scores, query rows and spans."""
    lanes = simd.VECTOR_BYTES // itemsize
    w = 2 * lanes
    nkp, nep = nk + w, -(-ne // w) * w
    rows = row_ceiling(nq)
    per_task = rows * (nkp + nd + 1) * itemsize + rows * 25 + 4 * w * itemsize
    return (nb * nd * nkp + nb * nk * nep) * itemsize + threads * per_task


def threads() -> int:
    import numba

    return numba.get_num_threads()

