"""The public entry points: load, compile, execute."""
from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from runtime.execution.executor import Executable, Result
from runtime.plan.memory import no_memory_error
from runtime.program.model import Program
from runtime.core.errors import FormulaError, fail
from runtime.plugins.registry import Registry, default_registry
from runtime.program.validate import load

DEFAULT_BACKEND = "cpu"


@no_memory_error
def load_program(src: Any, registry: Registry | None = None, max_bytes: int | None = None) -> Program:
    """A fully validated program from a path, JSON text/bytes, a parsed dict, or a Program.

    Text and files are capped at ``max_bytes`` (default: ``FORMULA_MAX_PROGRAM_BYTES``, else
    64 MiB); a path that is not a readable regular file is ``program_unreadable``."""
    return load(src, registry or default_registry(), max_bytes)


@no_memory_error
def compile(src: Any, backend: str = DEFAULT_BACKEND, registry: Registry | None = None,  # noqa: A001
            memory_limit: Any = None, tiered: bool | None = None) -> Executable:
    """An executable reusable across runs; plans and kernels are built once per set of extents.
    ``memory_limit`` caps every run's working set whatever the program's own limits say
    (bytes or ``"8G"``; default ``FORMULA_MEMORY_LIMIT``, else the machine's available memory).
    ``tiered`` (default: on for ``cpu`` unless ``FORMULA_TIERED=0``): runs whose kernels are
    still compiling execute on the ``reference`` kernels meanwhile (``Result.tier`` says which
    ran); ``exe.wait_compiled()`` waits for them."""
    registry = registry or default_registry()
    return Executable(load_program(src, registry), backend, registry, memory_limit, tiered)


def execute(src: Any, inputs: Mapping[str, Any] | None = None, banks: Any = None,
            backend: str = DEFAULT_BACKEND, trace: bool = False,
            registry: Registry | None = None, out: Mapping[str, Any] | None = None,
            memory_limit: Any = None, check_outputs: bool = False, tiered: bool | None = None) -> Result:
    """Load, compile and run once. For repeated runs, keep ``compile``'s executable.
    ``check_outputs``: raise ``nonfinite`` at the instruction whose output holds a NaN or
    ±inf (SPEC §3b.3 item 2; see ``Executable.run``)."""
    return compile(src, backend, registry, memory_limit, tiered).run(inputs=inputs, banks=banks, trace=trace,
                                                                     out=out, check_outputs=check_outputs)


def vjp(src: Any, wrt, outputs=None, registry: Registry | None = None):
    """The vector-Jacobian product of a program, as a program (SPEC §3c): ``g.program`` (a
    program dict), ``g.cotangents`` {output slot: cotangent input}, ``g.gradients`` {wrt:
    output slot}. ``src`` is a path, JSON text, a dict or a loaded program."""
    from runtime.autodiff import vjp as transform

    return transform(src, wrt, outputs, registry or default_registry())


def grad(src: Any, wrt, output: str, registry: Registry | None = None):
    """``vjp`` for one 0-d floating ``output`` with the cotangent 1 (no cotangent input)."""
    from runtime.autodiff import grad as transform

    return transform(src, wrt, output, registry or default_registry())


def open_bank_store(location, registry=None):
    """The store of the first plugin whose ``formula_open_bank_store`` understands ``location``."""
    registry = registry or default_registry()
    hook = registry.pm.hook.formula_open_bank_store
    try:
        store = hook(location=location)
    except FormulaError:
        raise
    except Exception as exc:  # a third-party opener must not leak its own exception types
        raise FormulaError("bank_store", "$.banks",
                           f"bank store opener of plugin {registry.raising_plugin(hook, exc)} "
                           f"failed on {location!r}: {type(exc).__name__}: {exc}") from exc
    if store is None:
        names = ", ".join(registry.pm.get_name(impl.plugin) or "?" for impl in hook.get_hookimpls())
        fail("bank_store", "$.banks",
             f"no bank store opener understands {location!r} (plugins with openers: "
             f"{names or 'none'}; built-in formats: .safetensors, .npz)")
    return store
