"""Executor promises: fresh results, shared executables across threads, traces, value checks
before kernels, and cpu/cuda (simulator) agreeing with the reference on whole programs."""
import threading
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

import runtime
from runtime.testing import ProgramBuilder, assert_backends_agree, random_values

SEED = Path(__file__).resolve().parents[1] / "examples" / "seed-lora-silu.program.json"


def seed_values(T=8, seed=0):
    inputs, banks = random_values(SEED, {"B": 1, "S": T}, seed=seed)
    return inputs, banks


def expected(inputs, banks):
    """The seed in float64: what a float32 run approximates."""
    inputs = {k: np.asarray(v, np.float64) for k, v in inputs.items()}
    banks = {k: np.asarray(v, np.float64) for k, v in banks.items()}
    h = inputs["x"] @ banks["lora.A"].T
    with np.errstate(over="ignore"):
        return inputs["base"] + inputs["lora.gain"] * ((h / (1 + np.exp(-h))) @ banks["lora.B"].T)


def assert_seed_close(got, inputs, banks):
    """float32 sums of 1024 terms: errors grow with the values' size (about 1e3 here)."""
    want = expected(inputs, banks)
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=2e-6 * np.abs(want).max())


def test_results_are_fresh_and_never_overwritten_by_a_later_run():
    exe = runtime.compile(SEED, "cpu")
    i1, b1 = seed_values(seed=1)
    i2, b2 = seed_values(seed=2)
    r1 = exe.run(inputs=i1, banks=b1)["%4"]
    keep = r1.copy()
    r2 = exe.run(inputs=i2, banks=b2)["%4"]
    assert not np.shares_memory(r1, r2)
    np.testing.assert_array_equal(r1, keep)
    assert_seed_close(r2, i2, b2)


def test_a_shared_executable_runs_concurrently_from_threads():
    exe = runtime.compile(SEED, "cpu")
    cases = [seed_values(T=16, seed=s) for s in range(6)]
    exe.run(inputs=cases[0][0], banks=cases[0][1])  # compile outside the race
    results, errors = {}, []

    def work(k):
        try:
            for _ in range(5):
                results[k] = exe.run(inputs=cases[k][0], banks=cases[k][1])["%4"]
        except Exception as exc:  # pragma: no cover - reported below
            errors.append(exc)

    threads = [threading.Thread(target=work, args=(k,)) for k in range(len(cases))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors
    for k, (inputs, banks) in enumerate(cases):
        assert_seed_close(results[k], inputs, banks)


def test_runs_alternating_between_extents_each_take_their_own_plan():
    exe = runtime.compile(SEED, "cpu")
    cases = [seed_values(T=T, seed=T) for T in (8, 40, 8, 40, 40, 8)]
    for inputs, banks in cases:  # the repeat-run shortcuts key on the last structure
        got = exe.run(inputs=inputs, banks=banks)["%4"]
        assert got.shape == inputs["x"].shape
        assert_seed_close(got, inputs, banks)
    assert len(exe._plans) == 2


def test_a_new_extent_takes_the_idle_arena_of_another_when_it_is_large_enough():
    """A plan's first run takes the idle arena of another extent's plan when its own is large
    (fresh memory faults in each page on its first touch), and never one too small: every run
    computes what the reference does, whichever plan's arena it uses."""
    from runtime.execution.compiled import TAKE_ARENA_BYTES

    b = ProgramBuilder()
    x, w1, w2 = b.input("x", {"T": "T", "D": 512}), b.bank("w1", {"F": 512, "D": 512}), b.bank("w2", {"E": 64, "F": 512})
    h = b.op("contract", [x, w1], {"reduce_axes": [["D", "D"]], "output_axes": ["T", "F"],
                                   "accumulation_dtype": "float32"})
    y = b.op("contract", [b.op("scalar-map", [h], {"mode": "gelu"}), w2],
             {"reduce_axes": [["F", "F"]], "output_axes": ["T", "E"], "accumulation_dtype": "float32"})
    program = b.build([y])
    exe, ref = runtime.compile(program, "cpu", tiered=False), runtime.compile(program, "reference")
    rng = np.random.default_rng(0)
    banks = {"w1": rng.standard_normal((512, 512), np.float32) / 20, "w2": rng.standard_normal((64, 512), np.float32) / 20}

    made = []
    allocate = exe._builder.backend.allocate
    exe._builder.backend.allocate = lambda nbytes: made.append(nbytes) or allocate(nbytes)

    def run(T):
        inputs = {"x": rng.standard_normal((T, 512), np.float32)}
        np.testing.assert_allclose(exe.run(inputs=inputs, banks=banks)[y], ref.run(inputs=inputs, banks=banks)[y],
                                   rtol=1e-4, atol=1e-4)
        plan = next(c for k, c in exe._plans.items() if dict(k.dims)["T"] == T)
        assert plan.plan.arena_bytes >= TAKE_ARENA_BYTES
        (raw,) = plan._raw.values()
        assert raw.size >= plan.plan.arena_bytes
        return raw

    try:
        first = run(1024)
        assert run(900) is first and len(made) == 1  # taken: the 1024 plan's arena is idle and large enough
        grown = run(1100)  # none idle is large enough: its own
        assert grown is not first and len(made) == 2
        assert all(any(run(T) is r for r in (first, grown)) for T in (1024, 900)) and len(made) == 2
        assert run(900) is run(900)  # (its own idle arena first, once it has one)
    finally:
        exe._builder.backend.allocate = allocate


def test_trace_names_groups_atoms_times_and_bytes():
    inputs, banks = seed_values()
    res = runtime.execute(SEED, inputs=inputs, banks=banks, trace=True)
    assert [t["instructions"] for t in res.trace] == [["i0", "i1"], ["i2", "i3", "i4"]]
    assert all(t["backend"] == "cpu" and t["ms"] >= 0 for t in res.trace)
    assert res.trace[1]["bytes"] == 8 * 1024 * 4
    assert runtime.execute(SEED, inputs=inputs, banks=banks).trace is None


def test_symbols_rebind_per_run_and_plans_are_cached_per_extents():
    exe = runtime.compile(SEED, "cpu")
    for T in (3, 5, 3):
        inputs, banks = seed_values(T=T)
        np.testing.assert_allclose(exe.run(inputs=inputs, banks=banks)["%4"], expected(inputs, banks),
                                   rtol=1e-4, atol=1e-4)
    assert len(exe._plans) == 2


def _gather_program():
    b = ProgramBuilder()
    v = b.input("v", {"N": 5, "D": 3})
    idx = b.input("idx", {"J": 4}, dtype="int64")
    y = b.op("gather", [v, idx], {"axis": "N", "index_axis": "J"})
    return b.build(outputs=[y])


@pytest.mark.parametrize("backend", ["reference", "cpu", "cuda"])
def test_index_range_is_raised_before_any_kernel(backend):
    v = np.arange(15, dtype=np.float32).reshape(5, 3)
    for bad in ([0, 1, 5, 2], [0, -1, 2, 3]):
        with pytest.raises(runtime.FormulaError) as err:
            runtime.execute(_gather_program(), inputs={"v": v, "idx": np.array(bad)}, backend=backend)
        assert err.value.code == "index_range"
        assert err.value.path.startswith("$.instructions[0]")
    ok = runtime.execute(_gather_program(), inputs={"v": v, "idx": np.array([4, 0, 2, 2])}, backend=backend)
    np.testing.assert_array_equal(ok["%0"], v[[4, 0, 2, 2]])


def _fused_mix():
    b = ProgramBuilder()
    x = b.input("x", {"T": "T", "D": 8})
    w = b.bank("w", {"E": 6, "D": 8})
    g = b.input("g", {"E": 6})
    m = b.input("m", {"T": "T", "E": 6}, dtype="boolean")
    z = b.input("z", {"T": "T", "E": 6})
    c = b.op("contract", [x, w], {"reduce_axes": [["D", "D"]], "output_axes": ["T", "E"],
                                  "accumulation_dtype": "float32"})
    c = b.op("scale", [c, g], {"factor_axes": ["E"], "accumulation_dtype": "float32"})
    c = b.op("scalar-map", [c], {"mode": "gelu"})
    c = b.op("select", [m, c, z])
    s = b.op("masked-softmax", [c, m], {"axis": "E", "accumulation_dtype": "float32"})
    r = b.op("reduce", [s], {"axis": "E", "mode": "sum", "accumulation_dtype": "float32"})
    t = b.op("permute", [c], {"output_axes": ["E", "T"]})
    return b.build(outputs=[r, t])


@pytest.mark.parametrize("backend", ["cpu", pytest.param("cuda", marks=pytest.mark.slow)])  # (slow: CI)
def test_whole_programs_agree_with_the_reference(backend):
    for program, dims in ((SEED, {"B": 1, "S": 4}), (_fused_mix(), {"T": 5})):
        inputs, banks = random_values(program, dims, seed=3)
        assert_backends_agree(program, inputs, banks, backends=[backend])


@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_seed_in_both_dtypes_on_cpu(dtype):
    import json

    program = json.loads(SEED.read_text())
    for rec in program["bindings"] + program["slots"]:
        rec["value_type"]["dtype"] = dtype
    inputs, banks = random_values(program, {"B": 2, "S": 3}, seed=4)
    assert_backends_agree(program, inputs, banks, backends=["cpu"])


@pytest.mark.slow  # (CI runs the slow set after the suite: README)
def test_cuda_results_come_back_as_host_arrays_for_host_inputs():
    inputs, banks = seed_values(T=2)
    res = runtime.execute(SEED, inputs=inputs, banks=banks, backend="cuda")
    assert isinstance(res["%4"], np.ndarray)


def test_unavailable_cuda_is_backend_unavailable(monkeypatch):
    from runtime.backends.cuda import CudaBackend

    monkeypatch.setattr(CudaBackend, "unavailable_reason", lambda self: "no CUDA GPU or driver was found")
    with pytest.raises(runtime.FormulaError) as err:
        runtime.compile(SEED, "cuda")
    assert err.value.code == "backend_unavailable" and "no CUDA GPU" in err.value.message
    assert runtime.compile(SEED, "cpu") is not None


def test_unknown_backend_names_the_registered_ones():
    with pytest.raises(runtime.FormulaError) as err:
        runtime.compile(SEED, "tpu")
    assert err.value.code == "backend_unavailable" and "cpu" in err.value.message


@pytest.mark.slow  # (CI runs the slow set after the suite: README)
def test_cuda_device_inputs_give_device_results_and_are_checked_on_device():
    from numba import cuda

    inputs, banks = seed_values(T=2)
    d_inputs = {k: cuda.to_device(v) for k, v in inputs.items() if v.ndim}
    d_inputs["lora.gain"] = float(inputs["lora.gain"])  # a number: mixed host/device is fine
    d_banks = {k: cuda.to_device(v) for k, v in banks.items()}
    res = runtime.execute(SEED, inputs=d_inputs, banks=d_banks, backend="cuda")
    out = res["%4"]
    from runtime.kernels.arrays import is_device_array

    assert is_device_array(out)
    np.testing.assert_allclose(out.copy_to_host(), expected(inputs, banks), rtol=1e-4, atol=1e-3)
    bad = inputs["x"].copy()
    bad[0, 1, 7] = np.nan
    with pytest.raises(runtime.FormulaError) as err:
        runtime.execute(SEED, inputs={**d_inputs, "x": cuda.to_device(bad)}, banks=d_banks, backend="cuda")
    assert err.value.code == "nonfinite" and err.value.path == "$.inputs.x" and "[0, 1, 7]" in err.value.message
    with pytest.raises(runtime.FormulaError) as err:
        runtime.execute(SEED, inputs=d_inputs, banks=d_banks, backend="cpu")
    assert err.value.code == "binding_dtype"


def test_reshape_infers_a_new_symbol_at_plan_time_without_input_symbols():
    b = ProgramBuilder()
    v = b.input("v", {"N": 12})
    y = b.op("reshape", [v], {"output_axes": ["R", "C"], "output_sizes": ["R", 4]})
    res = runtime.execute(b.build(outputs=[y]), inputs={"v": np.arange(12.0, dtype=np.float32)})
    np.testing.assert_array_equal(res["%0"], np.arange(12.0, dtype=np.float32).reshape(3, 4))


def test_finiteness_of_an_epilogue_operand_is_checked_by_the_kernel_that_reads_it():
    exe = runtime.compile(SEED, "cpu")
    inputs, banks = seed_values(T=4)
    for _ in range(3):  # the second run arms the fast path, the third defers the check
        exe.run(inputs=inputs, banks=banks)
    compiled = next(iter(exe._plans.values()))
    every = {"x", "base", "lora.gain", "lora.A", "lora.B"}
    assert compiled.deferred_finite == every  # x: tile by tile in group 1, before BLAS reads it
    assert exe._by_structure and all(exe._binder._deferred(k) == every for k in exe._by_structure)
    trace = exe.run(inputs=inputs, banks=banks, trace=True).trace
    assert [set(rec.get("checks_finite", ())) for rec in trace] == [{"x", "lora.A"},
                                                                    {"lora.B", "base", "lora.gain"}]
    with pytest.raises(runtime.FormulaError) as err:
        exe.run(inputs={**inputs, "lora.gain": np.float32(np.inf)}, banks=banks)
    assert (err.value.code, err.value.path) == ("nonfinite", "$.inputs.lora.gain")
    for name, where in (("base", (0, 1, 7)), ("x", (0, 3, 1000)), ("x", (0, 0, 0)), ("lora.B", (5, 31))):
        kind = "banks" if name.startswith("lora.") else "inputs"
        values = {"inputs": dict(inputs), "banks": dict(banks)}
        bad = values[kind][name].copy()
        bad[where] = np.inf
        values[kind][name] = bad
        with pytest.raises(runtime.FormulaError) as err:
            exe.run(**values)
        assert (err.value.code, err.value.path) == ("nonfinite", f"$.{kind}.{name}")
        assert str(list(where)) in err.value.message
    a = banks["lora.A"]
    for layout, bank in (("fortran", np.asfortranarray(a)),  # the kernel scans its transpose
                         ("strided", np.repeat(a, 2, axis=1)[:, ::2])):  # no flat view: the runner
        bank = bank.copy(order="K") if layout == "fortran" else bank
        bank[3, 17] = np.nan
        with pytest.raises(runtime.FormulaError) as err:
            exe.run(inputs=inputs, banks={**banks, "lora.A": bank})
        assert err.value.path == "$.banks.lora.A" and "[3, 17]" in err.value.message, layout
    fortran = np.asfortranarray(inputs["x"])  # no flat view for the kernel: scanned by the runner
    fortran[0, 2, 5] = np.nan
    with pytest.raises(runtime.FormulaError) as err:
        exe.run(inputs={**inputs, "x": fortran}, banks=banks)
    assert err.value.path == "$.inputs.x" and "[0, 2, 5]" in err.value.message
    bad = inputs["base"].copy()
    bad[0, 2, 3] = np.nan
    sentinel = np.full((1, 4, 1024), 7.0, np.float32)
    with pytest.raises(runtime.FormulaError) as err:  # with out=, checked before any kernel
        exe.run(inputs={**inputs, "base": bad}, banks=banks, out={"%4": sentinel})
    assert err.value.code == "nonfinite" and "[0, 2, 3]" in err.value.message
    np.testing.assert_array_equal(sentinel, 7.0)
    np.testing.assert_allclose(exe.run(inputs=inputs, banks=banks)["%4"], expected(inputs, banks),
                               rtol=1e-4, atol=1e-3)


def test_the_first_run_at_a_new_extent_leaves_the_finiteness_its_kernels_count_to_them(monkeypatch):
    """A new structure (a new extent) is bound without the finiteness passes: the plan built
    or found for it says which floats its kernels count as they read them, and only the others
    are scanned before it runs. So a new extent scans no bank twice, and a non-finite value
    met there is still named, at its path and index, and never reaches an ``out`` array."""
    from runtime.execution import bindings

    exe = runtime.compile(SEED, "cpu", tiered=False)
    inputs, banks = seed_values(T=4)
    exe.run(inputs=inputs, banks=banks)
    scanned = []
    plain = bindings._all_finite
    monkeypatch.setattr(bindings, "_all_finite", lambda a: scanned.append(a) or plain(a))
    inputs5, _ = seed_values(T=5)
    got = exe.run(inputs=inputs5, banks=banks)["%4"]
    np.testing.assert_allclose(got, expected(inputs5, banks), rtol=1e-4, atol=1e-3)
    assert not any(a is v for a in scanned for v in (*inputs5.values(), *banks.values()) if v.ndim)
    for T, kind, name, where in ((6, "banks", "lora.B", (5, 31)), (7, "inputs", "x", (0, 6, 1000)),
                                 (8, "inputs", "base", (0, 0, 3))):
        fresh, _ = seed_values(T=T)
        values = {"inputs": fresh, "banks": dict(banks)}
        bad = values[kind][name].copy()
        bad[where] = np.inf
        values[kind][name] = bad
        sentinel = np.full((1, T, 1024), 7.0, np.float32)
        with pytest.raises(runtime.FormulaError) as err:  # with out=: checked before any kernel
            exe.run(**values, out={"%4": sentinel})
        assert (err.value.code, err.value.path) == ("nonfinite", f"$.{kind}.{name}")
        assert str(list(where)) in err.value.message
        np.testing.assert_array_equal(sentinel, 7.0)
        with pytest.raises(runtime.FormulaError) as err:  # again: now counted by the kernels
            exe.run(**values)
        assert (err.value.code, err.value.path) == ("nonfinite", f"$.{kind}.{name}")
    b = ProgramBuilder()  # a lookup's kernel reads only the rows it is asked for: it counts nothing
    table, ids = b.input("table", {"V": 6, "D": 4}), b.input("ids", {"T": "T"}, dtype="int64")
    lookup = runtime.compile(b.build(outputs=[b.op("lookup", [table, ids], {"table_axis": "V",
                                                                          "output_axes": ["T", "D"]})]),
                             "cpu", tiered=False)
    rows = np.arange(24, dtype=np.float32).reshape(6, 4)
    lookup.run(inputs={"table": rows, "ids": np.arange(3)})
    bad = rows.copy()
    bad[5, 2] = np.nan  # a row no id reads, at a new extent
    with pytest.raises(runtime.FormulaError) as err:
        lookup.run(inputs={"table": bad, "ids": np.arange(4)})
    assert (err.value.code, err.value.path) == ("nonfinite", "$.inputs.table") and "[5, 2]" in err.value.message


@pytest.mark.parametrize("tokens, row", [(300, 0), (300, 127), (300, 128), (300, 299), (263, 259), (263, 262)])
def test_the_left_operand_scan_covers_every_tile(tokens, row):
    """x·Aᵀ checks x's rows through their sums (``atoms.contract.render._scan_after``), tile by tile: a bad
    value in any tile, and in the remainder rows of a tile (263: 131 rows, 21 blocks of 6
    and then 4 and 1), is found and named."""
    exe = runtime.compile(SEED, "cpu")
    inputs, banks = seed_values(T=tokens)  # 132-row tiles (about 512 KiB of x each)
    for _ in range(3):
        exe.run(inputs=inputs, banks=banks)
    bad = inputs["x"].copy()
    bad[0, row, 1023] = -np.inf
    with pytest.raises(runtime.FormulaError) as err:
        exe.run(inputs={**inputs, "x": bad}, banks=banks)
    assert err.value.path == "$.inputs.x" and f"[0, {row}, 1023]" in err.value.message


@pytest.mark.parametrize("bad", [np.nan, np.inf, -np.inf])
def test_a_non_finite_left_value_is_found_where_it_meets_only_zero_weights(bad):
    """x·Aᵀ on the micro-kernel with resident banks: a bad x[i, k] must show wherever it is,
    even where every product it enters is with a zero weight."""
    exe = runtime.compile(SEED, "cpu")
    inputs, banks = seed_values(T=300)
    banks = {**banks, "lora.A": banks["lora.A"].copy()}
    banks["lora.A"][:, 17] = 0.0
    resident = exe.load_banks(banks)
    for _ in range(3):
        exe.run(inputs=inputs, banks=resident)
    for row, col in ((0, 17), (299, 17), (150, 3)):
        x = inputs["x"].copy()
        x[0, row, col] = bad
        with pytest.raises(runtime.FormulaError) as err:
            exe.run(inputs={**inputs, "x": x}, banks=resident)
        assert err.value.path == "$.inputs.x" and f"[0, {row}, {col}]" in err.value.message


def test_a_finite_overflow_in_the_outputs_is_no_error():
    exe = runtime.compile(SEED, "cpu")
    inputs, banks = seed_values(T=300)
    x = inputs["x"].copy()
    x[0, 5, :] = 3e38  # finite; its products with A overflow float32
    for _ in range(3):
        got = exe.run(inputs={**inputs, "x": x}, banks=banks)["%4"]
    assert not np.isfinite(got[0, 5]).all() and np.isfinite(np.delete(got[0], 5, axis=0)).all()


@pytest.mark.parametrize("rows", [4, 300])  # one thread, and blocks on several (>= 64K elements)
def test_finiteness_of_a_chain_operand_is_checked_by_the_chain_kernel(rows):
    b = ProgramBuilder()
    a, c = b.input("a", {"T": "T", "D": 256}), b.input("c", {"T": "T", "D": 256})
    f = b.input("f", {"D": 256})  # broadcast over T: read at every row
    y = b.op("scale", [b.op("add", [a, c], {"accumulation_dtype": "float32"}), f],
             {"factor_axes": ["D"], "accumulation_dtype": "float32"})
    exe = runtime.compile(b.build(outputs=[y]), "cpu")
    rng = np.random.default_rng(0)
    inputs = {"a": rng.standard_normal((rows, 256), dtype=np.float32),
              "c": rng.standard_normal((rows, 256), dtype=np.float32),
              "f": rng.standard_normal(256, dtype=np.float32)}
    want = (inputs["a"] + inputs["c"]) * inputs["f"]
    for _ in range(3):  # the second run arms the fast path, the third defers the check
        np.testing.assert_array_equal(exe.run(inputs=inputs)[y], want)
    compiled = next(iter(exe._plans.values()))
    assert compiled.deferred_finite == {"a", "c", "f"} and len(compiled.launches) == 1
    assert set(exe.run(inputs=inputs, trace=True).trace[0]["checks_finite"]) == {"a", "c", "f"}
    for name, where in (("a", (0, 0)), ("c", (rows - 1, 255)), ("f", (200,)), ("a", (rows // 2, 7))):
        bad = inputs[name].copy()
        bad[where] = np.nan if where[-1] % 2 else -np.inf
        with pytest.raises(runtime.FormulaError) as err:
            exe.run(inputs={**inputs, name: bad})
        assert (err.value.code, err.value.path) == ("nonfinite", f"$.inputs.{name}")
        assert str(list(where)) in err.value.message
        sentinel = np.full((rows, 256), 7.0, np.float32)
        with pytest.raises(runtime.FormulaError):  # with out=, checked before any kernel
            exe.run(inputs={**inputs, name: bad}, out={y: sentinel})
        np.testing.assert_array_equal(sentinel, 7.0)
    np.testing.assert_array_equal(exe.run(inputs=inputs)[y], want)


@pytest.mark.parametrize("rows", [3, 300])  # one thread, and blocks on several
def test_a_chain_writing_in_place_of_its_operand_computes_what_the_reference_does(rows):
    b = ProgramBuilder()
    x, y = b.input("x", {"D": 256, "T": "T"}), b.input("y", {"T": "T", "D": 256})
    u = b.op("permute", [x], {"output_axes": ["T", "D"]})  # a temporary the chain reads last
    v = b.op("add", [b.op("scalar-map", [u], {"mode": "tanh"}), y], {"accumulation_dtype": "float32"})
    w = b.op("reduce", [v], {"axis": "D", "mode": "sum", "accumulation_dtype": "float32"})
    program = b.build(outputs=[w])
    rng = np.random.default_rng(1)
    inputs = {"x": rng.standard_normal((256, rows), dtype=np.float32),
              "y": rng.standard_normal((rows, 256), dtype=np.float32)}
    plan = runtime.compile(program, "cpu").plan({"T": rows})
    assert plan.buffers[v].alias_of == u and plan.arena_bytes == plan.buffers[u].nbytes
    assert_backends_agree(program, inputs)


@pytest.mark.parametrize("backend", ["cpu", "cuda"])
def test_a_reshape_of_a_temporary_is_a_view_even_where_a_chain_could_write_in_place(backend):
    """The reshape runs no kernel: its output is the permute's buffer. The tanh chain is that
    buffer's last direct reader, but the view is read after it, so the chain must not write
    there (it would have: tests/test_planner.py)."""
    b = ProgramBuilder()
    x, y = b.input("x", {"D": 8, "T": "T"}), b.input("y", {"T": "T", "D": 8})
    u = b.op("permute", [x], {"output_axes": ["T", "D"]})
    r = b.op("reshape", [u], {"output_axes": ["R", "E"], "output_sizes": ["T", 8]})
    v = b.op("add", [b.op("scalar-map", [u], {"mode": "tanh"}), y], {"accumulation_dtype": "float32"})
    w = b.op("contract", [r, v], {"reduce_axes": [["E", "D"]], "output_axes": ["R", "T"],
                                  "accumulation_dtype": "float32"})
    program = b.build(outputs=[w])
    rng = np.random.default_rng(2)
    inputs = {"x": rng.standard_normal((8, 5), dtype=np.float32),
              "y": rng.standard_normal((5, 8), dtype=np.float32)}
    plan = runtime.compile(program, backend).plan({"T": 5})
    assert plan.buffers[r].alias_of == u and len(plan.views) == 1
    assert plan.buffers[u].last > plan.buffers[r].first
    assert plan.buffers[v].alias_of is None  # (u's last direct reader, but r is read later)
    result = runtime.compile(program, backend).run(inputs=inputs, trace=True)
    assert not any("reshape" in a for rec in result.trace for a in rec["atoms"])
    assert_backends_agree(program, inputs, backends=(backend,))


def test_no_in_place_over_an_operand_that_another_operand_of_the_group_views():
    """scale(u, r) with r a view of u under other axis names: written in place of u, the
    chain would overwrite elements of r it has still to read at other indices."""
    b = ProgramBuilder()
    x = b.input("x", {"D": 8, "T": 8})
    u = b.op("permute", [x], {"output_axes": ["T", "D"]})
    r = b.op("reshape", [u], {"output_axes": ["D", "T"], "output_sizes": [8, 8]})
    y = b.op("scale", [u, r], {"factor_axes": ["D", "T"], "accumulation_dtype": "float32"})
    program = b.build(outputs=[b.op("reduce", [y], {"axis": "D", "mode": "sum", "accumulation_dtype": "float32"})])
    plan = runtime.compile(program, "cpu").plan({})
    assert plan.buffers[r].alias_of == u and plan.buffers[y].alias_of is None
    inputs = {"x": np.random.default_rng(3).standard_normal((8, 8), dtype=np.float32)}
    assert_backends_agree(program, inputs)


def test_a_fused_group_in_place_of_an_epilogue_operand_reads_it_through_its_output():
    """The gated MLP's gate group writes in place of ``up``: the kernel is asked to read it
    through the output (KernelRequest.output_extras), and computes what the reference does."""
    from runtime.plan.planner import output_extras

    b = ProgramBuilder()
    x = b.input("x", {"T": "T", "D": 64})
    w1, w3 = b.bank("w1", {"F": 96, "D": 64}), b.bank("w3", {"F": 96, "D": 64})
    acc = {"accumulation_dtype": "float32"}
    mm = {"reduce_axes": [["D", "D"]], "output_axes": ["T", "F"], **acc}
    v2 = "arti/formula-atom-scalar-map@2"
    up = b.op("scalar-map", [b.op("contract", [x, w3], mm)], {"mode": "softplus", **acc}, ref=v2)
    gate = b.op("scalar-map", [b.op("contract", [x, w1], mm)], {"mode": "silu", **acc}, ref=v2)
    m = b.op("scale", [gate, up], {"factor_axes": ["T", "F"], **acc})
    program = b.build(outputs=[b.op("reduce", [m], {"axis": "F", "mode": "sum", **acc})])
    plan = runtime.compile(program, "cpu").plan({"T": 40})
    (group,) = [g for g in plan.groups if g.output_slot == m]
    assert plan.buffers[m].alias_of == up and output_extras(plan, group) == (0,)
    rng = np.random.default_rng(4)
    assert_backends_agree(program, {"x": rng.standard_normal((40, 64), dtype=np.float32)},
                          {"w1": rng.standard_normal((96, 64), dtype=np.float32) / 8,
                           "w3": rng.standard_normal((96, 64), dtype=np.float32) / 8})


@pytest.mark.parametrize("atom", ["reduce", "masked-softmax"])
@pytest.mark.parametrize("rows", [4, 600])  # one thread, and tasks on several
def test_finiteness_of_a_lone_node_operand_is_checked_by_its_kernel(atom, rows):
    """reduce finds a NaN or ±inf through its sums, masked-softmax in its pass for the row
    maxima, masked entries included."""
    b = ProgramBuilder()
    x = b.input("x", {"T": "T", "D": 256})
    if atom == "reduce":
        y = b.op("reduce", [x], {"axis": "D", "mode": "sum", "accumulation_dtype": "float32"})
    else:
        y = b.op("masked-softmax", [x, b.input("m", {"D": 256}, "boolean")],
                 {"axis": "D", "accumulation_dtype": "float32"})
    program = b.build(outputs=[y])
    exe = runtime.compile(program, "cpu")
    rng = np.random.default_rng(2)
    inputs = {"x": rng.standard_normal((rows, 256), dtype=np.float32)}
    if atom != "reduce":
        inputs["m"] = np.arange(256) % 3 != 0  # D=0, 3, 6... masked
    want = runtime.compile(program, "reference").run(inputs=inputs)[y]
    for _ in range(3):  # the second run arms the fast path, the third defers the check
        np.testing.assert_allclose(exe.run(inputs=inputs)[y], want, rtol=1e-5, atol=1e-6)
    compiled = next(iter(exe._plans.values()))
    assert compiled.deferred_finite == {"x"}
    for where in ((0, 0), (rows - 1, 255), (rows // 2, 3)):  # (., 0) and (., 3) are masked
        bad = inputs["x"].copy()
        bad[where] = np.nan if where[0] else np.inf
        with pytest.raises(runtime.FormulaError) as err:
            exe.run(inputs={**inputs, "x": bad})
        assert (err.value.code, err.value.path) == ("nonfinite", "$.inputs.x")
        assert str(list(where)) in err.value.message
    if atom == "reduce":  # finite values whose sum overflows: counted, checked, not an error
        big = np.full((rows, 256), 3e38, np.float32)
        with np.errstate(over="ignore"):
            assert np.isinf(exe.run(inputs={"x": big})[y]).all()


@pytest.mark.parametrize("rows", [4, 600])
def test_a_layout_copy_checks_the_finiteness_of_what_it_reads_in_full(rows):
    b = ProgramBuilder()
    x = b.input("x", {"T": "T", "D": 256})
    y = b.op("permute", [x], {"output_axes": ["D", "T"]})
    z = b.op("slice", [b.input("s", {"T": "T", "D": 256})], {"axis": "D", "start": 0, "stop": 8, "step": 1})
    exe = runtime.compile(b.build(outputs=[y, z]), "cpu")
    rng = np.random.default_rng(3)
    inputs = {"x": rng.standard_normal((rows, 256), dtype=np.float32),
              "s": rng.standard_normal((rows, 256), dtype=np.float32)}
    for _ in range(3):
        got = exe.run(inputs=inputs)
    np.testing.assert_array_equal(got[y], inputs["x"].T)
    assert next(iter(exe._plans.values())).deferred_finite == {"x"}  # a slice reads part of s: the run scans it
    for name, where in (("x", (rows - 1, 200)), ("s", (0, 100))):  # s: NaN outside the slice still fails
        bad = inputs[name].copy()
        bad[where] = np.nan
        with pytest.raises(runtime.FormulaError) as err:
            exe.run(inputs={**inputs, name: bad})
        assert (err.value.code, err.value.path) == ("nonfinite", f"$.inputs.{name}")
        assert str(list(where)) in err.value.message


# --- random programs of views, in-place chains and contractions ------------------------------

_ACC = {"accumulation_dtype": "float32"}
_AXES = {"AB": ["A", "B"], "BA": ["B", "A"]}  # two classes of 6 x 6 values: views swap them


@st.composite
def _aliasing_programs(draw):
    """Chains over [A, B] and [B, A] values where reshapes (views), permutes (copies),
    elementwise chains (in place where their operand dies) and contractions interleave, so
    buffers are shared in every way the planner allows."""
    b = ProgramBuilder()
    pool = {"AB": [b.input("x", {"A": 6, "B": 6})], "BA": [b.input("y", {"B": 6, "A": 6})]}
    w = b.bank("w", {"E": 6, "B": 6})
    made = []
    for _ in range(draw(st.integers(2, 10))):
        cls = draw(st.sampled_from(["AB", "BA"]))
        other = "BA" if cls == "AB" else "AB"
        pick = lambda c: draw(st.sampled_from(pool[c]))  # noqa: E731
        kind = draw(st.sampled_from(["view", "permute", "tanh", "add", "scale", "contract"]))
        if kind == "view":  # the same memory under the other class's names
            slot, out = b.op("reshape", [pick(cls)], {"output_axes": _AXES[other], "output_sizes": [6, 6]}), other
        elif kind == "permute":
            slot, out = b.op("permute", [pick(cls)], {"output_axes": _AXES[other]}), other
        elif kind == "tanh":
            slot, out = b.op("scalar-map", [pick(cls)], {"mode": "tanh"}), cls
        elif kind == "add":
            slot, out = b.op("add", [pick(cls), pick(cls)], _ACC), cls
        elif kind == "scale":  # a factor in the other axis order: read transposed
            slot, out = b.op("scale", [pick(cls), pick(other)], {"factor_axes": _AXES[other], **_ACC}), cls
        else:  # [.., B] x [E, B] -> [A, E], viewed back as [A, B]
            src = pick("AB")
            c = b.op("contract", [src, w], {"reduce_axes": [["B", "B"]], "output_axes": ["A", "E"], **_ACC})
            slot, out = b.op("reshape", [c], {"output_axes": ["A", "B"], "output_sizes": [6, 6]}), "AB"
        pool[out].append(slot)
        made.append(slot)
    outputs = list(dict.fromkeys([made[-1], *draw(st.lists(st.sampled_from(made), max_size=2))]))
    return b.build(outputs=outputs)


@settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(_aliasing_programs(), st.integers(0, 2 ** 16))
def test_random_programs_sharing_buffers_agree_with_the_reference(program, seed):
    rng = np.random.default_rng(seed)
    inputs = {"x": rng.standard_normal((6, 6), dtype=np.float32), "y": rng.standard_normal((6, 6), dtype=np.float32)}
    assert_backends_agree(program, inputs, {"w": rng.standard_normal((6, 6), dtype=np.float32) / 3})
