"""Score thresholds that zero a target fraction of heads, from pooled per-input scores.

For one model and task, every score is computed on each (unablated) input and the values
are pooled over inputs x layers x heads (NaNs dropped). For a target fraction p of N
pooled values, with k = ceil(p * N):

* inactive when **low**:  tau = the k-th smallest value (the empirical p-quantile,
  "inverted CDF": the smallest x with #{s <= x} >= p N);
* inactive when **high**: tau = the k-th largest value (the mirror image, i.e. the
  upper-tail (1 - p)-quantile: the largest x with #{s >= x} >= p N).

Together with the inclusive tie rule of ``ScoreAblation`` (``<= tau`` / ``>= tau``) this
zeroes exactly k of the N pooled values when there are no ties (at least k with ties), so
on the calibration inputs the fraction zeroed is ceil(pN)/N >= p. Fraction 0 means no
ablation at all (``None``), not "the minimum value".

``calibrated_spec`` turns a target fraction into the ablation spec ``score:ID@tau`` that the
sweep evaluates at that fraction; ``lens-heads evaluate --ablate score:ahon_ln@10%`` uses it on
the task's own evaluated inputs, so it measures the same point as the sweep's 10 % point.
"""

from __future__ import annotations

import math
import re
from typing import Sequence

import torch
from jaxtyping import Float
from torch import Tensor

from lens_heads.errors import LensHeadsError

DEFAULT_FRACTIONS: tuple[float, ...] = (0.0, 0.05, 0.10, 0.15, 0.20, 0.25, 0.30)
SCORING_BATCH = 8  # inputs per scoring forward; sweeps and evaluate's P% share it, so they get equal thresholds


def check_fraction(p: float) -> float:
    p = float(p)
    if math.isnan(p) or not 0.0 <= p <= 1.0:
        raise LensHeadsError(f"target fraction must be in [0, 1], got {p:g}")
    return p


def parse_fractions(text: str) -> list[float]:
    """``"0,0.05,0.1"`` -> [0.0, 0.05, 0.1] (each checked to lie in [0, 1], duplicates dropped)."""
    out: list[float] = []
    for item in text.split(","):
        item = item.strip()
        if not item:
            continue
        try:
            value = float(item)
        except ValueError:
            raise LensHeadsError(f"bad fraction {item!r}: fractions are numbers in [0, 1], e.g. 0,0.05,0.1") from None
        value = check_fraction(value)
        if value not in out:
            out.append(value)
    if not out:
        raise LensHeadsError("no fractions given (e.g. --fractions 0,0.05,0.1)")
    return out


def threshold_for(values: Float[Tensor, "n"], fraction: float, inactive_when: str) -> float | None:
    """The threshold that zeroes ``fraction`` of ``values`` (see module docstring); None for 0."""
    p = check_fraction(fraction)
    if inactive_when not in ("high", "low"):
        raise LensHeadsError(f"inactive_when must be 'high' or 'low', got {inactive_when!r}")
    v = values.detach().flatten().double()
    v = v[~torch.isnan(v)]
    if p == 0.0:
        return None
    if v.numel() == 0:
        raise LensHeadsError("no score values to take a threshold from (all NaN or no inputs)")
    k = max(1, math.ceil(p * v.numel() - 1e-9))  # guard 0.3 * 10 = 3.0000000000000004
    ordered = torch.sort(v, descending=inactive_when == "high").values
    return float(ordered[k - 1])


def thresholds_from_scores(
    per_input: dict[str, Float[Tensor, "n_inputs layer head"]],
    inactive_when: dict[str, str],
    fractions: Sequence[float],
) -> dict[str, dict[float, float | None]]:
    """{score_id: {fraction: tau}} from per-input scores pooled over inputs x layers x heads."""
    return {sid: {float(p): threshold_for(vals, p, inactive_when[sid]) for p in fractions}
            for sid, vals in per_input.items()}


def compute_thresholds(model, inputs: list[Tensor], score_ids: Sequence[str], fractions: Sequence[float],
                       batch_size: int = SCORING_BATCH, *,
                       progress: bool = True) -> dict[str, dict[float, float | None]]:
    """Score ``inputs`` (unablated) and return thresholds per score id and target fraction."""
    from lens_heads.scores import score_heads

    for p in fractions:
        check_fraction(p)
    if not inputs:
        raise LensHeadsError("no inputs to compute score thresholds from")
    hs = score_heads(model, inputs, scores=list(score_ids), batch_size=batch_size, keep_per_input=True,
                     progress=progress)
    return thresholds_of(hs, score_ids, fractions)


def thresholds_of(hs, score_ids: Sequence[str], fractions: Sequence[float]) -> dict[str, dict[float, float | None]]:
    """Thresholds from the per-input scores of a ``score_heads(..., keep_per_input=True)`` pass."""
    from lens_heads.scores import SCORES

    return thresholds_from_scores({sid: hs.per_input[sid] for sid in score_ids},
                                  {sid: SCORES[sid].inactive_when for sid in score_ids}, fractions)


def score_ablation_spec(score_id: str, tau: float | None) -> str:
    """The per-input ablation spec for threshold ``tau`` ("none" when there is none: fraction 0)."""
    return "none" if tau is None else f"score:{score_id}@{tau!r}"


_PERCENT = re.compile(r"^\s*score:(?P<id>[^@]+)@(?P<pct>[^%]+)%\s*$")


def parse_percent_spec(spec: str) -> tuple[str, float] | None:
    """``"score:ahon_ln@10%"`` -> ``("ahon_ln", 0.1)``; None for any spec not of that form."""
    m = _PERCENT.match(spec)
    if m is None:
        return None
    try:
        pct = float(m["pct"])
    except ValueError:
        raise LensHeadsError(f"bad ablation {spec!r}: {m['pct']!r} is not a percentage; "
                             f"write score:ID@P%, e.g. score:ahon_ln@10%") from None
    if math.isnan(pct) or not 0.0 <= pct <= 100.0:
        raise LensHeadsError(f"bad ablation {spec!r}: the percentage must be in [0, 100]")
    return m["id"].strip(), pct / 100.0


def calibrated_spec(model, inputs: list[Tensor], score_id: str, fraction: float,
                    batch_size: int = SCORING_BATCH, *, progress: bool = True) -> tuple[str, float | None]:
    """(spec, tau): the per-input ablation that zeroes ``fraction`` of the pooled unablated
    scores of ``score_id`` on ``inputs``."""
    taus = compute_thresholds(model, inputs, [score_id], [fraction], batch_size, progress=progress)
    tau = taus[score_id][float(fraction)]
    return score_ablation_spec(score_id, tau), tau
