"""Helpers shared by this plugin's kernel factories (Python-level preparation only)."""
from __future__ import annotations

import math

import numpy as np

from runtime.plugins.atomspec import Node
from runtime.core.errors import FormulaError
from runtime.core.types import TensorType

KERNEL_DTYPES = ("float32", "float64")  # what the cpu/cuda kernels are compiled for


def kernel_dtype(node: Node, backend: str) -> np.dtype:
    """The NumPy dtype the compiled kernels run in; float16/bfloat16 only on the oracle."""
    dtype = node.input_types[0].dtype
    if dtype not in KERNEL_DTYPES:
        raise FormulaError("backend_unavailable", node.path,
                           f"{node.atom.name} has no {backend} kernel for {dtype}; "
                           "use backend='reference'")
    return np.dtype(dtype)


def rows_shape(t: TensorType, axis: str) -> tuple[int, int, int]:
    """``(outer, n, inner)``: the C-order shape viewed as rows normalised along the middle
    axis, so one kernel handles any rank and axis position without transposing."""
    shape = t.shape
    k = t.axes.index(axis)
    return math.prod(shape[:k]), shape[k], math.prod(shape[k + 1:])


def readonly_c(x: np.ndarray) -> np.ndarray:
    """A read-only C-contiguous view (a copy only for strided/Fortran caller arrays).

    Always read-only so Numba sees one array type and compiles once per dtype, and so a
    kernel bug cannot write into the caller's memory."""
    x = np.ascontiguousarray(x)
    if x.flags.writeable:
        x = x.view()
        x.flags.writeable = False
    return x


def launch_config(n: int, threads_per_block: int = 128) -> tuple[int, int]:
    """Blocks and threads for ``n`` grid-stride work items; small grids stay small (the
    CUDA simulator runs every thread in Python)."""
    threads = min(threads_per_block, 32 * -(-n // 32))
    blocks = min(8192, -(-n // threads))
    return max(blocks, 1), max(threads, 1)
