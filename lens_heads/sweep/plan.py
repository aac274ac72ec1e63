"""A sweep's plan: which points, in which order, and which work units are still missing.

``SweepPlan`` is built from a run identity, the config, the task and the thresholds -- no model.
Its units are what an executor runs: the parts of each point (``chunk_questions`` questions
each), in ``compute_order``. A unit is idempotent: its ``StoreKey`` names the one record it
writes, and it is skipped when that record (or its point's) is stored.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, replace
from typing import Iterator, Sequence

from lens_heads.errors import LensHeadsError
from lens_heads.interventions.specs import RandomHeads, StaticHeads
from lens_heads.results.keys import Kind, RunIdentity, StoreKey, replacement_field
from lens_heads.scores.functions import SCORES
from lens_heads.results.store import ResultStore
from lens_heads.sweep.config import BASELINE, RANDOM, SEEDED, STATIC_RANDOM, PointId, SweepConfig, static_name
from lens_heads.sweep.records import StaticScoresRecord, Thresholds, ThresholdsRecord
from lens_heads.interventions.thresholds import score_ablation_spec
from lens_heads.scores.dataset import inactive_when, least_active
from lens_heads.forward.task_requests import select_records
from lens_heads.interventions.specs import parse_spec, with_replacement


@dataclass(frozen=True)
class SweepPoint:
    score_fn: str  # a score id, "random", or the spec of an extra ablation
    fraction: float  # target fraction (nan for extra ablations)
    spec: str  # the ablation spec evaluated ("none" at fraction 0)
    seed: int | None = None  # random seed
    threshold: float | None = None

    @property
    def id(self) -> PointId:
        """The point's name in ``SweepConfig.first``."""
        if math.isnan(self.fraction):
            return PointId(self.spec, math.nan, None, self.spec)
        return PointId(self.score_fn, self.fraction, self.seed if self.score_fn in SEEDED else None)


def point_label(p: SweepPoint) -> str:
    """``str(p.id)``: ``ID@FRACTION``, ``random@FRACTION@SEED``, or an extra ablation's spec."""
    return str(p.id)


StaticScores = dict[str, list]  # static_ranking name -> dataset-level value per head, [layer][head]


def static_rankings(cfg: SweepConfig) -> list[str]:
    """The dataset-level rankings the static curves need: each score id, ``random@SEED`` per seed."""
    return [r for sid in cfg.static_ids for r in ([f"{RANDOM}@{s}" for s in cfg.random_seeds] if sid == RANDOM
                                                  else [sid])]


def static_heads(values, inactive_when: str, fraction: float) -> StaticHeads | None:
    """The ``ceil(fraction * n_heads)`` least active heads by ``values`` ([layer][head]; NaN
    -- a head a pruned layer lacks -- last, never chosen); None when that is no head. The sets of
    one ranking are nested: each fraction's contains the smaller fractions' (docs/methods.md §2)."""

    order = least_active(values, inactive_when)
    defined = [lh for lh in order if math.isfinite(float(values[lh[0]][lh[1]]))]
    k = min(math.ceil(fraction * len(defined) - 1e-9), len(defined))
    return StaticHeads(tuple(defined[:k])) if k > 0 else None


def _static_points(cfg: SweepConfig, static: StaticScores) -> list[SweepPoint]:

    pts = []
    for sid in cfg.static_ids:
        for seed in (cfg.random_seeds if sid == RANDOM else [None]):
            values = static[sid if seed is None else f"{RANDOM}@{seed}"]
            direction = "low" if sid == RANDOM else inactive_when(sid)
            for p in cfg.fractions:
                heads = static_heads(values, direction, float(p)) if p > 0 else None
                pts.append(SweepPoint(static_name(sid), float(p), "none" if heads is None else str(heads), seed))
    return pts


def plan_points(cfg: SweepConfig, thresholds: Thresholds, static: StaticScores | None = None) -> list[SweepPoint]:
    """Every point of the sweep, baseline rows included (fraction 0 -> spec "none"); ``static``:
    the dataset-level values of ``static_rankings(cfg)`` (needed when the sweep has static curves)."""
    if cfg.static_ids and (static is None or any(r not in static for r in static_rankings(cfg))):
        raise LensHeadsError("a sweep with static curves needs the dataset-level scores they rank heads by")
    pts: list[SweepPoint] = []
    for sid in cfg.score_ids:
        for p in cfg.fractions:
            tau = thresholds[sid][float(p)]
            pts.append(SweepPoint(sid, float(p), score_ablation_spec(sid, tau, cfg.protocol.strict), None, tau))
    for s in cfg.random_seeds:
        for p in cfg.fractions:
            spec = "none" if p == 0 else str(RandomHeads(float(p), s))
            pts.append(SweepPoint(RANDOM, float(p), spec, s, None))
    if cfg.static_ids:
        pts.extend(_static_points(cfg, static))
    if not pts:  # extra ablations only (or nothing): still measure the baseline they are compared with
        pts.append(SweepPoint(BASELINE, 0.0, "none"))
    for spec in cfg.extra_labels:
        pts.append(SweepPoint(spec, math.nan, spec))
    if cfg.replacement:  # every ablated point replaces its heads instead of zeroing them (its own keys)
        pts = [p if p.spec == "none" else replace(p, spec=str(with_replacement(parse_spec(p.spec), cfg.replacement)))
               for p in pts]
    return pts


def compute_order(points: Sequence[SweepPoint], first: Sequence[PointId | str] = ()) -> list[str]:
    """Distinct specs in the order they are evaluated: the baseline (every curve's origin), the
    points named in ``first`` (``PointId`` strings, in that order), the random-heads curves,
    per input then static (what every function is compared with), then each function's curve
    whole before the next one (per input, then static), then the extra ablations. A sweep stopped part-way thus holds its reference and
    complete curves, which ``tabulate(..., partial=True)`` can show."""
    by_label = {point_label(p): p for p in points if p.spec != "none"}
    first = [str(f) for f in first]
    unknown = [f for f in first if f not in by_label]
    if unknown:
        raise LensHeadsError(f"first: {unknown[0]!r} is no point of this sweep; its points are "
                             f"{', '.join(list(by_label)[:6])}{', ...' if len(by_label) > 6 else ''}")
    rank = lambda p: (0 if p.spec == "none" else 2 if p.score_fn in SEEDED else 4 if math.isnan(p.fraction) else 3)  # noqa: E731
    ahead = [by_label[f].spec for f in first]
    return list(dict.fromkeys(["none"] * any(p.spec == "none" for p in points) + ahead
                              + [p.spec for p in sorted(points, key=rank)]))  # stable within a rank


def partial_config(cfg: SweepConfig, points: Sequence[SweepPoint], stored: set[str]) -> SweepConfig:
    """``cfg`` narrowed to what ``stored`` (specs) completes: the score functions, random seeds
    and static curves whose every point is stored (static random heads only when their seeds are
    the per-input random curve's), and the stored extra ablations."""

    def whole(keep) -> bool:
        return all(p.spec in stored for p in points if keep(p))

    seeds = [s for s in cfg.random_seeds if whole(lambda p: p.score_fn == RANDOM and p.seed == s)]
    static_seeds = [s for s in cfg.random_seeds if whole(lambda p: p.score_fn == STATIC_RANDOM and p.seed == s)]
    static = [sid for sid in cfg.static_ids if sid != RANDOM and whole(lambda p: p.score_fn == static_name(sid))]
    if RANDOM in cfg.static_ids and static_seeds == seeds and seeds:  # one seed list serves both random curves
        static.append(RANDOM)
    return replace(cfg, score_ids=[sid for sid in cfg.score_ids if whole(lambda p: p.score_fn == sid)],
                   random_seeds=seeds, static_ids=[s for s in cfg.static_ids if s in static],
                   extra_ablations=[e for e in cfg.extra_ablations if str(e) in stored])


# -----------------------------------------------------------------------------
# Thresholds in the store


def thresholds_key(identity: RunIdentity, cfg: SweepConfig) -> StoreKey:
    return identity.thresholds(cfg.score_ids, cfg.fractions, cfg.replacement_text)


def stored_thresholds(store: ResultStore, identity: RunIdentity, cfg: SweepConfig) -> ThresholdsRecord | None:
    """The stored thresholds of ``cfg``'s functions and fractions: the record of exactly this
    sweep, else, function by function, those of records from sweeps of the same run identity
    that scored the function (among others, under its current definition) at these fractions
    (among others). A function's thresholds come from its own pooled scores alone, so they do
    not depend on what else that pass scored; None unless every function is found."""
    rec = store.load(thresholds_key(identity, cfg), ThresholdsRecord)
    if rec is not None:
        return rec
    fractions = {float(p) for p in cfg.fractions}
    same = json.loads(json.dumps({**identity.config(), "kind": Kind.THRESHOLDS.value}, default=str))
    mine = thresholds_key(identity, cfg).config
    revisions = mine.get("score_revisions", {})
    found: dict[str, dict] = {}
    n_inputs = None
    per_function = ("score_ids", "fractions", "score_revisions",
                    *(replacement_field(s) for s, fn in SCORES.items() if fn.replacement_dependent))
    for data in store.records(Kind.THRESHOLDS):
        c = data.get("config", {})
        theirs = c.get("score_revisions", {})
        if ({k: v for k, v in c.items() if k not in per_function} != same
                or not fractions <= set(c.get("fractions", []))):
            continue
        rec = ThresholdsRecord.from_json(data)
        for sid in cfg.score_ids:
            if c.get(replacement_field(sid)) != mine.get(replacement_field(sid)):
                continue  # a score whose values depend on the replacement: under another, another score
            if sid not in found and sid in c.get("score_ids", []) and theirs.get(sid, 1) == revisions.get(sid, 1):
                found[sid] = {p: t for p, t in rec.thresholds[sid].items() if p in fractions}
                n_inputs = rec.n_inputs
        if len(found) == len(cfg.score_ids):
            return ThresholdsRecord({sid: found[sid] for sid in cfg.score_ids}, n_inputs)
    return None


def static_key(identity: RunIdentity, cfg: SweepConfig, ranking: str) -> StoreKey:
    """Where the dataset-level values of one of ``static_rankings(cfg)`` are stored."""
    return identity.static_scores(ranking, cfg.replacement_text)


def stored_static(store: ResultStore, identity: RunIdentity, cfg: SweepConfig) -> StaticScores | None:
    """The stored values of every ranking the sweep's static curves need; None while any is missing."""
    out: StaticScores = {}
    for r in static_rankings(cfg):
        rec = store.load(static_key(identity, cfg, r), StaticScoresRecord)
        if rec is None:
            return None
        out[r] = rec.mean
    return out


def put_thresholds(store: ResultStore, identity: RunIdentity, cfg: SweepConfig, computed: Thresholds,
                   n_inputs: int) -> ThresholdsRecord:
    """Store a sweep's thresholds ({score_id: {fraction: tau}}), from its own scoring pass or from a
    caller's pass over the same inputs (``task_inputs`` of the sweep, ``cfg.threshold_batch_size``)."""
    rec = ThresholdsRecord({sid: {float(p): t for p, t in d.items()} for sid, d in computed.items()}, n_inputs)
    store.save(thresholds_key(identity, cfg), rec)
    return rec


# -----------------------------------------------------------------------------
# Work units


@dataclass(frozen=True)
class PartUnit:
    """One unit of work: evaluate ``spec`` on ``doc_ids`` and store the part under ``key``."""

    spec: str
    point: StoreKey  # the point this part belongs to
    key: StoreKey
    doc_ids: tuple[int, ...]


@dataclass
class SweepPlan:
    """The points of one sweep and the store keys of every point and part (no model needed)."""

    identity: RunIdentity
    cfg: SweepConfig
    thresholds: Thresholds
    points: list[SweepPoint]
    order: list[str]  # distinct specs, in compute order
    doc_ids: list[int]  # the evaluated questions, in order

    @classmethod
    def build(cls, identity: RunIdentity, cfg: SweepConfig, task, thresholds: Thresholds,
              static: StaticScores | None = None) -> "SweepPlan":

        points = plan_points(cfg, thresholds, static)
        return cls(identity, cfg, thresholds, points, compute_order(points, cfg.first),
                   [r.doc_id for r in select_records(task, cfg.limit, cfg.seed)])

    def point(self, spec: str) -> SweepPoint:
        return next(p for p in self.points if p.spec == spec)

    def point_key(self, spec: str) -> StoreKey:
        return self.identity.point(spec, self.point(spec).score_fn)

    def parts(self, spec: str) -> list[PartUnit]:
        """The point's questions in runs of ``cfg.chunk_questions`` doc ids."""
        key, ids = self.point_key(spec), self.doc_ids
        size = self.cfg.chunk_questions or len(ids)
        return [PartUnit(spec, key, key.part(ids[i:i + size]), tuple(ids[i:i + size]))
                for i in range(0, len(ids), size)]

    @property
    def all_units(self) -> list[PartUnit]:
        """Every part unit in compute order (``UnitRef("part", i)`` is the i-th)."""
        return [u for spec in self.order for u in self.parts(spec)]

    def units(self, store: ResultStore | None = None) -> Iterator[PartUnit]:
        """Every part unit in compute order; with ``store``, only those whose point and part
        records are both missing."""
        for spec in self.order:
            if store is not None and store.has(self.point_key(spec)):
                continue
            for unit in self.parts(spec):
                if store is None or not store.has(unit.key):
                    yield unit

    def stored(self, store: ResultStore) -> set[str]:
        """The specs whose point record is stored."""
        return {spec for spec in self.order if store.has(self.point_key(spec))}
