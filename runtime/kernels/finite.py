"""The finiteness check of SPEC §4 at memory speed: a parallel scan of exponent bits.

It reads every bound float once per run, so for large inputs it matters as much as a kernel:
NumPy's reductions are single-threaded; this splits the scan across Numba's threads."""
from __future__ import annotations

import numpy as np

PARALLEL_MIN = 1 << 18  # below this one thread is cheaper than waking the others
SMALL = 16  # below this NumPy's isfinite is as cheap as a compiled call
_CHUNKS = 64
_kernels = {}


def _kernel(parallel: bool):
    if not _kernels:
        from numba import njit, prange

        @njit(cache=True, nogil=True)
        def count_nonfinite_serial(a):  # any C-contiguous float array: no views to make first
            flat = a.reshape(a.size)
            acc = 0
            for i in range(flat.size):
                v = flat[i]
                acc += (v - v) != 0  # NaN and ±inf give NaN
            return acc

        @njit(parallel=True, cache=True, nogil=True)
        def count_nonfinite(bits, mask):
            n = bits.size
            counts = np.zeros(_CHUNKS, np.uint64)
            for c in prange(_CHUNKS):
                lo = np.uint64(c * n // _CHUNKS)
                hi = np.uint64((c + 1) * n // _CHUNKS)
                acc = np.uint64(0)
                for i in range(lo, hi):  # unsigned: vectorises
                    acc += np.uint64((bits[i] & mask) == mask)
                counts[c] = acc
            return counts.sum()

        _kernels[True] = count_nonfinite
        _kernels[False] = count_nonfinite_serial
    return _kernels[parallel]


def all_finite(a: np.ndarray) -> bool | None:
    """True/False for contiguous float32/float64 arrays, None when NumPy should decide."""
    if a.dtype.char not in "fd" or a.size < SMALL:
        return None
    if a.flags.c_contiguous:
        if a.size < PARALLEL_MIN:
            return _kernel(False)(a) == 0
    elif a.flags.f_contiguous:
        if a.size < PARALLEL_MIN:
            return _kernel(False)(a.T) == 0
    else:
        return None
    flat = a.reshape(-1, order="A")
    if a.dtype == np.float32:
        bits, mask = flat.view(np.uint32), np.uint32(0x7F800000)
    else:
        bits, mask = flat.view(np.uint64), np.uint64(0x7FF0000000000000)
    return _kernel(True)(bits, mask) == 0


_device_kernels = {}


def device_all_finite(a) -> bool:
    """The same check on a CUDA device array, on the device: nothing crosses the bus."""
    global cuda  # a module global: the simulator swaps the kernel's global ``cuda`` per thread
    from numba import cuda

    kernel = _device_kernels.get("count")
    if kernel is None:
        @cuda.jit
        def count_nonfinite(flat, flag):
            i = cuda.grid(1)
            stride = cuda.gridsize(1)
            while i < flat.size:
                v = flat[i]
                if not (v - v == 0):  # NaN and ±inf give NaN
                    flag[0] = 1
                i += stride

        kernel = _device_kernels["count"] = count_nonfinite
    flat = a.reshape(a.size) if a.is_c_contiguous() else cuda.to_device(a.copy_to_host().reshape(-1))
    flag = cuda.to_device(np.zeros(1, np.int32))
    blocks = max(1, min(1024, (flat.size + 255) // 256))
    kernel[blocks, 256](flat, flag)
    return int(flag.copy_to_host()[0]) == 0
