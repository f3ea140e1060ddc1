"""The contraction's tile plan (atoms.tiles.plan_tiles): decisions only, no kernel compiled."""
from __future__ import annotations

import itertools
import math

import attrs
import numpy as np
import pytest

from atoms.contract import lowering, micro, render, tiles

SHAPES = [(1, 1, 64, 64), (1, 3, 1024, 1024), (1, 256, 1024, 16), (1, 256, 16, 1024),
          (4, 512, 512, 64), (1, 4096, 4096, 1024), (8, 7, 33, 5), (1, 8192, 1024, 16)]


@pytest.mark.parametrize("dims, dt, scan, threads",
                         list(itertools.product(SHAPES, ("float32", "float64"), (False, True), (1, 2, 8))))
def test_every_plan_covers_the_rows_once_in_whole_register_blocks(dims, dt, scan, threads):
    nb, m, n, k = dims
    plan = tiles.plan_tiles(dims, dt, scan, threads=threads)
    # every row and column in exactly one tile
    assert plan.tm >= 1 and plan.ntiles == nb * -(-m // plan.tm) * -(-n // plan.tn)
    assert 1 <= plan.nwork <= max(1, min(threads, plan.ntiles))
    assert plan.parallel or plan.nwork == 1
    if plan.form is not None and plan.ntiles > 1:  # only a call's last tile has a remainder
        mr = micro.rows_per_block(plan.form)
        assert plan.tm % mr in (0, micro.REMAINDER_MR % mr)
    assert not plan.pack_left or plan.form == "bcast"
    assert plan.form_id == tiles.FORM_IDS["bcast packed left" if plan.pack_left else plan.form]


def test_few_row_weight_gradients_split_their_columns_over_the_threads(monkeypatch):
    """The seed's dA at T=8192 (32 x 1024 x 8192, K-leading left): two row tiles of 16 rows
    each read all of x; a column tile per thread reads half of it, for all 32 rows: on the
    blocked tiles (BLOCKED_COLUMN_COLS), and on BLAS where a dtype or CPU takes BLAS for it
    (WGRAD_SPLIT_COLS)."""
    dims = (1, 32, 1024, 8192)
    plan = tiles.plan_tiles(dims, "float32", threads=2, dot_ok=False, left_k_leading=True)
    form = micro.choose_form(*dims)  # (blocked: its tile is whole strips of rows, 36 on AVX2)
    assert (plan.form, plan.tm, plan.tn, plan.ntiles, plan.nwork) == (form, micro.whole_blocks(form, 32), 512, 2, 2)
    monkeypatch.setattr(tiles, "form_for", lambda *a, **k: None)  # (BLAS)
    plan = tiles.plan_tiles(dims, "float32", threads=2, dot_ok=False, left_k_leading=True)
    assert (plan.form, plan.tm, plan.tn, plan.ntiles, plan.nwork) == (None, 32, 512, 2, 2)
    assert tiles.plan_tiles(dims, "float32", threads=1, dot_ok=False, left_k_leading=True).tn == 1024
    for dims in ((1, 1024, 32, 8192), (1, 2, 1024, 8192), (4, 32, 1024, 8192)):  # rows enough, gemv, batches
        assert tiles.plan_tiles(dims, "float32", threads=2, dot_ok=False, left_k_leading=True).tn == dims[2]
    monkeypatch.undo()
    bcast = tiles.plan_tiles((1, 300, 64, 1024), "float32", threads=2)  # bcast tiles are never cut along N
    assert bcast.form == "bcast" and bcast.tn == 64


@pytest.mark.parametrize("m, n, k", [(128, 2048, 512), (128, 4096, 2048), (16, 2048, 512), (100, 2100, 512),
                                     (255, 2048, 512), (128, 512, 2048), (128, 2047, 512), (32, 1024, 256)])
def test_short_wide_blocked_products_split_their_columns_in_whole_panels(m, n, k):
    """Fewer than BLOCKED_COLUMN_ROWS rows a thread, at least BLOCKED_COLUMN_COLS columns: one
    row tile of every row, a column tile of whole panels per thread (the last one shorter)."""
    nr = micro.blocked_nr("float32")  # (64 columns with AVX-512, 16 on AVX2)
    tn = math.ceil(math.ceil(n / 2) / nr) * nr
    plan = tiles.plan_tiles((1, m, n, k), "float32", threads=2)
    assert (plan.form, plan.tm, plan.tn, plan.ntiles, plan.nwork) == ("blocked", micro.whole_blocks("blocked", m),
                                                                      tn, 2, 2)
    assert plan.tn % micro.blocked_nr("float32") == 0


@pytest.mark.parametrize("dims", [(1, 256, 2048, 512), (1, 4096, 4096, 1024), (8, 128, 512, 64), (1, 128, 64, 512),
                                  (1, 128, 511, 2048), (1, 32, 300, 2048)])
def test_other_blocked_products_keep_whole_rows(dims):
    """Rows enough for every thread, batches, a single panel, too few columns, and one
    thread: no column tiles."""
    assert tiles.plan_tiles(dims, "float32", threads=2).tn == dims[2]
    assert tiles.plan_tiles((1, 128, 2048, 512), "float32", threads=1).tn == 2048


def test_small_calls_stay_on_one_worker_and_tiny_ones_on_gemv():
    plan = tiles.plan_tiles((1, 3, 64, 64), "float32", threads=2)
    assert (plan.parallel, plan.nwork, plan.form) == (False, 1, None)  # 3 rows <= GEMV_ROWS


def test_large_blas_calls_split_evenly_over_the_threads(monkeypatch):
    monkeypatch.setattr(micro, "choose_form", lambda *dims: None)
    plan = tiles.plan_tiles((1, 4096, 1024, 1024), "float32", threads=2)
    assert plan.parallel and plan.nwork == 2 and plan.ntiles % 2 == 0


@pytest.mark.parametrize("m", [128, 300, 4096])
def test_blocked_calls_give_each_thread_several_tiles_of_whole_strips(m):
    """Workers take tiles as they come free: several per thread, so that one on a busy core
    takes fewer; no tile shorter than BLOCKED_MIN_SPLIT rows (nor padded, but the last)."""
    plan = tiles.plan_tiles((1, m, 2048, 512), "float32", threads=2)
    assert plan.form == "blocked" and plan.parallel and plan.nwork == 2
    assert plan.ntiles >= min(2 * tiles.BLOCKED_TILES_PER_THREAD, m // micro.BLOCKED_MIN_SPLIT)
    assert plan.tm >= micro.BLOCKED_MIN_SPLIT and plan.tm % micro.BLOCKED_MR == 0


def test_a_scanned_left_tile_fits_the_scan_budget():
    dims = nb, m, n, k = 1, 4096, 64, 4096
    item = 4
    assert tiles.pack_rows(m, n, k, item) == 0  # a right operand that stays cached
    plain, scanned = (tiles.plan_tiles(dims, "float32", scan, threads=1) for scan in (False, True))
    assert scanned.tm < plain.tm
    assert scanned.tm <= micro.whole_blocks(scanned.form, tiles.SCAN_TILE_BYTES // (k * item))


def test_a_right_operand_too_big_for_cache_gets_long_blas_tiles(monkeypatch):
    nb, m, n, k = 1, 4096, 4096, 1024  # right operand 16 MiB in float32
    monkeypatch.setattr(micro, "choose_form", lambda *dims: None)
    plan = tiles.plan_tiles((nb, m, n, k), "float32", threads=1)
    assert plan.tm >= min(m, tiles.PACK_ROWS)


def test_blocked_tiles_stay_short_since_the_right_operand_is_packed_once():
    nb, m, n, k = 1, 4096, 4096, 1024
    plan = tiles.plan_tiles((nb, m, n, k), "float32", threads=1)
    # (about BLOCKED_MIN_TM rows: the call's rows balanced over its tiles)
    assert plan.form == "blocked" and abs(plan.tm - micro.BLOCKED_MIN_TM) <= micro.BLOCKED_MIN_TM // 8
    assert plan.tm < tiles.PACK_ROWS
    assert plan.tm % micro.BLOCKED_MR == 0


def test_a_slice_takes_the_form_of_the_whole_run():
    whole = (1, 8192, 1024, 16)
    for rows in (1, 4, 5, 64, 300):
        part = (1, rows, 1024, 16)
        want = tiles.plan_tiles(whole, "float32", threads=2).form
        assert tiles.plan_tiles(part, "float32", whole=whole, threads=2).form == want


def test_the_kernel_source_does_not_depend_on_the_plan():
    """One compiled kernel serves every plan: the renderer sees no tile decision."""
    import inspect

    params = inspect.signature(render.cpu_source).parameters
    assert not {"tm", "form", "parallel", "nwork", "pack_left", "tiles"} & set(params)
    assert np.array_equal(sorted(tiles.FORM_IDS.values()), np.arange(len(tiles.FORM_IDS)))


# N and K around every threshold of choose_form and of the left packing
_NK = sorted({1, 7, 16, 31, 32, 33, 63, 64, 65, 255, 256, 257, 512, 1024, 4096}
             | {micro.BCAST_MAX_K, micro.BCAST_MAX_K + 1, micro.BCAST_MIN_N - 1, micro.BCAST_MIN_N,
                micro.DOT_MAX_N, micro.DOT_MAX_N + 1, micro.DOT_MIN_K - 1, micro.DOT_MIN_K})
_ROWS = (1, 4, 5, 6, 31, 32, 33, 100, 255, 256, 257, 2048)


@pytest.mark.parametrize("dt", ["float32", "float64"])
def test_a_kernel_links_every_form_its_declared_n_and_k_can_reach(dt):
    """kernel_forms(n, k) bounds plan_tiles' form for every M and batch (and for the slices of
    a chunked run): a plan asking for a tile its kernel did not link would fall back to BLAS."""
    for n, k in itertools.product(_NK, _NK):
        forms = tiles.kernel_forms(n, k, dt)
        assert tiles.FORM_IDS[None] in forms
        reached = set()
        for nb, m in itertools.product((1, 3), _ROWS):
            plan = tiles.plan_tiles((nb, m, n, k), dt, threads=2)
            reached.add(plan.form_id)
            part = tiles.plan_tiles((1, max(1, m // 3), n, k), dt, whole=(nb, m, n, k), threads=2)
            reached.add(part.form_id)
        assert reached <= forms, (n, k)
        assert forms - reached <= {tiles.FORM_IDS[None]}, (n, k)  # and no form it cannot reach


def test_an_extent_that_varies_links_every_form():
    assert tiles.kernel_forms(None, 64, "float32") == tiles.ALL_FORMS
    assert tiles.kernel_forms(64, None, "float32") == tiles.ALL_FORMS


def test_declared_extents_reach_the_kernel_and_symbols_stay_variable():
    """The seed declares Din, R and Dout as ints: its x·Aᵀ has N = 32, K = 1024 in every run.
    A symbol-sized axis (here S, as N of qᵀ·x-like products) is None."""
    import json
    from pathlib import Path

    import runtime
    from runtime.plan.resolve import resolve_nodes

    text = (Path(__file__).resolve().parents[2] / "examples" / "seed-lora-silu.program.json").read_text()
    exe = runtime.compile(json.loads(text), "reference")
    dims = {"B": 2, "S": 5}
    nodes, _, _ = resolve_nodes(exe.program, exe.specs, exe._builder.binding_types(dims, {}), dims)
    contracts = [n for n in nodes if n.atom.name == "contract"]
    assert [tiles.fixed_nk(n, lowering.lower(*n.input_types, n.attributes["reduce_axes"])) for n in contracts] \
        == [(32, 1024), (1024, 32)]
    symbolic = _declared_by_symbol(contracts[0], "Din")  # K, declared on both operands
    assert tiles.fixed_nk(symbolic, lowering.lower(*symbolic.input_types, symbolic.attributes["reduce_axes"])) \
        == (32, None)
    inserted = attrs.evolve(contracts[0], declared_inputs=())  # a node the planner inserts
    assert tiles.fixed_nk(inserted, lowering.lower(*inserted.input_types, inserted.attributes["reduce_axes"])) \
        == (None, None)


def _declared_by_symbol(node, axis: str):
    """``node`` as if the program declared ``axis`` by a symbol of the same name."""
    return attrs.evolve(node, declared_inputs=tuple(
        t.evolve(sizes=tuple(axis if a == axis else s for a, s in zip(t.axes, t.sizes)))
        for t in node.declared_inputs))


def test_a_layout_the_dot_tile_cannot_read_takes_bcast_not_blas():
    """x·W with W stored [K, N] (the seed's g·B in its gradient) in the x·Aᵀ region: the dot
    tile reads [N, K] only, and BLAS in its place computed an element in an order that
    depended on the call's rows (OpenBLAS's Zen gemm): a chunked run's slices differed from
    the whole run on AVX2. bcast reads either layout, so every row is computed alike."""
    dims = (1, 111, 32, 1024)
    assert tiles.plan_tiles(dims, "float32", dot_ok=False).form == "bcast"
    sliced = tiles.plan_tiles((1, 37, 32, 1024), "float32", whole=dims, dot_ok=False)
    assert sliced.form == "bcast"
    assert tiles.FORM_IDS["bcast"] in tiles.kernel_forms(32, 1024, "float32", dot_ok=False)
    assert tiles.FORM_IDS["dot"] not in tiles.kernel_forms(32, 1024, "float32", dot_ok=False)
    if tiles.plan_tiles((1, 100, 32, 1024), "float32").form == "dot":  # (AVX2: dot below 256 rows)
        assert tiles.FORM_IDS["dot"] in tiles.kernel_forms(32, 1024, "float32")


def test_a_short_weight_gradient_over_a_large_right_operand_keeps_the_blocked_tiles():
    """gᵀ·x of the seed at T=8192 (32 x 1024, K = 8192, the left operand K-leading): the blocked
    tiles, whose column tiles split it over the threads, were faster than BLAS (docs/performance.md,
    tuning log: WGRAD_BLAS_RIGHT, removed); a forward of the same shape keeps them too."""
    dims = (1, 32, 1024, 8192)
    assert tiles.plan_tiles(dims, "float32", left_k_leading=True).form == micro.choose_form(*dims) == "blocked"
    assert tiles.plan_tiles(dims, "float32").form == "blocked"
    assert tiles.plan_tiles((1, 16, 4096, 8192), "float32", left_k_leading=True).form == "blocked"
    # a kernel of that N and K links BLAS too (gemv rows, other tiles): which one a call takes depends on its rows
    assert {tiles.FORM_IDS[None], tiles.FORM_IDS["blocked"]} <= tiles.kernel_forms(1024, 8192, "float32",
                                                                                  left_k_leading=True)


def test_k_leading_left_operands_take_blas_where_the_micro_kernels_read_them_poorly():
    """Narrow products over a long K whose left operand is K-leading (the seed's dB, attention's
    dV by P·dO): bcast reads that operand down its columns; batched ones of few rows per batch
    (attention's dV by dOᵀ·P): blocked packs each batch's whole right operand for them. Where
    K is short, or the left operand is row-major, or one batch has rows enough, the
    micro-kernels stay."""
    kl = dict(dot_ok=False, left_k_leading=True)
    assert tiles.form_for(1, 1024, 32, 8192, "float32", **kl) is None
    assert tiles.form_for(8, 512, 64, 512, "float32", **kl) is None
    assert tiles.form_for(1, 1024, 32, 256, "float32", **kl) == "bcast"  # (K = 256: bcast was faster)
    assert tiles.form_for(1, 8192, 32, 1024, "float32") in ("bcast", "dot")  # x·Aᵀ: row-major left
    assert tiles.form_for(8, 64, 512, 512, "float32", **kl) is None
    assert tiles.form_for(1, 64, 1024, 4096, "float32", **kl) == "blocked"  # one batch: blocked was faster
    assert tiles.form_for(8, 128, 512, 512, "float32", **kl) == "blocked"
