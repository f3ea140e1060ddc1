"""Driving one atom's kernels directly, without a program (shared by this folder's tests)."""
from __future__ import annotations

from runtime.core.types import TensorType
from runtime.testing import run_kernel as run_atom_kernel

import formula_norms

SPECS = {s.name: s for s in formula_norms.SPECS}
TOL = {"float32": dict(rtol=2e-5, atol=2e-6), "float64": dict(rtol=1e-12, atol=1e-13)}


def ttype(axes, sizes, dtype="float32", domain="d") -> TensorType:
    return TensorType(tuple(axes), tuple(sizes), dtype, domain)


def run_kernel(name, attributes, x, axes, backend="reference"):
    """Run ``backend``'s kernel of the atom ``name`` on ``x`` (axes named ``axes``)."""
    return run_atom_kernel(SPECS[name], attributes, [ttype(axes, x.shape, x.dtype.name)], [x], backend)
