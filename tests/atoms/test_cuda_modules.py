"""The built-in atoms' constant CUDA kernels are plain modules (atoms/cuda/, one per atom
module), imported when a CUDA kernel is first made: ``import atoms`` loads no numba.cuda, and
making these kernels compiles no generated source."""
from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from atoms import all_specs
from runtime.core.types import TensorType
from runtime.testing import run_kernel

ROOT = Path(__file__).resolve().parents[2]
# the atom modules whose CUDA kernels nothing varies in, and their kernels' module
CONSTANT = ("window", "indexing", "layout", "segment", "scatter_add", "fill", "slice_vjp", "softmax_vjp",
            "window_vjp", "observe")
SPEC = {s.name: s for s in all_specs()}


def test_importing_atoms_loads_no_numba_cuda():
    code = ("import sys, atoms\natoms.all_specs()\nimport runtime.toolkit\n"
            "print(sorted(m for m in sys.modules if m.startswith(('numba.cuda', 'atoms.cuda'))))")
    got = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=True)
    assert got.stdout.strip() == "[]", got.stdout


@pytest.mark.parametrize("family", CONSTANT)
def test_constant_cuda_kernels_are_module_functions_not_source_strings(family):
    """No string in the atom module holds kernel source, and each has its module in atoms/cuda."""
    path = ROOT / "atoms" / f"{family}.py"
    strings = [n.value for n in ast.walk(ast.parse(path.read_text())) if isinstance(n, ast.Constant)
               and isinstance(n.value, str) and "cuda.jit" in n.value]
    assert not strings, f"atoms/{family}.py renders CUDA source: {strings[0][:80]!r}"
    device = ROOT / "atoms" / "cuda" / f"{family}.py"
    assert "@cuda.jit" in device.read_text()


def T(axes, sizes, dtype="float32"):
    return TensorType(tuple(axes), tuple(sizes), dtype, "d")


WIN = {"axis": "N", "output_axis": "P", "window_axis": "K", "kernel_size": 3, "stride": 2, "dilation": 1,
       "padding": [1, 1], "output_size": None}


def test_making_these_cuda_kernels_compiles_no_generated_source(monkeypatch):
    import runtime.backends.cuda_codegen as cg
    import runtime.kernels.codegen as codegen

    def refuse(source, prefix="gen"):
        raise AssertionError(f"generated source compiled for {prefix}")
    monkeypatch.setattr(cg, "load_generated", refuse)
    monkeypatch.setattr(codegen, "load_generated", refuse)
    x = np.arange(10, dtype=np.float64).reshape(2, 5)
    types = [T("BN", (2, 5), "float64")]
    got = run_kernel(SPEC["window"], WIN, types, [x], "cuda")
    np.testing.assert_array_equal(got, run_kernel(SPEC["window"], WIN, types, [x]))
    g = np.arange(18, dtype=np.float64).reshape(2, 3, 3)
    vjp_types = [T("BPK", (2, 3, 3), "float64"), types[0]]
    got = run_kernel(SPEC["window-vjp"], WIN, vjp_types, [g, x], "cuda")
    np.testing.assert_array_equal(got, run_kernel(SPEC["window-vjp"], WIN, vjp_types, [g, x]))
    assert got.dtype == np.float64
    assert {"atoms.cuda.window", "atoms.cuda.window_vjp", "atoms.cuda.rows"} <= set(sys.modules)
