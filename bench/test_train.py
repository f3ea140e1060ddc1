"""A training step (issue 34): forward, MSE loss, backward and torch.optim.AdamW through
runtime.torch.Module (forward and gradient programs on the runtime's backend, save-all) against
the same model, loss and optimizer in torch eager, on the same threads (bench.training). Groups
are ``train-<case>``; one benchmark round is one step, the weights moving on between rounds.

Peak RSS and the time to the first step (the runtime's vjp, split, compile and kernels) need
a fresh process each: ``python bench/training.py fresh`` (or ``bench/run.py --fresh``).

Checked, also under ``--benchmark-disable`` (each case at its quick size): the first step's
loss is that of the forward output checked against float64 NumPy, and after the warm-up steps
the loss has fallen.

    python bench/run.py --suites train --contenders cpu,torch --coldstart none --fresh
"""
from __future__ import annotations

import math

import attrs
import numpy as np
import pytest

from bench import training
from bench.contenders import Unavailable


@attrs.frozen
class TrainCase:
    contender: str
    name: str  # a training.TRAIN_CASES name

    @property
    def id(self) -> str:
        return f"{self.contender}-{self.name}"


CASES = [TrainCase(c, n) for n in training.TRAIN_CASES for c in ("cpu", "cuda", "torch")]


def first_loss(case: training.Case, values) -> float:
    """The MSE of the first step, from the float64 NumPy forward (the seed: its sampled rows)."""
    want = training.expected_output(case, values)
    target = values["target"]
    if case.kind == "seed":
        target = target[0, training.programs.sample_rows(case.sizes["T"])]
    return float(np.mean((want - target) ** 2))


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.id)
def test_train(benchmark, request, case: TrainCase):
    quick = bool(request.config.getoption("benchmark_disable", False))
    spec = training.resolve(case.name, quick)
    values = training.data(spec)
    try:
        tr = training.trainer(case.contender, spec, values)
    except Unavailable as exc:
        pytest.skip(str(exc))
    loss0 = tr.step()
    if spec.kind != "seed" or spec.sizes["T"] <= 64:  # the seed's check has sampled rows only
        assert math.isclose(loss0, first_loss(spec, values), rel_tol=1e-3), (loss0, first_loss(spec, values))
    tr.warm()
    benchmark.group = f"train-{case.name}"
    benchmark.extra_info.update(suite="train", contender=case.contender, case=case.name,
                                sizes=dict(spec.sizes), threads=training.threads(),
                                saved_bytes=tr.saved_bytes(), lr=training.LR)
    loss = benchmark(tr.step)
    assert math.isfinite(loss) and loss < loss0, (loss0, loss)
