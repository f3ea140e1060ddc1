"""Test helpers for formula-runtime and its plugins, shipped as the ``formula_runtime``
pytest plugin (entry point ``pytest11``): fixtures that register a plugin for one test, and
a backend-equivalence assertion against the ``reference`` oracle."""
from __future__ import annotations

import os
from collections.abc import Mapping, Sequence

import numpy as np
import pytest

from runtime.plugins import registry as _registry
from runtime.build import DEFAULT_LIMITS, ProgramBuilder  # noqa: F401 (moved; importable from here too)
from runtime.core.types import TensorType, numpy_dtype


def real_cuda() -> bool:
    """Whether this session runs CUDA kernels on a device (``FORMULA_REAL_CUDA=1``, as
    ``bench/gpu_check.sh`` sets) rather than on Numba's simulator. The simulator interprets
    every thread in Python, so simulated cases stay tiny; a device gets more and larger ones
    (several blocks, partial tiles, grid-stride loops)."""
    return os.environ.get("FORMULA_REAL_CUDA") == "1"


@pytest.fixture
def formula_registry():
    """The process-wide registry (built-ins and installed plugins)."""
    return _registry.default_registry()


@pytest.fixture
def register_plugin(formula_registry):
    """``register_plugin(obj, name=...)`` registers a plugin object for this test only."""
    added: list[str] = []

    def register(plugin, name: str | None = None, distribution: str | None = None):
        info = _registry.PluginInfo(name or getattr(plugin, "__name__", type(plugin).__name__),
                                    distribution, None)
        formula_registry.register(plugin, info)
        added.append(info.name)
        return info

    try:
        yield register
    finally:
        for name in reversed(added):
            formula_registry.unregister(name)


def random_values(program, dims: Mapping[str, int] | None = None, seed: int = 0,
                  int_high: int = 1):
    """Random inputs and banks of the declared types (``formula run --random``'s generator)."""
    from runtime.api import load_program
    from runtime.cli import random_values as generate

    return generate(load_program(program), dict(dims or {}), seed=seed, int_high=int_high)


TOLERANCES = {"float64": (1e-10, 1e-10), "float32": (2e-4, 2e-5), "float16": (1e-2, 1e-2),
              "bfloat16": (5e-2, 5e-2)}


def assert_backends_agree(program, inputs=None, banks=None, backends: Sequence[str] = ("cpu",),
                          rtol: float | None = None, atol: float | None = None, registry=None):
    """Run on ``reference`` and each backend; every output must match the oracle."""
    from runtime.api import compile as _compile

    expected = _compile(program, "reference", registry).run(inputs=inputs, banks=banks)
    for backend in backends:
        got = _compile(program, backend, registry).run(inputs=inputs, banks=banks)
        assert set(got) == set(expected)
        for slot, want in expected.items():
            have = np.asarray(got[slot])
            assert have.shape == want.shape and have.dtype == want.dtype, (backend, slot)
            r, a = TOLERANCES.get(want.dtype.name, (0, 0))
            if want.dtype.name == "bfloat16":  # compared as the float32 values they hold
                have, want = have.astype(np.float32), want.astype(np.float32)
            finite = np.abs(want[np.isfinite(want)]) if want.dtype.kind == "f" else np.zeros(0)
            if finite.size:  # absolute error scales with the (finite) values
                a *= max(1.0, float(finite.max()))
            np.testing.assert_allclose(have, want, rtol=rtol if rtol is not None else r,
                                        atol=atol if atol is not None else a,
                                        err_msg=f"backend {backend!r} slot {slot!r}")
    return expected


def run_kernel(spec, attributes, types: Sequence[TensorType], values: Sequence[np.ndarray],
               backend: str = "reference") -> np.ndarray:
    """One atom's kernel on one backend, outside any program: bind the node from ``types``,
    fill a fresh output (through device memory for ``cuda``) and return it as a host array."""
    from runtime.plugins.atomspec import bind_node
    from runtime.plugins.kernel import KernelRequest

    node = bind_node(spec, attributes, types)
    out = np.empty(node.output_type.shape, dtype=numpy_dtype(node.output_type.dtype))
    if backend == "cuda":
        from numba import cuda

        dev = cuda.device_array(out.shape, dtype=out.dtype)
        node.atom.kernels["cuda"](KernelRequest(node))([cuda.to_device(np.array(v, order="C")) for v in values], (), dev)
        return dev.copy_to_host()
    node.atom.kernels[backend](KernelRequest(node))(values, (), out)
    return out
