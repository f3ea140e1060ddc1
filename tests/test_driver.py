"""The compiled drivers (runtime.execution.driver): each run of consecutive kernels that compiled
code can call is one compiled call (a segment), the others launch from Python between them;
used when the bindings have the layout the drivers were built for, otherwise (and for traces)
every kernel launches from Python. Drivers build in the background from a plan's eighth run."""
from pathlib import Path

import attrs
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

import runtime
from runtime.core import settings as runtime_settings  # (hypothesis owns `settings` here)
from runtime.execution.driver import _all_of
from runtime.execution.compiled import DRIVER_AFTER_RUNS
from runtime.testing import ProgramBuilder, assert_backends_agree, random_values, warm_drivers

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
    for _ in range(DRIVER_AFTER_RUNS - 1):
        exe.run(inputs=inputs, banks=banks)
    compiled = next(iter(exe._plans.values()))
    assert compiled._driver_thread is None  # a plan run a few times is not worth compiling a driver for
    exe.run(inputs=inputs, banks=banks)  # this run starts building it, in the background
    assert exe.wait_compiled() and compiled.driver_error is None
    calls = counted_launches(compiled)
    by_driver = exe.run(inputs=inputs, banks=banks)["%4"].copy()
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
    for _ in range(DRIVER_AFTER_RUNS):  # (the fast path, where the kernels check every input, is armed by then)
        exe.run(inputs=inputs, banks=resident)
    exe.wait_compiled()
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


# --- segments: every kernel kind that compiled code can call ---------------------------------

ACC = {"accumulation_dtype": "float32"}


def norm_program(concat: bool = False) -> dict:
    """Looked-up rows through an RMS norm and a projection, as transformer blocks write them:
    lookup, elementwise chains with broadcast operands, reduce@2 (mean, sum, amax,
    logsumexp), a scalar input broadcast, a contraction, a permute and a slice; with
    ``concat``, a concat in the middle (two copies: no compiled call)."""
    b = ProgramBuilder()
    ids = b.input("ids", {"B": 2, "S": "S"}, "int64")
    eps = b.input("eps", {})
    emb, gain = b.bank("emb", {"V": 11, "D": 16}), b.bank("gain", {"D": 16})
    w = b.bank("w", {"E": 8, "D": 16})
    x = b.op("lookup", [emb, ids], {"table_axis": "V", "output_axes": ["B", "S", "D"]})
    ms = b.op("reduce@2", [b.op("scale", [x, x], {"factor_axes": ["B", "S", "D"], **ACC})],
              {"axis": "D", "mode": "mean", **ACC})
    be = b.op("broadcast", [eps], {"output_axes": ["B", "S"], "output_sizes": [2, "S"]})
    inv = b.op("scalar-map@2", [b.op("add", [ms, be], ACC)], {"mode": "rsqrt", **ACC})
    g = b.op("scale", [b.op("scale", [x, inv], {"factor_axes": ["B", "S"], **ACC}), gain],
             {"factor_axes": ["D"], **ACC})
    if concat:
        g = b.op("slice", [b.op("concat", [g, g], {"axis": "D"})], {"axis": "D", "start": 8, "stop": 24, "step": 1})
    y = b.op("contract", [g, w], {"reduce_axes": [["D", "D"]], "output_axes": ["B", "S", "E"], **ACC})
    t = b.op("permute", [y], {"output_axes": ["E", "S", "B"]})
    outs = [b.op("reduce@2", [t], {"axis": "S", "mode": mode, **ACC}) for mode in ("sum", "amax", "logsumexp")]
    outs.append(b.op("slice", [t], {"axis": "E", "start": 1, "stop": 7, "step": 2}))
    return b.build(outputs=outs)


def norm_values(s: int, seed: int = 0):
    rng = np.random.default_rng(seed)
    inputs = {"ids": rng.integers(0, 11, (2, s)), "eps": np.array(1e-5, np.float32)}
    banks = {"emb": rng.standard_normal((11, 16), dtype=np.float32),
             "gain": rng.standard_normal(16, dtype=np.float32), "w": rng.standard_normal((8, 16), dtype=np.float32)}
    return inputs, banks


def warmed(exe, inputs, banks):
    """Runs until the drivers build (the kernels compile on the first), then wait for them."""
    warm_drivers(exe, inputs, banks)


def driven_and_launched(exe, inputs, banks):
    """(the result through the driver, the same run launched kernel by kernel) as host copies."""
    got = exe.run(inputs=inputs, banks=banks)
    got = {k: got[k].copy() for k in got}
    traced = exe.run(inputs=inputs, banks=banks, trace=True)
    return got, {k: traced[k] for k in traced}


def test_a_plan_of_lookup_norm_projection_and_reductions_runs_as_one_compiled_call():
    program = norm_program()
    exe = runtime.compile(program, "cpu", tiered=False)
    inputs, banks = norm_values(5)
    resident = exe.load_banks(banks)
    warmed(exe, inputs, resident)
    compiled = next(iter(exe._plans.values()))
    calls = counted_launches(compiled)
    got, launched = driven_and_launched(exe, inputs, resident)
    driver = compiled.driver()
    assert driver is not None and len(driver.parts) == 1 and len(calls) == len(compiled.launches)
    assert not isinstance(driver.parts[0], int)  # every kernel inside the one segment
    want = runtime.compile(program, "reference").run(inputs=inputs, banks=banks)
    for slot in program["outputs"]:
        np.testing.assert_array_equal(got[slot], launched[slot])  # the same kernels, the same bits
        np.testing.assert_allclose(got[slot], want[slot], rtol=1e-5, atol=1e-5)


def test_a_kernel_compiled_code_cannot_call_splits_the_driver_into_segments():
    program = norm_program(concat=True)
    exe = runtime.compile(program, "cpu", tiered=False)
    inputs, banks = norm_values(5, seed=1)
    warmed(exe, inputs, banks)
    compiled = next(iter(exe._plans.values()))
    lone = [i for i, launch in enumerate(compiled.launches) if launch.kernel.compiled is None]
    assert [compiled.launches[i].nodes[0].atom.name for i in lone] == ["concat"]
    calls = counted_launches(compiled)
    got, launched = driven_and_launched(exe, inputs, banks)
    kinds = ["python" if isinstance(p, int) else "segment" for p in compiled.driver().parts]
    assert kinds == ["segment", "python", "segment"] and compiled.driver().parts[1] == lone[0]
    assert calls[:1] == lone and len(calls) == 1 + len(compiled.launches)  # then the traced run
    want = runtime.compile(program, "reference").run(inputs=inputs, banks=banks)
    for slot in program["outputs"]:
        np.testing.assert_array_equal(got[slot], launched[slot])
        np.testing.assert_allclose(got[slot], want[slot], rtol=1e-5, atol=1e-5)


def test_read_only_bindings_run_through_the_driver():
    exe = runtime.compile(norm_program(), "cpu", tiered=False)
    inputs, banks = norm_values(6, seed=2)
    want = exe.run(inputs=inputs, banks=banks)
    want = {k: want[k].copy() for k in want}
    frozen = {}
    for name, v in {**inputs, **banks}.items():
        frozen[name] = v.copy()
        frozen[name].flags.writeable = False
    warmed(exe, {k: frozen[k] for k in inputs}, {k: frozen[k] for k in banks})
    compiled = next(iter(exe._plans.values()))
    calls = counted_launches(compiled)
    got = exe.run(inputs={k: frozen[k] for k in inputs}, banks={k: frozen[k] for k in banks})
    assert calls == [] and compiled.driver() is not None
    for slot in want:
        np.testing.assert_array_equal(got[slot], want[slot])


def test_one_driver_serves_every_extent_of_a_symbolic_axis():
    """Extents reach the driver as constants, not in its source: a new extent compiles no
    new driver (its kernels are the same)."""
    exe = runtime.compile(norm_program(), "cpu", tiered=False)
    for s in (5, 9):
        warmed(exe, *norm_values(s, seed=s))
    first, second = (c.driver().parts[0] for c in exe._plans.values())  # (in the order they ran)
    assert first.call is second.call and first.constants[0].tolist() != second.constants[0].tolist()


def _plan_at(exe, s):
    return next(c for c in exe._plans.values() if c.plan.dims["S"] == s)


def test_a_new_extent_takes_the_drivers_of_another_at_its_first_run():
    """A plan at a new extent whose drivers another plan built (their modules loaded, their
    code compiled for these types) takes them at its first run, in the foreground: no run of
    it launches those kernels from Python, and no background thread builds them again."""
    exe = runtime.compile(norm_program(), "cpu", tiered=False)
    warmed(exe, *norm_values(5, seed=5))
    inputs, banks = norm_values(9, seed=9)
    first = exe.run(inputs=inputs, banks=banks)
    first = {k: first[k].copy() for k in first}
    plan = _plan_at(exe, 9)
    assert plan.driver() is not None and plan._driver_thread is None
    launched = counted_launches(plan)
    got = exe.run(inputs=inputs, banks=banks)
    got = {k: got[k].copy() for k in got}
    segments = {k for part in plan.driver().parts if not isinstance(part, int) for k in part.launches}
    assert segments and not segments & set(launched)
    by_kernel = exe.run(inputs=inputs, banks=banks, trace=True)
    assert set(launched) == set(range(len(plan.launches)))  # (a traced run launches each from Python)
    for k in got:
        np.testing.assert_array_equal(got[k], by_kernel[k])
        np.testing.assert_array_equal(first[k], by_kernel[k])


def test_a_new_extent_whose_first_values_the_drivers_cannot_take_builds_them_in_the_background():
    """The same plan's first run with a binding of another layout: nothing is taken in the
    foreground; the drivers build in the background from its DRIVER_AFTER_RUNS-th run."""
    exe = runtime.compile(norm_program(), "cpu", tiered=False)
    warmed(exe, *norm_values(5, seed=5))
    inputs, banks = norm_values(9, seed=9)
    strided = dict(inputs, ids=np.asfortranarray(inputs["ids"]))  # (not C-contiguous)
    exe.run(inputs=strided, banks=banks)
    plan = _plan_at(exe, 9)
    assert plan._driver is None and plan._driver_thread is None
    warm_drivers(exe, inputs, banks)
    assert plan.driver() is not None and plan._driver_thread is not None


def test_a_driver_is_renamed_when_a_kernel_it_calls_changes(tmp_path, monkeypatch):
    """Numba's disk cache checks only a function's own file, and a driver holds its callees'
    code: the digest of their sources in the driver's source keeps a cache from serving a
    driver built from older kernels."""
    import importlib
    import sys

    from runtime.execution import driver
    from runtime.kernels import codegen

    exe = runtime.compile(norm_program(), "cpu", tiered=False)
    warmed(exe, *norm_values(4, seed=3))
    segment = next(iter(exe._plans.values())).driver().parts[0]
    source = Path(sys.modules[segment.call.py_func.__module__].__file__).read_text()
    callees = [line.split()[1] for line in source.splitlines()
               if line.startswith("from ") and " as k" in line]  # the kernels' modules
    assert callees and f"# kernels' sources: {driver.sources_stamp(callees)}\n" in source
    kernel = tmp_path / "kernel_mod_for_stamp.py"
    kernel.write_text("X = 1\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    importlib.import_module("kernel_mod_for_stamp")
    before = driver.sources_stamp(["kernel_mod_for_stamp"])
    assert driver.sources_stamp(["kernel_mod_for_stamp"]) == before  # deterministic
    kernel.write_text("X = 2\n")
    codegen.file_digest.cache_clear()
    assert driver.sources_stamp(["kernel_mod_for_stamp"]) != before


def test_the_driver_compiles_in_the_background_for_the_types_of_the_run_that_started_it():
    exe = runtime.compile(norm_program(), "cpu", tiered=False)
    inputs, banks = norm_values(4, seed=3)
    warmed(exe, inputs, banks)
    segment = next(iter(exe._plans.values())).driver().parts[0]
    compiled = list(segment.call.signatures)  # (before any run called it; other tests' types too)
    exe.run(inputs=inputs, banks=banks)
    assert compiled and segment.call.signatures == compiled  # the run found its types ready


def test_a_driver_that_cannot_take_a_runs_values_gives_way_to_launches_from_python():
    from numba.core.errors import TypingError

    exe = runtime.compile(norm_program(), "cpu", tiered=False)
    inputs, banks = norm_values(5, seed=4)
    warmed(exe, inputs, banks)
    compiled = next(iter(exe._plans.values()))
    want = exe.run(inputs=inputs, banks=banks)
    want = {k: want[k].copy() for k in want}
    segment = compiled.driver().parts[0]

    def refuse(*args):
        raise TypingError("no implementation for these types (a test's)")
    object.__setattr__(segment, "call", refuse)
    calls = counted_launches(compiled)
    got = exe.run(inputs=inputs, banks=banks)
    assert calls == list(segment.launches) and compiled.driver() is None
    assert isinstance(compiled.driver_error, TypingError)
    for slot in want:
        np.testing.assert_array_equal(got[slot], want[slot])


# --- random programs through the drivers -------------------------------------------------------

@st.composite
def segment_programs(draw):
    """Chains over [A, B] values mixing every kernel kind compiled code can call (chains with
    broadcast operands, reduce@2, broadcast, permute, slice, lookup, contraction and views)
    with ones it cannot (concat), so plans split into segments in every way."""
    b = ProgramBuilder()
    a, n = 5, 6
    pool = [b.input("x", {"A": a, "B": n}), b.op("lookup", [b.bank("t", {"V": 7, "B": n}), b.input("ids", {"A": a}, "int64")],
                          {"table_axis": "V", "output_axes": ["A", "B"]})]
    w = b.bank("w", {"E": n, "B": n})
    row = b.input("r", {"A": a})
    for _ in range(draw(st.integers(2, 9))):
        pick = lambda: draw(st.sampled_from(pool))  # noqa: E731
        kind = draw(st.sampled_from(["map", "add", "row", "mean", "amax", "permute", "slice", "concat", "contract"]))
        if kind == "map":
            slot = b.op("scalar-map", [pick()], {"mode": draw(st.sampled_from(["tanh", "silu", "gelu"]))})
        elif kind == "add":
            slot = b.op("add", [pick(), pick()], ACC)
        elif kind == "row":  # a broadcast operand of the chain
            slot = b.op("scale", [pick(), row], {"factor_axes": ["A"], **ACC})
        elif kind in ("mean", "amax"):
            m = b.op("reduce@2", [pick()], {"axis": "B", "mode": kind, **ACC})
            slot = b.op("broadcast", [m], {"output_axes": ["A", "B"], "output_sizes": [a, n]})
        elif kind == "permute":
            t = b.op("permute", [pick()], {"output_axes": ["B", "A"]})
            slot = b.op("permute", [b.op("scalar-map", [t], {"mode": "tanh"})], {"output_axes": ["A", "B"]})
        elif kind in ("slice", "concat"):
            s = b.op("slice", [pick()], {"axis": "B", "start": 1, "stop": n, "step": 1})
            slot = b.op("concat", [s, b.op("slice", [pick()], {"axis": "B", "start": 0, "stop": 1, "step": 1})],
                        {"axis": "B"}) if kind == "concat" else \
                b.op("concat", [b.op("slice", [pick()], {"axis": "B", "start": 0, "stop": 1, "step": 1}), s], {"axis": "B"})
        else:
            c = b.op("contract", [pick(), w], {"reduce_axes": [["B", "B"]], "output_axes": ["A", "E"], **ACC})
            slot = b.op("reshape", [c], {"output_axes": ["A", "B"], "output_sizes": [a, n]})
        pool.append(slot)
    outputs = list(dict.fromkeys([pool[-1], *draw(st.lists(st.sampled_from(pool[2:] or pool), max_size=2))]))
    return b.build(outputs=outputs)


@settings(max_examples=runtime_settings.DRIVER_EXAMPLES.read(), deadline=None,
          suppress_health_check=[HealthCheck.too_slow])
@pytest.mark.slow  # (CI runs the slow set after the suite: README)
@given(segment_programs(), st.integers(0, 2 ** 16))
def test_random_programs_through_the_drivers_equal_their_python_launches(program, seed):
    rng = np.random.default_rng(seed)
    inputs = {"x": rng.standard_normal((5, 6), dtype=np.float32), "ids": rng.integers(0, 7, 5),
              "r": rng.standard_normal(5, dtype=np.float32)}
    banks = {"t": rng.standard_normal((7, 6), dtype=np.float32), "w": rng.standard_normal((6, 6), dtype=np.float32) / 3}
    exe = runtime.compile(program, "cpu", tiered=False)
    warmed(exe, inputs, banks)
    got, launched = driven_and_launched(exe, inputs, banks)
    for slot in got:
        np.testing.assert_array_equal(got[slot], launched[slot])
    assert_backends_agree(program, inputs, banks)
