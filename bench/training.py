"""Gradients and training steps: the runtime against PyTorch eager (issues 33 and 34).

Cases (``quick=True`` shrinks each for the CI smoke run):

- ``seed-T<T>``: the seed program (LoRA + SiLU, B=1, S=T), gradients for ``lora.A``, ``lora.B``;
- ``mlp-T4096``: ``gelu(x·W1ᵀ)·W2ᵀ`` at T=4096, 1024→4096→1024, gradients for ``w1``, ``w2``;
- ``block-B<B>-S<S>``: bench.blocks' transformer block (embedding lookup, RMS norms, causal
  attention, gelu MLP; D=512, 8×64, F=2048), gradients for every bank (the embedding, both
  gains, the seven projections).

What each contender computes:

- the runtime (``cpu``; ``cuda`` on a GPU): ``forward``, the program; ``fwdbwd``, the gradient
  program of ``runtime.vjp`` in one run (the forward instructions and the backward, fused and
  planned together); ``split``, the forward of ``Gradient.split()`` (keeping what the backward
  reads) then its backward, as ``runtime.torch.Module`` runs a step; ``backward``, that
  backward alone; ``train``, a step of ``runtime.torch.Module``: forward, MSE loss in torch,
  backward, ``torch.optim.AdamW``;
- ``torch`` (eager, the same weights as parameters): ``forward`` (inference mode), ``fwdbwd``
  (the forward with autograd, then ``torch.autograd.grad`` with the same cotangent),
  ``backward`` (``autograd.grad`` on a kept graph), ``train`` (the same step as the runtime's).

Both run with the same threads: torch gets ``torch.set_num_threads`` equal to Numba's default
(``NUMBA_NUM_THREADS``, else the CPUs this process may use).

Peak RSS and the time to the first step need a fresh process each (``ru_maxrss`` only grows):
``python bench/training.py fresh`` runs one per contender and case and prints JSON rows;
``bench/run.py --fresh`` does it for the ``train`` and ``remat`` suites and keeps the rows.
"""
from __future__ import annotations

import argparse
import json
import math
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import attrs
import numpy as np

REPO = Path(__file__).resolve().parent.parent
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from bench import blocks, programs  # noqa: E402

GRAD_CASES = ("seed-T256", "seed-T8192", "mlp-T4096", "block-B1-S128", "block-B1-S512")
TRAIN_CASES = ("seed-T8192", "mlp-T4096", "block-B1-S512")
REMAT_CASE = "block-B4-S512"
POLICIES = ("save-all", "save-contractions", "save-inputs")
RUNTIME_MODES = ("forward", "backward", "fwdbwd", "split")
TORCH_MODES = ("forward", "backward", "fwdbwd")
LR = 1e-3
Values = dict[str, dict[str, Any]]


@attrs.frozen
class Case:
    """A case resolved at its benchmark or quick size."""

    name: str  # as in GRAD_CASES; the full-size name even when quick
    kind: str  # seed, mlp, block
    sizes: Mapping[str, int]

    @property
    def block_case(self) -> blocks.BlockCase:
        return blocks.BlockCase(self.name, self.kind, dict(self.sizes), ())


def resolve(name: str, quick: bool = False) -> Case:
    """``seed-T8192``, ``mlp-T4096`` or ``block-B4-S512`` at full size, or shrunk (seed T=16;
    MLP T=64, 64→256→64; the block at bench.blocks' quick sizes)."""
    kind, _, rest = name.partition("-")
    if kind == "seed":
        return Case(name, kind, {"T": 16 if quick else int(rest.removeprefix("T"))})
    if kind == "mlp":
        return Case(name, kind, {"T": 64, "D": 64, "F": 256} if quick else
                    {"T": int(rest.removeprefix("T")), "D": 1024, "F": 4096})
    if kind == "block":
        b, s = (int(p[1:]) for p in rest.split("-"))
        if quick:
            b, s = blocks.QUICK_SIZES[blocks.BLOCK_SIZES.index((b, s))]
        return Case(name, kind, {**(blocks.QUICK_DIMS if quick else blocks.BLOCK_DIMS), "B": b, "S": s})
    raise ValueError(f"unknown case {name!r}")


def threads() -> int:
    """Numba's default thread count, which torch is given too."""
    return int(os.environ.get("NUMBA_NUM_THREADS") or len(os.sched_getaffinity(0)))


def program(case: Case) -> dict:
    if case.kind == "seed":
        return programs.seed_program("float32")
    return blocks.program(case.block_case)


def data(case: Case, seed: int = 0) -> Values:
    """Inputs, banks, the cotangent of the output (``cotangent``) and a training target
    (``target``), all float32; the weights scaled by 1/sqrt(fan-in)."""
    v = programs.seed_data(case.sizes["T"], "float32", seed) if case.kind == "seed" else \
        blocks.data(case.block_case, seed)
    shape = output_shape(case)
    rng = np.random.default_rng(seed + 1)
    v["cotangent"] = rng.standard_normal(shape, dtype=np.float32) * np.float32(1 / math.sqrt(math.prod(shape)))
    v["target"] = rng.standard_normal(shape, dtype=np.float32)
    return v


def output_shape(case: Case) -> tuple[int, ...]:
    z = case.sizes
    if case.kind == "seed":
        return (1, z["T"], programs.SEED_DIMS["Dout"])
    if case.kind == "mlp":
        return (z["T"], z["D"])
    return (z["B"], z["S"], z["D"])


def wrt(case: Case, values: Values) -> list[str]:
    """The banks that get gradients: every floating one."""
    return [n for n, a in values["banks"].items() if np.asarray(a).dtype.kind == "f"]


def expected_output(case: Case, values: Values) -> np.ndarray:
    """The forward output in float64 NumPy (the seed: its sampled rows)."""
    if case.kind == "seed":
        rows = programs.sample_rows(case.sizes["T"])
        return programs.seed_expected_rows(values, rows)
    return blocks.expected(case.block_case, values)


def check_output(case: Case, values: Values, result, expected: np.ndarray) -> None:
    result = np.asarray(result, dtype=np.float32)
    assert result.shape == output_shape(case), result.shape
    if case.kind == "seed":
        result = result[0, programs.sample_rows(case.sizes["T"])]
    np.testing.assert_allclose(result, expected, rtol=2e-3, atol=2e-3,
                               err_msg=f"{case.name}: the forward output differs from float64 NumPy")


def check_gradients(got: Mapping[str, np.ndarray], want: Mapping[str, np.ndarray], what: str) -> None:
    """Each gradient within 1 % of the largest entry of the one it is checked against."""
    assert list(got) == list(want), (list(got), list(want))
    for name, w in want.items():
        g = np.asarray(got[name], dtype=np.float64)
        w = np.asarray(w, dtype=np.float64)
        scale = float(np.abs(w).max()) or 1.0
        np.testing.assert_allclose(g, w, rtol=0, atol=1e-2 * scale, err_msg=f"{what}: d/d{name}")


# --- the runtime ---------------------------------------------------------------------------------

@attrs.frozen
class RuntimeGrad:
    """The runtime's programs for one case, compiled, with the banks loaded once."""

    fns: Mapping[str, Callable[[], Any]]  # mode -> zero-argument call
    gradients: Callable[[], dict[str, np.ndarray]]  # the split step's gradients by bank name
    whole: Callable[[], dict[str, np.ndarray]]  # the whole vjp program's gradients by bank name
    reference: Callable[[], dict[str, np.ndarray]]  # the same gradient program on the reference backend
    output: Callable[[], np.ndarray]  # the forward's output
    saved_bytes: int


def runtime_grad(backend: str, case: Case, values: Values) -> RuntimeGrad:
    """Compile the forward, the whole gradient program and its split (save-all); every call
    warmed past the compiled drivers' build (``prepare_runtime``), so timings are steady."""
    import runtime

    from bench.contenders import runtime_compile
    from runtime.execution.compiled import DRIVER_AFTER_RUNS

    prog = program(case)
    out_slot = prog["outputs"][0]
    names = wrt(case, values)
    g = runtime.vjp(prog, wrt=names)
    sp = g.split("save-all")
    (cot_name,) = g.cotangents.values()
    inputs, banks = values["inputs"], values["banks"]
    exe_f, exe_g, exe_sf, exe_sb = (runtime_compile(p, backend) for p in (prog, g.program, sp.forward, sp.backward))
    res_f, res_g, res_sf, res_sb = (e.load_banks({n: banks[n] for n in _bank_names(p)})
                                    for e, p in ((exe_f, prog), (exe_g, g.program), (exe_sf, sp.forward),
                                                 (exe_sb, sp.backward)))
    g_inputs = {**inputs, cot_name: values["cotangent"]}
    sb_plain = {n: inputs[n] for n in sp.bindings if n in inputs}
    kept = {name: np.array(a) for name, a in _saved(exe_sf.run(inputs=inputs, banks=res_sf), sp).items()}

    def backward_inputs(saved):
        return {**sb_plain, **saved, sp.cotangents[out_slot]: values["cotangent"]}

    def split_step():
        result = exe_sf.run(inputs=inputs, banks=res_sf)
        return exe_sb.run(inputs=backward_inputs(_saved(result, sp)), banks=res_sb)

    fns = {"forward": lambda: exe_f.run(inputs=inputs, banks=res_f)[out_slot],
           "backward": lambda: exe_sb.run(inputs=backward_inputs(kept), banks=res_sb),
           "fwdbwd": lambda: exe_g.run(inputs=g_inputs, banks=res_g),
           "split": split_step}
    for fn in fns.values():
        for _ in range(DRIVER_AFTER_RUNS):  # kernels compile on the first run, the drivers after these
            fn()
    for exe in (exe_f, exe_g, exe_sf, exe_sb):
        exe.wait_compiled()

    def reference():
        result = runtime.execute(g.program, inputs=g_inputs, banks=banks, backend="reference")
        return {n: result[g.gradients[n]] for n in names}

    def whole():
        result = fns["fwdbwd"]()
        return {n: result[g.gradients[n]] for n in names}

    return RuntimeGrad(fns, lambda: {n: split_step()[sp.gradients[n]] for n in names}, whole, reference,
                       fns["forward"], sum(sp.saved_bytes(_dims(case)).values()))


def _bank_names(p: Mapping[str, Any]) -> list[str]:
    return [b["name"] for b in p["bindings"] if b["kind"] == "bank"]


def _saved(result, sp) -> dict[str, np.ndarray]:
    return {name: result[slot] for slot, name in sp.saved.items()}


def _dims(case: Case) -> dict[str, int]:
    return {"B": 1, "S": case.sizes["T"]} if case.kind == "seed" else {}


# --- torch ------------------------------------------------------------------------------------------

def torch_setup() -> Any:
    import torch

    torch.set_num_threads(threads())
    return torch


def torch_forward(case: Case, values: Values) -> Callable[[Mapping[str, Any]], Any]:
    """The case as a PyTorch user writes it: ``f(params) -> output``, the inputs bound."""
    torch = torch_setup()
    F = torch.nn.functional
    t = {k: torch.from_numpy(np.ascontiguousarray(a)) for k, a in values["inputs"].items()}
    if case.kind == "seed":
        x, base, gain = t["x"], t["base"], t["lora.gain"]
        return lambda p: base + gain * (F.silu(x @ p["lora.A"].T) @ p["lora.B"].T)
    if case.kind == "mlp":
        return lambda p: F.gelu(t["x"] @ p["w1"].T) @ p["w2"].T
    z = case.sizes
    bsz, s, d, h, dh = z["B"], z["S"], z["D"], z["H"], z["Dh"]
    mask, eps = t["causal_mask"], t["epsilon"]

    def rms(x, gain):
        return x * torch.rsqrt((x * x).mean(-1, keepdim=True) + eps) * gain

    def heads(x, w):  # [B,S,D] · [H,Dh,D] -> [B,H,S,Dh]
        return (x @ w.reshape(h * dh, d).T).reshape(bsz, s, h, dh).transpose(1, 2)

    def block(p):
        x = p["embedding"][t["ids"]]
        hn = rms(x, p["norm1_gain"])
        att = F.scaled_dot_product_attention(heads(hn, p["wq"]), heads(hn, p["wk"]), heads(hn, p["wv"]),
                                             attn_mask=mask, scale=1.0)  # queries prescaled, as the program's
        x2 = x + att.transpose(1, 2).reshape(bsz, s, h * dh) @ p["wo"].reshape(d, h * dh).T
        return x2 + F.gelu(rms(x2, p["norm2_gain"]) @ p["w1"].T) @ p["w2"].T

    return block


@attrs.frozen
class TorchGrad:
    fns: Mapping[str, Callable[[], Any]]
    gradients: Callable[[], dict[str, np.ndarray]]
    output: Callable[[], np.ndarray]


def torch_grad(case: Case, values: Values) -> TorchGrad:
    torch = torch_setup()
    f = torch_forward(case, values)
    names = wrt(case, values)
    params = {n: torch.tensor(values["banks"][n], requires_grad=True) for n in names}
    frozen = {n: torch.from_numpy(np.asarray(a)) for n, a in values["banks"].items() if n not in params}
    cot = torch.from_numpy(values["cotangent"])
    order = list(params.values())

    def forward():
        with torch.inference_mode():
            return f({**frozen, **params})

    def fwdbwd():
        return torch.autograd.grad(f({**frozen, **params}), order, cot)

    kept = f({**frozen, **params})  # one graph, kept for the backward alone

    def backward():
        return torch.autograd.grad(kept, order, cot, retain_graph=True)

    for fn in (forward, fwdbwd, backward):
        fn()
    return TorchGrad({"forward": forward, "fwdbwd": fwdbwd, "backward": backward},
                     lambda: {n: g.numpy() for n, g in zip(names, fwdbwd())}, lambda: forward().numpy())


# --- a training step ------------------------------------------------------------------------------

@attrs.frozen
class Trainer:
    step: Callable[[], float]  # one step; the loss before it
    warm: Callable[[], None]  # steps until every compiled piece is built (the runtime: its drivers)
    saved_bytes: Callable[[], int | None] = lambda: None  # what the step keeps for its backward


def runtime_trainer(backend: str, case: Case, values: Values, remat: Any = "save-all") -> Trainer:
    """runtime.torch.Module over the case's program: forward on the runtime, MSE in torch,
    backward on the runtime, AdamW in torch."""
    torch = torch_setup()
    import runtime
    import runtime.torch as rt

    from bench.contenders import runtime_compile
    from runtime.execution.compiled import DRIVER_AFTER_RUNS

    prog = program(case)
    runtime_compile(prog, backend)  # Unavailable (a skip) where the backend cannot run
    module = rt.Module(prog, banks=values["banks"], backend=backend, wrt=wrt(case, values), remat=remat,
                       tiered=False)
    opt = torch.optim.AdamW(module.parameters(), lr=LR)
    target = torch.from_numpy(values["target"])
    out_slot = prog["outputs"][0]
    inputs = values["inputs"]

    def step() -> float:
        loss = ((module(**inputs)[out_slot] - target) ** 2).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
        return loss.item()

    def warm() -> None:
        for _ in range(DRIVER_AFTER_RUNS):
            step()
        module.wait_compiled()

    def saved_bytes() -> int:  # after the timed first step: the transform is no part of it
        sp = runtime.vjp(prog, wrt=wrt(case, values)).split(remat)
        return sum(sp.saved_bytes(_dims(case)).values())

    return Trainer(step, warm, saved_bytes)


def torch_trainer(case: Case, values: Values) -> Trainer:
    """The same model, loss and optimizer in torch eager."""
    torch = torch_setup()
    f = torch_forward(case, values)
    names = wrt(case, values)
    params = {n: torch.nn.Parameter(torch.tensor(values["banks"][n])) for n in names}
    frozen = {n: torch.from_numpy(np.asarray(a)) for n, a in values["banks"].items() if n not in params}
    opt = torch.optim.AdamW(params.values(), lr=LR)
    target = torch.from_numpy(values["target"])

    def step() -> float:
        loss = ((f({**frozen, **params}) - target) ** 2).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
        return loss.item()

    def warm() -> None:
        for _ in range(3):
            step()

    return Trainer(step, warm)


def trainer(contender: str, case: Case, values: Values, remat: Any = "save-all") -> Trainer:
    """Any contender's trainer; bench.contenders.Unavailable when it cannot run here."""
    from bench.contenders import RUNTIME_BACKENDS, Unavailable, peer_unavailable

    reason = peer_unavailable("torch")  # both train through torch
    if reason:
        raise Unavailable(reason)
    if contender in RUNTIME_BACKENDS:
        return runtime_trainer(contender, case, values, remat)
    if contender == "torch":
        return torch_trainer(case, values)
    raise Unavailable(f"{contender}: no training step is written for it")


# --- fresh processes: peak RSS and the time to the first step -----------------------------------------

def measure(contender: str, name: str, remat: str, steps: int, quick: bool = False) -> dict[str, Any]:
    """In this (fresh) process: data, then the trainer built and its first step taken (timed
    together: the runtime's vjp, split, compile and kernels; torch's first eager step), the
    warm-up, ``steps`` timed steps; the peak RSS."""
    t0 = time.perf_counter()
    case = resolve(name, quick)
    values = data(case)
    data_rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    t = time.perf_counter()
    tr = trainer(contender, case, values, remat)
    first_loss = tr.step()
    first = time.perf_counter() - t
    tr.warm()
    times = []
    for _ in range(steps):
        t = time.perf_counter()
        loss = tr.step()
        times.append(time.perf_counter() - t)
    assert math.isfinite(loss) and loss < first_loss, (first_loss, loss)
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss  # KiB on Linux
    return {"contender": contender, "case": name, "remat": remat if contender != "torch" else None,
            "first_step_s": round(first, 3), "steady_step_ms": round(statistics.median(times) * 1e3, 3),
            "steps": steps, "peak_rss_mib": round(peak / 1024, 1), "data_rss_mib": round(data_rss / 1024, 1),
            "saved_bytes": tr.saved_bytes(), "threads": threads(), "loss": [first_loss, loss],
            "process_s": round(time.perf_counter() - t0, 3),
            "cache_dir": os.environ.get("FORMULA_CACHE_DIR"), "quick": quick}


def fresh(rows: list[tuple[str, str, str]], steps: int = 5, cold: bool = False, quick: bool = False,
          timeout: float = 1800) -> list[dict[str, Any]]:
    """Each (contender, case, remat) measured in a fresh process. ``cold``: the runtime's
    first with empty ``FORMULA_CACHE_DIR``/``NUMBA_CACHE_DIR`` and again with them warm."""
    out = []
    with tempfile.TemporaryDirectory(prefix="formula-train-") as tmp:
        for k, (contender, name, remat) in enumerate(rows):
            caches = ["cold", "warm"] if cold and contender != "torch" else ["as-is"]
            for cache in caches:
                env = dict(os.environ)
                if cache != "as-is":
                    where = Path(tmp) / str(k)
                    env.update(FORMULA_CACHE_DIR=str(where), NUMBA_CACHE_DIR=str(where / "numba"))
                cmd = [sys.executable, str(Path(__file__).resolve()), "child", contender, name,
                       "--remat", remat, "--steps", str(steps), *(["--quick"] if quick else [])]
                proc = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, env=env, timeout=timeout)
                lines = proc.stdout.strip().splitlines()
                row = json.loads(lines[-1]) if proc.returncode == 0 and lines else \
                    {"contender": contender, "case": name, "remat": remat,
                     "error": (proc.stderr.strip().splitlines() or ["?"])[-1]}
                row["cache"] = cache
                out.append(row)
                print(json.dumps(row), flush=True)
    return out


def fresh_rows(suites: list[str], contenders: list[str]) -> list[tuple[str, str, str]]:
    """What ``bench/run.py --fresh`` measures: each train case per contender (save-all), each
    remat policy on the block at (4, 512), and torch there as the baseline."""
    rows = []
    runtime_side = [c for c in contenders if c in ("cpu", "cuda")]
    if "train" in suites:
        rows += [(c, n, "save-all") for n in TRAIN_CASES for c in [*runtime_side, "torch"] if c in contenders]
    if "remat" in suites:
        rows += [(c, REMAT_CASE, p) for c in runtime_side for p in POLICIES]
        rows += [("torch", REMAT_CASE, "save-all")] if "torch" in contenders else []
    return rows


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description="Training steps in fresh processes: peak RSS, first step, step time.")
    sub = p.add_subparsers(dest="cmd", required=True)
    f = sub.add_parser("fresh", help="every contender × case (× remat policy), one fresh process each")
    f.add_argument("--contenders", default="cpu,torch")
    f.add_argument("--cases", default=",".join(TRAIN_CASES))
    f.add_argument("--remat", default="save-all", help=f"comma list of {', '.join(POLICIES)}")
    f.add_argument("--steps", type=int, default=5)
    f.add_argument("--cold", action="store_true", help="the runtime cold (empty caches), then warm")
    f.add_argument("--quick", action="store_true", help="the cases at their quick sizes")
    f.add_argument("--out", type=Path, default=None, help="also write the rows here as JSON")
    c = sub.add_parser("child")
    c.add_argument("contender")
    c.add_argument("case")
    c.add_argument("--remat", default="save-all")
    c.add_argument("--steps", type=int, default=5)
    c.add_argument("--quick", action="store_true")
    args = p.parse_args(argv)
    if args.cmd == "child":
        print(json.dumps(measure(args.contender, args.case, args.remat, args.steps, args.quick)))
        return 0
    contenders = [x.strip() for x in args.contenders.split(",") if x.strip()]
    policies = [x.strip() for x in args.remat.split(",") if x.strip()]
    rows = [(c, n.strip(), r) for n in args.cases.split(",") for c in contenders
            for r in (policies if c != "torch" else ["save-all"])]
    found = fresh(rows, args.steps, args.cold, args.quick)
    if args.out:
        args.out.write_text(json.dumps(found, indent=1))
    return 1 if any(r.get("error") for r in found) else 0


if __name__ == "__main__":
    sys.exit(main())
