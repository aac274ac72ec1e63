"""The without-replacement confidence sequence (lens_heads/sweep/confseq.py, docs/methods.md §12):
exact agreement with a brute-force computation written separately from the formulas, the mean
exactly at n = N, coverage by simulation, nesting and bounds, bad inputs."""

from __future__ import annotations

import math
from fractions import Fraction

import numpy as np
import pytest

from lens_heads.errors import LensHeadsError
from lens_heads.sweep.confseq import WoRConfidenceSequence, decide, interval


def brute_force_intervals(values, N, alpha, lower=-1.0, upper=1.0, step=1.0, theta=0.5, c=0.5):
    """The interval after each of ``values``, by plain loops over candidates and time: every
    bet recomputed from the start at each time, the means in exact fractions, capital as a
    product (not a log sum). Written from docs/methods.md §12, not from the module."""
    L = round((upper - lower) / step)
    xs = [Fraction(round((v - lower) / step), L) for v in values]  # in [0, 1]
    candidates = [Fraction(k, L * N) for k in range(L * N + 1)]  # the population mean of x
    up = [1.0] * len(candidates)
    down = [1.0] * len(candidates)
    rejected = [False] * len(candidates)
    out = []
    for t in range(1, len(xs) + 1):
        # lambda_t from x_1..x_{t-1} only
        sq = 0.0
        for i in range(1, t):
            mu_i = (0.5 + sum(float(x) for x in xs[:i])) / (i + 1)
            sq += (float(xs[i - 1]) - mu_i) ** 2
        sigma2 = (0.25 + sq) / t
        lam = math.sqrt(2 * math.log(2 / alpha) / (sigma2 * t * math.log(1 + t)))
        seen = sum(xs[:t - 1], Fraction(0))
        x = float(xs[t - 1])
        for j, m in enumerate(candidates):
            m_wor = (N * m - seen) / (N - t + 1)
            if m_wor < 0 or m_wor > 1:
                continue  # impossible: excluded below whatever its capital
            mw = float(m_wor)
            lam_up = min(lam, c / mw) if mw > 0 else lam
            lam_down = min(lam, c / (1 - mw)) if mw < 1 else lam
            up[j] *= 1 + lam_up * (x - mw)
            down[j] *= 1 - lam_down * (x - mw)
            if max(theta * up[j], (1 - theta) * down[j]) >= 1 / alpha:
                rejected[j] = True
        total = sum(xs[:t], Fraction(0))
        possible = [m for m in candidates if total <= N * m <= total + (N - t)]
        kept = [m for j, m in enumerate(candidates) if not rejected[j] and m in possible] or possible
        scale = lambda m: float(Fraction(lower) + Fraction(upper - lower) * m)  # noqa: E731
        out.append((scale(min(kept)), scale(max(kept))))
    return out


def population(rng, N, p_down, p_up):
    """N paired differences in {-1, 0, 1} with P(-1) = p_down, P(1) = p_up, shuffled."""
    return rng.choice([-1, 0, 1], size=N, p=[p_down, 1 - p_down - p_up, p_up])


def one_at_a_time(values, N, alpha, **kw):
    cs = WoRConfidenceSequence(N, alpha, **kw)
    return [cs.update([v]) for v in values]


@pytest.mark.parametrize("N, p_down, p_up, alpha, theta, c, seed", [
    (1, 0.3, 0.3, 0.05, 0.5, 0.5, 0),
    (2, 0.3, 0.3, 0.5, 0.5, 0.5, 1),
    (7, 0.2, 0.1, 0.3, 0.5, 0.75, 2),
    (13, 0.4, 0.1, 0.2, 0.3, 0.5, 3),
    (20, 0.05, 0.05, 0.5, 0.5, 0.5, 4),
    (30, 0.3, 0.2, 0.1, 0.5, 0.5, 5),
    (30, 0.0, 0.0, 0.5, 0.5, 0.75, 6),
    (30, 0.6, 0.0, 0.05, 0.7, 0.5, 7),
])
def test_every_interval_equals_a_brute_force_computation(N, p_down, p_up, alpha, theta, c, seed):
    rng = np.random.default_rng(seed)
    for _ in range(3):  # three populations and orders per case
        d = population(rng, N, p_down, p_up)
        got = one_at_a_time(d, N, alpha, theta=theta, c=c)
        assert got == brute_force_intervals(d, N, alpha, theta=theta, c=c)


def test_other_lattices_equal_brute_force():
    """Accuracy itself (0/1) and a three-level [0, 1] scale, on their own candidate grids."""
    rng = np.random.default_rng(11)
    for _ in range(3):
        acc = rng.integers(0, 2, size=17).astype(float)
        assert one_at_a_time(acc, 17, 0.3, lower=0.0, upper=1.0) == \
            brute_force_intervals(acc, 17, 0.3, lower=0.0, upper=1.0)
        half = rng.choice([0.0, 0.5, 1.0], size=11)
        assert one_at_a_time(half, 11, 0.4, lower=0.0, upper=1.0, step=0.5) == \
            brute_force_intervals(half, 11, 0.4, lower=0.0, upper=1.0, step=0.5)


def test_contradicted_sequences_equal_brute_force_and_fall_back_to_the_deterministic_range():
    """With alpha near 1 the bets reject the truth often; the set empties and the interval is
    then the deterministic range (both computations agree on it)."""
    rng = np.random.default_rng(12)
    seen = 0
    for _ in range(20):
        d = population(rng, 12, 0.3, 0.3)
        cs = WoRConfidenceSequence(12, 0.95)
        got = [cs.update([v]) for v in d]
        assert got == brute_force_intervals(d, 12, 0.95)
        if cs.contradicted:
            seen += 1
            assert cs.interval() == cs.deterministic_interval()
    assert seen > 0  # the fallback was exercised


def test_batches_give_the_same_sequence_as_single_items():
    rng = np.random.default_rng(21)
    N = 700
    d = population(rng, N, 0.08, 0.04)
    single = one_at_a_time(d, N, 0.05)
    cs = WoRConfidenceSequence(N, 0.05)
    n = 0
    while n < N:
        size = int(rng.integers(1, 80))
        assert cs.update(d[n:n + size]) == single[min(n + size, N) - 1]
        n = min(n + size, N)
    assert interval(d[:333], N, 0.05) == single[332]
    assert interval([], N, 0.05) == (-1.0, 1.0)


@pytest.mark.parametrize("N", [1, 2, 9, 50, 1838])
def test_at_n_equals_N_the_interval_is_the_population_mean(N):
    rng = np.random.default_rng(N)
    for alpha in (0.05, 0.99):  # 0.99 rejects the truth: the deterministic range must still win
        d = population(rng, N, 0.2, 0.1)
        lo, hi = interval(d, N, alpha)
        assert lo == hi == np.sum(d) / N


def _coverage(N, p_down, p_up, alpha, runs, batch, seed):
    """(fraction of runs where the true mean ever left the interval at a batch end, fraction
    where the bets ever rejected it), each run a fresh seeded order of one fixed population."""
    rng = np.random.default_rng(seed)
    d = population(rng, N, p_down, p_up)
    delta = np.sum(d) / N
    left = rejected = 0
    for _ in range(runs):
        order = rng.permutation(d)
        cs = WoRConfidenceSequence(N, alpha)
        prev = (-1.0, 1.0)
        out = False
        for i in range(0, N, batch):
            lo, hi = cs.update(order[i:i + batch])
            out |= not (lo <= delta <= hi)
            if not cs.contradicted:  # nested while the sequence holds
                assert prev[0] <= lo <= hi <= prev[1]
            dlo, dhi = cs.deterministic_interval()
            assert -1.0 <= dlo <= lo <= hi <= dhi <= 1.0
            prev = (lo, hi)
        left += out
        rejected += not cs.covers(delta)
    return left / runs, rejected / runs


# Slack: 3 binomial standard errors of a rate alpha over `runs` runs (a valid sequence's miss
# rate is <= alpha; this one's is far below it in practice).
@pytest.mark.parametrize("p_down, p_up, alpha", [
    (0.02, 0.02, 0.05),   # Delta ~ 0, few disagreements
    (0.10, 0.05, 0.05),   # Delta ~ -0.05
    (0.30, 0.30, 0.05),   # Delta ~ 0, high variance
    (0.50, 0.00, 0.05),   # Delta ~ -0.5
    (0.10, 0.05, 0.30),   # a large alpha: misses are frequent enough to see a wrong bet
])
def test_coverage_by_simulation(p_down, p_up, alpha):
    runs = 1000
    left, rejected = _coverage(N=300, p_down=p_down, p_up=p_up, alpha=alpha, runs=runs, batch=16,
                               seed=int(1000 * (p_down + 2 * p_up + alpha)))
    slack = 3 * math.sqrt(alpha * (1 - alpha) / runs)
    assert left <= rejected <= alpha + slack, (left, rejected)


@pytest.mark.slow
def test_coverage_by_simulation_at_benchmark_size():
    for p_down, p_up in ((0.06, 0.04), (0.3, 0.25)):
        left, rejected = _coverage(N=1838, p_down=p_down, p_up=p_up, alpha=0.1, runs=2000, batch=32, seed=7)
        assert left <= rejected <= 0.1 + 3 * math.sqrt(0.1 * 0.9 / 2000), (left, rejected)


def test_the_decision_rule():
    assert decide(-0.01, 0.02, 0.01) == "within"
    assert decide(-0.0101, 0.02, 0.01) is None
    assert decide(-0.05, -0.0101, 0.01) == "outside"
    assert decide(-0.05, -0.01, 0.01) is None
    assert decide(0.0, 0.0, 0.0) == "within"
    for bad in (-0.01, math.nan, math.inf):
        with pytest.raises(LensHeadsError, match="margin"):
            decide(-0.1, 0.1, bad)
    with pytest.raises(LensHeadsError, match="lo <= hi"):
        decide(0.1, -0.1, 0.01)


def test_a_sweep_decides_before_the_end():
    """On a benchmark-sized population the sequence decides long before n = N either way."""
    rng = np.random.default_rng(3)
    N = 1838
    for (p_down, p_up), want in (((0.02, 0.02), "within"), ((0.25, 0.02), "outside")):
        d = population(rng, N, p_down, p_up)
        cs = WoRConfidenceSequence(N, 0.05)
        for i in range(0, N, 32):
            verdict = decide(*cs.update(d[i:i + 32]), margin=0.05)
            if verdict:
                break
        assert verdict == want and cs.n < N / 2, (verdict, cs.n)


@pytest.mark.parametrize("kwargs, message", [
    ({"N": 10, "alpha": 0.0}, "alpha must be in"),
    ({"N": 10, "alpha": 1.0}, "alpha must be in"),
    ({"N": 10, "alpha": math.nan}, "alpha must be in"),
    ({"N": 10, "alpha": None}, "alpha must be a number"),
    ({"N": 0}, "N must be an integer >= 1"),
    ({"N": 2.5}, "N must be an integer >= 1"),
    ({"N": True}, "N must be an integer >= 1"),
    ({"N": 10, "lower": 1.0, "upper": -1.0}, "lower < upper"),
    ({"N": 10, "step": 0.7}, "divide upper - lower"),
    ({"N": 10, "step": 0.0}, "divide upper - lower"),
    ({"N": 10, "theta": 1.5}, "theta must be in"),
    ({"N": 10, "c": 1.0}, "truncation c must be in"),
])
def test_bad_parameters_raise(kwargs, message):
    with pytest.raises(LensHeadsError, match=message):
        WoRConfidenceSequence(**kwargs)


def test_bad_values_raise():
    cs = WoRConfidenceSequence(4, 0.05)
    for bad, message in (([2.0], "outside the bounds"), ([-1.5], "outside the bounds"),
                         ([math.nan], "outside the bounds"), ([0.5], "not lower \\+ j \\* step"),
                         ([[0.0, 1.0]], "1-d"), (["a"], "values must be numbers"),
                         ([0, 0, 0, 0, 0], "more than the population of N = 4")):
        with pytest.raises(LensHeadsError, match=message):
            cs.update(bad)
    assert cs.n == 0  # nothing was taken from a rejected batch
    cs.update([1, 0, -1])
    with pytest.raises(LensHeadsError, match="3 \\+ 2 values is more than"):
        cs.update([0, 0])
    with pytest.raises(LensHeadsError, match="more than the population"):
        interval([0, 1, 1], 2)
