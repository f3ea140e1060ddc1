"""``numba.cuda`` kernels with one device arena per executable.

numba-cuda is an optional extra (``pip install formula-runtime[cuda]``); without it, or
without a GPU (and without the simulator, ``NUMBA_ENABLE_CUDASIM=1``), the backend reports
itself unavailable and the other backends keep working.
"""
from __future__ import annotations

import numpy as np

from runtime.kernels.arrays import is_device_array
from runtime.core.types import TensorType, numpy_dtype
from runtime.backends.base import Backend

ARENA_ALIGNMENT = 256  # cudaMalloc alignment; the planner's offsets are multiples of 64


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
        from runtime.backends.cuda_codegen import device_aligner  # (kernel machinery: loaded on first use)

        return device_aligner(value_type, target)

    def elementwise_kernel(self, request):
        from runtime.backends.cuda_codegen import elementwise_kernel

        return elementwise_kernel(request)

    def synchronize(self) -> None:
        self.cuda.synchronize()
