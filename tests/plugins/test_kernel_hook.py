"""Kernels registered per (atom, backend) by a plugin that does not own the atom, and hooks
called through pluggy (so a wrapper or pluggy's tracing sees every registration)."""
from __future__ import annotations

import numpy as np
import pytest

import runtime
from runtime.plugins import diagnostics
from runtime.core.errors import FormulaError
from runtime.plugins.hookspecs import hookimpl
from runtime.plugins.registry import Registry
from runtime.testing import ProgramBuilder

ADD = "arti/formula-atom-add@1"
REDUCE = "arti/formula-atom-reduce@1"


def _registry() -> Registry:
    return Registry(autoload=False)


def _reduce_program():
    b = ProgramBuilder()
    x = b.input("x", {"R": 3, "C": 4})
    y = b.op("reduce", [x], {"axis": "C", "mode": "sum", "accumulation_dtype": "activation"})
    return b.build(outputs=[y])


class TwiceReduce:
    """A 'cpu' kernel for the built-in reduce that doubles the sum: visibly not the built-in."""

    calls = 0

    @hookimpl
    def formula_register_kernels(self, register):
        def factory(node):
            def run(inputs, out):
                TwiceReduce.calls += 1
                out[...] = 2 * inputs[0].sum(axis=1)
            return run
        register(REDUCE, "cpu", kernel=factory)


def test_a_plugin_kernel_replaces_the_atoms_own_on_that_backend_only():
    reg = _registry()
    reg.register(TwiceReduce(), None)
    x = np.arange(12, dtype=np.float32).reshape(3, 4)
    prog = _reduce_program()
    got = runtime.execute(prog, inputs={"x": x}, backend="cpu", registry=reg)
    out = next(iter(got.values()))
    np.testing.assert_allclose(out, 2 * x.sum(axis=1))
    assert TwiceReduce.calls >= 1
    ref = runtime.execute(prog, inputs={"x": x}, backend="reference", registry=reg)
    np.testing.assert_allclose(next(iter(ref.values())), x.sum(axis=1))  # reference untouched
    spec = reg.atom(REDUCE, "$")
    assert "cpu" not in spec.kernel_counts_nonfinite  # the built-in's counting went with it
    assert reg.kernel_owner(spec, "cpu").name == "TwiceReduce"
    assert reg.kernel_owner(spec, "reference") is None


def test_registered_kernels_are_reported_and_go_with_their_plugin():
    reg = _registry()
    reg.register(TwiceReduce(), None)
    row = next(r for r in diagnostics.plugins_report(reg) if r["name"] == "TwiceReduce")
    assert row["registered_kernels"] == [f"{REDUCE} on cpu"]
    assert "formula_register_kernels" in row["hooks"]
    text = diagnostics.format_plugins(diagnostics.plugins_report(reg))
    assert f"  gives       kernels for {REDUCE} on cpu" in text
    reg.unregister("TwiceReduce")
    assert reg.kernel_owner(reg.atom(REDUCE, "$"), "cpu") is None
    assert "cpu" in reg.atom(REDUCE, "$").kernel_counts_nonfinite


def test_two_plugins_giving_one_pair_is_a_conflict_naming_both():
    reg = _registry()
    reg.register(TwiceReduce(), None)

    class Other:
        @hookimpl
        def formula_register_kernels(self, register):
            register(REDUCE, "cpu", kernel=lambda node: None)

    with pytest.raises(FormulaError) as err:
        reg.register(Other(), None)
    assert err.value.code == "plugin_conflict"
    assert "TwiceReduce" in err.value.message and "Other" in err.value.message


@pytest.mark.parametrize("args, match", [
    (("not a ref", "cpu"), "malformed atom reference"),
    ((ADD, ""), "not a backend name"),
    ((ADD, "cpu"), "no kernel"),
])
def test_malformed_kernel_registrations_are_plugin_errors(args, match):
    reg = _registry()

    class Bad:
        @hookimpl
        def formula_register_kernels(self, register):
            register(*args)

    with pytest.raises(FormulaError, match=match) as err:
        reg.register(Bad(), None)
    assert err.value.code == "plugin_error"


def test_registration_hooks_go_through_pluggy():
    reg = Registry(autoload=False, builtins=())
    seen = []
    reg.pm.add_hookcall_monitoring(lambda name, impls, kwargs: seen.append(name),
                                   lambda outcome, name, impls, kwargs: None)
    reg.register(TwiceReduce(), None)
    assert {"formula_register_atoms", "formula_register_backends",
            "formula_register_kernels"} <= set(seen)
