"""Programs inside a PyTorch training loop (``pip install formula-runtime[torch]``).

    module = runtime.torch.Module("adapter.program.json", banks={"lora.A": a, "lora.B": b})
    opt = torch.optim.AdamW(module.parameters(), lr=1e-3)
    out = module(x=x, base=base, **{"lora.gain": 0.5})["%4"]
    loss = ((out - target) ** 2).mean(); loss.backward(); opt.step()

The floating banks (or those named by ``wrt``) are the module's parameters; ``module.banks``
maps a binding name to its parameter (torch refuses dots in parameter names). A step runs the
program's forward once on the runtime's backend, keeping what the gradient reads
(``Gradient.split`` under the ``remat`` policy), and its backward as a second program; floating
input tensors that require grad get gradients too. Tensors cross as NumPy views where their
layout allows (CPU, contiguous); results come back as tensors over the runtime's fresh arrays.
"""
from __future__ import annotations

import types
from collections.abc import Mapping
from typing import Any

import numpy as np

from runtime.core.errors import FormulaError, fail

try:
    import torch
except ImportError as exc:  # an optional extra: say how to get it
    raise ImportError("runtime.torch needs PyTorch: pip install 'formula-runtime[torch]' "
                      "(on CPU-only machines: pip install torch==2.13.0+cpu)") from exc

_TORCH_DTYPES = {"float16": torch.float16, "bfloat16": torch.bfloat16, "float32": torch.float32,
                 "float64": torch.float64, "int64": torch.int64, "boolean": torch.bool}


def to_numpy(value: Any) -> Any:
    """A tensor's values as a NumPy array, a view where the layout allows (CPU tensors); a
    bfloat16 tensor as an ml_dtypes.bfloat16 array over the same memory. Other values pass."""
    if not isinstance(value, torch.Tensor):
        return value
    t = value.detach()
    if t.device.type != "cpu":
        t = t.cpu()
    if t.dtype == torch.bfloat16:
        import ml_dtypes

        return t.contiguous().view(torch.int16).numpy().view(ml_dtypes.bfloat16)
    return t.numpy()


def to_tensor(value: np.ndarray) -> torch.Tensor:
    """A tensor over a result array (no copy; bfloat16 through its bits)."""
    a = np.asarray(value)
    if a.dtype.name == "bfloat16":
        return torch.from_numpy(np.ascontiguousarray(a).view(np.int16)).view(torch.bfloat16)
    if not a.flags.writeable:
        a = a.copy()
    return torch.from_numpy(a)


class Module(torch.nn.Module):
    """A formula program as a ``torch.nn.Module`` whose parameters are its banks."""

    def __init__(self, program: Any, banks: Mapping[str, Any] | None = None, backend: str = "cpu",
                 wrt: Any = None, remat: Any = "save-all", registry=None, tiered: bool | None = None,
                 memory_limit: Any = None):
        super().__init__()
        from runtime.api import load_program

        self.program = load_program(program, registry)
        self.backend, self.remat, self.registry = backend, remat, registry
        self._tiered, self._memory_limit = tiered, memory_limit
        floating = [b.name for b in self.program.bank_bindings
                    if b.value_type.dtype not in ("int64", "boolean")]
        names = floating if wrt is None else list(wrt)
        bank_names = {b.name for b in self.program.bank_bindings}
        for i, name in enumerate(names):
            if name not in bank_names:
                fail("binding_keys", f"$.wrt[{i}]", f"{name!r} is not a bank of the program "
                                                    f"(banks: {sorted(bank_names)}); inputs get gradients "
                                                    "when their tensors require grad")
        values = dict(banks or {})
        missing = sorted(bank_names - set(values))
        if missing:
            fail("binding_keys", "$.banks", f"no value for banks {missing}")
        self._params: dict[str, torch.nn.Parameter] = {}
        for k, name in enumerate(names):
            v = values[name]
            param = torch.nn.Parameter(v.detach().clone() if isinstance(v, torch.Tensor)
                                       else to_tensor(np.array(v)))
            self.register_parameter(f"bank_{k}_" + "".join(c if c.isalnum() else "_" for c in name), param)
            self._params[name] = param
        self.banks = types.MappingProxyType(self._params)  # binding name -> parameter
        self._fixed = {n: to_numpy(v) for n, v in values.items() if n not in self._params}
        self._steps: dict[frozenset[str], _Step] = {}

    # --- what a step runs ------------------------------------------------------------------
    def _step(self, grad_inputs: frozenset[str]) -> "_Step":
        step = self._steps.get(grad_inputs)
        if step is None:
            from runtime.api import compile as compile_program, vjp

            wrt = [*self._params, *sorted(grad_inputs)]
            sp = vjp(self.program, wrt, registry=self.registry).split(self.remat)
            kw = dict(backend=self.backend, registry=self.registry, tiered=self._tiered,
                      memory_limit=self._memory_limit)
            step = self._steps[grad_inputs] = _Step(sp, compile_program(sp.forward, **kw),
                                                     compile_program(sp.backward, **kw), wrt)
        return step

    def forward(self, **inputs: Any) -> dict[str, torch.Tensor]:
        """Run the program; ``inputs`` by binding name (tensors, arrays or numbers). Returns
        ``{output slot: tensor}``."""
        floating_inputs = {b.name for b in self.program.input_bindings
                           if b.value_type.dtype not in ("int64", "boolean")}
        grad_inputs = frozenset(n for n, v in inputs.items() if n in floating_inputs
                                and isinstance(v, torch.Tensor) and v.requires_grad)
        step = self._step(grad_inputs)
        tensors = [self._params[n] for n in self._params] + [inputs[n] for n in sorted(grad_inputs)]
        outputs = _Run.apply(self, step, inputs, *tensors)
        return dict(zip(self.program.outputs, outputs))

    def plan(self, dims: Mapping[str, int], requires_grad: tuple[str, ...] = ()) -> dict[str, Any]:
        """A step's plans at ``dims``: ``{"forward", "backward"}`` (runtime.plan.Plan) and
        ``"saved_bytes"``, what the forward keeps for the backward under the ``remat`` policy."""
        step = self._step(frozenset(requires_grad))
        return {"forward": step.forward.plan(dims), "backward": step.backward.plan(dims),
                "saved_bytes": step.split.saved_bytes(dims)}

    def wait_compiled(self, timeout: float | None = None) -> bool:
        """Wait for the background compiles of every step built so far (``Executable.wait_compiled``)."""
        done = True
        for step in self._steps.values():
            for exe in (step.forward, step.backward):
                done = exe.wait_compiled(timeout) is not False and done
        return done


class _Step:
    """One set of differentiated bindings: the split programs and their executables."""

    def __init__(self, split, forward, backward, wrt):
        self.split, self.forward, self.backward, self.wrt = split, forward, backward, wrt
        self.kinds = {b["name"]: b["kind"] for b in split.backward["bindings"]}


class _Run(torch.autograd.Function):
    @staticmethod
    def forward(ctx, module: Module, step: _Step, inputs: Mapping[str, Any], *tensors):
        program = module.program
        values = {n: to_numpy(v) for n, v in inputs.items()}
        banks = dict(module._fixed)
        banks.update({n: to_numpy(p) for n, p in module._params.items()})
        result = step.forward.run(inputs=values, banks=banks)
        sp = step.split
        ctx.step = step
        ctx.values = {**values, **banks}
        ctx.saved_values = {name: result[slot] for slot, name in sp.saved.items()}
        ctx.output_types = [program.slot(s).value_type for s in program.outputs]
        ctx.output_shapes = [np.shape(result[s]) for s in program.outputs]
        outs = tuple(to_tensor(result[s]) for s in program.outputs)
        ctx.mark_non_differentiable(*[o for o, t in zip(outs, ctx.output_types)
                                      if t.dtype in ("int64", "boolean")])
        return outs

    @staticmethod
    def backward(ctx, *grads):
        step: _Step = ctx.step
        sp = step.split
        program_outputs = list(step.split.forward["outputs"])
        inputs: dict[str, Any] = {}
        banks: dict[str, Any] = {}
        for name in sp.bindings:
            (banks if step.kinds[name] == "bank" else inputs)[name] = ctx.values[name]
        inputs.update(ctx.saved_values)
        for slot, name in sp.cotangents.items():
            k = program_outputs.index(slot)
            g = grads[k]
            t = ctx.output_types[k]
            if g is None:  # the output took no part in the loss
                g = torch.zeros(ctx.output_shapes[k], dtype=_TORCH_DTYPES.get(t.dtype, torch.float32))
            inputs[name] = np.ascontiguousarray(to_numpy(g))
        result = step.backward.run(inputs=inputs, banks=banks)
        out = [to_tensor(result[sp.gradients[w]]) for w in step.wrt]
        return (None, None, None, *out)


__all__ = ["Module", "to_numpy", "to_tensor", "FormulaError"]
