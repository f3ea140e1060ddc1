"""The gradient atom fill@1: values, the reference float dtype, fusion as a constant."""
from __future__ import annotations


import ml_dtypes
import numpy as np
import pytest

import runtime
from atoms._grad import FILL_REF
from runtime.core.types import numpy_dtype
from runtime.testing import ProgramBuilder
from tests.atoms.gradient_helpers import BACKENDS, F32, INF, execute


def fill_program(reference_dtype, attributes, axes=("B", "N"), extents=(2, 3), then=None):
    b = ProgramBuilder(dtype=reference_dtype)
    r = b.input("r", dict(zip(axes, extents)))
    y = b.op("fill", [r], attributes, ref=FILL_REF)
    if then is not None:
        y = then(b, r, y)
    return b.build(outputs=[y]), y, {"r": np.zeros(extents, numpy_dtype(reference_dtype))}


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("dtype, value, want", [
    ("float32", 0.1, np.float32(0.1)),
    ("float64", 0.1, 0.1),
    ("float16", 1e6, np.float16(INF)),  # beyond float16's range: +inf (rounded once, as cast@1)
    ("float16", -65520.0, np.float16(-INF)),
    ("float16", 65519.0, np.float16(65504)),
    ("bfloat16", 1 + 2 ** -8 + 2 ** -30, ml_dtypes.bfloat16(1 + 2 ** -7)),  # one rounding from the double
    ("bfloat16", 1e300, ml_dtypes.bfloat16(INF)),
    ("float32", 1e300, np.float32(INF)),
    ("float32", -7, np.float32(-7)),
    ("int64", -(1 << 63), np.int64(-(1 << 63))),
    ("int64", (1 << 63) - 1, np.int64((1 << 63) - 1)),
    ("boolean", True, True),
    ("boolean", False, False),
])
def test_fill_values(backend, dtype, value, want):
    for axes in (["B", "N"], ["N", "B"], ["N"], []):  # the reference's own axes (a chain on cpu/cuda) or not
        prog, y, inputs = fill_program("float32", {"axes": axes, "dtype": dtype, "value": value})
        got = execute(prog, inputs, backend)[y]
        assert got.dtype == numpy_dtype(dtype)
        assert got.shape == tuple({"B": 2, "N": 3}[a] for a in axes)
        w = np.asarray(want, numpy_dtype(dtype)).reshape(1)
        np.testing.assert_array_equal(got.reshape(-1).view(np.uint8), np.tile(w.view(np.uint8), got.size),
                                      err_msg=f"{axes} {backend}")  # the very bits


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("reference", ["float16", "bfloat16", "float64", "int64", "boolean"])
def test_fill_floating_takes_the_reference_float_dtype(backend, reference):
    prog, y, inputs = fill_program(reference, {"axes": ["N", "B"], "dtype": "floating", "value": -2.5})
    got = execute(prog, inputs, backend)[y]
    assert got.dtype == numpy_dtype(reference if reference.startswith(("float", "bfloat")) else "float32")
    assert got.shape == (3, 2) and np.all(got.astype(np.float64) == -2.5)


def test_fill_fuses_into_its_reader_as_a_constant():
    """fill over the reference's own axes is a chain step: with its one reader (an add whose
    other operand has no producer in a chain) it runs as one kernel and is never stored."""
    def then(b, r, f):
        return b.op("add", [f, r], F32)
    prog, y, _ = fill_program("float32", {"axes": ["B", "N"], "dtype": "float32", "value": 3.0}, then=then)
    for backend in ("cpu", "cuda"):
        groups = runtime.compile(prog, backend=backend).plan().groups
        assert len(groups) == 1 and [n.atom.name for n in groups[0].nodes] == ["fill", "add"], backend
    r = np.arange(6, dtype=np.float32).reshape(2, 3)
    for backend in BACKENDS:
        np.testing.assert_array_equal(execute(prog, {"r": r}, backend)[y], r + 3)


def test_fill_of_a_half_reference_reads_nothing_and_is_not_widened():
    prog, y, _ = fill_program("float16", {"axes": ["N"], "dtype": "float32", "value": 1.5})
    for backend in ("cpu", "cuda"):
        names = [n.atom.name for g in runtime.compile(prog, backend=backend).plan().groups for n in g.nodes]
        assert names == ["fill"], names
    r = np.full((2, 3), np.float16(65504))
    for backend in BACKENDS:
        np.testing.assert_array_equal(execute(prog, {"r": r}, backend)[y], np.full(3, 1.5, np.float32))


# --- scalar-map-vjp ------------------------------------------------------------------------------
