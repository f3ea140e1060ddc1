"""The kernel toolkit for generated CPU kernels (``runtime.backends.cpu_codegen``'s loop
nests, which the fused chains use too), and the SIMD and vector-math helpers their bodies
call. Importing it imports numba.

``numba_type(dtype, path, what, backend="cpu")`` the Numba scalar type of a dtype, or
:func:`runtime.toolkit.no_kernel`; ``broadcast_axes``, ``index_expr`` the reads of a
broadcast operand; ``loop_nest``, ``render`` the source of a serial or parallel loop nest;
``NestKernel`` its compiled serial/parallel pair, picked per call; ``contiguous`` an operand
in the form those kernels take; ``elementwise_kernel`` the fused chain's kernel; ``simd``,
``vmath`` the vector helpers (``simd.lanes``, ``vmath.IMPORT``, ``vmath.GELU_EXPR``, ...);
``Source`` the builder of generated source (lines, indented blocks, an import set, ``text()``).
"""
from __future__ import annotations

from runtime.backends.cpu_codegen import (NestKernel, broadcast_axes, contiguous, elementwise_kernel, index_expr,
                                          loop_nest, numba_type, render)
from runtime.kernels import simd, vmath
from runtime.kernels.codegen import Source

__all__ = ["numba_type", "broadcast_axes", "index_expr", "loop_nest", "render", "NestKernel", "contiguous",
           "elementwise_kernel", "simd", "vmath", "Source"]
