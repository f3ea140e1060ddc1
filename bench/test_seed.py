"""The seed program (LoRA + SiLU) per backend and peer, grouped by case.

Groups are ``seed-<dtype>-T<T>`` (B=1, S=T). Setup — compiling, building an ONNX session,
allocating buffers, and one warm-up call — is outside the timed region. Every contender's
result is checked against a float64 NumPy evaluation of sampled rows, also under
``--benchmark-disable`` (the quick CI mode, where each case runs once).
"""
from __future__ import annotations

import attrs
import numpy as np
import pytest

from bench import programs
from bench.contenders import CONTENDERS, Unavailable, prepare_seed

TOKENS = (1, 256, 8192, 32768)


@attrs.frozen
class SeedCase:
    contender: str
    dtype: str
    tokens: int

    @property
    def id(self) -> str:
        return f"{self.contender}-{self.dtype}-T{self.tokens}"


# dtype and T outermost, contender fastest: one data set serves every contender in a row.
CASES = [SeedCase(c, d, t) for d in programs.FLOAT_DTYPES for t in TOKENS for c in CONTENDERS]
_data_cache: dict = {}


def seed_data(dtype: str, tokens: int):
    """The last data set only: T=32768 float64 inputs are 256 MiB each."""
    key = (dtype, tokens)
    if key not in _data_cache:
        _data_cache.clear()
        _data_cache[key] = programs.seed_data(tokens, dtype)
    return _data_cache[key]


def check_seed(result, data, case: SeedCase) -> None:
    result = np.asarray(result)
    assert result.shape == (1, case.tokens, programs.SEED_DIMS["Dout"]), result.shape
    assert result.dtype == np.dtype(case.dtype), result.dtype
    rows = programs.sample_rows(case.tokens)
    np.testing.assert_allclose(result[0, rows], programs.seed_expected_rows(data, rows),
                               **programs.tolerance(case.dtype),
                               err_msg=f"{case.id}: seed output differs from NumPy")


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.id)
def test_seed(benchmark, case: SeedCase):
    data = seed_data(case.dtype, case.tokens)
    try:
        run = prepare_seed(case.contender, programs.seed_program(case.dtype), data)
    except Unavailable as exc:
        pytest.skip(str(exc))
    check_seed(run(), data, case)  # warm-up: compilation and first-touch stay untimed
    benchmark.group = f"seed-{case.dtype}-T{case.tokens}"
    benchmark.extra_info.update(suite="seed", contender=case.contender, dtype=case.dtype,
                                tokens=case.tokens)
    check_seed(benchmark(run), data, case)
