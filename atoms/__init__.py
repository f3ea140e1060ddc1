"""The built-in atom plugin: every atom of SPEC §3, registered through the public hooks.

One family per module; each module exposes ``SPECS``, a list of :class:`AtomSpec`, whose
reference, CPU (``numba.njit``) and CUDA (``numba.cuda.jit``) kernels sit side by side.
"""
from __future__ import annotations

import importlib

from runtime.plugins.hookspecs import hookimpl

FAMILIES = ("contract", "elementwise", "reduce", "softmax", "layout", "indexing", "window", "segment",
            "position", "observe")


def all_specs():
    specs = []
    for family in FAMILIES:
        specs.extend(importlib.import_module(f"atoms.{family}").SPECS)
    return specs


@hookimpl
def formula_register_atoms(register):
    for spec in all_specs():
        register(spec)
