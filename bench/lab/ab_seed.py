"""Side-by-side A/B of this session's seed optimisations, in one process: each variant is its
own executable, calls are interleaved, figures are medians (ms). The baseline is the code as
it is; every other variant switches one mechanism back off:

- ``results kept``: the caller keeps every result, so the result pool can reuse none and
  each run writes fresh pages (what every run paid before the pool existed);
- ``separate finiteness pass``: the binder scans every float binding again before the run
  (the kernels' own counting stays, so this is the cost of that extra pass);
- ``libm exp``: generated CPU kernels call ``math.exp`` instead of ``runtime.kernels.vmath.vexp``;
- ``4 tiles/thread``: the contract's CPU tiles at the former 4 per thread;
- ``BLAS tiles``: the contract's row tiles computed by BLAS, not by the register-blocked
  micro-kernels of ``atoms.contract.micro``;
- ``banks per run``: the banks passed as arrays to every run (checked, and counted for
  finiteness by the kernels, each run) instead of loaded once by ``Executable.load_banks``;
- ``kernel by kernel``: no compiled driver (``runtime.execution.driver``): the plan's kernels launched
  one by one from Python;
- ``bcast from 2048 rows``: ``h·Bᵀ`` by BLAS below 2048 rows (the micro-kernel's former
  threshold, before its right operand was packed in panels by a vectorised copy);
- ``B packed per call``: the ``bcast`` micro-kernel packs its right operand (a resident bank)
  on every call instead of once per loaded value;
- ``x·Aᵀ on dot``: the ``x·Aᵀ`` product on the ``dot`` micro-kernel (dot products along K)
  at every T, not on ``bcast`` from 256 rows;
- ``remainder rows one by one``: a tile's rows past its last full micro-kernel block
  computed one at a time, with no block of 4 first;
- ``left rows unpacked``: the ``bcast`` micro-kernel broadcasts a block's left elements
  straight from its rows, not from the block first copied into one interleaved buffer
  (``micro.PACK_LEFT_MIN_PANELS``).

    python bench/lab/ab_seed.py 256 8192 32768
    python bench/lab/ab_seed.py 256 --variants "left rows unpacked,B packed per call" --reps 3000
"""
from __future__ import annotations

import argparse
import time
from collections import deque
from pathlib import Path

import numpy as np

import atoms.contract.micro as micro
import atoms.contract.tiles as tiles
import runtime
import runtime.kernels.vmath as vmath
from runtime.execution.compiled import DRIVER_AFTER_RUNS

SEED = Path(__file__).resolve().parents[2] / "examples" / "seed-lora-silu.program.json"


def seed_values(T: int):
    rng = np.random.default_rng(0)
    inputs = {"x": rng.standard_normal((1, T, 1024), dtype=np.float32),
              "base": rng.standard_normal((1, T, 1024), dtype=np.float32),
              "lora.gain": np.float32(0.7)}
    banks = {"lora.A": (rng.standard_normal((32, 1024)) * 0.03).astype(np.float32),
             "lora.B": (rng.standard_normal((1024, 32)) * 0.1).astype(np.float32)}
    return inputs, banks


def built(inputs, banks, module=None, name=None, value=None, resident=True):
    """(executable, banks to run it with): the banks loaded once (``load_banks``) or, with
    ``resident=False``, the arrays themselves; its kernels, built on its first run with those
    banks, see ``module.name = value``."""
    exe = runtime.compile(SEED, "cpu", tiered=False)
    run_banks = exe.load_banks(banks) if resident else banks
    saved = getattr(module, name) if module is not None else None
    if module is not None:
        setattr(module, name, value)
    try:
        exe.run(inputs=inputs, banks=run_banks)
    finally:
        if module is not None:
            setattr(module, name, saved)
    return exe, run_banks


def libm_imports(lines: list[str]) -> list[str]:
    """``vmath.with_imports`` binding the vector helpers' names to libm's functions."""
    libm = ("from math import exp as _vexp, erf as _verf, tanh as _vtanh; "
            "from runtime.kernels.vmath import gelu_libm as _vgelu")
    return [libm if line == vmath.IMPORT else line for line in lines]


def rows_one_by_one(mr, rows_of):
    """``micro._row_blocks`` with no block of 4: full blocks, then the remainder row by row."""
    from runtime.toolkit.cpu import Source

    src = Source()
    with src.block(f"while i + {mr} <= rows:"):
        src.add(rows_of(mr), f"i += {mr}")
    with src.block("while i < rows:"):
        src.add(rows_of(1), "i += 1")
    return src


class _NoResidentPacks:
    """``micro.ResidentPacks`` that gives no packs: a resident bank is packed in every call."""

    @staticmethod
    def shared(*args, **kwargs):
        return None


def variants(inputs, banks, only: list[str] | None = None):
    """name -> (executable, keep results?, banks to run with), each with one mechanism
    switched off; ``only``: the baseline and these (all when None)."""
    def separate():
        exe, run_banks = built(inputs, banks)
        exe._binder._deferred = lambda structure: frozenset()
        return exe, run_banks

    def by_kernel():
        exe, run_banks = built(inputs, banks)
        for compiled in exe._plans.values():
            compiled._driver, compiled._driver_built = None, True
        return exe, run_banks

    makers = {"baseline": (lambda: built(inputs, banks), False),
              "results kept": (lambda: built(inputs, banks), True),
              "separate finiteness pass": (separate, False),
              "libm exp": (lambda: built(inputs, banks, vmath, "with_imports", libm_imports), False),
              "4 tiles/thread": (lambda: built(inputs, banks, tiles, "TILES_PER_THREAD", 4), False),
              "BLAS tiles": (lambda: built(inputs, banks, micro, "choose_form", lambda *dims: None), False),
              "bcast from 2048 rows": (lambda: built(inputs, banks, micro, "BCAST_MIN_ROWS", 2048), False),
              "B packed per call": (lambda: built(inputs, banks, micro, "ResidentPacks", _NoResidentPacks), False),
              "x·Aᵀ on dot": (lambda: built(inputs, banks, micro, "BCAST_WIDE_MIN_ROWS", 1 << 62), False),
              "remainder rows one by one": (lambda: built(inputs, banks, micro, "_row_blocks", rows_one_by_one), False),
              "left rows unpacked": (lambda: built(inputs, banks, micro, "PACK_LEFT_MIN_PANELS", 1 << 30), False),
              "banks per run": (lambda: built(inputs, banks, resident=False), False),
              "kernel by kernel": (by_kernel, False)}
    unknown = set(only or ()) - set(makers)
    if unknown:
        raise SystemExit(f"unknown variants {sorted(unknown)}; known: {sorted(makers)}")
    names = list(makers) if only is None else ["baseline", *only]
    table = {}
    for name in names:
        make, keep = makers[name]
        exe, run_banks = make()
        table[name] = (exe, keep, run_banks)
    return table


def main(tokens: list[int], only: list[str] | None, reps: int | None) -> None:
    for T in tokens:
        inputs, banks = seed_values(T)
        table = variants(inputs, banks, only)
        kept = deque(maxlen=4)  # more than the pool keeps per slot
        for exe, _, run_banks in table.values():  # arm the fast paths
            for _ in range(DRIVER_AFTER_RUNS):
                exe.run(inputs=inputs, banks=run_banks)
            exe.wait_compiled()  # (the compiled drivers build in the background)
        times = {name: [] for name in table}
        for _ in range(reps or (200 if T <= 2048 else 30)):
            for name, (exe, keep, run_banks) in table.items():
                started = time.perf_counter()
                result = exe.run(inputs=inputs, banks=run_banks)["%4"]
                times[name].append(time.perf_counter() - started)
                if keep:
                    kept.append(result)
                del result
        base = np.median(times["baseline"])
        print(f"T={T}: " + ", ".join(f"{name} {np.median(v) * 1e3:.3f} ms ({np.median(v) / base:.2f}x)"
                                     for name, v in times.items()), flush=True)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description="Side-by-side A/B of the seed's mechanisms.")
    parser.add_argument("tokens", nargs="*", type=int, default=[256, 8192, 32768])
    parser.add_argument("--variants", help="comma-separated: only these beside the baseline (fewer "
                        "executables in turn disturb each other's caches less)")
    parser.add_argument("--reps", type=int, help="rounds of calls (default 200 up to T=2048, else 30)")
    args = parser.parse_args()
    main(args.tokens, args.variants.split(",") if args.variants else None, args.reps)
