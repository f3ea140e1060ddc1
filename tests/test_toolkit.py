"""The kernel toolkit (runtime.toolkit): the one dtype refusal, launch configuration, and the
promise that every name it offers is documented and that importing it imports no numba."""
from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

from runtime import toolkit
from runtime.core.errors import FormulaError
from runtime.core.types import TensorType
from runtime.plugins.atomspec import AtomSpec, bind_node, every_axis
from runtime.toolkit import cpu, cuda

ROOT = Path(__file__).resolve().parents[1]


def _node(dtype: str, out_dtype: str | None = None):
    spec = AtomSpec(name="probe", refs=("test/formula-atom-probe@1",), inputs=("value",), attributes=frozenset(),
                    infer=lambda ctx: ctx.output(ctx.operands[0].axes, ctx.operands[0].sizes,
                                                 dtype=out_dtype or ctx.operands[0].dtype),
                    kernels={}, free_axes=every_axis)
    return bind_node(spec, {}, [TensorType(("D",), (4,), dtype, "d")])


def test_no_kernel_is_the_one_message():
    err = toolkit.no_kernel("rms-norm", "cuda", "float16", "$.instructions[3]")
    assert isinstance(err, FormulaError)
    assert (err.code, err.path) == ("backend_unavailable", "$.instructions[3]")
    assert err.message == "rms-norm has no cuda kernel for float16; use backend='reference'"


def test_check_dtypes_names_the_first_refused_type():
    toolkit.check_dtypes(_node("float32"), "cpu")
    with pytest.raises(FormulaError) as info:
        toolkit.check_dtypes(_node("float16"), "cpu")
    assert info.value.message == "probe has no cpu kernel for float16; use backend='reference'"
    assert info.value.path == "$.instructions[0]"
    with pytest.raises(FormulaError, match="probe has no cuda kernel for int64"):  # the output counts too
        toolkit.check_dtypes(_node("float32", "int64"), "cuda")
    toolkit.check_dtypes(_node("float32", "int64"), "cuda", types=_node("float32", "int64").input_types)
    with pytest.raises(FormulaError, match="probe epilogue has no cpu kernel for boolean"):
        toolkit.check_dtypes(_node("boolean"), "cpu", what="probe epilogue")
    toolkit.check_dtypes(_node("boolean"), "cpu", toolkit.KERNEL_DTYPES)


def test_generated_kernels_refuse_with_the_same_message():
    with pytest.raises(FormulaError) as info:
        cpu.numba_type("bfloat16", "$.instructions[1]", "scale")
    assert info.value.message == toolkit.no_kernel("scale", "cpu", "bfloat16", "$").message
    assert cuda.numba_type("float32", "$", "scale", "cuda") == "float32"


def test_launch_config():
    assert toolkit.launch_config(0) == (1, 1)
    assert toolkit.launch_config(5) == (1, 32)  # whole warps, small grids for small work
    assert toolkit.launch_config(1000) == (8, 128)
    assert toolkit.launch_config(10 ** 8) == (8192, 128)  # grid-stride beyond the cap
    assert toolkit.launch_config(10 ** 8, max_blocks=None) == (781250, 128)
    assert toolkit.launch_config(1000, threads_per_block=256) == (4, 256)


def test_every_toolkit_name_is_documented():
    section = (ROOT / "docs" / "writing-plugins.md").read_text().split("## 6. The kernel toolkit", 1)[1]
    section = section.split("\n## ", 1)[0]
    documented = set(re.findall(r"`(\w+)", section))
    names = set(toolkit.__all__) | set(cpu.__all__) | set(cuda.__all__)
    assert names - documented == set()
    assert all(hasattr(m, n) for m in (toolkit, cpu, cuda) for n in m.__all__)


def test_the_toolkit_imports_no_numba():
    code = "import sys, runtime.toolkit; assert 'numba' not in sys.modules, 'numba imported'"
    subprocess.run([sys.executable, "-c", code], cwd=ROOT, check=True)
