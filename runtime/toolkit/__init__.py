"""The kernel toolkit: what a kernel author may use besides the plugin API, kept stable.

An atom plugin imports the runtime through the public API (``runtime``, ``runtime.core``, the
public names of ``runtime.plugins.atomspec``, ``.kernel`` and ``.hookspecs``, ``runtime.build``,
``runtime.testing``) and this package; nothing else of ``runtime`` (tests/test_architecture.py
holds the built-in atoms and plugins/ to it). docs/writing-plugins.md, "The kernel toolkit",
lists every name with why it is here. This module imports no numba; the generated-kernel
helpers of each backend are :mod:`runtime.toolkit.cpu` and :mod:`runtime.toolkit.cuda`.

Refusing a dtype
    ``no_kernel(what, backend, dtype, path)`` the one ``backend_unavailable`` error;
    ``check_dtypes(node, backend, dtypes, types=None, what=None)`` raises it;
    ``KERNEL_FLOATS``, ``KERNEL_DTYPES`` the dtypes compiled kernels usually take.
Making a kernel
    ``plain_kernel(run, counts=, warm=, compiled=)`` the ``Kernel`` of ``run(inputs, out)``.
Compiled calls (``Kernel.compiled``)
    ``CompiledCall``, ``Param`` and its makers ``flat_input``, ``flat_output``, ``FLAT_OUTPUT``,
    ``flat_extra``, ``derived_input``, ``const_int``, ``const_scalar``, ``const_array``.
Serial/parallel CPU kernels
    ``Twins``; ``parallel_threshold()`` (elements below which a call stays on one thread).
CUDA launches
    ``launch_config(n, threads_per_block=128, max_blocks=8192)`` -> ``(blocks, threads)``.
Layouts
    ``align_to``, ``c_strides``, ``span_view``, ``keepdims_is_reshape``, ``readonly_c``,
    ``rows_shape``.
Epilogues (anchors, and atoms that describe themselves as one)
    ``Epilogue``, ``EpilogueStep``, ``EMPTY_EPILOGUE``.
Generated modules
    ``load_generated(source, prefix)``, ``configure_numba_cache()``.
Runs
    ``first_tier()`` (a tiered executable's first runs), ``value_is_finite(value)``.
"""
from __future__ import annotations

import math
from typing import Any

import numpy as np

from runtime.core.types import TensorType
from runtime.kernels.codegen import configure_numba_cache, load_generated
from runtime.kernels.launch import launch_config
from runtime.kernels.layout import align_to, c_strides, keepdims_is_reshape, span_view
from runtime.kernels.tiers import first_tier
from runtime.kernels.twins import Twins
from runtime.plan.fusion import EMPTY_EPILOGUE, Epilogue, EpilogueStep
from runtime.plugins.kernel import (FLAT_OUTPUT, KERNEL_DTYPES, KERNEL_FLOATS, CompiledCall, Param, check_dtypes,
                                    const_array, const_int, const_scalar, derived_input, flat_extra, flat_input,
                                    flat_output, no_kernel, plain_kernel)


def parallel_threshold() -> int:
    """Elements of work below which a CPU call runs on one thread (the generated kernels'
    threshold, ``FORMULA_CPU_PARALLEL_MIN``): pick a parallel twin at or above it."""
    from runtime.backends import cpu_codegen  # (read at each call: tests and tuning change it)

    return cpu_codegen.PARALLEL_MIN_ELEMENTS


def readonly_c(x: np.ndarray) -> np.ndarray:
    """``x`` as a read-only C-contiguous array (a copy only for a strided or Fortran-ordered
    caller array): one array type, so Numba compiles once per dtype, and a kernel that errs
    cannot write into the caller's memory."""
    x = np.ascontiguousarray(x)
    if x.flags.writeable:
        x = x.view()
        x.flags.writeable = False
    return x


def rows_shape(t: TensorType, axis: str) -> tuple[int, int, int]:
    """``(outer, n, inner)``: a C-order value of type ``t`` viewed as rows along ``axis`` (the
    middle extent), so one kernel serves any rank and axis position without a transpose."""
    k = t.axes.index(axis)
    return math.prod(t.shape[:k]), t.shape[k], math.prod(t.shape[k + 1:])


def value_is_finite(value: Any) -> bool:
    """Whether a bound value (host or device array) holds no NaN or ±inf (SPEC §4's check)."""
    from runtime.execution.bindings import value_is_finite as check

    return check(value)


__all__ = [
    "no_kernel", "check_dtypes", "KERNEL_FLOATS", "KERNEL_DTYPES", "plain_kernel",
    "CompiledCall", "Param", "flat_input", "flat_output", "FLAT_OUTPUT", "flat_extra", "derived_input",
    "const_int", "const_scalar", "const_array",
    "Twins", "parallel_threshold", "launch_config",
    "align_to", "c_strides", "span_view", "keepdims_is_reshape", "readonly_c", "rows_shape",
    "Epilogue", "EpilogueStep", "EMPTY_EPILOGUE",
    "load_generated", "configure_numba_cache", "first_tier", "value_is_finite",
]
