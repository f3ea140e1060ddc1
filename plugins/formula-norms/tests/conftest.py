"""The CUDA simulator must be on before numba is imported (no GPU in CI); FORMULA_REAL_CUDA=1
runs the cuda tests on a real device instead."""
import os

if os.environ.get("FORMULA_REAL_CUDA") != "1":
    os.environ.setdefault("NUMBA_ENABLE_CUDASIM", "1")
