"""SPEC §3b.3: the decisions where arti and this SPEC differ, each at its code and path."""
from __future__ import annotations

import json

import numpy as np
import pytest

import runtime
from runtime.testing import ProgramBuilder

EFFECT_ATOMS = ["neural-plasticity@1", "neural-plasticity-blend@1", "neural-plasticity-outer@1",
                "neural-plasticity-outer@2", "neural-plasticity-transport@1",
                "neural-plasticity-polynomial@1", "neural-plasticity-proximal@1"]


def _add_program(dtype: str = "float32") -> dict:
    b = ProgramBuilder(dtype=dtype)
    x, y = b.input("x", {"N": 4}), b.input("y", {"N": 4})
    z = b.op("add", [x, y], {"accumulation_dtype": "float32"})
    return json.loads(json.dumps(b.build(outputs=[z])))


@pytest.mark.parametrize("atom", EFFECT_ATOMS)
def test_effect_atoms_are_unknown_and_say_why(atom):
    """Item 5: an effect atom fails at load with unknown_atom, saying it is not executed here."""
    program = _add_program()
    program["instructions"][0]["atom_ref"] = f"arti/formula-atom-{atom}"
    with pytest.raises(runtime.FormulaError) as info:
        runtime.load_program(program)
    err = info.value
    assert (err.code, err.path) == ("unknown_atom", "$.instructions[0].atom_ref")
    assert "effect atom" in err.message and "not executed by this runtime" in err.message
    assert "close to it" not in err.message  # no misleading look-alike suggestions


@pytest.mark.parametrize("backend", ["reference", "cpu", "cuda"])
@pytest.mark.parametrize("dtypes", [("float32", "float64"), ("float16", "float32"), ("float64", "float16")])
def test_floating_bindings_of_different_dtypes_meeting_in_one_atom(backend, dtypes):
    """Item 3: `floating` bindings bound to different float dtypes where an atom needs one dtype
    is the caller's binding error, named at the binding that differs."""
    program = _add_program("floating")
    inputs = {"x": np.ones(4, dtypes[0]), "y": np.ones(4, dtypes[1])}
    with pytest.raises(runtime.FormulaError) as info:
        runtime.execute(program, inputs=inputs, backend=backend)
    err = info.value
    assert (err.code, err.path) == ("binding_dtype", "$.inputs.y")
    assert dtypes[0] in err.message and dtypes[1] in err.message and "add" in err.message


def test_floating_bindings_of_one_dtype_run():
    program = _add_program("floating")
    out = runtime.execute(program, inputs={"x": np.ones(4, np.float64), "y": np.ones(4, np.float64)})
    (value,) = out.values()
    assert value.dtype == np.float64 and np.all(value == 2)
