"""Sweep statistics: pure functions of the question x point correctness matrix (docs/methods.md §5).

All on accuracy as a fraction in [0, 1]; "1 point" = ``cfg.tol`` = 0.01:

* per point (``point_summary``): a percentile bootstrap interval over questions (``n_boot``
  resamples, seeded), and the difference to the baseline with a *paired* interval (the same
  resampled questions for both);
* per function (``tables``): ``curves.max_within`` (largest % zeroed with accuracy >= base - 1
  point, last crossing of the interpolated curve) and ``curves.normalised_auc`` over the common
  range [0, R], R = the smallest of the curves' largest measured % zeroed; both with bootstrap
  intervals (the whole curve is recomputed on each resample of the questions);
* ``random`` and ``static:random``: the curve is the mean over seeds at each fraction (mean %
  zeroed, mean accuracy); ``seed_min``/``seed_max`` give the range of the per-seed
  within-1-point values;
* static curves (``static:ID``) are curves like the per-input ones, over the same fractions, in
  the same table (their % zeroed is k / heads exactly);
* ``crossing_gap_pct``: the distance between the measured points that bracket the crossing
  (0 when the value is a lower bound); the wider it is, the more the value is interpolation;
* a score function whose thresholds coincide for every target fraction (its values tie across
  heads) has one ablated point, not a curve: its within-1-point value and AUC are NaN, ``note``
  says why, and it is left out of the common AUC range and the ranking.

Nothing here loads a model or reads a file: the inputs are ``SweepPoint`` s and their stored
``PointRecord`` s.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Sequence

import numpy as np

from lens_heads.sweep.curves import bootstrap_indices, crossing_gap, max_within, normalised_auc, percentile_interval
from lens_heads.errors import LensHeadsError
from lens_heads.sweep.config import RANDOM, SEEDED, STATIC_RANDOM, SweepConfig
from lens_heads.sweep.plan import SweepPoint
from lens_heads.sweep.records import PointRecord

TIED_NOTE = "ties: one threshold for every fraction, so no curve"


def _correct_matrix(specs: Sequence[str], records: dict[str, PointRecord]) -> np.ndarray:
    """[n_specs, n_questions] 0/1 correctness, questions aligned by doc_id."""
    ref = [q.doc_id for q in records["none"].questions]
    rows = []
    for spec in specs:
        by_id = records[spec].correct_by_doc()
        if set(by_id) != set(ref):
            raise LensHeadsError(f"sweep point {spec!r} was evaluated on other questions than the baseline")
        rows.append([float(by_id[d]) for d in ref])
    return np.asarray(rows, dtype=float)


def thresholds_tie(taus: Sequence[float]) -> bool:
    """True when several target fractions > 0 all got the same threshold: the score ties
    across heads and its sweep has one ablated point, not a curve."""
    taus = [float(t) for t in taus]
    return len(taus) > 1 and len(set(taus)) == 1


def _tied(points: Sequence[SweepPoint], score_fn: str) -> bool:
    return thresholds_tie([p.threshold for p in points if p.score_fn == score_fn and p.fraction > 0])


@dataclass
class _Boot:
    """Accuracy of each spec on the stored records and on ``cfg.n_boot`` shared resamples."""
    row_of: dict[str, int]
    boot: np.ndarray  # [spec, boot]
    acc: dict[str, float]
    pct: dict[str, float]
    n_questions: int

    @property
    def b0(self) -> np.ndarray:
        return self.boot[self.row_of["none"]]


def _bootstrap(points: Sequence[SweepPoint], records: dict[str, PointRecord], cfg: SweepConfig) -> _Boot:
    specs = list(dict.fromkeys(p.spec for p in points))
    C = _correct_matrix(specs, records)  # [spec, question]
    n_q = C.shape[1]
    if n_q == 0:
        raise LensHeadsError("the sweep evaluated no questions")
    idx = bootstrap_indices(n_q, cfg.n_boot, cfg.boot_seed)
    counts = np.stack([np.bincount(row, minlength=n_q) for row in idx])  # [boot, question]
    row_of = {s: i for i, s in enumerate(specs)}
    return _Boot(row_of, C @ counts.T / n_q,  # accuracies on each resample
                 {s: float(records[s].metrics.get("acc", C[row_of[s]].mean())) for s in specs},
                 {s: 100.0 * float(records[s].zeroed_fraction or 0.0) for s in specs}, n_q)


def point_summary(points: Sequence[SweepPoint], records: dict[str, PointRecord], cfg: SweepConfig,
                  bt: _Boot | None = None):
    """One row per point: % zeroed, accuracy with its interval, and the paired difference to
    the baseline (pure: from stored records; ``points`` must include the baseline's spec)."""
    import pandas as pd

    bt = _bootstrap(points, records, cfg) if bt is None else bt
    boot, acc, pct, b0 = bt.boot, bt.acc, bt.pct, bt.b0
    rows = []
    for p in points:
        i = bt.row_of[p.spec]
        lo, hi = percentile_interval(boot[i])
        dlo, dhi = percentile_interval(boot[i] - b0)
        m = records[p.spec].metrics
        rows.append({
            "score_fn": p.score_fn, "fraction": p.fraction, "seed": p.seed, "threshold": p.threshold,
            "spec": p.spec, "pct_zeroed": pct[p.spec], "accuracy": acc[p.spec], "ci_low": lo, "ci_high": hi,
            "delta": acc[p.spec] - acc["none"], "delta_ci_low": dlo, "delta_ci_high": dhi,
            "acc_norm": m.get("acc_norm", math.nan), "n_questions": bt.n_questions,
            "point_hash": records[p.spec].point_hash,
        })
    summary = pd.DataFrame(rows)
    summary["seed"] = summary["seed"].astype("Int64")  # blank for non-random rows, not 0.0
    return summary


def tables(points: Sequence[SweepPoint], records: dict[str, PointRecord], cfg: SweepConfig):
    """(summary, within_1pt) DataFrames from stored point records (pure: no model needed)."""
    import pandas as pd

    bt = _bootstrap(points, records, cfg)
    summary = point_summary(points, records, cfg, bt)
    boot, acc, pct, b0, row_of = bt.boot, bt.acc, bt.pct, bt.b0, bt.row_of

    # curves: x = % zeroed (fixed), y = accuracy (observed and per bootstrap resample)
    curves: dict[str, tuple[np.ndarray, np.ndarray, np.ndarray]] = {}
    seed_curves: dict[str, dict[int, tuple[np.ndarray, np.ndarray]]] = {}

    def seeded(name: str) -> None:  # the mean over seeds at each fraction; each seed's curve kept too
        seed_curves[name] = {}
        for s in cfg.random_seeds:
            ss = [p.spec for p in points if p.score_fn == name and p.seed == s]
            seed_curves[name][s] = (np.array([pct[x] for x in ss]), np.array([acc[x] for x in ss]))
        xs, ys, bs = [], [], []
        for f in cfg.fractions:
            ss = [p.spec for p in points if p.score_fn == name and p.fraction == float(f)]
            xs.append(np.mean([pct[s] for s in ss]))
            ys.append(np.mean([acc[s] for s in ss]))
            bs.append(np.mean([boot[row_of[s]] for s in ss], axis=0))
        curves[name] = (np.array(xs), np.array(ys), np.stack(bs))

    for name in [*cfg.score_ids, *cfg.static_curves]:
        if name == STATIC_RANDOM:
            continue
        ss = [p.spec for p in points if p.score_fn == name]
        curves[name] = (np.array([pct[s] for s in ss]), np.array([acc[s] for s in ss]),
                        np.stack([boot[row_of[s]] for s in ss]))
    if cfg.random_seeds:
        seeded(RANDOM)
    if STATIC_RANDOM in cfg.static_curves:
        seeded(STATIC_RANDOM)

    base = acc["none"]
    tied = {sid for sid in cfg.score_ids if _tied(points, sid)}
    x_max = min((c[0].max() for name, c in curves.items() if name not in tied), default=math.nan)
    nan_boot = [math.nan] * len(b0)
    rows = []
    for name, (x, y, yb) in curves.items():
        ok = name not in tied
        w = max_within(x, y, base, cfg.tol) if ok else math.nan
        wb = [max_within(x, yb[:, b], b0[b], cfg.tol) for b in range(yb.shape[1])] if ok else nan_boot
        a = normalised_auc(x, y, base, x_max) if ok else math.nan
        ab = [normalised_auc(x, yb[:, b], b0[b], x_max) for b in range(yb.shape[1])] if ok else nan_boot
        row = {"score_fn": name, "max_pct_zeroed_within_1pt": w,
               "crossing_gap_pct": crossing_gap(x, y, base, cfg.tol) if ok else math.nan,
               "n_ablated_points": int(np.sum(x > 0)) if name in SEEDED else
               len({p.spec for p in points if p.score_fn == name and p.spec != "none"}),
               "note": "" if ok else TIED_NOTE,
               "ci_low": percentile_interval(np.array(wb))[0], "ci_high": percentile_interval(np.array(wb))[1],
               "auc": a, "auc_ci_low": percentile_interval(np.array(ab))[0],
               "auc_ci_high": percentile_interval(np.array(ab))[1], "auc_range_pct": x_max,
               "max_pct_measured": float(x.max()), "base_accuracy": base,
               "n_seeds": len(seed_curves[name]) if name in SEEDED else None,
               "seed_min": math.nan, "seed_max": math.nan}
        if name in SEEDED:
            per_seed = [max_within(sx, sy, base, cfg.tol) for sx, sy in seed_curves[name].values()]
            row["seed_min"], row["seed_max"] = float(np.min(per_seed)), float(np.max(per_seed))
        rows.append(row)
    within = pd.DataFrame(rows)
    if len(within):
        within["n_seeds"] = within["n_seeds"].astype("Int64")
    if len(within):
        within["rank_by_auc"] = within["auc"].rank(ascending=False, method="min")
    return summary, within
