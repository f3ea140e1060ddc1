"""The kernel toolkit for generated CUDA kernels (``runtime.backends.cuda_codegen``): grid-
stride loops over a flattened index space. numba.cuda itself is imported only when a kernel is
built or launched.

``numba_type``, ``broadcast_axes``, ``index_expr`` as in :mod:`runtime.toolkit.cpu` (pass
``backend="cuda"``); ``render`` the module source of a grid-stride kernel; ``SpaceKernel`` it
compiled, launched with :func:`runtime.toolkit.launch_config` (``SpaceKernel.of`` launches a
constant kernel, a ``@cuda.jit`` function of a plain module, alike); ``align_device`` a device
operand in keepdims form; ``elementwise_kernel`` the fused chain's kernel; ``Source`` the
builder of generated source, as in :mod:`runtime.toolkit.cpu`.
"""
from __future__ import annotations

from runtime.backends.cpu_codegen import broadcast_axes, index_expr, numba_type
from runtime.backends.cuda_codegen import SpaceKernel, align_device, elementwise_kernel, render
from runtime.kernels.codegen import Source
from runtime.kernels.launch import launch_config

__all__ = ["numba_type", "broadcast_axes", "index_expr", "render", "SpaceKernel", "align_device",
           "elementwise_kernel", "launch_config", "Source"]
