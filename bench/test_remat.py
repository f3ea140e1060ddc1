"""Recompute policies (issue 34): a runtime.torch.Module training step on the block at
(4, 512) under each ``remat`` policy (save-all, save-contractions, save-inputs), torch eager's
step beside them (bench.training). Group ``remat-<case>``; each benchmark's extra_info holds
the bytes its policy keeps for the backward (``Split.saved_bytes``).

Peak RSS per policy needs a fresh process each: ``bench/run.py --fresh`` or
``python bench/training.py fresh --cases block-B4-S512 --remat save-all,save-contractions,save-inputs``.

Under ``--benchmark-disable`` the block runs at its quick size (2, 16); the loss must fall,
and the policies must keep fewer bytes in the order listed.

    python bench/run.py --suites remat --contenders cpu,torch --coldstart none --fresh
"""
from __future__ import annotations

import math

import attrs
import pytest

from bench import training
from bench.contenders import Unavailable


@attrs.frozen
class RematCase:
    contender: str
    remat: str  # a policy; torch: "autograd"

    @property
    def id(self) -> str:
        return f"{self.contender}-{self.remat}-{training.REMAT_CASE}"


CASES = [RematCase(c, p) for c in ("cpu", "cuda") for p in training.POLICIES] + [RematCase("torch", "autograd")]
_saved: dict[str, int] = {}


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.id)
def test_remat(benchmark, request, case: RematCase):
    quick = bool(request.config.getoption("benchmark_disable", False))
    spec = training.resolve(training.REMAT_CASE, quick)
    values = training.data(spec)
    try:
        tr = training.trainer(case.contender, spec, values,
                              case.remat if case.contender != "torch" else "save-all")
    except Unavailable as exc:
        pytest.skip(str(exc))
    loss0 = tr.step()
    tr.warm()
    saved = tr.saved_bytes()
    if saved is not None:
        _saved[case.remat] = saved
        kept = [_saved[p] for p in training.POLICIES if p in _saved]
        assert kept == sorted(kept, reverse=True) and (case.remat != "save-inputs" or saved == 0), _saved
    benchmark.group = f"remat-{training.REMAT_CASE}"
    benchmark.extra_info.update(suite="remat", contender=case.contender, remat=case.remat,
                                case=training.REMAT_CASE, sizes=dict(spec.sizes), threads=training.threads(),
                                saved_bytes=saved)
    loss = benchmark(tr.step)
    assert math.isfinite(loss) and loss < loss0, (loss0, loss)
