"""Result memory: caller-supplied ``out=`` arrays, and recycling of results the caller let go.

A fresh result array costs a page fault per 4 KiB on first touch (PERFORMANCE-FACTS: a new
32 MiB array is ~3 ms slower to fill than a warm one), which at large T is as much as a
whole kernel. Two ways to avoid it without ever overwriting memory the caller can see:

* ``out=``: the caller hands in the arrays to write (checked like bindings: keys, shape,
  dtype, layout, no overlap with any operand or other output).
* :class:`runtime.execution.pool.ResultPool`: each compiled plan keeps the last few result arrays it handed out and
  reuses one only once nothing but the pool refers to it — no name, container, view,
  buffer export or weak reference. That is exactly the state in which freeing it would be
  safe, so reuse is indistinguishable from ``free`` followed by ``malloc`` of warm memory.
"""
from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import numpy as np

from runtime.core.errors import fail

from runtime.core.types import TensorType, numpy_dtype

def check_out(out: Any, outputs: tuple[str, ...], types: Mapping[str, TensorType],
              operands: Mapping[str, Any], device: Callable[[Any], bool]) -> dict[str, Any]:
    """``out`` as {output slot: array}, each one writable memory of the result's exact type
    that no operand and no other output overlaps (a kernel reads operands while writing)."""
    if out is None:
        return {}
    if not isinstance(out, Mapping):
        fail("schema", "$.out", f"out must be a mapping of output slot to array, got {type(out).__name__}")
    checked: dict[str, Any] = {}
    for slot, arr in out.items():
        path = f"$.out.{slot}"
        if slot not in outputs:
            fail("binding_keys", path, f"{slot!r} is not an output of the program (outputs: {list(outputs)})")
        if arr is None:
            continue
        t = types[slot]
        if not (isinstance(arr, np.ndarray) or device(arr)):
            fail("out_buffer", path, f"out[{slot!r}] must be an array, got {type(arr).__name__}")
        if tuple(arr.shape) != t.shape:
            fail("binding_shape", path, f"out[{slot!r}] has shape {tuple(arr.shape)}; the result {slot!r} "
                 f"has shape {t.shape} (axes {list(t.axes)})")
        if np.dtype(arr.dtype) != numpy_dtype(t.dtype):
            fail("binding_dtype", path, f"out[{slot!r}] has dtype {np.dtype(arr.dtype)}; the result {slot!r} is {t.dtype}")
        if not _contiguous(arr):
            fail("out_buffer", path, f"out[{slot!r}] must be C-contiguous")
        if isinstance(arr, np.ndarray):
            if not arr.flags.writeable:
                fail("out_buffer", path, f"out[{slot!r}] is read-only")
            if not arr.flags.aligned:
                fail("out_buffer", path, f"out[{slot!r}] is not aligned to its dtype")
        for name, value in list(operands.items()) + list(checked.items()):
            if may_overlap(arr, value):
                fail("out_buffer", path, f"out[{slot!r}] overlaps the memory of {name!r}; "
                     "results must be written to memory no operand or other result uses")
        checked[slot] = arr
    return checked


def may_overlap(a: Any, b: Any) -> bool:
    """Whether two arrays' memory may overlap: host arrays by NumPy's bounds check, device
    arrays by the byte ranges their ``__cuda_array_interface__`` spans (the same check on
    device pointers), the simulator's by the host arrays they wrap. Host and device memory
    never overlap."""
    if isinstance(a, np.ndarray) or isinstance(b, np.ndarray):
        return isinstance(a, np.ndarray) and isinstance(b, np.ndarray) and np.may_share_memory(a, b)
    ra, rb = device_bytes(a), device_bytes(b)
    if ra is not None and rb is not None:
        return ra[0] < rb[1] and rb[0] < ra[1]
    wa, wb = getattr(a, "_ary", None), getattr(b, "_ary", None)  # numba's simulator arrays
    return isinstance(wa, np.ndarray) and isinstance(wb, np.ndarray) and np.may_share_memory(wa, wb)


def device_bytes(arr: Any) -> tuple[int, int] | None:
    """The ``[start, end)`` device addresses an array's elements span, or None when it has no
    ``__cuda_array_interface__``. Empty arrays span nothing."""
    iface = getattr(arr, "__cuda_array_interface__", None)
    if not isinstance(iface, Mapping):
        return None
    start = int(iface["data"][0])
    shape = tuple(iface["shape"])
    itemsize = np.dtype(iface["typestr"]).itemsize
    if 0 in shape:
        return start, start
    strides = iface.get("strides")
    if strides is None:  # C-contiguous
        return start, start + itemsize * int(np.prod(shape, dtype=np.int64))
    low = sum((n - 1) * s for n, s in zip(shape, strides) if s < 0)
    high = sum((n - 1) * s for n, s in zip(shape, strides) if s > 0)
    return start + low, start + high + itemsize


def _contiguous(arr: Any) -> bool:
    if isinstance(arr, np.ndarray):
        return arr.flags.c_contiguous
    is_c = getattr(arr, "is_c_contiguous", None)
    if callable(is_c):
        return bool(is_c())
    iface = getattr(arr, "__cuda_array_interface__", None)
    return iface is not None and iface.get("strides") is None
