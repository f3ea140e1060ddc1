"""General programs (bench.blocks): the transformer block at four sizes, attention alone, a
wide MLP and the §3b gated block, for every runtime backend and peer, each result checked
against a float64 NumPy evaluation. Groups are ``block-<case>``. Under
``--benchmark-disable`` (the CI smoke run) every case runs once at its quick, small size."""
from __future__ import annotations

import attrs
import numpy as np
import pytest

from bench import blocks
from bench.contenders import RUNTIME_BACKENDS, Unavailable

BLOCK_CONTENDERS = ("cpu", "cuda", "reference", *blocks.BLOCK_PEERS)


@attrs.frozen
class Case:
    contender: str
    name: str  # a case name of bench.blocks.cases()

    @property
    def id(self) -> str:
        return f"{self.contender}-{self.name}"


def _all() -> list[Case]:
    out = []
    for c in blocks.cases():
        for contender in BLOCK_CONTENDERS:
            # the reference backend is timed where it is the only peer (the gated block)
            if contender == "reference" and "reference" not in c.peers:
                continue
            out.append(Case(contender, c.name))
    return out


_expected: dict[str, np.ndarray] = {}


@pytest.mark.parametrize("case", _all(), ids=lambda c: c.id)
def test_block(benchmark, request, case: Case):
    quick = bool(request.config.getoption("benchmark_disable", False))
    full_size = next(c for c in blocks.cases() if c.name == case.name)
    spec = blocks.cases(quick)[blocks.cases().index(full_size)]  # the same case, maybe shrunk
    values = blocks.data(spec)
    try:
        run = blocks.prepare(case.contender, spec, values)
    except Unavailable as exc:
        pytest.skip(str(exc))
    if spec.name not in _expected:
        _expected[spec.name] = blocks.expected(spec, values)

    def check(result):
        result = np.asarray(result)
        assert result.dtype == np.dtype(spec.dtype), result.dtype
        np.testing.assert_allclose(result, _expected[spec.name], rtol=spec.rtol, atol=spec.atol,
                                   err_msg=f"{case.id}: result differs from float64 NumPy")

    check(run())  # warm-up: compilation stays untimed
    benchmark.group = f"block-{case.name}"
    benchmark.extra_info.update(suite="blocks", contender=case.contender, case=case.name,
                                kind=spec.kind, sizes=dict(spec.sizes))
    check(benchmark(run))
