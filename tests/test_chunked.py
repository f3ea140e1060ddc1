"""Chunked runs (``run(chunks=...)``): slices along a free axis equal the whole run bit for bit."""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

import runtime
from runtime import FormulaError
from runtime.build import ProgramBuilder

EXAMPLES = Path(__file__).resolve().parents[1] / "examples"
SEED = json.loads((EXAMPLES / "seed-lora-silu.program.json").read_text())
BACKENDS = ["reference", "cpu"]


def seed(limit: int | None = None) -> dict:
    doc = json.loads(json.dumps(SEED))
    if limit is not None:
        doc["limits"]["max_working_bytes"] = limit
    return doc


def seed_values(b: int, s: int, seed_: int = 0):
    rng = np.random.default_rng(seed_)
    inputs = {"x": rng.standard_normal((b, s, 1024), dtype=np.float32),
              "base": rng.standard_normal((b, s, 1024), dtype=np.float32),
              "lora.gain": np.float32(0.5)}
    banks = {"lora.A": (rng.standard_normal((32, 1024)) * 0.03).astype(np.float32),
             "lora.B": (rng.standard_normal((1024, 32)) * 0.03).astype(np.float32)}
    return inputs, banks


@pytest.fixture(scope="module")
def whole():
    """The unchunked seed results per backend and shape (the oracle of every chunked run)."""
    cache = {}

    def get(backend, b, s):
        key = (backend, b, s)
        if key not in cache:
            inputs, banks = seed_values(b, s)
            cache[key] = runtime.compile(seed(), backend=backend).run(inputs=inputs, banks=banks)["%4"].copy()
        return cache[key]
    return get


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("b, s, limit", [(2, 300, 3 << 20), (1, 200, 1 << 20), (16, 24, 2 << 20)])
def test_auto_chunks_a_run_over_the_limit_bit_for_bit(backend, b, s, limit, whole):
    inputs, banks = seed_values(b, s)
    exe = runtime.compile(seed(limit), backend=backend)
    with pytest.raises(FormulaError) as err:
        exe.run(inputs=inputs, banks=banks)  # without chunks: refused, as before
    assert err.value.code == "limit_exceeded"
    got = exe.run(inputs=inputs, banks=banks, chunks="auto")
    c = got.plan.chunking
    assert c is not None and c.count > 1 and c.slice_working_bytes <= limit < c.whole_working_bytes
    assert got.plan.fits and got.plan.to_dict()["chunking"]["count"] == c.count
    assert "chunked along" in got.plan.describe()
    assert np.array_equal(got["%4"], whole(backend, b, s))


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("chunks", [1, 2, 5, 7, 16, 36])
def test_every_slice_size_gives_the_whole_run_bit_for_bit(backend, chunks, whole):
    inputs, banks = seed_values(3, 37)
    got = runtime.compile(seed(), backend=backend).run(inputs=inputs, banks=banks, chunks=chunks)
    # the leading free axis B (contiguous slices) while it splits, else S (strided slices)
    assert got.plan.chunking.symbol == ("B" if chunks < 3 else "S")
    assert got.plan.chunking.size <= chunks and got.plan.chunking.count > 1
    assert np.array_equal(got["%4"], whole(backend, 3, 37))


@pytest.mark.parametrize("chunks", [1, 5, 13, 40])
def test_slices_on_the_blocked_gemm_give_the_whole_run_bit_for_bit(chunks):
    """An MLP whose products take the blocked GEMM (N >= 256, K >= 128) over 150 rows: a slice
    of 1 to 40 rows computes each element as the whole run does (the form is the whole run's,
    strips are padded)."""
    from atoms.contract import micro
    from tests.test_resident import mlp_program

    program, y = mlp_program(136, 288, 260, "silu")
    assert micro.choose_form(1, 150, 288, 136) == micro.choose_form(1, 150, 260, 288) == "blocked"
    rng = np.random.default_rng(7)
    inputs = {"x": rng.standard_normal((150, 136), dtype=np.float32)}
    banks = {"w1": (rng.standard_normal((288, 136)) * 0.1).astype(np.float32),
             "w2": (rng.standard_normal((260, 288)) * 0.1).astype(np.float32)}
    exe = runtime.compile(program, backend="cpu")
    want = exe.run(inputs=inputs, banks=banks)[y].copy()
    got = exe.run(inputs=inputs, banks=banks, chunks=chunks)
    assert got.plan.chunking.count > 1 or chunks >= 150
    assert np.array_equal(got[y], want)


@pytest.mark.parametrize("chunks", [4, 1])
def test_a_leading_free_axis_is_written_in_place_into_out(chunks):
    """18 rows: the seed's second product takes its micro-kernel (bcast) from 5 rows on; on
    BLAS, slices of 2 rows (gemv) and, on Haswell or Zen, of 6 rows (gemm) differed by 1 ulp."""
    inputs, banks = seed_values(9, 2)  # B is the longest free axis: contiguous slices
    exe = runtime.compile(seed(), backend="cpu")
    expected = exe.run(inputs=inputs, banks=banks)["%4"].copy()
    out = np.full((9, 2, 1024), np.nan, np.float32)
    got = exe.run(inputs=inputs, banks=banks, out={"%4": out}, chunks=chunks)
    assert got.plan.chunking.symbol == "B" and got["%4"] is out
    assert np.array_equal(out, expected)


AVX2_SCRIPT = """
import numpy as np, runtime
from runtime.kernels import simd
from tests.test_chunked import seed, seed_values
assert simd.WIDE_BYTES == 32  # (AVX2's vectors: the emulation took)
exe = runtime.compile(seed(), backend="cpu")
for (b, s), sizes in {(9, 2): (1, 3, 4), (2, 40): (1, 8, 13)}.items():
    inputs, banks = seed_values(b, s)
    want = exe.run(inputs=inputs, banks=banks)["%4"].copy()
    for chunks in sizes:
        got = exe.run(inputs=inputs, banks=banks, chunks=chunks)["%4"]
        assert np.array_equal(got, want), (b, s, chunks, int((got != want).sum()))
print("equal")
"""


def avx2_features() -> str:
    """This host's CPU features with AVX-512 and later extensions turned off (an AVX2 CPU)."""
    import llvmlite.binding as ll

    later = ("avx512", "avxvnni", "avxifma", "avxneconvert", "avx10", "amx", "evex512")
    return ",".join(("+" if on and not name.startswith(later) else "-") + name
                    for name, on in sorted(ll.get_host_cpu_features().items()))


@pytest.mark.slow
def test_chunks_equal_the_whole_run_on_an_avx2_cpu(tmp_path):
    """An AVX2 CPU (an EPYC: Numba's target and OpenBLAS's kernels both emulated, an empty
    cache) computes the seed's slices as its whole run, bit for bit (issue 36: 1 ulp in 1,036
    elements there before the micro-kernels served every run of 5 rows or more)."""
    import os
    import subprocess
    import sys

    root = Path(__file__).resolve().parents[1]
    cache = tmp_path / "cache"
    cache.mkdir(mode=0o700)
    env = {k: v for k, v in os.environ.items() if k != "NUMBA_CACHE_DIR"}
    env.update(NUMBA_CPU_NAME="znver3", NUMBA_CPU_FEATURES=avx2_features(), OPENBLAS_CORETYPE="Zen",
               FORMULA_CACHE_DIR=str(cache), FORMULA_TIERED="0", PYTHONPATH=str(root))
    done = subprocess.run([sys.executable, "-c", AVX2_SCRIPT], env=env, cwd=root, capture_output=True,
                          text=True, timeout=900)
    assert done.returncode == 0 and done.stdout.split() == ["equal"], done.stderr[-3000:]


def test_results_are_fresh_per_run_and_inputs_untouched():
    inputs, banks = seed_values(2, 40)
    before = {k: np.array(v, copy=True) for k, v in inputs.items()}
    exe = runtime.compile(seed(), backend="cpu")
    first = exe.run(inputs=inputs, banks=banks, chunks=8)["%4"]
    kept = first.copy()
    second = exe.run(inputs={**inputs, "lora.gain": np.float32(2.0)}, banks=banks, chunks=8)["%4"]
    assert not np.shares_memory(first, second)
    assert np.array_equal(first, kept)
    for k, v in before.items():
        assert np.array_equal(inputs[k], v)


def test_auto_on_a_run_that_fits_is_an_ordinary_run():
    inputs, banks = seed_values(1, 4)
    got = runtime.compile(seed(), backend="cpu").run(inputs=inputs, banks=banks, chunks="auto")
    assert got.plan.chunking is None


def tied_program(limit: int) -> dict:
    b = ProgramBuilder()
    x = b.input("x", {"T": "T", "D": 64})
    y = b.op("masked-softmax", [x, b.input("m", {"T": "T", "D": 64}, dtype="boolean")],
             {"axis": "T", "accumulation_dtype": "float32"})
    return b.build(outputs=[y], limits={"max_working_bytes": limit})


def test_no_free_axis_is_refused_with_the_reason():
    exe = runtime.compile(tied_program(4096), backend="cpu")
    inputs = {"x": np.ones((64, 64), np.float32), "m": np.ones((64, 64), bool)}
    with pytest.raises(FormulaError) as err:
        exe.run(inputs=inputs, chunks="auto")
    assert err.value.code == "limit_exceeded"
    assert "no free axis" in err.value.message and "masked-softmax" in err.value.message
    assert "'T'" in err.value.message
    with pytest.raises(FormulaError) as err:
        exe.run(inputs=inputs, chunks=8)
    assert err.value.code == "schema" and err.value.path == "$.chunks"


def test_a_slice_that_cannot_fit_is_refused():
    inputs, banks = seed_values(1, 8)
    exe = runtime.compile(seed(100_000), backend="cpu")  # the banks alone need more
    with pytest.raises(FormulaError) as err:
        exe.run(inputs=inputs, banks=banks, chunks="auto")
    assert err.value.code == "limit_exceeded" and "one position" in err.value.message


@pytest.mark.parametrize("bad", ["yes", 0, -3, 2.5, True, [4], None])
def test_bad_chunks_values(bad):
    inputs, banks = seed_values(1, 4)
    exe = runtime.compile(seed(), backend="reference")
    if bad is None:
        exe.run(inputs=inputs, banks=banks, chunks=bad)  # the default: unchunked
        return
    with pytest.raises(FormulaError) as err:
        exe.run(inputs=inputs, banks=banks, chunks=bad)
    assert err.value.code == "schema" and err.value.path == "$.chunks"


def test_plan_reports_the_chunking():
    exe = runtime.compile(seed(1 << 20), backend="cpu")
    plan = exe.plan({"B": 1, "S": 200}, chunks="auto")
    assert plan.chunking.symbol == "S" and plan.fits
    assert plan.to_dict()["free_axes"]["free"] == ["B", "S"]
    assert not exe.plan({"B": 1, "S": 200}, enforce=False).fits


def test_cli_run_and_plan_with_chunks(tmp_path, capsys):
    from runtime.cli import main

    path = tmp_path / "seed.json"
    path.write_text(json.dumps(seed(600_000)))
    args = [str(path), "--dim", "B=2", "--dim", "S=40"]
    assert main(["run", *args, "--random"]) != 0
    capsys.readouterr()
    assert main(["run", *args, "--random", "--chunks", "auto"]) == 0
    assert main(["plan", *args, "--chunks", "auto", "--json"]) == 0
    out = capsys.readouterr().out
    report = json.loads(out[out.index("{"):])
    assert report["plan"]["chunking"]["symbol"] == "S" and report["plan"]["chunking"]["count"] > 1


@pytest.mark.cuda
def test_cuda_chunked_host_and_device_values():
    from numba import cuda

    b = ProgramBuilder()
    x = b.input("x", {"B": "B", "S": "S", "D": 8})
    w = b.bank("w", {"E": 4, "D": 8})
    y = b.op("contract", [x, w], {"reduce_axes": [["D", "D"]], "output_axes": ["B", "S", "E"],
                                   "accumulation_dtype": "float32"})
    z = b.op("scalar-map", [y], {"mode": "silu"})
    doc = b.build(outputs=[z])
    rng = np.random.default_rng(0)
    xs, ws = rng.standard_normal((3, 5, 8), dtype=np.float32), rng.standard_normal((4, 8), dtype=np.float32)
    want = runtime.compile(doc, backend="reference").run(inputs={"x": xs}, banks={"w": ws})[z]
    exe = runtime.compile(doc, backend="cuda")
    for chunks, symbol in ((1, "B"), (4, "S")):  # contiguous slices, then strided ones
        got = exe.run(inputs={"x": xs}, banks={"w": ws}, chunks=chunks)
        assert got.plan.chunking.symbol == symbol and isinstance(got[z], np.ndarray)
        np.testing.assert_allclose(got[z], want, rtol=1e-5, atol=1e-6)
    got = exe.run(inputs={"x": cuda.to_device(xs)}, banks={"w": ws}, chunks=1)  # device results
    np.testing.assert_allclose(got[z].copy_to_host(), want, rtol=1e-5, atol=1e-6)


def test_check_outputs_does_not_combine_with_chunks():
    inputs, banks = seed_values(1, 4)
    exe = runtime.compile(seed(), backend="cpu")
    with pytest.raises(FormulaError) as err:
        exe.run(inputs=inputs, banks=banks, chunks=2, check_outputs=True)
    assert err.value.code == "schema" and "check_outputs" in err.value.message
