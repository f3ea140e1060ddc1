"""The compiled driver (runtime.execution.driver): a plan's kernels in one compiled call, used exactly
when every kernel can be called from compiled code and the bindings have the layout it was
built for; otherwise (and for traces) kernels are launched one by one from Python."""
from pathlib import Path

import attrs
import numpy as np
import pytest

import runtime
from runtime.execution.driver import _all_of
from runtime.testing import ProgramBuilder, random_values

SEED = Path(__file__).resolve().parents[1] / "examples" / "seed-lora-silu.program.json"


def seed_values(T, seed=0):
    return random_values(SEED, {"B": 1, "S": T}, seed=seed)


def counted_launches(compiled):
    """Wrap every launch's runner so the test sees whether Python launched it."""
    calls = []
    for i, launch in enumerate(compiled.launches):
        inner = launch.kernel

        def run(*args, _inner=inner, _i=i):
            calls.append(_i)
            return _inner(*args)
        launch.kernel = attrs.evolve(inner, run=run)
    return calls


@pytest.mark.parametrize("T", [1, 5, 300])
def test_the_seed_runs_as_one_compiled_call_with_the_per_kernel_results(T):
    exe = runtime.compile(SEED, "cpu")
    inputs, banks = seed_values(T)
    exe.run(inputs=inputs, banks=banks)
    compiled = next(iter(exe._plans.values()))
    assert compiled._driver is None  # a plan run once is not worth compiling a driver for
    calls = counted_launches(compiled)
    by_driver = exe.run(inputs=inputs, banks=banks)["%4"].copy()  # the second run builds it
    assert calls == [] and compiled.driver() is not None
    traced = exe.run(inputs=inputs, banks=banks, trace=True)  # a trace times each kernel
    assert calls == [0, 1] and len(traced.trace) == 2
    np.testing.assert_array_equal(by_driver, traced["%4"])
    resident = exe.load_banks(banks)
    np.testing.assert_array_equal(exe.run(inputs=inputs, banks=resident)["%4"], by_driver)
    assert calls == [0, 1]


@pytest.mark.parametrize("layout", ["fortran", "strided", "unaligned"])
def test_bindings_of_another_layout_are_launched_kernel_by_kernel(layout):
    exe = runtime.compile(SEED, "cpu")
    inputs, banks = seed_values(16)
    want = exe.run(inputs=inputs, banks=banks)["%4"].copy()
    calls = counted_launches(next(iter(exe._plans.values())))
    x = inputs["x"]
    if layout == "fortran":
        x = np.asfortranarray(x)
    elif layout == "strided":
        x = np.repeat(x, 2, axis=2)[:, :, ::2]
    else:
        raw = np.empty(x.nbytes + 1, np.uint8)[1:]
        x = np.frombuffer(raw, np.float32).reshape(x.shape)
        x[...] = inputs["x"]
        assert not x.flags.aligned
    got = exe.run(inputs={**inputs, "x": x}, banks=banks)["%4"]
    assert calls == [0, 1]
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=2e-6 * np.abs(want).max())  # other BLAS order


def test_a_non_finite_value_read_by_the_driver_is_named_precisely():
    exe = runtime.compile(SEED, "cpu")
    inputs, banks = seed_values(8)
    resident = exe.load_banks(banks)
    for _ in range(3):  # arm the fast path: the kernels then check every input
        exe.run(inputs=inputs, banks=resident)
    compiled = next(c for c in exe._plans.values() if c.deferred_finite)
    assert compiled.driver() is not None and {"x", "base", "lora.gain"} <= compiled.deferred_finite
    calls = counted_launches(compiled)
    for name, where in (("x", (0, 7, 1023)), ("base", (0, 0, 3))):
        bad = inputs[name].copy()
        bad[where] = np.nan
        with pytest.raises(runtime.FormulaError) as err:
            exe.run(inputs={**inputs, name: bad}, banks=resident)
        assert (err.value.code, err.value.path) == ("nonfinite", f"$.inputs.{name}")
        assert str(list(where)) in err.value.message
    assert calls == []


def test_plans_with_a_kernel_compiled_code_cannot_call_have_no_driver():
    b = ProgramBuilder()
    x = b.input("x", {"N": 64})
    y = b.op("scalar-map", [x], {"mode": "relu"})
    exe = runtime.compile(b.build(outputs=[y]), "cpu")
    v = np.linspace(-1, 1, 64, dtype=np.float32)
    np.testing.assert_array_equal(exe.run(inputs={"x": v})["%0"], np.maximum(v, 0))
    assert next(iter(exe._plans.values())).driver() is None


def test_guards_are_entered_in_order_and_left_in_reverse():
    log = []

    class Guard:
        def __init__(self, name, fail=False):
            self.name, self.fail = name, fail

        def __enter__(self):
            if self.fail:
                raise RuntimeError(self.name)
            log.append(f"+{self.name}")

        def __exit__(self, *exc):
            log.append(f"-{self.name}")

    with _all_of([Guard("a"), Guard("b")]):
        log.append("body")
    assert log == ["+a", "+b", "body", "-b", "-a"]
    log.clear()
    with pytest.raises(RuntimeError):
        with _all_of([Guard("a"), Guard("b", fail=True)]):
            log.append("body")
    assert log == ["+a", "-a"]
