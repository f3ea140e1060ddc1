"""A plugin author's mistakes named where they are made (issue 37): ScalarOp expressions
checked when declared, plugin code that raises as ``kernel_failed`` naming the atom, its
plugin and the instruction, the CLI's contract for it, and short atom names in the builder."""
from __future__ import annotations

import json

import numpy as np
import pytest

import runtime
from runtime.cli import main
from runtime.plugins import diagnostics
from runtime.plugins.atomspec import AtomSpec, ScalarOp
from runtime.plugins.expressions import ExpressionError, check_text
from runtime.plugins.hookspecs import hookimpl
from runtime.plugins.kernel import plain_kernel
from runtime.plugins.registry import PluginInfo, Registry

REF = "formula-softsign/formula-atom-softsign@1"
X = np.linspace(-4, 4, 24, dtype=np.float32).reshape(3, 8)


def softsign_plugin(expr: str | None = "{0} / (1.0 + abs({0}))", raises: str = "", name: str = "softsign"):
    """A plugin object with one softsign atom; ``raises`` names the part of it that raises."""
    def infer(ctx):
        if raises == "infer":
            raise KeyError("mode")
        return ctx.output(ctx.operands[0].axes, ctx.operands[0].sizes)

    def kernel(backend):
        def factory(request):
            if raises == f"{backend} factory":
                raise RuntimeError("no factory today")

            def run(inputs, out):
                if raises == backend:
                    raise ValueError(f"{backend} kernel broke")
                x = np.asarray(inputs[0])
                out[...] = x / (1 + np.abs(x))
            return plain_kernel(run)
        return factory

    def check(node, arrays):
        if raises == "check":
            raise IndexError("list index out of range")
        if raises == "index_range":  # on purpose: it must pass untouched
            raise runtime.FormulaError("index_range", node.path, "softsign: index 9 outside the axis")

    kernels = {"reference": kernel("reference")}
    for backend in ("cpu", "cuda"):
        if raises.startswith(backend):
            kernels[backend] = kernel(backend)
    spec = AtomSpec(name=name, refs=(REF.replace("softsign", name),), inputs=("value",),
                    attributes=frozenset(), infer=infer, kernels=kernels,
                    check_values=check if raises in ("check", "index_range") else None,
                    checked_inputs=(0,) if raises in ("check", "index_range") else (),
                    elementwise=(lambda node: ScalarOp(expr)) if expr is not None else None, inplace=0)

    class Plugin:
        @hookimpl
        def formula_register_atoms(self, register):
            register(spec)
    return Plugin()


def registry_with(plugin) -> Registry:
    registry = Registry(autoload=False)
    registry.register(plugin, PluginInfo("formula_softsign", "formula-softsign", "0.1.0"))
    return registry


def program(registry, atom: str = "softsign"):
    """x[T, D=8] -> atom(x); its own domain, so that no readiness marker another test's program
    left in the kernel cache applies to it (a tiered run would then compile at once)."""
    b = runtime.ProgramBuilder(registry=registry, domain="plugin-failures")
    x = b.input("x", {"T": "T", "D": 8})
    y = b.op(atom, [x])
    return b.build(outputs=[y])


def run(registry, backend="cpu", tiered=False):
    return runtime.compile(program(registry), backend, registry, tiered=tiered).run(inputs={"x": X})


def assert_names_the_plugin(err: runtime.FormulaError, *parts: str):
    assert err.code == "kernel_failed" and err.path == "$.instructions[0]", err
    for part in (f"atom {REF}", "plugin formula_softsign (formula-softsign 0.1.0)", *parts):
        assert part in err.message, (part, err.message)


# --- 1. expressions checked when declared --------------------------------------------------
@pytest.mark.parametrize("expr, why", [
    ("{0} +* 1", "it is not a Python expression: invalid syntax"),
    ("float(str({0}))", "it calls str, which expressions may not use"),
    ("np.tanh({0})", "it uses np.tanh (use math.tanh), which expressions may not use"),
    ("{0} + {1}", "it refers to an operand the atom lacks (it has 1: {0} to {0})"),
    ("{0}.real", "it uses {0}.real, which expressions may not use"),
    ("{x} * 2", "its placeholders are not {0}, {1}…"),
    ("[{0}][0]", "it uses '[{0}][0]' (Subscript)"),
])
def test_a_refused_expression_is_the_plugins_problem_and_the_plans_error(expr, why):
    registry = registry_with(softsign_plugin(expr))
    (problem,) = registry.atom_problems["formula_softsign"]
    assert problem.startswith(f"atom {REF}: its ScalarOp expression {expr!r} is refused: ") and why in problem
    row = next(r for r in diagnostics.plugins_report(registry) if r["name"] == "formula_softsign")
    assert row["status"] == "loaded" and row["problems"] == [problem]
    text = diagnostics.format_plugins(diagnostics.plugins_report(registry))
    assert "  PROBLEM     atom formula-softsign" in text and "1 with problems" in text
    np.testing.assert_allclose(next(iter(run(registry, "reference").values())), X / (1 + np.abs(X)))
    for tiered in (False, True):  # tiered: the first run answers, before any background compile
        with pytest.raises(runtime.FormulaError) as err:
            run(registry, "cpu", tiered)
        assert_names_the_plugin(err.value, f"its ScalarOp expression {expr!r} is refused: ", why)


def test_an_expression_numba_cannot_type_is_refused_at_plan_time():
    registry = registry_with(softsign_plugin("({0} & {0})"))  # bitwise and of floats
    assert not registry.atom_problems  # Python accepts it: only Numba's typing refuses it
    why = "its ScalarOp expression '({0} & {0})' is refused: Numba cannot compile it for cpu on float32 operands"
    with pytest.raises(runtime.FormulaError) as err:
        run(registry, "cpu", tiered=False)
    assert_names_the_plugin(err.value, why)
    # tiered, the first result does not wait for Numba's typing: the background build types
    # it, and its refusal is the next run's error
    exe = runtime.compile(program(registry), "cpu", registry, tiered=True)
    assert exe.run(inputs={"x": X}).tier == "reference"
    with pytest.raises(runtime.FormulaError) as err:
        exe.wait_compiled()
    assert_names_the_plugin(err.value, why)
    with pytest.raises(runtime.FormulaError) as err:
        exe.run(inputs={"x": X})
    assert_names_the_plugin(err.value, why)


def test_the_allowed_symbols_cover_the_builtin_expressions():
    from atoms import elementwise

    for expr in [*elementwise.SCALAR_EXPRS_V2.values(), *elementwise.COMPARE_EXPRS.values(),
                 *elementwise.BOOLEAN_EXPRS.values(), "np.float32({0})", "(not {0})",
                 "max(min({0}, 6.0), 0.0) * round({0}) + math.pi", "({1} if {0} else {2})"]:
        check_text(expr, 3)
    with pytest.raises(ExpressionError, match="it uses the name 'os'"):
        check_text("os", 1)


# --- 2. plugin code that raises --------------------------------------------------------------
@pytest.mark.parametrize("raises, backend, what, cause", [
    ("reference", "reference", "its 'reference' kernel raised ValueError: reference kernel broke", ValueError),
    ("reference", "cpu", "its 'reference' kernel raised ValueError", ValueError),  # tiered: the first run
    ("cpu", "cpu", "its 'cpu' kernel raised ValueError: cpu kernel broke", ValueError),
    ("cpu factory", "cpu", "its 'cpu' kernel factory raised RuntimeError: no factory today", RuntimeError),
    ("check", "reference", "its value check (check_values) raised IndexError", IndexError),
    ("cuda", "cuda", "its 'cuda' kernel raised ValueError: cuda kernel broke", ValueError),
])
def test_plugin_code_that_raises_is_kernel_failed_with_its_cause(raises, backend, what, cause):
    registry = registry_with(softsign_plugin(None, raises))
    with pytest.raises(runtime.FormulaError) as err:
        run(registry, backend, tiered=backend == "cpu" and raises == "reference")
    assert_names_the_plugin(err.value, what)
    assert isinstance(err.value.__cause__, cause)


def test_infer_that_raises_is_named_at_load_time():
    registry = registry_with(softsign_plugin(None, "infer"))
    with pytest.raises(runtime.FormulaError) as err:
        program(registry)
    assert_names_the_plugin(err.value, "its infer raised KeyError: 'mode'")
    assert isinstance(err.value.__cause__, KeyError)


def test_a_formula_error_the_plugin_raises_on_purpose_is_kept():
    registry = registry_with(softsign_plugin(None, "index_range"))
    with pytest.raises(runtime.FormulaError) as err:
        run(registry, "reference")
    assert err.value.code == "index_range" and err.value.message == "softsign: index 9 outside the axis"


def test_a_background_compile_failure_reaches_the_next_run_named():
    registry = registry_with(softsign_plugin(None, "cpu"))
    exe = runtime.compile(program(registry), "cpu", registry, tiered=True)
    assert exe.run(inputs={"x": X}).tier == "reference"  # the cpu kernels compile meanwhile
    with pytest.raises(runtime.FormulaError) as err:
        exe.wait_compiled()
    assert_names_the_plugin(err.value, "its 'cpu' kernel raised ValueError: cpu kernel broke")
    with pytest.raises(runtime.FormulaError) as again:
        exe.run(inputs={"x": X})
    assert again.value.code == "kernel_failed" and again.value.message == err.value.message


def test_the_cli_keeps_its_contract_for_a_raising_kernel(tmp_path, capsys, register_plugin):
    register_plugin(softsign_plugin(None, "reference", name="softsign-cli"), name="formula_softsign",
                    distribution="formula-softsign")
    path = tmp_path / "p.json"
    path.write_text(json.dumps(program(None, "softsign-cli")))
    assert main(["run", str(path), "--random", "--dim", "T=3", "--backend", "reference"]) == 1
    err = capsys.readouterr().err
    assert err.startswith("error [kernel_failed] $.instructions[0]: atom formula-softsign-cli/"
                          "formula-atom-softsign-cli@1 of plugin formula_softsign (formula-softsign)")
    assert main(["run", str(path), "--random", "--dim", "T=3", "--backend", "reference", "--json"]) == 1
    doc = json.loads(capsys.readouterr().out)
    assert doc["ok"] is False and doc["error"]["code"] == "kernel_failed"
    assert doc["error"]["path"] == "$.instructions[0]" and "ValueError: reference kernel broke" in doc["error"]["message"]


# --- 3, 4. formula atoms, short names ----------------------------------------------------------
def test_formula_atoms_lists_the_fused_backends_and_whole_references():
    registry = registry_with(softsign_plugin())
    (row,) = [r for r in diagnostics.atoms_table(registry) if r["reference"] == REF]
    assert row["backends"] == ["reference", "cpu", "cuda"] and row["fused_backends"] == ["cpu", "cuda"]
    text = diagnostics.format_atoms(diagnostics.atoms_table(registry))
    lines = text.splitlines()
    k = next(k for k, line in enumerate(lines) if line.startswith(REF))
    assert lines[k].split() == [REF, "softsign", "formula-softsign"]  # whole, the backends below
    assert lines[k + 1] == "    runs on reference, cpu (fused), cuda (fused)"
    assert max(map(len, lines)) <= 100


def test_a_short_name_two_plugins_register_asks_for_the_whole_reference():
    registry = registry_with(softsign_plugin())
    other_spec = AtomSpec(name="softsign", refs=("acme/formula-atom-softsign@1",), inputs=("value",),
                          attributes=frozenset(), infer=lambda ctx: ctx.operands[0])

    class Acme:
        @hookimpl
        def formula_register_atoms(self, register):
            register(other_spec)
    registry.register(Acme(), PluginInfo("acme", "acme-atoms", "1.0"))
    with pytest.raises(runtime.FormulaError) as err:
        program(registry)
    assert err.value.code == "unknown_atom"
    assert f"registered by several plugins: acme/formula-atom-softsign@1, {REF}" in err.value.message


def test_short_names_resolve_against_every_plugins_atoms():
    registry = registry_with(softsign_plugin())
    assert program(registry)["instructions"][0]["atom_ref"] == REF
    b = runtime.ProgramBuilder(registry=registry)
    x = b.input("x", {"D": 8})
    with pytest.raises(runtime.FormulaError) as err:
        b.op("sofsign", [x])
    assert err.value.code == "unknown_atom" and err.value.path == "$.instructions[0].atom_ref"
    assert "(did you mean 'softsign'?)" in err.value.message
    assert b.op("scale", [x, x], {"factor_axes": ["D"], "accumulation_dtype": "activation"})  # built-ins first


def test_an_expression_is_parsed_once_and_refused_every_time(monkeypatch):
    """A plan checks its expressions again at every new extent: the checks are remembered,
    refusals are not (each plan that holds a broken expression must fail)."""
    import ast

    from runtime.plugins import expressions

    parsed = []
    real = ast.parse
    monkeypatch.setattr(expressions.ast, "parse", lambda *a, **k: parsed.append(a[0]) or real(*a, **k))
    good, bad = "{0} * 0.73125 + {1}", "{0} +* 0.73125"
    assert expressions.check_text(good, 2) == expressions.check_text(good, 2) == "_x0 * 0.73125 + _x1"
    assert parsed.count("_x0 * 0.73125 + _x1") <= 1
    for _ in range(2):
        with pytest.raises(expressions.ExpressionError, match="not a Python expression"):
            expressions.check_text(bad, 1)
    assert parsed.count("_x0 +* 0.73125") == 2
    with pytest.raises(expressions.ExpressionError, match="not a string"):
        expressions.check_text(["{0}"], 1)  # (unhashable: refused before the memo)
