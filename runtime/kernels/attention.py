"""The fused attention kernel for the CPU: ``softmax_mask(chain(q·kᵀ))·v`` in one streaming pass
per (batch, block of query rows), the [rows, keys] scores never written to memory whole.

Layout-free: every operand is read through element-offset tables (one per group of axes:
batch, query rows, values) and two strides (key, head), so any axis order and any stride
takes the same compiled kernel; the per-call work in Python is the tables and the spans.
The keys are packed once per call, transposed ([batch, head, key], zero-padded) so that a
register tile of 4 query rows × 2 or 4 vectors of keys runs on broadcast-FMA; the values are
packed [batch, key, value] for the same tile of p·v. Asked to, the kernel counts the NaN and
±inf of q, k and v (it reads each in full) with the vector scan of what it packed.

Each query row's visible span [lo, hi) comes from its mask row (computed once per distinct
mask row, so a mask broadcast over batch and heads costs one pass over its own size): scores
are computed only inside the union of a tile's spans, entries of a row outside its span or
masked inside it weigh 0, and a row with no visible entry gives zeros (SPEC §3
masked-softmax). Every score is one dot product summed over the head dim in order, and
every output element one sum over the keys in order, whatever the tile a row falls in: a
slice of the rows computes each row exactly as the whole run does.

Extent-generic: extents are arguments of one explicitly typed entry per (dtype, chain), so a
new sequence length compiles nothing; a parallel twin (``prange`` over workers that take
batch × query blocks from a shared ticket as they come free: a causal mask's blocks differ,
and a worker on a busy core takes fewer) is built on first need or by
:meth:`AttentionKernel.warm`.
"""
from __future__ import annotations

import threading
from collections.abc import Sequence
from pathlib import Path

import numpy as np
from numba import njit, types
from numba.extending import intrinsic

from runtime.core import settings
from runtime.kernels import simd, vmath
from runtime.kernels.atomic import WORKERS
from runtime.kernels.layout import span_view
from runtime.kernels.codegen import Source, configure_numba_cache, load_generated, source_stamp

# Below this many multiply-adds (rows × visible keys × head dim, as if unmasked) a call runs
# on one thread: a parallel region costs more than it saves. FORMULA_ATTENTION_PARALLEL_MIN
# overrides it.
PARALLEL_MIN_MACS = settings.ATTENTION_PARALLEL_MIN.read()
BLOCK_ROWS = 32  # query rows per task: keys packed in cache are reused by this many rows
TILE_ROWS = 4  # rows of a register tile


# vectors of keys (values) per register tile of scores (outputs): 4 rows × 4 vectors is 16
# accumulators, which fit AVX-512's 32 registers (they serve 32-byte vectors too) and halve
# the loads per multiply-add of 4 × 2, the most that 16 registers hold
QK_VECTORS = PV_VECTORS = 4 if simd.avx512() else 2
# in the header of generated sources: a digest of this file and of atomic.py, whose helpers
# they call (simd and vmath stamp their own import lines)
STAMP = source_stamp(__file__, Path(__file__).with_name("atomic.py"))


def _define_max(dtype):
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
            return simd.lane_reduce(builder, args[0], lanes,
                                    lambda lo, hi: builder.select(builder.fcmp_ordered(">", hi, lo), hi, lo))
        return dtype(v), codegen

    return vmax, hmax


# (module globals: generated kernels import them by these names)
vmax_f32x8, hmax_f32x8 = _define_max(types.float32)
vmax_f64x4, hmax_f64x4 = _define_max(types.float64)


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


def _kernel(parallel: bool, chain: Sequence[str]) -> Source:
    """The kernel's source: the score ``chain`` (lines turning ``x`` into ``x``) inlined where
    the scores of a row are complete, the register tiles of :data:`QK_VECTORS` and
    :data:`PV_VECTORS` vectors, ``prange`` where ``parallel``; the rest is the same text."""
    loop, nwork = ("prange", WORKERS) if parallel else ("range", 1)
    src = Source()
    src.add(f'''
        def kernel(qf, qb, qi, qsd, kf, kb, ksj, ksd, vf, vb, vsj, ve, mrb, mrq, mk, slo, shi, sdense, cs,
                   out, ob, oq, oe, ec, nq, nk, nd, ne, bq, count_q, count_k, count_v):
            nb = qb.shape[0]
            nkp = nk + WK
            nep = ((ne + WE - 1) // WE) * WE
            kt = np.empty(max(nb * nd * nkp, 1), DT)
            vp = np.empty(max(nb * nk * nep, 1), DT)
            packed_bad = 0
            for b in {loop}(nb):
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
                bad = (count_k and _nonfinite(kt, base, base + nd * nkp) != 0) or \\
                    (count_v and _nonfinite(vp, vbase, vbase + nk * nep) != 0)
                packed_bad += 1 if bad else 0
            nqb = (nq + bq - 1) // bq
            rows_bad = 0
            ticket = np.zeros(1, np.int64)
            for w in {loop}({nwork}):
                while _left(ticket, nb * nqb):
                    t = _take(ticket)
                    if t >= nb * nqb:
                        break
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
                    tmp = np.empty(4 * WE, DT)
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
                    rows_bad += 1 if count_q and _nonfinite(qk, 0, nr * nd) != 0 else 0
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
        ''')
    with src.indented(4):  # in the loop over the quads of rows (r0)
        src.add(_qk_tile(QK_VECTORS))
        src.add('''
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
            ''')
        with src.indented():  # in the loop over the quad's rows (r)
            if chain:
                with src.block("for u in range(un):"):
                    src.add("x = sc[ua + u]", list(chain), "sc[ua + u] = x")
            src.add('''
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
                        sc[ua + u] = _vexp(sc[ua + u] - mx)
                else:
                    mrow = _u(mrs[r] * nk + lo)
                    mx = sc[at]
                    for u in range(un):
                        x = sc[ua + u]
                        if mk[mrow + u] and x > mx:
                            mx = x
                    for u in range(un):
                        x = _vexp(sc[ua + u] - mx)
                        sc[ua + u] = x if mk[mrow + u] else 0.0
                one = vbcast(1.0)
                a00 = vzero()
                a01 = vzero()
                j = 0
                while j + 2 * L <= ni:
                    a00 = vfma(vload(sc, at + j), one, a00)
                    a01 = vfma(vload(sc, at + j + L), one, a01)
                    j += 2 * L
                tot = 0.0 + vhsum(a00) + vhsum(a01)
                while j < ni:
                    tot += sc[at + j]
                    j += 1
                inv[r] = 1.0 / tot
                ''')
        src.add(_pv_tile(PV_VECTORS))
    src.add("    return packed_bad + rows_bad")
    return src


def _tile_accumulators(nv: int) -> list[str]:
    return [f"a{r}{c} = vzero()" for r in range(TILE_ROWS) for c in range(nv)]


def _fma_rows(row_value: str, vector: str, nv: int) -> list[str]:
    """Each tile row's accumulators += its broadcast ``row_value`` (``{r}``: the row) times the
    ``nv`` loaded vectors ``vector0..``."""
    lines = []
    for r in range(TILE_ROWS):
        lines.append(f"x = vbcast({row_value.format(r=r)})")
        lines += [f"a{r}{c} = vfma(x, {vector}{c}, a{r}{c})" for c in range(nv)]
    return lines


def _qk_tile(nv: int) -> Source:
    """Scores of 4 query rows × ``nv`` vectors of keys per step, over the quad's key range."""
    src = Source().add("q0 = r0 * nd", "j = jlo")
    with src.block("while j < jhi:"):
        src.add(_tile_accumulators(nv), "p = ktb + j")
        with src.block("for d in range(nd):"):
            src.add([f"k{c} = vload(kt, p + {c} * L)" for c in range(nv)])
            src.add(_fma_rows("qk[q0 + {r} * nd + d]", "k", nv), "p += nkp")
        src.add("s0 = r0 * nkp + j")
        src.add([f"vstore(sc, s0 + {r} * nkp + {c} * L, a{r}{c})" for r in range(TILE_ROWS) for c in range(nv)])
        src.add("j += WK")
    return src


def _pv_tile(nv: int) -> Source:
    """Outputs of 4 query rows × ``nv`` vectors of values per step, summed over the quad's keys,
    scaled by each row's 1/sum and stored (whole vectors where the value axes are contiguous)."""
    src = Source().add("p0 = r0 * nkp", "e0 = 0")
    with src.block("while e0 < nep:"):
        src.add(_tile_accumulators(nv), "pv = vbase + jlo * nep + e0")
        with src.block("for j in range(jlo, jhi):"):
            src.add([f"v{c} = vload(vp, pv + {c} * L)" for c in range(nv)])
            src.add(_fma_rows("sc[p0 + {r} * nkp + j]", "v", nv), "pv += nep")
        src.add("top = min(WE, ne - e0)")
        with src.block("if ec and top == WE:"):
            src.add("z = vzero()")
            for r in range(TILE_ROWS):
                with src.block(f"if r0 + {r} < nr:"):
                    src.add(f"at = ob[b] + oq[i0 + r0 + {r}] + e0", f"f = vbcast(inv[r0 + {r}])")
                    src.add([f"vstore(out, at + {c} * L, vfma(a{r}{c}, f, z))" for c in range(nv)])
        with src.block("else:"):
            src.add([f"vstore(tmp, {r} * WE + {c} * L, a{r}{c})" for r in range(TILE_ROWS) for c in range(nv)])
            src.add("""
                for r in range(r0, min(r0 + 4, nr)):
                    at = ob[b] + oq[i0 + r]
                    f = inv[r]
                    for e in range(top):
                        out[at + oe[e0 + e]] = tmp[(r - r0) * WE + e] * f
                """)
        src.add("e0 += WE")
    return src


def _call(scalars: int) -> Source:
    """How compiled code calls the kernel (runtime.execution.driver): the mask's spans and the
    chain's ``scalars`` scalars (one-element arrays, last) worked out from the run's values,
    as the Python launch does before it."""
    given = "".join(f", e{k}" for k in range(scalars))
    src = Source().add("", "@njit(cache=True, nogil=True)")
    with src.block("def call(qf, qb, qi, qsd, kf, kb, ksj, ksd, vf, vb, vsj, ve, mrb, mrq, mk, nkm, out, ob, oq, oe, "
                   f"ec, nq, nk, nd,\n         ne, bq, count_q, count_k, count_v{given}):"):
        src.add("slo, shi, sdense = _spans(mk.reshape((mk.size // nkm, nkm)))",
                f"cs = np.zeros({max(1, scalars)}, DT)", [f"cs[{k}] = e{k}[0]" for k in range(scalars)])
        src.add("""
            return kernel(qf, qb, qi, qsd, kf, kb, ksj, ksd, vf, vb, vsj, ve, mrb, mrq, mk, slo, shi, sdense, cs, out,
                          ob, oq, oe, ec, nq, nk, nd, ne, bq, count_q != 0, count_k != 0, count_v != 0)
            """)
    return src


def _source(dt: str, chain: Sequence[str], parallel: bool, scalars: int = 0) -> str:
    """Module source of the kernel for ``dt`` with the score ``chain`` (lines turning ``x`` into
    ``x``, with the chain's ``scalars`` scalars ``cs[k]`` in scope), and of ``call``, its entry
    for compiled callers (the scalars as one-element arrays, last)."""
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
                     i64, i64, i64, i64, i64, "_t.boolean", "_t.boolean", "_t.boolean"])
    src = Source(f"Generated by runtime.kernels.attention {STAMP}: fused attention, {dt}"
                 f"{', parallel' if parallel else ''}.",
                 ["import math", "import numpy as np", "from numba import njit, prange, uint64 as _u, types as _t",
                  "from runtime.kernels.atomic import left as _left, take as _take",
                  simd.ops_import(dt), simd.scan_import(dt), vmath.IMPORT,
                  f"from runtime.kernels.attention import vmax_{suffix} as vmax, hmax_{suffix} as hmax, "
                  "spans as _spans"])
    src.add("", f"DT = np.{dt}", f"L = {simd.lanes(dt)}", f"WK = {QK_VECTORS * simd.lanes(dt)}",
            f"WE = {PV_VECTORS * simd.lanes(dt)}", "",
            f"@njit(_t.int64({sig}), cache=True, parallel={parallel}, error_model='numpy', nogil=True)")
    src.add(_kernel(parallel, chain), _call(scalars))
    return "\n".join(vmath.with_imports(src.module_lines())) + "\n"


_kernels: dict[tuple, "AttentionKernel"] = {}
_kernels_lock = threading.Lock()


def attention_kernel(dt: str, chain: Sequence[str] = (), scalars: int = 0) -> "AttentionKernel":
    """The process's one :class:`AttentionKernel` of ``dt``, ``chain`` and ``scalars``: a plan
    at a new extent takes the modules the last one loaded (its source is the same text, and
    rendering it again cost a new extent's first run 0.6 ms)."""
    key = (dt, tuple(chain), scalars)
    kernel = _kernels.get(key)
    if kernel is None:
        with _kernels_lock:
            kernel = _kernels.get(key)
            if kernel is None:
                kernel = _kernels[key] = AttentionKernel(dt, chain, scalars)
    return kernel


class AttentionKernel:
    """The compiled kernel for one dtype and chain (of ``scalars`` scalars): a serial entry and
    a parallel twin, each with its ``call`` for compiled callers."""

    def __init__(self, dt: str, chain: Sequence[str] = (), scalars: int = 0):
        self._dt, self._chain, self._scalars = dt, tuple(chain), scalars
        configure_numba_cache()
        self.serial_module = load_generated(_source(dt, self._chain, False, scalars), "attention")
        self.serial = self.serial_module.kernel
        self._parallel = None

    def parallel_module(self):
        if self._parallel is None:
            self._parallel = load_generated(_source(self._dt, self._chain, True, self._scalars), "attention_par")
        return self._parallel

    def parallel(self):
        return self.parallel_module().kernel

    def warm(self) -> None:
        self.parallel()

    @staticmethod
    def is_parallel(work: int, tasks: int) -> bool:
        return work >= PARALLEL_MIN_MACS and tasks >= 2

    def __call__(self, args: Sequence, work: int, tasks: int) -> int:
        """Run; returns how many batches or row blocks met a NaN or ±inf in the operands it
        was asked to count (``count_q``, ``count_k``, ``count_v``, the last arguments)."""
        return (self.parallel() if self.is_parallel(work, tasks) else self.serial)(*args)


def flat(x: np.ndarray) -> tuple[np.ndarray, tuple[int, ...]]:
    """(a 1-D view of the memory ``x`` spans, ``x``'s element strides): copies only an array
    with a negative or unaligned stride."""
    item = x.itemsize
    if any(s < 0 or s % item for s in x.strides):
        x = np.ascontiguousarray(x)
    strides = tuple(s // item for s in x.strides)
    if x.size == 0:
        return np.zeros(1, x.dtype), strides
    return span_view(x), strides


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
    wk, we = QK_VECTORS * lanes, PV_VECTORS * lanes
    nkp, nep = nk + wk, -(-ne // we) * we
    rows = row_ceiling(nq)
    per_task = rows * (nkp + nd + 1) * itemsize + rows * 25 + TILE_ROWS * we * itemsize
    return (nb * nd * nkp + nb * nk * nep) * itemsize + threads * per_task


def threads() -> int:
    import numba

    return numba.get_num_threads()

