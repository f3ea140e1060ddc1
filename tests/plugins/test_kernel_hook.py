"""Kernels registered per (atom, backend) by a plugin that does not own the atom, and hooks
called through pluggy (so a wrapper or pluggy's tracing sees every registration)."""
from __future__ import annotations

import numpy as np
import pytest

import runtime
from runtime.plugins import diagnostics
from runtime.core.errors import FormulaError
from runtime.plugins.hookspecs import hookimpl
from runtime.plugins.kernel import plain_kernel
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
        def factory(request):
            def run(inputs, out):
                TwiceReduce.calls += 1
                out[...] = 2 * inputs[0].sum(axis=1)
            return plain_kernel(run)
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
    assert reg.kernel_owner(spec, "cpu").name == "TwiceReduce"
    assert reg.kernel_owner(spec, "reference") is None
    bad = x.copy()
    bad[1, 2] = np.nan  # the plugin's kernel counts nothing: the run checks x itself
    with pytest.raises(FormulaError) as err:
        runtime.execute(prog, inputs={"x": bad}, backend="cpu", registry=reg)
    assert err.value.code == "nonfinite" and err.value.path == "$.inputs.x"


def test_a_kernel_registered_without_anchors_takes_no_epilogue():
    contract = "arti/formula-atom-contract@1"

    class PlainContract:
        @hookimpl
        def formula_register_kernels(self, register):
            def factory(request):
                assert request.epilogue is None  # the planner fuses nothing into it
                return plain_kernel(lambda inputs, out: np.matmul(inputs[0], inputs[1].T, out=out))
            register(contract, "cpu", kernel=factory)

    reg = Registry(autoload=False)
    assert "cpu" in reg.atom(contract, "$").anchors
    reg.register(PlainContract(), None)
    assert "cpu" not in reg.atom(contract, "$").anchors and "cuda" in reg.atom(contract, "$").anchors
    b = ProgramBuilder()
    x, w = b.input("x", {"T": 2, "D": 3}), b.input("w", {"R": 4, "D": 3})
    y = b.op("contract", [x, w], {"reduce_axes": [["D", "D"]], "output_axes": ["T", "R"],
                                  "accumulation_dtype": "activation"})
    z = b.op("scalar-map", [y], {"mode": "relu"})
    prog = b.build(outputs=[z])
    xv, wv = np.arange(6, dtype=np.float32).reshape(2, 3) - 2, np.ones((4, 3), np.float32)
    got = runtime.execute(prog, inputs={"x": xv, "w": wv}, backend="cpu", registry=reg)
    np.testing.assert_allclose(next(iter(got.values())), np.maximum(xv @ wv.T, 0))


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
