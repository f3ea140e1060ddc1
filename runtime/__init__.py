"""formula-runtime: execute typed formula programs with planned, fused, compiled kernels.

    import runtime
    result = runtime.execute("examples/seed-lora-silu.program.json", inputs={...}, banks={...})
    b = runtime.ProgramBuilder()     # programs from Python (runtime.build), checked as they grow

Public names are loaded on first use, so importing a submodule (an atom plugin importing
``runtime.plugins.atomspec``) stays cheap.
"""
from __future__ import annotations

import importlib

from runtime.kernels.codegen import configure_numba_cache as _configure_numba_cache
from runtime.core.errors import FormulaError

_configure_numba_cache()  # before any @njit(cache=True) kernel is defined

_LAZY = {
    "compile": "api", "execute": "api", "load_program": "api",
    "BankOperand": "execution.banks", "open_bank_store": "api",
    "Executable": "execution.executor", "Result": "execution.executor", "Program": "program.model",
    "ProgramBuilder": "build", "vjp": "api", "grad": "api", "Gradient": "autodiff",
}

__all__ = ["FormulaError", *_LAZY]
__version__ = "0.1.0"


def __getattr__(name: str):
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'runtime' has no attribute {name!r}")
    value = getattr(importlib.import_module(f".{module}", __name__), name)
    globals()[name] = value
    return value
