"""``numba.cuda`` kernels with one device arena per executable.

numba-cuda is an optional extra (``pip install formula-runtime[cuda]``); without it, or
without a GPU (and without the simulator, ``NUMBA_ENABLE_CUDASIM=1``), the backend reports
itself unavailable and the other backends keep working.
"""
from __future__ import annotations

import sys

import numpy as np

from ..layout import keepdims_aligner, keepdims_order
from ..types import TensorType, numpy_dtype
from .base import Backend

ARENA_ALIGNMENT = 256  # cudaMalloc alignment; the planner's offsets are multiples of 64


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


class CudaBackend(Backend):
    name = "cuda"
    fuses = True
    device_memory = True

    def unavailable_reason(self) -> str | None:
        try:
            from numba import cuda
        except ImportError as exc:
            return f"numba.cuda cannot be imported ({exc}); install the extra: pip install 'formula-runtime[cuda]'"
        try:
            if not cuda.is_available():
                return "no CUDA GPU or driver was found (set NUMBA_ENABLE_CUDASIM=1 to use the simulator)"
        except Exception as exc:  # drivers report problems in many ways
            return f"CUDA is not usable here: {type(exc).__name__}: {exc}"
        return None

    @property
    def cuda(self):
        from numba import cuda

        return cuda

    def allocate(self, nbytes: int):
        return self.cuda.device_array(max(nbytes, 1), dtype=np.uint8)

    def view(self, arena, offset: int, t: TensorType):
        dtype = numpy_dtype(t.dtype)
        return arena[offset:offset + t.nbytes].view(dtype).reshape(t.shape)

    def empty(self, t: TensorType):
        return self.cuda.device_array(t.shape, dtype=numpy_dtype(t.dtype))

    def to_backend(self, host_value):
        if is_device_array(host_value):
            return host_value
        return self.cuda.to_device(np.ascontiguousarray(host_value))

    def to_host(self, value):
        if isinstance(value, np.ndarray):
            return value
        return value.copy_to_host()

    def aligner(self, value_type: TensorType, target: TensorType):
        """Device operands in keepdims form: a view when the operand's axes already follow
        the target's order, else a transposed copy through the host."""
        order, keep_shape = keepdims_order(value_type, target)
        if order == tuple(sorted(order)):
            return keepdims_aligner(value_type, target)  # a view (reshape) on any array kind

        def transposed(value):
            host = self.to_host(value).transpose(order)
            return self.cuda.to_device(np.ascontiguousarray(host).reshape(keep_shape))
        return transposed

    def elementwise_kernel(self, epilogue, out_type):
        from .cuda_codegen import elementwise_kernel

        return elementwise_kernel(epilogue, out_type)

    def synchronize(self) -> None:
        self.cuda.synchronize()
