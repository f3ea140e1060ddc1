"""formula-runtime: execute typed formula programs with planned, fused, compiled kernels."""
from __future__ import annotations

from .errors import FormulaError

__all__ = ["FormulaError"]
