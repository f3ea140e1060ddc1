"""Named-axis tensor types and the dtype vocabulary shared by the loader, atoms and backends."""
from __future__ import annotations

import re
from collections.abc import Mapping

import attrs
import numpy as np

NAME_RE = re.compile(r"^[A-Za-z][A-Za-z0-9_]*$")  # axes and size symbols
BINDING_NAME_RE = re.compile(r"^[A-Za-z][A-Za-z0-9_.-]*$")  # bindings and member ids

FLOAT_DTYPES = ("float16", "bfloat16", "float32", "float64")
HALF_DTYPES = ("float16", "bfloat16")  # Numba has no type of either: kernels move their raw bits
DTYPES = ("floating",) + FLOAT_DTYPES + ("int64", "boolean")

# what an atom may declare an operand accepts (AtomSpec.dtypes; "a|b" joins two classes)
DTYPE_CLASSES = {
    "floating": ("floating",) + FLOAT_DTYPES,
    "int64": ("int64",),
    "boolean": ("boolean",),
    "numeric": ("floating",) + FLOAT_DTYPES + ("int64",),
    "coordinate": FLOAT_DTYPES + ("int64",),  # position atoms: a concrete float or int64
    "any": DTYPES,
}


def dtype_class_members(expr: str) -> tuple[str, ...]:
    """The dtypes a class expression such as ``"floating|boolean"`` admits (KeyError if unknown)."""
    members = {d for part in expr.split("|") for d in DTYPE_CLASSES[part]}
    return tuple(d for d in DTYPES if d in members)


Size = int | str  # a static extent, or a symbol bound once per run

# bytes per element of each concrete dtype: the one table (bfloat16 needs no ml_dtypes here)
ITEMSIZE = {"float16": 2, "bfloat16": 2, "float32": 4, "float64": 8, "int64": 8, "boolean": 1}


def is_float(dtype: str) -> bool:
    return dtype == "floating" or dtype in FLOAT_DTYPES


def numpy_dtype(dtype: str) -> np.dtype:
    """The NumPy dtype of a concrete formula dtype (bfloat16 needs ml_dtypes)."""
    if dtype == "boolean":
        return np.dtype(np.bool_)
    if dtype == "bfloat16":
        try:
            import ml_dtypes  # optional: only programs that use bfloat16 need it
        except ImportError:
            from runtime.core.errors import fail

            fail("backend_unavailable", "$", "bfloat16 values need the ml_dtypes package "
                 "(pip install 'formula-runtime[bfloat16]')")
        return np.dtype(ml_dtypes.bfloat16)
    return np.dtype(dtype)


def formula_dtype(dt: np.dtype) -> str | None:
    """The formula dtype name of a NumPy dtype, or None if the format has no such dtype."""
    try:
        return _FORMULA_DTYPES[dt]
    except (KeyError, TypeError):  # TypeError: an unhashable dtype-like
        pass
    name = _formula_dtype(np.dtype(dt))
    if isinstance(dt, np.dtype):
        _FORMULA_DTYPES[dt] = name  # called for every bound value on every run: memoise
    return name


_FORMULA_DTYPES: dict[np.dtype, str | None] = {}


def _formula_dtype(dt: np.dtype) -> str | None:
    if dt == np.bool_:
        return "boolean"
    if dt.name in FLOAT_DTYPES or dt.name == "int64":
        return dt.name
    return None


def accumulation_dtype(dtype: str, accumulation: str) -> str:
    """SPEC §3 `acc`: 'activation' computes in the operand dtype, 'float32' in float32 (float64 stays)."""
    if accumulation == "activation" or dtype in ("float64", "int64", "boolean"):
        return dtype
    return "float32"


@attrs.frozen
class TensorType:
    """A named-axis type. Sizes are ints or symbols; `dtype` may be 'floating' until run time."""

    axes: tuple[str, ...]
    sizes: tuple[Size, ...]
    dtype: str
    domain: str
    schema_ref: str = "arti/formula-tensor-type@1"

    @property
    def rank(self) -> int:
        return len(self.axes)

    def size_of(self, axis: str) -> Size:
        return self.sizes[self.axes.index(axis)]

    @property
    def is_static(self) -> bool:
        return str not in map(type, self.sizes)  # (sizes are ints or symbols; asked per node per plan)

    @property
    def shape(self) -> tuple[int, ...]:
        """The concrete shape; only for resolved types."""
        if not self.is_static:
            raise ValueError(f"type {self} has symbolic sizes")
        sizes = self.sizes
        return sizes if type(sizes) is tuple else tuple(sizes)  # type: ignore[return-value]

    @property
    def elements(self) -> int:
        n = 1
        for s in self.shape:
            n *= s
        return n

    @property
    def nbytes(self) -> int:
        return self.elements * ITEMSIZE[self.dtype]

    def evolve(self, **changes) -> "TensorType":
        # (built directly: attrs.evolve reads the class's fields on every call, and planning a
        # new extent evolves a type per instruction)
        get = changes.pop
        evolved = TensorType(get("axes", self.axes), get("sizes", self.sizes), get("dtype", self.dtype),
                             get("domain", self.domain), get("schema_ref", self.schema_ref))
        if changes:
            raise TypeError(f"TensorType has no fields {sorted(changes)}")
        return evolved

    def resolve(self, dims: Mapping[str, int], dtype: str | None = None) -> "TensorType":
        """Substitute known symbols (and a concrete dtype for 'floating')."""
        sizes = tuple(dims.get(s, s) if isinstance(s, str) else s for s in self.sizes)
        return TensorType(self.axes, sizes, dtype or self.dtype, self.domain, self.schema_ref)

    def same_as(self, other: "TensorType") -> bool:
        """Equal as types (the schema_ref spelling does not matter)."""
        return (self.axes, self.sizes, self.dtype, self.domain) == (
            other.axes, other.sizes, other.dtype, other.domain)

    def describe(self) -> str:
        dims = ", ".join(f"{a}={s}" for a, s in zip(self.axes, self.sizes))
        return f"{self.dtype}[{dims}]@{self.domain}"

    def __str__(self) -> str:
        return self.describe()


def extents_compatible(a: Size, b: Size) -> bool:
    """Could two extents be equal? Only two different static ints certainly differ."""
    if isinstance(a, int) and isinstance(b, int):
        return a == b
    if isinstance(a, str) and isinstance(b, str):
        return True  # two symbols may be bound to one extent
    return True


def dtypes_compatible(a: str, b: str) -> bool:
    if a == b:
        return True
    return {a, b} <= set(FLOAT_DTYPES + ("floating",)) and "floating" in (a, b)
