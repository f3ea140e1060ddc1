"""Bank operands and bank stores (the built-in ``runtime.execution.banks`` plugin).

A bank value handed to ``run`` is a plain array (its identity is the program's) or a
:class:`BankOperand` carrying the identity of the asset it came from, which must equal the
binding's (SPEC §4). A *bank store* resolves every bank binding of a program from one file.

Key layout of a store file (safetensors or npz):

- a binding outside a bundle is the tensor named by its ``partition_id``, else by its binding
  ``name``;
- a bundle binding is stacked from one tensor per member, ``<partition_id>/<member_id>``, each
  of the binding's type without axis ``K``, stacked along ``K`` in ``member_ids`` order (at
  ``K``'s position in the axes). A single-member bundle whose type has no ``K`` may also be
  stored as a plain ``<partition_id>`` (or ``name``) tensor;
- optional metadata — safetensors ``__metadata__``, or an npz entry ``__metadata__`` holding a
  0-d string array of a JSON object — with string keys ``source_ref`` (the store then serves
  only bindings of that source) and ``asset_fingerprint`` (the asset the file holds).

Fingerprints: outside a bundle, ``asset_fingerprint`` is the sha256 of the tensor's C-order
bytes; for a bundle it names the asset the bundle comes from, which for a store is the sha256
of the whole store file's bytes. The store verifies the bundle fingerprint (hashing the file
once); ``runtime.execution.bindings.bind_values`` verifies per-tensor fingerprints of every bank value.
"""
from __future__ import annotations

import hashlib
import json
import os
import zipfile
from pathlib import Path
from typing import Any

import attrs
import numpy as np
from numpy.lib import format as npformat

from runtime.core.errors import FormulaError, fail
from runtime.plugins.hookspecs import hookimpl
from runtime.plan.memory import check_shape
from runtime.core.types import FLOAT_DTYPES as FLOATING, ITEMSIZE, formula_dtype

SAFETENSORS_DTYPES = {"F16": "float16", "BF16": "bfloat16", "F32": "float32", "F64": "float64",
                      "I64": "int64", "BOOL": "boolean"}
MAX_METADATA_BYTES = 1 << 20  # a JSON object of a few refs; more is a hostile header

MEMBER_AXIS = "K"
METADATA_KEY = "__metadata__"


def _member_ids(value: Any) -> tuple[str, ...]:
    if isinstance(value, str):  # a lone string would otherwise become a tuple of characters
        return (value,)
    return tuple(value)


@attrs.frozen(eq=False)
class BankOperand:
    """A bank value with the identity of the asset it came from (SPEC §4, §7)."""

    value: Any
    source_ref: str
    partition_id: str
    asset_fingerprint: str | None = None
    bundle_id: str | None = None
    member_ids: tuple[str, ...] = attrs.field(default=(), converter=_member_ids)

    def identity(self) -> dict[str, Any]:
        return {"source_ref": self.source_ref, "partition_id": self.partition_id,
                "asset_fingerprint": self.asset_fingerprint, "bundle_id": self.bundle_id,
                "member_ids": self.member_ids}


def binding_identity(binding) -> dict[str, Any]:
    """The identity fields of a bank binding, comparable with ``BankOperand.identity()``."""
    return {"source_ref": binding.source_ref, "partition_id": binding.partition_id,
            "asset_fingerprint": binding.asset_fingerprint, "bundle_id": binding.bundle_id,
            "member_ids": tuple(binding.member_ids)}


def tensor_fingerprint(array: np.ndarray) -> str:
    """sha256 of an array's C-order bytes (copies only if the array is not C-contiguous)."""
    c = np.ascontiguousarray(array)
    return hashlib.sha256(c.reshape(-1).view(np.uint8)).hexdigest()


def file_fingerprint(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 22), b""):
            h.update(chunk)
    return h.hexdigest()


class BankStore:
    """A file of bank tensors; ``resolve_bank`` turns a bank binding into a BankOperand.

    Subclasses provide ``keys()`` and ``_load(key)``; ``bind_values`` recognises any object
    with a ``resolve_bank(binding, path, verify=True)`` method as a store."""

    format = "store"

    def __init__(self, path: Path, metadata: dict[str, str]):
        self.path = path
        self.metadata = metadata
        self._file_fingerprint: str | None = None

    def keys(self) -> list[str]:
        raise NotImplementedError

    def _load(self, key: str, path: str = "$.banks") -> np.ndarray:
        raise NotImplementedError

    def header(self, key: str, path: str = "$.banks") -> tuple[tuple[int, ...], str | None] | None:
        """(shape, formula dtype or None) of a tensor read from the file's header without its
        data, or None when the format cannot tell (then only the loaded value is checked)."""
        return None

    def _checked_load(self, binding, key: str, path: str, limits, member: bool = False) -> np.ndarray:
        """``_load(key)`` after its header matches the binding (rank, static extents, dtype)
        and the limits, so a small file declaring a huge tensor is never inflated."""
        head = self.header(key, path)
        if head is not None:
            shape, dtype = head
            t = binding.value_type
            sizes = [z for a, z in zip(t.axes, t.sizes) if not (member and a == MEMBER_AXIS)]
            where = f"tensor {key!r} of bank {binding.name!r} in {str(self.path)!r}"
            if len(shape) != len(sizes) or any(isinstance(z, int) and z != e for z, e in zip(sizes, shape)):
                fail("binding_shape", path, f"{where} has shape {list(shape)} in the file's header; "
                                            f"expected {t.describe()}" + (" without axis K" if member else ""))
            want = t.dtype
            if dtype is None or (dtype != want and not (want == "floating" and dtype in FLOATING)):
                fail("binding_dtype", path, f"{where} has dtype {dtype or 'unsupported'} in the file's "
                                            f"header; expected {want}")
            if limits is not None:  # a bundle's members stack along K: count them all
                stacked = ((len(binding.member_ids),) if member else ()) + tuple(shape)
                axes = ((MEMBER_AXIS,) if member else ()) + tuple(a for a in t.axes if not (member and a == MEMBER_AXIS))
                check_shape(where, axes, stacked, ITEMSIZE[dtype], limits, path)
        return self._load(key, path)

    def __repr__(self) -> str:
        return f"<{type(self).__name__} {str(self.path)!r}: {len(self.keys())} tensors>"

    @property
    def fingerprint(self) -> str:
        """sha256 of the store file, computed once."""
        if self._file_fingerprint is None:
            self._file_fingerprint = file_fingerprint(self.path)
        return self._file_fingerprint

    def resolve_bank(self, binding, path: str, verify: bool = True, limits=None) -> BankOperand:
        """The operand for ``binding`` with full identity; ``verify`` also checks a per-tensor
        fingerprint (``bind_values`` passes False because it verifies every value itself).
        Each tensor's header is checked against the binding and ``limits`` before its data
        is read."""
        declared = self.metadata.get("source_ref")
        if declared is not None and declared != binding.source_ref:
            fail("bank_identity", path,
                 f"bank store {str(self.path)!r} holds source {declared!r}, but binding "
                 f"{binding.name!r} expects source {binding.source_ref!r}")
        asset = self.metadata.get("asset_fingerprint")
        if asset is not None and binding.asset_fingerprint is not None \
                and binding.bundle_id is not None and asset != binding.asset_fingerprint:
            fail("bank_identity", path,
                 f"bank store {str(self.path)!r} declares asset {asset}, but binding "
                 f"{binding.name!r} expects asset {binding.asset_fingerprint}")
        if binding.bundle_id is None:
            value = self._checked_load(binding, self._find(binding, (binding.partition_id, binding.name), path),
                                       path, limits)
            if verify and binding.asset_fingerprint is not None:
                got = tensor_fingerprint(value)
                if got != binding.asset_fingerprint:
                    fail("bank_identity", path,
                         f"tensor for bank {binding.name!r} in {str(self.path)!r} has sha256 "
                         f"{got}, but the binding's asset_fingerprint is {binding.asset_fingerprint}")
        else:
            value = self._bundle_value(binding, path, limits)
            if binding.asset_fingerprint is not None and self.fingerprint != binding.asset_fingerprint:
                fail("bank_identity", path,
                     f"bank store file {str(self.path)!r} has sha256 {self.fingerprint}, but "
                     f"bundle {binding.bundle_id!r} expects asset {binding.asset_fingerprint}")
        return BankOperand(value, **binding_identity(binding))

    def _bundle_value(self, binding, path: str, limits=None) -> np.ndarray:
        t = binding.value_type
        keys = set(self.keys())
        member_keys = [f"{binding.partition_id}/{m}" for m in binding.member_ids]
        if MEMBER_AXIS not in t.axes and len(member_keys) == 1 and member_keys[0] not in keys:
            return self._checked_load(binding, self._find(binding, (binding.partition_id, binding.name), path),
                                      path, limits)
        missing = [k for k in member_keys if k not in keys]
        if missing:
            fail("binding_keys", path,
                 f"bank store {str(self.path)!r} lacks member tensors {missing} of bundle "
                 f"{binding.bundle_id!r} for bank {binding.name!r}{self._has()}")
        members = [self._checked_load(binding, k, path, limits, member=MEMBER_AXIS in t.axes)
                   for k in member_keys]
        if MEMBER_AXIS not in t.axes:
            return members[0]
        shapes = {m.shape for m in members}
        dtypes = {m.dtype for m in members}
        if len(shapes) != 1 or len(dtypes) != 1:
            fail("binding_shape", path,
                 f"member tensors of bank {binding.name!r} in {str(self.path)!r} differ in "
                 f"shape or dtype: {[(k, m.shape, str(m.dtype)) for k, m in zip(member_keys, members)]}")
        axis = t.axes.index(MEMBER_AXIS)
        if members[0].ndim != t.rank - 1:
            fail("binding_shape", path,
                 f"member tensors of bank {binding.name!r} have rank {members[0].ndim}; expected "
                 f"{t.rank - 1} (the type {t.describe()} without axis {MEMBER_AXIS})")
        return np.stack(members, axis=axis)

    def _find(self, binding, candidates, path: str) -> str:
        keys = set(self.keys())
        for key in candidates:
            if key in keys:
                return key
        fail("binding_keys", path,
             f"bank store {str(self.path)!r} has no tensor for bank {binding.name!r} "
             f"(looked for {list(dict.fromkeys(candidates))}){self._has()}")

    def _has(self) -> str:
        keys = sorted(k for k in self.keys() if k != METADATA_KEY)
        shown = ", ".join(keys[:12]) + (", …" if len(keys) > 12 else "")
        return f"; it has: {shown or 'no tensors'}"


class SafetensorsStore(BankStore):
    """A ``.safetensors`` file read lazily with ``safe_open(framework='numpy')`` (no torch)."""

    format = "safetensors"

    def __init__(self, path: Path):
        from safetensors import safe_open

        try:
            with safe_open(str(path), framework="numpy") as f:
                self._keys = list(f.keys())
                metadata = dict(f.metadata() or {})
        except Exception as exc:  # safetensors raises its own error types for bad headers
            fail("bank_store", "$.banks",
                 f"cannot read safetensors file {str(path)!r}: {type(exc).__name__}: {exc}")
        super().__init__(path, metadata)

    def keys(self) -> list[str]:
        return list(self._keys)

    def _load(self, key: str, path: str = "$.banks") -> np.ndarray:
        from safetensors import safe_open

        try:
            with safe_open(str(self.path), framework="numpy") as f:
                return f.get_tensor(key)
        except Exception as exc:
            fail("bank_store", path,
                 f"cannot read tensor {key!r} from {str(self.path)!r}: {type(exc).__name__}: {exc}")


    def header(self, key: str, path: str = "$.banks") -> tuple[tuple[int, ...], str | None]:
        from safetensors import safe_open

        try:
            with safe_open(str(self.path), framework="numpy") as f:
                sl = f.get_slice(key)
                return tuple(int(e) for e in sl.get_shape()), SAFETENSORS_DTYPES.get(sl.get_dtype())
        except Exception as exc:
            fail("bank_store", path,
                 f"cannot read the header of tensor {key!r} in {str(self.path)!r}: {type(exc).__name__}: {exc}")


class NpzStore(BankStore):
    """A ``.npz`` archive read with ``np.load(allow_pickle=False)``."""

    format = "npz"

    def __init__(self, path: Path):
        try:
            with np.load(path, allow_pickle=False) as z:
                self._keys = list(z.files)
                raw = None
                if METADATA_KEY in z.files:
                    shape, dtype = npy_header(path, METADATA_KEY)
                    if shape != () or dtype.itemsize > MAX_METADATA_BYTES:
                        fail("bank_store", "$.banks", f"{METADATA_KEY} in {str(path)!r} must be a 0-d string "
                                                      f"array of at most {MAX_METADATA_BYTES} bytes, got "
                                                      f"{dtype}{list(shape)}")
                    raw = z[METADATA_KEY]
        except FormulaError:
            raise
        except Exception as exc:
            fail("bank_store", "$.banks",
                 f"cannot read npz file {str(path)!r}: {type(exc).__name__}: {exc}")
        super().__init__(path, _npz_metadata(raw, path))

    def keys(self) -> list[str]:
        return [k for k in self._keys if k != METADATA_KEY]

    def header(self, key: str, path: str = "$.banks") -> tuple[tuple[int, ...], str | None]:
        try:
            shape, dtype = npy_header(self.path, key)
        except Exception as exc:
            fail("bank_store", path,
                 f"cannot read the header of array {key!r} in {str(self.path)!r}: {type(exc).__name__}: {exc}")
        if dtype.hasobject:
            fail("bank_store", path, f"array {key!r} in {str(self.path)!r} holds Python objects (a pickle), "
                                     "which are never loaded; expected a numeric array")
        return shape, formula_dtype(dtype)

    def _load(self, key: str, path: str = "$.banks") -> np.ndarray:
        try:
            with np.load(self.path, allow_pickle=False) as z:
                return z[key]
        except Exception as exc:
            fail("bank_store", path,
                 f"cannot read array {key!r} from {str(self.path)!r}: {type(exc).__name__}: {exc}")


def npy_header(path: Path, key: str) -> tuple[tuple[int, ...], np.dtype]:
    """The shape and dtype of an npz member from its .npy header (the data stays compressed)."""
    with zipfile.ZipFile(path) as zf:
        names = set(zf.namelist())
        member = f"{key}.npy" if f"{key}.npy" in names else key
        with zf.open(member) as f:
            version = npformat.read_magic(f)
            if version == (1, 0):
                shape, _, dtype = npformat.read_array_header_1_0(f)
            elif version == (2, 0):
                shape, _, dtype = npformat.read_array_header_2_0(f)
            else:
                raise ValueError(f"unsupported .npy format version {version}")
    return tuple(shape), dtype


def _npz_metadata(raw, path: Path) -> dict[str, str]:
    if raw is None:
        return {}
    try:
        data = json.loads(str(raw[()]))
    except (ValueError, TypeError, IndexError) as exc:
        fail("bank_store", "$.banks",
             f"{METADATA_KEY} in {str(path)!r} must be a 0-d string array holding a JSON object: {exc}")
    if not isinstance(data, dict) or not all(isinstance(v, str) for v in data.values()):
        fail("bank_store", "$.banks",
             f"{METADATA_KEY} in {str(path)!r} must be a JSON object of strings, got {data!r}")
    return data


def _suffix_opener(suffix: str, cls):
    def opener(location):
        if not isinstance(location, (str, os.PathLike)):
            return None
        path = Path(location)
        if path.suffix.lower() != suffix:
            return None
        if not path.is_file():
            fail("bank_store", "$.banks", f"bank store file {str(path)!r} does not exist")
        return cls(path)

    opener.__name__ = opener.__qualname__ = f"open_{suffix[1:]}"
    opener.__doc__ = f"Open ``*{suffix}`` files as {cls.__name__}."
    return opener


open_safetensors = _suffix_opener(".safetensors", SafetensorsStore)
open_npz = _suffix_opener(".npz", NpzStore)


@hookimpl(trylast=True)  # after every third-party opener: they may claim these suffixes too
def formula_open_bank_store(location):
    for opener in (open_safetensors, open_npz):
        store = opener(location)
        if store is not None:
            return store
    return None
