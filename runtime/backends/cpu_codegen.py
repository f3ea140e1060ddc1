"""Generated Numba loop kernels for the CPU: fused elementwise chains, and the loop nests that
the reduce and masked-softmax atoms fill with their bodies.

Each kernel is rendered as source with an explicit signature (operands read-only, possibly
unaligned C-contiguous arrays; the output C-contiguous), so it compiles exactly once per
source, and ``cache=True`` (via :func:`runtime.kernels.codegen.load_generated`) lets a second process
load it from disk. Runners bring operands to that form cheaply: broadcast axes (known from
the types) are cut to extent 1 and read at index 0, so stride-0 views cost nothing; only a
transposed or Fortran-ordered operand is copied. Loop indices are unsigned so the inner loop
vectorises. Serial and parallel variants live in separate modules so the slower-compiling
parallel one is only built when a call is large enough to use it.
"""
from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import numpy as np

from runtime.kernels import vmath
from runtime.kernels.atomic import WORKERS
from runtime.kernels.codegen import Source, configure_numba_cache, load_generated
from runtime.kernels.layout import keepdims_is_reshape
from runtime.core import settings
from runtime.plugins.kernel import (CompiledCall, Counts, Kernel, KernelRequest, Param, const_int, flat_extra, flat_output,
                                    no_kernel)
from runtime.core.types import TensorType

# Below this many elements of work a call runs on one thread: a parallel region costs more
# than it saves (docs/tuning.md: FORMULA_CPU_PARALLEL_MIN overrides it).
PARALLEL_MIN_ELEMENTS = settings.CPU_PARALLEL_MIN.read()
TASKS_PER_THREAD = 4
MIN_BLOCK = 2048  # inner-axis elements per parallel task when the inner axis is split
DYNAMIC_CHUNKS = settings.CPU_DYNAMIC_CHUNKS.read()  # chunks per parallel call

NUMBA_TYPES = {"float32": "float32", "float64": "float64", "int64": "int64", "boolean": "boolean"}


def numba_type(dtype: str, path: str, what: str, backend: str = "cpu") -> str:
    """The numba scalar type name of a formula dtype this backend's kernels handle."""
    try:
        return NUMBA_TYPES[dtype]
    except KeyError:
        raise no_kernel(what, backend, dtype, path) from None


def broadcast_axes(operand: TensorType, target: TensorType) -> tuple[bool, ...]:
    """Per axis of ``target``: whether ``operand`` is broadcast along it (absent, or extent 1
    where the target's is larger), so a kernel indexes it at 0 instead of with the loop index.
    An axis of extent 1 in both is indexed like any other (its index is 0 anyway): a symbolic
    axis bound to 1 then uses the kernel of every other extent."""
    present = dict(zip(operand.axes, operand.sizes))
    return tuple(a not in present or (present[a] == 1 and e != 1) for a, e in zip(target.axes, target.shape))


def index_expr(names: Sequence[str], broadcast: Sequence[bool]) -> str:
    """``a, b, 0`` style subscript; broadcast positions read element 0."""
    parts = ["0" if b else n for n, b in zip(names, broadcast)]
    return ", ".join(parts) + ("," if len(parts) == 1 else "")


def loop_nest(dims: Sequence[str], body: Sequence[str] | Source, parallel: bool, flag: str | None = None) -> Source:
    """A kernel's body (for :func:`render`) iterating ``i0..i{R-1}`` over extents ``dims``
    (R >= 1) and running ``body`` (lines or a fragment).

    The outer axes are flattened into rows; each row's innermost range is cut into ``nblk``
    blocks, so ``prange`` has enough tasks even when the outer extents are 1. With ``flag``
    (a boolean the body sets), it ends by returning how many blocks set it."""
    rank = len(dims)
    src = Source().add([f"d{k} = {d}" for k, d in enumerate(dims)])
    if flag:
        src.add("_nf = 0")
    last = f"d{rank - 1}"
    rows = " * ".join(f"d{k}" for k in range(rank - 1)) or "1"
    src.add(f"rows = {rows}", f"blk = ({last} + nblk - 1) // nblk")
    task = Source().add("r = t // nblk", "lo = (t - r * nblk) * blk", f"hi = _u(min(lo + blk, {last}))", "lo = _u(lo)")
    # unsigned indices: Numba then skips negative-index wraparound, which otherwise blocks
    # vectorisation of the inner loop
    for k in range(rank - 2, 0, -1):
        task.add(f"i{k} = _u(r % d{k})", f"r = r // d{k}")
    if rank > 1:
        task.add("i0 = _u(r)")
    if flag:
        task.add(f"{flag} = False")
    with task.block(f"for i{rank - 1} in range(lo, hi):"):
        task.add(body)
    if flag:  # (a boolean OR in the loop vectorises; an int64 count would halve the vectors)
        task.add(f"_nf += {flag}")
    if parallel:  # workers take chunks of tasks from a ticket: see dynamic_tasks
        src.add(dynamic_tasks("rows * nblk", task, DYNAMIC_CHUNKS))
    else:
        with src.block("for t in range(rows * nblk):"):
            src.add(task)
    if flag:
        src.add("return _nf")
    return src


def dynamic_tasks(count: str, task: Sequence[str] | Source, chunks: int) -> Source:
    """A fragment running ``task`` (lines using ``t``) for ``t`` in ``range(count)`` in a
    parallel region whose workers take chunks of consecutive tasks, about ``chunks`` in all,
    from a shared ticket as they come free: a worker on a busy core takes fewer. (Numba's
    ``set_parallel_chunksize`` does not balance under the omp threading layer: its chunks
    are dealt out statically.)"""
    src = Source().add(f"ntask = {count}",
                       f"chunk = max(1, ntask // {max(1, chunks)})",
                       "nchunk = (ntask + chunk - 1) // chunk",
                       "ticket = np.zeros(1, np.int64)")
    with src.block(f"for w in prange({WORKERS}):"), src.block("while _left(ticket, nchunk):"):
        src.add("c = _take(ticket)")
        with src.block("if c >= nchunk:"):
            src.add("break")
        with src.block("for t in range(c * chunk, min(c * chunk + chunk, ntask)):"):
            src.add(task)
    return src


def render(name: str, args: Sequence[tuple[str, str, int, bool]], body: Sequence[str] | Source,
           parallel: bool, returns: str = "void") -> str:
    """Module source for ``kernel(*args, nblk)`` running ``body`` (a fragment such as
    :func:`loop_nest`'s, or lines, at the function's depth); ``args`` are (name, numba dtype,
    rank, is_output); ``returns``: the numba type it returns ("int64" for a count)."""
    sig = []
    for _, dt, rank, is_out in args:
        if is_out:
            sig.append(f"_t.Array(_t.{dt}, {rank}, 'C')")
        else:
            sig.append(f"_t.Array(_t.{dt}, {rank}, 'C', readonly=True, aligned=False)")
    params = ", ".join(a[0] for a in args)
    src = Source(f"Generated by runtime.backends.cpu_codegen: {name}.",
                 ["import math", "import numpy as np", "from numba import njit, prange, uint64 as _u, types as _t",
                  "from runtime.kernels.atomic import left as _left, take as _take", vmath.IMPORT])
    src.add("", f"SIGNATURE = _t.{returns}({', '.join(sig)}, _t.int64)", "",
            f"@njit(SIGNATURE, cache=True, parallel={parallel}, error_model='numpy', nogil=True)")
    with src.block(f"def kernel({params}, nblk):"):
        src.add(body)
    return "\n".join(vmath.with_imports(src.module_lines())) + "\n"


class NestKernel:
    """A serial kernel plus a lazily built parallel twin, picked per call by size.

    Which twin a call takes depends on its extents; :meth:`warm` builds both, so that a plan
    warmed once runs any later extent of its symbolic axes without compiling (the executor
    warms a plan's kernels in the background, see ``runtime.execution.tiers``)."""

    # the parallel twin of each serial module loaded (by its name, a digest of its source: a
    # twin's source follows from the serial one's), shared by the kernels of every plan: a
    # plan at a new extent takes the twin the last plan loaded instead of rendering it again
    _twins: dict[str, Any] = {}
    _shared: dict[tuple, "NestKernel"] = {}  # (NestKernel.shared)

    def __init__(self, prefix: str, make_source):
        self._make_source = make_source
        self._prefix = prefix
        configure_numba_cache()
        module = load_generated(make_source(False), prefix)
        self.serial = module.kernel
        self._key = module.__name__
        self._parallel = None

    @classmethod
    def shared(cls, prefix: str, key: tuple, make_source) -> "NestKernel":
        """The process's one kernel of ``key`` (hashable: everything its source depends on),
        made from ``make_source`` the first time: a plan at a new extent neither renders its
        source again nor hashes it."""
        kernel = cls._shared.get((prefix, key))
        if kernel is None:
            kernel = cls._shared.setdefault((prefix, key), cls(prefix, make_source))
        return kernel

    @classmethod
    def loop(cls, prefix: str, label: str, args: Sequence[tuple[str, str, int, bool]], dims: Sequence[str],
             body: Sequence[str], flag: str | None = None) -> "NestKernel":
        """:meth:`shared` for the usual source: ``render(label, args, loop_nest(dims, body, par,
        flag), par)``, returning the count ``flag`` gathers when there is one."""
        return cls.shared(prefix, (label, tuple(args), tuple(dims), tuple(body), flag),
                          lambda par: render(label, args, loop_nest(dims, body, par, flag), par,
                                             "int64" if flag else "void"))

    def parallel(self):
        if self._parallel is None:
            twin = NestKernel._twins.get(self._key)
            if twin is None:
                twin = NestKernel._twins[self._key] = load_generated(self._make_source(True),
                                                                     self._prefix + "_par").kernel
            self._parallel = twin
        return self._parallel

    def warm(self) -> None:
        """Build (compile, or load from the disk cache) every variant a call may take."""
        self.parallel()

    def __call__(self, arrays: Sequence[np.ndarray], space: Sequence[int], work: int | None = None):
        """Run over the index ``space`` (the loop nest's extents); ``work``: elements read,
        when each point of the space reads more than one (a softmax row). Returns what the
        kernel returns."""
        parallel, nblk = self.variant(space, work)
        return (self.parallel() if parallel else self.serial)(*arrays, nblk)

    def variant(self, space: Sequence[int], work: int | None = None) -> tuple[bool, int]:
        """(whether the parallel twin runs, its ``nblk``) for this index space."""
        n = math.prod(space)
        if (n if work is None else work) < PARALLEL_MIN_ELEMENTS:
            return False, 1
        import numba

        tasks = numba.get_num_threads() * TASKS_PER_THREAD
        rows = n // space[-1]
        return True, 1 if rows >= tasks else max(1, min(-(-tasks // rows), space[-1] // MIN_BLOCK))

    def compiled(self, params: Sequence[Param], space: Sequence[int], work: int | None = None) -> CompiledCall:
        """How compiled code calls the variant this space takes: ``params`` then its ``nblk``."""
        parallel, nblk = self.variant(space, work)
        return CompiledCall(self.parallel if parallel else (lambda: self.serial), (*params, const_int(nblk)))


def contiguous(x: np.ndarray, slicer: tuple | None = None, shape: tuple | None = None) -> np.ndarray:
    """``x`` as the C-contiguous operand a generated kernel takes: broadcast axes cut to
    extent 1 (``slicer``), copied only if still not C-contiguous (a transposed or Fortran
    caller array), then viewed with the kernel's collapsed ``shape``."""
    if slicer is not None:
        x = x[slicer]
    if not x.flags.c_contiguous:
        x = np.ascontiguousarray(x)
    return x if shape is None else x.reshape(shape)


def collapse_groups(patterns: Sequence[Sequence[bool]], rank: int) -> list[list[int]]:
    """Runs of consecutive axes along which every operand is either broadcast throughout or
    not at all: such a run is one contiguous axis of each compacted operand."""
    groups: list[list[int]] = []
    for k in range(rank):
        key = tuple(p[k] for p in patterns)
        if groups and tuple(p[groups[-1][0]] for p in patterns) == key:
            groups[-1].append(k)
        else:
            groups.append([k])
    return groups


def elementwise_kernel(request: KernelRequest) -> Kernel:
    """The kernel of an anchorless chain (``request.epilogue``) over its output's shape.

    Its extras are NumPy arrays of the output's shape (broadcast views welcome). Statically
    known broadcast axes are cut to extent 1 and read at index 0, and runs of axes with the
    same broadcast pattern are collapsed, so a same-shape chain is one flat vectorisable loop.
    It counts the non-finite values of the ``request.count_extras`` extras it reads, and with
    ``request.check_outputs`` those of every floating step's value: it returns how many blocks
    of the loop met one (nonzero exactly when one did)."""
    epilogue, out_type = request.epilogue, request.output_type
    if epilogue is None or epilogue.empty:
        raise ValueError("an anchorless elementwise kernel needs at least one step")
    node = epilogue.steps[-1].node
    what = node.atom.name
    out_dt = numba_type(out_type.dtype, node.path, what)
    shape = out_type.shape or (1,)
    patterns = [broadcast_axes(t, out_type) if out_type.rank else (True,) for t in epilogue.extra_types]
    groups = collapse_groups(patterns, len(shape))
    rank = len(groups)
    out_shape = tuple(math.prod(shape[k] for k in g) for g in groups)
    names = [f"i{k}" for k in range(rank)]
    store = f"out[{index_expr(names, [False] * rank)}]"
    args, reads, prepare = [], [], []
    for j, (t, pat) in enumerate(zip(epilogue.extra_types, patterns)):
        args.append((f"x{j}", numba_type(t.dtype, node.path, what), rank, False))
        gpat = [pat[g[0]] for g in groups]
        # an operand in out's memory is read there: two arrays LLVM cannot tell apart keep the loop scalar
        reads.append(store if j in request.output_extras else f"x{j}[{index_expr(names, gpat)}]")
        cshape = tuple(1 if b else n for b, n in zip(gpat, out_shape))
        slicer = tuple(slice(0, 1) if b else slice(None) for b in pat) if any(pat) else None
        if out_type.rank == 0:
            slicer = None
        prepare.append((slicer, cshape))
    args.append(("out", out_dt, rank, True))
    checked, values = request.count_extras, request.check_outputs
    flag = "bad" if checked or values else None  # counts the non-finite values met
    lines, result = epilogue.emit(None, reads, nonfinite=flag, checked=checked, values=values, cpu=True)
    # (the stored value too: rounding to the output dtype can overflow)
    body = lines + [f"{store} = {result}"] + ([f"{flag} |= ({store} - {store}) != 0"] if values else [])
    dims = [f"out.shape[{k}]" for k in range(rank)]
    # (no extents in the source: it must be the same for every extent of a symbolic axis)
    label = f"elementwise {epilogue.key}{f' counting {checked}' if checked else ''}" \
            f"{' checking values' if values else ''} -> {out_dt} rank {rank}" + \
            (f" in-out {list(request.output_extras)}" if request.output_extras else "")
    kernel = NestKernel.loop("ew", label, args, dims, body, flag)

    def run(inputs: Sequence[np.ndarray], extras: Sequence[np.ndarray], out: np.ndarray) -> int | None:
        arrays = [contiguous(x, sl, cs) for x, (sl, cs) in zip(extras, prepare)]
        arrays.append(out.reshape(out_shape))
        return kernel(arrays, out_shape)
    compiled = None
    if all(keepdims_is_reshape(t, out_type) for t in epilogue.extra_types):  # flat C-order buffers: a reshape each
        compiled = kernel.compiled([*(flat_extra(j, cs, unaligned=True) for j, (_, cs) in enumerate(prepare)), flat_output(out_shape)],
                                   out_shape)
    return Kernel(run, Counts(extras=tuple(checked), outputs=values), compiled, kernel.warm)
