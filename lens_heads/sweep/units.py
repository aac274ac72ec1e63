"""A sweep as independent work units, for executors that spread it over workers (docs/methods.md §8).

A sweep has two phases of units, each idempotent: it reads what it needs from its identity,
writes one store record atomically, and is skipped when that record (or what it merges into)
exists. ``UnitRef`` names a unit (``score/3``: shard 3 of the thresholds' scoring pass;
``part/17``: the 18th part of ``SweepPlan.all_units``), with one parser and one printer.

* phase ``score``: the thresholds' scoring pass in ``n_shards`` shards of whole batches
  (``thresholds.scoring_shard_batches``); ``merge_score_shards`` turns the stored shards into the
  thresholds record, bit-identical to the unsharded pass, with no model, and stores the static
  curves' dataset-level scores from the same shards. ``score_in_shards`` runs them one after
  another in one process, a pass longer than one sitting resuming at its next shard.
* phase ``static`` (one unit, ``static/0``, only with static curves): the dataset-level scores
  the static curves rank heads by that the shards did not give (``run.static_pass``: question-
  level scores, random orders), by one worker, as ``run_sweep`` stores them.
* phase ``part``: every part of every point (``SweepPlan``), as ``run_sweep`` runs them.
* phase ``curve`` (an adaptive search, ``SweepJob.search``): one curve's bisection, its probes'
  batches claimed and stored as parts (``adaptive.run_curve_unit``); a curve another worker is
  searching is replayed from the store, waiting on the batches it holds.

A ``SweepJob`` is everything a worker needs, picklable and model-free: the model spec, dtype,
device, the sweep config, the output folder, and the weights digest the launcher planned with.
A ``Worker`` loads the model once, checks that its weights have that digest (units from other
weights never join the sweep), and runs units by reference. Executors (``sweep.executors``)
only decide where workers run.
"""

from __future__ import annotations

import os
import socket
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Callable, Literal

import torch

from lens_heads.batching import batch_floor
from lens_heads.files.claims import claim
from lens_heads.errors import LensHeadsError
from lens_heads.results.keys import RunIdentity, StoreKey
from lens_heads.results.store import ResultStore
from lens_heads.sweep.config import RANDOM, SweepConfig
from lens_heads.sweep.plan import SweepPlan, put_thresholds, static_key, static_rankings, thresholds_key
from lens_heads.sweep.records import ThresholdsRecord
from lens_heads.sweep.run import Outcome
from lens_heads.scores import SCORES
from lens_heads.scores.functions import input_level
from lens_heads.sweep.plan import stored_thresholds
from lens_heads.sweep.run import CLAIM_POLL_S
from lens_heads.forward.task_requests import task_inputs
from lens_heads.interventions.thresholds import scoring_shard_batches, thresholds_from_scores
from lens_heads.data import load_task
from lens_heads.models.load import model_digest
from lens_heads.sweep.plan import stored_static
from lens_heads.sweep.run import read_thresholds
from lens_heads import scores as scoring
from lens_heads import models
from lens_heads.sweep import run as sweep_run
from lens_heads.sweep.run import put_static, random_ranking, run_static_unit
from lens_heads.sweep.adaptive import SearchConfig, run_curve_unit

if TYPE_CHECKING:
    from lens_heads.models.load import LoadedModel

Phase = Literal["score", "static", "part", "curve"]
PHASES = ("score", "static", "part", "curve")


@dataclass(frozen=True, order=True)
class UnitRef:
    """One unit of a sweep by reference: ``score/I``, ``static/0``, ``part/I`` or ``curve/I`` (an
    adaptive search's curve I)."""

    phase: Phase
    index: int

    @classmethod
    def parse(cls, text: str) -> "UnitRef":
        phase, _, index = text.strip().partition("/")
        if phase not in PHASES or not index.isdigit():
            raise LensHeadsError(f"bad unit {text!r}; write score/INDEX, static/0, part/INDEX or curve/INDEX")
        return cls(phase, int(index))  # type: ignore[arg-type]

    def __str__(self) -> str:
        return f"{self.phase}/{self.index}"


# -----------------------------------------------------------------------------
# The scoring pass in shards


def shard_key(identity: RunIdentity, cfg: SweepConfig, index: int, n_shards: int, floor: int | None) -> StoreKey:
    """Shard ``index`` of ``n_shards``, cut with ``floor`` (``batching.device_floor`` of the
    scoring device)."""
    return thresholds_key(identity, cfg).shard(index, n_shards, cfg.threshold_batch_size, floor)


def shard_score_ids(cfg: SweepConfig) -> list[str]:
    """What a shard scores: the thresholds' functions, then the input-level rankings of the
    static curves (their dataset-level means come out of the same shards)."""
    return list(dict.fromkeys([*cfg.score_ids, *input_level(static_rankings(cfg))]))


def run_score_shard(model: LoadedModel, task, identity: RunIdentity, cfg: SweepConfig, store: ResultStore, index: int,
                    n_shards: int) -> Outcome:
    """Score shard ``index`` of ``n_shards`` and store its per-input scores (with their input
    positions and the sizes of its batches), unless it or the thresholds are stored or another
    live process holds it."""
    floor = batch_floor(model)
    key, done = shard_key(identity, cfg, index, n_shards, floor), thresholds_key(identity, cfg)
    if store.has(key) or store.has(done):
        return Outcome.STORED
    with claim(store.path(key)) as mine:
        if not mine:
            return Outcome.HELD
        if store.has(key) or store.has(done):
            return Outcome.STORED
        inputs = task_inputs(model, task, cfg.n_shot, cfg.limit, cfg.seed, cfg.protocol)
        prefixes = scoring.pass_prefixes(model, inputs)  # the whole pass's: the shard runs the forwards the pass runs
        batches = scoring_shard_batches(inputs, cfg.threshold_batch_size, n_shards, floor, prefixes)[index]
        idx = [i for b in batches for i in b]
        tensors = {"input_index": torch.tensor(idx, dtype=torch.long),
                   "batch_sizes": torch.tensor([len(b) for b in batches], dtype=torch.long),
                   "n_inputs": torch.tensor([len(inputs)], dtype=torch.long)}
        if idx:
            ids = shard_score_ids(cfg)
            hs = scoring.score_heads(model, [inputs[i] for i in idx], scores=ids,
                                     batch_size=cfg.threshold_batch_size, keep_per_input=True, progress=False,
                                     shared_prefix=[prefixes[i] for i in idx])
            tensors.update({f"score.{sid}": hs.per_input[sid] for sid in ids})
        store.put_tensors(key, tensors)
    return Outcome.COMPUTED


def _static_from_shards(shards: list[dict], missing: list[str], model: LoadedModel | None) -> dict[str, list]:
    """The static rankings of ``missing`` that the shards (or, with ``model``, its geometry) give:
    an input-level score's dataset-level mean replayed batch by batch in the pass's order
    (``scores.pooled_mean``: the unsharded pass's values bit for bit); ``random@SEED``'s order."""
    out = {}
    for r in missing:
        if r.startswith(f"{RANDOM}@"):
            if model is not None:
                out[r] = random_ranking(model, int(r.split("@")[1]))
        elif any(f"score.{r}" in s for s in shards) and all(
                "batch_sizes" in s and (f"score.{r}" in s or not len(s["input_index"])) for s in shards):
            # every shard with inputs scored it: shards of a sweep without this static curve share
            # the key (static ids are not part of it) and leave the ranking to the static pass
            batches = (b for s in shards if f"score.{r}" in s
                       for b in s[f"score.{r}"].split(s["batch_sizes"].tolist()))
            out[r] = scoring.pooled_mean(batches).tolist()
    return out


def merge_score_shards(store: ResultStore, identity: RunIdentity, cfg: SweepConfig,
                       n_shards: int, floor: int | None, model: LoadedModel | None = None) -> ThresholdsRecord | None:
    """The thresholds from the stored shards cut with ``floor`` (then stored, and the shards
    discarded); None while a shard is missing. No model needed: per-input scores are put back in
    input order and pooled exactly as ``compute_thresholds`` pools them. The static curves'
    dataset-level scores the store lacks are stored from the same shards (``random@SEED`` only
    with ``model``: its geometry), so they take no second pass."""
    rec = stored_thresholds(store, identity, cfg)
    if rec is not None:
        return rec
    keys = [shard_key(identity, cfg, j, n_shards, floor) for j in range(n_shards)]
    shards = [store.get_tensors(k) for k in keys]
    if any(s is None for s in shards):
        return stored_thresholds(store, identity, cfg)  # merged meanwhile by another process
    n = int(shards[0]["n_inputs"][0])
    idx = torch.cat([s["input_index"] for s in shards])
    if sorted(idx.tolist()) != list(range(n)):
        raise LensHeadsError(f"{store.root}: the scoring shards do not cover the {n} inputs once each")
    per_input = {}
    for sid in cfg.score_ids:
        parts = [s[f"score.{sid}"] for s in shards if f"score.{sid}" in s]
        full = torch.empty((n, *parts[0].shape[1:]), dtype=parts[0].dtype)
        full[idx] = torch.cat(parts)
        per_input[sid] = full
    computed = thresholds_from_scores(per_input, {sid: SCORES[sid].inactive_when for sid in cfg.score_ids},
                                      cfg.fractions, cfg.protocol.threshold_rule)
    missing = [r for r in static_rankings(cfg) if not store.has(static_key(identity, cfg, r))]
    put_static(store, identity, cfg, _static_from_shards(shards, missing, model), n)
    rec = put_thresholds(store, identity, cfg, computed, n)
    for k in keys:
        store.discard(k)
    return rec


def score_in_shards(model: LoadedModel, task, identity: RunIdentity, cfg: SweepConfig, store: ResultStore,
                    n_shards: int, start_by: float | None = None,
                    on_shard: Callable[[int, float, float], None] | None = None) -> ThresholdsRecord | None:
    """The thresholds (and the static curves' scores) by the scoring pass's ``n_shards`` shards,
    one after another in this process, each stored as it ends: a pass longer than one sitting
    resumes at the next missing shard. No shard starts after ``start_by`` (``time.monotonic``;
    the merge of shards all stored still happens);
    shards another live process holds are left to it. ``on_shard(index, wall, cpu)`` after each
    computed shard. The merged record, or None while a shard is missing."""
    floor = batch_floor(model)
    for j in range(n_shards):
        if stored_thresholds(store, identity, cfg) is not None:
            break
        if store.has(shard_key(identity, cfg, j, n_shards, floor)):
            continue
        if start_by is not None and time.monotonic() >= start_by:
            return None
        t0, c0 = time.perf_counter(), time.process_time()
        if run_score_shard(model, task, identity, cfg, store, j, n_shards) is Outcome.COMPUTED and on_shard:
            on_shard(j, time.perf_counter() - t0, time.process_time() - c0)
    return merge_score_shards(store, identity, cfg, n_shards, floor, model)


# -----------------------------------------------------------------------------
# Jobs and workers


@dataclass(frozen=True)
class SweepJob:
    """What a worker needs to run units of one sweep (picklable; no model)."""

    model: str  # the model spec (zoo name, .gguf, HF folder, hub id)
    dtype: str
    device: str
    cfg: SweepConfig
    out_dir: str
    digest: str  # the weights digest the sweep was planned with
    include_path: str | None = None
    n_shards: int = 1  # shards of the scoring pass
    threads: int | None = None  # torch threads per worker (None: torch's default)
    revision: str | None = None  # a hub id's commit: every worker loads the same weights
    attention: str = "auto"  # the attention backend each worker runs (lens_heads.models.attention)
    search: SearchConfig | None = None  # an adaptive search (curve units; cfg is then on its grid)


@dataclass
class Worker:
    """Runs units of a ``SweepJob``; loads the model on first use, once."""

    job: SweepJob
    _model: object = field(default=None, repr=False)
    _task: object = field(default=None, repr=False)
    _plan: SweepPlan | None = field(default=None, repr=False)
    computed: int = 0  # units this worker computed (not skipped)
    loads: int = 0  # model loads (one per worker process)

    def _setup(self):
        if self._model is None:
            if self.job.threads:
                torch.set_num_threads(self.job.threads)
            self._task = load_task(self.job.cfg.task, n_shot=self.job.cfg.n_shot, include_path=self.job.include_path)
            model = models.load_model(self.job.model, dtype=self.job.dtype, device=self.job.device,
                                      revision=self.job.revision, attention=self.job.attention)
            self.loads += 1
            if model_digest(model) != self.job.digest:
                raise LensHeadsError(
                    f"{socket.gethostname()} (pid {os.getpid()}): {self.job.model} has weights "
                    f"{model_digest(model)[:16]}..., but the sweep in {self.job.out_dir} was planned with "
                    f"{self.job.digest[:16]}...; units of other weights never join one sweep (pin the weights: "
                    f"the same file, folder or --revision on every machine)")
            self._model = model
        return self._model, self._task

    @property
    def identity(self) -> RunIdentity:
        model, task = self._setup()
        return self.job.cfg.identity(model, task)

    def plan(self) -> SweepPlan:
        if self._plan is None:

            model, task = self._setup()
            store, cfg = ResultStore(self.job.out_dir), self.job.cfg
            thresholds = read_thresholds(store, self.identity, cfg, task)
            if thresholds is None:
                raise LensHeadsError(f"{self.job.out_dir}: part units need the thresholds; run the score units first")
            static = stored_static(store, self.identity, cfg) if cfg.static_ids else None
            if cfg.static_ids and static is None:
                raise LensHeadsError(f"{self.job.out_dir}: part units of static curves need their dataset-level "
                                     f"scores; run the static unit first")
            self._plan = SweepPlan.build(self.identity, cfg, task, thresholds, static)
        return self._plan

    def run(self, ref: UnitRef) -> Outcome:
        """Run one unit (skipped when stored; left alone when another live process holds it)."""
        model, task = self._setup()
        store = ResultStore(self.job.out_dir)
        if ref.phase == "score":
            out = run_score_shard(model, task, self.identity, self.job.cfg, store, ref.index, self.job.n_shards)
        elif ref.phase == "curve":
            new = run_curve_unit(model, task, self.identity, self.job.cfg, store, self.job.search, ref.index)
            out = Outcome.COMPUTED if new else Outcome.STORED
        elif ref.phase == "static":
            if ref.index != 0:
                raise LensHeadsError(f"unit {ref}: a sweep has one static unit, static/0")
            out = run_static_unit(model, task, self.identity, self.job.cfg, store)
        else:
            plan = self.plan()
            if not 0 <= ref.index < len(plan.all_units):
                raise LensHeadsError(f"unit {ref}: the sweep has {len(plan.all_units)} part units")
            out = sweep_run.run_unit(model, task, plan, plan.all_units[ref.index], store)
        self.computed += out is Outcome.COMPUTED
        return out

    def run_all(self, refs: list[UnitRef]) -> int:
        """Run ``refs`` in order, then come back to those another process held until every one
        is stored; the number this worker computed."""
        before, pending = self.computed, list(refs)
        while pending:
            held = [r for r in pending if self.run(r) is Outcome.HELD]
            if held and len(held) == len(pending):
                time.sleep(CLAIM_POLL_S)
            pending = held
        return self.computed - before
