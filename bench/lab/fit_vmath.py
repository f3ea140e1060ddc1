"""Fits the polynomial coefficients of runtime/kernels/vmath.py's erf and tanh and prints
them as Python tuples: ``python bench/lab/fit_vmath.py``.

Least squares on Chebyshev nodes (numpy.polynomial), converted to monomials:
- erf on |x| < 1: ``erf(x) = x + x·P(x²)``, P of degree 12 fitted to erf(x)/x − 1 (the
  small correction keeps the final rounding that of ``x + small``);
- erf on 1 ≤ |x| < 6: ``erf(x) = 1 − exp(−x²)·G(x)`` with G = erfcx (scipy) fitted on
  [1, 2], [2, 3.5], [3.5, 6] by polynomials of degree 16 in t = (x − centre)/half-width;
- tanh on |x| < 0.625: ``tanh(x) = x + x·s·Q(s)``, s = x², Q of degree 10 fitted to
  (tanh(x) − x)/x³, evaluated in long double, or by its Taylor series where x² < 10⁻³ (the
  long double difference cancels there).
The node counts are the ones whose fits measured within 2 ulp (tests/test_vmath.py).

The float32 gelu's fits (``erf32_small``, ``erfc32``) round each monomial coefficient to
float32 in turn and refit the later ones to what is left (plain rounding of a float64 fit
cost up to 4 ulp where the small polynomial's terms cancel):
- erf on |t| < 0.75: ``erf(t) = t + t·P(t²)``, P of degree 5;
- erfcx on [0.75, 10.2] as ``w·G(w)``, w = 1/(1 + |t|): G of degree 9 in w's [-1, 1]
  coordinate (one piece: erfcx(a)/w is smooth in w from a = 0.75 to a = ∞), fitted to
  relative error.
"""
from __future__ import annotations

import numpy as np
from numpy.polynomial import chebyshev as C
from numpy.polynomial import polynomial as P

NODES = 6000
ERFC_INTERVALS = ((1.0, 2.0), (2.0, 3.5), (3.5, 6.0))


def _nodes(lo: float, hi: float, n: int = NODES) -> np.ndarray:
    t = np.cos(np.pi * (np.arange(n) + 0.5) / n)
    return lo + (hi - lo) * (t + 1) / 2


def _fit(x: np.ndarray, y: np.ndarray, deg: int, lo: float, hi: float, window=None) -> tuple[float, ...]:
    """Monomial coefficients (constant first) of the fit, in x or in ``window`` coordinates."""
    ch = C.Chebyshev.fit(x, y, deg, domain=[lo, hi])
    w = window or [lo, hi]
    return tuple(float(c) for c in ch.convert(kind=P.Polynomial, domain=[lo, hi], window=w).coef)


def erf_small() -> tuple[float, ...]:
    from scipy.special import erf

    s = _nodes(0.0, 1.0, 4000)
    r = np.sqrt(s)
    return _fit(s, erf(r) / r - 1.0, 12, 0.0, 1.0)


def erf_large() -> tuple[tuple[float, ...], ...]:
    from scipy.special import erfcx

    out = []
    for lo, hi in ERFC_INTERVALS:
        x = _nodes(lo, hi)
        out.append(_fit(x, erfcx(x), 16, lo, hi, window=[-1.0, 1.0]))
    return tuple(out)


GELU32_SMALL, GELU32_FAR = 0.75, 10.2


def _fit_float32(x: np.ndarray, y: np.ndarray, deg: int, weight: np.ndarray | None = None) -> tuple[float, ...]:
    """Monomial coefficients in x (constant first), each rounded to float32 before the later
    ones are refitted to the residual (weighted least squares when ``weight`` is given)."""
    residual, out = y.copy(), []
    w = np.ones_like(y) if weight is None else weight
    for k in range(deg + 1):
        basis = np.stack([x ** j for j in range(k, deg + 1)], 1)
        coef, *_ = np.linalg.lstsq(basis * w[:, None], residual * w, rcond=None)
        out.append(float(np.float32(coef[0])))
        residual = residual - out[-1] * x ** k
    return tuple(out)


def erf32_small() -> tuple[float, ...]:
    from scipy.special import erf

    s = _nodes(0.0, GELU32_SMALL ** 2, 4000)
    r = np.sqrt(s)
    return _fit_float32(s, erf(r) / r - 1.0, 5)


def erfcx32() -> tuple[float, float, tuple[float, ...]]:
    """(centre, scale, coefficients): erfcx(a) = w·G((w − centre)·scale), w = 1/(1 + a), on
    [GELU32_SMALL, GELU32_FAR]."""
    from scipy.special import erfcx

    lo, hi = 1 / (1 + GELU32_FAR), 1 / (1 + GELU32_SMALL)
    w = _nodes(lo, hi)
    y = erfcx(1 / w - 1) / w
    centre, scale = (lo + hi) / 2, 2 / (hi - lo)
    return centre, scale, _fit_float32((w - centre) * scale, y, 9, 1 / y)


def tanh_small() -> tuple[float, ...]:
    s = _nodes(0.0, 0.625 ** 2).astype(np.longdouble)
    x = np.sqrt(s)
    with np.errstate(invalid="ignore", divide="ignore"):
        y = (np.tanh(x) - x) / (x * s)
    series = -1 / 3 + s * (2 / 15 + s * (-17 / 315 + s * (62 / 2835 + s * (-1382 / 155925))))
    y = np.where(s < 1e-3, series, y)
    return _fit(s.astype(np.float64), y.astype(np.float64), 10, 0.0, 0.625 ** 2)


if __name__ == "__main__":
    print("ERF_SMALL =", erf_small())
    print("ERFC_INTERVALS =", ERFC_INTERVALS)
    print("ERFC =", erf_large())
    print("TANH_SMALL =", tanh_small())
    print("ERF32_SMALL =", erf32_small())
    print("ERFCX32 =", erfcx32())
