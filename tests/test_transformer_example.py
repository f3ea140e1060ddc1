"""The transformer-block example (examples/transformer-block.program.json) on every backend."""
from __future__ import annotations

import json

import numpy as np
import pytest

import runtime
from bench.transformer import EXAMPLE_PATH, transformer_block_data, transformer_block_program
from runtime.testing import assert_backends_agree

SMALL = {"D": 16, "H": 2, "Dh": 8, "F": 32}  # small enough for the CUDA simulator


def test_example_file_is_the_generated_program():
    program = json.loads(EXAMPLE_PATH.read_text())
    assert program == transformer_block_program(True)  # regenerate: python -m bench.transformer
    runtime.load_program(EXAMPLE_PATH)


@pytest.mark.parametrize("full", [False, True])
def test_block_matches_reference_on_every_backend(full):
    program = transformer_block_program(full, SMALL)
    data = transformer_block_data(5, full, SMALL)
    # the full block's down projection runs in float16: its rounding sets the tolerance
    tol = {"rtol": 1e-2, "atol": 1e-2} if full else {}
    out = assert_backends_agree(program, data["inputs"], data["banks"], backends=("cpu", "cuda"), **tol)
    (value,) = out.values()
    assert value.shape == (5, SMALL["D"]) and np.all(np.isfinite(value))
    # causal: the first token's output depends on the first token only
    data["inputs"]["x"][1:] += 1.0
    again = runtime.execute(program, backend="reference", **data)
    np.testing.assert_array_equal(next(iter(again.values()))[0], value[0])
