"""Array types for compiled callers of kernels whose explicit signatures declare unaligned
arrays: Numba converts an aligned array to an unaligned one only where its mutability changes
too, so compiled code passes :func:`unaligned` of it (the same array, retyped)."""
from __future__ import annotations

from numba import types
from numba.core.imputils import impl_ret_borrowed
from numba.extending import intrinsic


@intrinsic
def unaligned(typingctx, arr):
    """``arr`` typed as an unaligned array (same data, same mutability)."""
    if not isinstance(arr, types.Array):
        return None
    target = types.Array(arr.dtype, arr.ndim, arr.layout, readonly=not arr.mutable, aligned=False)

    def codegen(context, builder, signature, args):
        return impl_ret_borrowed(context, builder, signature.return_type, args[0])
    return target(arr), codegen
