"""Test helpers for formula-runtime and its plugins, shipped as the ``formula_runtime``
pytest plugin (entry point ``pytest11``): fixtures that register a plugin for one test, and
a backend-equivalence assertion against the ``reference`` oracle."""
from __future__ import annotations

import copy
import os
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import pytest

from . import registry as _registry
from .atomspec import InferContext
from .validate import check_signature
from .model import type_to_dict
from .types import TensorType, numpy_dtype


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


# --- building programs in tests ---------------------------------------------------------

DEFAULT_LIMITS = {
    "schema_ref": "arti/formula-limits@1", "schema_version": 1, "max_bindings": 32,
    "max_slots": 128, "max_instructions": 96, "max_steps": 64, "max_axes": 8,
    "max_axis_extent": 1 << 20, "max_tensor_elements": 1 << 28, "max_tensor_bytes": 1 << 30,
    "max_working_bytes": 1 << 31,
}


class ProgramBuilder:
    """Builds valid program dicts; instruction output types are inferred by the atoms.

        b = ProgramBuilder()
        x = b.input("x", {"T": "T", "D": 8})
        y = b.op("scalar-map", [x], {"mode": "silu"})
        program = b.build(outputs=[y])
    """

    def __init__(self, dtype: str = "float32", domain: str = "anonymous", registry=None):
        self.dtype, self.domain = dtype, domain
        self.registry = registry
        self.bindings: list[dict] = []
        self.slots: list[dict] = []
        self.instructions: list[dict] = []
        self.types: dict[str, TensorType] = {}
        self._steps: dict[str, int] = {}

    def _type(self, axes: Mapping[str, Any], dtype: str | None) -> TensorType:
        return TensorType(tuple(axes), tuple(axes.values()), dtype or self.dtype, self.domain)

    def input(self, name: str, axes: Mapping[str, Any], dtype: str | None = None) -> str:
        t = self._type(axes, dtype)
        self.bindings.append({"kind": "input", "name": name, "value_type": type_to_dict(t)})
        return self._slot(name, t, "input", name, "input")

    def bank(self, name: str, axes: Mapping[str, Any], dtype: str | None = None, *,
             source_ref: str = "arti/formula-operand-bank@1", partition_id: str | None = None,
             asset_fingerprint: str | None = None, bundle_id: str | None = None,
             member_ids: Sequence[str] = ()) -> str:
        t = self._type(axes, dtype)
        self.bindings.append({
            "kind": "bank", "name": name, "source_ref": source_ref,
            "partition_id": partition_id or name, "value_type": type_to_dict(t),
            "asset_fingerprint": asset_fingerprint, "route_ref": None, "bundle_id": bundle_id,
            "member_ids": list(member_ids)})
        return self._slot(name, t, "bank", name, "bank_operand")

    def op(self, atom: str, inputs: Sequence[str], attributes: Mapping[str, Any] | None = None,
           *, slot: str | None = None, step: int | None = None, ref: str | None = None) -> str:
        from .registry import default_registry

        registry = self.registry or default_registry()
        ref = ref or (atom if "@" in atom else f"arti/formula-atom-{atom}@1")
        spec = registry.atom(ref, "$")
        iid = f"i{len(self.instructions)}"
        slot = slot or f"%{len(self.instructions)}"
        attributes = dict(attributes or {})
        check_signature(spec, inputs, attributes, f"$.instructions[{len(self.instructions)}]")
        ctx = InferContext(spec, f"$.instructions[{len(self.instructions)}]", attributes,
                            [self.types[s] for s in inputs], inputs)
        out = spec.infer(ctx)
        step = step or 1 + max((self._steps.get(s, 0) for s in inputs), default=0)
        self.instructions.append({"instruction_id": iid, "step": step, "atom_ref": ref,
                                  "input_slots": list(inputs), "output_slot": slot,
                                  "attributes": copy.deepcopy(attributes)})
        self._steps[slot] = step
        return self._slot(slot, out, "instruction", iid, "temporary")

    def _slot(self, slot_id, t, producer, producer_id, role) -> str:
        self.types[slot_id] = t
        self.slots.append({"slot_id": slot_id, "value_type": type_to_dict(t), "producer": producer,
                           "producer_id": producer_id, "role": role})
        return slot_id

    def build(self, outputs: Sequence[str], limits: Mapping[str, Any] | None = None) -> dict:
        order = sorted(range(len(self.instructions)), key=lambda i: self.instructions[i]["step"])
        slots = copy.deepcopy(self.slots)
        for s in slots:
            if s["slot_id"] in outputs:
                s["role"] = "output"
        return {"schema_ref": "arti/formula-program@2", "schema_version": 2,
                "bindings": copy.deepcopy(self.bindings), "slots": slots,
                "instructions": [copy.deepcopy(self.instructions[i]) for i in order],
                "outputs": list(outputs), "limits": {**DEFAULT_LIMITS, **(limits or {})}}


def random_values(program, dims: Mapping[str, int] | None = None, seed: int = 0,
                  int_high: int = 1):
    """Random inputs and banks of the declared types (``formula run --random``'s generator)."""
    from .api import load_program
    from .cli import random_values as generate

    return generate(load_program(program), dict(dims or {}), seed=seed, int_high=int_high)


TOLERANCES = {"float64": (1e-10, 1e-10), "float32": (2e-4, 2e-5), "float16": (1e-2, 1e-2),
              "bfloat16": (5e-2, 5e-2)}


def assert_backends_agree(program, inputs=None, banks=None, backends: Sequence[str] = ("cpu",),
                          rtol: float | None = None, atol: float | None = None, registry=None):
    """Run on ``reference`` and each backend; every output must match the oracle."""
    from .api import compile as _compile

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
    from .atomspec import bind_node

    node = bind_node(spec, attributes, types)
    out = np.empty(node.output_type.shape, dtype=numpy_dtype(node.output_type.dtype))
    if backend == "cuda":
        from numba import cuda

        dev = cuda.device_array(out.shape, dtype=out.dtype)
        node.atom.kernels["cuda"](node)([cuda.to_device(np.array(v, order="C")) for v in values], dev)
        return dev.copy_to_host()
    node.atom.kernels[backend](node)(values, out)
    return out
