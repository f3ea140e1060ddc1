"""The contenders: formula-runtime backends and the peers they are measured against.

Each ``prepare_*`` function does all setup (compile, build a session, allocate buffers),
then returns a zero-argument callable that computes the seed output once and returns it as
an array of shape [1, T, Dout]. Heavy packages are imported inside these functions only, so
a process that benchmarks one contender loads that contender's libraries and no other's.
"""
from __future__ import annotations

import importlib.util
import os
from collections.abc import Callable, Mapping
from typing import Any

import numpy as np

RUNTIME_BACKENDS = ("reference", "cpu", "cuda")
SEED_PEERS = ("numpy", "numpy_inplace", "onnxruntime", "torch")
CONTENDERS = RUNTIME_BACKENDS + SEED_PEERS
PEER_PACKAGES = {"onnxruntime": ("onnxruntime", "onnx"), "torch": ("torch",)}

Fn = Callable[[], Any]


class Unavailable(Exception):
    """The contender cannot run here; the message says why (becomes a skip reason)."""


def peer_unavailable(name: str) -> str | None:
    """Why a peer cannot run (its package is missing), or None."""
    for package in PEER_PACKAGES.get(name, ()):
        if importlib.util.find_spec(package) is None:
            return f"{name}: package {package!r} is not installed"
    return None


def runtime_compile(program: Mapping[str, Any], backend: str):
    """``runtime.compile`` for a runtime contender, or Unavailable with the reason.

    Only a runtime that cannot be imported yet, or a backend that reports
    ``backend_unavailable``, is a skip; every other error is a real failure."""
    if backend == "cuda" and os.environ.get("NUMBA_ENABLE_CUDASIM") == "1":
        raise Unavailable("cuda: NUMBA_ENABLE_CUDASIM=1 is set; simulator timings mean nothing "
                          "(run on a GPU machine without it)")
    try:
        import runtime

        compile_ = runtime.compile
    except (ImportError, SyntaxError, AttributeError) as exc:
        raise Unavailable(f"runtime.compile is not importable yet: {type(exc).__name__}: {exc}") from exc
    try:
        return compile_(program, backend=backend, tiered=False)  # timings are of compiled kernels
    except runtime.FormulaError as exc:
        if exc.code == "backend_unavailable":
            raise Unavailable(f"{backend}: {exc}") from exc
        raise


def prepare_runtime(backend: str, program: Mapping[str, Any], inputs: Mapping[str, Any],
                    banks: Mapping[str, Any], output: str) -> Fn:
    """The banks are loaded once (``Executable.load_banks``), as a served program keeps its
    weights and as the ONNX Runtime peer holds them as initializers; every run checks its
    inputs."""
    exe = runtime_compile(program, backend)
    resident = exe.load_banks(banks)

    def run():
        return exe.run(inputs=inputs, banks=resident)[output]

    from runtime.execution.compiled import DRIVER_AFTER_RUNS

    for _ in range(DRIVER_AFTER_RUNS):  # the kernels compile on the first run, then the compiled drivers
        run()
    exe.wait_compiled()
    return run


# --- seed peers --------------------------------------------------------------------------

def seed_numpy(data: Mapping[str, Any]) -> Fn:
    """The formula as written: every step allocates its result."""
    x, base, gain = data["inputs"]["x"], data["inputs"]["base"], data["inputs"]["lora.gain"]
    a, b = data["banks"]["lora.A"], data["banks"]["lora.B"]

    def run():
        h = x @ a.T
        return base + gain * ((h * (1 / (1 + np.exp(-h)))) @ b.T)

    return run


def seed_numpy_inplace(data: Mapping[str, Any]) -> Fn:
    """Preallocated buffers and in-place ufuncs: what careful NumPy code can do."""
    x, base, gain = data["inputs"]["x"], data["inputs"]["base"], data["inputs"]["lora.gain"]
    a, b = data["banks"]["lora.A"], data["banks"]["lora.B"]
    tokens = x.shape[1]
    x2, base2 = x.reshape(tokens, -1), base.reshape(tokens, -1)
    h = np.empty((tokens, a.shape[0]), dtype=x.dtype)
    t = np.empty_like(h)
    out = np.empty_like(base)
    out2 = out.reshape(tokens, -1)
    g = gain.dtype.type(gain)

    def run():
        np.matmul(x2, a.T, out=h)
        np.negative(h, out=t)
        np.exp(t, out=t)
        np.add(t, 1, out=t)
        np.divide(h, t, out=h)  # silu(h) = h / (1 + exp(-h))
        np.matmul(h, b.T, out=out2)
        np.multiply(out2, g, out=out2)
        np.add(out2, base2, out=out2)
        return out

    return run


def seed_onnx_model(a: np.ndarray, b: np.ndarray):
    """MatMul→Sigmoid→Mul→MatMul→Mul→Add; the banks are initializers stored transposed
    (Aᵀ, Bᵀ), as weights are normally deployed in ONNX."""
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    elem = TensorProto.FLOAT if a.dtype == np.float32 else TensorProto.DOUBLE
    rank, din = a.shape
    dout = b.shape[0]
    nodes = [
        helper.make_node("MatMul", ["x", "At"], ["h"]),
        helper.make_node("Sigmoid", ["h"], ["sig"]),
        helper.make_node("Mul", ["h", "sig"], ["silu"]),
        helper.make_node("MatMul", ["silu", "Bt"], ["delta"]),
        helper.make_node("Mul", ["delta", "gain"], ["scaled"]),
        helper.make_node("Add", ["base", "scaled"], ["out"]),
    ]
    inputs = [helper.make_tensor_value_info("x", elem, ["B", "S", din]),
              helper.make_tensor_value_info("base", elem, ["B", "S", dout]),
              helper.make_tensor_value_info("gain", elem, [])]
    outputs = [helper.make_tensor_value_info("out", elem, ["B", "S", dout])]
    inits = [numpy_helper.from_array(np.ascontiguousarray(a.T), "At"),
             numpy_helper.from_array(np.ascontiguousarray(b.T), "Bt")]
    graph = helper.make_graph(nodes, "seed_lora_silu", inputs, outputs, initializer=inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)],
                              producer_name="formula-runtime-bench")
    model.ir_version = 8
    onnx.checker.check_model(model)
    return model


def seed_onnxruntime(data: Mapping[str, Any]) -> Fn:
    """ONNX Runtime CPU, default session options, io_binding onto kept-alive arrays."""
    import onnxruntime as ort

    x, base, gain = data["inputs"]["x"], data["inputs"]["base"], data["inputs"]["lora.gain"]
    model = seed_onnx_model(data["banks"]["lora.A"], data["banks"]["lora.B"])
    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    return ort_bound_run(session, {"x": x, "base": base, "gain": gain}, "out", np.empty_like(base))


def ort_bound_run(session, inputs: Mapping[str, np.ndarray], output: str, out: np.ndarray) -> Fn:
    """``session.run_with_iobinding`` onto ``inputs`` (C-order copies where they are not) and
    the preallocated ``out``: ONNX Runtime's cheapest call, returning ``out``."""
    # io_binding keeps raw pointers only: these arrays must outlive the binding.
    keep = {name: np.ascontiguousarray(v) for name, v in inputs.items()}
    binding = session.io_binding()
    for name, value in keep.items():
        binding.bind_cpu_input(name, value)
    binding.bind_output(output, "cpu", 0, out.dtype, list(out.shape), out.ctypes.data)

    def run():
        session.run_with_iobinding(binding)
        return out

    run.keep_alive = (keep, out, session, binding)  # type: ignore[attr-defined]
    return run


def seed_torch(data: Mapping[str, Any]) -> Fn:
    """PyTorch eager on CPU, inference mode, zero-copy tensors over the NumPy inputs."""
    import torch

    t = {k: torch.from_numpy(np.ascontiguousarray(v))
         for k, v in {**data["inputs"], **data["banks"]}.items()}
    x, base, gain, a, b = t["x"], t["base"], t["lora.gain"], t["lora.A"], t["lora.B"]
    silu = torch.nn.functional.silu

    def run():
        with torch.inference_mode():
            return (base + gain * (silu(x @ a.T) @ b.T)).numpy()

    return run


SEED_PREPARE = {"numpy": seed_numpy, "numpy_inplace": seed_numpy_inplace,
                "onnxruntime": seed_onnxruntime, "torch": seed_torch}


def prepare_seed(contender: str, program: Mapping[str, Any], data: Mapping[str, Any]) -> Fn:
    """The seed callable for any contender; raises Unavailable when it cannot run here."""
    if contender in RUNTIME_BACKENDS:
        return prepare_runtime(contender, program, data["inputs"], data["banks"], "%4")
    reason = peer_unavailable(contender)
    if reason:
        raise Unavailable(reason)
    return SEED_PREPARE[contender](data)
