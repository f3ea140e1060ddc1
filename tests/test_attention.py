"""Fused attention on cpu (runtime.plan.attention, runtime.kernels.attention): the rewrite
applies exactly when it is safe, and the fused kernel equals the unfused reference across
shapes, dtypes, masks, scale chains and axis orders."""
from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

import runtime
from runtime.build import ProgramBuilder
from runtime.kernels import attention as ak
from runtime.execution.compiled import DRIVER_AFTER_RUNS
from runtime.kernels import compilelog
from runtime.plan import attention
from runtime.plan.grouping import make_groups
from runtime.plan.resolve import resolve_nodes
from runtime.testing import TOLERANCES

ACC = {"accumulation_dtype": "float32"}


def program(dims, dtype="float32", q_order="BSHD", kv_order="BKHD", scores_order="BHSK",
            out_order="BSHD", mask_axes="SK", chain=(), outputs=("o",), extra_reader=None):
    """q·kᵀ (summing Dh) → ``chain`` → masked-softmax over K → ·v (summing K). Axis letters:
    B, H, S (query), K (key), D (head dim Dh); a lower-case mask axis has extent 1. ``chain``:
    "scale" (times a scalar input) or a scalar-map mode. ``outputs``: "o" and any of "s", "p";
    ``extra_reader``: one more instruction reading that intermediate."""
    full = {"B": "B", "H": "H", "S": "S", "K": "K", "D": "Dh"}
    ext = {"B": dims["B"], "H": dims["H"], "S": dims["S"], "K": dims["K"], "D": dims["Dh"]}

    def axes(order, sizes=None):
        return {full[a]: (sizes or ext)[a] for a in order}

    b = ProgramBuilder(dtype)
    q = b.input("q", axes(q_order))
    k = b.input("k", axes(kv_order))
    v = b.input("v", axes(kv_order))
    mask_sizes = {**ext, **{a: 1 for a in mask_axes if a.islower()}}
    mask = b.input("mask", {full[a.upper()]: mask_sizes[a] for a in mask_axes}, "boolean")
    s = b.op("contract", [q, k], {"reduce_axes": [["Dh", "Dh"]],
                                  "output_axes": [full[a] for a in scores_order], **ACC})
    cur = s
    for i, step in enumerate(chain):
        if step == "scale":
            cur = b.op("scale", [cur, b.input(f"c{i}", {})], {"factor_axes": [], **ACC})
        else:
            cur = b.op("scalar-map", [cur], {"mode": step})
    p = b.op("masked-softmax", [cur, mask], {"axis": "K", **ACC})
    o = b.op("contract", [p, v], {"reduce_axes": [["K", "K"]], "output_axes": [full[a] for a in out_order], **ACC})
    named = {"o": o, "s": s, "p": p}
    outs = [named[x] for x in outputs]
    if extra_reader is not None:
        outs.append(b.op("scalar-map", [named[extra_reader]], {"mode": "silu"}))
    return b.build(outputs=outs)


def values(dims, dtype="float32", q_order="BSHD", kv_order="BKHD", mask_axes="SK", mask="causal",
           chain=(), seed=0):
    rng = np.random.default_rng(seed)
    ext = {"B": dims["B"], "H": dims["H"], "S": dims["S"], "K": dims["K"], "D": dims["Dh"]}
    q = rng.standard_normal([ext[a] for a in q_order]).astype(dtype)
    k = rng.standard_normal([ext[a] for a in kv_order]).astype(dtype)
    v = rng.standard_normal([ext[a] for a in kv_order]).astype(dtype)
    shape = [1 if a.islower() else ext[a] for a in mask_axes]
    index = {a.upper(): np.arange(n).reshape([n if j == i else 1 for j in range(len(shape))])
             for i, (a, n) in enumerate(zip(mask_axes, shape))}
    if mask == "causal":  # the last query sees every key
        m = np.broadcast_to(index.get("K", 0) <= index.get("S", 0) + (dims["K"] - dims["S"]), shape).copy()
    else:
        m = rng.random(shape) < 0.6
        if mask == "holes" and m.size:
            m.reshape(-1, m.shape[-1])[::3] = False  # fully masked rows
    inputs = {"q": q, "k": k, "v": v, "mask": m}
    for i, step in enumerate(chain):
        if step == "scale":
            inputs[f"c{i}"] = np.asarray(0.25 if i == 0 else 4.0, dtype=dtype)
    return inputs


def kinds(plan):
    return [g.kind for g in plan.groups]


def check(prog, inputs, dims=None, fused=True):
    exe = runtime.compile(prog, "cpu", tiered=False)
    plan = exe.plan(dims or {})
    assert ("fused-attention" in kinds(plan)) == fused, plan.describe()
    want = runtime.compile(prog, "reference").run(inputs)
    got = exe.run(inputs)
    for slot, w in want.items():
        rtol, atol = TOLERANCES[w.dtype.name]
        assert got[slot].dtype == w.dtype and got[slot].shape == w.shape
        np.testing.assert_allclose(got[slot], w, rtol=rtol, atol=atol * 10, err_msg=slot)
    return got


DIMS = {"B": 2, "H": 3, "S": 9, "K": 9, "Dh": 5}


def test_the_bench_layout_fuses_and_equals_the_reference():
    got = check(program(DIMS), values(DIMS))
    assert len(got) == 1


@pytest.mark.parametrize("mask", ["causal", "random", "holes"])
@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_masks_and_dtypes(mask, dtype):
    dims = {"B": 2, "H": 2, "S": 7, "K": 13, "Dh": 11}
    check(program(dims, dtype), values(dims, dtype, mask=mask, seed=3))


def test_a_fully_masked_row_gives_zeros_and_nothing_visible_gives_all_zeros():
    dims = {"B": 1, "H": 2, "S": 5, "K": 6, "Dh": 3}
    inputs = values(dims, mask="random", seed=1)
    inputs["mask"][2] = False
    got = check(program(dims), inputs)
    out = next(iter(got.values()))
    assert not out[:, 2].any() and out[:, 1:2].any()
    inputs["mask"][:] = False
    got = check(program(dims), inputs)
    assert not next(iter(got.values())).any()


@pytest.mark.parametrize("mask_axes", ["BSK", "BHSK", "HSK", "SK", "bSK", "ShK", "Sk", "KS"])
def test_masks_broadcast_or_carrying_their_own_batch_axes(mask_axes):
    dims = {"B": 2, "H": 3, "S": 6, "K": 6, "Dh": 4}
    check(program(dims, mask_axes=mask_axes), values(dims, mask_axes=mask_axes, mask="holes", seed=5))
    if "S" in mask_axes and "K" in mask_axes:
        check(program(dims, mask_axes=mask_axes), values(dims, mask_axes=mask_axes, mask="causal"))


@pytest.mark.parametrize("chain", [("scale",), ("scale", "tanh", "scale")])
def test_a_scalar_chain_on_the_scores_is_fused(chain):
    dims = {"B": 1, "H": 2, "S": 10, "K": 10, "Dh": 9}
    prog = program(dims, chain=chain)
    exe = runtime.compile(prog, "cpu", tiered=False)
    group = [g for g in exe.plan().groups if g.kind == "fused-attention"][0]
    names = ["scalar-map" if c == "tanh" else c for c in chain]
    assert [n.atom.name for n in group.nodes] == ["contract", *names, "masked-softmax", "contract"]
    check(prog, values(dims, chain=chain, mask="holes"))


@pytest.mark.parametrize("orders", [
    ("BSHD", "BKHD", "BHSK", "BSHD"),  # the bench's strided heads
    ("BHSD", "BHKD", "BHSK", "BHSD"),  # packed heads
    ("DSBH", "HDKB", "KSHB", "HDSB"),  # every axis elsewhere
    ("SBHD", "KBHD", "SKBH", "DHBS"),
])
def test_other_axis_orders(orders):
    q_order, kv_order, s_order, o_order = orders
    dims = {"B": 2, "H": 2, "S": 5, "K": 7, "Dh": 6}
    check(program(dims, q_order=q_order, kv_order=kv_order, scores_order=s_order, out_order=o_order),
          values(dims, q_order=q_order, kv_order=kv_order, mask="holes", seed=7))


def test_transposed_caller_arrays_are_read_in_place_and_not_modified():
    dims = {"B": 2, "H": 2, "S": 6, "K": 6, "Dh": 8}
    q = values(dims, q_order="BHSD")["q"].transpose(0, 2, 1, 3)  # a BSHD view of BHSD memory
    inputs = {**values(dims), "q": q}
    before = {n: np.array(a, copy=True) for n, a in inputs.items()}
    check(program(dims), inputs)
    for n, a in inputs.items():
        np.testing.assert_array_equal(a, before[n])


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(b=st.integers(1, 3), h=st.integers(1, 3), s=st.integers(1, 19), extra=st.integers(-3, 12),
       dh=st.integers(1, 17), dtype=st.sampled_from(["float32", "float64"]),
       mask=st.sampled_from(["causal", "random", "holes"]), chain=st.sampled_from([(), ("scale",)]),
       mask_axes=st.sampled_from(["SK", "BSK", "BHSK", "hSK"]), seed=st.integers(0, 1000))
def test_property_equal_to_the_reference(b, h, s, extra, dh, dtype, mask, chain, mask_axes, seed):
    dims = {"B": b, "H": h, "S": s, "K": max(1, s + extra), "Dh": dh}
    check(program(dims, dtype, mask_axes=mask_axes, chain=chain),
          values(dims, dtype, mask_axes=mask_axes, mask=mask, chain=chain, seed=seed))


def test_the_parallel_kernel_equals_the_serial_one(monkeypatch):
    dims = {"B": 2, "H": 3, "S": 70, "K": 70, "Dh": 16}
    prog, inputs = program(dims), values(dims, mask="holes", seed=2)
    serial = check(prog, inputs)
    monkeypatch.setattr(ak, "PARALLEL_MIN_MACS", 0)
    parallel = check(prog, inputs)
    for slot in serial:
        np.testing.assert_array_equal(parallel[slot], serial[slot])  # each row computed alike


# --- when the rewrite applies ---------------------------------------------------------------

def test_no_rewrite_when_an_intermediate_is_an_output_or_read_twice():
    dims = {"B": 1, "H": 2, "S": 4, "K": 4, "Dh": 3}
    inputs = values(dims, chain=("scale",))
    check(program(dims, outputs=("o", "s")), values(dims), fused=False)
    check(program(dims, outputs=("o", "p")), values(dims), fused=False)
    check(program(dims, extra_reader="p"), values(dims), fused=False)
    check(program(dims, extra_reader="s"), values(dims), fused=False)
    check(program(dims, chain=("scale",)), inputs, fused=True)


def _nodes(prog):
    exe = runtime.compile(prog, "cpu", tiered=False)
    binding_types = exe._builder.binding_types({}, {})
    return resolve_nodes(exe.program, exe.specs, binding_types, {})[0], exe.program.outputs


def test_no_rewrite_on_reference_or_cuda_or_without_fusion():
    nodes, outputs = _nodes(program(DIMS))
    assert attention.find(nodes, outputs, "cpu")
    assert attention.find(nodes, outputs, "reference") == []
    assert attention.find(nodes, outputs, "cuda") == []
    assert "fused-attention" not in [g.kind for g in make_groups(nodes, outputs, "cpu", fuse=False)]
    assert "fused-attention" not in [g.kind for g in make_groups(nodes, outputs, "cpu", True, rewrite=False)]
    plan = runtime.compile(program(DIMS), "reference").plan()
    assert "fused-attention" not in kinds(plan)


def test_no_rewrite_when_switched_off(monkeypatch):
    monkeypatch.setenv("FORMULA_FUSED_ATTENTION", "0")
    check(program(DIMS), values(DIMS), fused=False)


def test_no_rewrite_when_outputs_are_checked_so_the_error_names_the_instruction():
    dims = {"B": 1, "H": 1, "S": 3, "K": 3, "Dh": 2}
    prog = program(dims, chain=("scale",))
    exe = runtime.compile(prog, "cpu", tiered=False)
    inputs = values(dims, chain=("scale",))
    traced = exe.run(inputs, trace=True, check_outputs=True)
    assert [r["instructions"] for r in traced.trace] == [["i0", "i1"], ["i2"], ["i3"]]
    inputs["q"][:], inputs["k"][:] = 100, 100
    inputs["c0"] = np.asarray(3e38, np.float32)  # the scaled scores overflow
    with pytest.raises(runtime.FormulaError) as err:
        exe.run(inputs, check_outputs=True)
    assert err.value.code == "nonfinite" and "i1" in str(err.value)


def test_no_rewrite_for_other_shapes_of_the_pattern():
    b = ProgramBuilder()
    q = b.input("q", {"S": 4, "Dh": 3})
    k = b.input("k", {"K": 4, "Dh": 3, "E": 2})  # k keeps a second axis of its own
    v = b.input("v", {"K": 4, "Dv": 3})
    mask = b.input("mask", {"S": 4, "K": 4}, "boolean")
    s = b.op("contract", [q, k], {"reduce_axes": [["Dh", "Dh"]], "output_axes": ["S", "K", "E"], **ACC})
    p = b.op("masked-softmax", [s, mask], {"axis": "K", **ACC})
    o = b.op("contract", [p, v], {"reduce_axes": [["K", "K"]], "output_axes": ["S", "E", "Dv"], **ACC})
    prog = b.build([o])
    rng = np.random.default_rng(0)
    inputs = {"q": rng.standard_normal((4, 3)).astype(np.float32),
              "k": rng.standard_normal((4, 3, 2)).astype(np.float32),
              "v": rng.standard_normal((4, 3)).astype(np.float32), "mask": np.tril(np.ones((4, 4), bool))}
    check(prog, inputs, fused=False)
    # softmax over the query axis: not attention
    b = ProgramBuilder()
    q, k, v = (b.input(n, {"S" if n == "q" else "K": 4, "Dh": 3}) for n in "qkv")
    mask = b.input("mask", {"S": 4, "K": 4}, "boolean")
    s = b.op("contract", [q, k], {"reduce_axes": [["Dh", "Dh"]], "output_axes": ["S", "K"], **ACC})
    p = b.op("masked-softmax", [s, mask], {"axis": "S", **ACC})
    o = b.op("contract", [p, v], {"reduce_axes": [["K", "K"]], "output_axes": ["S", "Dh"], **ACC})
    assert "fused-attention" not in kinds(runtime.compile(b.build([o]), "cpu", tiered=False).plan())


def test_plan_printout_and_trace_name_the_fused_group_and_its_instructions():
    prog = program(DIMS, chain=("scale",))
    exe = runtime.compile(prog, "cpu", tiered=False)
    plan = exe.plan()
    text = plan.describe()
    assert "fused-attention   contract+scale+masked-softmax+contract [i0, i1, i2, i3]" in text
    assert "(fused away: %0, %1, %2)" in text
    entry = plan.to_dict()["schedule"][0]
    assert entry["kernel"] == "fused-attention" and entry["instructions"] == ["i0", "i1", "i2", "i3"]
    assert plan.scratch_bytes > 0 and "%0" not in {b.slot for b in plan.buffers.values() if b.in_arena}
    traced = exe.run(values(DIMS, chain=("scale",)), trace=True)
    assert [r["instructions"] for r in traced.trace] == [["i0", "i1", "i2", "i3"]]


# --- extents, chunks --------------------------------------------------------------------------

SYMBOLIC = {"B": 2, "H": 2, "S": "S", "K": "T", "Dh": 8}


def _sized(s: int, t: int) -> dict:
    return {**SYMBOLIC, "S": s, "K": t}


def test_new_sequence_lengths_compile_nothing_after_warm_up():
    prog = program(SYMBOLIC)
    exe = runtime.compile(prog, "cpu", tiered=False)
    for s in (16, 1):
        for _ in range(2):
            exe.run(values(_sized(s, s)))
    exe.warm()
    before = compilelog.specialisations()
    ref = runtime.compile(prog, "reference")
    for s, t in ((5, 5), (33, 40), (2, 1), (100, 100)):
        inputs = values(_sized(s, t), seed=s)
        np.testing.assert_allclose(exe.run(inputs)["%2"], ref.run(inputs)["%2"], rtol=2e-4, atol=2e-4)
    assert compilelog.specialisations() == before


@pytest.mark.parametrize("chunks", [1, 3, 7])
def test_chunked_runs_equal_the_whole_run(chunks):
    exe = runtime.compile(program(SYMBOLIC), "cpu", tiered=False)
    inputs = values(_sized(40, 45), mask="holes", seed=4)
    whole = exe.run(inputs)["%2"]
    plan = exe.plan({"S": 40, "T": 45}, chunks=chunks)
    assert plan.chunking is not None and "fused-attention" in kinds(plan)
    np.testing.assert_array_equal(exe.run(inputs, chunks=chunks)["%2"], whole)


@pytest.mark.parametrize("name", ["q", "k", "v"])
@pytest.mark.parametrize("bad", [np.nan, np.inf])
def test_the_kernel_counts_nonfinite_inputs_in_its_own_pass(name, bad):
    exe = runtime.compile(program(DIMS), "cpu", tiered=False)
    inputs = values(DIMS)
    assert exe.run(inputs, trace=True).trace[0]["checks_finite"] == ["q", "k", "v"]
    inputs[name][1, -1, 0, -1] = bad
    with pytest.raises(runtime.FormulaError) as err:
        exe.run(inputs)
    assert err.value.code == "nonfinite" and name in str(err.value)


def test_importing_the_planner_imports_no_numba():
    """NUMBA_ENABLE_CUDASIM and Numba's other import-time settings stay the caller's to set
    after ``import runtime`` (runtime.kernels.codegen): the rewrite loads its kernel lazily."""
    import subprocess
    import sys
    from pathlib import Path

    code = "import sys, runtime.api, runtime.plan.grouping; assert 'numba' not in sys.modules"
    subprocess.run([sys.executable, "-c", code], check=True, cwd=Path(__file__).resolve().parents[1])


def test_half_programs_fuse_on_their_float32_temporaries():
    dims = {"B": 1, "H": 2, "S": 6, "K": 6, "Dh": 4}
    prog = program(dims, "float16")
    plan = runtime.compile(prog, "cpu", tiered=False).plan()
    group = [g for g in plan.groups if g.kind == "fused-attention"][0]
    assert group.output_type.dtype == "float32" and "half-narrow" in [g.kind for g in plan.groups] + \
        [n.atom.name for g in plan.groups for n in g.nodes]
    check(prog, values(dims, "float16", mask="holes"))


@pytest.mark.parametrize("mask_axes,chain,compiled", [("SK", (), True), ("BHSK", ("scale", "scale"), True),
                                                      ("hSK", ("scale",), True), ("BSK", (), True),
                                                      ("KS", (), False), ("HBSK", (), False), ("bSK", (), True)])
def test_the_driver_runs_the_fused_kernel_with_each_runs_mask(mask_axes, chain, compiled):
    """Compiled code works out the mask's spans and the chain's scalars from each run's values,
    as the Python launch does: a new mask or scalar changes the result, and it equals the
    Python launch bit for bit. A mask whose rows are not its own C-order elements (here
    transposed) keeps the Python launch."""
    from tests.test_driver import counted_launches

    dims = {"B": 2, "H": 2, "S": 7, "K": 7, "Dh": 4}
    prog = program(dims, mask_axes=mask_axes, chain=chain, extra_reader="o")
    exe = runtime.compile(prog, "cpu", tiered=False)
    ref = runtime.compile(prog, "reference")
    for seed, mask in enumerate(["causal", "holes", "random"]):
        inputs = values(dims, mask_axes=mask_axes, mask=mask, chain=chain, seed=seed)
        if chain:
            inputs["c0"] = np.asarray(0.25 + seed, np.float32)
        for _ in range(DRIVER_AFTER_RUNS if seed == 1 else 1):  # (the drivers build from run 8 on)
            exe.run(inputs)
        assert exe.wait_compiled()
        result = exe.run(inputs)  # through the driver from the second mask on
        got = {k: result[k].copy() for k in result}
        compiled_plan = next(iter(exe._plans.values()))
        if seed:
            driver = compiled_plan.driver()
            assert (compiled_plan.launches[0].kernel.compiled is not None) == compiled
            if compiled:  # attention and silu: one segment
                assert len(driver.parts) == 1 and not isinstance(driver.parts[0], int)
            else:  # a lone silu is not worth a driver
                assert driver is None
            calls = counted_launches(compiled_plan)
            launched = exe.run(inputs, trace=True)
            assert len(calls) == len(compiled_plan.launches)
            for slot in got:
                np.testing.assert_array_equal(got[slot], launched[slot])
        want = ref.run(inputs)
        for slot, w in want.items():
            np.testing.assert_allclose(got[slot], w, rtol=1e-5, atol=1e-5, err_msg=f"{mask} {slot}")


def test_one_attention_kernel_serves_every_plan_of_its_dtype_and_chain():
    """Plans at new extents take the kernel (and the parallel module) that the first loaded."""
    assert ak.attention_kernel("float32") is ak.attention_kernel("float32")
    assert ak.attention_kernel("float32") is not ak.attention_kernel("float64")
    assert ak.attention_kernel("float32", ["x = x * cs[0]"], 1) is not ak.attention_kernel("float32")
