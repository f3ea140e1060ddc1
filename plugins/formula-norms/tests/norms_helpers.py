"""Driving one atom's kernels directly, without a program (shared by this folder's tests)."""
from __future__ import annotations

import numpy as np

from runtime.plugins.atomspec import bind_node
from runtime.plugins.kernel import KernelRequest
from runtime.core.types import TensorType

import formula_norms

SPECS = {s.name: s for s in formula_norms.SPECS}
TOL = {"float32": dict(rtol=2e-5, atol=2e-6), "float64": dict(rtol=1e-12, atol=1e-13)}


def ttype(axes, sizes, dtype="float32", domain="d") -> TensorType:
    return TensorType(tuple(axes), tuple(sizes), dtype, domain)


def run_kernel(name, attributes, x, axes, backend="reference"):
    """Bind the atom for ``x`` (axes named ``axes``) and run ``backend``'s kernel on it."""
    spec = SPECS[name]
    t = ttype(axes, x.shape, x.dtype.name)
    node = bind_node(spec, attributes, [t])
    run = spec.kernels[backend](KernelRequest(node))
    if backend == "cuda":
        from numba import cuda

        out = cuda.device_array(x.shape, dtype=x.dtype)
        run([cuda.to_device(np.ascontiguousarray(x))], (), out)
        return out.copy_to_host()
    out = np.empty(x.shape, dtype=x.dtype)
    run([x], (), out)
    return out
