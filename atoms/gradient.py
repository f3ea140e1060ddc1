"""Atoms for gradients (SPEC §3c): fill@1, scalar-map-vjp@1, masked-softmax-vjp@1, slice-vjp@1
and window-vjp@1, registered as ``formula-runtime/formula-atom-<name>@1``.

The gradient rules (runtime.autodiff) emit them; they are ordinary atoms otherwise, one module
each: atoms/fill.py, atoms/scalar_map_vjp.py, atoms/softmax_vjp.py, atoms/slice_vjp.py and
atoms/window_vjp.py, with what they share (their references, the cotangent checks, the row
kernels' helpers) in atoms/_grad.py.

- **fill** reads no value of its reference. When its axes are the reference's, in order, it is
  a constant :class:`ScalarOp`, so the planner fuses it into its reader's chain and it never
  reaches memory; otherwise its own kernel stores the constant's bits (every dtype, half
  included, with no conversion).
- **scalar-map-vjp** is ȳ·f′(x) as a two-operand :class:`ScalarOp` (it joins the epilogue of
  the contraction producing ȳ). As scalar-map@2's expressions, the expressions never raise in
  plain Python or under Numba's Python error model: every division and every ``math`` call
  that could raise is guarded.
- **masked-softmax-vjp**, **slice-vjp** and **window-vjp** are row kernels in the style of
  atoms/window.py: a row is one coordinate of the other axes (atoms/_rows.py), plain ``@njit``
  row functions with serial and parallel twins on the CPU, one thread per row or element on
  CUDA. slice-vjp moves raw bits (half-native); window-vjp gathers the ≤ K taps of each output
  element in ascending (p, k), so it needs no atomics and gives the same bits on every backend.
"""
from __future__ import annotations

from . import fill, scalar_map_vjp, slice_vjp, softmax_vjp, window_vjp

SPECS = [*fill.SPECS, *scalar_map_vjp.SPECS, *softmax_vjp.SPECS, *slice_vjp.SPECS, *window_vjp.SPECS]
