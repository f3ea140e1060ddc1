"""Plugin code that raises or does not compile, named where it happens (SPEC §6 ``kernel_failed``).

An atom's ``infer``, its kernels (and their factories), its value checks and its scalar
expression are plugin code. When one raises anything but a ``FormulaError`` (which a plugin
raises on purpose, such as ``index_range``, and which passes untouched), the runtime raises
``kernel_failed`` at the instruction's JSON path, naming the atom reference, the plugin and
its distribution and what of the atom failed, with the plugin's exception as ``__cause__``.

The registry records which plugin gave each spec object (:func:`own`), so that any layer
holding a ``Node`` can name the plugin without a registry at hand.
"""
from __future__ import annotations

import weakref
from collections.abc import Mapping

from runtime.core.errors import FormulaError

# id(spec) -> (a weak reference to it, its plugin, {backend: the plugin that gave that kernel});
# single dict operations, atomic under the GIL: no lock, which a weakref callback run by the
# garbage collector inside a locked block would deadlock on
_owners: dict[int, tuple[weakref.ref, str, Mapping[str, str]]] = {}


def own(spec: object, plugin: str, kernel_plugins: Mapping[str, str] | None = None) -> None:
    """Record that ``plugin`` (``PluginInfo.describe()``) gave ``spec``, and which plugin gave
    its kernels on each backend where another one did (``formula_register_kernels``)."""
    key = id(spec)

    def forget(ref: weakref.ref, key: int = key) -> None:
        entry = _owners.get(key)
        if entry is not None and entry[0] is ref:
            _owners.pop(key, None)
    _owners[key] = (weakref.ref(spec, forget), plugin, dict(kernel_plugins or {}))


def owner_of(spec: object, backend: str | None = None) -> str | None:
    """The plugin that gave ``spec`` (or its ``backend`` kernel), as recorded by :func:`own`."""
    entry = _owners.get(id(spec))
    if entry is None or entry[0]() is not spec:
        return None
    return entry[2].get(backend, entry[1]) if backend is not None else entry[1]


def describe_atom(spec, backend: str | None = None) -> str:
    """``atom REF of plugin NAME (DIST VERSION)``, and the plugin that gave its ``backend``
    kernels where another one did: who to tell."""
    owner = owner_of(spec)
    text = f"atom {spec.ref} of plugin {owner}" if owner else f"atom {spec.ref} ({spec.name})"
    kernels = owner_of(spec, backend) if backend is not None else owner
    if kernels != owner:
        text += f" (its {backend!r} kernels from plugin {kernels})"
    return text


def kernel_failed(spec, path: str, what: str, exc: BaseException | None = None,
                  backend: str | None = None, detail: str | None = None) -> FormulaError:
    """The ``kernel_failed`` error for ``what`` of ``spec`` ("infer", "'cpu' kernel"…)
    failing with ``exc`` (raise it ``from exc``); ``detail`` replaces the exception's text."""
    if detail is None:
        detail = f"raised {type(exc).__name__}: {exc}" if exc is not None else "failed"
    return FormulaError("kernel_failed", path, f"{describe_atom(spec, backend)}: its {what} {detail}; "
                                               "this is a bug in the plugin, not in the program")


def guard(call, spec, path: str, what: str, *args, backend: str | None = None):
    """``call(*args)``, with anything it raises but a FormulaError turned into kernel_failed."""
    try:
        return call(*args)
    except (FormulaError, MemoryError):  # (a MemoryError is limit_exceeded at the public entry points)
        raise
    except Exception as exc:
        raise kernel_failed(spec, path, what, exc, backend) from exc


def infer(spec, ctx):
    """``spec.infer(ctx)``: the output type, a FormulaError the atom raised, or kernel_failed
    when it raised anything else or returned something that is not a TensorType."""
    from runtime.core.types import TensorType

    out = guard(spec.infer, spec, ctx.path, "infer", ctx)
    if not isinstance(out, TensorType):
        raise kernel_failed(spec, ctx.path, "infer", detail=f"returned {type(out).__name__}, "
                                                                 "not a runtime.core.types.TensorType")
    return out
