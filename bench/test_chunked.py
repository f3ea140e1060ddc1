"""Chunked runs and Dask: the seed (float32) over a data set several times max_working_bytes.

Groups: ``chunked`` — the whole run in one call (max_working_bytes raised so that it fits)
against ``run(chunks="auto")`` under a limit a quarter of the whole working set, and against
slices of 4 and 1 batch rows (B is the leading free axis: the slices are contiguous views and
the results are written in place; the overhead per slice is the difference over the number
of slices); ``dask`` — ``runtime.dask.execute`` on the threaded scheduler and on a 2-worker
``LocalCluster`` (one thread each) against the in-process run. Every result is checked bit
for bit against the whole run, also under ``--benchmark-disable`` (each case once).

    python -m pytest -q -p no:cacheprovider bench/test_chunked.py --benchmark-columns=median,rounds \\
        --benchmark-sort=name
"""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

import runtime

SEED = json.loads((Path(__file__).resolve().parents[1] / "examples" / "seed-lora-silu.program.json").read_text())
B, S = 16, 512  # x, base and the output: 32 MiB each


def program(limit: int) -> dict:
    doc = json.loads(json.dumps(SEED))
    doc["limits"]["max_working_bytes"] = limit
    return doc


@pytest.fixture(scope="module")
def data():
    rng = np.random.default_rng(0)
    inputs = {"x": rng.standard_normal((B, S, 1024), dtype=np.float32),
              "base": rng.standard_normal((B, S, 1024), dtype=np.float32), "lora.gain": np.float32(0.5)}
    banks = {"lora.A": (rng.standard_normal((32, 1024)) * 0.03).astype(np.float32),
             "lora.B": (rng.standard_normal((1024, 32)) * 0.03).astype(np.float32)}
    exe = runtime.compile(program(1 << 34), backend="cpu")
    whole_bytes = exe.plan({"B": B, "S": S}).working_bytes
    expected = exe.run(inputs=inputs, banks=banks)["%4"].copy()
    return inputs, banks, whole_bytes, expected


CHUNKED = {"whole": (None, 1 << 34), "auto-quarter": ("auto", None), "slices-4": (4, 1 << 34),
           "slices-1": (1, 1 << 34)}


@pytest.mark.parametrize("case", list(CHUNKED))
def test_chunked(benchmark, data, case):
    inputs, banks, whole_bytes, expected = data
    chunks, limit = CHUNKED[case]
    exe = runtime.compile(program(limit or whole_bytes // 4), backend="cpu")
    resident = exe.load_banks(banks)
    run = lambda: exe.run(inputs=inputs, banks=resident, chunks=chunks)  # noqa: E731
    first = run()
    if chunks == "auto":
        assert first.plan.chunking is not None and first.plan.chunking.count >= 4
    benchmark.group = "chunked"
    benchmark.extra_info["slices"] = first.plan.chunking.count if first.plan.chunking else 1
    result = benchmark(run)
    assert np.array_equal(result["%4"], expected)


@pytest.fixture(scope="module")
def cluster():
    distributed = pytest.importorskip("distributed")
    cluster = distributed.LocalCluster(n_workers=2, threads_per_worker=1, processes=True,
                                       dashboard_address=None, silence_logs=40)
    client = distributed.Client(cluster)
    yield client
    client.close()
    cluster.close()


@pytest.mark.parametrize("scheduler", ["in-process", "threads", "local-cluster-2"])
def test_dask(benchmark, data, scheduler, request):
    da = pytest.importorskip("dask.array")
    import dask

    from runtime import dask as rdask

    inputs, banks, _, expected = data
    if scheduler == "in-process":
        exe = runtime.compile(program(1 << 34), backend="cpu")
        resident = exe.load_banks(banks)
        run = lambda: exe.run(inputs=inputs, banks=resident)["%4"]  # noqa: E731
    else:
        chunked = {**{k: da.from_array(inputs[k], chunks=(B // 4, S, 1024)) for k in ("x", "base")},
                   "lora.gain": inputs["lora.gain"]}
        if scheduler == "threads":
            def run():
                out = rdask.execute(SEED, inputs=chunked, banks=banks)["%4"]
                with dask.config.set(scheduler="threads"):
                    return out.compute()
        else:
            client = request.getfixturevalue("cluster")
            x = client.persist(chunked["x"])  # the data set lives on the workers, as it would
            base = client.persist(chunked["base"])

            def run():
                out = rdask.execute(SEED, inputs={"x": x, "base": base, "lora.gain": inputs["lora.gain"]},
                                    banks=banks)["%4"]
                return client.compute(out).result()
    run()
    benchmark.group = "dask"
    result = benchmark(run)
    assert np.array_equal(result, expected)
