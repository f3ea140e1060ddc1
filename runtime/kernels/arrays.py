"""Device arrays as the core meets them: any library's CUDA arrays (numba, CuPy, PyTorch), by
the CUDA array interface, with no backend imported."""
from __future__ import annotations

import sys

import numpy as np


def is_device_array(value) -> bool:
    """A CUDA array (any library's); the simulator's arrays count too, once it is loaded."""
    if isinstance(value, np.ndarray):
        return False
    if hasattr(value, "__cuda_array_interface__"):
        return True
    if "numba.cuda" not in sys.modules:  # nobody made device arrays without loading it
        return False
    from numba import cuda

    if hasattr(cuda, "is_cuda_array"):
        return cuda.is_cuda_array(value)
    fake = getattr(cuda.devicearray, "FakeCUDAArray", None)  # the simulator's device arrays
    return fake is not None and isinstance(value, fake)
