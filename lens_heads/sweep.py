"""Ablation sweeps: accuracy vs % of heads zeroed, per score function and for random heads.

One sweep, for one model and task::

    cfg = SweepConfig(task="mmlu", score_ids=["awft", "ahon_ln"], limit=200)
    result = run_sweep(model, cfg, out_dir="runs/smollm2-mmlu")
    result.summary        # one row per (score_fn, fraction[, seed]) point
    result.within         # per function: max % zeroed within 1 point, normalised AUC

Plan:
1. the unablated baseline (spec ``none``) -- every curve's point at fraction 0;
2. thresholds per score function from the pooled per-input scores of the task's unablated
   request sequences (``thresholds.compute_thresholds`` on ``evaluate.task_inputs``);
3. ``random:p@s`` for each seed x fraction > 0, ``score:ID@tau`` for each function x fraction
   > 0, and any fixed ``extra_ablations`` (e.g. ``static:...``), evaluated in that order
   (``compute_order``: the random reference first, then each function's curve whole), so a
   sweep stopped part-way can already be tabulated (``run_sweep(..., partial=True)``).
   ``first`` names points to evaluate right after the baseline (``point_label``:
   ``ahon_ln@0.1``, ``random@0.1@0``), for a sweep that cannot finish where it runs: the
   points that answer the question at hand are then stored before the rest.

Every point is evaluated with ``evaluate.evaluate_task(..., ablation=...)`` and stored as one
JSON file in a ``ResultStore`` (``DIR/points/<hash>.json``), keyed by a hash of what
determines it: model digest, task fingerprint, n_shot, limit, few-shot seed, dtype,
ablation spec, package version, the non-default settings of ``cfg.protocol`` and a score
function's definition revision where it changed (the batch size is deliberately not part of
the key). Thresholds are stored the same way (``DIR/thresholds``), from one scoring pass or
from the authors' ``thresholds.json`` (``cfg.thresholds_file``). A point is evaluated in parts
of ``chunk_questions`` questions, each stored (``DIR/parts``) until the point is complete, so a
sweep killed at any moment resumes by computing only the missing parts and points, and its
tables are computed from the stored records alone, so they equal those of an uninterrupted run.
Each part, and the scoring pass, is claimed first (``lens_heads.claims``): processes sharing
one folder take different units, and one waits for a unit another live process holds.

Statistics (all on accuracy as a fraction in [0, 1]; "1 point" = ``tol`` = 0.01):

* per point: a percentile bootstrap interval over questions (``n_boot`` resamples, seeded),
  and the difference to the baseline with a *paired* interval (the same resampled
  questions for both);
* per function: ``curves.max_within`` (largest % zeroed with accuracy >= base - 1 point, last
  crossing of the interpolated curve) and ``curves.normalised_auc`` over the common range
  [0, R], R = the smallest of the curves' largest measured % zeroed; both with bootstrap
  intervals (the whole curve is recomputed on each resample of the questions);
* ``random``: its curve is the mean over seeds at each fraction (mean % zeroed, mean
  accuracy); ``seed_min``/``seed_max`` give the range of the per-seed within-1-point values;
* ``crossing_gap_pct``: the distance between the measured points that bracket the crossing
  (0 when the value is a lower bound); the wider it is, the more the value is interpolation;
* a score function whose thresholds coincide for every target fraction (its values tie across
  heads, e.g. a layer-normalised value norm with one KV head per layer, identically 1) has one
  ablated point, not a curve: its within-1-point value and AUC are NaN, ``note`` says why, and
  it is left out of the common AUC range and the ranking.
"""

from __future__ import annotations

import hashlib
import json
import math
import time
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Sequence

import numpy as np

from lens_heads.claims import claim, wait_for
from lens_heads.curves import bootstrap_indices, crossing_gap, max_within, normalised_auc, percentile_interval
from lens_heads.errors import LensHeadsError
from lens_heads.models.load import model_digest
from lens_heads.interventions import RandomHeads
from lens_heads.protocol import Protocol, load_authors_thresholds, thresholds_for_sweep
from lens_heads.scores.functions import revision_key
from lens_heads.atomic import atomic_write_csv
from lens_heads.store import ResultStore
from lens_heads.thresholds import DEFAULT_FRACTIONS, SCORING_BATCH, check_fraction, score_ablation_spec

CLAIM_POLL_S = 2.0  # how often a process waiting for another's unit looks again
RANDOM = "random"
BASELINE = "baseline"  # score_fn of the unablated point when no curve supplies it
TIED_NOTE = "ties: one threshold for every fraction, so no curve"


@dataclass
class SweepConfig:
    task: str  # a task name ("mmlu", "piqa", "winogrande") or "file:..." spec
    score_ids: list[str]
    fractions: list[float] = field(default_factory=lambda: list(DEFAULT_FRACTIONS))
    random_seeds: list[int] = field(default_factory=lambda: [0, 1, 2])
    n_shot: int | None = None  # None: the task's default
    limit: int | None = None
    seed: int = 1234  # few-shot sampling seed (lm-eval's default)
    batch_size: int = 16
    extra_ablations: list[str] = field(default_factory=list)
    n_boot: int = 1000
    boot_seed: int = 0
    tol: float = 0.01  # one accuracy point
    threshold_batch_size: int = SCORING_BATCH
    chunk_questions: int | None = 250  # questions per stored part of a point (None: one part); not in the key
    first: list[str] = field(default_factory=list)  # point labels evaluated right after the baseline; not in the key
    protocol: Protocol = field(default_factory=Protocol)  # BOS, chat template, threshold rule
    thresholds_file: str | None = None  # the authors' thresholds.json instead of a scoring pass
    thresholds_model: str | None = None  # its model key (hub id), with thresholds_file

    def validate(self) -> None:
        """Check the settings; fractions become sorted, unique and always include 0 (the baseline)."""
        self.fractions = sorted({0.0, *(check_fraction(p) for p in self.fractions)})
        self.random_seeds = list(dict.fromkeys(int(s) for s in self.random_seeds))
        self.score_ids = list(dict.fromkeys(self.score_ids))
        if self.limit is not None and self.limit < 1:
            raise LensHeadsError(f"limit must be >= 1, got {self.limit}")
        if self.n_shot is not None and self.n_shot < 0:
            raise LensHeadsError(f"n_shot must be >= 0, got {self.n_shot}")
        if any(s < 0 for s in self.random_seeds):
            raise LensHeadsError("random seeds must be >= 0")
        if self.batch_size < 1:
            raise LensHeadsError(f"batch_size must be >= 1, got {self.batch_size}")
        if self.chunk_questions is not None and self.chunk_questions < 1:
            raise LensHeadsError(f"chunk_questions must be >= 1, got {self.chunk_questions}")
        if not isinstance(self.protocol, Protocol):
            raise LensHeadsError(f"protocol must be a lens_heads.protocol.Protocol, got {type(self.protocol).__name__}")
        if (self.thresholds_file is None) != (self.thresholds_model is None):
            raise LensHeadsError("thresholds_file and thresholds_model go together (the file's model key)")
        self.first = list(dict.fromkeys(self._first_label(f) for f in self.first))

    def _first_label(self, label: str) -> str:
        """``label`` in ``point_label``'s canonical form, checked against this sweep's plan
        (before any threshold is computed)."""
        if label in self.extra_ablations:
            return label
        name, *rest = label.strip().split("@")
        form = "ID@FRACTION or random@FRACTION@SEED"
        try:
            fraction = float(rest[0])
            seed = int(rest[1]) if len(rest) == 2 else None
        except (IndexError, ValueError):
            raise LensHeadsError(f"first: bad point {label!r}; write {form}") from None
        if len(rest) != (2 if name == RANDOM else 1):
            raise LensHeadsError(f"first: bad point {label!r}; write {form}")
        if fraction == 0 or fraction not in self.fractions:
            raise LensHeadsError(f"first: {label!r}: the sweep's fractions > 0 are "
                                 f"{', '.join(f'{p:g}' for p in self.fractions if p > 0)}")
        if name == RANDOM and seed not in self.random_seeds:
            raise LensHeadsError(f"first: {label!r}: the sweep's random seeds are {self.random_seeds}")
        if name != RANDOM and name not in self.score_ids:
            raise LensHeadsError(f"first: {label!r}: {name!r} is not among the sweep's score functions")
        return f"{name}@{fraction:g}" + (f"@{seed}" if name == RANDOM else "")


@dataclass(frozen=True)
class SweepPoint:
    score_fn: str  # a score id, "random", or the spec of an extra ablation
    fraction: float  # target fraction (nan for extra ablations)
    spec: str  # the ablation spec evaluated ("none" at fraction 0)
    seed: int | None = None  # random seed
    threshold: float | None = None


@dataclass
class SweepResult:
    summary: object  # pandas DataFrame
    within: object  # pandas DataFrame
    thresholds: dict[str, dict[float, float | None]]
    records: dict[str, dict]  # spec -> stored point record
    n_points: int = 0  # distinct points the sweep plans
    n_stored: int = 0  # of which the store holds (== n_points unless partial)

    @property
    def complete(self) -> bool:
        return self.n_stored == self.n_points


# -----------------------------------------------------------------------------
# Identity of what is evaluated


def task_fingerprint(task) -> str:
    """sha256 over the task's name, split and records (question, choices, gold, subject)."""
    h = hashlib.sha256(f"{task.name}|{task.split}|{task.source}".encode())
    for r in task.records:
        h.update(json.dumps([r.doc_id, r.question, r.choices, r.gold, r.subject], default=str).encode())
    return h.hexdigest()


def base_config(model, task, cfg: SweepConfig) -> dict:
    from lens_heads.provenance import lens_heads_version

    return {
        "model_digest": model_digest(model),
        "task": cfg.task,
        "task_fingerprint": task_fingerprint(task),
        "n_shot": task.spec.n_shot if cfg.n_shot is None else cfg.n_shot,
        "limit": cfg.limit,
        "seed": cfg.seed,
        "dtype": str(model.dtype).removeprefix("torch."),
        "version": lens_heads_version(),
        **cfg.protocol.key(),  # nothing for the default protocol: its keys are as before
    }


# -----------------------------------------------------------------------------
# Planning


def threshold_config(base: dict, cfg: SweepConfig) -> dict:
    revisions = revision_key(cfg.score_ids)
    return {**base, "kind": "thresholds", "score_ids": list(cfg.score_ids),
            "fractions": sorted(float(p) for p in cfg.fractions),
            **({"score_revisions": revisions} if revisions else {})}


def static_scores_config(base: dict, score_id: str) -> dict:
    """The store key of a dataset-level ranking by ``score_id`` on a sweep's inputs (the static
    ablation's head order), with the function's revision when its definition changed."""
    revisions = revision_key([score_id])
    return {**base, "kind": "static_scores", "score": score_id,
            **({"score_revision": revisions[score_id]} if revisions else {})}


def point_config(base: dict, point: SweepPoint) -> dict:
    """A point's store key: the run identity, its ablation spec, and its score function's
    revision when that definition has changed (so an old definition's point is never reused)."""
    revisions = revision_key([point.score_fn]) if point.spec != "none" else {}  # the baseline is shared
    return {**base, "kind": "point", "ablation": point.spec,
            **({"score_revision": revisions[point.score_fn]} if revisions else {})}


def stored_thresholds(store: ResultStore, base: dict, cfg: SweepConfig) -> dict | None:
    """The stored thresholds of ``cfg``'s functions and fractions: the record of exactly this
    sweep, else, function by function, those of records from sweeps of the same model, task and
    inputs that scored the function (among others, under its current definition) at these
    fractions (among others). A function's thresholds come from its own pooled scores alone, so
    they do not depend on what else that pass scored; None unless every function is found."""
    rec = store.get("thresholds", threshold_config(base, cfg))
    if rec is not None:
        return rec
    fractions = {float(p) for p in cfg.fractions}
    same = json.loads(json.dumps({**base, "kind": "thresholds"}, default=str))
    revisions = revision_key(cfg.score_ids)
    found: dict[str, dict] = {}
    for rec in store.records("thresholds"):
        c = rec.get("config", {})
        theirs = c.get("score_revisions", {})
        if ({k: v for k, v in c.items() if k not in ("score_ids", "fractions", "score_revisions")} != same
                or not fractions <= set(c.get("fractions", []))):
            continue
        for sid in cfg.score_ids:
            if sid not in found and sid in c.get("score_ids", []) and theirs.get(sid, 1) == revisions.get(sid, 1):
                found[sid] = {p: t for p, t in rec["thresholds"][sid].items() if float(p) in fractions}
        if len(found) == len(cfg.score_ids):
            return {**rec, "thresholds": {sid: found[sid] for sid in cfg.score_ids}}
    return None


def put_thresholds(store: ResultStore, base: dict, cfg: SweepConfig, computed: dict, n_inputs: int) -> dict:
    """Store a sweep's thresholds ({score_id: {fraction: tau}}), from its own scoring pass or from a
    caller's pass over the same inputs (``task_inputs`` of the sweep, ``cfg.threshold_batch_size``)."""
    stored = {"thresholds": {sid: {repr(p): t for p, t in d.items()} for sid, d in computed.items()},
              "n_inputs": n_inputs}
    store.put("thresholds", threshold_config(base, cfg), stored)
    return stored


def plan_points(cfg: SweepConfig, thresholds: dict[str, dict[float, float | None]]) -> list[SweepPoint]:
    """Every point of the sweep, baseline rows included (fraction 0 -> spec "none")."""
    pts: list[SweepPoint] = []
    for sid in cfg.score_ids:
        for p in cfg.fractions:
            tau = thresholds[sid][float(p)]
            pts.append(SweepPoint(sid, float(p), score_ablation_spec(sid, tau, cfg.protocol.strict), None, tau))
    for s in cfg.random_seeds:
        for p in cfg.fractions:
            spec = "none" if p == 0 else str(RandomHeads(float(p), s))
            pts.append(SweepPoint(RANDOM, float(p), spec, s, None))
    if not pts:  # extra ablations only (or nothing): still measure the baseline they are compared with
        pts.append(SweepPoint(BASELINE, 0.0, "none"))
    for spec in cfg.extra_ablations:
        pts.append(SweepPoint(spec, math.nan, spec))
    return pts


def point_label(p: SweepPoint) -> str:
    """A point's name in ``SweepConfig.first``: ``ID@FRACTION``, ``random@FRACTION@SEED``, or
    an extra ablation's spec."""
    if math.isnan(p.fraction):
        return p.spec
    return f"{p.score_fn}@{p.fraction:g}" + (f"@{p.seed}" if p.score_fn == RANDOM else "")


def compute_order(points: Sequence[SweepPoint], first: Sequence[str] = ()) -> list[str]:
    """Distinct specs in the order they are evaluated: the baseline (every curve's origin), the
    points labelled in ``first`` (``point_label``, in that order), the random-heads curves (what
    every function is compared with), then each function's curve whole before the next one,
    then the extra ablations. A sweep stopped part-way thus holds its reference and complete
    curves, which ``run_sweep(..., partial=True)`` can tabulate."""
    by_label = {point_label(p): p for p in points if p.spec != "none"}
    unknown = [f for f in first if f not in by_label]
    if unknown:
        raise LensHeadsError(f"first: {unknown[0]!r} is no point of this sweep; its points are "
                             f"{', '.join(list(by_label)[:6])}{', ...' if len(by_label) > 6 else ''}")
    rank = lambda p: (0 if p.spec == "none" else 2 if p.score_fn == RANDOM else 4 if math.isnan(p.fraction) else 3)  # noqa: E731
    ahead = [by_label[f].spec for f in first]
    return list(dict.fromkeys(["none"] * any(p.spec == "none" for p in points) + ahead
                              + [p.spec for p in sorted(points, key=rank)]))  # stable within a rank


def _point_record(result) -> dict:
    return {
        "task": result.task, "n_shot": result.n_shot, "metrics": result.metrics,
        "zeroed_fraction": result.zeroed_fraction,
        "questions": [asdict(q) for q in result.questions],
        "eval_config": result.config,
    }


def _part_configs(task, cfg: SweepConfig, pcfg: dict) -> list[dict]:
    """Store keys of a point's parts: its questions in runs of ``cfg.chunk_questions`` doc ids."""
    from lens_heads.evaluate import select_records

    ids = [r.doc_id for r in select_records(task, cfg.limit, cfg.seed)]
    size = cfg.chunk_questions or len(ids)
    return [{**pcfg, "kind": "part", "doc_ids": ids[i:i + size]} for i in range(0, len(ids), size)]


def _evaluate_point(model, task, cfg: SweepConfig, spec: str, store: ResultStore, pcfg: dict) -> dict | None:
    """Evaluate one point part by part, storing each part, so a killed run loses at most one part.

    Each part is claimed first (``claims``): a part another live process is computing is left
    to it, and None is returned while any part is missing (the caller comes back to the point).
    Every question's prompt, and every ablation's decision, depends only on that question, so
    the merged record equals one evaluation of all the questions: accuracy is the mean over
    questions (MMLU's size-weighted subjects included) and the zeroed fraction adds up counts.
    """
    from lens_heads.ablation import parse_ablation
    from lens_heads.evaluate import evaluate_task

    point = store.path("points", pcfg)
    parts, missing = [], False
    for part in _part_configs(task, cfg, pcfg):
        rec = store.get("parts", part)
        if rec is None:
            with claim(store.path("parts", part)) as mine:
                if not mine:  # another process is on it
                    missing = True
                    continue
                if point.is_file():  # merged meanwhile by another process (which then dropped the parts)
                    return store.get("points", pcfg)
                rec = store.get("parts", part)
                if rec is None:
                    ablation = parse_ablation(spec, model.geometry)
                    result = evaluate_task(model, task, n_shot=cfg.n_shot, seed=cfg.seed, ablation=ablation,
                                           batch_size=cfg.batch_size, progress=False, doc_ids=part["doc_ids"],
                                           protocol=cfg.protocol)
                    rec = _point_record(result)
                    store.put("parts", part, rec)
        parts.append(rec)
    if missing:
        return None
    return _merge_parts(parts, cfg.limit)


def _merge_parts(parts: list[dict], limit: int | None) -> dict:
    questions = [q for p in parts for q in p["questions"]]
    from lens_heads.evaluate import accuracy_metrics

    metrics = accuracy_metrics(questions, "acc_norm" in parts[0]["metrics"])
    counts = [p["eval_config"].get("zeroed_units") for p in parts]
    if all(c is not None for c in counts):
        zeroed, units = (sum(c[i] for c in counts) for i in (0, 1))
        zf = zeroed / units if units else math.nan
    else:
        zf, zeroed = parts[0]["zeroed_fraction"], None
    config = dict(parts[0]["eval_config"])
    for k in ("n_questions", "n_requests", "seconds"):
        config[k] = sum(p["eval_config"][k] for p in parts)
    config.update(limit=limit, doc_ids=None, n_parts=len(parts),
                  zeroed_units=None if zeroed is None else [zeroed, units])
    return {**parts[0], "metrics": metrics, "zeroed_fraction": zf, "questions": questions, "eval_config": config}


# -----------------------------------------------------------------------------
# Running


def run_sweep(model, cfg: SweepConfig, out_dir, task=None, progress: bool = True,
              compute: bool = True, partial: bool = False) -> SweepResult | None:
    """Run (or resume) a sweep, writing points under ``out_dir`` and the two CSV tables.

    ``compute=False`` only reads the store: None (and nothing written) when it lacks anything.
    ``compute=False, partial=True`` tabulates what a sweep still running (or stopped) holds:
    ``summary`` has a row for every stored point (``in_curve``: whether it belongs to a
    complete curve), ``within`` the curves whose every point is stored (``partial_config``);
    nothing is written; None without the thresholds or the
    baseline. Its within-1-point values are final, its AUCs are not (their common range
    depends on the curves still missing)."""
    from tqdm.auto import tqdm

    from lens_heads.ablation import parse_ablation
    from lens_heads.data import load_task
    from lens_heads.evaluate import task_inputs
    from lens_heads.thresholds import compute_thresholds

    cfg.validate()
    task = task if task is not None else load_task(cfg.task)
    specs = [parse_ablation(s, model.geometry) for s in cfg.extra_ablations]  # validate before writing
    del specs
    store = ResultStore(out_dir)
    base = base_config(model, task, cfg)

    # thresholds (one scoring pass over the unablated request sequences, stored)
    thresholds: dict[str, dict[float, float | None]] = {sid: {} for sid in cfg.score_ids}
    if cfg.score_ids and cfg.thresholds_file is not None:  # the authors' own thresholds
        table = load_authors_thresholds(cfg.thresholds_file, task.name, cfg.thresholds_model)
        thresholds = thresholds_for_sweep(table, cfg.score_ids, cfg.fractions,
                                          f"{cfg.thresholds_file} ({cfg.thresholds_model})")
    elif cfg.score_ids:
        stored = stored_thresholds(store, base, cfg)
        if stored is None and not compute:
            return None
        while stored is None:  # one scoring pass, by whichever process claims it
            path = store.path("thresholds", threshold_config(base, cfg))
            with claim(path) as mine:
                if mine and not path.is_file():
                    inputs = task_inputs(model, task, cfg.n_shot, cfg.limit, cfg.seed, cfg.protocol)
                    computed = compute_thresholds(model, inputs, cfg.score_ids, cfg.fractions,
                                                  cfg.threshold_batch_size, progress=progress,
                                                  rule=cfg.protocol.threshold_rule)
                    stored = put_thresholds(store, base, cfg, computed, len(inputs))
            if stored is None:
                wait_for(path, CLAIM_POLL_S)
                stored = store.get("thresholds", threshold_config(base, cfg))
        thresholds = {sid: {float(p): t for p, t in d.items()} for sid, d in stored["thresholds"].items()}

    points = plan_points(cfg, thresholds)
    todo = compute_order(points, cfg.first)
    by_spec = {p.spec: p for p in points}
    point_cfg = lambda spec: point_config(base, by_spec[spec])  # noqa: E731
    stored = {spec for spec in todo if store.path("points", point_cfg(spec)).is_file()}
    if not compute and len(stored) < len(todo):
        if not partial or "none" not in stored:
            return None
        part_cfg = partial_config(cfg, points, stored)
        part_points = [p for p in plan_points(part_cfg, thresholds) if p.spec in stored]
        done = [p for p in points if p.spec in stored]  # also the points of curves not complete yet
        records = {spec: store.get("points", point_cfg(spec)) for spec in dict.fromkeys(p.spec for p in done)}
        _, within = tables(part_points, records, part_cfg)
        summary = point_summary(done, records, cfg)
        summary["in_curve"] = summary["spec"].isin({p.spec for p in part_points})  # False: a curve still incomplete
        return SweepResult(summary, within, thresholds, records, n_points=len(todo), n_stored=len(stored))
    records: dict[str, dict] = {}
    bar = tqdm(total=len(todo), desc="sweep points", unit="point", disable=not progress)
    try:
        pending = list(todo)
        while pending:  # points whose parts other processes hold come round again
            deferred = []
            for spec in pending:
                pcfg = point_cfg(spec)
                rec = store.get("points", pcfg)
                if rec is None:
                    bar.set_postfix_str(spec, refresh=True)
                    rec = _evaluate_point(model, task, cfg, spec, store, pcfg)
                    if rec is None:
                        deferred.append(spec)
                        continue
                    rec["point_hash"] = store.path("points", pcfg).stem
                    store.put("points", pcfg, rec)  # the point first, then its parts go
                    for part in _part_configs(task, cfg, pcfg):
                        store.discard("parts", part)
                records[spec] = rec
                bar.update(1)
            if deferred and len(deferred) == len(pending):  # all of it held elsewhere: wait for it
                time.sleep(CLAIM_POLL_S)
            pending = deferred
    finally:
        bar.close()

    summary, within = tables(points, records, cfg)
    out = Path(out_dir)
    atomic_write_csv(summary, out / "summary.csv", make_parents=True)
    atomic_write_csv(within, out / "within_1pt.csv", make_parents=True)
    return SweepResult(summary, within, thresholds, records, n_points=len(todo), n_stored=len(todo))


def partial_config(cfg: SweepConfig, points: Sequence[SweepPoint], stored: set[str]) -> SweepConfig:
    """``cfg`` narrowed to what ``stored`` (specs) completes: the score functions and random
    seeds whose every point is stored, and the stored extra ablations."""

    def whole(keep) -> bool:
        return all(p.spec in stored for p in points if keep(p))

    return replace(cfg, score_ids=[sid for sid in cfg.score_ids if whole(lambda p: p.score_fn == sid)],
                   random_seeds=[s for s in cfg.random_seeds if whole(lambda p: p.score_fn == RANDOM and p.seed == s)],
                   extra_ablations=[e for e in cfg.extra_ablations if e in stored])


# -----------------------------------------------------------------------------
# Tables


def _correct_matrix(specs: Sequence[str], records: dict[str, dict]) -> np.ndarray:
    """[n_specs, n_questions] 0/1 correctness, questions aligned by doc_id."""
    ref = [q["doc_id"] for q in records["none"]["questions"]]
    rows = []
    for spec in specs:
        by_id = {q["doc_id"]: q["correct"] for q in records[spec]["questions"]}
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


def _bootstrap(points: Sequence[SweepPoint], records: dict[str, dict], cfg: SweepConfig) -> _Boot:
    specs = list(dict.fromkeys(p.spec for p in points))
    C = _correct_matrix(specs, records)  # [spec, question]
    n_q = C.shape[1]
    if n_q == 0:
        raise LensHeadsError("the sweep evaluated no questions")
    idx = bootstrap_indices(n_q, cfg.n_boot, cfg.boot_seed)
    counts = np.stack([np.bincount(row, minlength=n_q) for row in idx])  # [boot, question]
    row_of = {s: i for i, s in enumerate(specs)}
    return _Boot(row_of, C @ counts.T / n_q,  # accuracies on each resample
                 {s: float(records[s]["metrics"].get("acc", C[row_of[s]].mean())) for s in specs},
                 {s: 100.0 * float(records[s]["zeroed_fraction"] or 0.0) for s in specs}, n_q)


def point_summary(points: Sequence[SweepPoint], records: dict[str, dict], cfg: SweepConfig,
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
        m = records[p.spec]["metrics"]
        rows.append({
            "score_fn": p.score_fn, "fraction": p.fraction, "seed": p.seed, "threshold": p.threshold,
            "spec": p.spec, "pct_zeroed": pct[p.spec], "accuracy": acc[p.spec], "ci_low": lo, "ci_high": hi,
            "delta": acc[p.spec] - acc["none"], "delta_ci_low": dlo, "delta_ci_high": dhi,
            "acc_norm": m.get("acc_norm", math.nan), "n_questions": bt.n_questions,
            "point_hash": records[p.spec].get("point_hash"),
        })
    summary = pd.DataFrame(rows)
    summary["seed"] = summary["seed"].astype("Int64")  # blank for non-random rows, not 0.0
    return summary


def tables(points: Sequence[SweepPoint], records: dict[str, dict], cfg: SweepConfig):
    """(summary, within_1pt) DataFrames from stored point records (pure: no model needed)."""
    import pandas as pd

    bt = _bootstrap(points, records, cfg)
    summary = point_summary(points, records, cfg, bt)
    boot, acc, pct, b0, row_of = bt.boot, bt.acc, bt.pct, bt.b0, bt.row_of

    # curves: x = % zeroed (fixed), y = accuracy (observed and per bootstrap resample)
    curves: dict[str, tuple[np.ndarray, np.ndarray, np.ndarray]] = {}
    for sid in cfg.score_ids:
        ss = [p.spec for p in points if p.score_fn == sid]
        curves[sid] = (np.array([pct[s] for s in ss]), np.array([acc[s] for s in ss]),
                       np.stack([boot[row_of[s]] for s in ss]))
    seed_curves = {}
    if cfg.random_seeds:
        for s in cfg.random_seeds:
            ss = [p.spec for p in points if p.score_fn == RANDOM and p.seed == s]
            seed_curves[s] = (np.array([pct[x] for x in ss]), np.array([acc[x] for x in ss]))
        xs, ys, bs = [], [], []
        for f in cfg.fractions:
            ss = [p.spec for p in points if p.score_fn == RANDOM and p.fraction == float(f)]
            xs.append(np.mean([pct[s] for s in ss]))
            ys.append(np.mean([acc[s] for s in ss]))
            bs.append(np.mean([boot[row_of[s]] for s in ss], axis=0))
        curves[RANDOM] = (np.array(xs), np.array(ys), np.stack(bs))

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
               "n_ablated_points": int(np.sum(x > 0)) if name == RANDOM else
               len({p.spec for p in points if p.score_fn == name and p.spec != "none"}),
               "note": "" if ok else TIED_NOTE,
               "ci_low": percentile_interval(np.array(wb))[0], "ci_high": percentile_interval(np.array(wb))[1],
               "auc": a, "auc_ci_low": percentile_interval(np.array(ab))[0],
               "auc_ci_high": percentile_interval(np.array(ab))[1], "auc_range_pct": x_max,
               "max_pct_measured": float(x.max()), "base_accuracy": base,
               "n_seeds": len(seed_curves) if name == RANDOM else None,
               "seed_min": math.nan, "seed_max": math.nan}
        if name == RANDOM:
            per_seed = [max_within(sx, sy, base, cfg.tol) for sx, sy in seed_curves.values()]
            row["seed_min"], row["seed_max"] = float(np.min(per_seed)), float(np.max(per_seed))
        rows.append(row)
    within = pd.DataFrame(rows)
    if len(within):
        within["n_seeds"] = within["n_seeds"].astype("Int64")
    if len(within):
        within["rank_by_auc"] = within["auc"].rank(ascending=False, method="min")
    return summary, within
