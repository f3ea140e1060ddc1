"""Tile planning of the CPU contraction: which micro-kernel form a call takes (``micro``) and
how it is cut into row tiles for the workers; decisions only, no kernel compiled. The plan
reaches the one compiled kernel of a dtype and layout (``render``) as run-time ints.
"""
from __future__ import annotations

import math
from collections.abc import Sequence

import attrs
import numpy as np

from runtime.core import settings
from runtime.core.types import TensorType

from . import micro
from .lowering import Lowering

# Row tiles: the GEMM result of one tile ([tm, n], acc dtype) stays cache-resident while the
# epilogue reads it (docs/performance.md, tuning log).
SCRATCH_BYTES = settings.CONTRACT_SCRATCH.read()
# Below this many multiply-adds a call runs on one thread (a parallel region costs ~10 µs+).
PARALLEL_MIN_MACS = settings.CONTRACT_PARALLEL_MIN.read()
# Workers take tiles dynamically, but more BLAS tiles per thread only shrink the tiles: each
# BLAS call packs the whole right operand again. Blocked tiles share one packed right operand:
# two per thread let a worker on a busy core take fewer (noisy neighbour; more cost speed on
# an idle machine: docs/performance.md, tuning log).
TILES_PER_THREAD = 1
BLOCKED_TILES_PER_THREAD = settings.CONTRACT_BLOCKED_TILES.read()
SCAN_TILE_BYTES = 512 * 1024  # a left-operand tile scanned for finiteness: half of L2
# Every BLAS call packs the whole right operand: over a right operand larger than cache, row
# tiles as small as the scratch above would re-pack it every few rows, so there tiles get at
# least PACK_ROWS rows, their result up to WIDE_SCRATCH_BYTES per worker (0 rows: off;
# docs/performance.md, tuning log).
PACK_ROWS = settings.CONTRACT_PACK_ROWS.read()
PACKED_RIGHT_BYTES = 1 << 20
WIDE_SCRATCH_BYTES = 16 << 20
GEMV_ROWS = 4  # tiles of at most this many rows call gemv per row (no packing of B)


# ints[I_FORM] (``render``): the micro-kernel tiles used when ``micro`` is set (none: BLAS only)
FORM_IDS = {None: 0, "dot": 1, "bcast": 2, "bcast packed left": 3, "blocked": 4}
ALL_FORMS = frozenset(FORM_IDS.values())


# a batched weight gradient (K-leading left operand) of at most this many rows per batch
# takes BLAS: the blocked tiles pack each batch's whole right operand for a few rows
# (attention's dV = dOᵀ·P per head, 64 rows: 1.74 -> 1.57 ms at S=512, 52 -> 24 ms at S=2048;
# docs/performance.md, tuning log). An unbatched one of few rows keeps the blocked tiles,
# which split its columns across threads (BLOCKED_COLUMN_COLS): the seed's dA at T=8192,
# 32 x 1024 x 8192, 6.0-6.4 ms against BLAS's 11.0-12.5 (tuning log, WGRAD_BLAS_RIGHT)
BATCHED_WGRAD_BLAS_ROWS = 64

# a BLAS weight gradient (K-leading left operand) of at most this many rows makes one row tile:
# its columns are cut across threads instead (WGRAD_SPLIT_COLS)
WGRAD_BLAS_ROWS = 32

# a K-leading left operand over a narrow right one (dot's region, which dot cannot read) takes
# BLAS from this K on: bcast's column reads cost more than BLAS's packing (docs/performance.md,
# tuning log: the seed's dB at T=256, K=256, stays faster on bcast)
WGRAD_BLAS_MIN_K = 512

# a BLAS weight gradient of so few rows that they make one row tile is cut along N, a tile
# per thread of at least this many columns (a multiple of every vector width): row tiles alone
# left the seed's dA at T=8192 (32 rows) with each thread re-reading the whole 32 MiB of x
# for 16 rows of it (docs/performance.md, tuning log)
WGRAD_SPLIT_COLS = 128

# a blocked product of fewer rows than BLOCKED_COLUMN_ROWS per thread, over at least
# BLOCKED_COLUMN_COLS columns per thread, is cut along N instead, each thread all the rows and
# a share of the panels: a thread's tile then reuses each panel slice over twice the strips and
# reads half the packed right operand (the block's x·W1 at 128 rows, K=512, N=2048: 201 against
# 181 GFLOP/s a core in bench/lab/blocked_tile_ab.py, 0.84 against 0.88 ms in the block). Few
# rows gain most: split by rows, 16 or 32 rows make 4 or 8 strips a panel slice; the seed's dA
# at T=256 (32 x 256 x 1024) 0.148 -> 0.073 ms at 256 columns against 1024 (docs/performance.md,
# tuning log: bench/lab/kleading_forms.py)
BLOCKED_COLUMN_ROWS, BLOCKED_COLUMN_COLS = 128, 256


def form_for(nb: int, m: int, n: int, k: int, dt: str, dot_ok: bool = True, left_k_leading: bool = False) -> str | None:
    """``micro.choose_form``, with ``bcast`` (which reads either layout) where ``dot`` cannot
    read the operands' layout (``dot_ok`` False): BLAS in its place computes an element in an
    order that depends on the call's rows on some CPUs (OpenBLAS's Haswell and Zen gemm), so
    a chunked run's slices differed from its whole run (x's gradient of the seed, on AVX2).
    ``left_k_leading``: the left operand is [K, M] (a weight gradient gᵀ·x, whose rows are
    weight axes that no chunked run slices): BLAS where the micro-kernels read it poorly,
    ``WGRAD_BLAS_ROWS``, ``BATCHED_WGRAD_BLAS_ROWS`` and ``WGRAD_BLAS_MIN_K``."""
    form = micro.choose_form(nb, m, n, k, dt)
    if form == "blocked" and left_k_leading and nb > 1 and m <= BATCHED_WGRAD_BLAS_ROWS:
        return None
    if form in ("dot", "bcast") and left_k_leading and n <= micro.DOT_MAX_N and k >= WGRAD_BLAS_MIN_K:
        # a narrow product over a long K (dot's region, which dot cannot read with this left
        # operand): bcast reads the K-leading left operand down its columns, a cache line per
        # step; BLAS packs it (attention's dV at S=512, 3.3 -> 1.1 ms; the seed's dB at
        # T=8192, 3.3 -> 2.6 ms)
        return None
    return "bcast" if form == "dot" and not dot_ok else form


def kernel_forms(n: int | None, k: int | None, dt: str, dot_ok: bool = True,
                 left_k_leading: bool = False) -> frozenset[int]:
    """The ``FORM_IDS`` that plans with N = ``n`` and K = ``k`` can ask for, whatever their M
    and batch (None: that extent varies between runs, so every form). A kernel links only
    these tiles: each one it links adds seconds to its compilation."""
    if n is None or k is None:
        return ALL_FORMS
    forms = {form_for(1, rows, n, k, dt, dot_ok, left_k_leading) for rows in micro.FORM_ROW_STEPS}
    return frozenset(FORM_IDS["bcast packed left" if micro.packs_left(f, n, dt) else f] for f in forms | {None})


def fixed_nk(node, low: Lowering) -> tuple[int | None, int | None]:
    """N and K of ``node`` when the program declares them (every axis sized by an int), else
    None: such an extent is the same in every run, and bounds the forms a kernel needs."""
    if not node.declared_inputs:
        return None, None
    left, right = node.declared_inputs

    def fixed(t: TensorType, axes: Sequence[str]) -> int | None:
        sizes = dict(zip(t.axes, t.sizes))
        got = [sizes[a] for a in axes]
        return math.prod(got) if all(isinstance(v, int) for v in got) else None

    k = fixed(left, low.k_left)
    return fixed(right, low.n_axes), k if k is not None else fixed(right, low.k_right)



@attrs.frozen
class TilePlan:
    """How one contraction call is cut into row tiles: decisions only. ``cpu_source`` renders
    one kernel for every plan of a dtype and layout; the plan reaches it as run-time ints."""

    tm: int  # rows per tile
    ntiles: int
    form: str | None  # the micro-kernel tiles use (``micro``); None: BLAS and gemv
    pack_left: bool  # bcast tiles copy their left rows into one interleaved block first
    parallel: bool  # tiles in a parallel region (else one worker, no region)
    nwork: int  # workers, each a contiguous run of tiles
    tn: int  # columns per tile: all N but for BLAS weight gradients of few rows (WGRAD_SPLIT_COLS)
    # and wide blocked products of few rows (BLOCKED_COLUMN_ROWS, BLOCKED_COLUMN_COLS)

    @property
    def form_id(self) -> int:
        return FORM_IDS["bcast packed left" if self.pack_left else self.form]


def plan_tiles(dims: tuple[int, int, int, int], dt: str, scan_left: bool = False,
               whole: tuple[int, int, int, int] | None = None, threads: int | None = None,
               dot_ok: bool = True, left_k_leading: bool = False) -> TilePlan:
    """The tile plan of a contraction of ``dims`` = (nb, m, n, k) in ``dt``: row tiles whose
    result stays in cache (shorter when the left tile is scanned first, longer over a right
    operand too big to re-pack often), the micro-kernel form chosen for ``whole`` (the whole
    run's dims when this call computes a slice of it, so each element is computed the same
    way), a parallel split above PARALLEL_MIN_MACS over ``threads`` (Numba's count); ``dot_ok``:
    whether the operands' layout is one the ``dot`` tile reads; ``left_k_leading``: the left
    operand is [K, M] (``form_for``)."""
    nb, m, n, k = dims
    item = np.dtype(dt).itemsize
    tm = max(8, min(m, SCRATCH_BYTES // max(1, n * item)))
    if scan_left:  # a scanned tile of the left operand must still be in cache when BLAS reads it
        tm = max(8, min(tm, SCAN_TILE_BYTES // max(1, k * item)))
    # (tiles of at most GEMV_ROWS rows always call gemv: no micro-kernel when all are)
    fnb, fm, fn, fk = whole or dims
    form = form_for(fnb, fm, fn, fk, dt, dot_ok, left_k_leading) if fm > GEMV_ROWS else None
    if form == "blocked":  # the right operand is packed once, not per tile: tiles for reuse
        tm = max(tm, min(m, micro.BLOCKED_MIN_TM))
    else:
        tm = max(tm, pack_rows(m, n, k, item))
    tm = micro.whole_blocks(form, tm)
    ntiles = nb * -(-m // tm)
    parallel = nb * m * n * k >= PARALLEL_MIN_MACS and nb * -(-m // 8) > 1
    if parallel:  # at least one tile per thread
        if threads is None:
            import numba

            threads = numba.get_num_threads()
        want = threads * (BLOCKED_TILES_PER_THREAD if form == "blocked" else TILES_PER_THREAD)
        if ntiles < want:  # (blocked tiles keep strips enough to reuse each panel slice)
            floor = micro.BLOCKED_MIN_SPLIT if form == "blocked" else 8
            tm = micro.whole_blocks(form, max(floor, -(-m // max(1, want // nb))))
            ntiles = nb * -(-m // tm)
        nwork = min(threads, ntiles)
        if nb == 1:  # every worker the same number of tiles, of about equal rows
            tm = micro.balanced_rows(form, m, -(-ntiles // nwork) * nwork)
            ntiles = -(-m // tm)
    else:
        nwork = 1
    tn = n
    if parallel and form == "blocked" and nb == 1 and m < threads * BLOCKED_COLUMN_ROWS \
            and n >= threads * BLOCKED_COLUMN_COLS:
        nr = micro.blocked_nr(dt)
        cols = -(-n // threads)
        cols = -(-cols // nr) * nr  # (whole panels: a blocked tile starts at one)
        if cols < n:  # one row tile, a column tile per thread
            tm, tn = micro.whole_blocks(form, m), cols
            ntiles = -(-n // tn)
            nwork = min(threads, ntiles)
    if parallel and form is None and left_k_leading and GEMV_ROWS < m <= WGRAD_BLAS_ROWS and nb < threads:
        cols = -(-n // threads)
        cols = -(-cols // 16) * 16  # (whole vectors in each column tile's epilogue)
        if WGRAD_SPLIT_COLS <= cols < n:  # one row tile, a column tile per thread
            tm, tn = m, cols
            ntiles = nb * -(-n // tn)
            nwork = min(threads, ntiles)
    pack_left = micro.packs_left(form, n, dt)
    return TilePlan(tm, ntiles, form, pack_left, parallel, nwork, tn)


def pack_rows(m: int, n: int, k: int, item: int) -> int:
    """The fewest rows a BLAS row tile gets so that packing a large right operand ([k, n]) is
    amortised over enough rows; 0 when it is small enough to stay cached between tiles."""
    if k * n * item <= PACKED_RIGHT_BYTES:
        return 0
    return min(m, PACK_ROWS, max(8, WIDE_SCRATCH_BYTES // max(1, n * item)))
