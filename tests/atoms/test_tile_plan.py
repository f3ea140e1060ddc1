"""The contraction's tile plan (atoms._gemm.plan_tiles): decisions only, no kernel compiled."""
from __future__ import annotations

import itertools

import numpy as np
import pytest

from atoms import _gemm
from atoms import _microgemm as micro

SHAPES = [(1, 1, 64, 64), (1, 3, 1024, 1024), (1, 256, 1024, 16), (1, 256, 16, 1024),
          (4, 512, 512, 64), (1, 4096, 4096, 1024), (8, 7, 33, 5), (1, 8192, 1024, 16)]


@pytest.mark.parametrize("dims, dt, scan, threads",
                         list(itertools.product(SHAPES, ("float32", "float64"), (False, True), (1, 2, 8))))
def test_every_plan_covers_the_rows_once_in_whole_register_blocks(dims, dt, scan, threads):
    nb, m, n, k = dims
    plan = _gemm.plan_tiles(dims, dt, scan, threads=threads)
    assert plan.tm >= 1 and plan.ntiles == nb * -(-m // plan.tm)  # every row in exactly one tile
    assert 1 <= plan.nwork <= max(1, min(threads, plan.ntiles))
    assert plan.parallel or plan.nwork == 1
    if plan.form is not None and plan.ntiles > 1:  # only a call's last tile has a remainder
        mr = micro.rows_per_block(plan.form)
        assert plan.tm % mr in (0, micro.REMAINDER_MR % mr)
    assert not plan.pack_left or plan.form == "bcast"
    assert plan.form_id == _gemm.FORM_IDS["bcast packed left" if plan.pack_left else plan.form]


def test_small_calls_stay_on_one_worker_and_tiny_ones_on_gemv():
    plan = _gemm.plan_tiles((1, 3, 64, 64), "float32", threads=2)
    assert (plan.parallel, plan.nwork, plan.form) == (False, 1, None)  # 3 rows <= GEMV_ROWS


def test_large_calls_split_evenly_over_the_threads():
    plan = _gemm.plan_tiles((1, 4096, 1024, 1024), "float32", threads=2)
    assert plan.parallel and plan.nwork == 2 and plan.ntiles % 2 == 0


def test_a_scanned_left_tile_fits_the_scan_budget():
    dims = nb, m, n, k = 1, 4096, 64, 4096
    item = 4
    assert _gemm.pack_rows(m, n, k, item) == 0  # a right operand that stays cached
    plain, scanned = (_gemm.plan_tiles(dims, "float32", scan, threads=1) for scan in (False, True))
    assert scanned.tm < plain.tm
    assert scanned.tm <= micro.whole_blocks(scanned.form, _gemm.SCAN_TILE_BYTES // (k * item))


def test_a_right_operand_too_big_for_cache_gets_long_tiles():
    nb, m, n, k = 1, 4096, 4096, 1024  # right operand 16 MiB in float32
    plan = _gemm.plan_tiles((nb, m, n, k), "float32", threads=1)
    assert plan.tm >= min(m, _gemm.PACK_ROWS)


def test_a_slice_takes_the_form_of_the_whole_run():
    whole = (1, 8192, 1024, 16)
    for rows in (1, 4, 5, 64, 300):
        part = (1, rows, 1024, 16)
        want = _gemm.plan_tiles(whole, "float32", threads=2).form
        assert _gemm.plan_tiles(part, "float32", whole=whole, threads=2).form == want


def test_the_kernel_source_does_not_depend_on_the_plan():
    """One compiled kernel serves every plan: the renderer sees no tile decision."""
    import inspect

    params = inspect.signature(_gemm._cpu_source).parameters
    assert not {"tm", "form", "parallel", "nwork", "pack_left", "tiles"} & set(params)
    assert np.array_equal(sorted(_gemm.FORM_IDS.values()), np.arange(len(_gemm.FORM_IDS)))
