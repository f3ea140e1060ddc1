"""Test helpers for formula-runtime and its plugins, shipped as the ``formula_runtime``
pytest plugin (entry point ``pytest11``): fixtures that register a plugin for one test, and
a backend-equivalence assertion against the ``reference`` oracle."""
from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np
import pytest

from runtime.core import settings
from runtime.plugins import registry as _registry
from runtime.build import DEFAULT_LIMITS, ProgramBuilder  # noqa: F401 (moved; importable from here too)
from runtime.core.types import TensorType, numpy_dtype


def real_cuda() -> bool:
    """Whether this session runs CUDA kernels on a device (``FORMULA_REAL_CUDA=1``, as
    ``bench/gpu_check.sh`` sets) rather than on Numba's simulator. The simulator interprets
    every thread in Python, so simulated cases stay tiny; a device gets more and larger ones
    (several blocks, partial tiles, grid-stride loops)."""
    return settings.REAL_CUDA.read()


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
    from runtime.execution.values import random_values as generate

    return generate(load_program(program), dict(dims or {}), seed=seed, int_high=int_high)


TOLERANCES = {"float64": (1e-10, 1e-10), "float32": (2e-4, 2e-5), "float16": (1e-2, 1e-2),
              "bfloat16": (5e-2, 5e-2)}


def assert_backends_agree(program, inputs=None, banks=None, backends: Sequence[str] = ("cpu",),
                          rtol: float | None = None, atol: float | None = None, registry=None):
    """Run on ``reference`` and each backend; every output must match the oracle. Each backend
    runs untiered: its own kernels, never the reference ones it would start on while compiling."""
    from runtime.api import compile as _compile

    expected = _compile(program, "reference", registry).run(inputs=inputs, banks=banks)
    for backend in backends:
        got = _compile(program, backend, registry, tiered=False).run(inputs=inputs, banks=banks)
        assert got.tier == backend, (backend, got.tier)
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


def warm_drivers(exe, inputs=None, banks=None):
    """Run ``exe`` on these values until its compiled drivers build (its kernels compile on the
    first run), wait for them, fail if one failed to build, and return the plans it compiled
    (a test then runs the values through the drivers)."""
    from runtime.execution.compiled import DRIVER_AFTER_RUNS

    for _ in range(DRIVER_AFTER_RUNS):
        exe.run(inputs=inputs, banks=banks)
    assert exe.wait_compiled() is not False
    plans = list(exe._plans.values())
    assert all(c.driver_error is None for c in plans), [c.driver_error for c in plans]
    return plans


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


# --- gradients (SPEC §3c) ------------------------------------------------------------------------

FLOAT_NAMES = ("float16", "bfloat16", "float32")


def as_float64(program) -> dict:
    """The program with every concrete float type (and ``dtype`` attribute) made float64: the
    same computation, where central finite differences are accurate to ~1e-8."""
    import copy

    from runtime.api import load_program

    data = copy.deepcopy(load_program(program).to_dict())

    def retype(t: dict) -> None:
        if t["dtype"] in FLOAT_NAMES:
            t["dtype"] = "float64"

    for b in data["bindings"]:
        retype(b["value_type"])
    for s in data["slots"]:
        retype(s["value_type"])
    for ins in data["instructions"]:
        if ins["attributes"].get("dtype") in FLOAT_NAMES:
            ins["attributes"]["dtype"] = "float64"
    return data


def _widen(values: Mapping[str, np.ndarray] | None) -> dict[str, np.ndarray]:
    out = {}
    for k, v in (values or {}).items():
        a = np.asarray(v)
        out[k] = a.astype(np.float64) if a.dtype.kind == "f" or a.dtype.name == "bfloat16" else a
    return out


def check_gradients(program, wrt: Sequence[str], inputs=None, banks=None,
                    outputs: Sequence[str] | None = None, backend: str = "reference",
                    directions: int = 3, eps: float = 1e-6, rtol: float = 1e-5, atol: float = 1e-8,
                    seed: int = 0, torch_fn=None, registry=None) -> dict[str, np.ndarray]:
    """The one-call gradient check for rule authors: ``runtime.vjp`` of ``program`` (made
    float64 by :func:`as_float64`) run on ``backend`` against central finite differences
    along ``directions`` random directions, ⟨ȳ, (f(x+εv) − f(x−εv))/2ε⟩ = ⟨vjp, v⟩.

    ``torch_fn(**values) -> {output slot: tensor}`` (the same computation in torch, values by
    binding name) adds a comparison with ``torch.autograd`` when torch is installed. Returns
    the gradients {wrt name: array}."""
    from runtime.api import compile as _compile, vjp

    p64 = as_float64(program)
    inputs, banks = _widen(inputs), _widen(banks)
    g = vjp(p64, wrt, outputs, registry)
    forward = _compile(p64, "reference", registry)
    rng = np.random.default_rng(seed)
    base = forward.run(inputs=inputs, banks=banks)
    cot = {name: rng.standard_normal(np.shape(base[slot])) for slot, name in g.cotangents.items()}
    result = _compile(g.program, backend, registry).run(inputs={**inputs, **cot}, banks=banks)
    grads = {w: np.asarray(result[slot]) for w, slot in g.gradients.items()}

    def f(shifted: Mapping[str, np.ndarray]) -> float:
        ins = {k: shifted.get(k, v) for k, v in inputs.items()}
        bks = {k: shifted.get(k, v) for k, v in banks.items()}
        out = forward.run(inputs=ins, banks=bks)
        return sum(float(np.sum(cot[name] * out[slot])) for slot, name in g.cotangents.items())

    values = {**inputs, **banks}
    for _ in range(directions):
        v = {w: rng.standard_normal(np.shape(values[w])) for w in wrt}
        plus = f({w: values[w] + eps * v[w] for w in wrt})
        minus = f({w: values[w] - eps * v[w] for w in wrt})
        numeric = (plus - minus) / (2 * eps)
        analytic = sum(float(np.sum(grads[w] * v[w])) for w in wrt)
        scale = max(1.0, abs(numeric), abs(analytic))
        assert abs(numeric - analytic) <= atol + rtol * scale, (
            f"vjp disagrees with finite differences along a random direction: "
            f"{analytic!r} against {numeric!r}")
    if torch_fn is not None:
        try:
            import torch
        except ImportError:
            return grads
        tv = {k: torch.tensor(np.asarray(v), requires_grad=k in wrt) for k, v in values.items()}
        outs = torch_fn(**tv)
        total = sum((outs[slot] * torch.tensor(cot[name])).sum() for slot, name in g.cotangents.items())
        expected = torch.autograd.grad(total, [tv[w] for w in wrt], allow_unused=True)
        for w, e in zip(wrt, expected):
            want = np.zeros_like(grads[w]) if e is None else e.detach().numpy()
            np.testing.assert_allclose(grads[w], want, rtol=1e-7, atol=1e-9,
                                       err_msg=f"gradient of {w!r} against torch.autograd")
    return grads
