"""formula-norms: rms-norm, layer-norm and extra activations for formula-runtime.

formula-runtime finds this module through the ``formula_runtime.plugins`` entry point and
calls :func:`formula_register_atoms`. Importing it is cheap: it defines specs and ``@njit``
functions (compiled on first call); CUDA kernels are imported only when a cuda plan is built.
"""
from __future__ import annotations

from runtime.plugins.hookspecs import hookimpl

from .activations import SPECS as _ACTIVATION_SPECS
from .norms import SPECS as _NORM_SPECS

__version__ = "0.1.0"

SPECS = [*_NORM_SPECS, *_ACTIVATION_SPECS]


@hookimpl
def formula_register_atoms(register):
    for spec in SPECS:
        register(spec)
