"""Free axes: each atom's declaration (every built-in and formula-norms atom, each attribute
that ties an axis) and the program-level analysis (runtime.plan.freeaxes)."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

import runtime
from runtime.core.types import TensorType
from runtime.plan.freeaxes import free_axes
from runtime.plugins.atomspec import Node
from runtime.plugins.registry import default_registry

EXAMPLES = Path(__file__).resolve().parents[1] / "examples"


def T(axes: str, dtype: str = "float32") -> TensorType:
    """A type with one symbol per axis (its upper-case name)."""
    names = tuple(axes.split())
    return TensorType(names, tuple(a.upper() for a in names), dtype, "d")


def full_ref(ref: str) -> str:
    """``arti/add@1`` -> ``arti/formula-atom-add@1`` (the legacy fold/unfold keep their names)."""
    owner, rest = ref.split("/")
    return ref if rest.startswith(("fold@", "unfold@")) else f"{owner}/formula-atom-{rest}"


def node(ref: str, attributes: dict, inputs: list[TensorType], output: TensorType) -> Node:
    spec = default_registry().atom(full_ref(ref), "$")
    return Node(0, "i0", spec, attributes, tuple(f"in{k}" for k in range(len(inputs))), "%o",
                tuple(inputs), output, "$.instructions[0]")


# (atom ref, attributes, operand types, output type, the free axes it must declare)
CASES = [
    # elementwise: every axis, broadcast operands included
    ("arti/scalar-map@1", {"mode": "silu"}, [T("b s d")], T("b s d"), "b s d"),
    ("arti/scalar-map@2", {"mode": "exp", "accumulation_dtype": "float32"}, [T("b s d")], T("b s d"), "b s d"),
    ("arti/scale@1", {"factor_axes": ["d"], "accumulation_dtype": "activation"}, [T("b d"), T("d")], T("b d"), "b d"),
    ("arti/add@1", {"accumulation_dtype": "activation"}, [T("b d"), T("b d")], T("b d"), "b d"),
    ("arti/select@1", {}, [T("b", "boolean"), T("b d"), T("b d")], T("b d"), "b d"),
    ("arti/cast@1", {"dtype": "float16"}, [T("b d")], T("b d", "float16"), "b d"),
    ("arti/compare@1", {"mode": "lt"}, [T("b d"), T("b d")], T("b d", "boolean"), "b d"),
    ("arti/boolean-binary@1", {"mode": "and"}, [T("b", "boolean")] * 2, T("b", "boolean"), "b"),
    ("arti/boolean-not@1", {}, [T("b", "boolean")], T("b", "boolean"), "b"),
    ("arti/position-relative@1", {}, [T("i", "int64"), T("j", "int64")], T("i j", "int64"), "i j"),
    ("formula-norms/scalar-map-ext@1", {"mode": "softplus"}, [T("b d")], T("b d"), "b d"),
    # contract: kept axes free; reduce_axes ties both sides' reduced names
    ("arti/contract@1", {"reduce_axes": [["d", "d"]], "output_axes": ["t", "r"], "accumulation_dtype": "float32"},
     [T("t d"), T("r d")], T("t r"), "t r"),
    ("arti/contract@1", {"reduce_axes": [["x", "y"]], "output_axes": ["b", "x"], "accumulation_dtype": "float32"},
     [T("b x"), T("y x")], T("b x"), "b"),  # right keeps an 'x' that left reduces: tied
    # reduce, softmax, norms: the reduced / normalised axis is tied
    ("arti/reduce@1", {"axis": "d", "mode": "sum", "accumulation_dtype": "float32"}, [T("b d")], T("b"), "b"),
    ("arti/reduce@2", {"axis": "b", "mode": "amax", "accumulation_dtype": "float32"}, [T("b d")], T("d"), "d"),
    ("arti/masked-softmax@1", {"axis": "k", "accumulation_dtype": "float32"},
     [T("q k"), T("q k", "boolean")], T("q k"), "q"),
    ("formula-norms/rms-norm@1", {"axis": "d", "epsilon": 1e-5, "accumulation_dtype": "float32"},
     [T("b d")], T("b d"), "b"),
    ("formula-norms/layer-norm@1", {"axis": "b", "epsilon": 1e-5, "accumulation_dtype": "float32"},
     [T("b d")], T("b d"), "d"),
    # layout
    ("arti/reshape@1", {"output_axes": ["b", "h", "e"], "output_sizes": ["B", 4, 8]},
     [TensorType(("b", "d"), ("B", 32), "float32", "d")], TensorType(("b", "h", "e"), ("B", 4, 8), "float32", "d"), "b"),
    ("arti/reshape@1", {"output_axes": ["n"], "output_sizes": ["N"]},
     [T("b s")], T("n"), ""),  # a flattening reshape ties everything
    ("arti/permute@1", {"output_axes": ["d", "b"]}, [T("b d")], T("d b"), "b d"),
    ("arti/broadcast@1", {"output_axes": ["b", "d"], "output_sizes": ["B", "D"]}, [T("d")], T("b d"), "b d"),
    ("arti/slice@1", {"axis": "s", "start": 0, "stop": 2, "step": 1}, [T("b s")], T("b s"), "b"),
    ("arti/concat@1", {"axis": "d"}, [T("b d"), T("b d")], T("b d"), "b"),
    # indexing: gather maps its index axis and the value's other axes; scatter ties its axis
    ("arti/gather@1", {"axis": "v", "index_axis": "t"}, [T("v d"), T("t", "int64")], T("t d"), "t d"),
    ("arti/gather@2", {"axis": "v", "index_axis": "t"}, [T("b v"), T("b t", "int64")], T("b t"), "b t"),
    ("arti/fold@2", {"axis": "v", "index_axis": "t"}, [T("v d"), T("t", "int64")], T("t d"), "t d"),
    ("arti/scatter@1", {"axis": "v", "index_axis": "t", "mode": "replace"},
     [T("v d"), T("t", "int64"), T("t d")], T("v d"), "d"),
    ("arti/scatter@2", {"axis": "v", "index_axis": "t", "mode": "add", "accumulation_dtype": "float32"},
     [T("v d"), T("t", "int64"), T("t d")], T("v d"), "d"),
    ("arti/unfold@2", {"axis": "v", "index_axis": "t", "mode": "replace"},
     [T("v d"), T("t", "int64"), T("t d")], T("v d"), "d"),
    ("arti/lookup@1", {"table_axis": "v", "output_axes": ["t", "d"]}, [T("v d"), T("t", "int64")], T("t d"), "t d"),
    # window ties its axis (the output and window axes); axis-index is its positions
    ("arti/window@1", {"axis": "s", "output_axis": "o", "window_axis": "w", "kernel_size": 2, "stride": 1,
                       "dilation": 1, "padding": [0, 0], "output_size": None}, [T("b s")], T("b o w"), "b"),
    ("arti/axis-index@1", {"axis": "s"}, [T("b s")], T("s", "int64"), ""),
    ("arti/segment@1", {"axis": "s", "segment_axis": "g", "num_segments": 3, "mode": "sum",
                        "accumulation_dtype": "float32"},
     [T("b s"), T("b s", "int64"), T("b s", "boolean")], T("b g"), "b"),
    ("arti/segment@1", {"axis": "s", "segment_axis": "g", "num_segments": 3, "mode": "softmax",
                        "accumulation_dtype": "float32"},
     [T("b s"), T("b s", "int64"), T("b s", "boolean")], T("b s"), "b"),
    # position
    ("arti/position-sinusoidal@1", {"feature_axis": "f", "feature_size": 8, "dtype": "float32", "base": 1e4},
     [T("b s", "int64")], T("b s f"), "b s"),
    ("arti/position-rotary@1", {"feature_axis": "f", "base": 1e4}, [T("b s f"), T("b s", "int64")], T("b s f"), "b s"),
    # observe: out [b, t, n, d]
    ("arti/observe-identity@1", {}, [T("b n d"), T("b t s"), T("b n", "boolean"), T("b t")], T("b t n d"), "b t n d"),
    ("arti/observe-affine@1", {"scale": 1.0}, [T("b n d"), T("b t s"), T("b n", "boolean"), T("b t"),
                                                T("w s"), T("w")], T("b t n d"), "b t n"),
    ("arti/observe-fourier@1", {"spatial_shape": [2, 2], "state_mode": "cartesian", "direction_epsilon": 1e-6,
                                "compile_policy": "safe_training"},
     [T("b n d"), T("b t s"), T("b n", "boolean"), T("b t")], T("b t n d"), "b t d"),
    # the atoms for gradients (SPEC §3c): fill reads no value; the vjps of slice and window tie their axis
    ("formula-runtime/fill@1", {"axes": ["s"], "dtype": "floating", "value": 1.0}, [T("b s")], T("s"), "s"),
    ("formula-runtime/scalar-map-vjp@1", {"mode": "tanh", "accumulation_dtype": "float32"}, [T("b d"), T("b d")],
     T("b d"), "b d"),
    ("formula-runtime/masked-softmax-vjp@1", {"axis": "k", "accumulation_dtype": "float32"}, [T("q k"), T("q k")],
     T("q k"), "q"),
    ("formula-runtime/slice-vjp@1", {"axis": "s", "start": 0, "stop": None, "step": 1}, [T("b s"), T("b s")],
     T("b s"), "b"),
    ("formula-runtime/window-vjp@1", {"axis": "s", "output_axis": "o", "window_axis": "w", "kernel_size": 2,
                                      "stride": 1, "dilation": 1, "padding": [0, 0], "output_size": "O"},
     [T("b o w"), T("b s")], T("b s"), "b"),
]


@pytest.mark.parametrize("ref, attributes, inputs, output, free", CASES,
                         ids=[f"{c[0].split('/')[1]}-{k}" for k, c in enumerate(CASES)])
def test_each_atom_declares_its_free_axes(ref, attributes, inputs, output, free):
    n = node(ref, attributes, inputs, output)
    assert n.atom.free_axes is not None, f"{ref} declares no free_axes"
    assert n.atom.free_axes(n) == frozenset(free.split())


def test_every_builtin_and_norms_atom_has_a_case():
    covered = {full_ref(c[0]) for c in CASES}
    registry = default_registry()
    owners = ("arti/", "formula-norms/", "formula-runtime/")
    missing = sorted({spec.ref for spec in registry.atoms.values()
                      if spec.ref.startswith(owners) and not set(spec.refs) & covered
                      and "neural-plasticity" not in spec.ref})
    assert not missing, f"atoms without a free-axes case: {missing}"


def test_plugin_atoms_default_to_no_free_axis():
    from runtime.plugins.atomspec import AtomSpec
    spec = AtomSpec(name="opaque", refs=("acme/opaque@1",), inputs=("value",), attributes=frozenset(),
                    infer=lambda ctx: ctx.operands[0])
    assert spec.free_axes is None


def _load(name: str) -> dict:
    return json.loads((EXAMPLES / name).read_text())


def _analyse(doc: dict):
    program = runtime.load_program(doc)
    exe = runtime.compile(program, backend="reference")
    return free_axes(program, exe.specs), exe


def test_seed_is_free_along_batch_and_tokens():
    free, exe = _analyse(_load("seed-lora-silu.program.json"))
    assert free.free == ("B", "S") and not free.tied
    plan = exe.plan({"B": 2, "S": 3})
    assert plan.free.free == ("B", "S")
    assert plan.to_dict()["free_axes"] == {"free": ["B", "S"], "tied": {}, "sums": {}}
    assert "free axes: B, S" in plan.describe()


def test_attention_ties_its_token_axis_with_the_reason():
    free, _ = _analyse(_load("transformer-block.program.json"))
    assert "T" not in free.free
    assert "two axes" in free.tied["T"]


def test_an_operand_at_another_extent_ties_the_symbol():
    doc = _load("seed-lora-silu.program.json")
    base = next(b for b in doc["bindings"] if b["name"] == "base")
    base["value_type"]["sizes"][1] = "S2"  # added to an S-sized value: at run time S2 = S
    for slot in doc["slots"]:
        if slot["slot_id"] in ("base", "%4"):
            slot["value_type"]["sizes"][1] = "S2"
    free, _ = _analyse(doc)
    assert free.free == ("B",)
    assert "extent" in free.tied["S"] or "extent" in free.tied["S2"]


def test_a_bank_carrying_the_symbol_ties_it():
    doc = _load("seed-lora-silu.program.json")
    for b in doc["bindings"]:
        if b["name"] == "lora.A":
            b["value_type"]["sizes"][0] = "R"
        if b["name"] == "lora.B":
            b["value_type"]["sizes"][1] = "R"
    for s in doc["slots"]:
        t = s["value_type"]
        t["sizes"] = ["R" if a == "R" else z for a, z in zip(t["axes"], t["sizes"])]
    free, _ = _analyse(doc)
    assert "R" not in free.free
    assert "bank" in free.tied["R"]
    assert set(free.free) == {"B", "S"}
