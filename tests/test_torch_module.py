"""runtime.torch.Module: a program's banks as torch parameters, trained by torch optimizers, with
the gradient programs on the runtime's backend (skips without torch)."""
from __future__ import annotations

import numpy as np
import pytest

torch = pytest.importorskip("torch", reason="runtime.torch needs PyTorch (pip install torch==2.13.0+cpu)")

import runtime  # noqa: E402
import runtime.torch as rt  # noqa: E402
from runtime.build import ProgramBuilder  # noqa: E402

SEED = "examples/seed-lora-silu.program.json"


def _seed_values(rng, B=2, S=8, D=1024, R=32):
    x = torch.tensor(rng.standard_normal((B, S, D)).astype(np.float32))
    base = torch.tensor(rng.standard_normal((B, S, D)).astype(np.float32))
    target = torch.tensor(rng.standard_normal((B, S, D)).astype(np.float32))
    a = (rng.standard_normal((R, D)) * 0.02).astype(np.float32)
    b = (rng.standard_normal((D, R)) * 0.02).astype(np.float32)
    return x, base, target, a, b


@pytest.mark.parametrize("backend", ["reference", "cpu"])
def test_adamw_on_the_seed_follows_the_torch_model(backend):
    x, base, target, a0, b0 = _seed_values(np.random.default_rng(0))
    module = rt.Module(SEED, banks={"lora.A": a0, "lora.B": b0}, backend=backend, tiered=False)
    assert list(module.banks) == ["lora.A", "lora.B"]
    a, b = torch.nn.Parameter(torch.tensor(a0)), torch.nn.Parameter(torch.tensor(b0))
    ours = torch.optim.AdamW(module.parameters(), lr=1e-2)
    theirs = torch.optim.AdamW([a, b], lr=1e-2)
    losses = []
    for _ in range(20):
        out = module(x=x, base=base, **{"lora.gain": 0.5})["%4"]
        loss = ((out - target) ** 2).mean()
        ours.zero_grad()
        loss.backward()
        ours.step()
        ref = base + 0.5 * (torch.nn.functional.silu(x @ a.T) @ b.T)
        loss_ref = ((ref - target) ** 2).mean()
        theirs.zero_grad()
        loss_ref.backward()
        theirs.step()
        losses.append((loss.item(), loss_ref.item()))
    for got, want in losses:
        assert abs(got - want) <= 1e-3 * want
    assert losses[-1][0] < 0.8 * losses[0][0]  # it learned
    np.testing.assert_allclose(module.banks["lora.A"].detach().numpy(), a.detach().numpy(), rtol=1e-2, atol=1e-4)


def test_inputs_that_require_grad_get_gradients_and_unused_outputs_are_zero():
    b = ProgramBuilder("float64")
    x = b.input("x", {"T": 3, "D": 4})
    w = b.bank("w", {"D": 4, "O": 2})
    y = b.op("contract", [x, w], {"reduce_axes": [["D", "D"]], "output_axes": ["T", "O"],
                                  "accumulation_dtype": "float32"})
    z = b.op("scalar-map", [y], {"mode": "tanh"})
    i = b.op("axis-index@1", [y], {"axis": "T"}, ref="arti/formula-atom-axis-index@1")
    program = b.build([y, z, i])
    w0 = np.random.default_rng(1).standard_normal((4, 2))
    module = rt.Module(program, banks={"w": w0}, tiered=False)
    xt = torch.randn(3, 4, dtype=torch.float64, requires_grad=True)
    out = module(x=xt)
    assert out[i].dtype == torch.int64 and not out[i].requires_grad
    out[z].sum().backward()  # y takes no part: its cotangent is zeros
    wt = torch.tensor(w0, requires_grad=True)
    xx = xt.detach().clone().requires_grad_()
    torch.tanh(xx @ wt).sum().backward()
    np.testing.assert_allclose(module.banks["w"].grad.numpy(), wt.grad.numpy(), rtol=1e-12)
    np.testing.assert_allclose(xt.grad.numpy(), xx.grad.numpy(), rtol=1e-12)


def test_wrt_names_banks_only_and_values_are_needed():
    with pytest.raises(runtime.FormulaError) as err:
        rt.Module(SEED, banks={"lora.A": np.zeros((32, 1024), np.float32)})
    assert err.value.code == "binding_keys" and "lora.B" in err.value.message
    with pytest.raises(runtime.FormulaError) as err:
        rt.Module(SEED, banks={}, wrt=["x"])
    assert (err.value.code, err.value.path) == ("binding_keys", "$.wrt[0]")


def test_tensors_cross_as_views():
    t = torch.arange(6, dtype=torch.float32).reshape(2, 3)
    a = rt.to_numpy(t)
    a[0, 0] = 7
    assert t[0, 0].item() == 7
    back = rt.to_tensor(np.ones(3, np.float32))
    assert back.dtype == torch.float32
    ml_dtypes = pytest.importorskip("ml_dtypes")
    bf = torch.tensor([1.5, -2.0], dtype=torch.bfloat16)
    assert rt.to_numpy(bf).dtype == ml_dtypes.bfloat16
    assert rt.to_tensor(rt.to_numpy(bf)).dtype == torch.bfloat16


def test_a_steps_plans_report_what_the_policy_keeps():
    _, _, _, a0, b0 = _seed_values(np.random.default_rng(2))
    sizes = {}
    for policy in ("save-all", "save-contractions", "save-inputs"):
        module = rt.Module(SEED, banks={"lora.A": a0, "lora.B": b0}, remat=policy, tiered=False)
        report = module.plan({"B": 4, "S": 512})
        sizes[policy] = sum(report["saved_bytes"].values())
        assert report["backward"].working_bytes > 0
    assert sizes["save-all"] == 2 * 4 * 512 * 32 * 4 and sizes["save-inputs"] == 0
    assert sizes["save-contractions"] == 4 * 512 * 32 * 4
