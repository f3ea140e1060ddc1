"""The ticket that parallel CPU kernels take their tasks from (runtime.kernels.atomic)."""
from __future__ import annotations

import numpy as np
from numba import njit, prange

from runtime.kernels.atomic import _fetch_add, take


@njit(parallel=True)
def _race(n):
    ticket = np.zeros(1, np.int64)
    hits = np.zeros(n, np.int64)
    for w in prange(2):
        while True:
            t = take(ticket)
            if t >= n:
                break
            hits[t] += 1
    return hits, _fetch_add(ticket, 0, 0)  # (an atomic read: LLVM may forward a plain one)


@njit(parallel=True)
def _one_worker_stalls(n, patience):
    """Worker 1 waits until every task is taken (at most ``patience`` spins): with tasks dealt
    out dynamically, worker 0 takes them all meanwhile; dealt out statically, half would wait."""
    ticket = np.zeros(1, np.int64)
    done = np.zeros(2, np.int64)
    for w in prange(2):
        if w == 1:
            spins = 0
            while _fetch_add(ticket, 0, 0) < n and spins < patience:  # (an atomic read)
                spins += 1
        while True:
            t = take(ticket)
            if t >= n:
                break
            done[w] += 1
    return done


def test_every_ticket_is_taken_once():
    hits, last = _race(100_000)
    assert (hits == 1).all() and last >= 100_000


def test_a_stalled_worker_leaves_its_tasks_to_the_other():
    import numba

    if numba.get_num_threads() < 2:  # (one thread runs both workers in turn)
        return
    done = _one_worker_stalls(64, 10**8)
    assert done.tolist() == [64, 0]
