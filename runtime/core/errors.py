"""The one exception type of the public API.

Every failure a caller can provoke (a malformed program, a bad binding, a broken plugin)
is a ``FormulaError`` with a stable ``code`` (SPEC §6) and a JSON ``path`` into the program
or the call, so tools can point at the offending field without parsing messages.
"""
from __future__ import annotations

CODES = frozenset(
    """schema unsupported_schema invalid_name invalid_type duplicate slot_producer
    ssa_visibility invalid_step unknown_atom atom_signature atom_attributes type_mismatch
    invalid_output unsupported_route bank_bundle limit_exceeded binding_keys binding_shape
    binding_dtype nonfinite symbol_conflict index_range duplicate_index bank_identity
    plugin_conflict backend_unavailable plugin_error bank_store out_buffer
    program_unreadable not_differentiable kernel_failed""".split()
)


class FormulaError(Exception):
    """An error with a stable ``code`` and the JSON ``path`` of what caused it."""

    def __init__(self, code: str, path: str, message: str):
        if code not in CODES:  # a typo here would silently break callers matching on codes
            raise ValueError(f"unknown FormulaError code {code!r}")
        self.code = code
        self.path = path
        self.message = message
        super().__init__(f"[{code}] {path}: {message}")

    def __reduce__(self):
        return (type(self), (self.code, self.path, self.message))


def fail(code: str, path: str, message: str):
    """Raise a FormulaError; a function so validators read as one line per rule."""
    raise FormulaError(code, path, message)


def did_you_mean(word: str, candidates) -> str:
    """`` (did you mean 'B'?)`` for a near miss of ``word`` among ``candidates``, else ``""``."""
    import difflib

    names = sorted(set(candidates))
    folded = [c for c in names if c.lower() == word.lower()]  # b for B beats any spelling distance
    close = folded or difflib.get_close_matches(word, names, n=1, cutoff=0.6)
    return f" (did you mean {close[0]!r}?)" if close else ""


def json_kind(v) -> str:
    """How a JSON value is named in messages ("the string 'x'", "a list", "null"...)."""
    if v is None:
        return "null"
    if isinstance(v, bool):
        return "a boolean"
    if isinstance(v, (int, float)):
        return f"the number {v}"
    if isinstance(v, str):
        return f"the string {v!r}"
    if isinstance(v, list):
        return "a list"
    if isinstance(v, dict):
        return "an object"
    return type(v).__name__
