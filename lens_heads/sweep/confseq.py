"""An anytime-valid confidence sequence for a finite population's mean, sampled without
replacement: the hedged betting (capital) sequence of Waudby-Smith & Ramdas (docs/methods.md §12).

The population is ``N`` items with values on a lattice ``lower + j * step`` (j = 0..L,
``L = (upper - lower) / step`` an integer): for paired accuracy differences
``d = correct_ablated - correct_unablated`` that is ``{-1, 0, 1}`` (the defaults). Items are
seen in a uniformly random order; after any number of them, ``interval()`` is a range that
holds the mean over all ``N`` items with probability >= 1 - alpha *simultaneously at every n*,
so a caller may look after every batch and stop whenever it likes. At n = N it is the mean
itself.

* The population sum is ``N * lower + step * k`` with k an integer in ``0..L*N``, so the
  candidate means are those ``L*N + 1`` values exactly (no grid error).
* Each candidate is tested by two betting capital processes on the rescaled values
  ``x = (d - lower) / (upper - lower)`` in [0, 1], centred on the without-replacement
  conditional mean; a candidate whose hedged capital ever reaches ``1 / alpha`` is rejected for
  good (a running intersection, so the interval never grows while the sequence holds).
* A candidate the items already seen make impossible (the unseen items cannot bring the mean
  there) is excluded deterministically, whatever the bets say.
* If every candidate is excluded -- only possible after the true mean itself was rejected, an
  event of probability <= alpha -- the interval falls back to the deterministic range, which
  always holds the mean, and ``contradicted`` is True.

One update costs O(live candidates x batch) numpy work; rejected and impossible candidates are
dropped from the arrays. ``decide(lo, hi, margin)`` turns an interval into the adaptive sweep's
decision.
"""

from __future__ import annotations

import math
from typing import Literal, Sequence

import numpy as np
from jaxtyping import Float

from lens_heads.errors import LensHeadsError

Decision = Literal["within", "outside"]

_CELLS_PER_CHUNK = 1 << 21  # items x live candidates per vectorised step (~16 MiB per float array)
_LATTICE_TOL = 1e-9


def _check_unit(name: str, value: float, closed: bool = False) -> float:
    try:
        value = float(value)
    except (TypeError, ValueError):
        raise LensHeadsError(f"{name} must be a number, got {value!r}") from None
    inside = 0.0 <= value <= 1.0 if closed else 0.0 < value < 1.0
    if not (math.isfinite(value) and inside):
        raise LensHeadsError(f"{name} must be in {'[0, 1]' if closed else '(0, 1)'}, got {value!r}")
    return value


class WoRConfidenceSequence:
    """The hedged betting confidence sequence for the mean of ``N`` items sampled without
    replacement (docs/methods.md §12).

    ``update(values)`` takes the next items' values (any batch size, in the order drawn);
    ``interval()`` is the current (lo, hi) on the values' own scale. ``alpha``: the probability
    that the population mean ever leaves the interval, over the random order. ``theta``: the
    weight of the upward bet in the hedge; ``c``: the bets' truncation (``lambda <= c / m``).
    """

    def __init__(self, N: int, alpha: float = 0.05, lower: float = -1.0, upper: float = 1.0,
                 step: float = 1.0, *, theta: float = 0.5, c: float = 0.5) -> None:
        if isinstance(N, bool) or not isinstance(N, (int, np.integer)) or N < 1:
            raise LensHeadsError(f"the population size N must be an integer >= 1, got {N!r}")
        self.alpha = _check_unit("alpha", alpha)
        self.theta = _check_unit("theta", theta, closed=True)
        self.c = _check_unit("the bet truncation c", c)
        lower, upper, step = float(lower), float(upper), float(step)
        if not (math.isfinite(lower) and math.isfinite(upper) and lower < upper):
            raise LensHeadsError(f"the value bounds must be finite with lower < upper, got [{lower}, {upper}]")
        levels = (upper - lower) / step if math.isfinite(step) and step > 0 else math.nan
        if not (math.isfinite(levels) and abs(levels - round(levels)) <= _LATTICE_TOL * max(1.0, levels)):
            raise LensHeadsError(f"step must be > 0 and divide upper - lower = {upper - lower:g}, got {step!r}")
        self.N, self.lower, self.upper, self.step = int(N), lower, upper, step
        self.levels = int(round(levels))  # L: values are lower + j * step, j = 0..L
        size = self.levels * self.N + 1  # candidate population sums k = 0..L*N (in steps)
        self._alive = np.ones(size, dtype=bool)  # never rejected by the bets
        self._log_up = np.zeros(size)  # log K^+ per candidate
        self._log_down = np.zeros(size)  # log K^-
        self._n = 0
        self._sum_steps = 0  # sum of j over the items seen (an exact integer)
        self._sum_x = 0.0  # sum of x over the items seen (for the bets)
        self._sum_sq = 0.0  # sum of (x_i - mu_hat_i)^2 (for the bets)
        self._log_threshold = math.log(1.0 / self.alpha)
        self._log_theta = (math.log(self.theta) if self.theta > 0 else -math.inf,
                           math.log(1.0 - self.theta) if self.theta < 1 else -math.inf)
        self._lam_scale = 2.0 * math.log(2.0 / self.alpha)

    @property
    def n(self) -> int:
        """How many items have been seen."""
        return self._n

    def _steps(self, values: Float[np.ndarray, " batch"] | Sequence[float]) -> np.ndarray:
        """The values as lattice indices j (int64), every input checked."""
        try:
            arr = np.asarray(values, dtype=float)
        except (TypeError, ValueError):
            raise LensHeadsError("values must be numbers (paired differences, e.g. -1, 0, 1)") from None
        if arr.ndim != 1:
            raise LensHeadsError(f"values must be a 1-d sequence, got shape {arr.shape}")
        if self._n + arr.size > self.N:
            raise LensHeadsError(f"{self._n} + {arr.size} values is more than the population of N = {self.N} items")
        bad = ~np.isfinite(arr) | (arr < self.lower - _LATTICE_TOL) | (arr > self.upper + _LATTICE_TOL)
        if bad.any():
            raise LensHeadsError(f"value {arr[bad][0]!r} is outside the bounds [{self.lower:g}, {self.upper:g}]")
        j = (arr - self.lower) / self.step
        steps = np.rint(j)
        off = np.abs(j - steps) > _LATTICE_TOL
        if off.any():
            raise LensHeadsError(f"value {arr[off][0]!r} is not lower + j * step (lower = {self.lower:g}, "
                                 f"step = {self.step:g}): the mean's candidates would not be exact")
        return steps.astype(np.int64)

    def update(self, values: Float[np.ndarray, " batch"] | Sequence[float]) -> tuple[float, float]:
        """Add the next items (in the order drawn); returns the new ``interval()``."""
        steps = self._steps(values)
        start = 0
        while start < steps.size:
            live = self._live_candidates()
            size = max(1, min(steps.size - start, _CELLS_PER_CHUNK // max(1, live.size)))
            self._update_chunk(steps[start:start + size], live)
            start += size
        return self.interval()

    def _live_candidates(self) -> np.ndarray:
        """Candidate sums not rejected and still possible given the items seen."""
        lo = self._sum_steps
        hi = lo + self.levels * (self.N - self._n)
        return lo + np.flatnonzero(self._alive[lo:hi + 1])

    def _update_chunk(self, steps: np.ndarray, live: np.ndarray) -> None:
        L, N = self.levels, self.N
        t = self._n + 1 + np.arange(steps.size)  # 1-based position of each item
        x = steps / L
        # The predictable plug-in bet (docs/methods.md §12), sums carried sequentially.
        cum_x = np.cumsum(np.concatenate(([self._sum_x], x)))
        mu_hat = (0.5 + cum_x[1:]) / (t + 1)
        cum_sq = np.cumsum(np.concatenate(([self._sum_sq], (x - mu_hat) ** 2)))
        sigma2_prev = (0.25 + cum_sq[:-1]) / t
        lam = np.sqrt(self._lam_scale / (sigma2_prev * t * np.log1p(t)))
        # Sum of j before each item, and the without-replacement conditional mean per candidate.
        before = self._sum_steps + np.concatenate(([0], np.cumsum(steps)[:-1]))
        gap = live[None, :] - before[:, None]  # k - S_{t-1}, integers
        room = (L * (N - t + 1))[:, None]
        possible = (gap >= 0) & (gap <= room)
        m_wor = gap / room
        with np.errstate(divide="ignore", invalid="ignore"):
            lam_up = np.minimum(lam[:, None], self.c / m_wor)
            lam_down = np.minimum(lam[:, None], self.c / (1.0 - m_wor))
        dx = x[:, None] - m_wor
        # An impossible candidate's factor is left at 1: it is excluded deterministically anyway.
        step_up = np.log1p(np.where(possible, lam_up * dx, 0.0))
        step_down = np.log1p(np.where(possible, -lam_down * dx, 0.0))
        log_up = np.cumsum(np.vstack((self._log_up[live], step_up)), axis=0)[1:]
        log_down = np.cumsum(np.vstack((self._log_down[live], step_down)), axis=0)[1:]
        hedged = np.maximum(self._log_theta[0] + log_up, self._log_theta[1] + log_down)
        rejected = ((hedged >= self._log_threshold) & possible).any(axis=0)
        self._alive[live[rejected]] = False
        self._log_up[live] = log_up[-1]
        self._log_down[live] = log_down[-1]
        self._n += steps.size
        self._sum_steps += int(steps.sum())
        self._sum_x = float(cum_x[-1])
        self._sum_sq = float(cum_sq[-1])

    def _mean_of(self, k: int) -> float:
        """The population mean whose sum is ``k`` steps above ``N * lower``."""
        return (self.N * self.lower + self.step * k) / self.N

    @property
    def contradicted(self) -> bool:
        """True when the bets rejected every candidate still possible (so they rejected the true
        mean: probability <= alpha); ``interval()`` is then the deterministic range."""
        return self._live_candidates().size == 0

    def deterministic_interval(self) -> tuple[float, float]:
        """The range the items seen allow whatever the unseen ones are (each in [lower, upper])."""
        lo = self._sum_steps
        return self._mean_of(lo), self._mean_of(lo + self.levels * (self.N - self._n))

    def interval(self) -> tuple[float, float]:
        """(lo, hi): the smallest and largest candidate mean neither rejected by the bets at any
        n so far nor made impossible by the items seen. Exactly (mean, mean) at n = N."""
        live = self._live_candidates()
        if live.size == 0:
            return self.deterministic_interval()
        return self._mean_of(int(live[0])), self._mean_of(int(live[-1]))

    def covers(self, value: float) -> bool:
        """Whether ``value`` is a candidate mean still in the sequence (never rejected, possible)."""
        k = (float(value) - self.lower) * self.N / self.step
        if not math.isfinite(k) or abs(k - round(k)) > _LATTICE_TOL * max(1.0, abs(k)):
            return False
        live = self._live_candidates()  # sorted
        i = int(np.searchsorted(live, int(round(k))))
        return i < live.size and int(live[i]) == int(round(k))

def interval(values: Float[np.ndarray, " n"] | Sequence[float], N: int, alpha: float = 0.05,
             lower: float = -1.0, upper: float = 1.0, step: float = 1.0, *, theta: float = 0.5,
             c: float = 0.5) -> tuple[float, float]:
    """The confidence sequence's interval after ``values`` (the first items of a random order of
    ``N``); the same as ``WoRConfidenceSequence`` updated with them in any batches."""
    cs = WoRConfidenceSequence(N, alpha, lower, upper, step, theta=theta, c=c)
    return cs.update(values)


def decide(lo: float, hi: float, margin: float) -> Decision | None:
    """``"within"`` when the whole interval is >= -margin, ``"outside"`` when it is all
    < -margin, else None (keep sampling). docs/methods.md §12."""
    lo, hi, margin = float(lo), float(hi), float(margin)
    if not (math.isfinite(margin) and margin >= 0):
        raise LensHeadsError(f"the margin must be a finite number >= 0, got {margin!r}")
    if not (lo <= hi):
        raise LensHeadsError(f"an interval needs lo <= hi, got ({lo!r}, {hi!r})")
    if lo >= -margin:
        return "within"
    if hi < -margin:
        return "outside"
    return None
