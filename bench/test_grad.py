"""Forward+backward (issue 33): the runtime's gradient programs against torch eager
``torch.autograd.grad`` on the same threads, and the runtime's backward alone against its
forward alone (bench.training). Groups are ``grad-<case>``; each benchmark's ``mode`` (in its
id and extra_info) is ``forward``, ``backward``, ``fwdbwd`` (the whole vjp program in one
run; torch: forward with autograd, then autograd.grad) or ``split`` (the runtime's split
forward then backward, as runtime.torch.Module runs them). Gradients are for every floating
bank, with one fixed cotangent.

Checked, also under ``--benchmark-disable`` (each case once at its quick size): every
contender's forward output against float64 NumPy; the runtime's gradients (split and whole
program) against the same gradient program on the reference backend.

    python bench/run.py --suites grad --contenders cpu,torch --coldstart none
"""
from __future__ import annotations

import attrs
import numpy as np
import pytest

from bench import training
from bench.contenders import RUNTIME_BACKENDS, Unavailable, peer_unavailable


@attrs.frozen
class GradCase:
    contender: str
    mode: str
    name: str  # a training.GRAD_CASES name

    @property
    def id(self) -> str:
        return f"{self.contender}-{self.mode}-{self.name}"


CASES = [GradCase(c, m, n) for n in training.GRAD_CASES
         for c, modes in (("cpu", training.RUNTIME_MODES), ("cuda", training.RUNTIME_MODES),
                          ("torch", training.TORCH_MODES)) for m in modes]
_prepared: dict = {}  # the last (contender, case): its compiled programs serve every mode


def prepared(contender: str, case: training.Case, quick: bool):
    key = (contender, case.name, quick)
    if key not in _prepared:
        _prepared.clear()
        values = training.data(case)
        expected = training.expected_output(case, values)
        if contender in RUNTIME_BACKENDS:
            run = training.runtime_grad(contender, case, values)
            training.check_output(case, values, run.output(), expected)
            want = run.reference()
            training.check_gradients(run.gradients(), want, f"{contender} split, {case.name}")
            training.check_gradients(run.whole(), want, f"{contender} vjp program, {case.name}")
        else:
            reason = peer_unavailable(contender)
            if reason:
                raise Unavailable(reason)
            run = training.torch_grad(case, values)
            training.check_output(case, values, run.output(), expected)
        _prepared[key] = run
    return _prepared[key]


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.id)
def test_grad(benchmark, request, case: GradCase):
    quick = bool(request.config.getoption("benchmark_disable", False))
    spec = training.resolve(case.name, quick)
    try:
        run = prepared(case.contender, spec, quick)
    except Unavailable as exc:
        pytest.skip(str(exc))
    fn = run.fns[case.mode]
    benchmark.group = f"grad-{case.name}"
    benchmark.extra_info.update(suite="grad", contender=case.contender, mode=case.mode, case=case.name,
                                sizes=dict(spec.sizes), threads=training.threads(),
                                saved_bytes=getattr(run, "saved_bytes", None))
    result = benchmark(fn)
    if case.mode == "forward":
        assert np.asarray(result).shape == training.output_shape(spec)
