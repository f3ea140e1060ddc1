"""An atomic counter for CPU kernels: workers of a parallel region take tasks from a shared
ticket (dynamic scheduling) instead of fixed shares, so a worker slowed by a busy core takes
fewer of them (docs/performance.md: noisy neighbour)."""
from __future__ import annotations

from numba import njit, types
from numba.extending import intrinsic


@intrinsic
def _fetch_add(typingctx, arr, index, value):
    """``arr[index] += value`` as one atomic operation; the old value (no bounds check)."""
    if not (isinstance(arr, types.Array) and arr.dtype == types.int64 and isinstance(index, types.Integer)
            and isinstance(value, types.Integer)):
        return None

    def codegen(context, builder, sig, args):
        aryty, ary, idx, val = sig.args[0], args[0], args[1], args[2]
        data = context.make_array(aryty)(context, builder, ary).data
        at = builder.gep(data, [context.cast(builder, idx, sig.args[1], types.intp)])
        return builder.atomic_rmw("add", at, context.cast(builder, val, sig.args[2], types.int64), "seq_cst")
    return types.int64(arr, index, value), codegen


@njit(nogil=True, inline="always")
def take(ticket):
    """The next task number from ``ticket`` (an int64 array of one element, from 0)."""
    return _fetch_add(ticket, 0, 1)
