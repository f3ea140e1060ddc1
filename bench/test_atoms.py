"""Micro-benchmarks: one instruction per atom family through ``runtime.compile``, against
the NumPy expression a user would write. Groups are ``atom-<case>``; setup and a warm-up
call stay untimed, and every result is checked (also under ``--benchmark-disable``)."""
from __future__ import annotations

import attrs
import numpy as np
import pytest

from bench.atom_cases import CASES, AtomCase
from bench.contenders import RUNTIME_BACKENDS, Unavailable, prepare_runtime

ATOM_CONTENDERS = (*RUNTIME_BACKENDS, "numpy")


@attrs.frozen
class Case:
    contender: str
    atom: AtomCase

    @property
    def id(self) -> str:
        return f"{self.contender}-{self.atom.name}"


ALL = [Case(c, a) for a in CASES for c in ATOM_CONTENDERS]


@pytest.mark.parametrize("case", ALL, ids=lambda c: c.id)
def test_atom(benchmark, case: Case):
    atom = case.atom
    values = atom.data(np.random.default_rng(0))
    if case.contender == "numpy":
        try:
            run = atom.numpy(values)
        except ImportError as exc:
            pytest.skip(f"numpy peer for {atom.name} needs {exc.name}")
        expected = (atom.expect or (lambda v: atom.numpy(v)()))(values)
    else:
        try:
            run = prepare_runtime(case.contender, atom.build(), values["inputs"], values["banks"], "%0")
        except Unavailable as exc:
            pytest.skip(str(exc))
        expected = atom.expect(values) if atom.expect else None
    if expected is None:  # a BLAS-free NumPy peer is its own oracle
        expected = atom.numpy(values)()

    def check(result):
        result = np.asarray(result)
        assert result.dtype == np.float32, result.dtype
        np.testing.assert_allclose(result, expected, rtol=atom.rtol, atol=atom.atol,
                                   err_msg=f"{case.id}: result differs from NumPy")

    check(run())  # warm-up: compilation stays untimed
    benchmark.group = f"atom-{atom.name}"
    benchmark.extra_info.update(suite="atoms", contender=case.contender, atom=atom.name)
    check(benchmark(run))
