"""Half precision (float16, bfloat16) on backends whose kernels compute in float32 (SPEC §3b.1).

Numba has no float16 or bfloat16 type, so the planner rewrites half-typed work before it
groups nodes: a half operand is *widened* once into a float32 temporary (an arena slot, so it
counts in the working bytes and the §5 preflight), the node runs its float32 kernel, and its
output is *narrowed* (rounded once, to nearest even) into the half slot. A reader that computes
in float32 and gives a half result takes the float32 value itself, so a chain of half ops
stays in float32 and is rounded once at its end; a reader with another output dtype (a
compare, a cast to float64) sees the rounded half value. A narrowing nobody reads is dropped. Atoms that list the backend in
``AtomSpec.half_native`` (data movement by item size) take half operands as they are.

The conversions work on integer views (uint16 <-> float32 bits as uint32): no half type is
needed inside Numba, on the CPU or on CUDA.
"""
from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import attrs
import numpy as np

from .atomspec import AtomSpec, Node
from .types import TensorType

HALF_DTYPES = ("float16", "bfloat16")
PARALLEL_MIN = 1 << 16  # elements: below this one thread is cheaper than waking the others
WIDE = "~f32"  # suffix of a half slot's float32 temporary (never a valid slot id: no clash)

# conversion kinds, as the kernels take them
F16_TO_F32, F32_TO_F16, BF16_TO_F32, F32_TO_BF16 = 0, 1, 2, 3


# --- scalar conversions (plain Python, compiled by Numba for the CPU and for CUDA devices) -----
def f16_bits_to_f32_bits(h):
    """float16 bits -> float32 bits, exactly (subnormals normalised, NaN payload kept)."""
    h = int(h)
    sign = (h & 0x8000) << 16
    exp = (h >> 10) & 0x1F
    man = h & 0x3FF
    if exp == 0x1F:
        return sign | 0x7F800000 | (man << 13)
    if exp != 0:
        return sign | ((exp + 112) << 23) | (man << 13)
    if man == 0:
        return sign
    e = 113  # a subnormal man·2^-24: shift its leading bit up to the implicit one
    while (man & 0x400) == 0:
        man <<= 1
        e -= 1
    return sign | (e << 23) | ((man & 0x3FF) << 13)


def f32_bits_to_f16_bits(x):
    """float32 bits -> float16 bits: round to nearest even, overflow to ±inf, NaN stays NaN."""
    x = int(x)
    sign = (x >> 16) & 0x8000
    a = x & 0x7FFFFFFF
    if a > 0x7F800000:  # NaN: the payload's top bits, never zero (as NumPy's astype)
        return sign | 0x7C00 | max((a >> 13) & 0x3FF, 1)
    if a >= 0x477FF000:  # |x| >= 65520 rounds past the largest half: ±inf
        return sign | 0x7C00
    if a >= 0x38800000:  # a normal half: rebias, round at bit 13
        m = a - 0x38000000
        return sign | ((m + 0xFFF + ((m >> 13) & 1)) >> 13)
    if a < 0x33000000:  # below half the smallest subnormal: ±0
        return sign
    shift = 126 - (a >> 23)  # a subnormal half: units of 2^-24
    mant = (a & 0x7FFFFF) | 0x800000
    return sign | ((mant + (1 << (shift - 1)) - 1 + ((mant >> shift) & 1)) >> shift)


def bf16_bits_to_f32_bits(h):
    """bfloat16 bits -> float32 bits (bfloat16 is float32's upper half)."""
    return int(h) << 16


def f32_bits_to_bf16_bits(x):
    """float32 bits -> bfloat16 bits: round to nearest even (carries into ±inf); a NaN becomes
    the quiet NaN of its sign (as ml_dtypes' astype)."""
    x = int(x)
    if (x & 0x7FFFFFFF) > 0x7F800000:
        return ((x >> 16) & 0x8000) | 0x7FC0
    return (x + 0x7FFF + ((x >> 16) & 1)) >> 16


_SCALAR = (f16_bits_to_f32_bits, f32_bits_to_f16_bits, bf16_bits_to_f32_bits, f32_bits_to_bf16_bits)
_cpu: dict[str, Any] = {}


def scalar_conversion(compile_):
    """``one(bits, kind)``: the conversion ``kind`` of one element, compiled by ``compile_``
    (kind is loop-invariant in the callers, so the compiler hoists the branch)."""
    w16, n16, wbf, nbf = (compile_(f) for f in _SCALAR)

    def one(v, kind):
        if kind == 0:
            return w16(v)
        if kind == 1:
            return n16(v)
        if kind == 2:
            return wbf(v)
        return nbf(v)
    return compile_(one)


def _cpu_kernels() -> dict[str, Any]:
    """Conversion kernels over integer views: ``serial``/``parallel`` for C-contiguous 1-D
    views, ``strided`` for any layout (a strided binding), element by element."""
    if not _cpu:
        from numba import njit, prange

        one = scalar_conversion(njit(inline="always", cache=True))

        @njit(cache=True)
        def serial(src, dst, kind):
            for i in range(src.size):
                dst[i] = one(src[i], kind)

        @njit(cache=True, parallel=True)
        def parallel(src, dst, kind):
            for i in prange(src.size):
                dst[i] = one(src[i], kind)

        @njit(cache=True)
        def strided(src, dst, kind):
            for idx in np.ndindex(src.shape):
                dst[idx] = one(src[idx], kind)

        _cpu.update(serial=serial, parallel=parallel, strided=strided)
    return _cpu


def _views(src, dst, kind: int):
    """The integer views the kernels read and write."""
    widen = kind in (F16_TO_F32, BF16_TO_F32)
    return src.view(np.uint16 if widen else np.uint32), dst.view(np.uint32 if widen else np.uint16)


def convert_host(src: np.ndarray, dst: np.ndarray, kind: int) -> None:
    """Widen or narrow ``src`` into ``dst`` (same shape) on the CPU."""
    s, d = _views(src, dst, kind)
    if s.flags.c_contiguous and d.flags.c_contiguous:
        kernel = _cpu_kernels()["parallel" if s.size >= PARALLEL_MIN else "serial"]
        kernel(s.reshape(-1), d.reshape(-1), kind)
    else:
        _cpu_kernels()["strided"](s, d, kind)


CUDA_THREADS = 256
CUDA_MAX_BLOCKS = 1024


def convert_device(src, dst, kind: int) -> None:
    """Widen or narrow device array ``src`` into ``dst`` (C-contiguous, same shape)."""
    s, d = _views(src, dst, kind)
    s, d = s.reshape(s.size), d.reshape(d.size)
    blocks = max(1, min(CUDA_MAX_BLOCKS, -(-s.size // CUDA_THREADS)))
    from .halves_cuda import convert

    convert[blocks, CUDA_THREADS](s, d, kind)


def _kind(node: Node) -> int:
    if node.atom is NARROW:
        return F32_TO_F16 if node.output_type.dtype == "float16" else F32_TO_BF16
    return F16_TO_F32 if node.input_types[0].dtype == "float16" else BF16_TO_F32


def _cpu_factory(node: Node):
    kind = _kind(node)

    def run(inputs: Sequence[Any], out) -> None:
        convert_host(inputs[0], out, kind)
    return run


def _cuda_factory(node: Node):
    kind = _kind(node)

    def run(inputs: Sequence[Any], out) -> None:
        convert_device(inputs[0], out, kind)
    return run


def _infer_unused(ctx):  # the planner builds these nodes with their types; no program names them
    raise AssertionError("half conversions are planner-made nodes")


_KERNELS = {"cpu": _cpu_factory, "cuda": _cuda_factory}
WIDEN = AtomSpec("half-widen", ("formula-runtime/half-widen@1",), ("value",), frozenset(), _infer_unused,
                 kernels=_KERNELS, summary="float16/bfloat16 -> float32, exactly (planner-made)")
NARROW = AtomSpec("half-narrow", ("formula-runtime/half-narrow@1",), ("value",), frozenset(), _infer_unused,
                  kernels=_KERNELS, summary="float32 -> float16/bfloat16, rounded once (planner-made)")


def _needs_widening(node: Node, backend: str) -> bool:
    if backend in node.atom.half_native:
        return False
    return node.output_type.dtype in HALF_DTYPES or any(t.dtype in HALF_DTYPES for t in node.input_types)


def widen_halves(nodes: Sequence[Node], outputs: Sequence[str], backend: str) -> list[Node]:
    """``nodes`` (program order) with half-typed work rewritten to run in float32 (see the
    module docstring); renumbered in run order, paths kept. Unchanged when nothing is half."""
    if not any(_needs_widening(n, backend) for n in nodes):
        return list(nodes)
    exact: dict[str, tuple[str, TensorType]] = {}  # half slot -> its widened copy
    unrounded: dict[str, tuple[str, TensorType]] = {}  # half slot -> its producer's float32 value
    out: list[Node] = []

    def float32_of(slot: str, t: TensorType, node: Node) -> tuple[str, TensorType]:
        if node.output_type.dtype in HALF_DTYPES and slot in unrounded:
            return unrounded[slot]  # half in, half out: the chain is rounded once, at its end
        if slot not in exact:  # otherwise the half value itself (a compare or cast sees it)
            wt = t.evolve(dtype="float32")
            name = f"{slot}{WIDE}" if slot not in unrounded else f"{slot}~rounded{WIDE}"
            out.append(Node(0, f"{node.instruction_id}~widen-{slot}", WIDEN, {}, (slot,), name,
                            (t,), wt, node.path))
            exact[slot] = (name, wt)
        return exact[slot]

    for node in nodes:
        if not _needs_widening(node, backend):
            out.append(node)
            continue
        slots, types = [], []
        for slot, t in zip(node.input_slots, node.input_types):
            if t.dtype in HALF_DTYPES:
                slot, t = float32_of(slot, t, node)
            slots.append(slot)
            types.append(t)
        result = node.output_type
        if result.dtype not in HALF_DTYPES:
            out.append(attrs.evolve(node, input_slots=tuple(slots), input_types=tuple(types)))
            continue
        wt = result.evolve(dtype="float32")
        wslot = node.output_slot + WIDE
        out.append(attrs.evolve(node, input_slots=tuple(slots), input_types=tuple(types),
                                output_slot=wslot, output_type=wt))
        out.append(Node(0, f"{node.instruction_id}~narrow", NARROW, {}, (wslot,), node.output_slot,
                        (wt,), result, node.path))
        unrounded[node.output_slot] = (wslot, wt)
    read = {s for n in out for s in n.input_slots} | set(outputs)
    kept = [n for n in out if n.atom is not NARROW or n.output_slot in read]
    return [attrs.evolve(n, index=i) for i, n in enumerate(kept)]
