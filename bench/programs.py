"""Program dicts and input data for the benchmarks.

The builder writes SPEC §2 records directly (every binding with its slot, roles, steps, a
limits record, versioned refs) and takes each instruction's output type from the caller, so
the benchmark programs do not depend on the atoms' type inference being finished.
"""
from __future__ import annotations

import copy
import json
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

REPO = Path(__file__).resolve().parent.parent
SEED_PATH = REPO / "examples" / "seed-lora-silu.program.json"

PROGRAM_REF = "arti/formula-program@2"
TENSOR_TYPE_REF = "arti/formula-tensor-type@1"
LIMITS_REF = "arti/formula-limits@1"
BANK_SOURCE_REF = "arti/formula-operand-bank@1"

LIMITS = {
    "schema_ref": LIMITS_REF, "schema_version": 1, "max_bindings": 32, "max_slots": 128,
    "max_instructions": 96, "max_steps": 64, "max_axes": 8, "max_axis_extent": 1 << 20,
    "max_tensor_elements": 1 << 28, "max_tensor_bytes": 1 << 30, "max_working_bytes": 1 << 32,
}

SEED_DIMS = {"Din": 1024, "Dout": 1024, "R": 32}
FLOAT_DTYPES = ("float32", "float64")


def atom_ref(name: str) -> str:
    """``reduce@2`` names its version; a bare name is version 1."""
    return f"arti/formula-atom-{name}" + ("" if "@" in name else "@1")


def tensor_type(axes: Mapping[str, int | str], dtype: str, domain: str = "anonymous") -> dict:
    """A tensor-type record from an ordered ``{axis: size}`` mapping."""
    return {"schema_ref": TENSOR_TYPE_REF, "axes": list(axes), "sizes": list(axes.values()),
            "dtype": dtype, "domain": domain}


class Builder:
    """Builds a program dict in SPEC §2 form; each op gets the next step after its inputs.

        b = Builder("float32")
        x = b.input("x", {"T": 64, "D": 8})
        y = b.op("scalar-map", [x], {"mode": "silu"}, out_axes={"T": 64, "D": 8})
        program = b.build([y])
    """

    def __init__(self, dtype: str = "float32", domain: str = "anonymous"):
        self.dtype, self.domain = dtype, domain
        self.bindings: list[dict] = []
        self.slots: list[dict] = []
        self.instructions: list[dict] = []
        self._steps: dict[str, int] = {}

    def _type(self, axes: Mapping[str, int | str], dtype: str | None) -> dict:
        return tensor_type(axes, dtype or self.dtype, self.domain)

    def input(self, name: str, axes: Mapping[str, int | str], dtype: str | None = None) -> str:
        t = self._type(axes, dtype)
        self.bindings.append({"kind": "input", "name": name, "value_type": t})
        return self._slot(name, t, "input", name, "input")

    def bank(self, name: str, axes: Mapping[str, int | str], dtype: str | None = None) -> str:
        t = self._type(axes, dtype)
        self.bindings.append({
            "kind": "bank", "name": name, "source_ref": BANK_SOURCE_REF, "partition_id": name,
            "value_type": t, "asset_fingerprint": None, "route_ref": None, "bundle_id": None,
            "member_ids": []})
        return self._slot(name, t, "bank", name, "bank_operand")

    def op(self, atom: str, inputs: Sequence[str], attributes: Mapping[str, Any],
           out_axes: Mapping[str, int | str], out_dtype: str | None = None) -> str:
        index = len(self.instructions)
        slot, iid = f"%{index}", f"i{index}"
        step = 1 + max((self._steps.get(s, 0) for s in inputs), default=0)
        self.instructions.append({
            "instruction_id": iid, "step": step, "atom_ref": atom_ref(atom),
            "input_slots": list(inputs), "output_slot": slot,
            "attributes": copy.deepcopy(dict(attributes))})
        self._steps[slot] = step
        return self._slot(slot, self._type(out_axes, out_dtype), "instruction", iid, "temporary")

    def _slot(self, slot_id: str, t: dict, producer: str, producer_id: str, role: str) -> str:
        self.slots.append({"slot_id": slot_id, "value_type": t, "producer": producer,
                           "producer_id": producer_id, "role": role})
        return slot_id

    def build(self, outputs: Sequence[str]) -> dict:
        slots = copy.deepcopy(self.slots)
        for s in slots:
            if s["producer"] == "instruction":
                s["role"] = "output" if s["slot_id"] in outputs else "temporary"
        instructions = sorted(self.instructions, key=lambda i: i["step"])  # stable
        return {"schema_ref": PROGRAM_REF, "schema_version": 2,
                "bindings": copy.deepcopy(self.bindings), "slots": slots,
                "instructions": copy.deepcopy(instructions), "outputs": list(outputs),
                "limits": dict(LIMITS)}


# --- the seed program -------------------------------------------------------------------

def _rewrite_dtype(node: Any, dtype: str) -> None:
    if isinstance(node, dict):
        if "axes" in node and "dtype" in node:
            node["dtype"] = dtype
        for value in node.values():
            _rewrite_dtype(value, dtype)
    elif isinstance(node, list):
        for value in node:
            _rewrite_dtype(value, dtype)


def seed_program(dtype: str = "float32") -> dict:
    """The seed program as a dict, its tensor dtypes rewritten (accumulation stays
    ``float32``, which SPEC §3 widens to float64 for float64 operands)."""
    program = json.loads(SEED_PATH.read_text())
    if dtype not in FLOAT_DTYPES:
        raise ValueError(f"seed dtype must be one of {FLOAT_DTYPES}, got {dtype!r}")
    _rewrite_dtype(program, dtype)
    return program


def seed_data(tokens: int, dtype: str, seed: int = 0) -> dict[str, Any]:
    """Inputs and banks for B=1, S=tokens, scaled so every intermediate is O(1).

    Uses only the random generator (no BLAS), so building data wakes no thread pool."""
    rng = np.random.default_rng(seed)
    dt = np.dtype(dtype)
    din, dout, rank = SEED_DIMS["Din"], SEED_DIMS["Dout"], SEED_DIMS["R"]

    def normal(shape, scale=1.0):
        a = rng.standard_normal(shape, dtype=np.float32 if dt == np.float32 else np.float64)
        if scale != 1.0:
            a *= dt.type(scale)
        return a

    return {
        "inputs": {"base": normal((1, tokens, dout)), "x": normal((1, tokens, din)),
                   "lora.gain": np.asarray(0.5, dtype=dt)},
        "banks": {"lora.A": normal((rank, din), din ** -0.5),
                  "lora.B": normal((dout, rank), rank ** -0.5)},
    }


def sample_rows(tokens: int, limit: int = 64) -> np.ndarray:
    """Token rows checked after a run: all of them when few, else a fixed spread."""
    if tokens <= limit:
        return np.arange(tokens)
    return np.unique(np.linspace(0, tokens - 1, limit).astype(np.int64))


def seed_expected_rows(data: Mapping[str, Any], rows: np.ndarray) -> np.ndarray:
    """The seed formula on selected rows, in float64 with ``einsum`` (no BLAS call, so the
    check leaves the contender's process free of extra BLAS thread activity)."""
    x = data["inputs"]["x"][0, rows].astype(np.float64)
    base = data["inputs"]["base"][0, rows].astype(np.float64)
    gain = float(data["inputs"]["lora.gain"])
    a = data["banks"]["lora.A"].astype(np.float64)
    b = data["banks"]["lora.B"].astype(np.float64)
    h = np.einsum("td,rd->tr", x, a, optimize=False)
    s = h / (1.0 + np.exp(-h))
    return base + gain * np.einsum("tr,or->to", s, b, optimize=False)


def tolerance(dtype: str) -> dict[str, float]:
    return {"rtol": 2e-4, "atol": 2e-4} if dtype == "float32" else {"rtol": 1e-9, "atol": 1e-9}
