"""The built-in backends, registered through the same hook a third-party backend would use."""
from __future__ import annotations

from ..hookspecs import hookimpl
from .cpu import CpuBackend
from .cuda import CudaBackend
from .reference import ReferenceBackend


@hookimpl
def formula_register_backends(register):
    register(ReferenceBackend())
    register(CpuBackend())
    register(CudaBackend())
