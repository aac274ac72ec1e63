"""Running a sweep's units: the thresholds' scoring pass, the static scores, the part units
and points, resume; and tabulating a store.

``run_points`` evaluates what the plan's store lacks (the in-process executor's part phase;
``executors.run_sweep`` is the one driver around it); ``tabulate`` only reads the store (no model: a weights digest and dtype identify the run) and is what ``--status`` and
``--from-store`` use. Every unit is claimed first (``lens_heads.files.claims``): processes sharing
one folder take different units, and one waits for a unit another live process holds.
"""

from __future__ import annotations

import time
from enum import Enum
from typing import TYPE_CHECKING, Sequence

from lens_heads.files.claims import claim, wait_for
from lens_heads.errors import LensHeadsError
from lens_heads.results.keys import Kind, RunIdentity
from lens_heads.progress import progress_bar
from lens_heads.evaluation.protocol import load_authors_thresholds, thresholds_for_sweep
from lens_heads.results.store import ResultStore
from lens_heads.sweep.config import RANDOM, SweepConfig
from lens_heads.sweep.plan import PartUnit, StaticScores, SweepPlan, plan_points, point_label, partial_config, put_thresholds, \
    static_key, static_rankings, stored_static, stored_thresholds, thresholds_key
from lens_heads.sweep.records import PointRecord, StaticScoresRecord, Thresholds
from lens_heads.sweep.result import SweepResult, check_same_weights
from lens_heads.sweep.stats import point_summary, tables
from lens_heads.interventions.ablation import parse_ablation
from lens_heads.data import load_task
from lens_heads.scores.functions import input_level, question_level
from lens_heads.forward.task_requests import task_inputs
from lens_heads.interventions.thresholds import thresholds_of
from lens_heads import scores as scoring
from lens_heads.evaluation import evaluate as evaluation
from lens_heads.scores import SCORES

if TYPE_CHECKING:
    from lens_heads.models.load import LoadedModel

CLAIM_POLL_S = 2.0  # how often a process waiting for another's unit looks again


# -----------------------------------------------------------------------------
# Thresholds


def authors_thresholds(cfg: SweepConfig, task) -> Thresholds:
    table = load_authors_thresholds(cfg.thresholds_file, task.name, cfg.thresholds_model)
    return thresholds_for_sweep(table, cfg.score_ids, cfg.fractions, f"{cfg.thresholds_file} ({cfg.thresholds_model})")


def read_thresholds(store: ResultStore, identity: RunIdentity, cfg: SweepConfig, task) -> Thresholds | None:
    """The sweep's thresholds without computing: the authors' file, or the store's (None when missing)."""
    if not cfg.score_ids:
        return {}
    if cfg.thresholds_file is not None:
        return authors_thresholds(cfg, task)
    rec = stored_thresholds(store, identity, cfg)
    return None if rec is None else rec.thresholds


def random_ranking(model: LoadedModel, seed: int) -> list:
    """[layer][head] seeded uniform values (NaN for heads a pruned layer lacks): ranked, a
    random order of the heads -- the static random-heads curve of seed ``seed``."""
    import hashlib

    import torch

    g = model.geometry
    digest = hashlib.sha256(f"lens_heads.static_random:{int(seed)}".encode()).digest()
    values = torch.rand(g.n_layers, g.n_heads, generator=torch.Generator().manual_seed(
        int.from_bytes(digest[:8], "little") & ((1 << 63) - 1)), dtype=torch.float64)
    for L in range(g.n_layers):
        values[L, g.heads_in(L):] = float("nan")
    return values.tolist()


def scoring_pass(model: LoadedModel, task, cfg: SweepConfig, progress: bool,
                 rankings: Sequence[str] = ()) -> tuple[Thresholds, int, StaticScores]:
    """(thresholds, n_inputs, static values) on the unablated model, in one pass per kind of
    score: ``cfg``'s input-level scores pooled over the request sequences (every choice row;
    ``n_inputs`` counts them) and each question-level score over the questions' gold requests,
    with the sweep's replacement (docs/methods.md §3); and the dataset-level means of
    ``rankings`` (score ids, ``random@SEED``) that static curves rank heads by."""
    rule = cfg.protocol.threshold_rule
    hook_ids = input_level(cfg.score_ids)
    hook_static = input_level([r for r in rankings if not r.startswith(f"{RANDOM}@")])
    computed: Thresholds = {}
    static: StaticScores = {}
    n_inputs = 0
    if hook_ids or hook_static:
        inputs = task_inputs(model, task, cfg.n_shot, cfg.limit, cfg.seed, cfg.protocol)
        hs = scoring.score_heads(model, inputs, scores=list(dict.fromkeys([*hook_ids, *hook_static])),
                         batch_size=cfg.threshold_batch_size, keep_per_input=bool(hook_ids), progress=progress)
        computed.update(thresholds_of(hs, hook_ids, cfg.fractions, rule) if hook_ids else {})
        static.update({r: hs.mean[r].tolist() for r in hook_static})
        n_inputs = len(inputs)
    for sid in question_level(list(dict.fromkeys([*cfg.score_ids, *rankings]))):
        hs = SCORES[sid].on_task(model, task, cfg.n_shot, cfg.limit, cfg.seed, cfg.replacement, progress, cfg.protocol)
        if sid in cfg.score_ids:
            computed.update(thresholds_of(hs, [sid], cfg.fractions, rule))
        if sid in rankings:
            static[sid] = hs.mean[sid].tolist()
        n_inputs = n_inputs or hs.n
    static.update({r: random_ranking(model, int(r.split("@")[1])) for r in rankings if r.startswith(f"{RANDOM}@")})
    return {sid: computed[sid] for sid in cfg.score_ids}, n_inputs, {r: static[r] for r in rankings}


def put_static(store: ResultStore, identity: RunIdentity, cfg: SweepConfig, static: StaticScores,
               n_inputs: int) -> None:
    for r, values in static.items():
        store.save(static_key(identity, cfg, r), StaticScoresRecord(values, n_inputs))


def _missing_static(store: ResultStore, identity: RunIdentity, cfg: SweepConfig) -> list[str]:
    return [r for r in static_rankings(cfg) if not store.has(static_key(identity, cfg, r))]


def ensure_thresholds(model: LoadedModel, store: ResultStore, identity: RunIdentity, cfg: SweepConfig, task,
                      progress: bool) -> Thresholds:
    """The sweep's thresholds, from one scoring pass over the unablated request sequences when
    the store lacks them (by whichever process claims that pass; the pass also stores the
    dataset-level scores the static curves need)."""
    found = read_thresholds(store, identity, cfg, task)
    key = thresholds_key(identity, cfg)
    path = store.path(key)
    while found is None:
        with claim(path) as mine:
            if mine and not path.is_file():
                computed, n_inputs, static = scoring_pass(model, task, cfg, progress,
                                                          _missing_static(store, identity, cfg))
                put_static(store, identity, cfg, static, n_inputs)
                found = put_thresholds(store, identity, cfg, computed, n_inputs).thresholds
        if found is None:
            wait_for(path, CLAIM_POLL_S)
            found = read_thresholds(store, identity, cfg, task)
    return found


def static_pass(model: LoadedModel, store: ResultStore, identity: RunIdentity, cfg: SweepConfig, task,
                progress: bool) -> "Outcome":
    """Score and store the static curves' dataset-level scores the store lacks, unless another
    live process holds that pass (``HELD``: come back later)."""
    from dataclasses import replace

    missing = _missing_static(store, identity, cfg)
    if not missing:
        return Outcome.STORED
    with claim(_static_claim(store, identity, cfg)) as mine:  # one path: the pass is one unit
        if not mine or _missing_static(store, identity, cfg) != missing:
            return Outcome.HELD
        _, n_inputs, static = scoring_pass(model, task, replace(cfg, score_ids=[]), progress, missing)
        if not n_inputs and (rec := stored_thresholds(store, identity, cfg)) is not None:
            n_inputs = rec.n_inputs  # random orders alone (no forward): the population's count, as a whole pass
        put_static(store, identity, cfg, static, n_inputs)
    return Outcome.COMPUTED


def _static_claim(store: ResultStore, identity: RunIdentity, cfg: SweepConfig):
    return store.path(static_key(identity, cfg, static_rankings(cfg)[0]))


def run_static_unit(model: LoadedModel, task, identity: RunIdentity, cfg: SweepConfig, store: ResultStore) -> "Outcome":
    """The ``static/0`` unit of an executor (``sweep.units``): ``static_pass`` without a bar."""
    return static_pass(model, store, identity, cfg, task, progress=False)


def ensure_static(model: LoadedModel, store: ResultStore, identity: RunIdentity, cfg: SweepConfig, task,
                  progress: bool) -> StaticScores | None:
    """The dataset-level scores of the sweep's static curves (None without static curves),
    scored when the store lacks them (by whichever process claims the pass)."""
    if not cfg.static_ids:
        return None
    found = stored_static(store, identity, cfg)
    while found is None:
        if static_pass(model, store, identity, cfg, task, progress) is Outcome.HELD:
            time.sleep(CLAIM_POLL_S)  # another live process runs the pass
        found = stored_static(store, identity, cfg)
    return found


# -----------------------------------------------------------------------------
# Units


class Outcome(str, Enum):
    """What running a unit did: found it stored, computed it, or left it to the live process
    that holds it (come back later)."""

    STORED = "stored"
    COMPUTED = "computed"
    HELD = "held"


def run_unit(model: LoadedModel, task, plan: SweepPlan, unit: PartUnit, store: ResultStore) -> Outcome:
    """Evaluate one part and store it, unless it (or its point) is stored or another live
    process holds it."""
    if store.has(unit.key) or store.has(unit.point):
        return Outcome.STORED
    cfg = plan.cfg
    with claim(store.path(unit.key)) as mine:
        if not mine:
            return Outcome.HELD
        if store.has(unit.key) or store.has(unit.point):  # done meanwhile by another process
            return Outcome.STORED
        result = evaluation.evaluate_task(model, task, n_shot=cfg.n_shot, seed=cfg.seed,
                               ablation=parse_ablation(unit.spec, model.geometry), batch_size=cfg.batch_size,
                               progress=False, doc_ids=list(unit.doc_ids), protocol=cfg.protocol)
        store.save(unit.key, PointRecord.from_result(result))
    return Outcome.COMPUTED


def merge_point(plan: SweepPlan, spec: str, store: ResultStore) -> PointRecord | None:
    """The point's record: stored, or merged from its stored parts (then stored and its parts
    discarded); None while any part is missing. No model needed.

    Every question's prompt, and every ablation's decision, depends only on that question, so
    the merged record equals one evaluation of all the questions: accuracy is the mean over
    questions (MMLU's size-weighted subjects included) and the zeroed fraction adds up counts."""
    key = plan.point_key(spec)
    rec = store.load(key, PointRecord)
    if rec is not None:
        return rec
    units = plan.parts(spec)
    parts = [store.load(u.key, PointRecord) for u in units]
    if any(p is None for p in parts):
        return store.load(key, PointRecord)  # merged meanwhile by another process (which dropped the parts)
    rec = PointRecord.merge(parts, plan.cfg.limit)
    rec.point_hash = key.digest
    store.save(key, rec)  # the point first, then its parts go
    for u in units:
        store.discard(u.key)
    return rec


# -----------------------------------------------------------------------------
# The sweep


def check_one_weights(store, identity) -> None:
    """A folder holding records of this sweep's run, or tables, from other weights is an error:
    units of different weights never merge into one table, and one model's tables never replace
    another's (checked before any work, by the in-process driver and the launcher alike)."""
    check_same_weights(store.root, identity.model_digest)
    mine = {k: v for k, v in identity.config().items() if k != "model_digest"}
    for kind in (Kind.THRESHOLDS, Kind.POINT, Kind.PART):
        for rec in store.records(kind):
            c = rec.get("config", {})
            if c.get("model_digest") != identity.model_digest and {k: c.get(k) for k in mine} == mine:
                raise LensHeadsError(
                    f"{store.root} holds results of this sweep from other weights ({str(c.get('model_digest'))[:16]}... "
                    f"vs {identity.model_digest[:16]}...): use another --out, or the same weights")


def check_sweep(model: LoadedModel, cfg: SweepConfig, task):
    """The sweep's task (loaded from ``cfg.task`` unless given), its extra ablations checked
    against the model, before anything is written."""

    cfg.validate()
    task = task if task is not None else load_task(cfg.task)
    for s in cfg.extra_labels:  # head ranges checked against the model, before writing
        parse_ablation(s, model.geometry if model is not None else None)
    return task


def run_points(model: LoadedModel, task, plan: SweepPlan, store: ResultStore, progress: bool) -> None:
    """Evaluate every point of ``plan`` the store lacks, point by point in the plan's order, each
    merged and stored as soon as its parts are (so a stopped run's ``--status`` shows it); points
    whose parts another live process holds come round again. The in-process executor's part
    phase (``executors.InProcessSession``)."""
    bar = progress_bar(len(plan.order), "sweep points", enabled=progress, unit="point", leave=True)
    try:
        pending = list(plan.order)
        while pending:  # points whose parts other processes hold come round again
            deferred = []
            for spec in pending:
                if not store.has(plan.point_key(spec)):
                    bar.set_postfix_str(point_label(plan.point(spec)), refresh=True)  # not a static set's heads
                    held = [u for u in plan.parts(spec) if run_unit(model, task, plan, u, store) is Outcome.HELD]
                    if held or merge_point(plan, spec, store) is None:
                        deferred.append(spec)
                        continue
                bar.update(1)
            if deferred and len(deferred) == len(pending):  # all of it held elsewhere: wait for it
                time.sleep(CLAIM_POLL_S)
            pending = deferred
    finally:
        bar.close()


def stored_plan(store: ResultStore, identity: RunIdentity, cfg: SweepConfig, task) -> SweepPlan | None:
    """The sweep's plan from what the store holds (its thresholds and the static curves'
    scores), None while it lacks them: what ``launch`` builds its units from, and what
    ``tabulate`` and ``--status`` read."""
    thresholds = read_thresholds(store, identity, cfg, task)
    static = stored_static(store, identity, cfg) if cfg.static_ids else None
    if thresholds is None or (cfg.static_ids and static is None):
        return None
    return SweepPlan.build(identity, cfg, task, thresholds, static)


def tabulate(out_dir, identity: RunIdentity, cfg: SweepConfig, task, partial: bool = False,
             model: str = "") -> SweepResult | None:
    """The sweep's tables from the store alone (no model, nothing written): None when it lacks
    the thresholds, the static curves' scores or, unless ``partial``, any point.

    ``partial=True`` tabulates what a sweep still running (or stopped) holds: ``summary`` has a
    row for every stored point (``in_curve``: whether it belongs to a complete curve),
    ``within`` the curves whose every point is stored (``partial_config``); None without the
    thresholds or the baseline. Its within-1-point values are final, its AUCs are not (their
    common range depends on the curves still missing). Points whose parts are all stored but
    not merged yet count as missing (the run that merges them stores the point)."""
    store = ResultStore(out_dir)
    plan = stored_plan(store, identity, cfg, task)
    if plan is None:
        return None
    thresholds = plan.thresholds
    records = {}
    for spec in plan.order:  # stored points only: parts not merged yet are a point still running
        rec = store.load(plan.point_key(spec), PointRecord)
        if rec is not None:
            records[spec] = rec
    n = len(plan.order)
    if len(records) == n:
        summary, within = tables(plan.points, records, cfg)
        return SweepResult(summary, within, thresholds, records, n_points=n, n_stored=n,
                           model=model, model_digest=identity.model_digest)
    if not partial or "none" not in records:
        return None
    stored = set(records)
    part_cfg = partial_config(cfg, plan.points, stored)
    static = stored_static(store, identity, cfg) if cfg.static_ids else None
    part_points = [p for p in plan_points(part_cfg, thresholds, static) if p.spec in stored]
    done = [p for p in plan.points if p.spec in stored]  # also the points of curves not complete yet
    _, within = tables(part_points, records, part_cfg)
    summary = point_summary(done, records, cfg)
    summary["in_curve"] = summary["spec"].isin({p.spec for p in part_points})  # False: a curve still incomplete
    return SweepResult(summary, within, thresholds, records, n_points=n, n_stored=len(stored),
                       model=model, model_digest=identity.model_digest)


def sweep_status(model: LoadedModel, cfg: SweepConfig, out_dir, task=None) -> SweepResult | None:
    """``tabulate(..., partial=True)`` for a loaded model."""
    task = check_sweep(model, cfg, task)
    return tabulate(out_dir, cfg.identity(model, task), cfg, task, partial=True, model=model.name)

