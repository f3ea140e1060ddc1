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


@intrinsic
def _load(typingctx, arr, index):
    """``arr[index]`` as an atomic load (a plain read may be forwarded or hoisted by LLVM)."""
    if not (isinstance(arr, types.Array) and arr.dtype == types.int64 and isinstance(index, types.Integer)):
        return None

    def codegen(context, builder, sig, args):
        data = context.make_array(sig.args[0])(context, builder, args[0]).data
        at = builder.gep(data, [context.cast(builder, args[1], sig.args[1], types.intp)])
        return builder.load_atomic(at, "acquire", 8)
    return types.int64(arr, index), codegen


# Workers of a parallel ticket loop (``for w in prange(WORKERS)``): at least any machine's
# threads, as a constant (``numba.get_num_threads()`` in a kernel keeps it out of the disk
# cache); the extra ones find the tickets gone at once (:func:`left`).
WORKERS = 64


@njit(nogil=True, inline="always")
def left(ticket, count):
    """Whether tasks below ``count`` may be left to take (one atomic read, no write)."""
    return _load(ticket, 0) < count


@njit(nogil=True, inline="always")
def take(ticket):
    """The next task number from ``ticket`` (an int64 array of one element, from 0)."""
    return _fetch_add(ticket, 0, 1)
