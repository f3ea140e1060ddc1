"""The public entry points: load, compile, execute."""
from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from . import loader
from .executor import Executable, Result
from .model import Program
from .registry import Registry, default_registry
from .validate import validate

DEFAULT_BACKEND = "cpu"


def load_program(src: Any, registry: Registry | None = None) -> Program:
    """A fully validated program from a path, JSON text/bytes, a parsed dict, or a Program."""
    if isinstance(src, Program):
        return src
    program = loader.program(loader.read_source(src))
    validate(program, registry or default_registry())
    return program


def compile(src: Any, backend: str = DEFAULT_BACKEND, registry: Registry | None = None) -> Executable:  # noqa: A001
    """An executable reusable across runs; plans and kernels are built once per set of extents."""
    registry = registry or default_registry()
    return Executable(load_program(src, registry), backend, registry)


def execute(src: Any, inputs: Mapping[str, Any] | None = None, banks: Any = None,
            backend: str = DEFAULT_BACKEND, trace: bool = False,
            registry: Registry | None = None, out: Mapping[str, Any] | None = None) -> Result:
    """Load, compile and run once. For repeated runs, keep ``compile``'s executable."""
    return compile(src, backend, registry).run(inputs=inputs, banks=banks, trace=trace, out=out)
