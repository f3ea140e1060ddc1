"""Gradient.split (issue: training): a forward that outputs what its backward reads and a backward
that takes it, under each recompute policy, equal to the whole gradient program."""
from __future__ import annotations

import numpy as np
import pytest

import runtime
from runtime.testing import as_float64
from tests.test_autodiff import CASES

POLICIES = ["save-all", "save-contractions", "save-inputs"]


def _run_split(sp, inputs, banks, cot, backend):
    f = runtime.execute(sp.forward, inputs=inputs, banks=banks, backend=backend)
    kinds = {b["name"]: b["kind"] for b in sp.backward["bindings"]}
    values = {**inputs, **banks}
    b_inputs = {k: values[k] for k in sp.bindings if kinds[k] == "input"}
    b_banks = {k: values[k] for k in sp.bindings if kinds[k] == "bank"}
    b_inputs.update({name: f[slot] for slot, name in sp.saved.items()})
    b_inputs.update(cot)
    return f, runtime.execute(sp.backward, inputs=b_inputs, banks=b_banks, backend=backend)


@pytest.mark.parametrize("policy", POLICIES)
@pytest.mark.parametrize("name", ["seed", "observe-affine", "segment-softmax", "masked-softmax",
                                  "scale-add-fanout", "layout", "lookup"])
def test_split_equals_the_whole_gradient(name, policy):
    program, wrt, inputs, banks = CASES[name]()
    p64 = as_float64(program)
    g = runtime.vjp(p64, wrt)
    out = runtime.execute(p64, inputs=inputs, banks=banks, backend="reference")
    rng = np.random.default_rng(1)
    cot = {n: rng.standard_normal(out[s].shape) for s, n in g.cotangents.items()}
    whole = runtime.execute(g.program, inputs={**inputs, **cot}, banks=banks, backend="reference")
    sp = g.split(policy)
    f, b = _run_split(sp, inputs, banks, cot, "reference")
    for slot in out:
        np.testing.assert_array_equal(f[slot], out[slot])
    for w, slot in g.gradients.items():
        np.testing.assert_allclose(b[slot], whole[slot], rtol=1e-12, atol=1e-12, err_msg=w)
    if policy == "save-inputs":
        assert sp.saved == {}
    if policy == "save-all":
        assert sp.recomputed == ()


def test_policies_trade_kept_bytes_for_recomputation_on_the_seed():
    g = runtime.vjp("examples/seed-lora-silu.program.json", ["lora.A", "lora.B"])
    dims = {"B": 4, "S": 512}
    kept = {p: sum(g.split(p).saved_bytes(dims).values()) for p in POLICIES}
    assert kept["save-all"] > kept["save-contractions"] > kept["save-inputs"] == 0
    sp = g.split("save-contractions")
    assert list(sp.saved) == ["%0"] and sp.recomputed == ("i1",)  # silu recomputed, fused back in
    plan = runtime.compile(sp.backward, "cpu", tiered=False).plan(dims)
    assert any("scalar-map" in line and "anchor" in line for line in plan.describe().splitlines()) or \
        "scalar-map" in plan.describe()


def test_a_list_of_slots_is_a_policy_and_bad_policies_are_refused():
    g = runtime.vjp("examples/seed-lora-silu.program.json", ["lora.A"])
    assert list(g.split(["%0"]).saved) == ["%0"] and g.split([]).recomputed == ("i0",)
    with pytest.raises(runtime.FormulaError) as err:
        g.split("keep-everything")
    assert (err.value.code, err.value.path) == ("schema", "$.remat")
    with pytest.raises(runtime.FormulaError) as err:
        g.split(["%9"])
    assert (err.value.code, err.value.path) == ("invalid_output", "$.remat[0]")


def test_split_programs_run_on_cpu_like_the_reference():
    program, wrt, inputs, banks = CASES["seed"]()
    g = runtime.vjp(program, wrt)
    inputs32 = {k: np.asarray(v, np.float32) for k, v in inputs.items()}
    banks32 = {k: np.asarray(v, np.float32) for k, v in banks.items()}
    cot = {n: np.ones((1, 2, 1024), np.float32) for n in g.cotangents.values()}
    sp = g.split("save-contractions")
    _, ref = _run_split(sp, inputs32, banks32, cot, "reference")
    _, cpu = _run_split(sp, inputs32, banks32, cot, "cpu")
    for slot in ref:
        np.testing.assert_allclose(cpu[slot], ref[slot], rtol=2e-4, atol=2e-4)
