"""scalar-map@2, cast@1, compare@1, boolean-binary@1, boolean-not@1 (SPEC §3b): infer errors,
hand-computed values and IEEE edge cases in float16/float32/float64, cpu and cuda against
reference (hypothesis shapes), and fusion into chains and contraction epilogues."""
from __future__ import annotations

import math

import ml_dtypes
import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

import runtime
from atoms.elementwise import MODES_V2, SPECS
from runtime.plugins.atomspec import InferContext
from runtime.core.errors import FormulaError
from runtime.testing import TOLERANCES, ProgramBuilder, assert_backends_agree, real_cuda
from runtime.core.types import TensorType

SPEC = {s.ref: s for s in SPECS}
F32 = {"accumulation_dtype": "float32"}
INF = math.inf


def ref(name: str) -> str:
    return f"arti/formula-atom-{name}" + ("" if "@" in name else "@1")


def T(axes, sizes, dtype="float32", domain="d"):
    return TensorType(tuple(axes), tuple(sizes), dtype, domain)


def infer(name, attributes, *types):
    spec = SPEC[ref(name)]
    return spec.infer(InferContext(spec, "$.instructions[2]", attributes, types, [f"s{k}" for k in range(len(types))]))


@pytest.mark.parametrize("name, attributes, types, code, path, needle", [
    ("scalar-map@2", {"mode": "swish", **F32}, [T("A", [2])], "atom_attributes", ".attributes.mode", "swish"),
    ("scalar-map@2", {"mode": "exp", "accumulation_dtype": "float16"}, [T("A", [2])],
     "atom_attributes", ".attributes.accumulation_dtype", "float16"),
    ("scalar-map@2", {"mode": "log", **F32}, [T("A", [2], "int64")], "type_mismatch", ".input_slots[0]", "floating"),
    ("cast", {"dtype": "floating"}, [T("A", [2])], "atom_attributes", ".attributes.dtype", "floating"),
    ("cast", {"dtype": "int64"}, [T("A", [2])], "atom_attributes", ".attributes.dtype", "int64"),
    ("cast", {"dtype": "float16"}, [T("A", [2], "boolean")], "type_mismatch", ".input_slots[0]", "boolean"),
    ("compare", {"mode": "lt"}, [T("A", [2], "boolean")] * 2, "type_mismatch", ".input_slots[0]", "'lt'"),
    ("compare", {"mode": "approx"}, [T("A", [2])] * 2, "atom_attributes", ".attributes.mode", "approx"),
    ("compare", {"mode": "eq"}, [T("A", [2]), T("A", [2], "float64")], "type_mismatch", ".input_slots[1]", "float64"),
    ("compare", {"mode": "eq"}, [T("A", [2]), T("A", [3])], "type_mismatch", ".input_slots[1]", "'A'"),
    ("boolean-binary", {"mode": "nand"}, [T("A", [2], "boolean")] * 2, "atom_attributes", ".attributes.mode", "nand"),
    ("boolean-binary", {"mode": "and"}, [T("A", [2])] * 2, "type_mismatch", ".input_slots[0]", "boolean"),
    ("boolean-not", {}, [T("A", [2], "int64")], "type_mismatch", ".input_slots[0]", "boolean"),
])
def test_infer_errors(name, attributes, types, code, path, needle):
    with pytest.raises(FormulaError) as info:
        infer(name, attributes, *types)
    assert info.value.code == code and info.value.path == "$.instructions[2]" + path, info.value
    assert needle in str(info.value)


def test_infer_types():
    v = T("BD", ["B", 8], "floating")
    assert infer("scalar-map@2", {"mode": "softplus", **F32}, v) == v
    assert infer("cast", {"dtype": "bfloat16"}, v) == T("BD", ["B", 8], "bfloat16")
    assert infer("compare", {"mode": "ge"}, v, v).dtype == "boolean"
    b = T("BD", ["B", 8], "boolean")
    assert infer("compare", {"mode": "ne"}, b, b) == b
    assert infer("boolean-binary", {"mode": "xor"}, b, b) == b and infer("boolean-not", {}, b) == b


def test_signature_needs_every_key():
    b = ProgramBuilder()
    x = b.input("x", {"N": 2})
    with pytest.raises(FormulaError) as info:
        b.op("scalar-map", [x], {"mode": "exp"}, ref=ref("scalar-map@2"))
    assert info.value.code == "atom_signature"


def _one(name, attributes, dtype, *values, out_dtype=None):
    """Run a one-instruction program on every backend; returns {backend: result}."""
    b = ProgramBuilder(dtype=dtype)
    slots = [b.input(f"x{k}", {"N": len(v)}, dtype if v.dtype != np.bool_ else "boolean")
             for k, v in enumerate(values)]
    y = b.op(name.split("@")[0], slots, attributes, ref=ref(name))
    prog = b.build(outputs=[y])
    inputs = {f"x{k}": v for k, v in enumerate(values)}
    return {be: runtime.execute(prog, inputs=inputs, backend=be)[y] for be in ("reference", "cpu", "cuda")}


EDGE = {  # mode: (finite inputs, IEEE results); inputs are exact in every float dtype
    "log": ([0.0, -0.0, -1.0, 1.0, 4.0], [-INF, -INF, math.nan, 0.0, math.log(4.0)]),
    "reciprocal": ([0.0, -0.0, 2.0, -4.0, 0.5], [INF, -INF, 0.5, -0.25, 2.0]),
    "rsqrt": ([0.0, 4.0, -1.0, 0.25, 16.0], [INF, 0.5, math.nan, 2.0, 0.25]),
    "log1p": ([-1.0, -2.0, 0.0, 1.0, -0.0], [-INF, math.nan, 0.0, math.log(2.0), -0.0]),
    "abs": ([-2.0, -0.0, 3.0, -5.0, 0.5], [2.0, 0.0, 3.0, 5.0, 0.5]),
    "exp": ([0.0, -1000.0, 1000.0, 1.0, -0.0], [1.0, 0.0, INF, math.e, 1.0]),
    "expm1": ([0.0, -1000.0, 1000.0, -0.0, 1.0], [0.0, -1.0, INF, -0.0, math.e - 1]),
    "sin": ([0.0, 0.5, -0.5, -0.0, 1.0], [0.0, math.sin(0.5), -math.sin(0.5), -0.0, math.sin(1.0)]),
    "cos": ([0.0, 0.5, 1.0, -0.0, 2.0], [1.0, math.cos(0.5), math.cos(1.0), 1.0, math.cos(2.0)]),
}


@pytest.mark.parametrize("dtype", ["float16", "float32", "float64"])
@pytest.mark.parametrize("mode", sorted(EDGE))
def test_ieee_edge_values(mode, dtype):
    x, want = EDGE[mode]
    got = _one("scalar-map@2", {"mode": mode, **F32}, dtype, np.array(x, dtype))
    want = np.array(want, dtype)
    for backend, y in got.items():
        assert y.dtype == np.dtype(dtype)
        np.testing.assert_allclose(y, want, rtol=2e-3 if dtype == "float16" else 1e-6, err_msg=backend)
        np.testing.assert_array_equal(np.signbit(y[want == 0]), np.signbit(want[want == 0]), err_msg=backend)


@pytest.mark.parametrize("dtype", ["float16", "float32", "float64"])
def test_softplus_around_its_threshold(dtype):
    x = np.array([19.5, 20.0, 20.25, 20.5, -3.0], dtype)
    got = _one("scalar-map@2", {"mode": "softplus", **F32}, dtype, x)
    xd = x.astype(np.float64)
    want = np.where(xd > 20, xd, np.log1p(np.exp(xd))).astype(dtype).astype(np.float64)  # 20: log1p(exp(20))
    for backend, y in got.items():
        np.testing.assert_allclose(y.astype(np.float64), want, rtol=2e-3 if dtype == "float16" else 1e-6,
                                   err_msg=backend)
        assert y[2] == x[2] and y[3] == x[3], backend  # strictly above 20: x itself


def test_float16_exp_overflows_to_inf_at_the_final_rounding():
    x = np.array([11.0, 11.1, -20.0], np.float16)  # e^11.1 > 65504
    for backend, y in _one("scalar-map@2", {"mode": "exp", **F32}, "float16", x).items():
        assert y[0] == np.float16(np.exp(11.0)) and y[1] == INF and y[2] == np.float16(np.exp(-20.0)), backend


@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_cast_to_float16_overflows_to_inf_and_rounds_to_even(dtype):
    x = np.array([65504, 65519, 65520, -65520, 1e6, 1 + 2 ** -11, 1 + 3 * 2 ** -11, 2 ** -25], dtype)
    want = np.array([65504, 65504, INF, -INF, INF, 1, 1 + 2 ** -9, 0], np.float16)
    for backend, y in _one("cast", {"dtype": "float16"}, dtype, x).items():
        assert y.dtype == np.float16
        np.testing.assert_array_equal(y, want, err_msg=backend)


@pytest.mark.parametrize("target", ["float16", "bfloat16", "float32", "float64"])
@pytest.mark.parametrize("dtype", ["float16", "float32", "float64"])
def test_cast_between_float_dtypes(dtype, target):
    x = np.array([1.0, -2.5, 1e-3, 3.14159, 100.0, 0.0], dtype)
    want = x.astype(ml_dtypes.bfloat16 if target == "bfloat16" else target)
    for backend, y in _one("cast", {"dtype": target}, dtype, x).items():
        assert y.dtype == want.dtype
        np.testing.assert_array_equal(y.view(np.uint8), want.view(np.uint8), err_msg=backend)  # exact


@pytest.mark.parametrize("dtype", ["float16", "float32", "float64"])
def test_compare_is_ieee_with_nan_only_ne(dtype):
    """Operands made by log (inputs must be finite): log(-1) = NaN, log(0) = -inf."""
    b = ProgramBuilder(dtype=dtype)
    x, y = b.input("x", {"N": 5}), b.input("y", {"N": 5})
    lx = b.op("scalar-map", [x], {"mode": "log", **F32}, ref=ref("scalar-map@2"))
    ly = b.op("scalar-map", [y], {"mode": "log", **F32}, ref=ref("scalar-map@2"))
    modes = ("eq", "ne", "lt", "le", "gt", "ge")
    outs = [b.op("compare", [lx, ly], {"mode": m}) for m in modes]
    prog = b.build(outputs=outs)
    inputs = {"x": np.array([1, 2, -1, 0, 0], dtype), "y": np.array([1, 3, -1, 1, 0], dtype)}
    # left = [0, ln2, NaN, -inf, -inf], right = [0, ln3, NaN, 0, -inf]
    expect = {"eq": [1, 0, 0, 0, 1], "ne": [0, 1, 1, 1, 0], "lt": [0, 1, 0, 1, 0],
              "le": [1, 1, 0, 1, 1], "gt": [0, 0, 0, 0, 0], "ge": [1, 0, 0, 0, 1]}
    for backend in ("reference", "cpu", "cuda"):
        res = runtime.execute(prog, inputs=inputs, backend=backend)
        for mode, slot in zip(modes, outs):
            assert res[slot].dtype == np.bool_
            np.testing.assert_array_equal(res[slot], np.array(expect[mode], bool), err_msg=f"{mode} {backend}")


def test_boolean_atoms_and_boolean_compare():
    a = np.array([True, True, False, False])
    b = np.array([True, False, True, False])
    for mode, want in {"and": a & b, "or": a | b, "xor": a ^ b}.items():
        for backend, y in _one("boolean-binary", {"mode": mode}, "float32", a, b).items():
            np.testing.assert_array_equal(y, want, err_msg=f"{mode} {backend}")
    for backend, y in _one("boolean-not", {}, "float32", a).items():
        np.testing.assert_array_equal(y, ~a, err_msg=backend)
    for backend, y in _one("compare", {"mode": "eq"}, "float32", a, b).items():
        np.testing.assert_array_equal(y, a == b, err_msg=backend)


def _chain_program(mode, dtype, extents, order):
    """x -> scalar-map@2 -> compare with y -> boolean-not, plus a cast and a boolean-binary."""
    b = ProgramBuilder(dtype=dtype)
    axes = dict(zip(order, extents))
    x = b.input("x", axes)
    y = b.input("y", axes)
    m = b.op("scalar-map", [x], {"mode": mode, **F32}, ref=ref("scalar-map@2"))
    c = b.op("compare", [m, y], {"mode": "lt"})
    n = b.op("boolean-not", [c])
    k = b.op("boolean-binary", [n, c], {"mode": "or"})
    w = b.op("cast", [m], {"dtype": "float64" if dtype != "float64" else "float16"})
    return b.build(outputs=[m, k, w])


@settings(deadline=None, max_examples=8)
@given(seed=st.integers(0, 2 ** 16), order=st.permutations("ABC"),
       extents=st.tuples(*[st.integers(1, 4)] * 3), mode=st.sampled_from(MODES_V2),
       dtype=st.sampled_from(["float16", "float32", "float64"]))
def test_cpu_matches_reference_hypothesis(seed, order, extents, mode, dtype):
    rng = np.random.default_rng(seed)
    shape = tuple(extents)
    x = (rng.standard_normal(shape) * 3).astype(dtype)
    prog = _chain_program(mode, dtype, extents, order)
    rtol, atol = TOLERANCES[dtype]  # the cast's wider output carries the source dtype's rounding
    assert_backends_agree(prog, {"x": x, "y": x[::-1].copy()}, backends=["cpu"], rtol=rtol, atol=atol)


@settings(deadline=None, max_examples=25 if real_cuda() else 3)
@given(seed=st.integers(0, 2 ** 16), mode=st.sampled_from(MODES_V2),
       dtype=st.sampled_from(["float16", "float32", "float64"]))
def test_cuda_matches_reference_hypothesis(seed, mode, dtype):
    rng = np.random.default_rng(seed)
    x = (rng.standard_normal((2, 3, 2)) * 3).astype(dtype)
    prog = _chain_program(mode, dtype, (2, 3, 2), "ABC")
    rtol, atol = TOLERANCES[dtype]
    assert_backends_agree(prog, {"x": x, "y": -x}, backends=["cuda"], rtol=rtol, atol=atol)


@pytest.mark.parametrize("dtype", ["float32", "float16"])
def test_scalar_map_v2_and_compare_join_a_contraction_epilogue(dtype):
    b = ProgramBuilder(dtype=dtype)
    x = b.input("x", {"T": 4, "D": 8})
    w = b.input("w", {"R": 3, "D": 8})
    y = b.input("y", {"T": 4, "R": 3})
    h = b.op("contract", [x, w], {"reduce_axes": [["D", "D"]], "output_axes": ["T", "R"], **F32})
    s = b.op("scalar-map", [h], {"mode": "softplus", **F32}, ref=ref("scalar-map@2"))
    c = b.op("compare", [s, y], {"mode": "gt"})
    prog = b.build(outputs=[c])
    for backend in ("cpu", "cuda"):
        plan = runtime.compile(prog, backend=backend).plan()
        fused = [g for g in plan.groups if g.anchor is not None and g.anchor.atom.name == "contract"]
        names = [n.atom.name for n in fused[0].nodes]
        if dtype == "float32":
            assert len(fused) == 1 and names == ["contract", "scalar-map", "compare"]
            assert fused[0].output_type.dtype == "boolean"
        else:  # compare must see the rounded half value: the chain is narrowed before it
            assert len(fused) == 1 and names == ["contract", "scalar-map"]
    rng = np.random.default_rng(1)
    dt = np.dtype(dtype)
    inputs = {"x": rng.standard_normal((4, 8)).astype(dt), "w": rng.standard_normal((3, 8)).astype(dt),
              "y": np.abs(rng.standard_normal((4, 3))).astype(dt)}
    want = runtime.execute(prog, inputs=inputs, backend="reference")[c]
    for backend in ("cpu", "cuda"):
        np.testing.assert_array_equal(runtime.execute(prog, inputs=inputs, backend=backend)[c], want)
