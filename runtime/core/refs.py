"""Component references: ``owner/name@sha256:<hex>`` (content-pinned) or ``owner/name@N``."""
from __future__ import annotations

import functools
import re

import attrs

from runtime.core.errors import fail

_REF = re.compile(
    r"^(?P<owner>[a-z0-9][a-z0-9_.-]*)/(?P<name>[a-z0-9][a-z0-9_.-]*)"
    r"@(?:sha256:(?P<digest>[0-9a-f]{64})|(?P<version>[1-9][0-9]*))$"
)


@attrs.frozen
class Ref:
    owner: str
    name: str
    digest: str | None
    version: int | None

    @property
    def family(self) -> str:
        return f"{self.owner}/{self.name}"

    def __str__(self) -> str:
        tail = f"sha256:{self.digest}" if self.digest else str(self.version)
        return f"{self.family}@{tail}"


def parse_ref(text: object, path: str) -> Ref:
    """Parse a reference or raise ``invalid_name`` (``schema`` if it is not even a string)."""
    if not isinstance(text, str):
        fail("schema", path, f"expected a reference string, got {type(text).__name__}")
    ref = _parsed(text)
    if ref is None:
        fail(
            "invalid_name",
            path,
            f"{text!r} is not a component reference "
            "(expected owner/name@sha256:<64 lowercase hex> or owner/name@<N>, N >= 1)",
        )
    return ref


@functools.lru_cache(maxsize=4096)  # programs repeat a few refs many times; Ref is immutable
def _parsed(text: str) -> Ref | None:
    m = _REF.match(text)
    if not m:
        return None
    version = m.group("version")
    return Ref(m.group("owner"), m.group("name"), m.group("digest"), int(version) if version else None)


def is_ref(text: object) -> bool:
    return isinstance(text, str) and _REF.match(text) is not None
