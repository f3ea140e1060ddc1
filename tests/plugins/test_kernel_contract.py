"""The one kernel contract (runtime.plugins.kernel): requests in, Kernels out, and what the
executor does with a kernel's ``counts``."""
from __future__ import annotations

import numpy as np
import pytest

import runtime
from runtime.core.errors import FormulaError
from runtime.plugins.atomspec import AtomSpec
from runtime.plugins.hookspecs import hookimpl
from runtime.plugins import kernel as contract
from runtime.plugins.kernel import CompiledCall, Counts, Kernel, plain_kernel, request_for
from runtime.plugins.registry import Registry
from runtime.testing import ProgramBuilder

REF = "kc-test/formula-atom-twice@1"


def _infer(ctx):
    return ctx.output(ctx.operands[0].axes, ctx.operands[0].sizes)


def _plugin(factory):
    class Plugin:
        @hookimpl
        def formula_register_atoms(self, register):
            register(AtomSpec(name="twice", refs=(REF,), inputs=("value",), attributes=frozenset(),
                              infer=_infer, kernels={"reference": factory, "cpu": factory}))
    return Plugin()


def _program():
    b = ProgramBuilder(registry=_registry_with(lambda request: plain_kernel(_twice)))
    x = b.input("x", {"D": 4})
    return b.build(outputs=[b.op("twice", [x], ref=REF)])


def _twice(inputs, out):
    out[...] = 2 * inputs[0]
    return 1  # ignored unless the kernel says it counts


def _registry_with(factory) -> Registry:
    reg = Registry(autoload=False)
    reg.register(_plugin(factory), None)
    return reg


def test_plain_kernel_ignores_the_return_value_unless_it_counts():
    out = np.empty(2)
    assert plain_kernel(_twice)([np.ones(2)], (), out) is None
    np.testing.assert_array_equal(out, [2, 2])
    counting = plain_kernel(_twice, Counts(inputs=(0,)))
    assert counting([np.ones(2)], (), out) == 1 and counting.counts.any
    assert not Kernel(lambda i, e, o: None).counts.any


def test_plain_kernel_carries_warm_and_compiled_and_request_for():
    """One idiom: a factory returns ``plain_kernel(run, warm=, compiled=)``; nothing is read
    from attributes of ``run``."""
    warmed = []
    call = CompiledCall(lambda: None, ())
    kernel = plain_kernel(_twice, warm=lambda: warmed.append(1), compiled=call)
    kernel.warm()
    assert warmed == [1] and kernel.compiled is call and not kernel.counts.any
    assert not hasattr(contract, "node_kernel")
    from runtime.plan.fusion import EMPTY_EPILOGUE
    assert request_for("n", EMPTY_EPILOGUE).epilogue is None  # an empty epilogue is none
    assert request_for("n", count_inputs=(0,)).count_inputs == (0,)


@pytest.mark.parametrize("backend", ["reference", "cpu"])
def test_the_executor_asks_for_counts_and_believes_only_what_was_asked(backend):
    requests = []

    def factory(request):
        requests.append(request)
        # claims operand 0 and an operand that does not exist: only what was asked is believed
        return plain_kernel(_twice, Counts(inputs=(0, 3)))

    reg = _registry_with(factory)
    prog = _program()
    exe = runtime.compile(prog, backend, registry=reg)
    got = exe.run(inputs={"x": np.arange(4.0, dtype=np.float32)})
    np.testing.assert_array_equal(got["%0"], [0, 2, 4, 6])
    (request,) = requests
    assert request.count_inputs == (0,) and request.epilogue is None and request.resident == ()
    compiled = next(iter(exe._plans.values()))
    assert compiled.deferred_finite == {"x"}  # the kernel counts x: the run leaves it to it
    # it returns 1: the run then checks x itself and finds it finite, so no error
    assert exe.run(inputs={"x": np.ones(4, np.float32)})["%0"][0] == 2


def test_a_factory_that_returns_no_kernel_is_a_plugin_error():
    reg = _registry_with(lambda request: _twice)
    with pytest.raises(FormulaError) as err:
        runtime.execute(_program(), inputs={"x": np.ones(4, np.float32)}, backend="cpu", registry=reg)
    assert err.value.code == "plugin_error" and err.value.path == "$.instructions[0]"
    assert "Kernel" in err.value.message
