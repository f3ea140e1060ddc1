"""Resident banks: a program's bank values checked once and owned by the runtime.

A served LoRA program runs many times over the same weights. Passing them to every run
makes each run check them again (SPEC §4: shape, dtype, identity, fingerprint, finiteness)
and, on a device backend, copy them to the device again. ``Executable.load_banks`` does all
of that once and returns a :class:`ResidentBanks`, which ``run`` then takes as ``banks``.

Why the checks may be skipped later: the values are the runtime's own C-contiguous copies,
made at load time, which no caller can reach to modify (the ``values`` it hands out are
read-only views). A caller who changes its weights loads them again.
"""
from __future__ import annotations

import types
from collections.abc import Mapping
from typing import Any

import attrs
import numpy as np

from runtime.kernels.arrays import is_device_array
from runtime.core.errors import fail


@attrs.frozen(eq=False, repr=False)
class ResidentBanks:
    """Checked bank values owned by the runtime (see the module docstring)."""

    signature: tuple
    backend: str
    owned: Mapping[str, np.ndarray]  # host copies in binding order: the ones runs bind
    on_backend: Mapping[str, Any]  # the same values where the backend's kernels read them
    dims: Mapping[str, int]  # the extents the banks fix
    where: Mapping[str, str]  # for each of those symbols, the bank axis that fixed it
    nbytes: int
    structure: tuple  # (dtype, shape) per owned value: their part of a run's structure key

    @property
    def values(self) -> Mapping[str, np.ndarray]:
        """Read-only views of the owned values (for inspection: runs never see writes)."""
        views = {}
        for name, a in self.owned.items():
            view = a.view()
            view.flags.writeable = False
            views[name] = view
        return types.MappingProxyType(views)

    def check_signature(self, program) -> None:
        """Fail unless these banks were loaded for this program's bank bindings."""
        if self.signature is not program.bank_signature and self.signature != program.bank_signature:
            fail("bank_identity", "$.banks",
                 f"these resident banks were loaded for bank bindings {self._names()}, which "
                 f"differ from this program's {[b.name for b in program.bank_bindings]} in name, "
                 "type or identity; call load_banks on this program's executable")

    def check_backend(self, backend) -> None:
        """A device backend reads its own copies: fail unless these banks hold them."""
        if backend.device_memory and self.backend != backend.name:
            fail("bank_identity", "$.banks",
                 f"these resident banks were loaded for backend {self.backend!r}; backend "
                 f"{backend.name!r} keeps its own device copies (call load_banks on its executable)")

    def _names(self) -> list[str]:
        return [entry[0] for entry in self.signature]

    def __repr__(self) -> str:
        shapes = ", ".join(f"{n}: {a.dtype}{list(a.shape)}" for n, a in self.owned.items())
        return f"ResidentBanks({shapes}; backend {self.backend!r}, {self.nbytes} bytes)"


def owned_copy(value) -> np.ndarray:
    """The runtime's own C-order host copy of a bank value."""
    host = value.copy_to_host() if is_device_array(value) else value
    return np.array(host, order="C", copy=True)
