"""The CUDA simulator must be on before numba is imported (no GPU in CI); FORMULA_REAL_CUDA=1
runs the cuda tests on a real device instead."""
import os

from runtime.core import settings  # imports no numba

if not settings.REAL_CUDA.read():
    os.environ.setdefault("NUMBA_ENABLE_CUDASIM", "1")
