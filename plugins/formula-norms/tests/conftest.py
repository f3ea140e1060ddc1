"""The CUDA simulator must be on before numba is imported (no GPU in CI); FORMULA_REAL_CUDA=1
runs the cuda tests on a real device instead."""
import os

from runtime.testing import real_cuda  # imports no numba

if not real_cuda():
    os.environ.setdefault("NUMBA_ENABLE_CUDASIM", "1")
