"""Resident banks (``Executable.load_banks``): checked once, owned copies, the same results,
no per-run bank checks, and every misuse a FormulaError."""
from __future__ import annotations

import threading
from pathlib import Path

import numpy as np
import pytest
from safetensors.numpy import save_file

import runtime
import runtime.execution.bindings as bindings
from runtime.execution.banks import tensor_fingerprint
from runtime.testing import ProgramBuilder, random_values

SEED = Path(__file__).resolve().parents[1] / "examples" / "seed-lora-silu.program.json"


def seed_values(T=8, seed=0, dtype=None):
    inputs, banks = random_values(SEED, {"B": 1, "S": T}, seed=seed)
    if dtype:
        inputs = {k: v.astype(dtype) for k, v in inputs.items()}
        banks = {k: v.astype(dtype) for k, v in banks.items()}
    return inputs, banks


def raises(code, path, fn, *args, match=None, **kwargs):
    with pytest.raises(runtime.FormulaError) as info:
        fn(*args, **kwargs)
    assert (info.value.code, info.value.path) == (code, path), info.value
    if match:
        assert match in info.value.message, info.value.message
    return info.value


@pytest.mark.parametrize("backend", ["reference", "cpu"])
def test_resident_banks_give_the_results_of_banks_passed_per_run(backend):
    exe = runtime.compile(SEED, backend)
    for T in (1, 5, 8, 300):  # (300: both products on micro-kernels that pack a bank)
        inputs, banks = seed_values(T=T, seed=T)
        want = np.array(exe.run(inputs=inputs, banks=banks)["%4"])
        resident = exe.load_banks(banks)
        for _ in range(3):  # the full path, then the binder's fast path
            got = exe.run(inputs=inputs, banks=resident)["%4"]
            np.testing.assert_array_equal(got, want)


def test_loaded_values_are_copies_that_caller_changes_do_not_reach():
    exe = runtime.compile(SEED, "cpu")
    inputs, banks = seed_values()
    want = np.array(exe.run(inputs=inputs, banks=banks)["%4"])
    resident = exe.load_banks(banks)
    banks["lora.A"][:] = np.nan  # after loading: neither a wrong result nor an error
    banks["lora.B"] *= 3
    np.testing.assert_array_equal(exe.run(inputs=inputs, banks=resident)["%4"], want)
    view = resident.values["lora.A"]
    assert not view.flags.writeable and np.isfinite(view).all()
    with pytest.raises(ValueError):
        view[0, 0] = 1.0
    with pytest.raises(TypeError):
        resident.values["lora.A"] = view
    assert "lora.A: float32[32, 1024]" in repr(resident) and "'cpu'" in repr(resident)


def test_strided_banks_are_loaded_as_contiguous_copies():
    exe = runtime.compile(SEED, "cpu")
    inputs, banks = seed_values()
    strided = {"lora.A": np.asfortranarray(banks["lora.A"]), "lora.B": banks["lora.B"].T.copy().T}
    resident = exe.load_banks(strided)
    assert all(v.flags.c_contiguous for v in resident.values.values())
    np.testing.assert_array_equal(exe.run(inputs=inputs, banks=resident)["%4"],
                                  exe.run(inputs=inputs, banks=banks)["%4"])


def test_loading_checks_every_bank_rule():
    exe = runtime.compile(SEED, "cpu")
    _, banks = seed_values()
    raises("binding_keys", "$.banks", exe.load_banks, {"lora.A": banks["lora.A"]}, match="lora.B")
    raises("binding_shape", "$.banks.lora.A", exe.load_banks, {**banks, "lora.A": banks["lora.A"][:16]})
    raises("binding_dtype", "$.banks.lora.B", exe.load_banks,
           {**banks, "lora.B": banks["lora.B"].astype(np.float64)})
    bad = banks["lora.B"].copy()
    bad[3, 4] = np.inf
    raises("nonfinite", "$.banks.lora.B", exe.load_banks, {**banks, "lora.B": bad}, match="[3, 4]")
    raises("schema", "$.banks", exe.load_banks, [banks["lora.A"]])


def test_runs_with_resident_banks_still_check_every_input():
    exe = runtime.compile(SEED, "cpu")
    inputs, banks = seed_values()
    resident = exe.load_banks(banks)
    exe.run(inputs=inputs, banks=resident)
    exe.run(inputs=inputs, banks=resident)  # arms the fast path
    bad = inputs["x"].copy()
    bad[0, 2, 5] = np.nan
    raises("nonfinite", "$.inputs.x", exe.run, inputs={**inputs, "x": bad}, banks=resident, match="[0, 2, 5]")
    bad_base = inputs["base"].copy()
    bad_base[0, 1, 1] = -np.inf
    for _ in range(2):
        raises("nonfinite", "$.inputs.base", exe.run, inputs={**inputs, "base": bad_base}, banks=resident)
    raises("binding_keys", "$.inputs", exe.run, inputs={"x": inputs["x"]}, banks=resident)
    raises("binding_shape", "$.inputs.x", exe.run,
           inputs={**inputs, "x": inputs["x"][..., :512]}, banks=resident)


def test_no_kernel_scans_resident_banks():
    """Per-run banks are counted for finiteness by the kernels that read them; resident
    ones were checked at load and are not (the trace names what each kernel counts)."""
    exe = runtime.compile(SEED, "cpu")
    inputs, banks = seed_values()
    resident = exe.load_banks(banks)

    def counted(b):
        exe.run(inputs=inputs, banks=b)
        trace = exe.run(inputs=inputs, banks=b, trace=True).trace
        return {slot for record in trace for slot in record.get("checks_finite", ())}

    assert {"lora.A", "lora.B"} <= counted(banks)
    assert not {"lora.A", "lora.B"} & counted(resident)
    assert {"x", "base"} <= counted(resident)


def symbol_program(fingerprint=None):
    b = ProgramBuilder()
    x = b.input("x", {"T": "T", "D": "D"})
    w = b.bank("w", {"E": "E", "D": "D"}, asset_fingerprint=fingerprint)
    y = b.op("contract", [x, w], {"reduce_axes": [["D", "D"]], "output_axes": ["T", "E"],
                                  "accumulation_dtype": "float32"})
    return b.build(outputs=[y])


def test_extents_fixed_by_resident_banks_bind_the_inputs():
    exe = runtime.compile(symbol_program(), "cpu")
    rng = np.random.default_rng(0)
    w = rng.standard_normal((3, 4)).astype(np.float32)
    resident = exe.load_banks({"w": w})
    assert dict(resident.dims) == {"E": 3, "D": 4}
    x = rng.standard_normal((5, 4)).astype(np.float32)
    np.testing.assert_allclose(exe.run(inputs={"x": x}, banks=resident)["%0"], x @ w.T, rtol=1e-5)
    err = raises("symbol_conflict", "$.inputs.x", exe.run, inputs={"x": x[:, :2]}, banks=resident)
    assert "$.banks.w" in err.message and "'D'" in err.message


def test_fingerprints_are_verified_once_at_load(monkeypatch):
    rng = np.random.default_rng(1)
    w = rng.standard_normal((3, 4)).astype(np.float32)
    x = rng.standard_normal((2, 4)).astype(np.float32)
    raises("bank_identity", "$.banks.w", runtime.compile(symbol_program("0" * 64), "cpu").load_banks, {"w": w})
    exe = runtime.compile(symbol_program(tensor_fingerprint(w)), "cpu")
    hashed = []
    real = bindings.tensor_fingerprint
    monkeypatch.setattr(bindings, "tensor_fingerprint", lambda a: hashed.append(a.shape) or real(a))
    exe.run(inputs={"x": x}, banks={"w": w})
    exe.run(inputs={"x": x}, banks={"w": w})
    assert len(hashed) == 2  # per-run banks: verified on every run
    resident = exe.load_banks({"w": w})
    assert len(hashed) == 3
    for _ in range(3):
        np.testing.assert_allclose(exe.run(inputs={"x": x}, banks=resident)["%0"], x @ w.T, rtol=1e-5)
    assert len(hashed) == 3


def test_banks_from_a_store_can_be_made_resident(tmp_path):
    _, banks = seed_values()
    path = tmp_path / "lora.safetensors"
    save_file(banks, str(path))
    exe = runtime.compile(SEED, "cpu")
    resident = exe.load_banks(runtime.open_bank_store(str(path)))
    inputs, _ = seed_values()
    np.testing.assert_array_equal(exe.run(inputs=inputs, banks=resident)["%4"],
                                  exe.run(inputs=inputs, banks=banks)["%4"])
    again = exe.load_banks(resident)  # loading resident banks again checks and copies them again
    assert again.values["lora.A"] is not resident.values["lora.A"]
    np.testing.assert_array_equal(again.values["lora.B"], banks["lora.B"])


def test_resident_banks_serve_only_programs_with_the_same_bank_bindings():
    _, banks = seed_values()
    resident = runtime.compile(SEED, "cpu").load_banks(banks)
    inputs, _ = seed_values()
    other = runtime.compile(SEED, "reference")  # same program, another host backend: fine
    np.testing.assert_allclose(other.run(inputs=inputs, banks=resident)["%4"],
                               other.run(inputs=inputs, banks=banks)["%4"])
    w_exe = runtime.compile(symbol_program(), "cpu")
    raises("bank_identity", "$.banks", w_exe.run, inputs={"x": np.ones((2, 4), np.float32)},
           banks=resident, match="load_banks")


def test_device_backend_holds_device_copies_and_refuses_host_loaded_banks():
    """On the CUDA simulator, so on a small program (it runs a Python thread per element)."""
    from runtime.kernels.arrays import is_device_array

    program = symbol_program()
    rng = np.random.default_rng(2)
    banks = {"w": rng.standard_normal((3, 4)).astype(np.float32)}
    cuda_exe = runtime.compile(program, "cuda")
    resident = cuda_exe.load_banks(banks)
    assert all(is_device_array(v) for v in resident.on_backend.values())
    for T in (2, 5):
        inputs = {"x": rng.standard_normal((T, 4)).astype(np.float32)}
        for _ in range(2):  # the full path, then the binder's fast path
            got = cuda_exe.run(inputs=inputs, banks=resident)["%0"]
            assert isinstance(got, np.ndarray)  # host inputs: host results, as with per-run banks
            np.testing.assert_array_equal(got, cuda_exe.run(inputs=inputs, banks=banks)["%0"])
    host_loaded = runtime.compile(program, "cpu").load_banks(banks)
    raises("bank_identity", "$.banks", cuda_exe.run, inputs=inputs, banks=host_loaded, match="'cpu'")
    cpu = runtime.compile(program, "cpu")  # device-loaded banks keep host copies: any host backend
    np.testing.assert_array_equal(cpu.run(inputs=inputs, banks=resident)["%0"],
                                  cpu.run(inputs=inputs, banks=banks)["%0"])


def test_concurrent_runs_share_resident_banks():
    exe = runtime.compile(SEED, "cpu")
    _, banks = seed_values()
    resident = exe.load_banks(banks)
    cases = [seed_values(seed=s)[0] for s in range(4)]
    want = [np.array(exe.run(inputs=i, banks=banks)["%4"]) for i in cases]
    errors = []

    def worker(k):
        try:
            for _ in range(20):
                np.testing.assert_array_equal(exe.run(inputs=cases[k], banks=resident)["%4"], want[k])
        except BaseException as exc:  # noqa: BLE001 - reported below
            errors.append(exc)

    threads = [threading.Thread(target=worker, args=(k,)) for k in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors[0]


def test_float64_banks_and_a_python_number_bank_take_the_banks_dtype():
    b = ProgramBuilder()
    x = b.input("x", {"N": 3}, dtype="floating")
    g = b.bank("g", {}, dtype="floating")
    y = b.op("scale", [x, g], {"factor_axes": [], "accumulation_dtype": "float32"})
    exe = runtime.compile(b.build(outputs=[y]), "cpu")
    resident = exe.load_banks({"g": 2.0})
    assert resident.values["g"].dtype == np.float64  # no other float bank to agree with
    x64 = np.arange(3.0)
    np.testing.assert_array_equal(exe.run(inputs={"x": x64}, banks=resident)["%0"], 2 * x64)


def _packs(exe):
    """The resident-pack caches of the executable's contract kernels (atoms.contract.factory)."""
    found = []
    for compiled in exe._plans.values():
        for launch in compiled.launches:
            call = launch.kernel.compiled
            for p in getattr(call, "params", ()):
                if p.kind == "derived":
                    found.append(p.value)
    return found


def _entries(packs, residents) -> int:
    """The entries of a resident-pack cache that hold one of these resident banks' values (the
    cache is shared by every kernel that packs alike, other tests' values included)."""
    ours = {id(a) for r in residents for a in r.on_backend.values()}
    return sum(1 for key, (ref, _) in list(packs._packed.items()) if key in ours and ref() is not None)


def test_a_resident_right_operand_is_packed_once_per_value_and_never_stale():
    import gc

    program = SEED  # (packing is dtype-blind; float64 bcast tiles are checked in test_contract)
    exe = runtime.compile(program, "cpu")
    T = 96  # h·Bᵀ on a micro-kernel that packs its right operand (bcast, or blocked on AVX-512)
    inputs, banks = random_values(program, {"B": 1, "S": T}, seed=1)
    _, other = random_values(program, {"B": 1, "S": T}, seed=2)
    per_run = exe.run(inputs=inputs, banks=banks)["%4"].copy()
    first = exe.load_banks(banks)
    got = exe.run(inputs=inputs, banks=first)["%4"].copy()
    np.testing.assert_array_equal(got, per_run)  # the same packed values, the same sums
    packs = _packs(exe)  # (h·Bᵀ's; on AVX-512 x·Aᵀ's bcast tiles pack A too)
    assert 1 <= len(packs) <= 2 and all(_entries(p, [first]) == 1 for p in packs)
    calls, originals = [], [p._pack for p in packs]
    for p in packs:
        p._pack = (lambda pack: lambda value: calls.append(1) or pack(value))(p._pack)
    try:
        for trace in (False, True, False):  # the driver and kernel by kernel both take it
            np.testing.assert_array_equal(exe.run(inputs=inputs, banks=first, trace=trace)["%4"], per_run)
        assert calls == []
        # a new extent's plan packs nothing: its kernels share the packs of the last plan's
        more, _ = random_values(program, {"B": 1, "S": T + 40}, seed=3)
        want = exe.run(inputs=more, banks=banks)["%4"].copy()
        np.testing.assert_array_equal(exe.run(inputs=more, banks=first)["%4"], want)
        assert calls == [] and {id(p) for p in _packs(exe)} == {id(p) for p in packs}
        second = exe.load_banks(other)  # same shapes, other values: packed anew, never the old pack
        want = exe.run(inputs=inputs, banks=other)["%4"].copy()
        np.testing.assert_array_equal(exe.run(inputs=inputs, banks=second)["%4"], want)
        assert calls == [1] * len(packs) and all(_entries(p, [first, second]) == 2 for p in packs)
        np.testing.assert_array_equal(exe.run(inputs=inputs, banks=first)["%4"], per_run)
        first_ids = {id(a) for a in first.on_backend.values()}
        del first
        gc.collect()
        # the dead value's pack went with it
        assert all(_entries(p, [second]) == 1 and not first_ids & set(p._packed) for p in packs)
    finally:
        for p, pack in zip(packs, originals):  # (shared with later tests' kernels)
            p._pack = pack


def mlp_program(d=160, f=300, e=272, mode="gelu"):
    """x[T, D] · W1ᵀ → ``mode`` → · W2ᵀ → [T, E]: with the default sizes both products take the
    blocked GEMM (N ≥ 256, K ≥ 128). Returns the program and its output's name."""
    b = ProgramBuilder()
    x = b.input("x", {"T": "T", "D": d})
    w1, w2 = b.bank("w1", {"F": f, "D": d}), b.bank("w2", {"E": e, "F": f})
    h = b.op("contract", [x, w1], {"reduce_axes": [["D", "D"]], "output_axes": ["T", "F"],
                                   "accumulation_dtype": "float32"})
    h = b.op("scalar-map", [h], {"mode": mode})
    y = b.op("contract", [h, w2], {"reduce_axes": [["F", "F"]], "output_axes": ["T", "E"],
                                   "accumulation_dtype": "float32"})
    return b.build(outputs=[y]), y


def test_resident_banks_packed_for_the_blocked_gemm_give_the_per_run_results():
    from atoms.contract import micro

    program, out = mlp_program()
    exe = runtime.compile(program, "cpu")
    for T in (13, 200):
        assert micro.choose_form(1, T, 300, 160) == micro.choose_form(1, T, 272, 300) == "blocked"
        inputs, banks = random_values(program, {"T": T}, seed=T)
        want = np.array(exe.run(inputs=inputs, banks=banks)[out])
        resident = exe.load_banks(banks)
        for _ in range(3):
            np.testing.assert_array_equal(exe.run(inputs=inputs, banks=resident)[out], want)
        ref = runtime.compile(program, "reference").run(inputs=inputs, banks=banks)[out]
        np.testing.assert_allclose(want, ref, rtol=2e-4, atol=2e-4)
