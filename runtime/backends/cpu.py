"""Numba ``@njit`` kernels on the host, with fused groups over one pre-planned arena."""
from __future__ import annotations

from .host import HostBackend


class CpuBackend(HostBackend):
    name = "cpu"
    fuses = True
    chain_counts_nonfinite = True

    def elementwise_kernel(self, epilogue, out_type):
        from .cpu_codegen import elementwise_kernel

        return elementwise_kernel(epilogue, out_type)
