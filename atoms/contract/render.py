"""The generated CPU source of the contraction: row tiles that the workers of a ``prange``
take from a shared ticket as they come free, each computed (micro-kernel tiles of ``micro``,
else BLAS through ``blas``) then read hot by the fused elementwise epilogue.
"""
from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence

from runtime.toolkit.cpu import Source, simd, vmath
from runtime.toolkit import Epilogue

from . import micro
from .lowering import Addressing
from .tiles import ALL_FORMS, GEMV_ROWS

# ints[] layout shared by the generated source and the runner (what is fixed per plan). The
# tile form and the parallel split are run-time values, not code: they depend on extents, and
# a new extent of a symbolic axis must not compile a new kernel.
I_NB, I_M, I_N, I_K, I_TM, I_FORM, I_PAR, I_TN = range(8)  # I_TN: columns per tile (BLAS tiles)
I_ADDR = 8  # then (batch, M, N) strides of out, then of each extra


def index_code(prefix: str, kind: str, var: str) -> str:
    """Source for one group's offset contribution of index ``var``."""
    if kind == "zero":
        return "0"
    if kind == "unit":
        return var
    if kind == "affine":
        return f"{var} * s_{prefix}"
    return f"t_{prefix}[{var}]"


def uindex_code(prefix: str, kind: str, var: str) -> str:
    """``index_code`` for an unsigned (uint64) index ``var``: every term stays unsigned, since
    mixing int64 and uint64 in Numba yields float64."""
    if kind == "zero":
        return "np.uint64(0)"
    if kind == "unit":
        return var
    if kind == "affine":
        return f"{var} * np.uint64(s_{prefix})"
    return f"np.uint64(t_{prefix}[{var}])"


# The kernel's leading parameters; then one flat array per epilogue operand, the offset
# tables, and nwork. ``a``/``b``: each operand's memory as a flat array from its first element
# (``blas.flat_operand``), whose address BLAS takes. ``micro``: 0 BLAS tiles, 1 micro-kernel
# tiles, 2 the same on ``bpk``, the right operand packed by the runner (see ``micro.ResidentPacks``),
# 3 the kernel packs it into ``bpk``, a buffer the runner keeps (``micro.KeptBuffer``).
KERNEL_HEAD = ["ints", "ta", "lda", "sab", "tb", "ldb", "sbb", "a", "scan_a", "b", "scan_b", "out", "micro", "bpk"]


# rendered sources by everything they depend on: a new extent of a plan renders nothing again
# (the render was a third of a new extent's plan build on the transformer block)
_SOURCES: OrderedDict[tuple, str] = OrderedDict()
MAX_SOURCES = 256


def cpu_source(label: str, dt: str, out_addr: Addressing, extra_addr: Sequence[Addressing],
               epilogue: Epilogue, scanned: Sequence[int] = (), checked: Sequence[int] = (),
               values: bool = False, forms: frozenset[int] = ALL_FORMS, shared: Sequence[int] = ()) -> str:
    """The contract kernel's module source (:func:`render_cpu_source`), rendered once per
    what it depends on: the addressings' kinds (not their strides or tables), the epilogue's
    operations and dtypes, and the rest of the arguments."""
    key = (label, dt, out_addr.kinds, tuple(a.kinds for a in extra_addr),
           tuple((s.op, s.sources, s.node.output_type.dtype) for s in epilogue.steps),
           tuple(t.dtype for t in epilogue.extra_types), tuple(scanned), tuple(checked), values,
           frozenset(forms), tuple(shared))
    source = _SOURCES.get(key)
    if source is None:
        source = render_cpu_source(label, dt, out_addr, extra_addr, epilogue, scanned, checked, values, forms, shared)
        _SOURCES[key] = source
        while len(_SOURCES) > MAX_SOURCES:
            _SOURCES.popitem(last=False)
    return source


def render_cpu_source(label: str, dt: str, out_addr: Addressing, extra_addr: Sequence[Addressing],
                      epilogue: Epilogue, scanned: Sequence[int] = (), checked: Sequence[int] = (),
                      values: bool = False, forms: frozenset[int] = ALL_FORMS, shared: Sequence[int] = ()) -> str:
    """``scan_a``: ``a`` is the left operand in C order, scanned for non-finite values tile by
    tile just before BLAS reads the tile (then from cache); ``scan_b``: ``b`` holds the whole
    right operand, scanned once, a share by each worker before its tiles (both only for
    operands in ``scanned``). ``checked``: the
    extras whose non-finite values the epilogue counts; ``values``: it counts those of the
    contraction's and each step's values too (the output check). The source depends on
    dtypes, layouts and the epilogue only: the micro-kernel form (``micro``;
    ``ints[I_FORM]``) and whether the tiles run in parallel (``ints[I_PAR]``) are chosen per
    call, so one compiled kernel serves every extent; ``forms``: the ``FORM_IDS`` it can be
    asked for (``kernel_forms``), the only tiles it links. The tiles of a worker are ``work``,
    called in ``prange`` or in a plain loop (no parallel region for a call too small to pay
    for one)."""
    item = 4 if dt == "float32" else 8
    blas = "_sgemm" if dt == "float32" else "_dgemm"
    gemv = "_sgemv" if dt == "float32" else "_dgemv"
    names = ["o"] + [f"x{j}" for j in range(len(extra_addr))]
    addrs = [out_addr] + list(extra_addr)
    tables = [f"t_{nm}{g}" for nm, ad in zip(names, addrs) for g, kind in zip("bmn", ad.kinds)
              if kind == "table"]
    scan_left = 0 in scanned
    scan_right = 1 in scanned
    xs = [f"x{j}" for j in range(len(extra_addr))]
    params = ", ".join(KERNEL_HEAD + xs + tables + ["nwork"])
    counting = bool(checked) or scan_left or scan_right or values  # count non-finite values met
    packing = bool(forms & {2, 3})  # bcast tiles read the right operand packed in panels,
    wide = 4 in forms  # blocked ones in panels of their own width
    # the micro-kernel tiles it can be asked for: (form id, import line, call)
    tile_calls = [(1, lambda: micro.tile_function("dot", dt, import_as="_tile_dot"),
                   f"_tile_dot({micro.TILE_ARGS['dot']})"),
                  (2, lambda: micro.tile_function("bcast", dt, import_as="_tile_bcast"),
                   f"_tile_bcast({micro.TILE_ARGS['bcast'].replace('apk', 'm_bp')})"),
                  (3, lambda: micro.tile_function("bcast", dt, True, import_as="_tile_bcastp"),
                   f"_tile_bcastp({micro.TILE_ARGS['bcast']})"),
                  (4, lambda: micro.tile_function("blocked", dt, import_as="_tile_blocked"),
                   f"_tile_blocked({micro.BLOCKED_ARGS})")]
    tile_calls = [(form, imported(), call) for form, imported, call in tile_calls if form in forms]
    # work(): one worker's tiles; its parameters are the kernel's and what the kernel derives
    wparams = ", ".join(["w", "ints", "ta", "lda", "sab", "tb", "ldb", "sbb", "a", "scan_a", "b", "scan_b", "out",
                         "micro", "m_bp"] + xs + tables + ["nwork", "ticket"])
    src = Source(f"Generated by atoms.contract.render: contract anchor {label}.",
                 ["import math", "import numpy as np", "from numba import njit, prange",
                  "from runtime.kernels.atomic import take as _take",
                  "from atoms.contract.blas import ext_sgemm as _sgemm, ext_dgemm as _dgemm, ext_sgemv as _sgemv, "
                  "ext_dgemv as _dgemv",
                  vmath.IMPORT, *(imported for _, imported, _ in tile_calls)])
    if packing:
        src.imports(micro.pack_function(dt, import_as="_pack_right"))
    if wide:
        src.imports(micro.pack_function(dt, import_as="_pack_wide", form="blocked"))
    if scan_left or scan_right:
        src.imports(simd.scan_import(dt))
    npad = micro.panel_columns("bcast", dt)
    nrw = micro.blocked_nr(dt)
    src.add("", "", "@njit(cache=True, nogil=True, error_model='numpy')")
    with src.block(f"def work({wparams}):"):
        src.add(f"nb = ints[{I_NB}]", f"m = ints[{I_M}]", f"n = ints[{I_N}]",
                f"k = ints[{I_K}]", f"tm = ints[{I_TM}]", f"form = ints[{I_FORM}]",
                "pa = np.int64(a.ctypes.data)", "pb = np.int64(b.ctypes.data)",
                "am = a", "bm = b",
                f"m_npad = (n + {npad - 1}) // {npad} * {npad}")
        for a, (nm, ad) in enumerate(zip(names, addrs)):
            for g, kind in enumerate(ad.kinds):
                if kind == "affine":
                    src.add(f"s_{nm}{'bmn'[g]} = ints[{I_ADDR + 3 * a + g}]")
        src.add(f"tn = ints[{I_TN}]", "ntm = (m + tm - 1) // tm", "ntn = (n + tn - 1) // tn", "ntiles = nb * ntm * ntn")
        if counting:
            src.add("nf = 0")
        if scan_right:  # the right operand flat, a share per worker (a serial scan before the
            with src.block("if scan_b:"):  # tiles took 2.5 ms of the seed's dA at T=8192)
                src.add("nf += _nonfinite(b, w * b.size // nwork, (w + 1) * b.size // nwork)")
        # the scratch's row stride: blocked tiles store rows of whole panels
        src.add(f"sn = (n + {nrw - 1}) // {nrw} * {nrw} if micro and form == 4 else n" if wide else "sn = n")
        # (+ MR rows: a blocked tile computes whole strips, up to MR - 1 rows past its own)
        src.add(f"scratch = np.empty((tm + {micro.BLOCKED_MR}) * sn, np.{dt})")
        if forms & {3, 4}:
            src.add(f"apk = np.empty({micro.BCAST_MR} * k if form == 3 else "
                    f"({micro.BLOCKED_MR} * ((tm + {micro.BLOCKED_MR - 1}) // {micro.BLOCKED_MR})) * "
                    f"min(k, {micro.blocked_kc(dt)}) if form == 4 else 0, np.{dt})")
        # BLAS's arguments by address: prm[6:8] gemv's incx, incy; ch 'T' (84) or 'N' (78)
        src.add(f"""
            prm = np.empty(8, np.int32)
            prm[0] = n
            prm[2] = k
            prm[3] = ldb
            prm[4] = lda
            prm[5] = n
            prm[6] = lda if ta else 1
            prm[7] = 1
            ch = np.empty(2, np.uint8)
            ch[0] = 84 if tb else 78
            ch[1] = 84 if ta else 78
            sc = np.empty(2, np.{dt})
            sc[0] = 1.0
            sc[1] = 0.0
            pch = np.int64(ch.ctypes.data)
            pprm = np.int64(prm.ctypes.data)
            psc = np.int64(sc.ctypes.data)
            pscr = np.int64(scratch.ctypes.data)""")
        with src.block("while True:"):
            src.add("t = _take(ticket)")
            with src.block("if t >= ntiles:"):
                src.add("break")
            # tile t: batch bi, row tile, column tile (more than one for BLAS weight gradients and
            # short blocked products: tiles.plan_tiles); a column tile's product lands at its
            # columns of the scratch (a blocked one's start is a whole panel's)
            src.add("bi = t // (ntm * ntn)", "tr = t - bi * ntm * ntn", "i0 = (tr // ntn) * tm",
                    "j0 = (tr - (tr // ntn) * ntn) * tn", "rows = min(tm, m - i0)", "cols = min(tn, n - j0)",
                    "prm[0] = cols", "prm[1] = rows")
            if scan_left:  # before the tile, or after it: see _scan_after
                src.add("q0 = (bi * m + i0) * k",
                        f"after = scan_a and micro != 0 and rows > {GEMV_ROWS} and 0 < n < k and cols == n")
                with src.block("if scan_a and not after and j0 == 0:"):
                    src.add("nf += _nonfinite(a, q0, q0 + rows * k)")
            src.add("arow = i0 if ta else i0 * lda")
            # gemm would pack all of B for a few rows; a micro-kernel computes a row as in any tile
            with src.block(f"if rows <= {GEMV_ROWS} and not micro and cols == n:"), src.block("for i in range(rows):"):
                src.add("arow = (i0 + i) if ta else (i0 + i) * lda",
                        f"{gemv}(pch, pprm + (8 if tb else 0), pprm + (0 if tb else 8), psc,",
                        f"       pb + bi * sbb * {item}, pprm + 12, pa + (bi * sab + arow) * {item},",
                        f"       pprm + 24, psc + {item}, pscr + i * n * {item}, pprm + 28)")
            for form, _, call in tile_calls:
                with src.block(f"elif micro and form == {form}:"):
                    src.add(call)
            with src.block("else:"):
                src.add(f"{blas}(pch, pch + 1, pprm, pprm + 4, pprm + 8, psc,",
                        f"       pb + (bi * sbb + (j0 * ldb if tb else j0)) * {item}, pprm + 12, "
                        f"pa + (bi * sab + arow) * {item}, pprm + 16,",
                        f"       psc + {item}, pscr + j0 * {item}, pprm + 20)")
            if scan_left:
                src.add(_scan_after())
            src.add("ob = " + index_code("ob", addrs[0].kinds[0], "bi"))
            src.add([f"x{j}b = " + index_code(f"x{j}b", ad.kinds[0], "bi") for j, ad in enumerate(extra_addr)])
            with src.block("for i in range(rows):"):
                src.add("ii = i0 + i", "orow = ob + " + index_code("om", addrs[0].kinds[1], "ii"), "srow = i * sn")
                src.add([f"x{j}r = np.uint64(x{j}b + " + index_code(f"x{j}m", ad.kinds[1], "ii") + ")"
                         for j, ad in enumerate(extra_addr)])
                # unsigned column index (and offsets): lets LLVM vectorise the epilogue's row loop
                src.add("orow = np.uint64(orow)", "srow = np.uint64(srow)")
                if counting:
                    src.add("bad = False")
                store = f"out[orow + {uindex_code('on', addrs[0].kinds[2], 'j')}]"
                reads = [store if j in shared else f"x{j}[x{j}r + {uindex_code(f'x{j}n', ad.kinds[2], 'j')}]"
                         for j, ad in enumerate(extra_addr)]  # (an extra in out's memory: read there)
                with src.block("for j in range(np.uint64(j0), np.uint64(j0 + cols)):"):
                    lines, result = epilogue.emit("acc", reads, nonfinite="bad" if counting else None,
                                                  checked=checked, values=values, cpu=True)
                    src.add("acc = scratch[srow + j]", lines, f"{store} = {result}")
                    if values:  # the stored value too: rounding to the output dtype can overflow
                        src.add(f"bad |= ({store} - {store}) != 0")
                if counting:  # (a row's flag, then counted: an int64 count per element halves the vectors)
                    src.add("nf += bad")
        src.add("return nf" if counting else "return 0")
    # (a prange index is unsigned: as int64 in both loops, work is compiled once, not twice)
    wargs = "np.int64(w)" + wparams.replace("m_bp", "bp")[1:]
    # two entry points, chosen per plan (ints[I_PAR]): parallel=True compiles prange into a
    # parallel region, and a parallel function costs about 2 µs a call even on a plain loop
    # (measured on the seed at T=1), which the small products a serial plan runs must not pay
    for name, parallel in (("kernel", True), ("kernel_serial", False)):
        src.add("", "", f"@njit(cache=True, {'parallel=True, ' if parallel else ''}nogil=True, error_model='numpy')")
        with src.block(f"def {name}({params}):"):
            src.add(f"nb = ints[{I_NB}]", f"n = ints[{I_N}]", f"k = ints[{I_K}]", f"form = ints[{I_FORM}]")
            src.add("bp = bpk")
            twin = "" if parallel else "_serial"
            if packing:  # bcast: the right operand packed in panels first (3: into bpk)
                with src.block("if micro == 1 and (form == 2 or form == 3):"):
                    src.add(f"bp = _pack_right{twin}(b, nb, k, n, sbb, ldb, tb, ints[{I_PAR}])")
                with src.block("elif micro == 3 and (form == 2 or form == 3):"):
                    src.add(f"bp = _pack_right_into{twin}(b, nb, k, n, sbb, ldb, tb, ints[{I_PAR}], bpk)")
            if wide:  # blocked: in its own panels
                with src.block("if micro == 1 and form == 4:"):
                    src.add(f"bp = _pack_wide{twin}(b, nb, k, n, sbb, ldb, tb, ints[{I_PAR}])")
                with src.block("elif micro == 3 and form == 4:"):
                    src.add(f"bp = _pack_wide_into{twin}(b, nb, k, n, sbb, ldb, tb, ints[{I_PAR}], bpk)")
            # the ticket: the next tile (workers take tiles dynamically)
            src.add("counts = np.empty(nwork, np.int64)", "ticket = np.zeros(1, np.int64)")
            with src.block(f"for w in {'prange' if parallel else 'range'}(nwork):"):
                src.add(f"counts[w] = work({wargs})")
            if counting:
                src.add("total = 0")
                with src.block("for w in range(nwork):"):
                    src.add("total += counts[w]")
                src.add("return total")
    return "\n".join(vmath.with_imports(src.module_lines())) + "\n"


def _scan_after() -> Source:
    """A micro-kernel tile's left rows are checked through its result, when that is the
    smaller (``n < k``): every left element is a factor of one term of each of its row's
    ``n`` sums, and a NaN or ±inf term makes the sum NaN or ±inf whatever the other terms
    (the tiles add every term: no zero is skipped, unlike some BLAS), so a row whose sums are
    all finite read only finite values. A non-finite sum (or an overflow) has the rows
    scanned exactly. Saves the scan's separate pass over the left tile (the seed's ``x``)."""
    src = Source()
    with src.block("if after and _nonfinite(scratch, 0, rows * sn):"):
        src.add("nf += _nonfinite(a, q0, q0 + rows * k)")
    return src
