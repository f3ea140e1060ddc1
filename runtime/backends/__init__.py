"""The built-in backends, registered through the same hook a third-party backend would use."""
from __future__ import annotations

from runtime.plugins.hookspecs import hookimpl
from runtime.backends.cpu import CpuBackend
from runtime.backends.cuda import CudaBackend
from runtime.backends.reference import ReferenceBackend


@hookimpl
def formula_register_backends(register):
    register(ReferenceBackend())
    register(CpuBackend())
    register(CudaBackend())
