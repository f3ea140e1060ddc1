"""Gradients over chunks and Dask: outputs that are sums over a free axis (bank gradients)
are added slice by slice (``run(chunks=...)``) and block by block (``runtime.dask.execute``),
and equal the whole run within tolerance; other outputs are sliced as before."""
from __future__ import annotations

import copy
import json
from pathlib import Path

import numpy as np
import pytest

import runtime
from runtime import FormulaError
from runtime.build import ProgramBuilder
from tests.test_chunked import seed, seed_values

ACC = {"accumulation_dtype": "float32"}
BACKENDS = ["reference", "cpu"]
SEED_GRADS = ("lora.A", "lora.B")


def with_outputs(doc: dict, outputs) -> dict:
    """``doc`` with these outputs (forward slots it keeps become outputs too)."""
    doc = copy.deepcopy(doc)
    doc["outputs"] = list(outputs)
    for s in doc["slots"]:
        if s["slot_id"] in outputs:
            s["role"] = "output"
        elif s["role"] == "output":
            s["role"] = "temporary"
    return doc


def limited(doc: dict, limit: int) -> dict:
    doc = copy.deepcopy(doc)
    doc["limits"]["max_working_bytes"] = limit
    return doc


def seed_grad(wrt=SEED_GRADS, forward: bool = False):
    """The seed's vjp (its cotangent input named in ``cotangent``); with ``forward`` the
    forward output %4 is an output too (sliced, while the bank gradients are summed)."""
    g = runtime.vjp(seed(), list(wrt))
    doc = with_outputs(g.program, ["%4", *g.program["outputs"]]) if forward else g.program
    return g, doc


def seed_grad_values(b: int, s: int, g, seed_: int = 0):
    inputs, banks = seed_values(b, s, seed_)
    rng = np.random.default_rng(seed_ + 100)
    inputs[g.cotangents["%4"]] = rng.standard_normal((b, s, 1024), dtype=np.float32)
    return inputs, banks


def block(d: int = 16, h: int = 2, dh: int = 8, f: int = 32):
    """A batched pre-norm transformer block: x [B, T, D], RMS norm with a gain, rotary
    causal attention over T (T is tied: the mask carries it twice), a silu MLP whose down
    projection runs in float16; and a loss, Σ y². Returns (program, y, loss)."""
    b = ProgramBuilder()
    x = b.input("x", {"B": "B", "T": "T", "D": d})
    pos = b.input("positions", {"T": "T"}, "int64")
    mask = b.input("causal_mask", {"T": "T", "S": "T"}, "boolean")
    gain = b.bank("norm_gain", {"D": d})
    wq, wk, wv = (b.bank(n, {"H": h, "Dh": dh, "D": d}) for n in ("wq", "wk", "wv"))
    wo = b.bank("wo", {"D": d, "H": h, "Dh": dh})
    w1 = b.bank("w1", {"F": f, "D": d})
    w2 = b.bank("w2", {"D": d, "F": f}, "float16")

    def contract(left, right, pairs, out):
        return b.op("contract", [left, right], {"reduce_axes": pairs, "output_axes": out, **ACC})

    ms = b.op("reduce@2", [b.op("scale", [x, x], {"factor_axes": ["B", "T", "D"], **ACC})],
              {"axis": "D", "mode": "mean", **ACC})
    inv = b.op("scalar-map@2", [ms], {"mode": "rsqrt", **ACC})
    hn = b.op("scale", [b.op("scale", [x, inv], {"factor_axes": ["B", "T"], **ACC}), gain],
              {"factor_axes": ["D"], **ACC})
    q, k, v = (contract(hn, w, [["D", "D"]], ["B", "T", "H", "Dh"]) for w in (wq, wk, wv))
    q = b.op("position-rotary", [q, pos], {"feature_axis": "Dh", "base": 10000.0})
    as_keys = {"output_axes": ["B", "S", "H", "Dh"], "output_sizes": ["B", "T", h, dh]}
    k, v = (b.op("reshape", [z], as_keys) for z in (k, v))
    p = b.op("masked-softmax", [contract(q, k, [["Dh", "Dh"]], ["B", "T", "H", "S"]), mask], {"axis": "S", **ACC})
    att = contract(p, v, [["S", "S"]], ["B", "T", "H", "Dh"])
    x2 = b.op("add", [x, contract(att, wo, [["H", "H"], ["Dh", "Dh"]], ["B", "T", "D"])], dict(ACC))
    hidden = b.op("scalar-map@2", [contract(x2, w1, [["D", "D"]], ["B", "T", "F"])], {"mode": "silu", **ACC})
    down = contract(b.op("cast", [hidden], {"dtype": "float16"}), w2, [["F", "F"]], ["B", "T", "D"])
    y = b.op("add", [x2, b.op("cast", [down], {"dtype": "float32"})], dict(ACC))
    loss = b.op("scale", [y, y], {"factor_axes": ["B", "T", "D"], **ACC})
    for axis in ("D", "T", "B"):
        loss = b.op("reduce@2", [loss], {"axis": axis, "mode": "sum", **ACC})
    return b.build(outputs=[loss]), y, loss


BLOCK_BANKS = ("norm_gain", "wq", "wk", "wv", "wo", "w1", "w2")


def block_grad():
    """The block's loss, y and the gradients of the loss by every bank and by x, in one program."""
    doc, y, loss = block()
    g = runtime.grad(doc, [*BLOCK_BANKS, "x"], loss)
    return g, with_outputs(g.program, [y, loss, *g.program["outputs"]]), y, loss


def block_values(b: int, t: int, seed_: int = 0):
    rng = np.random.default_rng(seed_)

    def normal(*shape):
        return (rng.standard_normal(shape) / np.sqrt(shape[-1])).astype(np.float32)

    banks = {"norm_gain": 1 + normal(16), "wq": normal(2, 8, 16), "wk": normal(2, 8, 16), "wv": normal(2, 8, 16),
             "wo": normal(16, 2, 8), "w1": normal(32, 16), "w2": normal(16, 32).astype(np.float16)}
    inputs = {"x": rng.standard_normal((b, t, 16)).astype(np.float32),
              "positions": np.arange(t, dtype=np.int64), "causal_mask": np.tril(np.ones((t, t), dtype=bool))}
    return inputs, banks


def check_results(got, want):
    """Every output as the whole run's, within tolerance (sums are added in another order)."""
    for slot, w in want.items():
        assert got[slot].dtype == w.dtype and got[slot].shape == w.shape, slot
        if w.dtype == np.float16:  # rounded to float16 once, from float32 partials
            scale = float(np.abs(w.astype(np.float64)).max())
            np.testing.assert_allclose(got[slot].astype(np.float64), w.astype(np.float64),
                                       rtol=2e-3, atol=2e-3 * scale, err_msg=slot)
        else:
            np.testing.assert_allclose(got[slot], w, rtol=1e-4, atol=1e-5 * float(np.abs(w).max()), err_msg=slot)


# --- the analysis ------------------------------------------------------------------------
def test_the_seed_gradient_is_free_along_B_and_S_with_sums():
    g, doc = seed_grad()
    free = runtime.compile(doc, backend="reference").free_axes
    grads = tuple(g.gradients[w] for w in SEED_GRADS)
    assert free.free == ("B", "S") and not free.tied
    assert set(free.sums["B"]) == set(grads) and set(free.sums["S"]) == set(grads)
    assert free.to_dict()["sums"] == {s: list(free.sums[s]) for s in ("B", "S")}
    assert "summed over B" in free.describe()
    assert runtime.compile(seed(), backend="reference").free_axes.sums == {}  # the forward sums nothing


def test_the_block_gradient_is_free_along_B():
    g, doc, y, loss = block_grad()
    free = runtime.compile(doc, backend="reference").free_axes
    assert free.free == ("B",) and "T" in free.tied
    # the loss and every bank gradient are sums over B; y and x's gradient carry B
    assert set(free.sums["B"]) == {loss, *(g.gradients[w] for w in BLOCK_BANKS)}


def _program(build):
    b = ProgramBuilder()
    x = b.input("x", {"B": "B", "D": 8})
    w = b.bank("w", {"D": 8, "E": 4})
    c = b.input("c", {"E": 4})
    out = build(b, x, w, c)
    return b.build(outputs=[out] if isinstance(out, str) else out)


def _sum_b(b, x, w):
    """x·w summed over B: [E]."""
    xw = b.op("contract", [x, w], {"reduce_axes": [["D", "D"]], "output_axes": ["B", "E"], **ACC})
    return b.op("reduce@2", [xw], {"axis": "B", "mode": "sum", **ACC})


LINEAR_CHAINS = {
    "reduce@2 sum": lambda b, x, w, c: _sum_b(b, x, w),
    "reduce@1 sum, then a layout": lambda b, x, w, c: b.op("reshape", [b.op("reduce", [
        b.op("contract", [x, w], {"reduce_axes": [["D", "D"]], "output_axes": ["B", "E"], **ACC})],
        {"axis": "B", "mode": "sum", **ACC})], {"output_axes": ["E", "one"], "output_sizes": [4, 1]}),
    "contract over B": lambda b, x, w, c: b.op("contract", [x, b.op("broadcast", [c], {
        "output_axes": ["B", "E"], "output_sizes": ["B", 4]})],
        {"reduce_axes": [["B", "B"]], "output_axes": ["D", "E"], **ACC}),
    "sum + sum, scaled by an input": lambda b, x, w, c: b.op("scale", [
        b.op("add", [_sum_b(b, x, w), _sum_b(b, x, w)], dict(ACC)), c], {"factor_axes": ["E"], **ACC}),
    "a sum times a bank": lambda b, x, w, c: b.op("contract", [w, _sum_b(b, x, w)], {
        "reduce_axes": [["E", "E"]], "output_axes": ["D"], **ACC}),
    "mean over E of a sum, cast": lambda b, x, w, c: b.op("cast", [b.op("reduce@2", [_sum_b(b, x, w)], {
        "axis": "E", "mode": "mean", **ACC})], {"dtype": "float64"}),
}


@pytest.mark.parametrize("name", list(LINEAR_CHAINS))
def test_sums_through_linear_atoms_are_sums(name):
    doc = _program(LINEAR_CHAINS[name])
    free = runtime.compile(doc, backend="reference").free_axes
    assert free.free == ("B",) and free.sums == {"B": tuple(doc["outputs"])}, free.describe()
    rng = np.random.default_rng(1)
    inputs = {"x": rng.standard_normal((11, 8)).astype(np.float32), "c": rng.standard_normal(4).astype(np.float32)}
    banks = {"w": rng.standard_normal((8, 4)).astype(np.float32)}
    for backend in BACKENDS:
        exe = runtime.compile(doc, backend=backend)
        want = exe.run(inputs=inputs, banks=banks)[doc["outputs"][0]].copy()
        for chunks in (1, 3, 4):  # 4: a shorter last slice (no overlap may add positions twice)
            got = exe.run(inputs=inputs, banks=banks, chunks=chunks)
            assert got.plan.chunking.sums and got.plan.chunking.count > 1
            np.testing.assert_allclose(got[doc["outputs"][0]], want, rtol=1e-5, atol=1e-5)


NOT_SUMS = {
    "a nonlinear atom of a sum": (lambda b, x, w, c: b.op("scalar-map@2", [_sum_b(b, x, w)], {"mode": "exp", **ACC}),
                                  "not linear in it"),
    "a sum plus a value no slice changes": (lambda b, x, w, c: b.op("add", [_sum_b(b, x, w), c], dict(ACC)),
                                            "each slice would add it again"),
    "a sum times a sum": (lambda b, x, w, c: b.op("scale", [_sum_b(b, x, w), _sum_b(b, x, w)],
                                                  {"factor_axes": ["E"], **ACC}), "both sums over 'B'"),
    "a mean over B": (lambda b, x, w, c: b.op("reduce@2", [b.op("contract", [x, w], {
        "reduce_axes": [["D", "D"]], "output_axes": ["B", "E"], **ACC})], {"axis": "B", "mode": "mean", **ACC}),
        "ties axis 'B'"),
    "an amax over B": (lambda b, x, w, c: b.op("reduce@2", [b.op("contract", [x, w], {
        "reduce_axes": [["D", "D"]], "output_axes": ["B", "E"], **ACC})], {"axis": "B", "mode": "amax", **ACC}),
        "ties axis 'B'"),
    "a sum read back along B": (lambda b, x, w, c: b.op("scale", [
        b.op("contract", [x, w], {"reduce_axes": [["D", "D"]], "output_axes": ["B", "E"], **ACC}),
        _sum_b(b, x, w)], {"factor_axes": ["E"], **ACC}), "together with values that carry 'B'"),
}


@pytest.mark.parametrize("name", list(NOT_SUMS))
def test_an_output_neither_free_nor_a_sum_ties_the_axis(name):
    build, why = NOT_SUMS[name]
    doc = _program(build)
    exe = runtime.compile(limited(doc, 2000), backend="cpu")
    assert exe.free_axes.free == () and why in exe.free_axes.tied["B"], exe.free_axes.tied
    inputs = {"x": np.ones((64, 8), np.float32), "c": np.ones(4, np.float32)}
    banks = {"w": np.ones((8, 4), np.float32)}
    with pytest.raises(FormulaError) as err:
        exe.run(inputs=inputs, banks=banks, chunks="auto")
    assert err.value.code == "limit_exceeded" and "no free axis" in err.value.message
    with pytest.raises(FormulaError) as err:
        exe.run(inputs=inputs, banks=banks, chunks=4)
    assert err.value.code == "schema" and err.value.path == "$.chunks"


# --- chunked runs ------------------------------------------------------------------------
@pytest.mark.parametrize("backend", BACKENDS)
def test_auto_chunks_the_seed_gradient_and_adds_the_bank_gradients(backend):
    g, doc = seed_grad()
    inputs, banks = seed_grad_values(2, 150, g)
    want = {k: v.copy() for k, v in runtime.compile(doc, backend=backend).run(inputs=inputs, banks=banks).items()}
    exe = runtime.compile(limited(doc, 2 << 20), backend=backend)
    with pytest.raises(FormulaError) as err:
        exe.run(inputs=inputs, banks=banks)  # without chunks: refused, as before
    assert err.value.code == "limit_exceeded"
    got = exe.run(inputs=inputs, banks=banks, chunks="auto")
    c = got.plan.chunking
    assert c.count > 1 and c.slice_working_bytes <= 2 << 20 < c.whole_working_bytes
    assert dict(c.sums) == {g.gradients[w]: "float32" for w in SEED_GRADS}
    assert sum(n for _, n in c.slices()) == c.extent  # no overlap: every position added once
    check_results(got, want)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("chunks", [1, 2, 5, 7, 36])
def test_forward_and_gradient_outputs_sliced_and_summed(backend, chunks):
    """%4 and x's gradient carry B and S (written slice by slice); the bank gradients are
    sums (added); both as the whole run, whatever the slices (a shorter last one included)."""
    g, doc = seed_grad(("lora.A", "x", "lora.B"), forward=True)
    inputs, banks = seed_grad_values(3, 37, g, 2)
    want = {k: v.copy() for k, v in runtime.compile(doc, backend=backend).run(inputs=inputs, banks=banks).items()}
    got = runtime.compile(doc, backend=backend).run(inputs=inputs, banks=banks, chunks=chunks)
    c = got.plan.chunking
    assert c.symbol == ("B" if chunks < 3 else "S") and c.count > 1
    assert {slot for slot, _ in c.sums} == {g.gradients["lora.A"], g.gradients["lora.B"]}
    check_results(got, want)
    assert np.array_equal(got["%4"], want["%4"])  # the forward output: bit for bit, as before
    if c.symbol == "B" or backend == "reference":  # (cpu: x's gradient over S slices differs in its last bits)
        assert np.array_equal(got[g.gradients["x"]], want[g.gradients["x"]])


def test_sum_outputs_go_into_out_arrays_and_half_gradients_round_once():
    g, doc, y, loss = block_grad()
    inputs, banks = block_values(5, 6)
    exe = runtime.compile(doc, backend="cpu")
    want = {k: v.copy() for k, v in exe.run(inputs=inputs, banks=banks).items()}
    w2 = g.gradients["w2"]
    assert want[w2].dtype == np.float16
    wq = g.gradients["wq"]  # float32: the out array is its own accumulator
    out = {w2: np.full_like(want[w2], 7), loss: np.zeros((), np.float32), wq: np.full_like(want[wq], 7)}
    got = exe.run(inputs=inputs, banks=banks, chunks=2, out=out)
    assert all(got[slot] is a for slot, a in out.items())
    assert dict(got.plan.chunking.sums)[w2] == "float32"
    check_results(got, want)


@pytest.mark.parametrize("backend", BACKENDS)
def test_the_block_gradient_chunked_equals_the_whole_run(backend):
    g, doc, y, loss = block_grad()
    inputs, banks = block_values(7, 6, 3)
    whole = runtime.compile(doc, backend=backend)
    want = {k: v.copy() for k, v in whole.run(inputs=inputs, banks=banks).items()}
    limit = whole.plan({"B": 2, "T": 6}).working_bytes
    exe = runtime.compile(limited(doc, limit), backend=backend)
    with pytest.raises(FormulaError) as err:
        exe.run(inputs=inputs, banks=banks)
    assert err.value.code == "limit_exceeded"
    got = exe.run(inputs=inputs, banks=banks, chunks="auto")
    c = got.plan.chunking
    assert c.symbol == "B" and c.size == 2 and c.count == 4 and c.slices()[-1] == (6, 1)
    assert {slot for slot, _ in c.sums} == {loss, *(g.gradients[w] for w in BLOCK_BANKS)}
    check_results(got, want)
    assert np.array_equal(got[y], want[y])


def test_plan_and_cli_show_the_accumulation(tmp_path, capsys):
    from runtime.cli import main

    g, doc = seed_grad()
    plan = runtime.compile(limited(doc, 1 << 20), backend="cpu").plan({"B": 1, "S": 200}, chunks="auto")
    assert plan.chunking.symbol == "S" and plan.fits
    assert plan.to_dict()["chunking"]["sums"] == {g.gradients[w]: "float32" for w in SEED_GRADS}
    assert plan.to_dict()["free_axes"]["sums"]["S"]
    path = tmp_path / "grad.json"
    path.write_text(json.dumps(limited(doc, 1 << 20)))
    args = [str(path), "--dim", "B=1", "--dim", "S=200"]
    assert main(["plan", *args, "--chunks", "auto"]) == 0
    text = capsys.readouterr().out
    assert f"{g.gradients['lora.A']} is a sum over S: each slice's value is added into it, in float32" in text
    assert "summed over S" in text
    assert main(["plan", *args, "--chunks", "auto", "--json"]) == 0
    out = capsys.readouterr().out
    report = json.loads(out[out.index("{"):])
    assert set(report["plan"]["chunking"]["sums"]) == {g.gradients[w] for w in SEED_GRADS}
    assert main(["run", *args, "--random"]) != 0
    capsys.readouterr()
    assert main(["run", *args, "--random", "--chunks", "auto"]) == 0


# --- Dask ----------------------------------------------------------------------------------
def test_dask_sums_bank_gradients_across_blocks_with_a_tree():
    da = pytest.importorskip("dask.array")
    dask = pytest.importorskip("dask")
    rdask = pytest.importorskip("runtime.dask")
    g, doc = seed_grad(("lora.A", "x", "lora.B"), forward=True)
    inputs, banks = seed_grad_values(4, 36, g, 4)
    want = {k: v.copy() for k, v in runtime.compile(doc, backend="cpu").run(inputs=inputs, banks=banks).items()}
    cot = g.cotangents["%4"]
    chunked = {**inputs, **{n: da.from_array(inputs[n], chunks=(1, 4, 1024)) for n in ("x", "base", cot)}}
    out = rdask.execute(doc, inputs=chunked, banks=banks)  # 4 x 9 = 36 blocks
    grad_a = g.gradients["lora.A"]
    assert out[grad_a].chunks == ((32,), (1024,)) and out["%4"].chunks[:2] == ((1,) * 4, (4,) * 9)
    tree = [k for k in out[grad_a].dask if isinstance(k, tuple) and k[0].startswith("formula-sum-")]
    assert len(tree) == 36 // rdask.SPLIT_EVERY + 1  # 5 tasks of at most 8 blocks, then the root
    with dask.config.set(scheduler="threads"):
        got = dask.compute(out)[0]
    check_results(got, want)
    assert np.array_equal(got["%4"], want["%4"])  # concatenated blocks, bit for bit as before


@pytest.mark.parametrize("backend", BACKENDS)
def test_dask_block_gradient_equals_the_whole_run(backend):
    da = pytest.importorskip("dask.array")
    dask = pytest.importorskip("dask")
    rdask = pytest.importorskip("runtime.dask")
    g, doc, y, loss = block_grad()
    inputs, banks = block_values(5, 6, 5)
    want = {k: v.copy() for k, v in runtime.compile(doc, backend=backend).run(inputs=inputs, banks=banks).items()}
    chunked = {**inputs, "x": da.from_array(inputs["x"], chunks=(2, 6, 16))}
    out = rdask.execute(doc, inputs=chunked, banks=banks, backend=backend)
    assert out[y].chunks[0] == (2, 2, 1) and out[loss].shape == ()
    with dask.config.set(scheduler="threads"):
        got = dask.compute(out)[0]
    check_results(got, want)
    # T is tied (the causal mask): chunks along it are refused, as before
    with pytest.raises(FormulaError) as err:
        rdask.execute(doc, inputs={**inputs, "x": da.from_array(inputs["x"], chunks=(5, 3, 16))}, banks=banks)
    assert err.value.code == "binding_shape" and err.value.path == "$.inputs.x"


def test_dask_refuses_chunks_along_an_axis_an_output_neither_carries_nor_sums():
    da = pytest.importorskip("dask.array")
    rdask = pytest.importorskip("runtime.dask")
    doc = _program(NOT_SUMS["a sum plus a value no slice changes"][0])
    with pytest.raises(FormulaError) as err:
        rdask.execute(doc, inputs={"x": da.ones((8, 8), chunks=(4, 8), dtype=np.float32),
                                   "c": np.ones(4, np.float32)}, banks={"w": np.ones((8, 4), np.float32)})
    assert err.value.code == "binding_shape" and "each slice would add it again" in err.value.message


def _two_axes():
    """[S, D]: a sum over B that carries S; [D]: a sum over B and over S."""
    b = ProgramBuilder()
    x = b.input("x", {"B": "B", "S": "S", "D": 8})
    per_s = b.op("reduce@2", [b.op("scale", [x, x], {"factor_axes": ["B", "S", "D"], **ACC})],
                 {"axis": "B", "mode": "sum", **ACC})
    total = b.op("reduce@2", [per_s], {"axis": "S", "mode": "sum", **ACC})
    return b.build(outputs=[per_s, total]), per_s, total


def test_an_output_summed_over_one_axis_and_carrying_another():
    doc, per_s, total = _two_axes()
    free = runtime.compile(doc, backend="reference").free_axes
    assert free.sums == {"B": (per_s, total), "S": (total,)}
    x = np.random.default_rng(6).standard_normal((5, 9, 8)).astype(np.float32)
    for backend in BACKENDS:
        exe = runtime.compile(doc, backend=backend)
        want = {k: v.copy() for k, v in exe.run(inputs={"x": x}).items()}
        for chunks in (2, 4):  # along B (both summed), then along S (per_s sliced, total summed)
            got = exe.run(inputs={"x": x}, chunks=chunks)
            assert {s for s, _ in got.plan.chunking.sums} == set(free.sums[got.plan.chunking.symbol])
            check_results(got, want)


def test_dask_sums_along_one_chunked_axis_and_concatenates_along_another():
    da = pytest.importorskip("dask.array")
    dask = pytest.importorskip("dask")
    rdask = pytest.importorskip("runtime.dask")
    doc, per_s, total = _two_axes()
    x = np.random.default_rng(8).standard_normal((6, 9, 8)).astype(np.float32)
    want = {k: v.copy() for k, v in runtime.compile(doc, backend="cpu").run(inputs={"x": x}).items()}
    out = rdask.execute(doc, inputs={"x": da.from_array(x, chunks=(2, 4, 8))})
    assert out[per_s].chunks == ((4, 4, 1), (8,)) and out[total].chunks == ((8,),)
    with dask.config.set(scheduler="threads"):
        got = dask.compute(out)[0]
    check_results(got, want)


@pytest.mark.cuda
def test_cuda_sums_with_host_and_device_values():
    from numba import cuda

    doc, per_s, total = _two_axes()
    x = np.random.default_rng(9).standard_normal((3, 5, 8)).astype(np.float32)
    want = {k: v.copy() for k, v in runtime.compile(doc, backend="reference").run(inputs={"x": x}).items()}
    exe = runtime.compile(doc, backend="cuda")
    for chunks in (1, 2):  # along B: both summed; 2: a shorter last slice
        got = exe.run(inputs={"x": x}, chunks=chunks)
        assert got.plan.chunking.symbol == "B" and isinstance(got[total], np.ndarray)
        check_results(got, want)
    got = exe.run(inputs={"x": cuda.to_device(x)}, chunks=2)  # device results
    check_results({k: got[k].copy_to_host() for k in want}, want)


TINY_LM = json.loads((Path(__file__).resolve().parents[1] / "examples" / "tiny-lm.program.json").read_text())


def tiny_lm_grad():
    """The tiny LM's gradient by every bank: the embedding's is a scatter@2 add into a zero
    fill over rows that merge B and S (reshape), a sum over B like the others."""
    banks = [b["name"] for b in TINY_LM["bindings"] if b["kind"] == "bank"]
    return runtime.vjp(TINY_LM, banks), banks


def tiny_lm_values(g, b: int, s: int, seed_: int = 0):
    rng = np.random.default_rng(seed_)
    banks = {}
    for binding in TINY_LM["bindings"]:
        t = binding["value_type"]
        if binding["kind"] == "bank":
            shape = tuple(t["sizes"])
            scale = 1.0 if len(shape) == 1 else 1 / np.sqrt(shape[-1])
            banks[binding["name"]] = (1.0 * (len(shape) == 1) + rng.standard_normal(shape) * scale).astype(np.float32)
    cot = next(iter(g.cotangents.values()))
    inputs = {"ids": rng.integers(0, 64, (b, s)), "causal_mask": np.tril(np.ones((s, s), dtype=bool)),
              "epsilon": np.float32(1e-6), "query_scale": np.float32(0.25),
              cot: rng.standard_normal((b, s, 64)).astype(np.float32)}
    return inputs, banks


def test_embedding_gradients_through_merged_rows_are_sums():
    g, banks = tiny_lm_grad()
    free = runtime.compile(g.program, backend="reference").free_axes
    assert free.free == ("B",) and set(free.sums["B"]) == {g.gradients[n] for n in banks}
    assert "'B' merged with other axes" in free.tied["N"]
    # an output carrying the merged symbol cannot be written along B: B is tied then
    rows = next(i["output_slot"] for i in g.program["instructions"] if i["input_slots"] == ["ids"])
    tied = runtime.compile(with_outputs(g.program, [*g.program["outputs"], rows]), backend="reference").free_axes
    assert "B" in tied.tied and "merged with other axes" in tied.tied["B"]


@pytest.mark.slow  # (CI runs the slow set after the suite: README)
@pytest.mark.parametrize("backend", BACKENDS)
def test_the_tiny_lm_gradient_chunked_and_on_dask_equals_the_whole_run(backend):
    da = pytest.importorskip("dask.array")
    dask = pytest.importorskip("dask")
    rdask = pytest.importorskip("runtime.dask")
    g, banks_names = tiny_lm_grad()
    inputs, banks = tiny_lm_values(g, 5, 8)
    exe = runtime.compile(g.program, backend=backend)
    want = {k: v.copy() for k, v in exe.run(inputs=inputs, banks=banks).items()}
    assert all(np.all(np.isfinite(w)) for w in want.values())
    for chunks in (1, 2):
        got = exe.run(inputs=inputs, banks=banks, chunks=chunks)
        assert got.plan.chunking.symbol == "B" and len(got.plan.chunking.sums) == len(banks_names)
        check_results(got, want)
    cot = next(iter(g.cotangents.values()))
    chunked = {**inputs, "ids": da.from_array(inputs["ids"], chunks=(2, 8)),
               cot: da.from_array(inputs[cot], chunks=(2, 8, 64))}
    out = rdask.execute(g.program, inputs=chunked, banks=banks, backend=backend)
    with dask.config.set(scheduler="threads"):
        check_results(dask.compute(out)[0], want)


def _scatter_program(zero_base: bool):
    """x [B, D] rows scatter-added at ids [B] into a [V, D] base: a fill of 0 (a sum over B,
    as every zero is) or the bank itself (added again by every slice: B is tied)."""
    b = ProgramBuilder()
    x = b.input("x", {"B": "B", "D": 4})
    ids = b.input("ids", {"B": "B"}, "int64")
    w = b.bank("w", {"V": 6, "D": 4})
    base = b.op("formula-runtime/formula-atom-fill@1", [w], {"axes": ["V", "D"], "dtype": "float32", "value": 0}) \
        if zero_base else w
    out = b.op("scatter@2", [base, ids, x], {"axis": "V", "index_axis": "B", "mode": "add", **ACC})
    return b.build(outputs=[out]), out


def test_a_scatter_add_into_zeros_is_a_sum_and_into_a_bank_is_not():
    doc, out = _scatter_program(True)
    assert runtime.compile(doc, backend="reference").free_axes.sums == {"B": (out,)}
    rng = np.random.default_rng(3)
    inputs = {"x": rng.standard_normal((13, 4)).astype(np.float32), "ids": rng.integers(0, 6, 13)}
    banks = {"w": rng.standard_normal((6, 4)).astype(np.float32)}
    for backend in BACKENDS:
        exe = runtime.compile(doc, backend=backend)
        want = exe.run(inputs=inputs, banks=banks)[out].copy()
        for chunks in (1, 5):
            got = exe.run(inputs=inputs, banks=banks, chunks=chunks)[out]
            np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)
    doc, out = _scatter_program(False)
    free = runtime.compile(doc, backend="reference").free_axes
    assert free.free == () and "each slice would add it again" in free.tied["B"]


def test_forward_instructions_a_gradient_program_never_runs_tie_nothing():
    """A forward output the gradient does not differentiate (a mean over S) stays in the
    gradient program but is never computed: it ties no axis there."""
    b = ProgramBuilder()
    x = b.input("x", {"B": "B", "S": "S", "D": 8})
    w = b.bank("w", {"E": 4, "D": 8})
    y = b.op("contract", [x, w], {"reduce_axes": [["D", "D"]], "output_axes": ["B", "S", "E"], **ACC})
    stats = b.op("reduce@2", [y], {"axis": "S", "mode": "mean", **ACC})
    doc = b.build(outputs=[y, stats])
    assert runtime.compile(doc, backend="reference").free_axes.free == ("B",)
    g = runtime.vjp(doc, ["w"], outputs=[y])
    free = runtime.compile(g.program, backend="reference").free_axes
    assert free.free == ("B", "S") and free.sums == {"B": (g.gradients["w"],), "S": (g.gradients["w"],)}
    rng = np.random.default_rng(4)
    inputs = {"x": rng.standard_normal((2, 9, 8)).astype(np.float32),
              g.cotangents[y]: rng.standard_normal((2, 9, 4)).astype(np.float32)}
    banks = {"w": rng.standard_normal((4, 8)).astype(np.float32)}
    exe = runtime.compile(g.program, backend="cpu")
    want = {k: v.copy() for k, v in exe.run(inputs=inputs, banks=banks).items()}
    got = exe.run(inputs=inputs, banks=banks, chunks=4)
    assert got.plan.chunking.symbol == "S"
    check_results(got, want)
