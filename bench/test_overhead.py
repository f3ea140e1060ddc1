"""What one run costs apart from its kernels: programs that compute next to nothing, per
contender (issue 38 item 1). ``python bench/run.py --suites overhead --contenders cpu,onnxruntime,numpy,torch``

Cases (each contender computes the same values, results checked):

- ``overhead-view``: the output is a reshape of the input. The runtime launches no kernel
  (a view); ONNX Runtime runs an ``Identity`` graph, its ``run()`` on an empty graph.
- ``overhead-relu-1``: one elementwise op on one float32: one kernel launch.
- ``overhead-seed-T1``: the seed program at one token (two contractions and a fused chain on
  1×1024 values): a real program at the size where a run is nearly all overhead.

The runtime's runs go through ``exe.run`` with banks loaded (``load_banks``), inputs checked
every run; ONNX Runtime through ``run_with_iobinding`` onto kept arrays (its cheapest path),
PyTorch in inference mode, NumPy with ``out=``.
"""
from __future__ import annotations

from collections.abc import Callable
from typing import Any

import attrs
import numpy as np
import pytest

from bench import programs
from bench.contenders import (CONTENDERS, RUNTIME_BACKENDS, Unavailable, ort_bound_run, peer_unavailable,
                              prepare_runtime, prepare_seed)

CASES = ("view", "relu-1", "seed-T1")
PEERS = ("numpy", "onnxruntime", "torch")


@attrs.frozen
class OverheadCase:
    contender: str
    case: str

    @property
    def id(self) -> str:
        return f"{self.contender}-{self.case}"


def _small_program(case: str) -> dict:
    b = programs.Builder("float32")
    x = b.input("x", {"N": 1})
    if case == "view":
        y = b.op("reshape", [x], {"output_axes": ["A", "N"], "output_sizes": [1, 1]}, out_axes={"A": 1, "N": 1})
    else:
        y = b.op("scalar-map", [x], {"mode": "relu"}, out_axes={"N": 1})
    return b.build([y])


def _onnx_session(case: str):
    import onnxruntime as ort
    from onnx import TensorProto, helper

    node = helper.make_node("Identity" if case == "view" else "Relu", ["x"], ["y"])
    graph = helper.make_graph([node], f"overhead_{case}",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    return ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])


def prepare_small(contender: str, case: str, x: np.ndarray) -> Callable[[], Any]:
    """A zero-argument callable computing ``case`` on the one-element ``x`` (float32)."""
    if contender in RUNTIME_BACKENDS:
        return prepare_runtime(contender, _small_program(case), {"x": x}, {}, "%0")
    reason = peer_unavailable(contender)
    if reason:
        raise Unavailable(reason)
    out = np.empty_like(x)
    if contender == "numpy":
        return (lambda: x.reshape(1, 1)) if case == "view" else (lambda: np.maximum(x, 0, out=out))
    if contender == "torch":
        import torch

        t = torch.from_numpy(x)

        def run():
            with torch.inference_mode():
                return (t.reshape(1, 1) if case == "view" else torch.relu(t)).numpy()

        return run
    return ort_bound_run(_onnx_session(case), {"x": x}, "y", out)


_CONTENDERS = [c for c in CONTENDERS if c in RUNTIME_BACKENDS + PEERS]
CASE_LIST = [OverheadCase(c, k) for k in CASES for c in _CONTENDERS]


@pytest.mark.parametrize("case", CASE_LIST, ids=lambda c: c.id)
def test_overhead(benchmark, case: OverheadCase):
    if case.case == "seed-T1":
        data = programs.seed_data(1, "float32")
        try:
            run = prepare_seed(case.contender, programs.seed_program("float32"), data)
        except Unavailable as exc:
            pytest.skip(str(exc))
        rows = programs.sample_rows(1)
        expected = programs.seed_expected_rows(data, rows)

        def check(result):
            np.testing.assert_allclose(np.asarray(result)[0, rows], expected, **programs.tolerance("float32"))
    else:
        x = np.array([-1.5 if case.case == "relu-1" else 2.5], np.float32)
        try:
            run = prepare_small(case.contender, case.case, x)
        except Unavailable as exc:
            pytest.skip(str(exc))
        want = np.maximum(x, 0).reshape(-1)

        def check(result):
            np.testing.assert_array_equal(np.asarray(result).reshape(-1), want)
    check(run())
    benchmark.group = f"overhead-{case.case}"
    benchmark.extra_info.update(suite="overhead", contender=case.contender, case=case.case)
    check(benchmark(run))
