"""``ScalarOp`` expressions checked where they are declared, not where a kernel compiles them.

An elementwise atom's expression becomes a line of generated Numba code on the fusing
backends. A broken one used to surface as a SyntaxError in a generated file, or a bare Numba
error, in the background compilation of some later run. Here it is checked when its plugin
registers (:func:`probe`, for expressions that do not depend on the instruction) and when a
plan uses it (:func:`scalar_op`), before any run:

1. the placeholders ``{0}``, ``{1}``… name operands the atom has;
2. the text is one Python expression (``compile``);
3. it uses only :data:`ALLOWED` symbols (an AST walk: no other names, attributes, subscripts,
   lambdas, comprehensions or strings);
4. Numba types it for the operands' dtypes when the plan's kernels are built (type inference
   only, no code generation: about a millisecond, once per expression and dtypes in a process,
   after Numba's typing has started).

A failure is ``kernel_failed`` naming the atom, its plugin, the expression and the instruction.
"""
from __future__ import annotations

import ast
import contextlib
import contextvars
import functools
import math
import re
import threading
from collections.abc import Sequence

from runtime.core.errors import FormulaError
from runtime.plugins.atomspec import AtomSpec, Node, ScalarOp
from runtime.plugins.failures import kernel_failed

BUILTINS = ("abs", "min", "max", "float", "int", "bool", "round")
NP_CASTS = ("float32", "float64", "int8", "int16", "int32", "int64", "uint8", "uint16", "uint32",
            "uint64", "bool_")
MATH = tuple(sorted(name for name in dir(math) if not name.startswith("_")))
ALLOWED = ("{0}, {1}… (one element of each operand), number and boolean literals, arithmetic, "
           "comparison, boolean and conditional (x if c else y) operators, the built-ins "
           f"{', '.join(BUILTINS)}, math.* (e.g. math.exp, math.tanh, math.inf) and the NumPy "
           "scalar casts np.float32, np.float64, np.int8…np.int64, np.uint8…np.uint64 and np.bool_")
_NODES = (ast.Expression, ast.BinOp, ast.UnaryOp, ast.BoolOp, ast.Compare, ast.IfExp, ast.Call,
          ast.Name, ast.Attribute, ast.Constant, ast.operator, ast.unaryop, ast.boolop, ast.cmpop,
          ast.expr_context)
# what a ScalarOp's ``cpu`` expression may call besides: the helpers runtime.kernels.vmath binds
CPU_HELPERS = ("_vexp", "_verf", "_vtanh", "_vgelu", "_vgelu_grad", "_vlog", "_vlog1p")
NUMBA_TYPES = ("float32", "float64", "int64", "boolean")  # the fusing backends' scalar types


class ExpressionError(ValueError):
    """Why an expression is refused (its ``__cause__``: Numba's or the parser's error)."""


def placeholders(arity: int) -> list[str]:
    return [f"_x{k}" for k in range(arity)]


def check_text(expr: object, arity: int, helpers: tuple[str, ...] = ()) -> str:
    """The expression with its placeholders filled, or ExpressionError saying what is wrong
    (``helpers``: functions it may call besides the built-ins, as a ScalarOp's ``cpu``)."""
    if not isinstance(expr, str):
        raise ExpressionError(f"its expression is {type(expr).__name__}, not a string")
    return _checked(expr, arity, tuple(helpers))


@functools.lru_cache(maxsize=4096)
def _checked(expr: str, arity: int, helpers: tuple[str, ...]) -> str:
    """check_text's work, once per expression (a plan checks each again at every new extent;
    refusals raise again, since lru_cache keeps only results)."""
    try:
        text = expr.format(*placeholders(arity))
    except IndexError:
        raise ExpressionError(f"it refers to an operand the atom lacks (it has {arity}: "
                              f"{{0}} to {{{arity - 1}}})") from None
    except (KeyError, ValueError) as exc:
        raise ExpressionError(f"its placeholders are not {{0}}, {{1}}… ({type(exc).__name__}: {exc}); "
                              "write a literal brace as {{ or }}") from None
    if "\n" in text or "\r" in text:  # (it becomes one line of generated code)
        raise ExpressionError("it spans lines; write it on one line")
    try:
        tree = ast.parse(text.strip(), mode="eval")
        compile(tree, "<ScalarOp>", "eval")
    except SyntaxError as exc:
        raise ExpressionError(f"it is not a Python expression: {exc.msg}") from exc
    for node in ast.walk(tree):
        _check_node(node, set(placeholders(arity)), helpers)
    return text


def _show(node: ast.AST) -> str:
    """Source of ``node`` with the placeholders as written: ``{0}``, not ``_x0``."""
    return re.sub(r"\b_x(\d+)\b", r"{\1}", ast.unparse(node))


def _check_node(node: ast.AST, operands: set[str], helpers: tuple[str, ...] = ()) -> None:
    if not isinstance(node, _NODES):
        what = _show(node) if isinstance(node, ast.expr) else type(node).__name__
        raise ExpressionError(f"it uses {what!r} ({type(node).__name__}); expressions may use {ALLOWED}")
    if isinstance(node, ast.Constant) and not isinstance(node.value, (int, float, bool)):
        raise ExpressionError(f"it uses the constant {node.value!r}; only numbers and booleans "
                              f"are allowed")
    if isinstance(node, ast.Call):
        if node.keywords or any(isinstance(a, ast.Starred) for a in node.args):
            raise ExpressionError(f"{_show(node)}: calls take positional arguments only")
        func = node.func
        if not (isinstance(func, ast.Name) and func.id in BUILTINS + helpers or isinstance(func, ast.Attribute)):
            raise ExpressionError(f"it calls {_show(func)}, which expressions may not use; "
                                  f"they may use {ALLOWED}")
    if isinstance(node, ast.Attribute):
        owner = node.value.id if isinstance(node.value, ast.Name) else None
        if owner == "math" and node.attr in MATH or owner == "np" and node.attr in NP_CASTS:
            return
        instead = f" (use math.{node.attr})" if owner == "np" and node.attr in MATH else ""
        raise ExpressionError(f"it uses {_show(node)}{instead}, which expressions may not use; "
                              f"they may use {ALLOWED}")
    # (a bare ``math`` or ``np``, outside an attribute, is refused by Numba's typing)
    if isinstance(node, ast.Name) and node.id not in operands | set(BUILTINS) | set(helpers) | {"math", "np"}:
        raise ExpressionError(f"it uses the name {node.id!r}, which expressions may not use; "
                              f"they may use {ALLOWED}")


_typed: dict[tuple, str | None] = {}  # (text, dtypes, backend) -> None or why Numba refuses it
_typed_lock = threading.Lock()
# on while a plan's kernels are built (runtime.execution.executor): Numba's typing takes ~0.5 s
# to start in a process, which a compile pays anyway but a plan report (formula plan, the CLI's
# preflight) or a tiered first run must not
_typing: contextvars.ContextVar[bool] = contextvars.ContextVar("formula_expression_typing", default=False)


@contextlib.contextmanager
def numba_typing():
    """Within it, :func:`scalar_op` also types expressions with Numba (else: placeholders,
    syntax and symbols only)."""
    token = _typing.set(True)
    try:
        yield
    finally:
        _typing.reset(token)


def check_types(text: str, dtypes: Sequence[str], backend: str) -> None:
    """ExpressionError when Numba cannot type ``text`` (placeholders filled) for operands of
    ``dtypes`` on ``backend``; dtypes the fusing backends do not compute in are not checked."""
    if not all(d in NUMBA_TYPES for d in dtypes):
        return
    key = (text, tuple(dtypes), backend)
    with _typed_lock:
        known = _typed.get(key, ...)
    if known is ...:
        known = _numba_refusal(text, dtypes, backend)
        with _typed_lock:
            _typed[key] = known
    if known is not None:
        raise ExpressionError(f"Numba cannot compile it for {backend} on "
                              f"{', '.join(dtypes) or 'no'} operands: {known}")


def _numba_refusal(text: str, dtypes: Sequence[str], backend: str) -> str | None:
    import numpy as np
    import numba
    from numba.core import compiler, typed_passes
    from numba.core.compiler_lock import global_compiler_lock

    namespace = {"math": math, "np": np}
    args = ", ".join(placeholders(len(dtypes)))
    exec(f"def _scalar_op({args}):\n    return {text.strip()}\n", namespace)  # noqa: S102 (checked above)
    try:
        with global_compiler_lock:  # (Numba's contexts are shared with compiles in other threads)
            context = _typing_context()
            interp = compiler.run_frontend(namespace["_scalar_op"])
            types = tuple(getattr(numba, d) for d in dtypes)
            typed_passes.type_inference_stage(context.typing_context, context.target_context, interp,
                                              types, None)
    except Exception as exc:  # Numba's TypingError and friends
        lines = [line.strip() for line in str(exc).splitlines() if line.strip()]
        return " ".join(lines[:2]) if lines else type(exc).__name__
    return None


def _typing_context():
    """The CPU target's contexts, for every backend: the CUDA simulator runs Python, and what a
    real GPU's device functions lack beyond the CPU's fails in the compile, still named."""
    from numba.core.registry import cpu_target

    cpu_target.typing_context.refresh()
    cpu_target.target_context.refresh()
    return cpu_target


def scalar_op(node: Node, backend: str) -> ScalarOp | None:
    """``node``'s scalar form for ``backend`` (None: not fusable), its expression checked (and
    typed by Numba within :func:`numba_typing`)."""
    spec = node.atom
    try:
        op = spec.elementwise(node)
    except FormulaError:
        raise
    except Exception as exc:
        raise kernel_failed(spec, node.path, "elementwise(node)", exc) from exc
    if op is None:
        return None
    try:
        if not isinstance(op, ScalarOp):
            raise ExpressionError(f"elementwise(node) returned {type(op).__name__}, not a ScalarOp")
        text = check_text(op.expr, len(node.input_types))
        if op.cpu is not None:
            check_text(op.cpu, len(node.input_types), CPU_HELPERS)
        if _typing.get():
            check_types(text, [t.dtype for t in node.input_types], backend)
    except ExpressionError as exc:
        raise expression_failed(spec, node.path, op, exc) from exc.__cause__
    return op


def expression_failed(spec: AtomSpec, path: str, op: object, exc: ExpressionError) -> FormulaError:
    expr = getattr(op, "expr", op)
    return kernel_failed(spec, path, f"ScalarOp expression {expr!r}", detail=f"is refused: {exc}")


def probe(spec: AtomSpec) -> str | None:
    """At registration: why the expression of ``spec`` is refused, for an expression that does
    not depend on the instruction (``elementwise`` called on a float32 node without
    attributes), else None. An ``elementwise`` that needs attributes raises here; it is
    checked when a plan uses it."""
    if spec.elementwise is None:
        return None
    from runtime.core.types import TensorType

    t = TensorType(("n",), (1,), "float32", "anonymous")
    node = Node(0, "probe", spec, {}, tuple(f"in{k}" for k in range(len(spec.inputs))), "%probe",
                tuple(t for _ in spec.inputs), t, "$")
    try:
        op = spec.elementwise(node)
    except Exception:  # it reads attributes or types the probe lacks
        return None
    if op is None:
        return None
    try:
        if not isinstance(op, ScalarOp):
            raise ExpressionError(f"elementwise(node) returned {type(op).__name__}, not a ScalarOp")
        check_text(op.expr, len(spec.inputs))
        if op.cpu is not None:
            check_text(op.cpu, len(spec.inputs), CPU_HELPERS)
    except ExpressionError as exc:
        return f"its ScalarOp expression {getattr(op, 'expr', op)!r} is refused: {exc}"
    return None
