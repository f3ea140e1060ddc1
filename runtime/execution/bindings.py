"""Run-time binding checks (SPEC §4): the values a run gets, checked before anything runs.

``bind_values`` turns the caller's ``inputs`` and ``banks`` into host arrays keyed by binding
name, with the extent of every size symbol. It never modifies a caller array and copies only
for a conversion: a Python number for a 0-d binding, a non-native byte order, a bundle stacked
by a store. Choices the SPEC leaves open:

- a list, tuple or other non-array object is ``binding_dtype`` (it has no dtype; the message
  says to pass ``np.asarray(value, dtype=...)``); a Python number for a binding of rank > 0 is
  ``binding_shape``;
- a Python number for a 0-d ``floating`` binding takes the float dtype of the other
  ``floating`` values of the run if they agree on one, else float64;
- ``banks`` may be a Mapping or a bank store (any object with ``resolve_bank``, see
  ``runtime.execution.banks``), which then resolves every bank binding.
"""
from __future__ import annotations

import math
import numbers
from types import MappingProxyType
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import attrs
import numpy as np

from runtime.kernels.arrays import is_device_array
from runtime.kernels.finite import all_finite, blas_all_finite, device_all_finite
from runtime.execution.banks import BankOperand, BankStore, binding_identity, tensor_fingerprint
from runtime.core.errors import FormulaError, fail
from runtime.plan.memory import check_shape, check_working
from runtime.execution.resident import ResidentBanks, owned_copy
from runtime.core.types import FLOAT_DTYPES, formula_dtype, numpy_dtype

INT64_MIN, INT64_MAX = -(2**63), 2**63 - 1
NO_RESIDENT: Mapping[str, Any] = MappingProxyType({})


@attrs.define
class BoundValues:
    """Checked host arrays by binding name, the extent of each symbol, and their total bytes.
    One per run, made on every run's hot path: a plain attrs class, cheaper to construct than
    a frozen one; nothing changes it after it is made."""

    values: dict[str, np.ndarray]
    dims: dict[str, int]
    binding_bytes: int
    structure: tuple | None = None  # set by Binder's fast path: names, dtypes, shapes as last run
    unchecked: frozenset[str] = frozenset()  # float values whose finiteness a kernel checks
    resident: Mapping[str, Any] = NO_RESIDENT  # resident banks: their values on the backend


def bind_values(program, inputs: Mapping[str, Any] | None, banks: Any,
                memory_limit: int | None = None, whole_working: bool = True,
                check_finite: bool = True) -> BoundValues:
    """Check ``inputs``/``banks`` against the program's bindings (every SPEC §4 rule).
    Resident banks (``runtime.execution.resident``) were checked when loaded: only the inputs are,
    with the extents the banks fix. Shapes, dtypes and every limit (the program's and the
    runtime's ``memory_limit``) are checked for all values before any pass over their data.
    ``whole_working=False`` (a chunked run, which preflights each slice instead): the values
    together are not held to ``max_working_bytes`` and the ceiling. ``check_finite=False``: the
    finiteness of host float arrays is left to the caller (named in ``unchecked``), who checks
    those that the plan's kernels do not count as they read them (``Executor._run_bound``)."""
    inputs = _mapping(inputs, "$.inputs", "inputs")
    unchecked: set[str] | None = None if check_finite else set()
    resident = banks if isinstance(banks, ResidentBanks) else None
    symbols = _Symbols()
    if resident is not None:
        resident.check_signature(program)
        _check_keys(program, inputs, program.input_bindings, "$.inputs", "input")
        symbols.dims.update(resident.dims)
        symbols.where.update(resident.where)
        floating = [v.dtype for name, v in resident.owned.items()
                    if program.binding(name).value_type.dtype == "floating"]
        values = _check_all(program.input_bindings, inputs, (None, {}), symbols, floating,
                            program.limits, memory_limit, resident.owned.values(), whole_working, unchecked)
        values.update(resident.owned)
    else:
        source = _bank_source(banks)
        _check_keys(program, inputs, program.input_bindings, "$.inputs", "input")
        _check_bank_keys(program, source)
        values = _check_all(program.bindings, inputs, source, symbols, (), program.limits, memory_limit,
                            whole_working=whole_working, unchecked=unchecked)
    ordered = {b.name: values[b.name] for b in program.bindings}
    return BoundValues(ordered, dict(symbols.dims), sum(a.nbytes for a in ordered.values()),
                       unchecked=frozenset(unchecked or ()),
                       resident=resident.on_backend if resident is not None else NO_RESIDENT)


def bind_banks(program, banks: Any, memory_limit: int | None = None) -> tuple[BoundValues, dict[str, str]]:
    """The bank bindings alone checked (for ``runtime.execution.resident``), and where each symbol
    they fix was bound. A Python number for a 0-d ``floating`` bank takes the float dtype of
    the other banks here (there are no inputs to agree with)."""
    if isinstance(banks, ResidentBanks):
        banks = dict(banks.owned)  # loaded again: checked again, like any mapping
    source = _bank_source(banks)
    _check_bank_keys(program, source)
    symbols = _Symbols()
    values = _check_all(program.bank_bindings, {}, source, symbols, (), program.limits, memory_limit)
    ordered = {b.name: values[b.name] for b in program.bank_bindings}
    return BoundValues(ordered, dict(symbols.dims), sum(a.nbytes for a in ordered.values())), \
        dict(symbols.where)


def _bank_source(banks: Any) -> tuple[Any, Mapping]:
    """(store, mapping): a bank store resolves every bank binding, else the mapping does."""
    if _is_store(banks):
        return banks, {}
    return None, _mapping(banks, "$.banks", "banks")


def _check_bank_keys(program, source) -> None:
    if source[0] is None:
        _check_keys(program, source[1], program.bank_bindings, "$.banks", "bank")


def _check_all(bindings, inputs: Mapping, source, symbols: "_Symbols",
               floating_known: Sequence[np.dtype], limits, memory_limit: int | None,
               bound_before=(), whole_working: bool = True,
               unchecked: set[str] | None = None) -> dict[str, np.ndarray]:
    """Every value of ``bindings`` checked. ``floating_known``: the dtypes of the run's
    ``floating`` values checked before (they count for the dtype a Python number takes).
    Two phases: rank, extents, dtype and every size limit for all values, then the passes
    over data (byte order, finiteness, fingerprints), so a value declaring 2³¹ elements is
    refused for its size before anything reads it. ``bound_before``: values bound already
    (resident banks) that count toward the working bytes. ``unchecked``: a set to collect the
    host float arrays whose finiteness is left to the caller; None checks every one here."""
    store, bank_map = source
    arrays: dict[str, tuple[Any, np.ndarray, str]] = {}
    deferred: list[tuple[Any, Any, str]] = []  # Python numbers for 0-d 'floating' bindings
    for b in bindings:
        path = f"$.{'inputs' if b.kind == 'input' else 'banks'}.{b.name}"
        if b.kind == "input":
            raw = inputs[b.name]
            if isinstance(raw, BankOperand):
                fail("binding_dtype", path,
                     f"input {b.name!r} got a BankOperand; operands are for bank bindings, "
                     f"pass the array itself")
        else:
            raw = _resolve(store, b, path, limits) if store is not None else bank_map[b.name]
            raw = _unwrap_operand(b, raw, path)
        if _is_number(raw) and b.value_type.dtype == "floating" and b.value_type.rank == 0:
            deferred.append((b, raw, path))
            continue
        a = _check_structure(b, raw, path, symbols)
        _check_size(b, a, path, limits)
        arrays[b.name] = (b, a, path)
    total = sum(a.nbytes for _, a, _ in arrays.values()) + sum(a.nbytes for a in bound_before)
    if whole_working:
        check_working(total, limits, memory_limit, "the bound values alone")
    values = {name: _check_data(b, a, path, unchecked) for name, (b, a, path) in arrays.items()}

    if deferred:
        floats = {b.name for b in bindings if b.value_type.dtype == "floating"}
        seen = {v.dtype for name, v in values.items() if name in floats}
        seen.update(floating_known)
        dtype = seen.pop() if len(seen) == 1 else np.dtype(np.float64)
        for b, raw, path in deferred:
            a = _check_structure(b, _number(b, raw, path, dtype), path, symbols)
            values[b.name] = _check_data(b, a, path)
    return values


def _check_size(binding, a, path: str, limits) -> None:
    check_shape(repr(binding.name), binding.value_type.axes, a.shape, a.dtype.itemsize, limits, path)


# --- arguments ---------------------------------------------------------------------------
def _mapping(value: Any, path: str, what: str) -> Mapping:
    if value is None:
        return {}
    if not isinstance(value, Mapping):
        fail("schema", path, f"{what} must be a mapping of binding name to value, "
                             f"got {type(value).__name__}")
    return value


def _is_store(banks: Any) -> bool:
    return banks is not None and not isinstance(banks, Mapping) and \
        callable(getattr(banks, "resolve_bank", None))


def _check_keys(program, given: Mapping, expected, path: str, kind: str) -> None:
    names = [b.name for b in expected]
    missing = [n for n in names if n not in given]
    extra = [k for k in given if k not in names]
    if not missing and not extra:
        return
    parts = []
    if missing:
        parts.append(f"missing {kind} bindings {missing}")
    if extra:
        other = "banks" if kind == "input" else "inputs"
        moved = [k for k in extra if any(b.name == k and b.kind != kind for b in program.bindings)]
        hint = f" ({', '.join(map(repr, moved))}: pass in {other})" if moved else ""
        parts.append(f"unexpected names {extra}{hint}")
    fail("binding_keys", path,
         f"{' and '.join(parts)}; the program's {kind} bindings are {names}")


def _resolve(store, binding, path: str, limits=None):
    try:
        if isinstance(store, BankStore):  # a built-in store checks headers before reading data
            return store.resolve_bank(binding, path, verify=False, limits=limits)
        return store.resolve_bank(binding, path, verify=False)
    except FormulaError:
        raise
    except Exception as exc:  # a third-party store must not leak its own exception types
        raise FormulaError("bank_store", path,
                           f"bank store {store!r} failed to resolve bank {binding.name!r}: "
                           f"{type(exc).__name__}: {exc}") from exc


def _unwrap_operand(binding, raw: Any, path: str) -> Any:
    if not isinstance(raw, BankOperand):
        return raw  # a plain value: its identity is the program's
    want = binding_identity(binding)
    got = raw.identity()
    for field in ("source_ref", "partition_id", "bundle_id", "member_ids", "asset_fingerprint"):
        if got[field] != want[field]:
            fail("bank_identity", path,
                 f"bank {binding.name!r}: operand {field} {_show(got[field])} differs from "
                 f"the binding's {_show(want[field])}")
    return raw.value


def _show(v: Any) -> str:
    return repr(list(v)) if isinstance(v, tuple) else repr(v)


# --- values ------------------------------------------------------------------------------
def _is_number(raw: Any) -> bool:
    return isinstance(raw, (bool, numbers.Real)) and not isinstance(raw, (np.generic, np.ndarray))


def _check_structure(binding, raw: Any, path: str, symbols: "_Symbols") -> np.ndarray:
    """Rank, extents, symbols and dtype: nothing that reads the values."""
    t = binding.value_type
    a = _as_array(binding, raw, path)
    if a.ndim != t.rank:
        fail("binding_shape", path,
             f"{binding.name!r} has rank {a.ndim} (shape {a.shape}); expected rank {t.rank}: "
             f"{t.describe()}")
    for axis, size, extent in zip(t.axes, t.sizes, a.shape):
        if extent == 0:
            fail("binding_shape", path, f"axis {axis} of {binding.name!r} is empty (shape {a.shape})")
        if isinstance(size, int) and extent != size:
            fail("binding_shape", path,
                 f"axis {axis} of {binding.name!r} has extent {extent}; expected {size} "
                 f"(shape {a.shape}, type {t.describe()})")
        if isinstance(size, str):
            symbols.bind(size, extent, f"{path} axis {axis}", path)
    got = formula_dtype(a.dtype)
    ok = got in FLOAT_DTYPES if t.dtype == "floating" else got == t.dtype
    if not ok:
        want = "any float dtype (float16, bfloat16, float32, float64)" if t.dtype == "floating" \
            else t.dtype
        fail("binding_dtype", path,
             f"{binding.name!r} has dtype {a.dtype}; expected {want} (values are never cast "
             f"implicitly)")
    return a


def _check_data(binding, a, path: str, unchecked: set[str] | None = None) -> np.ndarray:
    """The passes over the data: byte order, finiteness (left to the caller for a host array
    when ``unchecked`` collects names), the asset fingerprint."""
    got = formula_dtype(a.dtype)
    if not a.dtype.isnative:  # kernels read native byte order; converting keeps every value
        a = a.astype(a.dtype.newbyteorder("="))
    if got in FLOAT_DTYPES and unchecked is not None and isinstance(a, np.ndarray) and a.ndim:
        unchecked.add(binding.name)
    elif got in FLOAT_DTYPES and not _all_finite(a):
        host = a.copy_to_host() if is_device_array(a) else a  # only to name the bad element
        bad = ~_isfinite(host)
        a = host
        index = tuple(int(i) for i in np.argwhere(bad)[0])
        fail("nonfinite", path,
             f"{binding.name!r} holds {a[index].item()!r} at index {list(index)} "
             f"({int(bad.sum())} non-finite values); floating values must be finite")
    if binding.kind == "bank" and binding.bundle_id is None and binding.asset_fingerprint is not None:
        digest = tensor_fingerprint(a.copy_to_host() if is_device_array(a) else a)
        if digest != binding.asset_fingerprint:
            fail("bank_identity", path,
                 f"bank {binding.name!r}: sha256 of the value's C-order bytes is {digest}, but "
                 f"the binding's asset_fingerprint is {binding.asset_fingerprint}")
    return a


def _as_array(binding, raw: Any, path: str) -> np.ndarray:
    if isinstance(raw, np.ma.MaskedArray):
        fail("binding_dtype", path,
             f"{binding.name!r} is a masked array; pass plain values (e.g. .filled(...))")
    if isinstance(raw, np.ndarray):
        return raw if type(raw) is np.ndarray else raw.view(np.ndarray)
    if is_device_array(raw):  # CUDA array interface (numba, CuPy, PyTorch): wrapped, not copied
        from numba import cuda

        return cuda.as_cuda_array(raw) if hasattr(cuda, "as_cuda_array") else raw  # simulator: as is
    if isinstance(raw, np.generic):
        return np.asarray(raw)
    if _is_number(raw):
        t = binding.value_type
        if t.rank != 0:
            fail("binding_shape", path,
                 f"{binding.name!r} got the number {raw!r}; expected an array of rank {t.rank}: "
                 f"{t.describe()}")
        return _number(binding, raw, path, numpy_dtype(t.dtype))
    # a torch CPU tensor is the common case (arti's callers): its view costs no copy
    how = "tensor.numpy() (a view, no copy; .detach() first if it requires grad) or " \
          "np.from_dlpack(tensor)" if type(raw).__module__.split(".")[0] == "torch" else \
          "np.asarray(value, dtype=...)"
    fail("binding_dtype", path,
         f"{binding.name!r} got a {type(raw).__name__}; expected a NumPy array of "
         f"{binding.value_type.describe()} (use {how})")


def _number(binding, raw: Any, path: str, dtype: np.dtype) -> np.ndarray:
    """A Python number as a 0-d array of the declared dtype, refusing lossy conversions."""
    name = formula_dtype(dtype)
    kind = "bool" if isinstance(raw, bool) else "int" if isinstance(raw, numbers.Integral) else "float"
    allowed = {"boolean": ("bool",), "int64": ("int",)}.get(name, ("int", "float"))
    if kind not in allowed:
        fail("binding_dtype", path,
             f"{binding.name!r} got the {kind} {raw!r}; a {name} binding takes "
             f"{' or '.join(allowed)} numbers")
    if name == "int64" and not INT64_MIN <= int(raw) <= INT64_MAX:
        fail("binding_dtype", path, f"{binding.name!r}: {raw!r} does not fit int64")
    try:
        with np.errstate(over="ignore", invalid="ignore"):
            a = np.array(raw, dtype=dtype)
    except OverflowError:
        fail("nonfinite", path, f"{binding.name!r}: {raw!r} overflows {name}")
    if kind != "bool" and name != "int64" and np.isfinite(float(raw)) and not np.isfinite(a):
        fail("nonfinite", path, f"{binding.name!r}: {raw!r} overflows {name} (becomes {float(a)})")
    return a


def _isfinite(a: np.ndarray) -> np.ndarray:
    try:
        return np.isfinite(a)
    except TypeError:  # an extension float type without an isfinite loop
        return np.isfinite(a.astype(np.float32))


def value_is_finite(a) -> bool:
    """Whether a bound value (host or device array) holds only finite values."""
    return _all_finite(a)


def _all_finite(a: np.ndarray) -> bool:
    """One pass: a finite sum proves every element finite (NaN and ±inf propagate); only an
    overflowing sum or an exotic dtype falls back to an elementwise check."""
    if not isinstance(a, np.ndarray):
        return device_all_finite(a)
    if a.ndim == 0 and a.dtype.char in "fd":
        return math.isfinite(a.item())
    fast = all_finite(a)
    if fast is None:
        fast = blas_all_finite(a)  # (while the compiled scan is not built: the first tier)
    if fast is not None:
        return fast
    if a.size < 1024:
        return bool(_isfinite(a).all())
    if a.dtype in (np.float32, np.float64, np.float16):
        acc = np.float32 if a.dtype == np.float16 else a.dtype
        with np.errstate(all="ignore"):
            if np.isfinite(np.add.reduce(a, axis=None, dtype=acc)):
                return True
    return bool(_isfinite(a).all())


class Binder:
    """``bind_values`` for one program, with a fast path for repeated runs.

    It remembers the structure of the last run whose values passed every check: binding
    names, plain NumPy arrays (or scalars), their dtypes and shapes. A run with that same
    structure has the same symbol extents and passes every rank/extent/dtype/key rule by
    construction, so only what the structure does not decide is checked again: finiteness.
    Anything else (a bank store, operands, Python numbers, fingerprints to verify, or any
    failure) takes the full path, which also produces the precise error."""

    def __init__(self, program, deferred: Callable[[tuple], frozenset[str] | None] = lambda structure: frozenset(),
                 memory_limit: int | None = None):
        """``memory_limit``: the runtime ceiling the bound values must fit (before any pass
        over them). ``deferred(structure)``: the float bindings whose finiteness, for runs of that
        structure, the kernels check themselves (the executor then calls :meth:`check_finite`);
        None while that is not known yet (no plan for the structure)."""
        self.program = program
        self.memory_limit = memory_limit
        self._deferred = deferred
        self._order = tuple((b.name, b.kind == "input", b.value_type.dtype in FLOAT_DTYPES
                             or b.value_type.dtype == "floating") for b in program.bindings)
        self._counts = (len(program.input_bindings), len(program.bank_bindings))
        self._eligible = not any(b.kind == "bank" and b.bundle_id is None and b.asset_fingerprint
                                 is not None for b in program.bindings)
        # the last structure, its values, and (once the executor has a plan for it) the
        # deferred names with the positions of the float values the fast path checks itself
        self._last: tuple[tuple, BoundValues, list] | None = None

    def check_finite(self, bound: BoundValues, names, inputs: Any, banks: Any) -> None:
        """Raise the full path's precise ``nonfinite`` error if any of ``names`` is not finite."""
        for name in names:
            if not _all_finite(bound.values[name]):
                bind_values(self.program, inputs, banks, self.memory_limit)  # names the value and the index
                kind = "inputs" if self.program.binding(name).kind == "input" else "banks"
                fail("nonfinite", f"$.{kind}.{name}", f"{name!r} holds non-finite values "
                     "(it changed while the run read it)")

    def bind(self, inputs: Any, banks: Any) -> BoundValues:
        resident = banks if isinstance(banks, ResidentBanks) else None
        if not (self._eligible or resident is not None):
            return bind_values(self.program, inputs, banks, self.memory_limit)
        same = self._key(inputs, banks, resident, like=self._last[0]) if self._last is not None else None
        if same is None:
            got = self._key(inputs, banks, resident)
            if got is None:
                return bind_values(self.program, inputs, banks, self.memory_limit)
            if self._last is not None and got[0] == self._last[0]:  # (equal dtypes, distinct objects)
                same = got
        if same is not None:
            fast = self._fast(same[1], resident)
            # (else the last structure holds a non-finite value: the full path names it)
            return fast if fast is not None else bind_values(self.program, inputs, banks, self.memory_limit)
        # a new structure: its plan (built or found next) says which floats its kernels count as
        # they read them; the executor checks the others (a new extent scans no bank twice)
        bound = bind_values(self.program, inputs, banks, self.memory_limit, check_finite=False)
        bound.structure = got[0]
        self._last = (got[0], bound, [None, ()])
        return bound

    def _key(self, inputs: Any, banks: Any, resident: ResidentBanks | None, like: tuple | None = None):
        """(structure key, values in binding order), or None when the fast path cannot apply.
        Resident banks count by their shapes and dtypes (fixed when loaded), like arrays, and
        the key says they are resident (their runs need no check of the banks, so they get
        plans of their own). With ``like`` (the last key), only values of exactly that
        structure qualify, compared in place (dtypes by identity: arrays of a builtin dtype
        share its one descriptor), and ``like`` itself is their key: no key is built."""
        if resident is not None:
            if resident.signature is not self.program.bank_signature:
                return None  # (the full path compares the signatures and names the mismatch)
            if like is not None and like[-1] is not resident.structure:
                return None
            banks = resident.owned
        elif like is not None and like[-1] is not None:
            return None
        elif banks is None:
            banks = {}
        elif type(banks) is not dict:
            return None
        if type(inputs) is not dict or (len(inputs), len(banks)) != self._counts:
            return None
        key, values, compared = [], [], 0
        for name, is_input, _ in self._order:
            if not is_input and resident is not None:
                values.append(banks[name])
                continue
            v = (inputs if is_input else banks).get(name)
            if type(v) is not np.ndarray:
                if not isinstance(v, np.generic):
                    return None
                v = np.asarray(v)
            if like is not None:
                dtype, shape = like[compared]
                compared += 1
                if v.dtype is not dtype or v.shape != shape:
                    return None
            elif not v.dtype.isnative:
                return None  # the full path converts it
            else:
                key.append((v.dtype, v.shape))
            values.append(v)
        if like is not None:
            return like, values
        key.append(resident.structure if resident is not None else None)
        return tuple(key), values

    def _fast(self, values: list, resident: ResidentBanks | None) -> BoundValues | None:
        """The bound values of a run with the last structure: only finiteness to check."""
        last = self._last
        known = last[2]
        skip, check = known
        if skip is None:  # asked until the executor has a plan for this structure
            deferred = self._deferred(last[0])
            checked = resident.owned if resident is not None else NO_RESIDENT
            if deferred is None:
                # no plan yet (a tiered run on its reference tier, which checks the values it
                # binds itself): none is scanned twice; the executor checks what the plan it
                # finds does not count (Executor._run_bound)
                deferred = frozenset(name for name, _, floating in self._order if floating and name not in checked)
                bound = last[1]
                return BoundValues(dict(zip(bound.values, values)), bound.dims, bound.binding_bytes,
                                   last[0], deferred, resident.on_backend if resident is not None else NO_RESIDENT)
            skip = deferred
            check = tuple(i for i, (name, _, floating) in enumerate(self._order)
                          if floating and name not in skip and name not in checked)
            known[:] = skip, check
        for i in check:
            if not _all_finite(values[i]):
                return None  # the full path names the value and the index
        bound = last[1]
        return BoundValues(dict(zip(bound.values, values)), bound.dims, bound.binding_bytes,
                           last[0], skip, resident.on_backend if resident is not None else NO_RESIDENT)


@attrs.define
class _Symbols:
    """Extents of size symbols, with where each was first bound (for symbol_conflict)."""

    dims: dict[str, int] = attrs.Factory(dict)
    where: dict[str, str] = attrs.Factory(dict)

    def bind(self, symbol: str, extent: int, where: str, path: str) -> None:
        known = self.dims.get(symbol)
        if known is None:
            self.dims[symbol] = extent
            self.where[symbol] = where
        elif known != extent:
            fail("symbol_conflict", path,
                 f"symbol {symbol!r} is {known} at {self.where[symbol]} but {extent} at {where}")


def load_resident(program, banks: Any, backend, memory_limit: int | None = None) -> ResidentBanks:
    """Check ``banks`` as a run would (every SPEC §4 rule) and keep the runtime's own copies
    of them (on the device too, for a device backend): ``Executable.load_banks``."""
    bound, where = bind_banks(program, banks, memory_limit)
    owned = {name: owned_copy(v) for name, v in bound.values.items()}
    if backend.device_memory:
        on_backend = {name: backend.to_backend(v) for name, v in owned.items()}
        backend.synchronize()
    else:
        on_backend = owned
    return ResidentBanks(program.bank_signature, backend.name, MappingProxyType(owned),
                         MappingProxyType(on_backend), MappingProxyType(dict(bound.dims)),
                         MappingProxyType(where), sum(a.nbytes for a in owned.values()),
                         tuple((a.dtype, a.shape) for a in owned.values()))
