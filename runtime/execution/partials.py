"""The outputs of a chunked run that are sums over the sliced axis: each slice's value added in.

A gradient program's bank gradients are sums over the batch and token axes
(:mod:`runtime.plan.freeaxes`): a chunked run gives each slice's partial sum, and the output
is their sum, added in slice order in the accumulation dtype (SPEC c(float32, d): float32,
float64 for float64) and rounded once to the output's dtype at the end.
"""
from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

from runtime.core.types import TensorType, numpy_dtype
from runtime.kernels.arrays import is_device_array


class PartialSums:
    """Accumulators for ``sums`` (slot -> accumulation dtype) into ``results`` (the run's
    output arrays, host or device): :meth:`target` is where slice ``k`` may write its value
    in place, :meth:`add` adds a slice's value, :meth:`finish` writes the results."""

    def __init__(self, sums: Mapping[str, str], results: Mapping[str, Any], types: Mapping[str, TensorType],
                 to_host):
        self._to_host = to_host
        self._results = {slot: results[slot] for slot in sums}
        self._dtypes = {slot: numpy_dtype(types[slot].dtype) for slot in sums}
        self.slots = frozenset(sums)
        self._acc: dict[str, np.ndarray] = {}
        for slot, acc in sums.items():
            result, want = results[slot], numpy_dtype(acc)
            direct = isinstance(result, np.ndarray) and result.dtype == want and result.flags.c_contiguous
            # a result of the accumulation dtype is its own accumulator, written by slice 0
            self._acc[slot] = result if direct else np.zeros(types[slot].shape, want)

    def target(self, k: int) -> dict[str, Any]:
        """The arrays slice ``k`` writes in place: the first slice writes the results that
        are their own accumulators; every other value comes from the plan's result pool."""
        if k:
            return {}
        return {slot: acc for slot, acc in self._acc.items() if acc is self._results[slot]}

    def add(self, k: int, got: Mapping[str, Any]) -> None:
        for slot, acc in self._acc.items():
            value = got[slot]
            if k == 0 and value is acc:
                continue  # written in place
            if is_device_array(value):
                value = self._to_host(value)
                if value.dtype != self._dtypes[slot]:
                    value = value.view(self._dtypes[slot])  # bfloat16 travels as 2-byte items
            if k == 0:
                acc[...] = value  # (zeros + value would round a -0 to +0)
            else:
                acc += value.astype(acc.dtype, copy=False)

    def finish(self) -> None:
        for slot, acc in self._acc.items():
            result = self._results[slot]
            if result is acc:
                continue
            value = acc.astype(self._dtypes[slot])  # rounded once to the output dtype
            if is_device_array(result):
                result.copy_to_device(value.view(np.dtype(result.dtype)))  # (bfloat16: 2-byte items)
            else:
                result[...] = value


__all__ = ["PartialSums"]
