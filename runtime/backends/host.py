"""Host memory shared by the NumPy-based backends: one byte arena, views into it."""
from __future__ import annotations

import numpy as np

from runtime.kernels.layout import keepdims_aligner
from runtime.core.types import TensorType, numpy_dtype
from runtime.backends.base import Backend

ARENA_ALIGNMENT = 64


class HostBackend(Backend):
    def allocate(self, nbytes: int):
        # over-allocate so that offset 0 is 64-byte aligned in memory, not just in the plan
        raw = np.empty(max(nbytes, 1) + ARENA_ALIGNMENT, dtype=np.uint8)
        shift = (-raw.ctypes.data) % ARENA_ALIGNMENT
        return raw[shift:shift + max(nbytes, 1)]

    def view(self, arena, offset: int, t: TensorType):
        dtype = numpy_dtype(t.dtype)
        return arena[offset:offset + t.nbytes].view(dtype).reshape(t.shape)

    def empty(self, t: TensorType):
        return np.empty(t.shape, dtype=numpy_dtype(t.dtype))

    def aligner(self, value_type: TensorType, target: TensorType):
        return keepdims_aligner(value_type, target)
