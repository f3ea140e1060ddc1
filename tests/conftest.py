"""Test-session setup. The CUDA simulator must be switched on before numba is imported, so
it happens here, first: CI has no GPU, and every CUDA test runs on the simulator unless
FORMULA_REAL_CUDA=1 asks for the real device (bench/gpu_check.sh does)."""
import os

from runtime.core import settings  # imports no numba

if not settings.REAL_CUDA.read():
    os.environ.setdefault("NUMBA_ENABLE_CUDASIM", "1")

# Runs compile their kernels before they return (no reference tier meanwhile): tests compare
# and time the backends' own kernels; tests/test_tiers.py turns tiering on where it tests it.
os.environ.setdefault("FORMULA_TIERED", "0")
# ... and a tiered run's kernels compile in the tests' own process: a worker process would not
# see a test's monkeypatches, and would mark plans ready in the shared cache for later tests;
# tests/test_compile_worker.py tests the worker in fresh processes with caches of their own.
os.environ.setdefault("FORMULA_COMPILE_WORKER", "0")
