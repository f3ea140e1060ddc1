"""The device side of atoms._rows: a row's offset in one operand (imported by the cuda kernels
of atoms.cuda only, so numba.cuda is loaded only when a cuda plan is built)."""
from __future__ import annotations

from numba import cuda


@cuda.jit(device=True, inline=True)
def row_offset(r, shape, st, k):
    """Operand ``k``'s offset of row ``r`` (row axes ``shape``, strides ``st[k]``)."""
    off = 0
    for d in range(shape.shape[0] - 1, -1, -1):
        q = r // shape[d]
        off += (r - q * shape[d]) * st[k, d]
        r = q
    return off
