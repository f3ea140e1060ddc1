"""runtime.vjp / runtime.grad (SPEC §3c): every differentiable atom against float64 central
finite differences (runtime.testing.check_gradients), the conventions at kinks and ties, the
gradient program's own gradient (grad of grad), and the refusals."""
from __future__ import annotations

import json

import numpy as np
import pytest

import runtime
from runtime.build import ProgramBuilder
from runtime.testing import check_gradients

RNG = np.random.default_rng(7)


def normal(*shape):
    return RNG.standard_normal(shape)


def case_contract():
    b = ProgramBuilder("float64")
    x = b.input("x", {"T": 3, "D": 4})
    w = b.bank("w", {"O": 5, "D": 4})
    y = b.op("contract", [x, w], {"reduce_axes": [["D", "D"]], "output_axes": ["O", "T"],
                                  "accumulation_dtype": "float32"})
    return b.build([y]), ["x", "w"], {"x": normal(3, 4)}, {"w": normal(5, 4)}


def case_contract_batched_renamed():
    b = ProgramBuilder("float64")
    left = b.input("l", {"B": 2, "i": 3, "k": 4})
    right = b.input("r", {"m": 4, "B": 2, "j": 2})
    y = b.op("contract", [left, right], {"reduce_axes": [["k", "m"]], "output_axes": ["j", "B", "i"],
                                         "accumulation_dtype": "activation"})
    return b.build([y]), ["l", "r"], {"l": normal(2, 3, 4), "r": normal(4, 2, 2)}, {}


def case_contract_two_pairs_swapped():
    b = ProgramBuilder("float64")
    left = b.input("l", {"a": 3, "b": 2, "t": 4})
    right = b.input("r", {"b": 3, "a": 2})
    y = b.op("contract", [left, right], {"reduce_axes": [["a", "b"], ["b", "a"]], "output_axes": ["t"],
                                         "accumulation_dtype": "float32"})
    return b.build([y]), ["l", "r"], {"l": normal(3, 2, 4), "r": normal(3, 2)}, {}


def case_contract_nothing_own():
    b = ProgramBuilder("float64")
    left = b.input("l", {"T": 3, "D": 4})
    right = b.input("r", {"D": 4})
    y = b.op("contract", [left, right], {"reduce_axes": [["D", "D"]], "output_axes": ["T"],
                                         "accumulation_dtype": "float32"})
    return b.build([y]), ["l", "r"], {"l": normal(3, 4), "r": normal(4)}, {}


def case_scale_add_fanout():
    b = ProgramBuilder("float64")
    x = b.input("x", {"T": 3, "D": 4})
    f = b.input("f", {"D": 4})
    g = b.input("g", {})
    s = b.op("scale", [x, f], {"factor_axes": ["D"], "accumulation_dtype": "float32"})
    s2 = b.op("scale", [s, g], {"factor_axes": [], "accumulation_dtype": "activation"})
    sq = b.op("scale", [x, x], {"factor_axes": ["T", "D"], "accumulation_dtype": "float32"})
    y = b.op("add", [s2, sq], {"accumulation_dtype": "float32"})
    y2 = b.op("add", [y, x], {"accumulation_dtype": "float32"})
    return b.build([y2]), ["x", "f", "g"], {"x": normal(3, 4), "f": normal(4), "g": np.float64(0.7)}, {}


def case_reduce(mode, version=2):
    def make():
        b = ProgramBuilder("float64")
        x = b.input("x", {"T": 3, "D": 5})
        attrs = {"axis": "D", "mode": mode, "accumulation_dtype": "float32"}
        y = b.op("reduce@2" if version == 2 else "reduce", [x], attrs)
        return b.build([y]), ["x"], {"x": normal(3, 5)}, {}
    return make


def case_layout():
    b = ProgramBuilder("float64")
    x = b.input("x", {"A": 2, "B": 3, "C": 1})
    r = b.op("reshape", [x], {"output_axes": ["P", "Q"], "output_sizes": [3, 2]})
    p = b.op("permute", [r], {"output_axes": ["Q", "P"]})
    c = b.op("broadcast", [x], {"output_axes": ["N", "B", "A", "C"], "output_sizes": [2, 3, 2, 4]})
    s = b.op("slice", [c], {"axis": "C", "start": 1, "stop": None, "step": 2})
    cat = b.op("concat", [s, s], {"axis": "C"})
    return b.build([p, cat]), ["x"], {"x": normal(2, 3, 1)}, {}


def case_indexing():
    b = ProgramBuilder("float64")
    x = b.input("x", {"N": 4, "D": 3})
    i = b.input("i", {"K": 5}, dtype="int64")
    u = b.input("u", {"J": 2, "D": 3})
    j = b.input("j", {"J": 2}, dtype="int64")
    g1 = b.op("gather", [x, i], {"axis": "N", "index_axis": "K"})
    g2 = b.op("gather@2", [x, i], {"axis": "N", "index_axis": "K"})
    s1 = b.op("scatter", [x, j, u], {"axis": "N", "index_axis": "J", "mode": "replace"})
    s2 = b.op("scatter@2", [x, i, g1], {"axis": "N", "index_axis": "K", "mode": "add",
                                        "accumulation_dtype": "float32"})
    return (b.build([g2, s1, s2]), ["x", "u"],
            {"x": normal(4, 3), "i": np.array([0, 2, 2, 3, 0]), "u": normal(2, 3), "j": np.array([3, 1])}, {})


def case_lookup():
    b = ProgramBuilder("float64")
    t = b.bank("table", {"D": 3, "V": 6})
    i = b.input("i", {"S": 2, "R": 3}, dtype="int64")
    y = b.op("lookup", [t, i], {"table_axis": "V", "output_axes": ["D", "S", "R"]})
    return b.build([y]), ["table"], {"i": np.array([[1, 5, 1], [0, 1, 2]])}, {"table": normal(3, 6)}


def case_select():
    b = ProgramBuilder("float64")
    m = b.input("m", {"D": 4}, dtype="boolean")
    x = b.input("x", {"T": 2, "D": 4})
    z = b.input("z", {"T": 2, "D": 4})
    y = b.op("select", [m, x, z])
    return b.build([y]), ["x", "z"], {"m": np.array([True, False, True, False]), "x": normal(2, 4),
                                      "z": normal(2, 4)}, {}


POSITIVE = {"log", "log1p", "rsqrt"}


def case_scalar_map(mode, version):
    def make():
        b = ProgramBuilder("float64")
        x = b.input("x", {"T": 7})
        attrs = {"mode": mode} if version == 1 else {"mode": mode, "accumulation_dtype": "float32"}
        y = b.op("scalar-map" if version == 1 else "scalar-map@2", [x], attrs)
        v = np.array([-3.1, -1.2, -0.4, 0.3, 0.9, 2.2, 25.0])
        if mode in POSITIVE:
            v = np.abs(v) + 0.2
        if mode in ("exp", "expm1"):
            v = v / 5.0
        return b.build([y]), ["x"], {"x": v}, {}
    return make


def case_cast():
    b = ProgramBuilder("float64")
    x = b.input("x", {"T": 3})
    c = b.op("cast", [x], {"dtype": "float32"})
    y = b.op("cast", [c], {"dtype": "float64"})
    return b.build([y]), ["x"], {"x": normal(3)}, {}


def case_masked_softmax():
    b = ProgramBuilder("float64")
    x = b.input("x", {"R": 3, "K": 4})
    m = b.input("m", {"R": 3, "K": 4}, dtype="boolean")
    y = b.op("masked-softmax", [x, m], {"axis": "K", "accumulation_dtype": "float32"})
    mask = np.array([[True, True, False, True], [False] * 4, [True, False, False, False]])
    return b.build([y]), ["x"], {"x": normal(3, 4), "m": mask}, {}


def case_segment(mode):
    def make():
        b = ProgramBuilder("float64")
        x = b.input("x", {"B": 2, "N": 6})
        ids = b.input("ids", {"N": 6}, dtype="int64")
        m = b.input("m", {"B": 2, "N": 6}, dtype="boolean")
        y = b.op("segment", [x, ids, m], {"axis": "N", "segment_axis": "G", "num_segments": 4,
                                          "mode": mode, "accumulation_dtype": "float32"})
        mask = np.array([[True, True, True, False, True, True], [True, False, True, False, True, True]])
        return (b.build([y]), ["x"], {"x": normal(2, 6), "ids": np.array([0, 2, 0, -5, 2, 1]), "m": mask}, {})
    return make


def case_window():
    b = ProgramBuilder("float64")
    x = b.input("x", {"B": 2, "N": 7})
    y = b.op("window", [x], {"axis": "N", "output_axis": "P", "window_axis": "K", "kernel_size": 3,
                             "stride": 2, "dilation": 2, "padding": [2, 1], "output_size": None})
    return b.build([y]), ["x"], {"x": normal(2, 7)}, {}


def case_observe(kind):
    def make():
        b = ProgramBuilder("float64")
        v = b.input("v", {"b": 2, "n": 3, "d": 2})
        s = b.input("s", {"b": 2, "t": 4, "e": 3})
        m = b.input("m", {"b": 2, "n": 3}, dtype="boolean")
        a = b.input("a", {"b": 2, "t": 4})
        values = {"v": normal(2, 3, 2), "s": normal(2, 4, 3), "m": np.array([[True, False, True]] * 2),
                  "a": normal(2, 4)}
        if kind == "identity":
            y = b.op("observe-identity", [v, s, m, a])
            return b.build([y]), ["v", "a"], values, {}
        if kind == "identity-boolean":
            b2 = ProgramBuilder("floating")
            v, s, m = (b2.input("v", {"b": 2, "n": 3, "d": 2}), b2.input("s", {"b": 2, "t": 4, "e": 3}),
                       b2.input("m", {"b": 2, "n": 3}, dtype="boolean"))
            a = b2.input("a", {"b": 2, "t": 4}, dtype="boolean")
            y = b2.op("observe-identity", [v, s, m, a])
            return b2.build([y]), ["v"], {**values, "a": normal(2, 4) > 0}, {}
        w = b.bank("w", {"w": 4, "e": 3})
        c = b.bank("c", {"w": 4})
        y = b.op("observe-affine", [v, s, m, a, w, c], {"scale": 0.5})
        return b.build([y]), ["v", "s", "a", "w", "c"], values, {"w": normal(4, 3) * 0.5, "c": normal(4)}
    return make


def case_position():
    b = ProgramBuilder("float64")
    p = b.input("p", {"S": 3})
    q = b.input("q", {"K": 2, "S": 3})
    v = b.input("v", {"S": 3, "H": 2, "F": 4})
    pos = b.input("pos", {"S": 3}, dtype="int64")
    rel = b.op("position-relative", [p, q])
    rot = b.op("position-rotary", [v, pos], {"feature_axis": "F", "base": 10000.0})
    return (b.build([rel, rot]), ["p", "q", "v"],
            {"p": normal(3), "q": normal(2, 3), "v": normal(3, 2, 4), "pos": np.array([0, 5, 11])}, {})


def case_position_float_coordinates(width):
    def make():
        b = ProgramBuilder("float64")
        v = b.input("v", {"S": 3, "H": 2, "F": 4})
        p = b.input("p", {"S": 3})
        q = b.input("q", {"H": 2, "S": 3})
        rot = b.op("position-rotary", [v, p], {"feature_axis": "F", "base": 100.0})
        sin = b.op("position-sinusoidal", [q], {"feature_axis": "W", "feature_size": width,
                                                 "dtype": "floating", "base": 50.0})
        return (b.build([rot, sin]), ["v", "p", "q"],
                {"v": normal(3, 2, 4), "p": normal(3) * 2, "q": normal(2, 3) * 2}, {})
    return make


def case_seed():
    program = json.load(open("examples/seed-lora-silu.program.json"))
    x = normal(1, 2, 1024) * 0.5
    inputs = {"x": x, "base": normal(1, 2, 1024), "lora.gain": np.float64(0.8)}
    banks = {"lora.A": normal(32, 1024) * 0.03, "lora.B": normal(1024, 32) * 0.03}
    return program, ["lora.A", "lora.B", "lora.gain", "x"], inputs, banks


CASES = {
    "contract": case_contract, "contract-batched-renamed": case_contract_batched_renamed,
    "contract-two-pairs-swapped": case_contract_two_pairs_swapped,
    "contract-nothing-own": case_contract_nothing_own, "scale-add-fanout": case_scale_add_fanout,
    "reduce@1": case_reduce("sum", 1),
    **{f"reduce@2-{m}": case_reduce(m) for m in ("sum", "mean", "amax", "logsumexp")},
    "layout": case_layout, "indexing": case_indexing, "lookup": case_lookup, "select": case_select,
    **{f"scalar-map@1-{m}": case_scalar_map(m, 1)
       for m in ("gelu", "relu", "rsqrt", "sigmoid", "silu", "tanh")},
    **{f"scalar-map@2-{m}": case_scalar_map(m, 2)
       for m in ("abs", "exp", "expm1", "log", "log1p", "softplus", "reciprocal", "sin", "cos")},
    "cast": case_cast, "masked-softmax": case_masked_softmax,
    **{f"segment-{m}": case_segment(m) for m in ("sum", "mean", "amax", "softmax")},
    "window": case_window, "observe-identity": case_observe("identity"),
    "observe-identity-boolean": case_observe("identity-boolean"),
    "observe-affine": case_observe("affine"), "position": case_position, "seed": case_seed,
    "position-float-even": case_position_float_coordinates(6),
    "position-float-odd": case_position_float_coordinates(5),
}


@pytest.mark.parametrize("name", sorted(CASES))
def test_vjp_matches_finite_differences(name):
    program, wrt, inputs, banks = CASES[name]()
    check_gradients(program, wrt, inputs, banks)


@pytest.mark.parametrize("name", ["contract-batched-renamed", "scale-add-fanout", "reduce@2-amax",
                                  "layout", "indexing", "lookup", "scalar-map@2-softplus",
                                  "masked-softmax", "segment-softmax", "window", "observe-affine",
                                  "position", "position-float-odd"])
def test_the_gradient_of_a_gradient_matches_finite_differences(name):
    """vjp(vjp(P)) loads and runs: the gradient program, differentiated again for its inputs."""
    program, wrt, inputs, banks = CASES[name]()
    g = runtime.vjp(check_float64(program), wrt)
    cot = {name_: normal(*runtime.execute(check_float64(program), inputs=inputs, banks=banks,
                                          backend="reference")[slot].shape)
           for slot, name_ in g.cotangents.items()}
    check_gradients(g.program, wrt[:1], {**inputs, **cot}, banks)


def check_float64(program):
    from runtime.testing import as_float64

    return as_float64(program)


@pytest.mark.parametrize("mode", ["gelu", "relu", "rsqrt", "sigmoid", "silu", "tanh", "abs", "exp",
                                  "expm1", "log", "log1p", "softplus", "reciprocal", "sin", "cos"])
def test_second_derivatives_of_every_scalar_mode(mode):
    program, wrt, inputs, banks = case_scalar_map(mode, 2)()
    g = runtime.vjp(program, wrt)
    cot = {n: normal(7) for n in g.cotangents.values()}
    check_gradients(g.program, ["x"], {**inputs, **cot}, banks)


# --- conventions at kinks and ties (SPEC §3c) ---------------------------------------------------

def _grad_of(program, wrt, inputs, cotangent, backend="reference"):
    g = runtime.vjp(program, wrt)
    (name,) = g.cotangents.values()
    r = runtime.execute(g.program, inputs={**inputs, name: cotangent}, backend=backend)
    return {w: r[s] for w, s in g.gradients.items()}


@pytest.mark.parametrize("backend", ["reference", "cpu"])
def test_kinks_follow_torch(backend):
    for mode, x, want in (("relu", [0.0, -1.0, 2.0], [0.0, 0.0, 1.0]),
                          ("abs", [0.0, -1.0, 2.0], [0.0, -1.0, 1.0]),
                          ("softplus", [20.5, 30.0, 0.0], [1.0, 1.0, 0.5])):
        program, _, _, _ = case_scalar_map(mode, 2)()
        b = ProgramBuilder("float64")
        xs = b.input("x", {"T": 3})
        y = b.op("scalar-map@2", [xs], {"mode": mode, "accumulation_dtype": "float32"})
        got = _grad_of(b.build([y]), ["x"], {"x": np.array(x)}, np.ones(3), backend)["x"]
        np.testing.assert_array_equal(got, want, err_msg=mode)


@pytest.mark.parametrize("backend", ["reference", "cpu"])
def test_amax_ties_share_the_cotangent(backend):
    b = ProgramBuilder("float32")
    x = b.input("x", {"D": 3})
    y = b.op("reduce@2", [x], {"axis": "D", "mode": "amax", "accumulation_dtype": "float32"})
    got = _grad_of(b.build([y]), ["x"], {"x": np.array([2, 2, 0], np.float32)}, np.float32(1), backend)
    np.testing.assert_array_equal(got["x"], [0.5, 0.5, 0.0])


@pytest.mark.parametrize("backend", ["reference", "cpu"])
def test_hidden_and_fully_masked_entries_get_exact_zeros(backend):
    program, wrt, inputs, _ = case_masked_softmax()
    got = _grad_of(program, wrt, inputs, np.full((3, 4), 1e300), backend)["x"]
    assert np.isfinite(got).all()
    np.testing.assert_array_equal(got[~inputs["m"]], 0.0)
    np.testing.assert_array_equal(got[1], 0.0)


def test_gradients_are_deterministic_and_typed_like_their_bindings():
    program, wrt, inputs, banks = case_scale_add_fanout()
    g = runtime.vjp(program, wrt)
    types = {b["name"]: b["value_type"] for b in program["bindings"]}
    slots = {s["slot_id"]: s["value_type"] for s in g.program["slots"]}
    for w, slot in g.gradients.items():
        assert slots[slot] == types[w]
    assert g.program["outputs"] == [g.gradients[w] for w in wrt]
    cot = {n: normal(3, 4) for n in g.cotangents.values()}
    exe = runtime.compile(g.program, "cpu")
    first = exe.run(inputs={**inputs, **cot})
    again = exe.run(inputs={**inputs, **cot})
    for slot in first:
        np.testing.assert_array_equal(first[slot], again[slot])


def test_the_forward_program_stays_as_it_was():
    program, wrt, _, _ = case_seed()
    g = runtime.vjp(program, wrt)
    forward_ids = [i["instruction_id"] for i in program["instructions"]]
    kept = {i["instruction_id"]: i for i in g.program["instructions"] if i["instruction_id"] in forward_ids}
    for ins in program["instructions"]:
        assert kept[ins["instruction_id"]] == ins
    assert {b["name"] for b in program["bindings"]} < {b["name"] for b in g.program["bindings"]}
    runtime.load_program(json.dumps(g.program))  # valid as JSON text too


def test_a_contraction_gradient_takes_the_operand_of_its_last_axis_on_the_right():
    """dV = Pᵀ·dO of attention's output O = P·V: V's last axis (Dh) comes from dO, so the rule
    writes contract(P, dO), whose kernels write rows of Dh (contract(dO, P) wrote a column of
    the result per row of its tile); a gradient whose last axis is the other operand's keeps
    the cotangent first. Both equal the oracle's."""
    b = ProgramBuilder("float64")
    p, v = b.input("p", {"H": 2, "S": 5, "K": 4}), b.input("v", {"K": 4, "H": 2, "Dh": 3})
    o = b.op("contract", [p, v], {"reduce_axes": [["K", "K"]], "output_axes": ["S", "H", "Dh"],
                                  "accumulation_dtype": "float32"})
    program = b.build([o])
    g = runtime.vjp(program, wrt=["p", "v"])
    (cotangent,) = g.cotangents.values()
    made = {i["output_slot"]: i for i in g.program["instructions"]}
    dv, dp = made[g.gradients["v"]], made[g.gradients["p"]]
    assert dv["atom_ref"] == dp["atom_ref"] == "arti/formula-atom-contract@1"
    assert dv["input_slots"] == ["p", cotangent]  # V's last axis, Dh, is the cotangent's
    assert dp["input_slots"] == [cotangent, "v"]  # P's last axis, K, is V's
    rng = np.random.default_rng(0)
    values = {"p": rng.standard_normal((2, 5, 4)), "v": rng.standard_normal((4, 2, 3)),
              cotangent: rng.standard_normal((5, 2, 3))}
    got = runtime.compile(g.program, "cpu").run(inputs=values)
    want = runtime.compile(g.program, "reference").run(inputs=values)
    np.testing.assert_allclose(got[g.gradients["v"]], np.einsum("hsk,shd->khd", values["p"], values[cotangent]))
    for name in ("p", "v"):
        np.testing.assert_allclose(got[g.gradients[name]], want[g.gradients[name]], rtol=1e-12)


def test_inactive_paths_emit_nothing_and_unreached_bindings_get_zeros():
    b = ProgramBuilder("float32")
    x = b.input("x", {"T": 3})
    z = b.input("z", {"T": 3})
    u = b.op("scalar-map", [x], {"mode": "tanh"})
    v = b.op("scalar-map", [z], {"mode": "sigmoid"})
    program = b.build([u, v])
    g = runtime.vjp(program, ["x"], outputs=[u])
    added = [i["atom_ref"] for i in g.program["instructions"] if i["instruction_id"].startswith("vjp")]
    assert added == ["formula-runtime/formula-atom-scalar-map-vjp@1"]  # nothing for the sigmoid
    g2 = runtime.vjp(program, ["z"], outputs=[u])
    r = runtime.execute(g2.program, inputs={"x": np.ones(3, np.float32), "z": np.ones(3, np.float32),
                                            g2.cotangents[u]: np.ones(3, np.float32)}, backend="reference")
    np.testing.assert_array_equal(r[g2.gradients["z"]], 0.0)


def test_grad_of_a_scalar_loss_needs_no_cotangent():
    b = ProgramBuilder("float64")
    x = b.input("x", {"T": 4})
    sq = b.op("scale", [x, x], {"factor_axes": ["T"], "accumulation_dtype": "float32"})
    loss = b.op("reduce@2", [sq], {"axis": "T", "mode": "sum", "accumulation_dtype": "float32"})
    g = runtime.grad(b.build([loss]), ["x"], output=loss)
    assert g.cotangents == {}
    x0 = np.array([1.0, -2.0, 0.5, 3.0])
    for backend in ("reference", "cpu"):
        np.testing.assert_allclose(runtime.execute(g.program, inputs={"x": x0}, backend=backend)[g.gradients["x"]],
                                   2 * x0)


@pytest.mark.slow  # (CI runs the slow set after the suite: README)
def test_cpu_gradients_equal_the_reference():
    from runtime.testing import assert_backends_agree

    for name in ("seed", "contract-batched-renamed", "layout", "segment-amax", "masked-softmax"):
        program, wrt, inputs, banks = CASES[name]()
        g = runtime.vjp(check_float64(program), wrt)
        out = runtime.execute(check_float64(program), inputs=inputs, banks=banks, backend="reference")
        cot = {n: normal(*out[s].shape) for s, n in g.cotangents.items()}
        assert_backends_agree(g.program, {**inputs, **cot}, banks)


# --- refusals ---------------------------------------------------------------------------------------

def _seed():
    return json.load(open("examples/seed-lora-silu.program.json"))


def test_wrt_names_are_checked():
    with pytest.raises(runtime.FormulaError) as err:
        runtime.vjp(_seed(), ["lora.a"])
    assert (err.value.code, err.value.path) == ("binding_keys", "$.wrt[0]")
    assert "lora.A" in err.value.message
    b = ProgramBuilder("float32")
    x = b.input("x", {"T": 3})
    i = b.input("i", {"K": 2}, dtype="int64")
    y = b.op("gather", [x, i], {"axis": "T", "index_axis": "K"})
    with pytest.raises(runtime.FormulaError) as err:
        runtime.vjp(b.build([y]), ["x", "i"])
    assert (err.value.code, err.value.path) == ("not_differentiable", "$.wrt[1]")


def test_observe_fourier_is_not_differentiable():
    b = ProgramBuilder("float32")
    v = b.input("v", {"b": 1, "n": 4, "d": 2})
    s = b.input("s", {"b": 1, "t": 2, "e": 2})
    m = b.input("m", {"b": 1, "n": 4}, dtype="boolean")
    a = b.input("a", {"b": 1, "t": 2})
    y = b.op("observe-fourier", [v, s, m, a], {"spatial_shape": [2, 2], "state_mode": "cartesian",
                                               "direction_epsilon": 1e-6, "compile_policy": "safe_training"})
    with pytest.raises(runtime.FormulaError) as err:
        runtime.vjp(b.build([y]), ["v"])
    assert (err.value.code, err.value.path) == ("not_differentiable", "$.instructions[0]")
    assert "observe-fourier" in err.value.message and "atoms" in err.value.message


class _Triple:
    """A plugin atom (3·x) with no gradient rule, and hooks that give it one."""
    from runtime.plugins.atomspec import AtomSpec, ScalarOp
    from runtime.plugins.hookspecs import hookimpl

    REF = "acme/formula-atom-triple@1"

    @staticmethod
    def spec():
        from runtime.plugins.atomspec import AtomSpec, ScalarOp, every_axis
        from runtime.plugins.kernel import plain_kernel

        def infer(ctx):
            ctx.require_dtype(0, "floating")
            t = ctx.operands[0]
            return ctx.output(t.axes, t.sizes)

        def ref(request):
            def run(inputs, out):
                out[...] = 3 * np.asarray(inputs[0])
            return plain_kernel(run)
        return AtomSpec(name="triple", refs=(_Triple.REF,), inputs=("value",), attributes=frozenset(),
                        infer=infer, kernels={"reference": ref}, free_axes=every_axis)


class AtomPlugin:
    from runtime.plugins.hookspecs import hookimpl

    @hookimpl
    def formula_register_atoms(self, register):
        register(_Triple.spec())


def _triple_program():
    b = ProgramBuilder("float64")
    x = b.input("x", {"T": 3})
    y = b.op("triple", [x], ref=_Triple.REF)
    return b.build([y])


def test_a_rule_less_plugin_atom_is_refused_naming_it(register_plugin):
    register_plugin(AtomPlugin(), name="acme", distribution="acme-atoms")
    with pytest.raises(runtime.FormulaError) as err:
        runtime.vjp(_triple_program(), ["x"])
    assert (err.value.code, err.value.path) == ("not_differentiable", "$.instructions[0]")
    assert _Triple.REF in err.value.message and "acme-atoms" in err.value.message


def test_a_plugin_gives_a_rule_for_another_plugins_atom(register_plugin):
    from runtime.plugins.hookspecs import hookimpl

    class Rules:
        @hookimpl
        def formula_register_vjps(self, register):
            register(_Triple.REF, lambda ctx: {0: ctx.mul(ctx.cotangent, ctx.scalar(ctx.cotangent, 3.0))})

    register_plugin(AtomPlugin(), name="acme")
    register_plugin(Rules(), name="acme-rules")
    check_gradients(_triple_program(), ["x"], {"x": normal(3)})
    with pytest.raises(runtime.FormulaError) as err:
        register_plugin(Rules(), name="other-rules")
    assert err.value.code == "plugin_conflict"
    assert "acme-rules" in err.value.message and "other-rules" in err.value.message


@pytest.mark.parametrize("bad, words", [
    (lambda ctx: {0: ctx.inputs[0] if False else ctx.fill(ctx.cotangent, 0.0, axes=())}, "type"),
    (lambda ctx: 1 / 0, "ZeroDivisionError"),
    (lambda ctx: {0: ctx.op("reduce@2", [ctx.cotangent], {"axis": "nope", "mode": "sum",
                                                          "accumulation_dtype": "float32"})},
     "atom_attributes"),
    (lambda ctx: [ctx.cotangent], "mapping"),
])
def test_a_faulty_rule_is_kernel_failed_naming_the_atom(register_plugin, bad, words):
    from runtime.plugins.hookspecs import hookimpl

    class Rules:
        @hookimpl
        def formula_register_vjps(self, register):
            register(_Triple.REF, bad)

    register_plugin(AtomPlugin(), name="acme")
    register_plugin(Rules(), name="acme-rules")
    with pytest.raises(runtime.FormulaError) as err:
        runtime.vjp(_triple_program(), ["x"])
    assert (err.value.code, err.value.path) == ("kernel_failed", "$.instructions[0]")
    assert _Triple.REF in err.value.message and "acme-rules" in err.value.message
    assert words in err.value.message


# --- torch.autograd on the same programs (tests/torch_oracle.py) ----------------------------------

TORCH_CASES = ["contract", "contract-batched-renamed", "contract-two-pairs-swapped", "contract-nothing-own",
               "scale-add-fanout", "reduce@1", "reduce@2-sum", "reduce@2-mean", "reduce@2-amax",
               "reduce@2-logsumexp", "layout", "select", "cast", "masked-softmax", "seed",
               *[f"scalar-map@1-{m}" for m in ("gelu", "relu", "rsqrt", "sigmoid", "silu", "tanh")],
               *[f"scalar-map@2-{m}" for m in ("abs", "exp", "expm1", "log", "log1p", "softplus",
                                                 "reciprocal", "sin", "cos")]]


@pytest.mark.parametrize("name", TORCH_CASES)
def test_vjp_matches_torch_autograd(name):
    pytest.importorskip("torch", reason="the torch oracle needs PyTorch")
    from tests.torch_oracle import interpret

    program, wrt, inputs, banks = CASES[name]()
    check_gradients(program, wrt, inputs, banks, directions=1,
                    torch_fn=interpret(check_float64(program)))


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
@pytest.mark.parametrize("backend", ["reference", "cpu"])
def test_half_precision_gradients_accumulate_in_float32(dtype, backend):
    """A half program's gradient agrees with the float32 program's within §3b.1's tolerance."""
    ml_dtypes = pytest.importorskip("ml_dtypes")
    half = np.float16 if dtype == "float16" else ml_dtypes.bfloat16

    def program(dt):
        b = ProgramBuilder(dt)
        x = b.input("x", {"T": 8, "D": 64})
        w = b.bank("w", {"O": 16, "D": 64})
        h = b.op("contract", [x, w], {"reduce_axes": [["D", "D"]], "output_axes": ["T", "O"],
                                      "accumulation_dtype": "float32"})
        s = b.op("scalar-map@2", [h], {"mode": "silu", "accumulation_dtype": "float32"})
        y = b.op("reduce@2", [s], {"axis": "O", "mode": "mean", "accumulation_dtype": "float32"})
        return b.build([y])

    rng = np.random.default_rng(5)
    x, w, c = rng.standard_normal((8, 64)), rng.standard_normal((16, 64)) * 0.1, rng.standard_normal(8)
    x, w, c = (v.astype(half).astype(np.float32) for v in (x, w, c))  # the same values in both
    results = {}
    for dt, cast in (("float32", np.float32), (dtype, half)):
        g = runtime.vjp(program(dt), ["x", "w"])
        r = runtime.execute(g.program, inputs={"x": x.astype(cast), g.cotangents["%2"]: c.astype(cast)},
                            banks={"w": w.astype(cast)}, backend=backend)
        results[dt] = {k: np.asarray(r[s]).astype(np.float32) for k, s in g.gradients.items()}
        assert all(np.asarray(r[s]).dtype == np.dtype(cast) for s in g.gradients.values())
    rtol, atol = (2e-3, 1e-3) if dtype == "float16" else (1.6e-2, 1e-2)
    for k in ("x", "w"):
        scale = float(np.abs(results["float32"][k]).max())
        np.testing.assert_allclose(results[dtype][k], results["float32"][k], rtol=rtol, atol=atol * scale)


@pytest.mark.slow  # (CI runs the slow set after the suite: README)
def test_the_example_transformer_block_differentiates_for_every_weight_and_its_input():
    program = json.load(open("examples/transformer-block.program.json"))
    rng = np.random.default_rng(11)
    T = 5
    inputs = {"x": rng.standard_normal((T, 64)), "positions": np.arange(T),
              "causal_mask": np.tril(np.ones((T, T), bool)), "epsilon": np.float64(1e-5)}
    banks = {b["name"]: rng.standard_normal([s for s in b["value_type"]["sizes"]]) * 0.15
             for b in program["bindings"] if b["kind"] == "bank"}
    wrt = ["x", *banks]
    check_gradients(program, wrt, inputs, banks, directions=2)
    g = runtime.vjp(program, wrt)  # in float32 (its w2 in float16) on cpu as on the reference
    cot = {n: rng.standard_normal((T, 64)).astype(np.float32) for n in g.cotangents.values()}
    from runtime.testing import assert_backends_agree

    f32 = {k: (v.astype(np.float32) if v.dtype.kind == "f" else v) for k, v in inputs.items()}
    b32 = {k: v.astype(np.float16 if k == "w2" else np.float32) for k, v in banks.items()}
    assert_backends_agree(g.program, {**f32, **cot}, b32, rtol=2e-3, atol=2e-3)


@pytest.mark.cuda
@pytest.mark.parametrize("name", ["contract-batched-renamed", "masked-softmax", "scalar-map@2-softplus",
                                  "segment-mean", "window"])
def test_cuda_gradients_equal_the_reference(name):
    from runtime.testing import assert_backends_agree

    program, wrt, inputs, banks = CASES[name]()
    g = runtime.vjp(program, wrt)
    out = runtime.execute(program, inputs=inputs, banks=banks, backend="reference")
    cot = {n: normal(*out[s].shape) for s, n in g.cotangents.items()}
    assert_backends_agree(g.program, {**inputs, **cot}, banks, backends=("cuda",))


def test_the_tiny_lm_differentiates_for_every_weight():
    """An arti-style tiny transformer LM (embedding lookup, a block, logits): every bank."""
    program = json.load(open("examples/tiny-lm.program.json"))
    rng = np.random.default_rng(12)
    B, S = 2, 4
    inputs = {"ids": rng.integers(0, 64, (B, S)), "causal_mask": np.tril(np.ones((S, S), bool)),
              "epsilon": np.float64(1e-5), "query_scale": np.float64(0.25)}
    banks = {b["name"]: rng.standard_normal(b["value_type"]["sizes"]) * 0.2
             for b in program["bindings"] if b["kind"] == "bank"}
    check_gradients(program, list(banks), inputs, banks, directions=2)
