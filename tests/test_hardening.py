"""Hostile inputs of issue #17 (D1-D3, D7): each is refused with its §6 code before any work
proportional to what it declares, within generous bounds on time and on memory (tracemalloc
sees NumPy's data allocations)."""
from __future__ import annotations

import json
import time
import tracemalloc
import zipfile

import numpy as np
import pytest
from numpy.lib import format as npformat

import runtime
from runtime.kernels import codegen

from .spec.builders import BANK_SOURCE, ProgramBuilder

SECONDS = 2.0
PEAK_BYTES = 200 << 20


class Bounded:
    """Asserts that the block ran under ``SECONDS`` and allocated under ``PEAK_BYTES``."""

    def __init__(self, seconds: float = SECONDS):
        self.seconds = seconds

    def __enter__(self):
        tracemalloc.start()
        self.t0 = time.perf_counter()
        return self

    def __exit__(self, *exc):
        elapsed = time.perf_counter() - self.t0
        peak = tracemalloc.get_traced_memory()[1]
        tracemalloc.stop()
        assert elapsed < self.seconds, f"took {elapsed:.1f} s"
        assert peak < PEAK_BYTES, f"allocated {peak} bytes"
        return False


def _relu_program(**limits) -> dict:
    b = ProgramBuilder()
    b.input("x", ["N"])
    b.op("scalar-map", ["x"], {"mode": "relu"}, ["N"])
    return b.build(**limits)


@pytest.mark.parametrize("backend", ["reference", "cpu"])
@pytest.mark.parametrize("order", ["<", ">"])
def test_d1_a_zero_stride_view_is_refused_for_its_size_before_its_values_are_read(backend, order):
    exe = runtime.compile(_relu_program(max_axis_extent=1 << 40, max_tensor_elements=1 << 28), backend=backend)
    # 4 bytes of memory declaring 2**31 elements, all 3e38 (a finiteness scan would sum them)
    x = np.lib.stride_tricks.as_strided(np.array([3e38], dtype=order + "f4"), shape=(1 << 31,), strides=(0,))
    with Bounded(), pytest.raises(runtime.FormulaError) as err:
        exe.run(inputs={"x": x})
    assert err.value.code == "limit_exceeded" and err.value.path == "$.inputs.x"
    assert "max_tensor_elements" in err.value.message


def _huge_broadcast() -> dict:
    b = ProgramBuilder()
    b.input("x", ["N"], [1])
    b.op("broadcast", ["x"], {"output_axes": ["N", "M"], "output_sizes": [10**6, 10**6]}, ["N", "M"],
         [10**6, 10**6])
    big = 10**16
    return b.build(max_working_bytes=big, max_tensor_bytes=big, max_tensor_elements=big, max_axis_extent=big)


@pytest.mark.parametrize("backend", ["reference", "cpu"])
def test_d2_a_program_cannot_raise_the_runtime_memory_ceiling(backend):
    with Bounded(), pytest.raises(runtime.FormulaError) as err:
        runtime.execute(_huge_broadcast(), inputs={"x": np.ones(1, np.float32)}, backend=backend)
    assert err.value.code == "limit_exceeded"
    assert "runtime memory limit" in err.value.message and "max_working_bytes" in err.value.message


def test_d2_the_ceiling_is_set_per_executable_and_by_environment(monkeypatch):
    prog = _relu_program()
    x = np.ones(1 << 16, np.float32)  # 256 KiB in, 256 KiB out
    assert runtime.compile(prog, backend="reference", memory_limit="1M").run(inputs={"x": x})["%0"].shape == x.shape
    for exe in (runtime.compile(prog, backend="reference", memory_limit=300_000),
                (monkeypatch.setenv("FORMULA_MEMORY_LIMIT", "300K"), runtime.compile(prog, backend="reference"))[1]):
        assert exe.memory_limit < 600_000
        with pytest.raises(runtime.FormulaError) as err:
            exe.run(inputs={"x": x})
        assert err.value.code == "limit_exceeded" and "runtime memory limit" in err.value.message
    for bad in (0, -1, "lots", True):
        with pytest.raises(runtime.FormulaError) as err:
            runtime.compile(prog, backend="reference", memory_limit=bad)
        assert err.value.code == "schema"


def test_d2_no_memory_error_escapes_the_public_api(monkeypatch):
    exe = runtime.compile(_relu_program(), backend="reference")

    def exhausted(*args, **kwargs):
        raise MemoryError("Unable to allocate 3.64 TiB")

    monkeypatch.setattr(exe._binder, "bind", exhausted)
    with pytest.raises(runtime.FormulaError) as err:
        exe.run(inputs={"x": np.ones(4, np.float32)})
    assert err.value.code == "limit_exceeded" and "3.64 TiB" in err.value.message


def _npz_bomb(path, elements: int) -> None:
    """An npz member declaring float32[elements] whose zeros compress to about 1 MB."""
    with zipfile.ZipFile(path, "w", compression=zipfile.ZIP_DEFLATED) as zf:
        with zf.open("w.npy", "w", force_zip64=True) as f:
            npformat.write_array_header_1_0(f, {"descr": "<f4", "fortran_order": False, "shape": (elements,)})
            chunk = bytes(1 << 20)
            for _ in range(elements * 4 >> 20):
                f.write(chunk)


def _bank_program(**limits) -> dict:
    b = ProgramBuilder()
    b.bank("w", ["N"], partition_id="w", source_ref=BANK_SOURCE)
    b.op("scalar-map", ["w"], {"mode": "relu"}, ["N"])
    return b.build(**limits)


def test_d3_an_npz_member_is_checked_by_its_header_before_it_is_inflated(tmp_path):
    path = tmp_path / "bomb.npz"
    _npz_bomb(path, 1 << 26)  # 256 MiB inflated, 250 KB on disk
    exe = runtime.compile(_bank_program(max_axis_extent=1 << 30, max_tensor_elements=1 << 22),
                          backend="reference")
    store = runtime.open_bank_store(path)
    with Bounded(), pytest.raises(runtime.FormulaError) as err:
        exe.run(banks=store)
    assert err.value.code == "limit_exceeded" and err.value.path == "$.banks.w"
    assert "has 67108864 elements" in err.value.message


@pytest.mark.parametrize("fmt", ["npz", "safetensors"])
def test_d3_a_stored_tensor_of_the_wrong_rank_or_dtype_is_refused_from_its_header(tmp_path, fmt):
    from safetensors.numpy import save_file

    exe = runtime.compile(_bank_program(), backend="reference")
    for value, code in ((np.ones((2, 3), np.float32), "binding_shape"), (np.ones(3, np.int64), "binding_dtype")):
        path = tmp_path / f"w.{fmt}"
        np.savez(path, w=value) if fmt == "npz" else save_file({"w": value}, str(path))
        with pytest.raises(runtime.FormulaError) as err:
            exe.run(banks=runtime.open_bank_store(path))
        assert err.value.code == code and "header" in err.value.message


def _chain(n: int, modes=("relu", "tanh", "sigmoid", "silu"), size: int = 8) -> dict:
    b = ProgramBuilder()
    prev = b.input("x", ["N"], [size])
    for i in range(n):
        prev = b.op("scalar-map", [prev], {"mode": modes[i % len(modes)]}, ["N"], [size])
    return b.build(max_slots=n + 1, max_instructions=n, max_steps=n)


def test_d7_loading_is_linear_in_the_instruction_count():
    small, large = json.dumps(_chain(2_000)), json.dumps(_chain(20_000))
    runtime.load_program(small)  # plugins loaded, caches warm

    def best(src: str, tries: int) -> float:  # best of a few: a busy neighbour only adds time
        times = []
        for _ in range(tries):
            t0 = time.perf_counter()
            runtime.load_program(src)
            times.append(time.perf_counter() - t0)
        return min(times)

    t_small = best(small, 5)
    t_large = best(large, 3)  # took over 120 s when validation was quadratic
    assert t_large < 10
    # 10x the instructions: quadratic would take 100x; 50x leaves room for the garbage
    # collector's passes over more live objects and a busy neighbour (30x once failed at 30.6x)
    assert t_large < 50 * max(t_small, 0.01)


@pytest.mark.slow  # (CI runs the slow set after the suite: README)
def test_d7_a_thousand_step_elementwise_chain_compiles_and_runs_on_cpu_from_an_empty_cache(
        tmp_path, monkeypatch):
    monkeypatch.setenv("FORMULA_CACHE_DIR", str(tmp_path))
    monkeypatch.setattr(codegen, "_usable", {})
    monkeypatch.setattr(codegen, "_modules", {})  # no kernel generated earlier in this process
    prog = _chain(1_000, modes=("gelu", "tanh", "sigmoid", "silu", "relu"))
    x = np.linspace(-3, 3, 8, dtype=np.float32)
    t0 = time.perf_counter()
    got = runtime.execute(prog, inputs={"x": x}, backend="cpu")
    assert time.perf_counter() - t0 < 30  # > 120 s when the chain was one kernel
    want = runtime.execute(prog, inputs={"x": x}, backend="reference")
    last = f"%{999}"
    np.testing.assert_allclose(got[last], want[last], rtol=1e-5, atol=1e-6)
    groups = runtime.compile(prog, backend="cpu").plan().groups
    assert max(len(g.nodes) for g in groups) <= 32
