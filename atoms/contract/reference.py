"""The contract atom's reference kernel: ``np.einsum`` in the accumulation dtype (the oracle);
the first tier's unbatched contractions through BLAS (``np.matmul``)."""
from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from runtime.core.types import accumulation_dtype, numpy_dtype
from runtime.toolkit import first_tier, value_is_finite
from runtime.plugins.atomspec import Node
from runtime.plugins.kernel import Counts, Kernel, KernelRequest, plain_kernel

from .lowering import as_batched, lower

def _acc(node: Node) -> np.dtype:
    t = node.input_types[0]
    return numpy_dtype(accumulation_dtype(t.dtype, node.attributes["accumulation_dtype"]))


def reference_kernel(request: KernelRequest) -> Kernel:
    """np.einsum in the accumulation dtype, cast back: the oracle. Subscripts are integer
    labels per axis name (a reduced pair shares its left axis' label)."""
    node = request.node
    lt, rt = node.input_types
    pairs = [tuple(p) for p in node.attributes["reduce_axes"]]
    labels: dict[str, int] = {}
    for a in lt.axes:
        labels.setdefault(a, len(labels))
    right_of = {b: a for a, b in pairs}
    for b in rt.axes:
        if b not in right_of:
            labels.setdefault(b, len(labels))
    sub_l = [labels[a] for a in lt.axes]
    sub_r = [labels[right_of.get(b, b)] if b in right_of else labels[b] for b in rt.axes]
    sub_o = [labels[a] for a in node.output_type.axes]
    acc = _acc(node)
    einsum_ok = len(labels) <= 52
    low = lower(lt, rt, pairs)
    nb, m, n, k = low.dims
    natural = low.batch + low.m_axes + low.n_axes
    in_place = tuple(node.output_type.axes) == natural  # the output is the product's [nb, m, n]

    # Every element of both operands is a factor of some term of a non-empty output, and a NaN
    # or ±inf factor makes its sum NaN or ±inf: a finite output proves the operands finite. So
    # the kernel counts the bindings it is asked to where its output is smaller than they are
    # (the seed's x, 16 MiB, through its 0.5 MiB product), by one check of its output; a
    # non-finite output (also an overflow) makes the run check them exactly.
    counted = tuple(request.count_inputs)
    if node.output_type.nbytes >= sum(node.input_types[k].nbytes for k in counted):
        counted = ()

    def run(inputs: Sequence[np.ndarray], out: np.ndarray) -> int:
        with np.errstate(all="ignore"):  # an overflowing sum gives ±inf, as the kernels'
            product(inputs, out)
        return int(out.size == 0 or not value_is_finite(out)) if counted else 0

    def product(inputs: Sequence[np.ndarray], out: np.ndarray) -> None:
        left = np.asarray(inputs[0]).astype(acc, copy=False)
        right = np.asarray(inputs[1]).astype(acc, copy=False)
        if einsum_ok and not first_tier():
            value = np.einsum(left, sub_l, right, sub_r, sub_o)
        else:  # einsum has 52 labels; the same sum as a matmul (BLAS: the first tier)
            a = as_batched(left, low.left_order, (nb, m, k))
            b = as_batched(right, low.right_order, (nb, k, n))
            if in_place and out.dtype == acc and out.flags.c_contiguous:
                np.matmul(a, b, out=out.reshape(nb, m, n))  # (no temporary as large as the output)
                return
            c = np.matmul(a, b).reshape([low.extents[x] for x in natural])
            value = c.transpose([natural.index(x) for x in node.output_type.axes])
        out[...] = value
    return plain_kernel(run, Counts(inputs=counted))

