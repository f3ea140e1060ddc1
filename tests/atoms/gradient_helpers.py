"""What the tests of the gradient atoms share (SPEC §3c; tests/atoms/test_gradient_atoms.py for the
family, test_<module>.py for each atom module): operand types, one-atom programs and runs."""
from __future__ import annotations

import math

import pytest

import runtime
from atoms import all_specs
from runtime.core.errors import FormulaError
from runtime.core.types import TensorType
from runtime.plugins.atomspec import InferContext
from runtime.testing import run_kernel

SPEC = {ref: s for s in all_specs() for ref in s.refs}
INS = "$.instructions[0]"
F32 = {"accumulation_dtype": "float32"}
WIN = {"axis": "N", "output_axis": "P", "window_axis": "K", "kernel_size": 2, "stride": 1, "dilation": 1,
       "padding": [0, 0], "output_size": None}
SLICE = {"axis": "N", "start": 1, "stop": None, "step": 2}
BACKENDS = ("reference", "cpu", "cuda")
INF = math.inf


def T(axes, sizes, dtype="float32", domain="d"):
    return TensorType(tuple(axes), tuple(sizes), dtype, domain)


def infer(ref, attributes, *types, dims=None, planning=False):
    ctx = InferContext(SPEC[ref], INS, attributes, types, [f"s{k}" for k in range(len(types))], dims,
                       planning=planning)
    return SPEC[ref].infer(ctx)


def expect(code, path, fn, *args, needle="", **kw):
    with pytest.raises(FormulaError) as info:
        fn(*args, **kw)
    assert (info.value.code, info.value.path) == (code, path), info.value
    assert needle in info.value.message, info.value
    return info.value


def run(ref, attributes, types, values, backend="reference"):
    return run_kernel(SPEC[ref], attributes, types, values, backend)


def execute(prog, inputs, backend):
    return runtime.execute(prog, inputs=inputs, backend=backend)


def window_attrs(k, s, d, pad, axis="N"):
    return {**WIN, "axis": axis, "kernel_size": k, "stride": s, "dilation": d, "padding": list(pad)}


def softmax(logits, mask, axis):
    from atoms.softmax import masked_softmax_numpy

    return masked_softmax_numpy(logits, mask, axis)
