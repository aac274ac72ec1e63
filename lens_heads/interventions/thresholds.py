"""Score thresholds that zero a target fraction of heads, from pooled per-input scores.

For one model and task, every score is computed on each (unablated) input and the values
are pooled over inputs x layers x heads (NaNs dropped). Two rules turn a target fraction
into a threshold and a comparison (``THRESHOLD_RULES``):

``"quantile"`` (lens_heads' default). For a target fraction p of N pooled values, with
k = ceil(p * N):

* inactive when **low**:  tau = the k-th smallest value (the empirical p-quantile,
  "inverted CDF": the smallest x with #{s <= x} >= p N);
* inactive when **high**: tau = the k-th largest value (the mirror image, i.e. the
  upper-tail (1 - p)-quantile: the largest x with #{s >= x} >= p N).

Together with the inclusive tie rule of ``ScoreAblation`` (``<= tau`` / ``>= tau``) this
zeroes exactly k of the N pooled values when there are no ties (at least k with ties), so
on the calibration inputs the fraction zeroed is ceil(pN)/N >= p. Fraction 0 means no
ablation at all (``None``), not "the minimum value".

``"cdf"`` (the authors' code, which produced the paper's tables). The sorted values x_i
(float32) sit at heights i/N of the empirical CDF; tau is read off it at height p (1 - p
when inactive is high) by linear interpolation between the two bracketing points (height
clamped to [1/N, 1]); heads are zeroed *strictly* (``< tau`` / ``> tau``), so ties at tau stay.
Without ties the two rules zero the same fraction to within 1/N; with ties (grouped-query
value scores repeat over a group's query heads, bf16 rounding) they can differ by the size of
the tied block. Fraction 0 is again no ablation (tau would be the minimum, which ``<`` never
crosses).

``calibrated_spec`` turns a target fraction into the ablation spec ``score:ID@tau`` that the
sweep evaluates at that fraction; ``lens-heads evaluate --ablate score:ahon_ln@10%`` uses it on
the task's own evaluated inputs, so it measures the same point as the sweep's 10 % point.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Sequence

import torch
from jaxtyping import Float
from torch import Tensor

from lens_heads.errors import LensHeadsError
from lens_heads.interventions.specs import ScoreThreshold
from lens_heads import scores as scoring

if TYPE_CHECKING:
    from lens_heads.models.load import LoadedModel

DEFAULT_FRACTIONS: tuple[float, ...] = (0.0, 0.05, 0.10, 0.15, 0.20, 0.25, 0.30)
THRESHOLD_RULES: tuple[str, ...] = ("quantile", "cdf")
DEFAULT_RULE = "quantile"


def check_rule(rule: str) -> str:
    if rule not in THRESHOLD_RULES:
        raise LensHeadsError(f"unknown threshold rule {rule!r}; choose one of: {', '.join(THRESHOLD_RULES)} "
                             f"(quantile: lens_heads' order statistic, inclusive; cdf: the authors' "
                             f"interpolated CDF, strict)")
    return rule


def rule_is_strict(rule: str) -> bool:
    """Whether heads are zeroed strictly beyond the threshold under ``rule``."""
    return check_rule(rule) == "cdf"
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


def threshold_for(values: Float[Tensor, "n"], fraction: float, inactive_when: str,
                  rule: str = DEFAULT_RULE) -> float | None:
    """The threshold that zeroes ``fraction`` of ``values`` under ``rule`` (see module
    docstring); None for 0."""
    p = check_fraction(fraction)
    check_rule(rule)
    if inactive_when not in ("high", "low"):
        raise LensHeadsError(f"inactive_when must be 'high' or 'low', got {inactive_when!r}")
    v = values.detach().flatten().double()
    v = v[torch.isfinite(v)]  # NaN (undefined) and +-inf (a zero layer mean) take no part, as in the authors' CDF
    if p == 0.0:
        return None
    if v.numel() == 0:
        raise LensHeadsError("no score values to take a threshold from (all NaN or no inputs)")
    if rule == "cdf":
        return _cdf_intercept(v.float(), 1.0 - p if inactive_when == "high" else p)
    k = max(1, math.ceil(p * v.numel() - 1e-9))  # guard 0.3 * 10 = 3.0000000000000004
    ordered = torch.sort(v, descending=inactive_when == "high").values
    return float(ordered[k - 1])


def _cdf_intercept(values: Float[Tensor, "n"], height: float) -> float:
    """x at ``height`` on the empirical CDF of ``values`` (float32, linear interpolation)."""
    x = torch.sort(values).values
    n = x.numel()
    if n == 1:
        return float(x[0])
    h = torch.arange(1, n + 1, dtype=torch.float32) / n  # heights i/N, as float32
    y = torch.tensor(height, dtype=torch.float32).clamp(h[0], h[-1])
    i = int(torch.searchsorted(h, y).clamp(1, n - 1))  # first height >= y, bracketing [i-1, i]
    dy = h[i] - h[i - 1]
    frac = (y - h[i - 1]) / (dy if dy != 0 else torch.tensor(1.0))
    return float(x[i - 1] + frac * (x[i] - x[i - 1]))


def thresholds_from_scores(
    per_input: dict[str, Float[Tensor, "n_inputs layer head"]],
    inactive_when: dict[str, str],
    fractions: Sequence[float],
    rule: str = DEFAULT_RULE,
) -> dict[str, dict[float, float | None]]:
    """{score_id: {fraction: tau}} from per-input scores pooled over inputs x layers x heads."""
    return {sid: {float(p): threshold_for(vals, p, inactive_when[sid], rule) for p in fractions}
            for sid, vals in per_input.items()}


def compute_thresholds(model: LoadedModel, inputs: list[Tensor], score_ids: Sequence[str], fractions: Sequence[float],
                       batch_size: int = SCORING_BATCH, *, progress: bool = True,
                       rule: str = DEFAULT_RULE) -> dict[str, dict[float, float | None]]:
    """Score ``inputs`` (unablated) and return thresholds per score id and target fraction."""
    check_rule(rule)
    for p in fractions:
        check_fraction(p)
    if not inputs:
        raise LensHeadsError("no inputs to compute score thresholds from")
    hs = scoring.score_heads(model, inputs, scores=list(score_ids), batch_size=batch_size, keep_per_input=True,
                     progress=progress)
    return thresholds_of(hs, score_ids, fractions, rule)


def scoring_shard_batches(inputs: Sequence[Tensor], batch_size: int, n_shards: int,
                          floor: int | None, prefixes: Sequence[int] | None = None) -> list[list[list[int]]]:
    """The batches (input positions in ``inputs``) of each of ``n_shards`` shards of a scoring
    pass: contiguous runs of whole batches in the pass's own order (``scores.scoring_batches``:
    the inputs of each shared prefix together, ``prefixes`` as ``scores.pass_prefixes`` gives
    them -- None: none, longest first; batches as ``batching.batch_bounds`` forms them with
    ``floor``, the scoring model's ``batch_floor``). A shard's inputs, scored on their own with
    the same batch size and their part of ``prefixes``, form exactly these batches, so the merged
    per-input scores -- the thresholds, and the dataset-level means replayed batch by batch --
    equal the unsharded pass's bit for bit. Shards beyond the number of batches are empty."""
    if isinstance(n_shards, bool) or not isinstance(n_shards, int) or n_shards < 1:
        raise LensHeadsError(f"n_shards must be a positive integer, got {n_shards!r}")
    batches = scoring.scoring_batches(inputs, [0] * len(inputs) if prefixes is None else prefixes,
                                      batch_size, floor)
    cuts = [round(j * len(batches) / n_shards) for j in range(n_shards + 1)]
    return [batches[cuts[j]:cuts[j + 1]] for j in range(n_shards)]


def scoring_shards(inputs: Sequence[Tensor], batch_size: int, n_shards: int, floor: int | None,
                   prefixes: Sequence[int] | None = None) -> list[list[int]]:
    """The inputs (their positions in ``inputs``) of each shard of ``scoring_shard_batches``, in
    the pass's order."""
    return [[i for b in shard for i in b]
            for shard in scoring_shard_batches(inputs, batch_size, n_shards, floor, prefixes)]


def thresholds_of(hs, score_ids: Sequence[str], fractions: Sequence[float],
                  rule: str = DEFAULT_RULE) -> dict[str, dict[float, float | None]]:
    """Thresholds from the per-input scores of a ``score_heads(..., keep_per_input=True)`` pass."""
    return thresholds_from_scores({sid: hs.per_input[sid] for sid in score_ids},
                                  {sid: hs.inactive_when(sid) for sid in score_ids}, fractions, rule)


def score_ablation_spec(score_id: str, tau: float | None, strict: bool = False) -> str:
    """The per-input ablation spec for threshold ``tau`` ("none" when there is none: fraction 0);
    ``strict`` (the authors' rule) zeroes only scores strictly beyond tau."""
    return "none" if tau is None else str(ScoreThreshold(score_id, tau, strict))


def calibrated_spec(model: LoadedModel, inputs: list[Tensor], score_id: str, fraction: float,
                    batch_size: int = SCORING_BATCH, *, progress: bool = True,
                    rule: str = DEFAULT_RULE) -> tuple[str, float | None]:
    """(spec, tau): the per-input ablation that zeroes ``fraction`` of the pooled unablated
    scores of ``score_id`` on ``inputs`` under ``rule``."""
    taus = compute_thresholds(model, inputs, [score_id], [fraction], batch_size, progress=progress, rule=rule)
    tau = taus[score_id][float(fraction)]
    return score_ablation_spec(score_id, tau, rule_is_strict(rule)), tau
