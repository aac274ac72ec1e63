"""Accuracy-vs-%-zeroed curves: the within-1-point value, normalised area, bootstrap intervals.

A curve is a set of points (x = % of (input, layer, head) zeroed, y = accuracy) that always
includes the unablated point (0, base). Points are sorted by x (ties kept in input order)
and joined by straight lines.

* ``max_within(x, y, base, tol)``: the largest x at which the interpolated curve is still
  >= base - tol -- the *last* crossing of the level base - tol. A curve that dips below and
  comes back counts up to where it leaves for the last time. If the curve never falls
  below the level, the value is the largest measured x (it is a lower bound then).
* ``crossing_gap(x, y, base, tol)``: how far apart the two measured points are between which
  that crossing was interpolated (0 for a lower bound). A crossing inside a wide gap -- a
  score whose ties make one threshold jump from 0 to most heads -- is a guess, not a measurement.
* ``normalised_auc(x, y, base, x_max)``: trapezoid area of the interpolated curve over
  [0, x_max] divided by base * x_max. 1.0 = no loss anywhere in range; the curve is taken
  as flat (its last value) beyond its last point when x_max is past it. Sweeps use one
  common x_max for all curves (the smallest of their largest measured x) so areas compare.
* ``bootstrap_indices(n, n_boot, seed)``: one seeded [n_boot, n] matrix of question indices,
  drawn once and reused for every point, so intervals of differences are paired.
* ``paired_difference(a, b, idx)``: mean(a) - mean(b) over the same questions, with its
  percentile interval and standard error on those resamples.
"""

from __future__ import annotations

import math
from typing import Sequence

import numpy as np


def _sorted_curve(x: Sequence[float], y: Sequence[float]) -> tuple[np.ndarray, np.ndarray]:
    x, y = np.asarray(x, dtype=float), np.asarray(y, dtype=float)
    if x.shape != y.shape or x.ndim != 1 or x.size == 0:
        raise ValueError("a curve needs equal-length, non-empty x and y")
    order = np.argsort(x, kind="stable")
    return x[order], y[order]


def _last_crossing(x: Sequence[float], y: Sequence[float], base: float, tol: float) -> tuple[float, float]:
    """(x at the last crossing of base - tol, width of the measured interval it lies in)."""
    xs, ys = _sorted_curve(x, y)
    level = base - tol
    ok = ys >= level
    if not ok.any():
        return math.nan, math.nan  # even the least-ablated point is below the level
    i = int(np.flatnonzero(ok)[-1])  # last point on or above the level
    if i == len(xs) - 1:
        return float(xs[i]), 0.0
    x0, x1, y0, y1 = xs[i], xs[i + 1], ys[i], ys[i + 1]  # y0 >= level > y1
    return float(x0 + (y0 - level) / (y0 - y1) * (x1 - x0)), float(x1 - x0)


def max_within(x: Sequence[float], y: Sequence[float], base: float, tol: float = 1.0) -> float:
    """Largest x with interpolated y(x) >= base - tol (last crossing); see module docstring."""
    return _last_crossing(x, y, base, tol)[0]


def crossing_gap(x: Sequence[float], y: Sequence[float], base: float, tol: float = 1.0) -> float:
    """Distance between the measured points that bracket ``max_within``'s crossing (0: lower bound)."""
    return _last_crossing(x, y, base, tol)[1]


def normalised_auc(x: Sequence[float], y: Sequence[float], base: float, x_max: float) -> float:
    """Trapezoid area of y over [0, x_max] / (base * x_max); see module docstring."""
    if not x_max > 0 or not base > 0:
        return math.nan
    xs, ys = _sorted_curve(x, y)
    grid = np.union1d(xs[(xs >= 0) & (xs <= x_max)], [0.0, x_max])
    # np.interp needs increasing x: for repeated x keep the last y (the curve's value leaving x)
    ux, last = np.unique(xs[::-1], return_index=True)
    uy = ys[::-1][last]
    vals = np.interp(grid, ux, uy)
    return float(np.trapezoid(vals, grid) / (base * x_max))


def bootstrap_indices(n: int, n_boot: int = 1000, seed: int = 0) -> np.ndarray:
    """[n_boot, n] resampling indices (with replacement), seeded."""
    return np.random.default_rng(seed).integers(0, n, size=(n_boot, n))


def percentile_interval(samples: np.ndarray, level: float = 0.95) -> tuple[float, float]:
    s = np.asarray(samples, dtype=float)
    s = s[~np.isnan(s)]
    if s.size == 0:
        return math.nan, math.nan
    a = (1 - level) / 2
    return float(np.quantile(s, a)), float(np.quantile(s, 1 - a))


def paired_difference(a: Sequence[float], b: Sequence[float], idx: np.ndarray,
                      level: float = 0.95) -> dict[str, float]:
    """``mean(a) - mean(b)`` for per-question values aligned on the same questions (0/1
    correctness, or a mean over seeds), with the percentile interval and the standard error
    over the resamples ``idx`` ([n_boot, n] from ``bootstrap_indices``)."""
    a, b = np.asarray(a, dtype=float), np.asarray(b, dtype=float)
    if a.shape != b.shape or a.ndim != 1 or a.size == 0 or idx.shape[-1] != a.size:
        raise ValueError("paired_difference needs two equal-length vectors and resamples of that length")
    d = a - b
    boot = d[idx].mean(axis=1)
    lo, hi = percentile_interval(boot, level)
    return {"delta": float(d.mean()), "ci_low": lo, "ci_high": hi, "se": float(boot.std(ddof=1))}
