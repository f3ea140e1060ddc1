"""The oracle: every atom's plain-NumPy kernel, one instruction at a time, no fusion."""
from __future__ import annotations

from runtime.backends.host import HostBackend


class ReferenceBackend(HostBackend):
    name = "reference"
    fuses = False
    half_kernels = True  # NumPy computes each atom in c(acc, d) and rounds once

    def prepare(self, float_dtypes: set[str]) -> None:
        """Nothing: the oracle checks with NumPy and compiles nothing (nor keeps a first run waiting)."""

    def elementwise_kernel(self, request):
        raise NotImplementedError("the reference backend runs every instruction on its own")
