"""What a plugin declares about an atom: contract, type inference, kernels, fusion traits.

The core knows no atom by name. Everything it needs to validate, plan, fuse and run an
instruction comes from the ``AtomSpec`` a plugin registers under one or more references.
"""
from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

import attrs

from runtime.core.errors import FormulaError, fail, json_kind as _json_kind
from runtime.core.types import Size, TensorType, dtypes_compatible, extents_compatible

from runtime.plugins.kernel import Kernel, KernelRequest

# backend name -> factory(request) -> Kernel (runtime.plugins.kernel: the one kernel contract).
# The kernel's operands are host NumPy arrays for "reference"/"cpu", device arrays for "cuda";
# ``out`` is a preallocated array of the output type to fill. A kernel never writes its inputs
# (unless the planner aliased ``out`` to an operand ``AtomSpec.inplace`` names).
KernelFactory = Callable[[KernelRequest], Kernel]


@attrs.frozen
class ScalarOp:
    """An elementwise atom as a scalar expression, so the planner can fuse chains of them.

    ``expr`` is a Python expression over ``{0}``, ``{1}``… (the node's operands, one element
    each, already broadcast to the output) valid in plain Python, ``numba.njit`` and
    ``numba.cuda.jit`` device code; ``math`` and ``np`` (NumPy, for scalar casts such as
    ``np.float32(x)``) are in scope. Placeholders are always plain names. The result may be
    of another dtype than the operands (a comparison gives a boolean).

    ``cpu``: optionally, the same function written for generated CPU kernels, where the
    vectorisable helpers ``_vexp``, ``_verf``, ``_vtanh``, ``_vlog``, ``_vlog1p`` (``math.exp``,
    ``math.erf``, ``math.tanh``, ``math.log``, ``math.log1p`` as plain arithmetic that LLVM
    vectorises, runtime.kernels.vmath) and ``_vgelu`` (``0.5·x·(1 + erf(x/√2))``) are in scope
    besides what ``expr`` may use; e.g. ``ScalarOp("math.tanh({0})", cpu="_vtanh({0})")``.
    Without it the CPU kernels evaluate ``expr`` (libm's scalar calls keep a loop scalar).
    """

    expr: str
    cpu: str | None = None


@attrs.frozen
class AtomSpec:
    name: str
    refs: tuple[str, ...]  # every reference this atom answers to (versioned ref first)
    inputs: tuple[str, ...]  # operand names, in instruction order
    attributes: frozenset[str]  # the exact attribute key set
    infer: Callable[["InferContext"], TensorType]  # validates and returns the output type
    kernels: Mapping[str, KernelFactory] = attrs.field(factory=dict)
    # host-side value checks (index_range, duplicate_index) run before the node's kernel;
    # ``checked_inputs`` names the operand positions they read (the CUDA backend copies only those).
    check_values: Callable[["Node", Sequence[Any]], None] | None = None
    checked_inputs: tuple[int, ...] = ()
    elementwise: Callable[["Node"], ScalarOp] | None = None  # fusable as an epilogue
    # backends whose kernel takes an epilogue (``KernelRequest.epilogue``): the planner fuses
    # elementwise successors into it, applied before each store
    anchors: frozenset[str] = attrs.field(default=frozenset(), converter=frozenset)
    # operand whose buffer the output may reuse (or several, in order of preference: add's
    # two operands of one type; the planner takes the first that is a temporary read last)
    inplace: int | tuple[int, ...] | None = None
    # the output is operand 0's memory read in C order under another shape (a C-order
    # reshape): on a fusing backend the planner makes such an output of a temporary operand
    # an alias of that operand's buffer, and no kernel runs for it
    view: bool = False
    # backends whose kernels take float16/bfloat16 operands as they are (data movement by item
    # size: gather, window, layout copies, cast). On the other fusing backends the planner
    # widens half operands to float32 temporaries, runs the float32 kernel and rounds the output
    # to the half dtype once (SPEC §3b.1), the temporaries counted in the working bytes (§3b.3.7).
    half_native: frozenset[str] = frozenset()
    # bytes of scratch a kernel holds beyond the arena slots, per backend (``scratch_bytes(node,
    # backend)``): the §5 preflight counts the largest of them in the working set (§3b.3 item 7)
    scratch_bytes: Callable[["Node", str], int] | None = None
    # the output axes the atom maps position by position (``free_axes(node)``, axis names): the
    # output at position i of such an axis reads every operand that has an axis of that name
    # only at position i (or at 0 where the operand has extent 1 there: broadcast), and never
    # depends on i itself. The planner may then run the program in slices along it
    # (runtime.plan.freeaxes). None: no axis is free (the default for plugin atoms).
    free_axes: Callable[["Node"], frozenset[str]] | None = None
    summary: str = ""
    # what the atom computes, for planner rewrites that recognise a pattern across atoms
    # (runtime.plan.attention): "contraction" (contract's reduce_axes/output_axes semantics),
    # "masked-softmax" (an ``axis`` attribute, operands logits and mask), "broadcast" (one
    # operand, its axes among the output's, each of the output's extent or 1, its values
    # repeated along the rest: runtime.plan.grouping lets an elementwise reader read it
    # directly). None: no rewrite looks at it. An atom declaring a role promises those semantics exactly.
    role: str | None = None
    # operand name -> the dtype class it accepts (runtime.core.types.DTYPE_CLASSES, "a|b" for
    # either), shown by ``formula atoms``; ``infer`` is what enforces it
    dtypes: Mapping[str, str] = attrs.field(factory=dict)
    # the gradient rule (SPEC §3c): ``vjp(ctx) -> {operand position: slot}`` emits atoms
    # through ``ctx`` (runtime.autodiff.VjpContext) for the operands ``ctx.wants``; operands
    # left out receive nothing. ``differentiable`` lists the operand positions it can serve:
    # an active floating operand outside it is ``not_differentiable``. A plugin may give the
    # rule of another plugin's atom through the ``formula_register_vjps`` hook instead.
    vjp: Callable[[Any], Mapping[int, str]] | None = None
    differentiable: tuple[int, ...] = ()
    # how the output is linear in its operands (``linear(node)`` -> ``Linear`` or None), so that
    # a chunked run may add the slices' results of sums over a free axis (runtime.plan.freeaxes).
    # None: not linear (the default for plugin atoms).
    linear: Callable[["Node"], "Linear | None"] | None = None
    # operand positions whose types alone the atom reads, never a value (fill's reference): an
    # axis of theirs the output lacks ties no free symbol (runtime.plan.freeaxes)
    types_only: tuple[int, ...] = ()

    @property
    def ref(self) -> str:
        return self.refs[0]


@attrs.frozen
class Linear:
    """How an atom's output is linear in its operands (``AtomSpec.linear``).

    ``operands``: the positions it is linear in, every other operand held fixed (none: the
    output is 0, a fill of 0). ``jointly``: linear in them together, f(a + a', b + b') =
    f(a, b) + f(a', b') (add, layout moves, a sum), else in each one alone with the others
    fixed (contract, scale). ``sums``: the output's summation indices, each the (operand
    position, axis) pairs it runs along together; the output is the sum over them of terms
    that read every operand carrying them at that index only (contract's reduce pairs, a
    sum-reduction's axis), plus, when ``jointly``, a linear function of the ``operands`` that
    carry none of them (scatter-add's base)."""

    operands: tuple[int, ...]
    jointly: bool
    sums: tuple[tuple[tuple[int, str], ...], ...] = ()


@attrs.frozen
class Node:
    """An instruction with every type resolved for one set of symbol extents."""

    index: int
    instruction_id: str
    atom: AtomSpec
    attributes: Mapping[str, Any]
    input_slots: tuple[str, ...]
    output_slot: str
    input_types: tuple[TensorType, ...]
    output_type: TensorType
    path: str  # JSON path of the instruction, for errors raised while running it
    # when this node runs one slice of a chunked run (runtime.plan.freeaxes): the instruction
    # resolved for the whole run's extents. A kernel that picks its algorithm by extents picks
    # it by the whole's, so that every slice computes each element as the whole run would.
    whole: "Node | None" = None
    # the operands' types as the program declares them (sizes may be symbols): what stays fixed
    # for every extent. Empty for nodes the planner inserts: every extent counts as variable.
    declared_inputs: tuple[TensorType, ...] = ()


class InferContext:
    """Everything an atom's ``infer`` may look at, plus helpers that raise with the right path.

    At load time operand sizes may be symbols and dtypes 'floating'; when a program is planned
    for concrete extents ``infer`` runs again on resolved types, with ``dims`` the symbol table.
    """

    def __init__(self, atom: AtomSpec, path: str, attributes: Mapping[str, Any],
                 operands: Sequence[TensorType], operand_slots: Sequence[str],
                 dims: Mapping[str, int] | None = None, planning: bool = False):
        self.planning = planning  # True when operands are resolved for one run's extents
        self.atom = atom
        self.path = path
        self.attributes = attributes
        self.operands = tuple(operands)
        self.operand_slots = tuple(operand_slots)
        self.dims = dict(dims or {})

    # --- attributes -------------------------------------------------------------------
    def attr_path(self, key: str) -> str:
        return f"{self.path}.attributes.{key}"

    def bad_attr(self, key: str, message: str):
        fail("atom_attributes", self.attr_path(key), f"{self.atom.name}: {message}")

    def mismatch(self, message: str, operand: int | None = None):
        path = self.path if operand is None else f"{self.path}.input_slots[{operand}]"
        fail("type_mismatch", path, f"{self.atom.name}: {message}")

    def attr_str(self, key: str, choices: Sequence[str] | None = None) -> str:
        v = self.attributes[key]
        if not isinstance(v, str):
            self.bad_attr(key, f"expected a string, got {_json_kind(v)}")
        if choices is not None and v not in choices:
            self.bad_attr(key, f"{v!r} is not one of {', '.join(map(repr, choices))}")
        return v

    def attr_int(self, key: str, minimum: int | None = None, nullable: bool = False) -> int | None:
        v = self.attributes[key]
        if v is None and nullable:
            return None
        if isinstance(v, bool) or not isinstance(v, int):
            self.bad_attr(key, f"expected an integer, got {_json_kind(v)}")
        if minimum is not None and v < minimum:
            self.bad_attr(key, f"expected an integer >= {minimum}, got {v}")
        return v

    def attr_number(self, key: str, minimum_exclusive: float | None = None) -> float:
        v = self.attributes[key]
        if isinstance(v, bool) or not isinstance(v, (int, float)):
            self.bad_attr(key, f"expected a number, got {_json_kind(v)}")
        if minimum_exclusive is not None and not v > minimum_exclusive:
            self.bad_attr(key, f"expected a number > {minimum_exclusive}, got {v}")
        return float(v)

    def attr_axes(self, key: str, unique: bool = True) -> tuple[str, ...]:
        v = self.attributes[key]
        if not isinstance(v, list) or not all(isinstance(a, str) for a in v):
            self.bad_attr(key, f"expected a list of axis names, got {_json_kind(v)}")
        if unique and len(set(v)) != len(v):
            self.bad_attr(key, f"axes repeat in {v}")
        return tuple(v)

    def accumulation(self, key: str = "accumulation_dtype") -> str:
        return self.attr_str(key, ("activation", "float32"))

    def axis_of(self, key: str, operand: int, value: Any = None) -> str:
        """An attribute naming an axis of operand ``operand``."""
        axis = self.attributes[key] if value is None else value
        if not isinstance(axis, str):
            self.bad_attr(key, f"expected an axis name, got {_json_kind(axis)}")
        t = self.operands[operand]
        if axis not in t.axes:
            self.bad_attr(key, f"{self.atom.inputs[operand]} has no axis {axis!r} (axes {list(t.axes)})")
        return axis

    # --- operand checks ---------------------------------------------------------------
    def require_dtype(self, operand: int, allowed: Sequence[str] | str, what: str = ""):
        t = self.operands[operand]
        if isinstance(allowed, str):
            ok = dtypes_compatible(t.dtype, allowed) if allowed != "floating" else _is_floating(t.dtype)
            want = allowed
        else:
            ok = t.dtype in allowed
            want = " or ".join(allowed)
        if not ok:
            self.mismatch(f"{self.atom.inputs[operand]} must be {want}{what}, got {t.dtype}", operand)

    def require_same_dtype_domain(self, a: int, b: int):
        ta, tb = self.operands[a], self.operands[b]
        if not dtypes_compatible(ta.dtype, tb.dtype):
            self.mismatch(f"{self.atom.inputs[a]} is {ta.dtype} but {self.atom.inputs[b]} is {tb.dtype}", b)
        if ta.domain != tb.domain:
            self.mismatch(f"{self.atom.inputs[a]} is in domain {ta.domain!r} but "
                          f"{self.atom.inputs[b]} is in {tb.domain!r}", b)

    def require_extent(self, a: Size, b: Size, what: str, operand: int | None = None):
        if not extents_compatible(a, b):
            self.mismatch(f"{what}: extents {a} and {b} differ", operand)

    def output(self, axes: Sequence[str], sizes: Sequence[Size], like: int = 0,
               dtype: str | None = None) -> TensorType:
        t = self.operands[like]
        return TensorType(tuple(axes), tuple(sizes), dtype or t.dtype, t.domain, t.schema_ref)


def every_axis(node: "Node") -> frozenset[str]:
    """``free_axes`` of an atom that maps every output axis position by position (elementwise)."""
    return frozenset(node.output_type.axes)


def no_axis(node: "Node") -> frozenset[str]:
    """``free_axes`` of an atom whose values depend on positions themselves (axis-index)."""
    return frozenset()


def axes_except(*keys: str) -> Callable[["Node"], frozenset[str]]:
    """``free_axes``: every output axis but those the attributes ``keys`` name (the axis an atom
    reduces, normalises, slices or indexes along)."""
    def free(node: "Node") -> frozenset[str]:
        return frozenset(node.output_type.axes) - {node.attributes[k] for k in keys}
    return free


def linear_in(*operands: int, jointly: bool = True) -> Callable[["Node"], Linear]:
    """``linear`` of an atom linear in ``operands`` whatever its attributes (add, layout moves)."""
    form = Linear(tuple(operands), jointly)
    return lambda node: form


def _is_floating(dtype: str) -> bool:
    from runtime.core.types import is_float

    return is_float(dtype)


__all__ = ["AtomSpec", "ScalarOp", "Linear", "Node", "InferContext", "FormulaError", "KernelFactory",
           "Kernel", "KernelRequest", "every_axis", "axes_except", "no_axis", "linear_in"]


def bind_node(spec: AtomSpec, attributes: Mapping[str, Any], input_types: Sequence[TensorType],
              dims: Mapping[str, int] | None = None, instruction_id: str = "i0",
              index: int = 0) -> Node:
    """Run ``infer`` on resolved types and return the Node a kernel factory receives.

    Used by the planner, and by atom tests that drive kernels without a whole program."""
    path = f"$.instructions[{index}]"
    slots = tuple(f"in{k}" for k in range(len(input_types)))
    ctx = InferContext(spec, path, attributes, input_types, slots, dims, planning=True)
    out = spec.infer(ctx)
    return Node(index, instruction_id, spec, attributes, slots, f"%{instruction_id}",
                tuple(input_types), out, path)


def inplace_operands(spec: "AtomSpec") -> tuple[int, ...]:
    """The operand positions whose buffer ``spec``'s output may reuse, in order of preference."""
    if spec.inplace is None:
        return ()
    return (spec.inplace,) if isinstance(spec.inplace, int) else tuple(spec.inplace)
