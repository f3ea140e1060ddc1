"""Numba ``@njit`` kernels on the host, with fused groups over one pre-planned arena."""
from __future__ import annotations

from runtime.backends.host import HostBackend


class CpuBackend(HostBackend):
    name = "cpu"
    fuses = True
    chain_counts_nonfinite = True

    def elementwise_kernel(self, epilogue, out_type):
        from runtime.backends.cpu_codegen import elementwise_kernel

        return elementwise_kernel(epilogue, out_type)
