"""GEMM machinery of the contract atom: axis lowering, and the generated CPU kernel with a fused
elementwise epilogue (the CUDA one is in ``atoms._gemm_cuda``).

Any named-axis contraction is lowered to a batched GEMM ``[nb, m, k] x [nb, k, n]``: batch
axes, left's kept axes (M), right's kept axes (N), reduced pairs (K). Operands are viewed,
not copied, whenever their strides give each batch a matrix with one unit stride. The output
and the epilogue operands are addressed through per-group offsets (affine strides, or tables
when a group's axes are interleaved), so any output axis order is written in place.

The CPU kernel computes one row tile at a time inside ``prange``, on the register-blocked
micro-kernels of ``atoms._microgemm`` (skinny shapes, and the cache-blocked GEMM for wide
ones), else on BLAS
(``atoms._blas`` holds the BLAS plumbing and the guard that keeps OpenBLAS on the calling
thread); the epilogue then reads the tile while it is hot.
"""
from __future__ import annotations

import math
from collections.abc import Sequence

import attrs
import numpy as np

from runtime.kernels import simd
from runtime.kernels import vmath
from runtime.execution.bindings import value_is_finite
from runtime.plugins import kernel as calls
from runtime.plugins.kernel import CompiledCall
from runtime.kernels.codegen import configure_numba_cache, load_generated
from runtime.core import settings
from runtime.core.errors import FormulaError
from runtime.plan.fusion import EMPTY_EPILOGUE, Epilogue
from runtime.plugins.kernel import Counts, Kernel, KernelRequest
from runtime.kernels.layout import c_strides, keepdims_is_reshape
from runtime.core.types import TensorType

from . import _microgemm as micro
from ._blas import blas_operand, c_contiguous_layout, flat_operand, register_blas, single_threaded_blas

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

_NUMBA_FLOATS = {"float32": "float32", "float64": "float64"}


# --- lowering ----------------------------------------------------------------------------

@attrs.frozen
class Lowering:
    """How a contract node maps onto ``[nb, m, k] x [nb, k, n] -> [nb, m, n]``."""

    batch: tuple[str, ...]
    m_axes: tuple[str, ...]
    n_axes: tuple[str, ...]
    k_left: tuple[str, ...]
    k_right: tuple[str, ...]
    extents: dict  # axis name -> extent (left's names for reduced pairs)
    left_order: tuple[int, ...]  # left axes permuted to (batch, M, K)
    right_order: tuple[int, ...]  # right axes permuted to (batch, K, N)

    def size(self, axes: Sequence[str]) -> int:
        return math.prod(self.extents[a] for a in axes)

    @property
    def dims(self) -> tuple[int, int, int, int]:
        return (self.size(self.batch), self.size(self.m_axes), self.size(self.n_axes),
                self.size(self.k_left))


def lower(left: TensorType, right: TensorType, pairs: Sequence[Sequence[str]]) -> Lowering:
    k_left = tuple(p[0] for p in pairs)
    k_right = tuple(p[1] for p in pairs)
    batch = tuple(a for a in left.axes if a in right.axes and a not in k_left and a not in k_right)
    m_axes = tuple(a for a in left.axes if a not in k_left and a not in batch)
    n_axes = tuple(a for a in right.axes if a not in k_right and a not in batch)
    extents = dict(zip(right.axes, right.sizes))
    extents.update(zip(left.axes, left.sizes))
    left_order = tuple(left.axes.index(a) for a in batch + m_axes + k_left)
    right_order = tuple(right.axes.index(a) for a in batch + k_right + n_axes)
    return Lowering(batch, m_axes, n_axes, k_left, k_right, extents, left_order, right_order)


def batched_view(order: Sequence[int], shape3: tuple[int, int, int], copy: bool | None = None):
    """:func:`as_batched` with ``order`` and ``shape3`` fixed, for the per-run path
    (``copy=False``: never a copy, ValueError instead)."""
    order = tuple(order)
    if copy is not None:  # (NumPy >= 2.1; older ones raise TypeError)
        return lambda x: x.transpose(order).reshape(shape3, copy=copy)
    if order == tuple(range(len(order))):
        return lambda x: x.reshape(shape3)
    return lambda x: x.transpose(order).reshape(shape3)


def as_batched(x: np.ndarray, order: Sequence[int], shape3: tuple[int, int, int]) -> np.ndarray:
    """``x`` transposed and reshaped to ``shape3``: a view whenever NumPy can make one."""
    return np.asarray(x).transpose(order).reshape(shape3)


def group_offsets(axes: Sequence[str], group: Sequence[str], shape: Sequence[int],
                  strides: Sequence[int]) -> np.ndarray:
    """Element offsets of every C-order index of the axes ``group`` in an array with ``axes``."""
    pos = {a: i for i, a in enumerate(axes)}
    offs = np.zeros(1, np.int64)
    for a in group:
        i = pos.get(a)
        ext, st = (shape[i], strides[i]) if i is not None else (1, 0)
        offs = (offs[:, None] + np.arange(ext, dtype=np.int64)[None, :] * st).reshape(-1)
    return offs


def classify(offs: np.ndarray) -> tuple[str, int]:
    """('zero'|'unit'|'affine'|'table', stride): the cheapest way to address a group."""
    if offs.size == 1 or not offs.any():
        return "zero", 0
    step = int(offs[1] - offs[0])
    if offs[0] == 0 and np.array_equal(offs, np.arange(offs.size, dtype=np.int64) * step):
        return ("unit" if step == 1 else "affine"), step
    return "table", 0


@attrs.frozen
class Addressing:
    """Offsets of (batch, M, N) groups in one flat array: kinds, strides and tables."""

    kinds: tuple[str, str, str]
    strides: tuple[int, int, int]
    tables: tuple[np.ndarray | None, np.ndarray | None, np.ndarray | None]


def addressing(axes: Sequence[str], shape: Sequence[int], strides: Sequence[int],
               low: Lowering) -> Addressing:
    kinds, steps, tables = [], [], []
    for group in (low.batch, low.m_axes, low.n_axes):
        offs = group_offsets(axes, group, shape, strides)
        kind, step = classify(offs)
        kinds.append(kind)
        steps.append(step)
        tables.append(offs if kind == "table" else None)
    return Addressing(tuple(kinds), tuple(steps), tuple(tables))


_GENERALITY = {"zero": 0, "unit": 1, "affine": 2, "table": 3}


def stable_addressing(axes: Sequence[str], shape: Sequence[int], strides: Sequence[int],
                      probe_shape: Sequence[int], probe_strides: Sequence[int], low: Lowering) -> Addressing:
    """``addressing`` whose kinds do not depend on an axis having extent 1: the kinds are the
    more general of the real ones and those at ``probe_shape`` (every extent 1 made 2), so a
    symbolic axis bound to 1 (one token) uses the kernel of every other extent. Steps and
    tables stay the real ones (a group of one element is only ever read at offset 0)."""
    kinds, steps, tables = [], [], []
    for group in (low.batch, low.m_axes, low.n_axes):
        offs = group_offsets(axes, group, shape, strides)
        real, step = classify(offs)
        probe, _ = classify(group_offsets(axes, group, probe_shape, probe_strides))
        kind = max(real, probe, key=_GENERALITY.get)
        if kind == "unit" and offs.size > 1 and step != 1:  # (cannot happen: unit is the real kind)
            kind = "affine"
        kinds.append(kind)
        steps.append(step if real in ("unit", "affine") else 0)
        tables.append(offs if kind == "table" else None)
    return Addressing(tuple(kinds), tuple(steps), tuple(tables))


def out_addressing(out_type: TensorType, low: Lowering) -> Addressing:
    shape = out_type.shape
    probe = [2 if e == 1 else e for e in shape]
    return stable_addressing(out_type.axes, shape, c_strides(shape), probe, c_strides(probe), low)


def keepdims_addressing(t: TensorType, out_type: TensorType, low: Lowering) -> Addressing:
    """Addressing of an epilogue operand compacted to out's rank (extent 1 where broadcast)."""
    probe = [2 if e == 1 else e for e in out_type.shape]
    return stable_addressing(out_type.axes, out_type.shape, keepdims_strides(t, out_type),
                             probe, keepdims_strides(t, out_type, probe=True), low)


def keepdims_strides(t: TensorType, out_type: TensorType, probe: bool = False) -> list[int]:
    """Element strides, per axis of out, of ``t`` in keepdims form (0 where broadcast).
    ``probe``: for an out shape whose extents 1 are made 2, where ``t`` has that axis of
    extent 1 too (present, not broadcast)."""
    present = dict(zip(t.axes, t.sizes))
    shape = []
    for a, oe in zip(out_type.axes, out_type.shape):
        e = present.get(a, 1)
        shape.append(2 if probe and a in present and e == 1 and oe == 1 else e)
    return [0 if e == 1 else s for e, s in zip(shape, c_strides(shape))]


def numba_float(dtype: str, node, backend: str) -> str:
    try:
        return _NUMBA_FLOATS[dtype]
    except KeyError:
        raise FormulaError("backend_unavailable", node.path,
                           f"contract has no {backend} kernel for {dtype}; use backend='reference'") from None


def anchor_dtype(node, epilogue: Epilogue, backend: str) -> str:
    """The numba float type of an anchor's operands, once its epilogue operands are known to
    be of dtypes the generated kernels handle (``backend_unavailable`` otherwise)."""
    for t in epilogue.extra_types:
        if t.dtype not in ("float32", "float64", "int64", "boolean"):
            raise FormulaError("backend_unavailable", node.path,
                               f"contract epilogue has no {backend} kernel for {t.dtype}; use backend='reference'")
    return numba_float(node.input_types[0].dtype, node, backend)


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


# --- CPU: generated kernel ---------------------------------------------------------------

# ints[] layout shared by the generated source and the runner (what is fixed per plan). The
# tile form and the parallel split are run-time values, not code: they depend on extents, and
# a new extent of a symbolic axis must not compile a new kernel.
_I_NB, _I_M, _I_N, _I_K, _I_TM, _I_FORM, _I_PAR = range(7)
_I_ADDR = 7  # then (batch, M, N) strides of out, then of each extra
# ints[_I_FORM]: the micro-kernel tiles used when ``micro`` is set (none: BLAS only)
FORM_IDS = {None: 0, "dot": 1, "bcast": 2, "bcast packed left": 3, "blocked": 4}
ALL_FORMS = frozenset(FORM_IDS.values())


def kernel_forms(n: int | None, k: int | None, dt: str) -> frozenset[int]:
    """The ``FORM_IDS`` that plans with N = ``n`` and K = ``k`` can ask for, whatever their M
    and batch (None: that extent varies between runs, so every form). A kernel links only
    these tiles: each one it links adds seconds to its compilation."""
    if n is None or k is None:
        return ALL_FORMS
    forms = {micro.choose_form(1, rows, n, k, dt) for rows in micro.FORM_ROW_STEPS}
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


# The kernel's leading parameters; then one flat array per epilogue operand, the offset
# tables, and nwork. ``a``/``b``: each operand's memory as a flat array from its first element
# (``_blas.flat_operand``), whose address BLAS takes. ``micro``: 0 BLAS tiles, 1 micro-kernel
# tiles, 2 the same on ``bpk``, the right operand packed by the runner (see ``_microgemm.ResidentPacks``).
KERNEL_HEAD = ["ints", "ta", "lda", "sab", "tb", "ldb", "sbb", "a", "scan_a", "b", "scan_b", "out", "micro", "bpk"]


def _cpu_source(label: str, dt: str, out_addr: Addressing, extra_addr: Sequence[Addressing],
                epilogue: Epilogue, scanned: Sequence[int] = (), checked: Sequence[int] = (),
                values: bool = False, forms: frozenset[int] = ALL_FORMS, shared: Sequence[int] = ()) -> str:
    """``scan_a``: ``a`` is the left operand in C order, scanned for non-finite values tile by
    tile just before BLAS reads the tile (then from cache); ``scan_b``: ``b`` holds the whole
    right operand, scanned once (both only for operands in ``scanned``). ``checked``: the
    extras whose non-finite values the epilogue counts; ``values``: it counts those of the
    contraction's and each step's values too (the output check). The source depends on
    dtypes, layouts and the epilogue only: the micro-kernel form (``atoms._microgemm``;
    ``ints[_I_FORM]``) and whether the tiles run in parallel (``ints[_I_PAR]``) are chosen per
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
    # work(): one worker's tiles; its parameters are the kernel's and what the kernel derives
    wparams = ", ".join(["w", "ints", "ta", "lda", "sab", "tb", "ldb", "sbb", "a", "scan_a", "b", "out",
                         "micro", "m_bp"] + xs + tables + ["nwork", "ticket"])
    L = [f'"""Generated by atoms._gemm: contract anchor {label}."""',
         "import math", "import numpy as np",
         "from numba import njit, prange",
         "from runtime.kernels.atomic import take as _take",
         "from atoms._blas import ext_sgemm as _sgemm, ext_dgemm as _dgemm, ext_sgemv as _sgemv, ext_dgemv as _dgemv",
         vmath.IMPORT,
         *([micro.tile_function("dot", dt, import_as="_tile_dot")] if 1 in forms else []),
         *([micro.tile_function("bcast", dt, import_as="_tile_bcast")] if 2 in forms else []),
         *([micro.tile_function("bcast", dt, True, import_as="_tile_bcastp")] if 3 in forms else []),
         *([micro.tile_function("blocked", dt, import_as="_tile_blocked")] if wide else []),
         *([micro.pack_function(dt, import_as="_pack_right")] if packing else []),
         *([micro.pack_function(dt, import_as="_pack_wide", form="blocked")] if wide else []),
         *([simd.scan_import(dt)] if scan_left or scan_right else []),
         "", "",
         "@njit(cache=True, nogil=True, error_model='numpy')",
         f"def work({wparams}):",
         f"    nb = ints[{_I_NB}]", f"    m = ints[{_I_M}]", f"    n = ints[{_I_N}]",
         f"    k = ints[{_I_K}]", f"    tm = ints[{_I_TM}]", f"    form = ints[{_I_FORM}]",
         "    pa = np.int64(a.ctypes.data)", "    pb = np.int64(b.ctypes.data)",
         "    am = a", "    bm = b",
         f"    m_npad = (n + {micro.BCAST_NV * simd.lanes(dt) - 1}) // {micro.BCAST_NV * simd.lanes(dt)} * {micro.BCAST_NV * simd.lanes(dt)}"]
    for a, (nm, ad) in enumerate(zip(names, addrs)):
        for g, kind in enumerate(ad.kinds):
            if kind == "affine":
                L.append(f"    s_{nm}{'bmn'[g]} = ints[{_I_ADDR + 3 * a + g}]")
    nrw = micro.blocked_nr(dt)
    L += ["    ntm = (m + tm - 1) // tm",
          "    ntiles = nb * ntm",
          *(["    nf = 0"] if counting else []),
          # the scratch's row stride: blocked tiles store rows of whole panels
          f"    sn = (n + {nrw - 1}) // {nrw} * {nrw} if micro and form == 4 else n" if wide else "    sn = n",
          # (+ MR rows: a blocked tile computes whole strips, up to MR - 1 rows past its own)
          f"    scratch = np.empty((tm + {micro.BLOCKED_MR}) * sn, np.{dt})",
          *([f"    apk = np.empty({micro.BCAST_MR} * k if form == 3 else "
             f"({micro.BLOCKED_MR} * ((tm + {micro.BLOCKED_MR - 1}) // {micro.BLOCKED_MR})) * min(k, {micro.BLOCKED_KC}) if form == 4 else 0, np.{dt})"]
            if forms & {3, 4} else []),
          "    prm = np.empty(8, np.int32)",
          "    prm[0] = n", "    prm[2] = k", "    prm[3] = ldb",
          "    prm[4] = lda", "    prm[5] = n",
          "    prm[6] = lda if ta else 1", "    prm[7] = 1",  # gemv incx, incy
          "    ch = np.empty(2, np.uint8)",
          "    ch[0] = 84 if tb else 78",  # 'T' / 'N'
          "    ch[1] = 84 if ta else 78",
          f"    sc = np.empty(2, np.{dt})", "    sc[0] = 1.0", "    sc[1] = 0.0",
          "    pch = np.int64(ch.ctypes.data)", "    pprm = np.int64(prm.ctypes.data)",
          "    psc = np.int64(sc.ctypes.data)", "    pscr = np.int64(scratch.ctypes.data)",
          "    while True:",
          "        t = _take(ticket)",
          "        if t >= ntiles:",
          "            break",
          "        bi = t // ntm",
          "        i0 = (t - bi * ntm) * tm",
          "        rows = min(tm, m - i0)",
          "        prm[1] = rows"]
    if scan_left:  # before the tile, or after it: see _scan_after
        L += ["        q0 = (bi * m + i0) * k",
              f"        after = scan_a and micro != 0 and rows > {GEMV_ROWS} and 0 < n < k",
              "        if scan_a and not after:",
              "            nf += _nonfinite(a, q0, q0 + rows * k)"]
    L += ["        arow = i0 if ta else i0 * lda",
          # gemm would pack all of B for a few rows; a micro-kernel computes a row as in any tile
          "        if rows <= %d and not micro:" % GEMV_ROWS,
          "            for i in range(rows):",
          "                arow = (i0 + i) if ta else (i0 + i) * lda",
          f"                {gemv}(pch, pprm + (8 if tb else 0), pprm + (0 if tb else 8), psc,",
          f"                       pb + bi * sbb * {item}, pprm + 12, pa + (bi * sab + arow) * {item},",
          f"                       pprm + 24, psc + {item}, pscr + i * n * {item}, pprm + 28)",
          *(["        elif micro and form == 1:",
             f"            _tile_dot({micro.TILE_PARAMS['dot']})"] if 1 in forms else []),
          *(["        elif micro and form == 2:",
             f"            _tile_bcast({micro.TILE_PARAMS['bcast'].replace('apk', 'm_bp')})"] if 2 in forms else []),
          *(["        elif micro and form == 3:",
             f"            _tile_bcastp({micro.TILE_PARAMS['bcast']})"] if 3 in forms else []),
          *(["        elif micro and form == 4:",
             f"            _tile_blocked({micro.BLOCKED_ARGS})"] if wide else []),
          "        else:",
          f"            {blas}(pch, pch + 1, pprm, pprm + 4, pprm + 8, psc,",
          f"                   pb + bi * sbb * {item}, pprm + 12, pa + (bi * sab + arow) * {item}, pprm + 16,",
          f"                   psc + {item}, pscr, pprm + 20)"]
    if scan_left:
        L += [line[4:] for line in _scan_after()]
    L.append("        ob = " + index_code("ob", addrs[0].kinds[0], "bi"))
    for j, ad in enumerate(extra_addr):
        L.append(f"        x{j}b = " + index_code(f"x{j}b", ad.kinds[0], "bi"))
    L += ["        for i in range(rows):",
          "            ii = i0 + i",
          "            orow = ob + " + index_code("om", addrs[0].kinds[1], "ii"),
          "            srow = i * sn"]
    for j, ad in enumerate(extra_addr):
        L.append(f"            x{j}r = np.uint64(x{j}b + " + index_code(f"x{j}m", ad.kinds[1], "ii") + ")")
    # unsigned column index (and offsets): lets LLVM vectorise the epilogue's row loop
    L += ["            orow = np.uint64(orow)", "            srow = np.uint64(srow)",
          *(["            bad = False"] if counting else []),
          "            for j in range(np.uint64(n)):"]
    store = f"out[orow + {uindex_code('on', addrs[0].kinds[2], 'j')}]"
    reads = [store if j in shared else f"x{j}[x{j}r + {uindex_code(f'x{j}n', ad.kinds[2], 'j')}]"
             for j, ad in enumerate(extra_addr)]  # (an extra in out's memory: read there)
    L.append("                acc = scratch[srow + j]")
    lines, result = epilogue.emit("acc", reads, indent="                ",
                                  nonfinite="bad" if counting else None, checked=checked, values=values)
    L += vmath.cpu_code(lines)
    L.append(f"                {store} = {result}")
    if values:  # the stored value too: rounding to the output dtype can overflow
        L.append(f"                bad |= ({store} - {store}) != 0")
    if counting:  # (a row's flag, then counted: an int64 count per element halves the vectors)
        L += ["            nf += bad", "    return nf"]
    else:
        L += ["    return 0"]
    # (a prange index is unsigned: as int64 in both loops, work is compiled once, not twice)
    wargs = "np.int64(w)" + wparams.replace("m_bp", "bp")[1:]
    L += ["", "",
          # parallel=True compiles prange into a parallel region; the plain loop stays serial
          "@njit(cache=True, parallel=True, nogil=True, error_model='numpy')",
          f"def kernel({params}):",
          f"    nb = ints[{_I_NB}]", f"    n = ints[{_I_N}]", f"    k = ints[{_I_K}]",
          f"    form = ints[{_I_FORM}]",
          "    nfb = 0"]
    if scan_right:  # the right operand (a bank, typically small) flat, once, before the tiles
        L += ["    if scan_b:", "        nfb = _nonfinite(b, 0, b.size)"]
    L += ["    bp = bpk"]
    if packing:  # bcast: the right operand packed in panels first
        L += ["    if micro == 1 and (form == 2 or form == 3):",
              "        bp = _pack_right(b, nb, k, n, sbb, ldb, tb, ints[%d])" % _I_PAR]
    if wide:  # blocked: in its own panels
        L += ["    if micro == 1 and form == 4:",
              "        bp = _pack_wide(b, nb, k, n, sbb, ldb, tb, ints[%d])" % _I_PAR]
    L += ["    counts = np.empty(nwork, np.int64)",
          "    ticket = np.zeros(1, np.int64)",  # the next tile (workers take tiles dynamically)
          f"    if ints[{_I_PAR}]:",
          "        for w in prange(nwork):",
          f"            counts[w] = work({wargs})",
          "    else:",
          "        for w in range(nwork):",
          f"            counts[w] = work({wargs})",
          *(["    total = nfb", "    for w in range(nwork):", "        total += counts[w]", "    return total"]
            if counting else [])]
    return "\n".join(vmath.with_imports(L)) + "\n"


def _scan_after() -> list[str]:
    """A micro-kernel tile's left rows are checked through its result, when that is the
    smaller (``n < k``): every left element is a factor of one term of each of its row's
    ``n`` sums, and a NaN or ±inf term makes the sum NaN or ±inf whatever the other terms
    (the tiles add every term: no zero is skipped, unlike some BLAS), so a row whose sums are
    all finite read only finite values. A non-finite sum (or an overflow) has the rows
    scanned exactly. Saves the scan's separate pass over the left tile (the seed's ``x``)."""
    return ["            if after and _nonfinite(scratch, 0, rows * sn):",
            "                nf += _nonfinite(a, q0, q0 + rows * k)"]


def keepdims_flattener(t: TensorType, out_type: TensorType):
    """A function giving an epilogue operand as the flat C-order array of its keepdims form.
    Takes keepdims form (the executor's) or a full broadcast view of out's shape, whose
    broadcast axes are cut to extent 1 first, so stride-0 views are never copied."""
    present = dict(zip(t.axes, t.sizes))
    keep = [a in present and present[a] != 1 for a in out_type.axes]
    keep_shape = tuple(e if k else 1 for e, k in zip(out_type.shape, keep))
    cut = tuple(slice(None) if k else slice(0, 1) for k in keep)

    def flat(x: np.ndarray) -> np.ndarray:
        if x.shape != keep_shape:
            x = x[cut]
        if not x.flags.c_contiguous:
            x = np.ascontiguousarray(x)
        return x.reshape(-1)
    return flat


@attrs.frozen
class TilePlan:
    """How one contraction call is cut into row tiles: decisions only. ``_cpu_source`` renders
    one kernel for every plan of a dtype and layout; the plan reaches it as run-time ints."""

    tm: int  # rows per tile
    ntiles: int
    form: str | None  # the micro-kernel tiles use (``atoms._microgemm``); None: BLAS and gemv
    pack_left: bool  # bcast tiles copy their left rows into one interleaved block first
    parallel: bool  # tiles in a parallel region (else one worker, no region)
    nwork: int  # workers, each a contiguous run of tiles

    @property
    def form_id(self) -> int:
        return FORM_IDS["bcast packed left" if self.pack_left else self.form]


def plan_tiles(dims: tuple[int, int, int, int], dt: str, scan_left: bool = False,
               whole: tuple[int, int, int, int] | None = None, threads: int | None = None) -> TilePlan:
    """The tile plan of a contraction of ``dims`` = (nb, m, n, k) in ``dt``: row tiles whose
    result stays in cache (shorter when the left tile is scanned first, longer over a right
    operand too big to re-pack often), the micro-kernel form chosen for ``whole`` (the whole
    run's dims when this call computes a slice of it, so each element is computed the same
    way), a parallel split above PARALLEL_MIN_MACS over ``threads`` (Numba's count)."""
    nb, m, n, k = dims
    item = np.dtype(dt).itemsize
    tm = max(8, min(m, SCRATCH_BYTES // max(1, n * item)))
    if scan_left:  # a scanned tile of the left operand must still be in cache when BLAS reads it
        tm = max(8, min(tm, SCAN_TILE_BYTES // max(1, k * item)))
    # (tiles of at most GEMV_ROWS rows always call gemv: no micro-kernel when all are)
    fnb, fm, fn, fk = whole or dims
    form = micro.choose_form(fnb, fm, fn, fk, dt) if fm > GEMV_ROWS else None
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
    pack_left = micro.packs_left(form, n, dt)
    return TilePlan(tm, ntiles, form, pack_left, parallel, nwork)


def cpu_anchor(request: KernelRequest, low: Lowering, whole: tuple[int, int, int, int] | None = None) -> Kernel:
    """The kernel: row tiles (micro-kernel or BLAS) in prange, taken by the workers as they
    come free, the epilogue applied per hot tile. It counts the
    non-finite values of every operand and extra the request asks it to (``counts``): the left
    operand is scanned tile by tile inside the kernel, just before BLAS reads the tile (or
    checked through the tile's sums, see ``_scan_after``); the right one (typically a small
    bank) once, flat, before the tiles. An operand with no flat view is scanned here.
    ``whole``: (nb, m, n, k) of the whole run when this one computes a slice of it: the tile
    form is chosen for those, so that each element is computed as the whole run computes it."""
    node, epilogue = request.node, request.epilogue or EMPTY_EPILOGUE
    scanned, checked = tuple(k for k in request.count_inputs if k in (0, 1)), request.count_extras
    values = request.check_outputs
    lt, rt = node.input_types
    dt = anchor_dtype(node, epilogue, "cpu")
    out_type = node.output_type
    nb, m, n, k = low.dims
    out_addr = out_addressing(out_type, low)
    extra_addr = [keepdims_addressing(t, out_type, low) for t in epilogue.extra_types]
    scan_left = 0 in scanned
    tiles = plan_tiles(low.dims, dt, scan_left, whole)
    forms = kernel_forms(*fixed_nk(node, low), dt)
    if tiles.form_id not in forms:  # (cannot happen for a declared N and K; stay correct if it does)
        forms = ALL_FORMS
    tm, form, parallel, nwork = tiles.tm, tiles.form, tiles.parallel, tiles.nwork
    ints = np.zeros(_I_ADDR + 3 * (1 + len(extra_addr)), np.int64)
    ints[[_I_NB, _I_M, _I_N, _I_K, _I_TM, _I_FORM, _I_PAR]] = (
        nb, m, n, k, tm, tiles.form_id, int(parallel))
    tables = []
    for a, ad in enumerate([out_addr] + extra_addr):
        ints[_I_ADDR + 3 * a:_I_ADDR + 3 * a + 3] = ad.strides
        tables += [tb for tb in ad.tables if tb is not None]
    shared = tuple(request.output_extras)
    label = f"{epilogue.key} scan={scanned} checked={checked}{' values' if values else ''} {dt} forms={sorted(forms)} out={''.join(k[0] for k in out_addr.kinds)}" + "".join(
        f" x{j}={''.join(k[0] for k in ad.kinds)}" for j, ad in enumerate(extra_addr)) + \
        (f" in-out={list(shared)}" if shared else "")
    register_blas()
    configure_numba_cache()
    module = load_generated(_cpu_source(label, dt, out_addr, extra_addr, epilogue, scanned, checked, values, forms,
                                        shared), "contract_cpu")
    kernel = module.kernel
    flatteners = [keepdims_flattener(t, out_type) for t in epilogue.extra_types]
    scan_right = 1 in scanned
    # OpenBLAS threads a call above 4*65536 multiply-adds (interface/gemm.c): keep it on ours
    guard = single_threaded_blas() if (parallel or tm * n * k > 4 * 65536) else None
    # a micro-kernel call makes no BLAS call at all when no tile is a gemv one: then no guard
    micro_guard = guard if min(tm, m - (-(-m // tm) - 1) * tm) <= GEMV_ROWS else None
    left_view, right_view = batched_view(low.left_order, (nb, m, k)), batched_view(low.right_order, (nb, k, n))
    packs = None
    if form in ("bcast", "blocked") and 1 in request.resident:  # resident: pack once per value
        got = c_contiguous_layout(rt.shape, batched_view(low.right_order, (nb, k, n), copy=False), dt)
        if got is not None and got[2]:
            packs = micro.ResidentPacks(micro.pack_module(dt, form).pack_right, nb, k, n, got[0], int(parallel))
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
                              ints, tables, nwork, packs, no_pack)
    return Kernel(run, Counts(inputs=scanned, extras=tuple(checked), outputs=values), compiled)


def pack_rows(m: int, n: int, k: int, item: int) -> int:
    """The fewest rows a BLAS row tile gets so that packing a large right operand ([k, n]) is
    amortised over enough rows; 0 when it is small enough to stay cached between tiles."""
    if k * n * item <= PACKED_RIGHT_BYTES:
        return 0
    return min(m, PACK_ROWS, max(8, WIDE_SCRATCH_BYTES // max(1, n * item)))


def _compiled_call(kernel, guard, micro_guard, form, types, orders, shapes, dt, epilogue, out_type, scan_left, scan_right,
                   ints, tables, nwork, packs, no_pack) -> CompiledCall | None:
    """``run``'s kernel arguments, as :mod:`runtime.execution.driver` passes them, for C-contiguous operands:
    None when such an operand would still be copied or scanned in Python (see ``run``)."""
    operands = []
    for t, order, shape3 in zip(types, orders, shapes):
        got = c_contiguous_layout(t.shape, batched_view(order, shape3, copy=False), dt)
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
    params = (calls.const_array(ints), *map(c, la), *map(c, lb), calls.flat_input(0), c(scan_left),
              calls.flat_input(1), c(scan_right), calls.FLAT_OUTPUT, c(use_micro), bpk,
              *(calls.flat_extra(j) for j in range(len(epilogue.extra_types))),
              *map(calls.const_array, tables), c(nwork))
    return CompiledCall(kernel, params, micro_guard if use_micro else guard)
