"""The one kernel contract: a :class:`KernelRequest` in, a :class:`Kernel` out.

Every kernel factory — an atom's own (``AtomSpec.kernels``), one a plugin registers through
``formula_register_kernels``, a backend's fused elementwise chain — is
``factory(request) -> Kernel``. The request says what the planner wants: the node, the epilogue
to apply before each store (on backends where the atom ``anchors``), which operands' non-finite
values the kernel may count (SPEC §4 finiteness of bindings, fused into a pass that reads them
anyway), which operands are resident banks. The kernel says what it does: ``counts`` lists
what its returned count covers, which may be less than asked (nothing, for a kernel that
cannot count); the run scans the rest itself. docs/writing-plugins.md documents it.
"""
from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import attrs

from runtime.core.errors import FormulaError

Run = Callable[[Sequence[Any], Sequence[Any], Any], "int | None"]


@attrs.frozen
class KernelRequest:
    """What the planner asks of a kernel for one group.

    ``node``: the anchor or lone node (None for an anchorless elementwise chain, a backend's
    own kernel). ``epilogue``: a ``runtime.plan.fusion.Epilogue`` to apply before each store
    (never empty), or None. ``count_inputs`` / ``count_extras``: positions among the node's
    operands / the epilogue's extra operands whose NaN and ±inf values the kernel may count
    (float bindings it reads in full, each in C order or a view of one). ``resident``: the
    node's operands that are resident banks — runtime-owned values that never change while
    they live, which a kernel may transform once (e.g. pack) and reuse run after run.
    ``check_outputs``: the run checks every instruction output for NaN and ±inf (SPEC §3b.3
    item 2), so the kernel may count them as it stores them. ``output_extras``: epilogue
    operands whose memory is the output's (the planner's in-place reuse), of the output's
    axes and extents: the kernel may read them through its output array at the index it
    writes (LLVM vectorises a loop that reads and writes one array, not one whose two arrays
    it cannot prove apart); it need not."""

    node: Any = None  # runtime.plugins.atomspec.Node | None
    epilogue: Any = None  # runtime.plan.fusion.Epilogue | None
    count_inputs: tuple[int, ...] = ()
    count_extras: tuple[int, ...] = ()
    resident: tuple[int, ...] = ()
    check_outputs: bool = False
    output_extras: tuple[int, ...] = ()

    @property
    def output_type(self):
        """The type of the array the kernel fills (the last epilogue step's, else the node's)."""
        if self.epilogue is not None and not self.epilogue.empty:
            return self.epilogue.steps[-1].node.output_type
        return self.node.output_type


@attrs.frozen
class Counts:
    """What a kernel's returned count covers: non-zero exactly when one of these holds a NaN
    or ±inf (a kernel may also count a false alarm, such as a sum that overflows; the run then
    looks again). ``inputs`` / ``extras``: operand positions as in :class:`KernelRequest`;
    ``outputs``: the values the kernel stores (and, in a fused group, every intermediate)."""

    inputs: tuple[int, ...] = ()
    extras: tuple[int, ...] = ()
    outputs: bool = False

    @property
    def any(self) -> bool:
        return bool(self.inputs or self.extras or self.outputs)


NOTHING = Counts()


# --- how compiled code calls a kernel (runtime.execution.driver) ---------------------------

@attrs.frozen
class Param:
    """One kernel parameter: ``kind`` is "input" / "extra" (the flat C-order array of operand /
    epilogue operand ``index``; with ``shape``, that array reshaped to it), "output" (the flat
    output, or reshaped), "int" (an int64 ``value``), "scalar" (the NumPy scalar ``value``, of
    its own type), "array" (the constant array ``value``) or "derived" (the array
    ``value(operand)`` for operand ``index`` as bound, worked out in Python before each call:
    e.g. a cached packed form of a resident bank). ``view``: the array viewed as this dtype
    (its name; the same item size: raw bits). ``unaligned``: typed as an unaligned array, for
    a kernel whose explicit signature declares one."""

    kind: str
    index: int = 0
    value: Any = None
    shape: tuple[int, ...] | None = None
    view: str | None = None
    unaligned: bool = False


def flat_input(index: int, shape: tuple[int, ...] | None = None, view: str | None = None,
               unaligned: bool = False) -> Param:
    return Param("input", index, shape=_shape(shape), view=view, unaligned=unaligned)


def derived_input(index: int, derive: Callable[[Any], Any]) -> Param:
    return Param("derived", index, derive)


def flat_extra(index: int, shape: tuple[int, ...] | None = None, unaligned: bool = False) -> Param:
    return Param("extra", index, shape=_shape(shape), unaligned=unaligned)


def flat_output(shape: tuple[int, ...] | None = None, view: str | None = None, unaligned: bool = False) -> Param:
    return Param("output", shape=_shape(shape), view=view, unaligned=unaligned)


def _shape(shape: tuple[int, ...] | None) -> tuple[int, ...] | None:
    return None if shape is None else tuple(int(n) for n in shape)


FLAT_OUTPUT = flat_output()


def const_int(value: int) -> Param:
    return Param("int", value=int(value))


def const_scalar(value: Any) -> Param:
    return Param("scalar", value=value)


def const_array(value: Any) -> Param:
    return Param("array", value=value)


@attrs.frozen(eq=False)
class CompiledCall:
    """How compiled code calls a kernel (``Kernel.compiled``) whose operands are C-contiguous,
    aligned arrays of their types. ``guard``: a context manager the call must run inside
    (entered once around the whole driver). It returns the count the ``Kernel`` returns when
    that kernel counts anything (``Kernel.counts``)."""

    kernel: Any  # a Numba dispatcher defined at module level in an importable module, or a
    # function of no arguments returning one (loaded when the driver is built: a variant that
    # only compiled code would call is then compiled only if a driver needs it)
    params: tuple[Param, ...]
    guard: Any = None

    def dispatcher(self) -> Any:
        return self.kernel if hasattr(self.kernel, "py_func") else self.kernel()


@attrs.frozen(eq=False)
class Kernel:
    """A kernel ready to launch: ``kernel(inputs, extras, out)`` fills ``out`` from the node's
    operands and the epilogue's extras (arrays in the keepdims form of ``out``), and returns a
    count as ``counts`` describes (None or 0 when it counts nothing). ``compiled``: how compiled
    code calls it (:class:`CompiledCall`), or None: then a run launches this kernel from Python
    (``runtime.execution.driver``)."""

    run: Run
    counts: Counts = NOTHING
    compiled: Any = None
    # builds (compiles or loads) every variant a later extent may take, e.g. a parallel twin
    # (``Executable.warm``): a warmed plan then runs new extents of symbolic axes compiling nothing
    warm: Callable[[], None] | None = None

    def __call__(self, inputs: Sequence[Any], extras: Sequence[Any], out: Any) -> int | None:
        return self.run(inputs, extras, out)


def plain_kernel(fn: Callable[[Sequence[Any], Any], Any], counts: Counts = NOTHING,
                 warm: Callable[[], None] | None = None, compiled: CompiledCall | None = None) -> Kernel:
    """A kernel from ``fn(inputs, out)``, for a node that takes no epilogue: the one idiom of a
    factory, ``def factory(request): ...; return plain_kernel(run, ...)``. ``fn`` returns a
    count covering ``counts`` (nothing by default: its return value is then ignored); ``warm``
    and ``compiled`` are ``Kernel``'s."""
    if counts.any:
        return Kernel(lambda inputs, extras, out: fn(inputs, out), counts, compiled, warm)
    return Kernel(lambda inputs, extras, out: _none(fn(inputs, out)), compiled=compiled, warm=warm)


def _none(_: Any) -> None:
    return None


# --- refusing a dtype ------------------------------------------------------------------------

# What compiled kernels usually handle: the floats (half operands reach them widened by the
# planner, SPEC §3b.1), and with the integers and booleans of elementwise code.
KERNEL_FLOATS = ("float32", "float64")
KERNEL_DTYPES = ("float32", "float64", "int64", "boolean")


def no_kernel(what: str, backend: str, dtype: str, path: str) -> FormulaError:
    """The one refusal of a dtype a backend's kernel does not handle (``backend_unavailable``
    at ``path``): ``what`` is the atom's name, or what of it lacks the kernel. Raise it from the
    factory, so a plan fails before any run."""
    return FormulaError("backend_unavailable", path,
                        f"{what} has no {backend} kernel for {dtype}; use backend='reference'")


def check_dtypes(node: Any, backend: str, dtypes: Sequence[str] = KERNEL_FLOATS,
                 types: Sequence[Any] | None = None, what: str | None = None) -> None:
    """Raise :func:`no_kernel` for the first of ``types`` (by default the node's operands, then
    its output) whose dtype is not among ``dtypes``."""
    for t in (tuple(node.input_types) + (node.output_type,)) if types is None else types:
        if t.dtype not in dtypes:
            raise no_kernel(what or node.atom.name, backend, t.dtype, node.path)


def request_for(node: Any, epilogue: Any = None, **fields: Any) -> KernelRequest:
    """The request for ``node`` alone (or with ``epilogue``; an empty one counts as none)."""
    if epilogue is not None and epilogue.empty:
        epilogue = None
    return KernelRequest(node, epilogue, **fields)


__all__ = ["KernelRequest", "Kernel", "Counts", "NOTHING", "plain_kernel", "request_for",
           "no_kernel", "check_dtypes", "KERNEL_FLOATS", "KERNEL_DTYPES"]
