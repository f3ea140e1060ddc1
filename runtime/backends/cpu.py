"""Numba ``@njit`` kernels on the host, with fused groups over one pre-planned arena."""
from __future__ import annotations

from runtime.backends.host import HostBackend


class CpuBackend(HostBackend):
    name = "cpu"
    fuses = True

    _on_run = None

    def entering_run(self) -> None:
        on_run = CpuBackend._on_run
        if on_run is None:
            from runtime.kernels import threads  # (imports numba: not at import time)

            on_run = CpuBackend._on_run = threads.on_run
        on_run()  # pins Numba's worker threads after a few runs, if asked to

    def elementwise_kernel(self, request):
        from runtime.backends.cpu_codegen import elementwise_kernel

        return elementwise_kernel(request)
