"""Explicit SIMD vectors for generated CPU kernels: register-blocked GEMM micro-kernels.

LLVM's auto-vectoriser keeps a loop's accumulator in memory or in one register, so a
hand-written matrix tile in Numba runs at a fraction of the FMA rate. These intrinsics give
generated code LLVM vector values (``<8 x float>``, ``<4 x double>``: one 32-byte AVX
register; and 64-byte ones, ``<16 x float>``, ``<8 x double>``, for the kernels that size
their tiles by :data:`WIDE_BYTES`) that stay in registers across a loop: unaligned
load/store, broadcast, fused multiply-add, a horizontal sum, lane-wise add, subtract and
multiply, and ``nzsel(y, x)``: x's lanes where y's are not 0 (NaN is not 0), else 0, a
select where a branch per element would keep a row loop scalar. On targets with narrower
vectors LLVM splits them.

Names are ``<op>_<f32x8|f64x4|f32x16|f64x8>``; :func:`ops_import` gives generated sources
their import line (with :data:`STAMP`, a digest of this file, so an edit here renames every generated
module and its cache).
Built on them, ``nonfinite_<f32|f64>(flat, lo, hi)`` is the finiteness scan of SPEC §4 at
vector speed (:func:`scan_import`).
"""
from __future__ import annotations

from llvmlite import ir
from numba import njit, types
from numba.core import cgutils
from numba.extending import intrinsic, models, register_model

from runtime.kernels.codegen import source_stamp

STAMP = source_stamp(__file__)  # in the import lines of generated sources
VECTOR_BYTES = 32


def avx512() -> bool:
    """Whether Numba's target (NUMBA_CPU_FEATURES, else the host's) has AVX-512: 32 vector
    registers, of 64 bytes."""
    from numba.core import config
    import llvmlite.binding as ll

    features = config.CPU_FEATURES if config.CPU_FEATURES is not None else ll.get_host_cpu_features().flatten()
    return "+avx512f" in features.split(",")


# The widest vector the target computes at full rate: a register tile of these (the blocked
# GEMM's) does twice the work per instruction of 32-byte ones where AVX-512 is present.
WIDE_BYTES = 64 if avx512() else VECTOR_BYTES
OPS = ("load", "store", "bcast", "zero", "fma", "hsum", "add", "sub", "mul", "nzsel")


class Vector(types.Type):
    """A SIMD vector of ``lanes`` floats of ``dtype`` (a Numba value type, in registers)."""

    def __init__(self, dtype, lanes: int):
        self.dtype, self.lanes = dtype, lanes
        super().__init__(name=f"Vector({dtype}x{lanes})")


@register_model(Vector)
class _VectorModel(models.PrimitiveModel):
    def __init__(self, dmm, fe_type):
        super().__init__(dmm, fe_type, _llvm_vector(fe_type.dtype, fe_type.lanes))


def _llvm_vector(dtype, lanes: int) -> ir.VectorType:
    return ir.VectorType(ir.FloatType() if dtype == types.float32 else ir.DoubleType(), lanes)


def _element_pointer(context, builder, aryty, ary, index, indexty, vec):
    data = context.make_array(aryty)(context, builder, ary).data
    at = builder.gep(data, [context.cast(builder, index, indexty, types.intp)])
    return builder.bitcast(at, vec.as_pointer())


def _define(dtype, nbytes: int = VECTOR_BYTES):
    """The vector operations (``OPS``) for one float dtype and vector size (the caller validates
    indices: these read and write ``lanes`` elements from ``index`` with no bounds check)."""
    item = 4 if dtype == types.float32 else 8
    lanes = nbytes // item
    vt = Vector(dtype, lanes)
    vec = _llvm_vector(dtype, lanes)

    def is_array(a):
        return isinstance(a, types.Array) and a.dtype == dtype and a.ndim == 1

    @intrinsic
    def load(typingctx, arr, index):
        if not (is_array(arr) and isinstance(index, types.Integer)):
            return None

        def codegen(context, builder, sig, args):
            return builder.load(_element_pointer(context, builder, sig.args[0], args[0], args[1],
                                                 sig.args[1], vec), align=item)
        return vt(arr, index), codegen

    @intrinsic
    def store(typingctx, arr, index, value):
        if not (is_array(arr) and isinstance(index, types.Integer) and value == vt):
            return None

        def codegen(context, builder, sig, args):
            builder.store(args[2], _element_pointer(context, builder, sig.args[0], args[0], args[1],
                                                    sig.args[1], vec), align=item)
            return context.get_dummy_value()
        return types.none(arr, index, value), codegen

    @intrinsic
    def bcast(typingctx, x):
        if not isinstance(x, (types.Float, types.Integer)):
            return None

        def codegen(context, builder, sig, args):
            scalar = context.cast(builder, args[0], sig.args[0], dtype)
            one = builder.insert_element(ir.Constant(vec, ir.Undefined), scalar, ir.Constant(ir.IntType(32), 0))
            return builder.shuffle_vector(one, ir.Constant(vec, ir.Undefined),
                                          ir.Constant(ir.VectorType(ir.IntType(32), lanes), [0] * lanes))
        return vt(x), codegen

    @intrinsic
    def zero(typingctx):
        def codegen(context, builder, sig, args):
            return ir.Constant(vec, [0.0] * lanes)
        return vt(), codegen

    @intrinsic
    def fma(typingctx, a, b, c):
        if not (a == vt and b == vt and c == vt):
            return None

        def codegen(context, builder, sig, args):
            fn = cgutils.get_or_insert_function(builder.module, ir.FunctionType(vec, [vec] * 3),
                                                f"llvm.fma.v{lanes}f{8 * item}")
            return builder.call(fn, args)
        return vt(a, b, c), codegen

    @intrinsic
    def hsum(typingctx, v):
        if v != vt:
            return None

        def codegen(context, builder, sig, args):
            return lane_reduce(builder, args[0], lanes, builder.fadd)
        return dtype(v), codegen

    def binary(build):
        @intrinsic
        def op(typingctx, a, b):
            if not (a == vt and b == vt):
                return None

            def codegen(context, builder, sig, args):
                return build(builder, *args)
            return vt(a, b), codegen
        return op

    def select_nonzero(builder, y, x):  # (fcmp une: true for NaN, as y != 0 is)
        return builder.select(builder.fcmp_unordered("!=", y, ir.Constant(vec, [0.0] * lanes)), x,
                              ir.Constant(vec, [0.0] * lanes))

    ops = (load, store, bcast, zero, fma, hsum, binary(builder_op("fadd")), binary(builder_op("fsub")),
           binary(builder_op("fmul")), binary(select_nonzero))
    return dict(zip(OPS, ops)), lanes


def builder_op(name: str):
    """``(builder, a, b) -> builder.<name>(a, b)``."""
    return lambda builder, a, b: getattr(builder, name)(a, b)


_F32, LANES_F32 = _define(types.float32)
_F64, LANES_F64 = _define(types.float64)
_F32_WIDE, _F64_WIDE = _define(types.float32, 64)[0], _define(types.float64, 64)[0]
_BY_WIDTH = {("float32", 32): _F32, ("float64", 32): _F64, ("float32", 64): _F32_WIDE, ("float64", 64): _F64_WIDE}
# (module globals: generated kernels import them by these names, see ops_import)
(load_f32x8, store_f32x8, bcast_f32x8, zero_f32x8, fma_f32x8, hsum_f32x8,
 add_f32x8, sub_f32x8, mul_f32x8, nzsel_f32x8) = (_F32[op] for op in OPS)
(load_f64x4, store_f64x4, bcast_f64x4, zero_f64x4, fma_f64x4, hsum_f64x4,
 add_f64x4, sub_f64x4, mul_f64x4, nzsel_f64x4) = (_F64[op] for op in OPS)
(load_f32x16, store_f32x16, bcast_f32x16, zero_f32x16, fma_f32x16, hsum_f32x16,
 add_f32x16, sub_f32x16, mul_f32x16, nzsel_f32x16) = (_F32_WIDE[op] for op in OPS)
(load_f64x8, store_f64x8, bcast_f64x8, zero_f64x8, fma_f64x8, hsum_f64x8,
 add_f64x8, sub_f64x8, mul_f64x8, nzsel_f64x8) = (_F64_WIDE[op] for op in OPS)


def ops(dt: str, wide: bool = False) -> dict:
    """The operations (``OPS``, by name) on vectors of ``dt`` (``wide``: ``WIDE_BYTES`` ones),
    for plain ``@njit`` kernels that close over them."""
    return _BY_WIDTH[dt, WIDE_BYTES if wide else VECTOR_BYTES]


@intrinsic
def prefetch(typingctx, arr, index):
    """A hint that ``arr[index]``'s cache line is read soon (``llvm.prefetch``: read, into every
    cache level); never faults, whatever the index."""
    if not (isinstance(arr, types.Array) and isinstance(index, types.Integer)):
        return None

    def codegen(context, builder, sig, args):
        data = context.make_array(sig.args[0])(context, builder, args[0]).data
        at = builder.bitcast(builder.gep(data, [context.cast(builder, args[1], sig.args[1], types.intp)]),
                             ir.IntType(8).as_pointer())
        i32 = ir.IntType(32)
        fn = cgutils.get_or_insert_function(builder.module, ir.FunctionType(ir.VoidType(), [at.type, i32, i32, i32]),
                                            "llvm.prefetch.p0")
        builder.call(fn, [at, ir.Constant(i32, 0), ir.Constant(i32, 3), ir.Constant(i32, 1)])
        return context.get_dummy_value()
    return types.none(arr, index), codegen


def lanes(dt: str, wide: bool = False) -> int:
    """Elements per vector of ``dt``: 32-byte vectors, or ``WIDE_BYTES`` ones (``wide``)."""
    return (WIDE_BYTES if wide else VECTOR_BYTES) // (4 if dt == "float32" else 8)


def lane_reduce(builder, x, lanes: int, combine):
    """LLVM IR folding vector ``x`` to its lane 0 by pairwise halving, ``combine(lo, hi)`` at
    each of the log2(lanes) steps (an add for a sum, a select for a maximum)."""
    width = lanes
    while width > 1:
        width //= 2
        lo = builder.shuffle_vector(x, x, ir.Constant(ir.VectorType(ir.IntType(32), width), list(range(width))))
        hi = builder.shuffle_vector(x, x, ir.Constant(ir.VectorType(ir.IntType(32), width),
                                                      list(range(width, 2 * width))))
        x = combine(lo, hi)
    return builder.extract_element(x, ir.Constant(ir.IntType(32), 0))


def ops_import(dt: str, wide: bool = False) -> str:
    """``from runtime.kernels.simd import load_f32x8 as vload, ...`` (v-prefixed local names;
    ``wide``: the operations on ``WIDE_BYTES`` vectors)."""
    suffix = f"f{'32' if dt == 'float32' else '64'}x{lanes(dt, wide)}"
    names = ", ".join(f"{op}_{suffix} as v{op}" for op in OPS)
    return f"from runtime.kernels.simd import {names}  # simd {STAMP}"


def _scan(load, zero, fma, hsum, width: int):
    @njit(cache=True, nogil=True, error_model="numpy")
    def nonfinite(flat, lo, hi):
        """1 if ``flat[lo:hi]`` holds a NaN or ±inf, else 0 (the caller checks the bounds).
        ``v * 0`` is 0 for every finite ``v`` and NaN otherwise, so each accumulator stays
        exactly 0 unless a value is not finite: one FMA per vector, four vectors in flight."""
        z = zero()
        a0, a1, a2, a3 = zero(), zero(), zero(), zero()
        q = lo
        while q + 4 * width <= hi:
            a0 = fma(load(flat, q), z, a0)
            a1 = fma(load(flat, q + width), z, a1)
            a2 = fma(load(flat, q + 2 * width), z, a2)
            a3 = fma(load(flat, q + 3 * width), z, a3)
            q += 4 * width
        found = (hsum(a0) + hsum(a1) + hsum(a2) + hsum(a3)) != 0
        while q < hi:
            v = flat[q]
            found |= (v - v) != 0
            q += 1
        return 1 if found else 0
    return nonfinite


nonfinite_f32 = _scan(*(_F32[op] for op in ("load", "zero", "fma", "hsum")), LANES_F32)
nonfinite_f64 = _scan(*(_F64[op] for op in ("load", "zero", "fma", "hsum")), LANES_F64)


def scan_import(dt: str) -> str:
    """``from runtime.kernels.simd import nonfinite_f32 as _nonfinite`` (stamped like ops_import)."""
    return f"from runtime.kernels.simd import nonfinite_{'f32' if dt == 'float32' else 'f64'} as _nonfinite  # simd {STAMP}"
