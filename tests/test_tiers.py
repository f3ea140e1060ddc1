"""Time to first result: no per-extent recompiles, tiered execution (reference kernels while
the cpu ones compile in the background), ``formula compile`` and ``formula cache``."""
from __future__ import annotations

import json
import threading
from pathlib import Path

import numpy as np
import pytest

import runtime
from bench import programs, transformer
from runtime.cli import main
from runtime.core.errors import fail
from runtime.execution.compiled import PlanBuilder
from runtime.kernels import codegen, compilelog

SEED = programs.seed_program("float32")


def _seed(tokens: int, seed: int = 0):
    data = programs.seed_data(tokens, "float32", seed)
    return data["inputs"], data["banks"]


def _expected(inputs, banks):
    x = inputs["x"].astype(np.float64)
    a, b = banks["lora.A"].astype(np.float64), banks["lora.B"].astype(np.float64)
    h = x @ a.T
    return inputs["base"] + float(inputs["lora.gain"]) * ((h / (1 + np.exp(-h))) @ b.T)


def _close(result, inputs, banks):
    np.testing.assert_allclose(result["%4"], _expected(inputs, banks), rtol=2e-4, atol=2e-4)


# --- no per-extent recompiles ------------------------------------------------------------
def test_new_extents_of_the_seed_compile_nothing_after_warm_up():
    """A counter, not a timing: every specialisation (compiled, or loaded from the disk
    cache) after warm-up would count; the extents cross every size threshold (one token, the
    micro-kernel forms, the parallel split and the parallel finiteness scan)."""
    exe = runtime.compile(SEED, "cpu", tiered=False)
    for tokens in (64, 1):
        inputs, banks = _seed(tokens)
        for _ in range(2):  # (the second run builds the one-call driver)
            exe.run(inputs=inputs, banks=banks)
    exe.warm()
    before = compilelog.specialisations()
    for tokens in (3, 7, 40, 300, 1000, 2):
        inputs, banks = _seed(tokens, seed=tokens)
        for _ in range(2):
            _close(exe.run(inputs=inputs, banks=banks), inputs, banks)
    assert compilelog.specialisations() == before


def test_a_new_extent_renders_no_contraction_source_again(monkeypatch):
    """The contraction's source depends on dtypes, layouts and the epilogue, not extents: a
    plan built for a new extent takes the rendered source of the first (the render was a
    third of a new extent's plan build)."""
    from atoms.contract import render

    renders = []
    real = render.render_cpu_source
    monkeypatch.setattr(render, "render_cpu_source", lambda *a, **k: renders.append(1) or real(*a, **k))
    monkeypatch.setattr(render, "_SOURCES", type(render._SOURCES)())
    exe = runtime.compile(SEED, "cpu", tiered=False)
    inputs, banks = _seed(64)
    _close(exe.run(inputs=inputs, banks=banks), inputs, banks)
    first = len(renders)
    assert first >= 1
    for tokens in (77, 300):
        inputs, banks = _seed(tokens, seed=tokens)
        _close(exe.run(inputs=inputs, banks=banks), inputs, banks)
    assert len(renders) == first


def test_a_new_extent_renders_no_loop_nest_source_again(monkeypatch):
    """The masked-softmax, rotary and sinusoidal kernels are the process's one NestKernel of
    their source (it depends on ranks, dtypes and layouts, not extents): a plan at a new extent
    renders and hashes none of them again, and computes what the oracle does."""
    from runtime.backends import cpu_codegen
    from runtime.testing import ProgramBuilder
    from runtime.toolkit import cpu as cg

    b = ProgramBuilder("float32")
    x, m = b.input("x", {"S": "S", "K": 4}), b.input("m", {"S": "S", "K": 4}, dtype="boolean")
    v, pos = b.input("v", {"S": "S", "H": 2, "F": 4}), b.input("pos", {"S": "S"}, dtype="int64")
    q = b.input("q", {"S": "S"})
    y = b.op("masked-softmax", [x, m], {"axis": "K", "accumulation_dtype": "float32"})
    rot = b.op("position-rotary", [v, pos], {"feature_axis": "F", "base": 100.0})
    sin = b.op("position-sinusoidal", [q], {"feature_axis": "W", "feature_size": 6, "dtype": "float32",
                                             "base": 50.0})
    program = b.build([y, rot, sin])
    exe, oracle = runtime.compile(program, "cpu", tiered=False), runtime.compile(program, "reference")

    def values(s):
        rng = np.random.default_rng(s)
        return {"x": rng.standard_normal((s, 4), dtype=np.float32), "m": rng.random((s, 4)) > 0.3,
                "v": rng.standard_normal((s, 2, 4), dtype=np.float32), "pos": np.arange(s) * 3,
                "q": rng.standard_normal(s, dtype=np.float32)}

    exe.run(inputs=values(5))
    renders = []
    for module in (cpu_codegen, cg):
        real = module.render
        monkeypatch.setattr(module, "render", lambda *a, real=real, **k: renders.append(1) or real(*a, **k))
    for s in (7, 9):
        got, want = exe.run(inputs=values(s)), oracle.run(inputs=values(s))
        for slot in (y, rot, sin):
            np.testing.assert_allclose(got[slot], want[slot], rtol=1e-5, atol=1e-6)
    assert renders == []


def test_new_extents_of_the_transformer_block_compile_nothing_after_warm_up():
    exe = runtime.compile(transformer.transformer_block_program(full=True), "cpu", tiered=False)
    for tokens in (8, 1):
        data = transformer.transformer_block_data(tokens)
        for _ in range(2):
            exe.run(**data)
    exe.warm()
    before = compilelog.specialisations()
    for tokens in (5, 33, 2):
        data = transformer.transformer_block_data(tokens, seed=tokens)
        for _ in range(2):
            exe.run(**data)
    assert compilelog.specialisations() == before


def test_specialisations_count_compilations():
    from numba import njit

    @njit
    def twice(x):
        return 2 * x

    before = compilelog.specialisations()
    assert twice(3) == 6 and twice(3.5) == 7.0
    assert compilelog.specialisations() == before + 2


# --- tiered execution --------------------------------------------------------------------
@pytest.fixture(autouse=True)
def own_ready_markers(monkeypatch, tmp_path):
    """Each test its own readiness markers: another test's compiled and warmed plan of the
    same program would otherwise send a tiered run straight to the cpu kernels."""
    from runtime.execution import executor, tiers

    def marker(key: str):
        return tmp_path / "ready" / key.replace("|", "_").replace("/", "_")[:200]

    def mark(key: str) -> None:
        marker(key).parent.mkdir(exist_ok=True)
        marker(key).touch()

    monkeypatch.setattr(tiers, "ready_marker", marker)
    monkeypatch.setattr(tiers, "mark_ready", mark)
    monkeypatch.setattr(executor, "mark_ready", mark)  # (Executable.warm)
    yield marker
    # a compile still running from this test would mark the next test's program ready
    for thread in threading.enumerate():
        if thread.name.startswith("formula-"):
            thread.join(120)


@pytest.fixture
def gated(monkeypatch):
    """Background plan builds wait for ``gate.set()``, so a test decides when the switch is."""
    gate = threading.Event()
    build = PlanBuilder.build

    def waiting(self, *args, **kwargs):
        if self.backend.name != "reference":  # (the reference tier builds its plans at once)
            assert gate.wait(120)
        return build(self, *args, **kwargs)

    monkeypatch.setattr(PlanBuilder, "build", waiting)
    yield gate
    gate.set()


def test_tiered_runs_on_reference_then_switches_with_equal_results(gated):
    exe = runtime.compile(SEED, "cpu", tiered=True)
    inputs, banks = _seed(16)
    first = exe.run(inputs=inputs, banks=banks, trace=True)
    assert first.tier == "reference"
    assert {r["tier"] for r in first.trace} == {"reference"}
    assert exe.wait_compiled(timeout=0.05) is False  # still compiling, behind the gate
    gated.set()
    assert exe.wait_compiled() is True
    second = exe.run(inputs=inputs, banks=banks, trace=True)
    assert second.tier == "cpu" and {r["tier"] for r in second.trace} == {"cpu"}
    _close(first, inputs, banks)
    _close(second, inputs, banks)
    np.testing.assert_allclose(first["%4"], second["%4"], rtol=1e-4, atol=1e-4)
    assert exe.run(inputs=inputs, banks=banks).tier == "cpu"  # the untraced path too


def test_the_tier_takes_blas_for_contractions_and_reference_stays_the_oracle(gated, monkeypatch):
    """The tier's runs take the reference kernels' faster paths (an unbatched contraction
    through BLAS, ``np.matmul``); ``backend="reference"`` keeps ``np.einsum`` (the oracle)."""
    from atoms.contract import reference as contract

    asked = []
    real = contract.first_tier
    monkeypatch.setattr(contract, "first_tier", lambda: asked.append(real()) or asked[-1])
    inputs, banks = _seed(16)
    first = runtime.compile(SEED, "cpu", tiered=True).run(inputs=inputs, banks=banks)
    assert first.tier == "reference" and asked == [True, True]  # the seed's two products
    _close(first, inputs, banks)
    asked.clear()
    _close(runtime.compile(SEED, "reference").run(inputs=inputs, banks=banks), inputs, banks)
    assert asked == [False, False]


def test_a_first_tier_contraction_is_blas_and_the_oracle_einsum():
    from atoms.contract import SPECS
    from runtime.core.types import TensorType
    from runtime.kernels.tiers import running_first_tier
    from runtime.testing import run_kernel

    rng = np.random.default_rng(5)
    x = rng.standard_normal((2, 37, 1024), dtype=np.float32)
    a = rng.standard_normal((24, 1024), dtype=np.float32)
    types = [TensorType(("B", "S", "D"), (2, 37, 1024), "float32", "d"),
             TensorType(("R", "D"), (24, 1024), "float32", "d")]
    attributes = {"reduce_axes": [["D", "D"]], "output_axes": ["B", "S", "R"], "accumulation_dtype": "float32"}
    einsum = np.einsum("bsd,rd->bsr", x, a)
    blas = np.matmul(x.reshape(1, 74, 1024), a.T[None]).reshape(2, 37, 24)
    assert not np.array_equal(einsum, blas)  # (else this test could not tell them apart)
    assert np.array_equal(run_kernel(SPECS[0], attributes, types, [x, a]), einsum)
    with running_first_tier():
        assert np.array_equal(run_kernel(SPECS[0], attributes, types, [x, a]), blas)


def test_a_batched_first_tier_contraction_is_blas_too():
    """Attention's [B, H] batched products: the oracle's einsum is no BLAS (5x NumPy's time
    on the block's first tier), the first tier's is a batched matmul."""
    from atoms.contract import SPECS
    from runtime.core.types import TensorType
    from runtime.kernels.tiers import running_first_tier
    from runtime.testing import run_kernel

    rng = np.random.default_rng(6)
    q = rng.standard_normal((2, 3, 40, 64), dtype=np.float32)
    k = rng.standard_normal((2, 3, 50, 64), dtype=np.float32)
    types = [TensorType(("B", "H", "S", "E"), q.shape, "float32", "d"),
             TensorType(("B", "H", "K", "E"), k.shape, "float32", "d")]
    attributes = {"reduce_axes": [["E", "E"]], "output_axes": ["B", "H", "S", "K"], "accumulation_dtype": "float32"}
    einsum = np.einsum("bhse,bhke->bhsk", q, k)
    blas = np.matmul(q, k.transpose(0, 1, 3, 2))
    assert not np.array_equal(einsum, blas)
    assert np.array_equal(run_kernel(SPECS[0], attributes, types, [q, k]), einsum)
    with running_first_tier():
        assert np.array_equal(run_kernel(SPECS[0], attributes, types, [q, k]), blas)


@pytest.mark.parametrize("mode", ["silu", "sigmoid"])
@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_the_first_tier_sigmoid_and_silu_are_branch_free_and_close_to_the_oracle(mode, dtype, monkeypatch):
    from atoms.elementwise import scalar_map_numpy
    from runtime.kernels.tiers import running_first_tier
    from runtime.testing import run_kernel
    from runtime.core.types import TensorType
    import atoms.elementwise as elementwise

    spec = next(s for s in elementwise.SPECS if s.name == "scalar-map")
    x = np.concatenate([np.random.default_rng(7).standard_normal(4000) * 30,
                        [0.0, -0.0, np.inf, -np.inf, np.nan, 1e30, -1e30, 88.0, -88.0, 700.0]]).astype(dtype)
    types = [TensorType(("N",), x.shape, dtype, "d")]
    attributes = {"mode": mode, "accumulation_dtype": "activation"}
    oracle = run_kernel(spec, attributes, types, [x])
    monkeypatch.setattr(elementwise.np, "where", lambda *a: pytest.fail("np.where in the first tier"))
    with running_first_tier():
        got = run_kernel(spec, attributes, types, [x])
    monkeypatch.undo()
    assert np.array_equal(oracle, scalar_map_numpy(mode, x), equal_nan=True)
    # (exp(-x) overflows below about -88 / -709: 0 where the oracle has |x|·exp(x), < 1e3·tiny)
    np.testing.assert_allclose(got, oracle, rtol=4 * np.finfo(dtype).eps, atol=1e3 * np.finfo(dtype).tiny)


def test_the_first_tier_agrees_with_the_oracle_on_the_block_and_its_gradient():
    """Every atom of the transformer block and of its split gradient's forward (saved values
    included), on the first tier's kernels and in-place plans, against the oracle; twice, so
    that the second run reads arena memory the first left behind."""
    from runtime.kernels.tiers import running_first_tier

    dims = {"D": 64, "H": 4, "F": 128}
    program = transformer.transformer_block_program(full=True, dims=dims)
    data = transformer.transformer_block_data(24, full=True, dims=dims)
    g = runtime.vjp(program, wrt=[b["name"] for b in program["bindings"] if b["kind"] == "bank"
                                  and b["value_type"]["dtype"] in ("floating", "float32")])
    for prog in (program, g.split("save-all").forward):
        banks = {n: data["banks"][n] for n in (b["name"] for b in prog["bindings"] if b["kind"] == "bank")}
        oracle = runtime.compile(prog, "reference").run(inputs=data["inputs"], banks=banks)
        exe = runtime.compile(prog, "reference")
        for _ in range(2):
            with running_first_tier():
                got = exe.run(inputs=data["inputs"], banks=exe.load_banks(banks))
            for slot, want in oracle.items():
                np.testing.assert_allclose(np.asarray(got[slot], np.float64), np.asarray(want, np.float64),
                                           rtol=2e-4, atol=2e-4, err_msg=slot)
    assert len(g.gradients) > 3


@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_every_scalar_map_mode_on_the_first_tier_writes_its_whole_output(dtype):
    """Each mode's result reaches the caller's ``out`` (filled with a sentinel first), in place
    and not: a mode computed apart from its output once left that output unwritten."""
    from atoms.elementwise import MODES_V2
    from runtime.build import ProgramBuilder
    from runtime.kernels.tiers import running_first_tier

    x = (np.random.default_rng(3).standard_normal((5, 7)) * 3).astype(dtype)
    x_pos = np.abs(x) + 0.5  # (log, rsqrt, reciprocal: finite results)
    acc = {"accumulation_dtype": "activation"}
    for mode in MODES_V2:
        b = ProgramBuilder(dtype)
        v = b.input("x", {"T": 5, "D": 7})
        y = b.op("scalar-map@2", [b.op("scalar-map@2", [v], {"mode": "abs", **acc})], {"mode": mode, **acc})  # (in place)
        z = b.op("scalar-map@2", [v], {"mode": mode, **acc})  # (over a binding: not in place)
        program = b.build(outputs=[y, z])
        value = x_pos if mode in ("log", "rsqrt", "reciprocal", "log1p") else x
        oracle = runtime.compile(program, "reference").run(inputs={"x": value})
        exe = runtime.compile(program, "reference")
        out = {y: np.full((5, 7), 12345.0, dtype), z: np.full((5, 7), 12345.0, dtype)}
        with running_first_tier():
            exe.run(inputs={"x": value}, out=out)
        for slot in (y, z):
            eps = np.finfo(dtype).eps
            np.testing.assert_allclose(out[slot], oracle[slot], rtol=8 * eps, atol=8 * eps, err_msg=f"{mode} {slot}")


@pytest.mark.parametrize("tier", [False, True])
def test_a_reference_contraction_proves_its_large_operands_finite_through_its_product(tier, monkeypatch):
    """x (T x 1024) is not scanned when bound: the product x @ A.T (T x 32) is checked instead;
    a non-finite product makes the run check x and A exactly, which names the value."""
    import contextlib

    from runtime.execution import bindings
    from runtime.kernels.tiers import running_first_tier

    exe = runtime.compile(SEED, "reference")
    inputs, banks = _seed(64)
    tiered = running_first_tier if tier else contextlib.nullcontext
    with tiered():
        exe.run(inputs=inputs, banks=banks)
    scanned = []
    real = bindings._all_finite
    monkeypatch.setattr(bindings, "_all_finite", lambda a: scanned.append(a) or real(a))
    with tiered():
        _close(exe.run(inputs=inputs, banks=banks), inputs, banks)
    assert not any(a is inputs["x"] or a is banks["lora.A"] for a in scanned)
    assert any(a is inputs["base"] for a in scanned)  # (the product of B is larger than B: scanned)
    for name, index, bad in (("x", (0, 5, 7), np.nan), ("x", (0, 63, 1023), -np.inf), ("lora.A", (3, 4), np.inf)):
        where = inputs if name in inputs else banks
        changed = where[name].copy()
        changed[index] = bad
        with tiered(), pytest.raises(runtime.FormulaError) as err:
            exe.run(inputs={**inputs, **({name: changed} if where is inputs else {})},
                    banks={**banks, **({name: changed} if where is banks else {})})
        assert err.value.code == "nonfinite"
        assert err.value.path == f"$.{'inputs' if where is inputs else 'banks'}.{name}"
        assert f"index {list(index)}" in err.value.message
    huge = {**inputs, "x": np.full_like(inputs["x"], 3e38)}  # finite values, an overflowing product
    with tiered():
        assert not np.isfinite(exe.run(inputs=huge, banks=banks)["%4"]).all()


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_the_blas_finiteness_check_finds_every_position(dtype):
    from runtime.kernels.finite import BLAS_MIN, BLAS_ROW, blas_all_finite

    a = np.random.default_rng(1).standard_normal(BLAS_MIN + BLAS_ROW + 5).astype(dtype)
    assert blas_all_finite(a) is True
    for i in (0, BLAS_ROW - 1, BLAS_MIN, a.size - 1):  # a row's start and end, the tail
        for bad in (np.nan, np.inf, -np.inf):
            b = a.copy()
            b[i] = bad
            assert blas_all_finite(b) is None  # (the elementwise check then names it)
    huge = np.full(BLAS_MIN, np.finfo(dtype).max / 2, dtype)
    assert blas_all_finite(huge) is None  # an overflowing sum of finite values: undecided
    assert blas_all_finite(a[:100]) is None and blas_all_finite(a.astype(np.float16)) is None
    assert blas_all_finite(np.ones(2 * BLAS_MIN + 2, dtype)[::2]) is None  # (not contiguous)


def test_a_first_tier_finiteness_check_takes_the_serial_scan(monkeypatch):
    """Numba's worker team spinning beside NumPy's BLAS threads made the seed's first tier
    2.7x slower: a first-tier run checks its values on the calling thread."""
    from runtime.kernels import finite
    from runtime.kernels.tiers import running_first_tier

    finite.prepare(["float32"])
    big = np.ones(finite.PARALLEL_MIN, np.float32)
    picked = []
    real = finite._scans()
    monkeypatch.setattr(finite, "_scans", lambda: type("T", (), {"pick": lambda self, p: picked.append(p) or real.pick(p)})())
    assert finite.all_finite(big) is True
    with running_first_tier():
        big[7] = np.nan
        assert finite.all_finite(big) is False
    assert picked == [True, False]


def test_a_new_extent_of_a_compiled_plan_runs_compiled_at_once(gated):
    """Kernels do not depend on the extents of symbolic axes: once one plan of these dtypes is
    compiled, a plan for new extents is built at once (nothing to compile), not tiered."""
    exe = runtime.compile(SEED, "cpu", tiered=True)
    inputs, banks = _seed(6)
    assert exe.run(inputs=inputs, banks=banks).tier == "reference"
    gated.set()
    exe.wait_compiled()
    inputs, banks = _seed(11)
    result = exe.run(inputs=inputs, banks=banks)
    assert result.tier == "cpu"
    _close(result, inputs, banks)


def test_a_plan_warmed_once_is_loaded_at_once_by_the_next_tiered_executable(own_ready_markers):
    """Once a plan of these dtypes compiled and warmed (here, or in `formula compile`), its
    kernels are in the disk cache: a new process's tiered run loads them in the foreground."""
    inputs, banks = _seed(9)
    assert runtime.compile(SEED, "cpu", tiered=True).run(inputs=inputs, banks=banks).tier == "reference"
    warmed = runtime.compile(SEED, "cpu", tiered=False)
    warmed.run(inputs=inputs, banks=banks)
    warmed.warm()
    assert list(own_ready_markers("x").parent.iterdir())
    result = runtime.compile(SEED, "cpu", tiered=True).run(inputs=inputs, banks=banks)
    assert result.tier == "cpu"
    _close(result, inputs, banks)


def test_a_plan_loaded_from_the_disk_cache_warms_its_variants_in_the_background(own_ready_markers, monkeypatch):
    """A plan loaded in the foreground (its readiness marker) loads its kernels' other variants
    (parallel twins, tails) in a background thread from its second run, so a later new extent
    finds them loaded instead of stalling on them; the first run does not wait behind them."""
    from runtime.execution.compiled import CompiledPlan

    inputs, banks = _seed(9)
    warmed = runtime.compile(SEED, "cpu", tiered=False)
    warmed.run(inputs=inputs, banks=banks)
    warmed.warm()
    calls = []
    real = CompiledPlan.warm
    monkeypatch.setattr(CompiledPlan, "warm", lambda self: (calls.append(threading.current_thread().name),
                                                            real(self)))
    exe = runtime.compile(SEED, "cpu", tiered=True)
    assert exe.run(inputs=inputs, banks=banks).tier == "cpu"
    assert calls == []  # (nothing behind the first run)
    for _ in range(3):
        _close(exe.run(inputs=inputs, banks=banks), inputs, banks)
    assert exe.wait_compiled() is True
    assert calls == ["formula-warm"]
    wider, wider_banks = _seed(300)  # a new extent: the same kernels, nothing warmed again
    _close(exe.run(inputs=wider, banks=wider_banks), wider, wider_banks)
    assert exe.wait_compiled() is True and calls == ["formula-warm"]


def test_tiered_is_on_for_cpu_by_default_and_opt_out(monkeypatch):
    monkeypatch.delenv("FORMULA_TIERED", raising=False)
    assert runtime.compile(SEED, "cpu").tiered is True
    assert runtime.compile(SEED, "reference").tiered is False
    assert runtime.compile(SEED, "cpu", tiered=False).tiered is False
    monkeypatch.setenv("FORMULA_TIERED", "0")
    exe = runtime.compile(SEED, "cpu")
    assert exe.tiered is False
    inputs, banks = _seed(4)
    assert exe.run(inputs=inputs, banks=banks).tier == "cpu"  # waited for its kernels
    assert exe.wait_compiled() is True


def _failing_cpu_builds(monkeypatch, failure):
    build = PlanBuilder.build

    def failing(self, *args, **kwargs):
        if self.backend.name != "reference":
            failure()
        return build(self, *args, **kwargs)

    monkeypatch.setattr(PlanBuilder, "build", failing)


def test_a_background_compile_error_surfaces_as_formula_error(monkeypatch):
    def broken():
        raise RuntimeError("no LLVM today")

    _failing_cpu_builds(monkeypatch, broken)
    exe = runtime.compile(SEED, "cpu", tiered=True)
    inputs, banks = _seed(4)
    assert exe.run(inputs=inputs, banks=banks).tier == "reference"
    with pytest.raises(runtime.FormulaError) as err:
        exe.wait_compiled()
    assert err.value.code == "backend_unavailable" and "no LLVM today" in err.value.message
    with pytest.raises(runtime.FormulaError, match="no LLVM today"):  # not lost: the next run says it too
        exe.run(inputs=inputs, banks=banks)
    from runtime.execution import tiers

    # even where the disk cache says kernels of these dtypes are ready (another process's)
    monkeypatch.setattr(tiers, "ready_marker", lambda key: Path(__file__))
    with pytest.raises(runtime.FormulaError, match="no LLVM today"):
        exe.run(inputs=inputs, banks=banks)


def test_a_formula_error_in_the_background_keeps_its_code(monkeypatch):
    _failing_cpu_builds(monkeypatch, lambda: fail("limit_exceeded", "$.limits", "too big for the cpu plan"))
    exe = runtime.compile(SEED, "cpu", tiered=True)
    inputs, banks = _seed(4)
    exe.run(inputs=inputs, banks=banks)
    with pytest.raises(runtime.FormulaError) as err:
        exe.wait_compiled()
    assert err.value.code == "limit_exceeded"


def test_concurrent_runs_across_the_switch(gated):
    exe = runtime.compile(SEED, "cpu", tiered=True)
    inputs, banks = _seed(8)
    expected = _expected(inputs, banks)
    tiers, failures = [], []
    start = threading.Barrier(4)

    def worker():
        try:
            # one run behind the gate is surely on the reference tier, whatever the cache holds
            first = exe.run(inputs=inputs, banks=banks)
            np.testing.assert_allclose(first["%4"], expected, rtol=2e-4, atol=2e-4)
            tiers.append(first.tier)
            start.wait()
            for _ in range(5):
                result = exe.run(inputs=inputs, banks=banks)
                np.testing.assert_allclose(result["%4"], expected, rtol=2e-4, atol=2e-4)
                tiers.append(result.tier)
        except Exception as exc:  # collected: a thread's failure must fail the test
            failures.append(exc)

    threads = [threading.Thread(target=worker) for _ in range(3)]
    for t in threads:
        t.start()
    start.wait()
    gated.set()  # the switch happens while the workers run
    for t in threads:
        t.join(300)
    assert not failures
    assert len(tiers) == 18 and tiers.count("reference") >= 3
    exe.wait_compiled()
    assert exe.run(inputs=inputs, banks=banks).tier == "cpu"


def test_tiered_runs_leave_the_callers_arrays_alone(gated):
    exe = runtime.compile(SEED, "cpu", tiered=True)
    inputs, banks = _seed(4)
    copies = {k: np.array(v, copy=True) for k, v in {**inputs, **banks}.items()}
    exe.run(inputs=inputs, banks=banks)
    inputs["x"][...] = np.nan  # the background compile works on its own copy
    gated.set()
    exe.wait_compiled()
    inputs["x"][...] = copies["x"]
    for k, v in {**inputs, **banks}.items():
        np.testing.assert_array_equal(v, copies[k])


# --- formula compile / formula cache -------------------------------------------------------
def _json(capsys):
    return json.loads(capsys.readouterr().out)


def test_formula_compile_fills_the_cache_then_has_nothing_left_to_compile(capsys, tmp_path, monkeypatch):
    from runtime.execution.compiled import CompiledPlan

    built = []  # the compiled drivers too, so that served processes load them from the cache
    build = CompiledPlan._build_driver
    monkeypatch.setattr(CompiledPlan, "_build_driver", lambda self, values: (build(self, values), built.append(self)))
    path = tmp_path / "seed.json"
    path.write_text(json.dumps(SEED))
    argv = ["compile", str(path), "--dim", "B=1", "--dim", "S=5", "--json"]
    assert main(argv) == 0
    doc = _json(capsys)
    assert doc["ok"] and doc["dims"] == {"B": 1, "S": 5} and doc["dtype"] == "float32"
    assert doc["cache"] == str(codegen.cache_dir())
    assert len(built) == 1 and built[0].driver() is not None and built[0].driver_error is None
    assert main(argv) == 0
    assert _json(capsys)["compiled"] == 0
    assert main(["compile", str(path), "--dim", "B=1", "--dim", "S=5", "--dtype", "float64"]) == 0
    out = capsys.readouterr().out
    assert "float64" in out and "cache" in out


def test_formula_compile_checks_its_arguments(capsys, tmp_path):
    path = tmp_path / "seed.json"
    path.write_text(json.dumps(SEED))
    assert main(["compile", str(path), "--json"]) == 1  # S has no extent
    doc = _json(capsys)
    assert not doc["ok"] and doc["error"]["code"] == "binding_shape" and "--dim" in doc["error"]["message"]
    assert main(["compile", str(path), "--dtype", "int8"]) == 2  # a usage error


def test_formula_cache_info_and_clear_touch_only_the_caches_files(capsys, tmp_path, monkeypatch):
    root = tmp_path / "cache"
    monkeypatch.setenv("FORMULA_CACHE_DIR", str(root))
    monkeypatch.delenv("NUMBA_CACHE_DIR", raising=False)
    assert main(["cache", "info", "--json"]) == 0
    doc = _json(capsys)
    assert doc["location"] == str(root) and doc["files"] == 0 and doc["exists"] is False
    (root / "generated" / "__pycache__").mkdir(parents=True)
    (root / "numba" / "sub").mkdir(parents=True)
    (root / "generated" / "_formula_ew_0123.py").write_text("x = 1\n")
    (root / "generated" / "__pycache__" / "_formula_ew_0123.cpython-312.pyc").write_bytes(b"12")
    (root / "numba" / "sub" / "k.py.kernel-1.py312.nbi").write_bytes(b"abc")
    (root / "numba" / "sub" / "k.py.kernel-1.py312.1.nbc").write_bytes(b"abcd")
    (root / "numba" / "sub" / "notes.txt").write_text("mine")
    (root / "generated" / "mine.py").write_text("mine")
    assert main(["cache", "info", "--json"]) == 0
    doc = _json(capsys)
    assert (doc["files"], doc["bytes"], doc["generated_files"], doc["numba_files"]) == (4, 6 + 2 + 3 + 4, 2, 2)
    assert main(["cache", "info"]) == 0
    text = capsys.readouterr().out
    assert str(root) in text and "4 files" in text and "FORMULA_CACHE_DIR" in text
    assert main(["cache", "clear", "--json"]) == 0
    doc = _json(capsys)
    assert doc["removed_files"] == 4 and doc["files"] == 0
    assert sorted(p.name for p in root.rglob("*") if p.is_file()) == ["mine.py", "notes.txt"]
    assert not (root / "generated" / "__pycache__").exists()


# --- a one-shot `formula run` leaves the cache filled -------------------------------------------
def _tiny_program() -> dict:
    from runtime.build import ProgramBuilder

    b = ProgramBuilder()
    x = b.input("x", {"T": "T", "D": 8})
    return b.build(outputs=[b.op("scalar-map", [b.op("scalar-map", [x], {"mode": "silu"})], {"mode": "tanh"})])


def _gone(pid: int) -> bool:
    """The process has exited (a zombie counts: this container's init may not reap it)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] == "Z"
    except FileNotFoundError:
        return True


def _cli_run(path, cache, *extra):
    import os
    import subprocess
    import sys

    env = {k: v for k, v in os.environ.items() if k not in ("FORMULA_TIERED", "NUMBA_CACHE_DIR")}
    env["FORMULA_CACHE_DIR"] = str(cache)
    proc = subprocess.run([sys.executable, "-m", "runtime.cli", "run", str(path), "--random", "--dim", "T=6",
                           "--json", *extra], capture_output=True, text=True, env=env, timeout=600)
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout)


@pytest.mark.skipif(not __import__("os").path.isdir("/proc/self"), reason="waits on the child through /proc")
def test_a_one_shot_run_leaves_a_process_filling_the_cache_for_the_next_run(tmp_path):
    import time

    path = tmp_path / "tiny.json"
    path.write_text(json.dumps(_tiny_program()))
    first = _cli_run(path, tmp_path / "cache")
    assert first["tier"] == "reference" and isinstance(first["filling_cache"], int)
    deadline = time.monotonic() + 300
    while not _gone(first["filling_cache"]):
        assert time.monotonic() < deadline, "the cache filler did not finish"
        time.sleep(0.2)
    second = _cli_run(path, tmp_path / "cache")
    assert second["tier"] == "cpu" and second["filling_cache"] is None
    assert second["outputs"] == first["outputs"] or all(  # the same values, within the tiers' tolerance
        abs(second["outputs"][s]["mean"] - first["outputs"][s]["mean"]) < 1e-5 for s in first["outputs"])


def test_no_fill_cache_leaves_no_process(tmp_path):
    path = tmp_path / "tiny.json"
    path.write_text(json.dumps(_tiny_program()))
    got = _cli_run(path, tmp_path / "cache", "--no-fill-cache")
    assert got["tier"] == "reference" and got["filling_cache"] is None
