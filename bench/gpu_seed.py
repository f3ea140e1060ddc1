"""The seed program at 65,536 tokens on a real GPU: formula cuda (device inputs, so nothing
crosses the bus), against CuPy and PyTorch doing the same formula on the same card and the
formula cpu backend; achieved bandwidth for the bytes the program must move (x and base
read, the output written) against a measured device-to-device copy. Writes JSON to argv[1]; argv[2] is the
number of tokens (65,536 by default; small ones let the simulator check the script)."""
from __future__ import annotations

import json
import sys
import time
from pathlib import Path

import numpy as np

import runtime

SEED = Path(__file__).resolve().parents[1] / "examples" / "seed-lora-silu.program.json"
D, R = 1024, 32


def median_ms(fn, sync, reps=30):
    fn(); sync()
    times = []
    for _ in range(reps):
        t0 = time.perf_counter(); fn(); sync(); times.append(time.perf_counter() - t0)
    return 1e3 * float(np.median(times))


def main(out_path: str, T: int = 65536) -> None:
    from numba import cuda

    rng = np.random.default_rng(0)
    x = rng.standard_normal((1, T, D), dtype=np.float32)
    base = rng.standard_normal((1, T, D), dtype=np.float32)
    A = (rng.standard_normal((R, D)) * 0.03).astype(np.float32)
    B = (rng.standard_normal((D, R)) * 0.1).astype(np.float32)
    name = getattr(cuda.get_current_device(), "name", "simulator")
    results = {"tokens": T, "device": name.decode() if isinstance(name, bytes) else str(name)}
    must_move = 3 * T * D * 4
    d = {k: cuda.to_device(v) for k, v in {"x": x, "base": base}.items()}
    banks = {"lora.A": cuda.to_device(A), "lora.B": cuda.to_device(B)}
    t0 = time.perf_counter()
    exe = runtime.compile(SEED, "cuda")
    inputs = {**d, "lora.gain": 0.7}
    got = exe.run(inputs=inputs, banks=banks)["%4"].copy_to_host()
    results["compile_and_first_run_s"] = time.perf_counter() - t0  # cold: empty cache dir
    h = x[0, :64] @ A.T
    want = base[0, :64] + 0.7 * ((h / (1 + np.exp(-h))) @ B.T)
    results["max_abs_err_first_64_rows"] = float(np.abs(got[0, :64] - want).max())
    results["formula_cuda_ms"] = median_ms(lambda: exe.run(inputs=inputs, banks=banks), cuda.synchronize)
    host_inputs = {"x": x, "base": base, "lora.gain": 0.7}
    host_banks = {"lora.A": A, "lora.B": B}
    resident = exe.load_banks(host_banks)
    results["formula_cuda_host_io_ms"] = median_ms(  # x and base up, the result down
        lambda: exe.run(inputs=host_inputs, banks=resident), cuda.synchronize, reps=10)
    copy_src, copy_dst = d["x"], cuda.device_array_like(d["x"])
    copy_ms = median_ms(lambda: copy_dst.copy_to_device(copy_src), cuda.synchronize)
    results["copy_GBps"] = 2 * x.nbytes / copy_ms / 1e6
    results["formula_cuda_GBps"] = must_move / results["formula_cuda_ms"] / 1e6
    results["fraction_of_copy_bandwidth"] = results["formula_cuda_GBps"] / results["copy_GBps"]
    try:
        import cupy as cp
        cx, cb, cA, cB = (cp.asarray(v) for v in (x, base, A, B))
        f = lambda: cb + 0.7 * ((lambda hh: hh / (1 + cp.exp(-hh)))(cx @ cA.T) @ cB.T)
        results["cupy_ms"] = median_ms(f, cp.cuda.Device().synchronize)
    except Exception as exc:  # report, don't fail: the peer is optional
        results["cupy_error"] = repr(exc)
    try:
        import torch
        tx, tb, tA, tB = (torch.from_numpy(v).cuda() for v in (x, base, A, B))
        with torch.inference_mode():
            f = lambda: tb + 0.7 * (torch.nn.functional.silu(tx @ tA.T) @ tB.T)
            results["torch_ms"] = median_ms(f, torch.cuda.synchronize)
    except Exception as exc:
        results["torch_error"] = repr(exc)
    cpu = runtime.compile(SEED, "cpu", tiered=False)
    results["formula_cpu_ms"] = median_ms(lambda: cpu.run(inputs=host_inputs, banks=host_banks), lambda: None, reps=5)
    for peer in ("cupy_ms", "torch_ms", "formula_cpu_ms"):
        if peer in results:
            results[f"speedup_vs_{peer[:-3]}"] = results[peer] / results["formula_cuda_ms"]
    Path(out_path).write_text(json.dumps(results, indent=2))
    print(json.dumps(results, indent=2))


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else "gpu_seed.json",
         int(sys.argv[2]) if len(sys.argv) > 2 else 65536)
