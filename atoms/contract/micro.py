"""Register-blocked GEMM tiles: for the skinny products of low-rank (LoRA-style) programs, and
a cache-blocked general GEMM for every other shape.

OpenBLAS handles a thin operand poorly, and on these machines its general kernels run
below the FMA rate of 64-byte vectors (docs/performance.md: ``choose_form``).
Three forms, each generated as a function of its own
(``tile_function``) that the contract kernel (``atoms.contract.render``) calls per row tile, each
computing the tile into the hot ``scratch`` the epilogue then reads:

- ``bcast``: ``MR x NR`` outer-product accumulators (6 rows x 2 vectors), the right operand
  packed in ``NR``-column panels (each ``[K, NR]``, contiguous; once per call, or once per
  value for a resident bank), the left operand's elements broadcast straight from its rows.
  For ``h · Bᵀ``, and for ``x · Aᵀ`` when the call has rows enough to pay for packing ``A``;
- ``dot`` (small N, long K): ``MR x NR`` dot products with vectors along K, for a left
  operand with unit K stride and a right operand with unit K stride: ``x · Aᵀ`` otherwise;
- ``blocked`` (the rest): ``bcast``'s register tile on ``WIDE_BYTES`` vectors, in blocks of
  ``KC`` along K: per block, the tile's left rows are packed in ``MR``-row strips, then
  each ``KC x NR`` panel slice (L1-resident) runs down every strip (L2-resident), adding into
  the tile's result. The right operand is packed in panels once per call, or once per
  resident bank value.

Every vector access stays inside a row of K or N elements.
"""
from __future__ import annotations

import textwrap
from typing import Any
import threading
import weakref

import numpy as np

from runtime.toolkit.cpu import Source, simd

# Where each form beats BLAS (measured on the seed's shapes; outside them BLAS is kept).
DOT_MAX_N, DOT_MIN_K = 64, 256
# bcast packs its right operand before the tiles (in parallel) unless it is a resident bank,
# packed once. The choice depends on shapes only, so that resident banks and banks passed per
# run give bitwise the same results (thresholds: docs/performance.md, tuning log).
BCAST_MAX_K, BCAST_MIN_N = 64, 256
BCAST_WIDE_MIN_ROWS = 256  # x·Aᵀ-like shapes (the dot region) on bcast from this many rows
DOT_MR, DOT_NR = 4, 2  # 8 accumulators + 2 + 1 registers of 16
BCAST_MR, BCAST_NV = 6, 2  # 12 accumulators, NR = 2 vectors
# blocked: MR x NV accumulators of WIDE_BYTES, K in slices of KC; from BLOCKED_MIN_ROWS rows,
# and N of a panel. 4 x 4 where AVX-512 gives 32 registers (4-row strips also fit the short
# tiles of 128-row calls whole); 6 x 2 fits AVX2's 16 (tuning log)
BLOCKED_MR, BLOCKED_NV = (4, 4) if simd.WIDE_BYTES == 64 else (6, 2)
# K slices: a panel slice (KC x NR) stays in L1, 32 KiB of every x86-64 L1d (48 KiB on recent
# ones): 128 for 4 x 4 vectors of 64 bytes in float32 or float64, 256 for AVX2's 6 x 2 (a 64 KiB
# slice ran the tile at 142 against 175-195 GFLOP/s on one core: bench/lab/blocked_tile_ab.py)
BLOCKED_SLICE_BYTES, BLOCKED_MAX_KC = 32 * 1024, 256
BLOCKED_PREFETCH = True  # prefetch the next panel slice during the current one's strips
# ... and the partial results of the strip this many rows ahead (from the second K slice on):
# a strip's first FMAs wait on its results, last stored a whole K slice earlier and by then
# out of L1 and L2 (bench/lab/blocked_tile_ab.py; 0: off)
BLOCKED_RESULTS_AHEAD = 16

# below these, BLAS is as fast or faster: packing costs about what the register tile saves
# (docs/performance.md: bench/lab/gemm_forms.py)
BLOCKED_MIN_N, BLOCKED_MIN_K = 256, 128
# bcast and blocked from 5 rows on (fewer call gemv per row, tiles.GEMV_ROWS), not from 32 and
# 12: OpenBLAS's gemm on Haswell or Zen computes an element in an order that depends on the
# call's rows, so a run's slices (chunks, dask blocks) differed from it by 1 ulp; a micro-kernel
# computes each row as in any tile
BCAST_MIN_ROWS = BLOCKED_MIN_ROWS = 5
# rows per tile at least: each panel slice is reused by TM / MR strips, and the packed right
# operand streams from L3 once per tile (4096x1024x4096 on one core: 172 GFLOP/s at 48 rows,
# 190 at 192; bench/lab/contract_layouts.py under monkeypatched values)
BLOCKED_MIN_TM = 192
BLOCKED_MIN_SPLIT = 24  # ... and at least this many when a call is split for more tiles
REMAINDER_MR = 4  # after bcast's full blocks, one block of 4 rows (8 accumulators: full rate)
# bcast: a block's left rows copied first into one buffer, interleaved (k-major), when the
# block then runs across at least this many panels: read straight from the rows, the six
# broadcasts' addresses become one chain of dependent adds in LLVM's code.
PACK_LEFT_MIN_PANELS = 16


def choose_form(nb: int, m: int, n: int, k: int, dt: str = "float32") -> str | None:
    """The form for ``[nb, m, k] x [nb, k, n]`` in ``dt`` (None: BLAS)."""
    if n <= DOT_MAX_N and k >= DOT_MIN_K:
        whole_panels = n % (BCAST_NV * bcast_lanes(dt)) == 0
        # bcast's 64-byte vectors (AVX-512) beat dot from 5 rows on (docs/performance.md, tuning
        # log: bench/lab/skinny_forms.py --region dot)
        rows = BCAST_MIN_ROWS if simd.WIDE_BYTES == 64 else BCAST_WIDE_MIN_ROWS
        return "bcast" if whole_panels and nb * m >= rows else "dot"
    if k <= BCAST_MAX_K and n >= BCAST_MIN_N and nb * m >= BCAST_MIN_ROWS:
        # AVX-512's blocked tile (4 x 4 registers of 64 bytes) is as fast as bcast's there or
        # faster; on AVX2 it was not faster, and bcast stays (docs/performance.md, tuning log:
        # bench/lab/skinny_forms.py). Both give the same bits.
        return "blocked" if simd.WIDE_BYTES == 64 else "bcast"
    if nb * m >= BLOCKED_MIN_ROWS and n >= max(BLOCKED_MIN_N, blocked_nr(dt)) and k >= BLOCKED_MIN_K:
        return "blocked"
    return None


def bcast_lanes(dt: str) -> int:
    """Lanes of a ``bcast`` vector: the widest at full rate (on AVX-512, x·Aᵀ at N = 32 is one
    panel of 2 x 16 lanes; docs/performance.md, tuning log)."""
    return simd.lanes(dt, wide=True)


def blocked_nr(dt: str) -> int:
    """Columns of a ``blocked`` panel."""
    return BLOCKED_NV * simd.lanes(dt, wide=True)


def blocked_kc(dt: str) -> int:
    """The ``blocked`` tile's K slice for ``dt`` (``BLOCKED_SLICE_BYTES``)."""
    return min(BLOCKED_MAX_KC, BLOCKED_SLICE_BYTES // (blocked_nr(dt) * (8 if dt == "float64" else 4)))


def panel_columns(form: str, dt: str) -> int:
    """Columns of a panel of the right operand packed for ``form`` (bcast or blocked)."""
    return blocked_nr(dt) if form == "blocked" else BCAST_NV * bcast_lanes(dt)


# rows (nb * m) at which choose_form's answer can change for a fixed N and K (plan_tiles asks
# it nothing below 5 rows: those tiles call gemv)
FORM_ROW_STEPS = (BLOCKED_MIN_ROWS, BCAST_MIN_ROWS, BCAST_WIDE_MIN_ROWS)


def packs_left(form: str | None, n: int, dt: str) -> bool:
    """Whether a ``form`` tile over ``n`` columns copies its left rows first (``PACK_LEFT_MIN_PANELS``)."""
    return form == "bcast" and n >= PACK_LEFT_MIN_PANELS * BCAST_NV * bcast_lanes(dt)


def rows_per_block(form: str) -> int:
    return {"dot": DOT_MR, "blocked": BLOCKED_MR}.get(form, BCAST_MR)


def whole_blocks(form: str | None, rows: int) -> int:
    """``rows`` rounded up to whole register blocks of ``form``, so that only a call's last
    tile has a row remainder."""
    block = rows_per_block(form) if form else 1
    return -(-rows // block) * block


def balanced_rows(form: str | None, rows: int, tiles: int) -> int:
    """Rows per tile for ``rows`` in ``tiles`` tiles of about equal size, for a micro-kernel
    rounded up to whole blocks or whole blocks and a block of ``REMAINDER_MR`` rows, which
    runs at the full rate (a lone row runs at a quarter of it): at T=256, tiles of 130 and
    126 rows rather than of 132 and 124; for ``blocked``, whole strips."""
    tm = -(-rows // max(1, tiles))
    if form:  # (blocked tiles pad their last strip instead: whole strips only)
        mr = rows_per_block(form)
        while tm % mr not in ((0,) if form == "blocked" else (0, REMAINDER_MR % mr)):
            tm += 1
    return tm


def usable(form: str, ta: int, tb: int) -> bool:
    """Whether ``form`` can read operands of these BLAS layouts (``bcast`` and ``blocked``
    read either)."""
    return form != "dot" or (ta == 0 and tb == 1)


def _dot_block(mr: int, nr: int, lanes: int) -> Source:
    R, V = range(mr), range(nr)
    src = Source().add([f"pa{r} = ab + (i + {r}) * lda" for r in R], [f"pb{v} = bb + (j + {v}) * ldb" for v in V])
    src.add([f"c{r}_{v} = vzero()" for r in R for v in V])
    with src.block(f"for kk in range(0, kv, {lanes}):"):
        src.add([f"b{v} = vload(bm, pb{v} + kk)" for v in V])
        for r in R:
            src.add(f"a{r} = vload(am, pa{r} + kk)", [f"c{r}_{v} = vfma(a{r}, b{v}, c{r}_{v})" for v in V])
    src.add([f"s{r}_{v} = vhsum(c{r}_{v})" for r in R for v in V])
    with src.block("for kk in range(kv, k):"):
        src.add([f"s{r}_{v} += am[pa{r} + kk] * bm[pb{v} + kk]" for r in R for v in V])
    return src.add([f"scratch[(i + {r}) * n + j + {v}] = s{r}_{v}" for r in R for v in V])


def _row_blocks(mr: int, rows_of) -> Source:
    """The tile's rows in blocks of ``mr`` (``rows_of(r)``: the lines for ``r`` rows from
    ``i``), then, when ``mr`` is larger, one block of ``REMAINDER_MR``, then row by row: a
    lone row has too few accumulators to hide the FMA latency and runs at a quarter of the
    rate. Each block is more code for LLVM to compile, so there are no blocks of 2:
    ``balanced_rows`` sizes tiles to need none."""
    src = Source()
    with src.block(f"while i + {mr} <= rows:"):
        src.add(rows_of(mr), f"i += {mr}")
    if mr > REMAINDER_MR:
        with src.block(f"if i + {REMAINDER_MR} <= rows:"):
            src.add(rows_of(REMAINDER_MR), f"i += {REMAINDER_MR}")
    with src.block("while i < rows:"):
        src.add(rows_of(1), "i += 1")
    return src


def _rows(mr: int, block, nr: int) -> Source:
    """Columns of ``mr`` rows: ``nr`` at a time, then one at a time."""
    src = Source().add("j = 0")
    with src.block(f"while j + {nr} <= n:"):
        src.add(block(mr, nr), f"j += {nr}")
    with src.block("while j < n:"):
        src.add(block(mr, 1), "j += 1")
    return src


def dot_tile(dt: str) -> Source:
    """``scratch[i, j] = sum_k A[i0 + i, k] B[k, j]`` for the tile's rows (ta=0, tb=1)."""
    lanes = simd.lanes(dt)

    def block(mr, nr):
        return _dot_block(mr, nr, lanes)
    src = Source().add("ab = bi * sab + i0 * lda", "bb = bi * sbb", f"kv = k - k % {lanes}", "i = 0")
    return src.add(_row_blocks(DOT_MR, lambda mr: _rows(mr, block, DOT_NR)))


def pack_source(dt: str, nr: int) -> Source:
    """The module's ``pack_right(bm, nb, k, n, sbb, ldb, tb, par)``: every right-operand
    batch ``q`` packed in panels of ``nr`` columns, ``bp[q][j0 // nr][k, j - j0]`` (the last
    panel zero-padded), so that a register block walks its panel's ``k * nr`` elements in
    order: a row-major ``[K, N]`` copy would make every step of K a jump of a whole row
    (4 KiB for the seed), which starved the FMAs. ``pack_right`` packs the panels in parallel,
    its twin ``pack_right_serial`` on the calling thread (every extent on one of the two); one module per
    dtype and panel width (:func:`pack_function`), so that a resident operand can be packed
    once, outside the kernel (``micro == 2``)."""
    # pt: prange may type t unsigned. tb: rows of B run along K, copied in 16x16 blocks, each
    # source row read in order (16 rows at once, ldb apart, thrash L1's sets)
    task = f"""
        pt = np.int64(t)
        q = pt // npan
        j0 = (pt - q * npan) * {nr}
        qb = np.uint64(q * sbb)
        pw = np.uint64(min(n, j0 + {nr}) - j0)
        pu = np.uint64(j0)
        pp = np.uint64(q * k * npan * {nr} + j0 * k)
        if tb:
            for kk0 in range(0, k, 16):
                kw = np.uint64(min(k, kk0 + 16) - kk0)
                for j in range(pw):
                    src = qb + (pu + j) * pld + np.uint64(kk0)
                    dst = pp + np.uint64(kk0 * {nr}) + j
                    for kk in range(kw):
                        bp[dst + kk * np.uint64({nr})] = bm[src + kk]
        else:
            for kk in range(np.uint64(k)):
                for j in range(pw):
                    bp[pp + kk * np.uint64({nr}) + j] = bm[qb + kk * pld + pu + j]"""
    src = Source()
    # twins, one taken per call (``par`` only keeps their arguments alike): a parallel function
    # costs about 2 µs a call even on a plain loop (see render); the ``_into`` pair writes a
    # buffer the caller keeps (``KeptBuffer``) instead of a new array
    for name, parallel, into in (("pack_right", True, False), ("pack_right_serial", False, False),
                                 ("pack_right_into", True, True), ("pack_right_into_serial", False, True)):
        src.add(f"@njit(cache=True, nogil=True, {'parallel=True, ' if parallel else ''}error_model='numpy')")
        with src.block(f"def {name}(bm, nb, k, n, sbb, ldb, tb, par{', bp' if into else ''}):"):
            # only the last panel of each batch has padding columns (np.zeros would be a parallel
            # loop even when par is 0); unsigned indices (pld): the copies vectorise
            src.add(f"""
                nbb = nb if sbb != 0 else 1
                npan = (n + {nr - 1}) // {nr}
                {'# (bp: the caller keeps it)' if into else f'bp = np.empty(nbb * k * npan * {nr}, np.{dt})'}
                if n % {nr} != 0:
                    for q in range(nbb):
                        for i in range((q * npan + npan - 1) * k * {nr}, (q + 1) * npan * k * {nr}):
                            bp[i] = 0
                pld = np.uint64(ldb)""")
            with src.block(f"for t in {'prange' if parallel else 'range'}(nbb * npan):"):
                src.add(task)
            src.add("return bp")
        src.add("", "")
    return src


def pack_function(dt: str, import_as: str = "pack_right", form: str = "bcast") -> str:
    """The import line of the shared ``pack_right`` of ``dt`` for ``form`` (:func:`pack_source`),
    of its serial twin as ``<import_as>_serial``, and of the pair that packs into a given
    buffer as ``<import_as>_into`` and ``<import_as>_into_serial``."""
    return f"from {pack_module(dt, form).__name__} import pack_right as {import_as}, " \
           f"pack_right_serial as {import_as}_serial, pack_right_into as {import_as}_into, " \
           f"pack_right_into_serial as {import_as}_into_serial"


def pack_module(dt: str, form: str = "bcast"):
    """The generated module holding ``pack_right`` for ``dt`` and ``form``'s panel width
    (compiled once, cached)."""
    from runtime.toolkit import configure_numba_cache, load_generated

    nr = panel_columns(form, dt)
    src = Source(f"Generated by atoms.contract.micro: the right-operand packing in panels of {nr}, {dt}.",
                 ["import numpy as np", "from numba import njit, prange"])
    src.add("", "", pack_source(dt, nr), "")  # (the blank last line keeps the module's cached name)
    configure_numba_cache()
    return load_generated(src.text(), "bcast_pack")


def _bcast_rows(mr: int, lanes: int, dt: str, pack_left: bool = False) -> Source:
    """``mr`` rows: every ``NR``-column block accumulates ``A[row, kk] * bp[kk, j:j + NR]``
    over K, broadcasting A's elements straight from the operand (either layout: ``ks`` is
    its K stride). Unsigned offsets keep Numba's negative-index wraparound out of the loop."""
    R, V = range(mr), range(BCAST_NV)
    nr = BCAST_NV * lanes
    packed = pack_left and mr > 1
    src = Source().add([f"pa{r} = np.uint64(ab + (i0 + i + {r}) * rs)" for r in R])
    if packed:  # the block's rows interleaved in apk: element (kk, r) at kk * mr + r
        with src.block("for kk in range(np.uint64(k)):"):
            src.add([f"apk[kk * np.uint64({mr}) + np.uint64({r})] = am[pa{r} + kk * ks]" for r in R])
    src.add("j = 0")
    with src.block(f"while j + {nr} <= n:"):
        src.add([f"c{r}_{v} = vzero()" for r in R for v in V], "pb = pq + j * k")
        if packed:
            src.add("pk = np.uint64(0)")
        with src.block("for kk in range(np.uint64(k)):"):
            src.add([f"b{v} = vload(bp, pb + {v * lanes})" for v in V])
            for r in R:
                a = f"apk[pk + np.uint64({r})]" if packed else f"am[pa{r} + kk * ks]"
                src.add(f"a{r} = vbcast({a})", [f"c{r}_{v} = vfma(a{r}, b{v}, c{r}_{v})" for v in V])
            src.add(f"pb += {nr}")
            if packed:
                src.add(f"pk += np.uint64({mr})")
        src.add([f"vstore(scratch, (i + {r}) * n + j + {v * lanes}, c{r}_{v})" for r in R for v in V])
        src.add(f"j += {nr}")
    with src.block("while j < n:"):
        src.add(f"pc = np.uint64(pq + (j - j % {nr}) * k + j % {nr})")
        for r in R:
            src.add(f"s{r} = np.{dt}(0)")
            with src.block("for kk in range(np.uint64(k)):"):
                src.add(f"s{r} += am[pa{r} + kk * ks] * bp[pc + kk * np.uint64({nr})]")
            src.add(f"scratch[(i + {r}) * n + j] = s{r}")
        src.add("j += 1")
    return src


def bcast_tile(dt: str, pack_left: bool = False) -> Source:
    """``scratch[i, j] = sum_k A[i0 + i, k] bp[k, j]`` for the tile's rows; ``pack_left``: each
    block's rows first copied into the kernel's ``apk`` (see ``PACK_LEFT_MIN_PANELS``)."""
    lanes = bcast_lanes(dt)
    src = Source().add("ab = bi * sab", "pq = (bi if sbb != 0 else 0) * k * npad",
                       "rs = 1 if ta else lda", "ks = np.uint64(lda if ta else 1)", "i = 0")
    return src.add(_row_blocks(BCAST_MR, lambda mr: _bcast_rows(mr, lanes, dt, pack_left)))


def blocked_tile(dt: str, mr: int = BLOCKED_MR, nv: int = BLOCKED_NV, kc: int | None = None,
                 lanes: int | None = None) -> Source:
    """``scratch[i, j] = sum_k A[i0 + i, k] bp[k, j]`` for the tile's rows and its columns
    ``j0 <= j < j0 + cols`` (``j0`` a whole panel's start), into a scratch of rows of whole
    panels (``bn`` columns: a register tile stores whole vectors), the tile's rows rounded up
    to whole strips (padding rows are zero). Every element is one chain of
    FMAs in K order, whichever tile and strip hold it: a slice of a run computes it alike.
    The shape parameters (``lanes``: of the vector operations in scope, by default the
    ``WIDE_BYTES`` ones) are the runtime's; bench/lab/blocked_tile_ab.py varies them."""
    lanes = lanes or simd.lanes(dt, wide=True)
    kc = kc or blocked_kc(dt)
    nr = nv * lanes
    R, V = range(mr), range(nv)
    u = "np.uint64"
    strip = Source()
    with strip.block("if kc0 == 0:"):
        strip.add([f"c{r}_{v} = vzero()" for r in R for v in V])
    with strip.block("else:"):
        strip.add([f"c{r}_{v} = vload(scratch, so + {u}({r}) * sn + {u}({v * lanes}))" for r in R for v in V])
    strip.add(f"pa = {u}(ib * kw)", f"pb = {u}(pbb)")
    with strip.block(f"for kk in range({u}(kw)):"):
        strip.add([f"b{v} = vload(m_bp, pb + {u}({v * lanes}))" for v in V])
        for r in R:
            strip.add(f"a{r} = vbcast(apk[pa + {u}({r})])", [f"c{r}_{v} = vfma(a{r}, b{v}, c{r}_{v})" for v in V])
        strip.add(f"pa += {u}({mr})", f"pb += {u}({nr})")
    strip.add([f"vstore(scratch, so + {u}({r}) * sn + {u}({v * lanes}), c{r}_{v})" for r in R for v in V])
    src = Source().add(f"bn = (n + {nr - 1}) // {nr} * {nr}", f"sn = {u}(bn)",
                       "pq = (bi if sbb != 0 else 0) * k * bn",  # this batch's panels (pack_right's layout)
                       f"rpad = (rows + {mr - 1}) // {mr} * {mr}",
                       f"jlo = j0 // {nr} * {nr}", f"jhi = min(bn, (j0 + cols + {nr - 1}) // {nr} * {nr})")
    with src.block(f"for kc0 in range(0, k, {kc}):"):
        # the strips: element (kk, r) of strip ib at ib * kw + kk * MR + r. With ta, K leads (a
        # weight gradient's gᵀ): copied along A's rows, which hold the tile's rows; read down a
        # column they were lda apart (one set of L1, a TLB miss each)
        # full strips copy their MR elements per step of K in one straight-line group (no test
        # per element: LLVM stores them as one interleaved group), the last partial strip padded
        whole = "\n".join(f"apk[dst + {u}({r})] = am[src + {u}(ib + {r})]" for r in R)
        rows_at = "\n".join(f"s{r} = {u}(bi * sab + (i0 + ib + {r}) * lda + kc0)" for r in R)
        interleave = "\n".join(f"apk[dst + kk * {u}({mr}) + {u}({r})] = am[s{r} + kk]" for r in R)
        src.add(f"""
            kw = min({kc}, k - kc0)
            full = rows // {mr} * {mr}
            if ta:
                for kk in range({u}(kw)):
                    src = {u}(bi * sab + (kc0 + kk) * lda + i0)
                    for ib in range(0, full, {mr}):
                        dst = {u}(ib * kw) + kk * {u}({mr})
{textwrap.indent(whole, ' ' * 24)}
                    for ib in range(full, rpad, {mr}):
                        dst = {u}(ib * kw) + kk * {u}({mr})
                        for r in range({mr}):
                            if ib + r < rows:
                                apk[dst + {u}(r)] = am[src + {u}(ib + r)]
                            else:
                                apk[dst + {u}(r)] = 0
            else:
                for ib in range(0, full, {mr}):
                    dst = {u}(ib * kw)
{textwrap.indent(rows_at, ' ' * 20)}
                    for kk in range({u}(kw)):
{textwrap.indent(interleave, ' ' * 24)}
                for ib in range(full, rpad, {mr}):
                    for r in range({mr}):
                        dst = {u}(ib * kw + r)
                        if ib + r < rows:
                            src = {u}(bi * sab + (i0 + ib + r) * lda + kc0)
                            for kk in range({u}(kw)):
                                apk[dst + kk * {u}({mr})] = am[src + kk]
                        else:
                            for kk in range({u}(kw)):
                                apk[dst + kk * {u}({mr})] = 0""")
        with src.block(f"for jp in range(jlo, jhi, {nr}):"):
            src.add(f"pbb = pq + jp * k + kc0 * {nr}")
            if BLOCKED_PREFETCH:
                # the next panel's slice (or the first panel's next slice), a share per strip:
                # a new slice's first strip otherwise waits on L3 for each of its lines
                src.add(f"""
                    nxt = pbb + {nr} * k if jp + {nr} < jhi else (pq + jlo * k + (kc0 + kw) * {nr} if kc0 + kw < k else -1)
                    plen = kw * {nr} if nxt >= 0 else 0
                    pstep = ((plen + 15) // 16 * {mr} + rpad - 1) // rpad * 16
                    pp = nxt""")
            with src.block(f"for ib in range(0, rpad, {mr}):"):
                if BLOCKED_PREFETCH:
                    src.add("pe = min(pp + pstep, nxt + plen)")
                    with src.block("for q in range(pp, pe, 16):"):
                        src.add("vprefetch(m_bp, q)")
                    src.add("pp = pe")
                src.add(f"so = {u}(ib * bn + jp)")
                if BLOCKED_PREFETCH and BLOCKED_RESULTS_AHEAD:
                    ahead = BLOCKED_RESULTS_AHEAD
                    with src.block(f"if kc0 > 0 and ib + {ahead} < rpad:"):
                        src.add([f"vprefetch(scratch, so + {u}({ahead + r}) * sn + {u}({v * lanes}))"
                                 for r in R for v in V])
                src.add(strip)
    return src


# The tiles' parameters: they are functions of their own (tile_function), so their locals
# need no names apart from the kernel's
TILE_PARAMS = {"bcast": "am, bp, scratch, apk, bi, sab, sbb, ta, lda, npad, i0, rows, n, k",
               "dot": "am, bm, scratch, bi, sab, sbb, lda, ldb, i0, rows, n, k"}
# what the contract kernel's worker passes them (its packed right operand is ``m_bp``, its
# panel width ``m_npad``)
TILE_ARGS = {"bcast": "am, m_bp, scratch, apk, bi, sab, sbb, ta, lda, m_npad, i0, rows, n, k",
             "dot": TILE_PARAMS["dot"]}
# blocked: a C function (see tile_function), called with its arrays' addresses and sizes
BLOCKED_ARGS = ("np.int64(am.ctypes.data), np.int64(m_bp.ctypes.data), np.int64(scratch.ctypes.data), "
                "np.int64(apk.ctypes.data), am.size, m_bp.size, scratch.size, apk.size, "
                "bi, sab, sbb, ta, lda, i0, rows, n, k, j0, cols")


def tile_function(form: str, dt: str, pack_left: bool = False, import_as: str = "_tile") -> str:
    """The import line of ``form``'s tile as a function of its own, ``_tile(<TILE_PARAMS>)``
    (``apk``: any array of the dtype when unused). One module per form, dtype and packing,
    shared by every contract kernel that uses it, so each is compiled once and cached: inlined
    into each kernel, it made every kernel's compilation longer. The ``blocked`` tile, the
    largest, is a C function (``cfunc``) each kernel calls through its symbol, as it calls
    BLAS (``BLOCKED_ARGS``): linked as a function, LLVM optimised it again inside every
    kernel, seconds each."""
    from runtime.toolkit import configure_numba_cache, load_generated

    if form == "blocked":
        return _blocked_function(dt, import_as)
    what = f"{form} {dt}" + (" packed left" if pack_left else "")
    src = Source(f"Generated by atoms.contract.micro: the {what} micro-kernel tile.",
                 ["import numpy as np", "from numba import njit", simd.ops_import(dt, wide=form == "bcast")])
    src.add("", "", "@njit(cache=True, nogil=True, error_model='numpy')")
    with src.block(f"def tile({TILE_PARAMS[form]}):"):
        src.add(dot_tile(dt) if form == "dot" else bcast_tile(dt, pack_left))
    configure_numba_cache()
    module = load_generated(src.text(), f"{form}_tile")
    return f"from {module.__name__} import tile as {import_as}"


def _blocked_function(dt: str, import_as: str) -> str:
    """The import line of the ``blocked`` tile of ``dt``: a ``cfunc`` registered under a symbol
    named after its module (so after its source), and the ``ExternalFunction`` that calls it."""
    from runtime.toolkit import configure_numba_cache, load_generated

    nargs = len(BLOCKED_ARGS.split(", "))  # 4 array addresses, then int64s
    ints = ", ".join(["_t.int64"] * (nargs - 4))
    src = Source(f"Generated by atoms.contract.micro: the blocked {dt} micro-kernel tile, a C function.",
                 ["import llvmlite.binding as _ll", "import numpy as np", "from numba import carray, cfunc, types as _t",
                  simd.ops_import(dt, wide=True), "from runtime.kernels.simd import prefetch as vprefetch"])
    src.add("", f"_P = _t.CPointer(_t.{dt})", "", "",
            f"@cfunc(_t.void(_P, _P, _P, _P, {ints}), cache=True, nopython=True, error_model='numpy')")
    with src.block("def tile_c(p_am, p_bp, p_scr, p_apk, n_am, n_bp, n_scr, n_apk, bi, sab, sbb, ta, lda, i0, rows, n, k, "
                   "j0, cols):"):
        src.add("am = carray(p_am, (n_am,))", "m_bp = carray(p_bp, (n_bp,))",
                "scratch = carray(p_scr, (n_scr,))", "apk = carray(p_apk, (n_apk,))", blocked_tile(dt))
    src.add("", "", 'SYMBOL = "formula_" + __name__.replace(".", "_")', "_ll.add_symbol(SYMBOL, tile_c.address)",
            f"tile = _t.ExternalFunction(SYMBOL, _t.void(*[_t.int64] * {nargs}))")
    configure_numba_cache()
    module = load_generated(src.text(), "blocked_tile")
    return f"from {module.__name__} import tile as {import_as}"


# a right operand of at least this many bytes packed is packed, in every call, into a buffer
# its kernel keeps per thread (``KeptBuffer``, the kernel's ``micro == 3``): a new array that
# size is fresh pages in every call, a 64 MiB pack 14.5 ms against 2.5 into a kept buffer
# (bench/lab/pack_buffers.py)
KEPT_PACK_BYTES = 32 << 20


class KeptBuffer:
    """A buffer of ``size`` elements of ``dt`` per calling thread, which a contraction kernel
    packs its right operand into in every call (``buffer(value)``, ``value`` unused: the
    runner's derived-argument form). A thread runs one kernel at a time, so every kernel of
    every plan shares the thread's one buffer per dtype (the largest asked for): a new extent's
    plan finds its pages already touched, where a buffer of its own faulted them in."""

    _local = threading.local()

    def __init__(self, size: int, dt: str):
        self._size, self._dt = size, dt

    def __call__(self, value: Any = None) -> np.ndarray:
        buffers = getattr(self._local, "buffers", None)
        if buffers is None:
            buffers = self._local.buffers = {}
        buffer = buffers.get(self._dt)
        if buffer is None or buffer.size < self._size:
            buffer = buffers[self._dt] = np.empty(self._size, self._dt)
        return buffer[:self._size]


class ResidentPacks:
    """The ``bcast`` form's packed right operand, made once per resident bank value (a
    runtime-owned array that never changes while it lives) instead of once per call:
    ``packs(value)``. Entries go when their value does. ``pack_right``: the generated
    module's (:func:`pack_source`); ``layout``: the operand's (trans, ld, batch stride).
    :meth:`shared` gives every kernel packing alike the same instance: the plans of other
    extents find the bank packed."""

    _shared: weakref.WeakValueDictionary = weakref.WeakValueDictionary()
    _shared_lock = threading.Lock()

    def __init__(self, pack_right, nb: int, k: int, n: int, layout: tuple[int, int, int], par: int = 1):
        tb, ldb, sbb = layout
        self._pack = lambda value: pack_right(value.reshape(-1), nb, k, n, sbb, ldb, tb, par)
        self._packed: dict[int, tuple[weakref.ref, np.ndarray]] = {}
        self._lock = threading.Lock()

    @classmethod
    def shared(cls, packer: tuple[str, str], pack_right, nb: int, k: int, n: int, layout: tuple[int, int, int],
               par: int = 1) -> "ResidentPacks":
        """The instance of every kernel whose ``packer`` (dtype, form) packs a [nb, k, n] operand
        of this layout: the packed panels do not depend on the call's rows, nor on ``par`` (how
        many threads pack them)."""
        key = (*packer, nb, k, n, tuple(layout))
        with cls._shared_lock:
            packs = cls._shared.get(key)
            if packs is None:
                packs = cls._shared[key] = cls(pack_right, nb, k, n, layout, par)
        return packs

    def __call__(self, value: np.ndarray) -> np.ndarray:
        key = id(value)
        entry = self._packed.get(key)  # (an atomic read: the lock guards the writes)
        if entry is None or entry[0]() is not value:
            entry = (weakref.ref(value, lambda _, key=key: self._forget(key)), self._pack(value))
            with self._lock:
                self._packed[key] = entry
        return entry[1]

    def _forget(self, key: int) -> None:
        with self._lock:
            entry = self._packed.get(key)
            if entry is not None and entry[0]() is None:
                del self._packed[key]
