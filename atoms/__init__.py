"""The built-in atom plugin: every atom of SPEC §3, registered through the public hooks.

One family per module; each module exposes ``SPECS``, a list of :class:`AtomSpec`, whose
reference, CPU (``numba.njit``) and CUDA (``numba.cuda.jit``) kernels sit side by side.
"""
from __future__ import annotations

import importlib

import attrs

from runtime.plugins.hookspecs import hookimpl

FAMILIES = ("contract", "elementwise", "reduce", "reduce2", "softmax", "layout", "indexing", "scatter_add",
            "window", "segment", "position", "observe", "gradient")


def all_specs():
    """Every family's specs, each with its gradient rule (atoms/vjp.py) attached."""
    from atoms.vjp import RULES

    specs = []
    for family in FAMILIES:
        for spec in importlib.import_module(f"atoms.{family}").SPECS:
            rule = RULES.get(spec.ref)
            if rule is not None:
                spec = attrs.evolve(spec, vjp=rule.fn, differentiable=rule.differentiable)
            specs.append(spec)
    return specs


@hookimpl
def formula_register_atoms(register):
    for spec in all_specs():
        register(spec)
