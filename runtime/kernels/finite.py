"""The finiteness check of SPEC §4 at memory speed: a parallel scan of exponent bits.

It reads every bound float once per run, so for large inputs it matters as much as a kernel:
NumPy's reductions are single-threaded; this splits the scan across Numba's threads."""
from __future__ import annotations

import numpy as np

from runtime.kernels.tiers import first_tier

PARALLEL_MIN = 1 << 18  # below this one thread is cheaper than waking the others
SMALL = 16  # below this NumPy's isfinite is as cheap as a compiled call
_CHUNKS = 64
_kernels = {}


def _scans():
    """The scan of the flat exponent bits, for every size and layout (so that a new extent
    never compiles a new variant, only the bits' dtype does): serial below ``PARALLEL_MIN``,
    in ``chunks`` parallel chunks above. Twins: a parallel function costs about 2 µs a call
    even on a plain loop, which the checks of small values must not pay."""
    twins = _kernels.get("count")
    if twins is None:
        from numba import njit, prange

        from runtime.kernels.twins import Twins

        @njit(cache=True, nogil=True)
        def count_nonfinite_serial(bits, mask, chunks):
            acc = np.uint64(0)
            for i in range(np.uint64(bits.size)):  # unsigned: vectorises
                acc += np.uint64((bits[i] & mask) == mask)
            return acc

        @njit(parallel=True, cache=True, nogil=True)
        def count_nonfinite(bits, mask, chunks):
            n = bits.size
            counts = np.empty(chunks, np.uint64)  # (np.zeros would be a parallel loop of its own)
            for c in prange(chunks):
                lo = np.uint64(c * n // chunks)
                hi = np.uint64((c + 1) * n // chunks)
                acc = np.uint64(0)
                for i in range(lo, hi):
                    acc += np.uint64((bits[i] & mask) == mask)
                counts[c] = acc
            total = np.uint64(0)
            for c in range(chunks):
                total += counts[c]
            return total

        twins = _kernels["count"] = Twins(count_nonfinite_serial, count_nonfinite)
    return twins


# the bits of each float dtype, and its exponent mask (all ones: ±inf or NaN)
_BITS = {"float32": np.uint32, "float64": np.uint64, "float16": np.uint16, "bfloat16": np.uint16}
_MASKS = {"float32": 0x7F800000, "float64": 0x7FF0000000000000, "float16": 0x7C00, "bfloat16": 0x7F80}
_ready: set[str] = set()  # the float dtypes whose scan is built in this process


def prepare(float_dtypes) -> None:
    """Build (compile, or load from the disk cache) the scan of each of these dtypes."""
    for name in sorted(set(float_dtypes) & set(_BITS) - _ready):
        bits = _BITS[name]
        for parallel in (False, True):
            _scans().pick(parallel)(np.zeros(SMALL, bits), bits(0), 2 if parallel else 1)
        _ready.add(name)


def all_finite(a: np.ndarray) -> bool | None:
    """True/False for contiguous float16/bfloat16/float32/float64 arrays, None when NumPy should decide: also
    while the scan of the dtype is not built (``prepare``), which a first run must not wait for."""
    name = a.dtype.name
    if name not in _ready or a.size < SMALL or not (a.flags.c_contiguous or a.flags.f_contiguous):
        return None
    kind = _BITS[name]
    bits, mask = a.reshape(-1, order="A").view(kind), kind(_MASKS[name])
    # (not in a first-tier run: Numba's team spinning beside NumPy's BLAS threads slowed
    # the seed's first tier 2.7x)
    parallel = a.size >= PARALLEL_MIN and not first_tier()
    return _scans().pick(parallel)(bits, mask, _CHUNKS if parallel else 1) == 0


# rows of the matrix-vector product blas_all_finite reads a flat array as
BLAS_ROW = 1024
BLAS_MIN = 1 << 16  # below this NumPy's pairwise sum is as fast
_ones: dict[str, np.ndarray] = {}


def blas_all_finite(a: np.ndarray) -> bool | None:
    """True when a contiguous float32/float64 array is all finite, proven by one BLAS
    matrix-vector product with ones (every element is read once, on BLAS's threads: 2.5x
    NumPy's single-threaded sum at 16 MiB; NaN and ±inf propagate through it); None when the
    product cannot tell (an overflowing sum of finite values, another dtype or layout), for an
    elementwise check to decide. It needs nothing compiled: the first tier's check."""
    name = a.dtype.name
    if name not in ("float32", "float64") or a.size < BLAS_MIN \
            or not (a.flags.c_contiguous or a.flags.f_contiguous):
        return None
    ones = _ones.get(name)
    if ones is None:
        ones = _ones[name] = np.ones(BLAS_ROW, a.dtype)
    flat = a.reshape(-1, order="A")
    rows = flat.size // BLAS_ROW
    with np.errstate(all="ignore"):
        total = np.add.reduce(flat[:rows * BLAS_ROW].reshape(rows, BLAS_ROW) @ ones) \
            + np.add.reduce(flat[rows * BLAS_ROW:])
    return True if np.isfinite(total) else None


def device_all_finite(a) -> bool:
    """The same check on a CUDA device array, on the device: nothing crosses the bus."""
    from numba import cuda

    from runtime.kernels.finite_cuda import count_nonfinite as kernel

    flat = a.reshape(a.size) if a.is_c_contiguous() else cuda.to_device(a.copy_to_host().reshape(-1))
    flag = cuda.to_device(np.zeros(1, np.int32))
    blocks = max(1, min(1024, (flat.size + 255) // 256))
    kernel[blocks, 256](flat, flag)
    return int(flag.copy_to_host()[0]) == 0
