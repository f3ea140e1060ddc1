"""The transformer block (bench.transformer) through ``runtime.compile`` on each backend, every
result checked against the reference backend's. Group ``transformer-block-T<tokens>``."""
from __future__ import annotations

import numpy as np
import pytest

from bench.contenders import RUNTIME_BACKENDS, Unavailable, prepare_runtime
from bench.transformer import transformer_block_data, transformer_block_program

TOKENS = (128,)
_expected: dict[tuple[int, bool], np.ndarray] = {}


def _full() -> bool:
    """The program as issue 19 writes it once scalar-map@2 and cast@1 are registered."""
    import runtime

    try:
        runtime.load_program(transformer_block_program(True))
    except runtime.FormulaError as exc:
        if exc.code != "unknown_atom":
            raise
        return False
    return True


@pytest.mark.parametrize("tokens", TOKENS)
@pytest.mark.parametrize("backend", RUNTIME_BACKENDS)
def test_transformer_block(benchmark, backend, tokens):
    full = _full()
    program = transformer_block_program(full)
    data = transformer_block_data(tokens, full)
    out = program["outputs"][0]
    if (tokens, full) not in _expected:
        _expected[tokens, full] = prepare_runtime("reference", program, data["inputs"], data["banks"], out)()
    try:
        run = prepare_runtime(backend, program, data["inputs"], data["banks"], out)
    except Unavailable as exc:
        pytest.skip(str(exc))

    # the full block's down projection runs in float16: its rounding sets the tolerance
    tol = 1e-2 if full else 1e-3

    def check(result):
        np.testing.assert_allclose(np.asarray(result), _expected[tokens, full], rtol=tol, atol=tol)

    check(run())  # warm-up: compilation stays untimed
    benchmark.group = f"transformer-block-T{tokens}"
    benchmark.extra_info.update(suite="transformer", contender=backend, tokens=tokens, full=full)
    check(benchmark(run))
