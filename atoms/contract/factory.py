"""The CPU contraction kernel (``cpu_anchor``): the tile plan (``tiles``) for the call's
extents, the generated kernel (``render``) loaded for its dtypes and layouts, and the runner
that hands it the operands as BLAS sees them, the resident packs, and the BLAS guard.
"""
from __future__ import annotations

import functools
from collections.abc import Sequence

import numpy as np

from runtime.toolkit import (EMPTY_EPILOGUE, Twins, configure_numba_cache, keepdims_is_reshape, load_generated,
                             value_is_finite)
from runtime.plugins import kernel as calls
from runtime.plugins.kernel import CompiledCall, Counts, Kernel, KernelRequest

from . import micro
from .blas import blas_operand, c_contiguous_layout, flat_operand, register_blas, single_threaded_blas
from .lowering import (anchor_dtype, batched_view, keepdims_addressing, keepdims_flattener, node_lowering,
                       out_addressing)
from .render import I_ADDR, I_FORM, I_K, I_M, I_N, I_NB, I_PAR, I_TM, I_TN, cpu_source
from .tiles import ALL_FORMS, GEMV_ROWS, fixed_nk, kernel_forms, plan_tiles


def cpu_anchor(request: KernelRequest) -> Kernel:
    """The kernel: row tiles (micro-kernel or BLAS) in prange, taken by the workers as they
    come free, the epilogue applied per hot tile. It counts the
    non-finite values of every operand and extra the request asks it to (``counts``): the left
    operand is scanned tile by tile inside the kernel, just before BLAS reads the tile (or
    checked through the tile's sums, see ``render._scan_after``); the right one once, flat, a
    share by each worker before its tiles. An operand with no flat view is scanned here.
    A slice of a chunked run (``node.whole``) takes the tile form of the whole run's dims, so
    that each element is computed as the whole run computes it."""
    node, epilogue = request.node, request.epilogue or EMPTY_EPILOGUE
    low = node_lowering(node)
    whole = node_lowering(node.whole).dims if node.whole is not None else None
    scanned, checked = tuple(k for k in request.count_inputs if k in (0, 1)), request.count_extras
    values = request.check_outputs
    lt, rt = node.input_types
    dt = anchor_dtype(node, epilogue, "cpu")
    out_type = node.output_type
    nb, m, n, k = low.dims
    out_addr = out_addressing(out_type, low)
    extra_addr = [keepdims_addressing(t, out_type, low) for t in epilogue.extra_types]
    scan_left = 0 in scanned
    left_view, right_view = batched_view(low.left_order, (nb, m, k)), batched_view(low.right_order, (nb, k, n))
    # the dot tile reads [M, K] · [N, K] only; operands in another layout (or copied) take bcast
    static = [_batched_layout(t.shape, order, shape3, dt)
              for t, order, shape3 in ((lt, low.left_order, (nb, m, k)), (rt, low.right_order, (nb, k, n)))]
    dot_ok = None not in static and micro.usable("dot", static[0][0][0], static[1][0][0])
    left_k_leading = static[0] is not None and static[0][0][0] == 1
    tiles = plan_tiles(low.dims, dt, scan_left, whole, dot_ok=dot_ok, left_k_leading=left_k_leading)
    forms = kernel_forms(*fixed_nk(node, low), dt, dot_ok, left_k_leading)
    if tiles.form_id not in forms:  # (cannot happen for a declared N and K; stay correct if it does)
        forms = ALL_FORMS
    tm, form, parallel, nwork = tiles.tm, tiles.form, tiles.parallel, tiles.nwork
    ints = np.zeros(I_ADDR + 3 * (1 + len(extra_addr)), np.int64)
    ints[[I_NB, I_M, I_N, I_K, I_TM, I_FORM, I_PAR, I_TN]] = (
        nb, m, n, k, tm, tiles.form_id, int(parallel), tiles.tn)
    tables = []
    for a, ad in enumerate([out_addr] + extra_addr):
        ints[I_ADDR + 3 * a:I_ADDR + 3 * a + 3] = ad.strides
        tables += [tb for tb in ad.tables if tb is not None]
    shared = tuple(request.output_extras)
    label = f"{epilogue.key} scan={scanned} checked={checked}{' values' if values else ''} {dt} forms={sorted(forms)} out={''.join(k[0] for k in out_addr.kinds)}" + "".join(
        f" x{j}={''.join(k[0] for k in ad.kinds)}" for j, ad in enumerate(extra_addr)) + \
        (f" in-out={list(shared)}" if shared else "")
    register_blas()
    configure_numba_cache()
    module = load_generated(cpu_source(label, dt, out_addr, extra_addr, epilogue, scanned, checked, values, forms,
                                       shared), "contract_cpu")
    twins = Twins(module.kernel_serial, module.kernel)
    kernel = twins.pick(parallel)  # (a serial plan pays no parallel region's cost)
    flatteners = [keepdims_flattener(t, out_type) for t in epilogue.extra_types]
    scan_right = 1 in scanned
    # OpenBLAS threads a call above 4*65536 multiply-adds (interface/gemm.c): keep it on ours
    guard = single_threaded_blas() if (parallel or tm * n * k > 4 * 65536) else None
    # a micro-kernel call makes no BLAS call at all when no tile is a gemv one: then no guard
    micro_guard = guard if min(tm, m - (-(-m // tm) - 1) * tm) <= GEMV_ROWS else None
    packs = kept = None
    got = static[1]
    if form in ("bcast", "blocked") and got is not None and got[2]:
        if 1 in request.resident:  # resident: pack once per value
            module = micro.pack_module(dt, form)
            packs = micro.ResidentPacks.shared((dt, form), Twins(module.pack_right_serial, module.pack_right).pick(parallel),
                                               nb, k, n, got[0], int(parallel))
        else:  # large: packed in every call into a buffer kept per thread
            cols = micro.panel_columns(form, dt)
            size = (nb if got[0][2] != 0 else 1) * k * -(-n // cols) * cols
            if size * np.dtype(dt).itemsize >= micro.KEPT_PACK_BYTES:
                kept = micro.KeptBuffer(size, dt)
    no_pack = np.empty(0, dt)

    def run(inputs: Sequence[np.ndarray], extras: Sequence[np.ndarray], out: np.ndarray):
        a3, (ta, lda, sab) = blas_operand(left_view(inputs[0]))
        b3, (tb, ldb, sbb) = blas_operand(right_view(inputs[1]))
        a, a_c, a_whole = flat_operand(a3)
        if form is not None and not a_whole and micro.usable(form, ta, tb):
            # rows BLAS reads with a stride (a slice of a chunked run): packed, so the
            # micro-kernel computes them as it does for a C-order operand
            a3, (ta, lda, sab) = blas_operand(np.ascontiguousarray(a3))
            a, a_c, a_whole = flat_operand(a3)
        b, _, b_whole = flat_operand(b3)
        xs = [flat(x) for flat, x in zip(flatteners, extras)]
        other = 0
        if scan_left and not a_c:  # no C-order flat view to scan in the kernel: scan it here
            other += not value_is_finite(inputs[0])
        if scan_right and not b_whole:
            other += not value_is_finite(inputs[1])
        use_micro = int(form is not None and micro.usable(form, ta, tb) and a_whole and b_whole)
        bpk = no_pack
        if use_micro and packs is not None and inputs[1].flags.c_contiguous:
            use_micro, bpk = 2, packs(inputs[1])
        elif use_micro and kept is not None and inputs[1].flags.c_contiguous:
            use_micro, bpk = 3, kept()
        args = (ints, ta, lda, sab, tb, ldb, sbb, a, int(scan_left and a_c), b, int(scan_right and b_whole),
                out.reshape(-1), use_micro, bpk, *xs, *tables, nwork)
        call_guard = micro_guard if use_micro else guard
        if call_guard is None:
            got = kernel(*args)
        else:
            with call_guard:
                got = kernel(*args)
        return None if got is None and not other else (got or 0) + other

    compiled = _compiled_call(kernel, guard, micro_guard, form, (lt, rt), (low.left_order, low.right_order),
                              ((nb, m, k), (nb, k, n)), dt, epilogue, out_type, scan_left, scan_right,
                              ints, tables, nwork, packs, no_pack, kept)
    return Kernel(run, Counts(inputs=scanned, extras=tuple(checked), outputs=values), compiled, twins.warm)


@functools.lru_cache(maxsize=1024)
def _batched_layout(shape: tuple[int, ...], order: tuple[int, ...], shape3: tuple[int, int, int], dt: str):
    """:func:`c_contiguous_layout` of an operand of ``shape`` viewed as ``shape3`` (the runner's
    and the compiled call's question, asked once)."""
    return c_contiguous_layout(shape, batched_view(order, shape3, copy=False), dt)


def _compiled_call(kernel, guard, micro_guard, form, types, orders, shapes, dt, epilogue, out_type, scan_left, scan_right,
                   ints, tables, nwork, packs, no_pack, kept=None) -> CompiledCall | None:
    """``run``'s kernel arguments, as :mod:`runtime.execution.driver` passes them, for C-contiguous operands:
    None when such an operand would still be copied or scanned in Python (see ``run``)."""
    operands = []
    for t, order, shape3 in zip(types, orders, shapes):
        got = _batched_layout(t.shape, order, shape3, dt)
        if got is None:
            return None
        operands.append(got)
    (la, a_c, a_whole), (lb, _, b_whole) = operands
    if (scan_left and not a_c) or (scan_right and not b_whole):
        return None
    if not all(keepdims_is_reshape(t, out_type) for t in epilogue.extra_types):  # (the executor's form)
        return None
    use_micro = int(form is not None and micro.usable(form, la[0], lb[0]) and a_whole and b_whole)
    c = calls.const_int
    bpk = calls.const_array(no_pack)
    if use_micro and packs is not None:
        use_micro, bpk = 2, calls.derived_input(1, packs)
    elif use_micro and kept is not None:
        use_micro, bpk = 3, calls.derived_input(1, kept)
    params = (calls.const_array(ints), *map(c, la), *map(c, lb), calls.flat_input(0), c(scan_left),
              calls.flat_input(1), c(scan_right), calls.FLAT_OUTPUT, c(use_micro), bpk,
              *(calls.flat_extra(j) for j in range(len(epilogue.extra_types))),
              *map(calls.const_array, tables), c(nwork))
    return CompiledCall(kernel, params, micro_guard if use_micro else guard)
