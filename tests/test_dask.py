"""runtime.dask: programs over dask arrays, on the threaded scheduler and a 2-process LocalCluster."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import runtime
from runtime import FormulaError

da = pytest.importorskip("dask.array")
dask = pytest.importorskip("dask")
distributed = pytest.importorskip("distributed")
rdask = pytest.importorskip("runtime.dask")

from tests.test_chunked import seed_values  # noqa: E402

SEED = json.loads((Path(__file__).resolve().parents[1] / "examples" / "seed-lora-silu.program.json").read_text())


def values(b=4, s=12, seed=0):
    return seed_values(b, s, seed)


def local(inputs, banks, backend="cpu"):
    return runtime.compile(SEED, backend=backend).run(inputs=inputs, banks=banks)["%4"].copy()


@pytest.fixture(scope="module")
def client():
    cluster = distributed.LocalCluster(n_workers=2, threads_per_worker=1, processes=True,
                                       dashboard_address=None, silence_logs=40)
    c = distributed.Client(cluster)
    yield c
    c.close()
    cluster.close()


@pytest.mark.parametrize("backend", ["cpu", "reference"])
def test_threaded_scheduler_equals_the_local_run(backend):
    inputs, banks = values()
    chunked = {**inputs, "x": da.from_array(inputs["x"], chunks=(2, 5, 1024))}  # base: NumPy
    out = rdask.execute(SEED, inputs=chunked, banks=banks, backend=backend)
    assert set(out) == {"%4"}
    assert out["%4"].chunks == ((2, 2), (5, 5, 2), (1024,))
    with dask.config.set(scheduler="threads"):
        got = out["%4"].compute()
    assert np.array_equal(got, local(inputs, banks, backend))


def test_local_cluster_equals_the_local_run(client):
    inputs, banks = values(b=6, s=10, seed=1)
    chunked = {"x": da.from_array(inputs["x"], chunks=(2, 10, 1024)),
               "base": da.from_array(inputs["base"], chunks=(2, 10, 1024)), "lora.gain": inputs["lora.gain"]}
    out = rdask.execute(SEED, inputs=chunked, banks=banks)
    got = client.compute(out["%4"]).result()
    assert np.array_equal(got, local(inputs, banks))
    # at most one executable per worker process, whatever number of blocks it ran, and the
    # banks loaded there at most once
    counts = client.run(lambda: __import__("runtime.dask", fromlist=["x"]).cached_executables())
    assert len(counts) == 2 and all(n <= 1 for n in counts.values()) and sum(counts.values()) >= 1
    loaded = client.run(lambda: len(__import__("runtime.dask", fromlist=["x"])._resident))
    assert all(n <= 1 for n in loaded.values()) and sum(loaded.values()) >= 1


def test_a_python_number_input_takes_its_dtype_in_the_run():
    inputs, banks = values()
    out = rdask.execute(SEED, inputs={**inputs, "lora.gain": 0.5, "x": da.from_array(inputs["x"], chunks=(2, 12, 1024))},
                        banks=banks)
    with dask.config.set(scheduler="threads"):
        got = out["%4"].compute()
    assert got.dtype == np.float32
    assert np.array_equal(got, local({**inputs, "lora.gain": 0.5}, banks))


def test_blocks_over_the_limit_are_sliced_on_the_workers():
    inputs, banks = values(b=2, s=64)
    doc = json.loads(json.dumps(SEED))
    doc["limits"]["max_working_bytes"] = 1 << 20  # one block of [1, 64, 1024] needs more
    out = rdask.execute(doc, inputs={**inputs, "x": da.from_array(inputs["x"], chunks=(1, 64, 1024))},
                        banks=banks)
    with dask.config.set(scheduler="threads"):
        got = out["%4"].compute()
    assert np.array_equal(got, local(inputs, banks))


def test_chunks_along_a_tied_axis_are_refused():
    inputs, banks = values()
    with pytest.raises(FormulaError) as err:
        rdask.execute(SEED, inputs={**inputs, "x": da.from_array(inputs["x"], chunks=(4, 12, 512))}, banks=banks)
    assert err.value.code == "binding_shape" and err.value.path == "$.inputs.x"
    assert "'Din'" in err.value.message and "not a free axis" in err.value.message


def test_mismatched_chunking_between_inputs_is_refused():
    inputs, banks = values()
    with pytest.raises(FormulaError) as err:
        rdask.execute(SEED, inputs={**inputs, "x": da.from_array(inputs["x"], chunks=(2, 6, 1024)),
                                    "base": da.from_array(inputs["base"], chunks=(2, 4, 1024))}, banks=banks)
    assert err.value.code == "binding_shape" and "mismatched chunking along S" in err.value.message


def test_bad_names_and_shapes_are_refused_before_any_work():
    inputs, banks = values()
    with pytest.raises(FormulaError) as err:
        rdask.execute(SEED, inputs={**inputs, "y": inputs["x"]}, banks=banks)
    assert err.value.code == "binding_keys"
    with pytest.raises(FormulaError) as err:
        rdask.execute(SEED, inputs={**inputs, "x": inputs["x"][..., :10]}, banks=banks)
    assert err.value.code == "binding_shape" and "'Din'" in err.value.message
    with pytest.raises(FormulaError) as err:
        rdask.execute(SEED, inputs={**inputs, "x": inputs["x"][:, :5]}, banks=banks)
    assert err.value.code == "symbol_conflict"


def test_import_runtime_does_not_import_dask():
    code = "import sys, runtime; runtime.compile; assert 'runtime.dask' not in sys.modules and 'dask' not in sys.modules"
    subprocess.run([sys.executable, "-c", code], check=True)
