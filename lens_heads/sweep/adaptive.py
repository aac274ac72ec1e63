"""Adaptive sweeps: each curve's within-margin crossing by bisection over fractions, every probe
decided as soon as an anytime-valid confidence sequence is certain (docs/methods.md §13).

A curve (a score function's per-input thresholds, random heads averaged over seeds, a static
ranking) is a function of the fraction p of heads zeroed; its *crossing* is the largest p on
the grid 0, r, 2r, ... (``SearchConfig.resolution`` r, up to the sweep's largest fraction) whose
paired difference Δ(p) = acc(ablated) − acc(unablated) over the benchmark's N items is still
≥ −margin. The search, in the order data flows:

* ``bisect_crossing``: bisection over the grid's indices (pure; the probe decisions come from a
  callback), assuming Δ is non-increasing in p between probes;
* ``decide_probe``: one probe's items in a seeded random order, batch by batch, each batch's
  differences fed to ``confseq.WoRConfidenceSequence`` at the per-probe level α / (most probes
  a curve can take), until ``confseq.decide`` says within or outside (at n = N it always does:
  the interval is then the exact Δ), or a cap on items runs out (``unresolved``);
* ``StoreItems``: per-item results from the sweep's ``ResultStore``, under the very keys a
  fixed-grid sweep writes (a stored point gives every item; stored parts give theirs); missing
  items are evaluated a batch at a time, each batch claimed and stored as a part of its point,
  so a killed run resumes without re-evaluating an item and two processes never evaluate the
  same batch;
* ``search_curve``: the three together for one curve of a ``SweepPlan`` built on the search's
  grid; ``crossing_table`` turns the outcomes into ``within_1pt.csv`` rows and ``probes.csv``.

A score function whose thresholds are one value at every fraction of the range (its scores tie
over the whole range) makes every point of its curve the same ablation: Δ is one number, the
fraction names no share of heads, and there is no crossing to search for. Such a curve
(``Curve.constant``) takes one probe, which says what that ablation does, and is reported as
``constant scores`` with no crossing and no bracket (docs/methods.md §3, §13).
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Callable, Iterable, Sequence

import numpy as np

from lens_heads.evaluation import evaluate as evaluation
from lens_heads.evaluation.timing import compute_seconds
from lens_heads.interventions.ablation import parse_ablation
from lens_heads.interventions.speculation import Speculation, population_prefixes
from lens_heads.files.atomic import atomic_write_csv
from lens_heads.files.claims import claim, wait_for
from lens_heads.errors import LensHeadsError
from lens_heads.results.keys import Kind, RunIdentity, StoreKey, config_key
from lens_heads.progress import progress_bar
from lens_heads.results.store import ResultStore
from lens_heads.sweep.confseq import WoRConfidenceSequence, decide
from lens_heads.sweep.ledger import Ledger, LedgerEntry, population_digest
from lens_heads.sweep.config import SweepConfig
from lens_heads.sweep.plan import SweepPlan, stored_static
from lens_heads.forward.task_requests import record_inputs, select_records
from lens_heads.sweep.records import PointRecord
from lens_heads.sweep.run import check_one_weights, check_sweep, ensure_static, ensure_thresholds, read_thresholds

if TYPE_CHECKING:
    from lens_heads.models.load import LoadedModel

WITHIN, OUTSIDE, UNRESOLVED = "within", "outside", "unresolved"
PENDING = "pending"  # a probe (and its curve) whose items are not all stored yet: a replay of a running search
CONSTANT = "constant scores"  # a curve whose every point in the range is the same ablation: no crossing exists
_EXACT = 1e-9  # Δ == -margin counts as within (the grid's ``acc >= base - tol``), float rounding aside


class ItemsMissing(LensHeadsError):
    """An item a search needs is not stored and there is no model to evaluate it."""


class SearchStopped(LensHeadsError):
    """The search's deadline came before the next batch was evaluated (nothing is lost: every
    batch evaluated is stored)."""


@dataclass(frozen=True)
class SearchConfig:
    """How the crossing is searched: ``margin`` (accuracy, 0.01 = one point), ``alpha`` (the
    curve's error rate), ``resolution`` (the grid's step in fraction of heads), ``batch``
    (items per sequential step), ``order_seed`` (the items' random order), ``max_items`` (a
    cap per probe: a probe that reaches it undecided is ``unresolved``; None: the benchmark)."""

    margin: float = 0.01
    alpha: float = 0.05
    resolution: float = 0.01
    batch: int = 64
    order_seed: int = 0
    max_items: int | None = None

    def __post_init__(self) -> None:
        for name, lo, hi in (("margin", 0.0, 1.0), ("alpha", 0.0, 1.0), ("resolution", 0.0, 1.0)):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) \
                    or not (lo < v < hi or (name == "margin" and v == 0)):
                raise LensHeadsError(f"{name} must be in ({lo:g}, {hi:g}), got {v!r}")
        if isinstance(self.batch, bool) or not isinstance(self.batch, int) or self.batch < 1:
            raise LensHeadsError(f"the search batch must be an integer >= 1, got {self.batch!r}")
        if self.max_items is not None and (isinstance(self.max_items, bool) or not isinstance(self.max_items, int)
                                           or self.max_items < 1):
            raise LensHeadsError(f"max_items must be an integer >= 1, got {self.max_items!r}")

    def grid(self, top: float) -> list[float]:
        """0, r, 2r, ... up to ``top`` (the sweep's largest fraction), rounded as fractions are
        written (so 3 x 0.05 is the grid sweep's 0.15 and shares its thresholds and points)."""
        k = int(math.floor(top / self.resolution + 1e-9))
        if k < 1:
            raise LensHeadsError(f"the search range 0..{top:g} holds no step of {self.resolution:g}: give a larger "
                                 f"largest fraction or a finer resolution")
        return [round(i * self.resolution, 9) for i in range(k + 1)]

    def probe_alpha(self, n_grid: int) -> float:
        """α per probe: α split over the most probes a bisection of ``n_grid`` points can take."""
        return self.alpha / max_probes(n_grid)


UNABLATED_BYTES = 1 << 30  # the unablated point's kept prefixes (one per subject: MMLU's 57 on Qwen2.5-0.5B ~0.7 GB)


def max_probes(n_grid: int) -> int:
    """The most probes ``bisect_crossing`` takes on a grid of ``n_grid`` points (index 0, the
    unablated model, is never probed): ceil(log2(n_grid))."""
    return max(1, math.ceil(math.log2(n_grid)))


# -----------------------------------------------------------------------------
# The search, pure


@dataclass
class ProbeOutcome:
    """One probe: grid ``index``, the decision, the interval on Δ when it was taken, the items it
    used (``n``), and the % of units its points zeroed on the items stored."""

    index: int
    decision: str
    lo: float
    hi: float
    n: int
    pct_zeroed: float = math.nan


@dataclass
class CurveOutcome:
    """A curve's search: the crossing's grid index (None when unresolved or constant), its status
    (``resolved``, ``lower bound``: within up to the grid's end, ``unresolved``, ``constant
    scores``: one ablation over the whole range, one probe), the bracket (last index known
    within, first known outside; ``n_grid`` for beyond the grid) and the probes."""

    crossing: int | None
    status: str
    bracket: tuple[int, int]
    probes: list[ProbeOutcome] = field(default_factory=list)
    stored: list[ProbeOutcome] = field(default_factory=list)  # grid points not probed but stored whole: exact Δ

    def violations(self, margin: float) -> list[tuple[int, int]]:
        """Pairs (a, b), a < b on the grid, of probes and stored points that contradict a
        non-increasing Δ: point b decided within after point a decided outside (the curve comes
        back: the bisection's crossing is then *a* crossing, not necessarily the largest within),
        or intervals saying Δ(b) > Δ(a) + margin for certain (a rise by more than the margin the
        curve is read at; a rise of a question or two is noise at that scale)."""
        seen = sorted(self.probes + self.stored, key=lambda p: p.index)
        out = []
        for pa in seen:
            for pb in seen:
                if pa.index < pb.index and ((pa.decision == OUTSIDE and pb.decision == WITHIN)
                                            or pb.lo > pa.hi + margin + _EXACT):
                    out.append((pa.index, pb.index))
        return out


def bisect_crossing(n_grid: int, probe: Callable[[int], ProbeOutcome]) -> CurveOutcome:
    """Bisection for the largest grid index whose Δ is within the margin. Index 0 (nothing
    zeroed) is within by definition; ``n_grid`` stands for "beyond the grid" (outside). Each
    step probes the middle of the bracket; an unresolved (or pending) probe ends the search."""
    lo, hi = 0, n_grid
    probes: list[ProbeOutcome] = []
    while hi - lo > 1:
        mid = (lo + hi) // 2
        got = probe(mid)
        probes.append(got)
        if got.decision == WITHIN:
            lo = mid
        elif got.decision == OUTSIDE:
            hi = mid
        else:
            return CurveOutcome(None, PENDING if got.decision == PENDING else UNRESOLVED, (lo, hi), probes)
    return CurveOutcome(lo, "lower bound" if hi == n_grid else "resolved", (lo, hi), probes)


def decide_probe(N: int, order: Sequence[int], differences: Callable[[Sequence[int]], np.ndarray],
                 alpha: float, margin: float, batch: int, levels: int = 1, max_items: int | None = None,
                 on_batch: Callable[[int, float, float], None] | None = None,
                 pending: bool = False) -> ProbeOutcome:
    """Feed the items of ``order`` (the population's N item ids in a random order) to a
    confidence sequence, ``batch`` at a time, until it decides; ``differences(ids)`` gives each
    item's Δ on the lattice -1, -1 + 1/levels, ..., 1. The outcome's index is left at -1.
    ``pending``: a batch whose items are missing (``ItemsMissing``) ends the probe as ``pending``
    with the interval so far, instead of raising."""
    cs = WoRConfidenceSequence(N, alpha, -1.0, 1.0, 1.0 / levels)
    cap = N if max_items is None else min(N, max_items)
    lo, hi, n = -1.0, 1.0, 0
    while n < cap:
        ids = order[n:min(n + batch, cap)]
        try:
            d = differences(ids)
        except ItemsMissing:
            if not pending:
                raise
            return ProbeOutcome(-1, PENDING, lo, hi, n)
        lo, hi = cs.update(d)
        n += len(ids)
        if on_batch is not None:
            on_batch(n, lo, hi)
        got = decide(lo, hi, margin + _EXACT)
        if got is not None:
            return ProbeOutcome(-1, got, lo, hi, n)
    return ProbeOutcome(-1, UNRESOLVED, lo, hi, n)


def item_order(doc_ids: Sequence[int], seed: int) -> list[int]:
    """The population's items in the seeded random order every probe reads them in."""
    perm = np.random.default_rng(seed).permutation(len(doc_ids))
    return [int(doc_ids[i]) for i in perm]


# -----------------------------------------------------------------------------
# Items from the store


@dataclass(frozen=True)
class _Known:
    """An item known from a ledger: its correctness is all a search reads."""

    doc_id: int
    correct: bool


class StoreItems:
    """Per-item results of sweep points, read from ``store`` (a point's record, or its parts)
    and from ``ledger`` (``sweep.ledger``: the compact form a fresh machine may hold alone), and
    evaluated where missing (with ``model``; without one a missing item is ``ItemsMissing``: the
    tables are rebuilt from the store alone). ``deadline`` (``time.monotonic()``): no batch is
    evaluated once it has passed (``SearchStopped``). ``after_batch``: called after each batch
    is evaluated and stored (a long campaign checkpoints its ledger there)."""

    def __init__(self, store: ResultStore, plan: SweepPlan, model: LoadedModel | None = None, task=None,
                 ledger: Ledger | None = None, deadline: float | None = None):
        self.store, self.plan, self.model, self.task = store, plan, model, task
        if ledger is not None and ledger.population != population_digest(plan.doc_ids):
            raise LensHeadsError("the ledger is of another population of items than the search's plan")
        self.ledger, self.deadline = ledger, deadline
        self.after_batch: Callable[[], None] | None = None  # called after each batch evaluated and stored
        self.new = 0  # items this object evaluated
        self.new_seconds = 0.0  # the seconds their evaluation took
        self._known: dict[str, dict[int, object]] = {}  # point digest -> doc_id -> QuestionResult (or _Known)
        self._zeroed: dict[str, list[float]] = {}  # point digest -> [units zeroed, units seen] over its records
        self._cost: dict[str, list[float]] = {}  # point digest -> [items evaluated, milliseconds] over its records
        self._last: tuple[str, object] | None = None  # the latest point's ablation (``_ablation``)
        self._prefixes: dict[tuple[int, ...], int] | None = None  # the population's shared prefixes
        self._unablated: Speculation | None = None  # the unablated point's prefixes
        self._index_parts()

    def _index_parts(self) -> None:
        """Every stored part, grouped under its point's digest."""
        self._parts: dict[str, list[dict]] = {}
        for data in self.store.records(Kind.PART):
            cfg = {k: v for k, v in data.get("config", {}).items() if k != "doc_ids"}
            cfg["kind"] = Kind.POINT.value
            self._parts.setdefault(config_key(cfg), []).append(data)

    def _load(self, key: StoreKey) -> dict[int, object]:
        digest = key.digest
        if digest in self._known:
            return self._known[digest]
        got: dict[int, object] = {}
        zeroed, cost = [0.0, 0.0], [0.0, 0.0]
        rec = self.store.load(key, PointRecord)
        records = [rec] if rec is not None else [PointRecord.from_json(d) for d in self._parts.get(digest, [])]
        entry = self.ledger.get(digest) if self.ledger is not None else None
        stored = {q.doc_id for r in records for q in r.questions}
        if entry is not None and not entry.known <= stored:  # the ledger knows more than this store
            got.update({d: _Known(d, d in entry.correct) for d in entry.known})
            zeroed[:] = entry.zeroed_units
            cost[:] = [entry.items, round(1000 * entry.seconds)]
            for r in records:  # what this store evaluated beyond the ledger
                ids = {q.doc_id for q in r.questions}
                if ids - entry.known:
                    self._add(got, zeroed, cost, r, share=len(ids - entry.known) / len(ids))
        else:
            for r in records:
                self._add(got, zeroed, cost, r)
        self._known[digest], self._zeroed[digest], self._cost[digest] = got, zeroed, cost
        return got

    @staticmethod
    def _add(got: dict, zeroed: list[float], cost: list[float], rec: PointRecord, share: float = 1.0) -> None:
        """Add ``rec``'s items that are not known yet; its counts (zeroed units, items evaluated,
        seconds) in proportion ``share`` (the part of its items that is new)."""
        for q in rec.questions:
            got.setdefault(q.doc_id, q)
        units = rec.eval_config.get("zeroed_units")
        if units:
            zeroed[0] += share * units[0]
            zeroed[1] += share * units[1]
        cost[0] += share * len(rec.questions)
        cost[1] += share * round(1000 * compute_seconds(rec.eval_config))  # in ms: sums exact

    def pct_zeroed(self, spec: str) -> float:
        """% of (input, layer, head) units zeroed over the stored items of ``spec``'s point."""
        key = self.plan.point_key(spec)
        self._load(key)
        z, u = self._zeroed.get(key.digest, [0, 0])
        return 0.0 if spec == "none" else (100.0 * z / u if u else math.nan)

    def cost(self, spec: str) -> tuple[float, float]:
        """(items evaluated, seconds) of ``spec``'s point over its stored items (and the ledger's),
        read from the records' own timings: the same on every machine that reads them."""
        key = self.plan.point_key(spec)
        self._load(key)
        items, ms = self._cost.get(key.digest, [0.0, 0.0])
        return float(items), float(ms) / 1000

    def known_whole(self, spec: str) -> bool:
        """Whether every item of the plan is known under ``spec`` (stored, or in the ledger)."""
        known = self._load(self.plan.point_key(spec))
        return all(d in known for d in self.plan.doc_ids)

    def correct(self, spec: str, doc_ids: Sequence[int]) -> np.ndarray:
        """0/1 correctness of ``spec`` on ``doc_ids`` (evaluating, and storing, the missing ones)."""
        key = self.plan.point_key(spec)
        known = self._load(key)
        missing = [d for d in doc_ids if d not in known]
        while missing:
            self._fetch(spec, key, missing)
            missing = [d for d in doc_ids if d not in known]
        return np.array([float(known[d].correct) for d in doc_ids])

    def _fetch(self, spec: str, key: StoreKey, missing: list[int]) -> None:
        """Evaluate ``missing`` under ``spec`` as one claimed part (or wait for the process that holds it).
        Without a model (a replay of the store) only what is stored is read: a part another process
        is still evaluating is missing, not waited for (else a replay beside a running search would
        follow it batch by batch)."""
        part = key.part(missing)
        path = self.store.path(part)
        if self.model is None:
            rec = self.store.load(part, PointRecord)
            if rec is None:
                raise ItemsMissing(f"{self.store.root}: items of {spec} are not stored; the search's "
                                   f"tables are rebuilt from a complete store only")
            self._add(self._known[key.digest], self._zeroed[key.digest], self._cost[key.digest], rec)
            return
        evaluated = False
        with claim(path) as mine:
            if mine:
                rec = self.store.load(part, PointRecord)
                if rec is None:
                    if self.deadline is not None and time.monotonic() >= self.deadline:
                        raise SearchStopped(f"the search's time is up before {len(missing)} items of {spec}")
                    rec = self._evaluate(spec, missing)
                    self.store.save(part, rec)
                    self.new += len(missing)
                    self.new_seconds += compute_seconds(rec.eval_config)
                    evaluated = True
                self._add(self._known[key.digest], self._zeroed[key.digest], self._cost[key.digest], rec)
        if mine:
            if evaluated and self.after_batch is not None:
                self.after_batch()  # between batches, no claim held: a caller may checkpoint (``to_ledger``)
            return
        wait_for(path)
        rec = self.store.load(part, PointRecord)
        if rec is not None:
            self._add(self._known[key.digest], self._zeroed[key.digest], self._cost[key.digest], rec)

    def _evaluate(self, spec: str, doc_ids: list[int]) -> PointRecord:
        cfg = self.plan.cfg
        if spec == "none":  # the unablated point, read by every probe: its prefixes kept for the whole search
            if self._unablated is None:
                self._unablated = Speculation(UNABLATED_BYTES)
                self._unablated.set_population(self._population())
            ablation, kept = None, {"speculation": self._unablated}
        else:
            ablation, kept = self._ablation(spec), {}
        result = evaluation.evaluate_task(self.model, self.task, n_shot=cfg.n_shot, seed=cfg.seed,
                                          ablation=ablation, batch_size=cfg.batch_size, progress=False,
                                          doc_ids=list(doc_ids), protocol=cfg.protocol, **kept)
        return PointRecord.from_result(result)

    def _ablation(self, spec: str):
        """The ablation of ``spec``, one object for all its batches: one that zeroes the same heads
        on every input (static) keeps each shared prefix it ran (``interventions.speculation``), found
        through the population's prefixes by the questions of a subject that later batches bring (so
        does a per-input score ablation given a ``Speculation``). The previous point's is dropped (a
        probe's batches come one after another)."""
        if self._last is None or self._last[0] != spec:
            self._last = None  # its entries go before the next point's are made
            abl = parse_ablation(spec, self.model.geometry)
            if abl.reuses_prefix:
                abl.speculation = Speculation()
            if abl.speculation is not None:
                abl.speculation.set_population(self._population())
            self._last = (spec, abl)
        return self._last[1]

    def _population(self) -> dict[tuple[int, ...], int]:
        """The shared prefixes of the plan's questions' model inputs (computed once)."""
        if self._prefixes is None:
            cfg = self.plan.cfg
            records = select_records(self.task, None, cfg.seed, self.plan.doc_ids)
            self._prefixes = population_prefixes(self.model, record_inputs(
                self.model, self.task, records, cfg.n_shot, cfg.seed, cfg.protocol))
        return self._prefixes

    def to_ledger(self) -> Ledger:
        """Everything known of the plan's points (the store's and the ledger's), as a ledger."""
        entries = {}
        for spec in self.plan.order:
            key = self.plan.point_key(spec)
            known = self._load(key)
            if not known:
                continue
            entries[key.digest] = LedgerEntry(spec, frozenset(known), frozenset(d for d, q in known.items() if q.correct),
                                              tuple(self._zeroed[key.digest]), self._cost[key.digest][1] / 1000,
                                              int(round(self._cost[key.digest][0])))
        return Ledger(self.plan.doc_ids, entries)

    def complete_point(self, spec: str) -> bool:
        """Once every item of ``spec`` is known from disjoint parts: store them as the point's
        record (what a grid sweep then reads) and drop the parts. True when the point is stored."""
        key = self.plan.point_key(spec)
        if self.store.has(key):
            return True
        known = self._load(key)
        ids = self.plan.doc_ids
        if any(d not in known for d in ids):
            return False
        self._index_parts()
        parts = [PointRecord.from_json(d) for d in self._parts.get(key.digest, [])]
        docs = [q.doc_id for p in parts for q in p.questions]
        if sorted(docs) != sorted(ids):  # overlapping or foreign parts: leave them as they are
            return False
        rank = {d: i for i, d in enumerate(ids)}
        rec = PointRecord.merge(parts, self.plan.cfg.limit)
        rec.questions = sorted(rec.questions, key=lambda q: rank[q.doc_id])
        rec.point_hash = key.digest
        self.store.save(key, rec)
        for d in self._parts.get(key.digest, []):
            self.store.discard(StoreKey(Kind.PART, d["config"]))
        return True


# -----------------------------------------------------------------------------
# Curves of a plan


@dataclass(frozen=True)
class Curve:
    """One searched curve: its name (a score id, ``random``, ``static:ID``) and, per grid
    index, the specs whose mean correctness it reads (one, or one per random seed)."""

    name: str
    specs: tuple[tuple[str, ...], ...]  # [grid index] -> specs

    @property
    def levels(self) -> int:
        return len(self.specs[-1])

    @property
    def constant(self) -> bool:
        """Whether every grid point after 0 is the same ablation (two or more of them): a score
        whose thresholds tie over the whole range, so Δ does not depend on the fraction."""
        return len(self.specs) > 2 and len(set(self.specs[1:])) == 1


def curves_of(plan: SweepPlan, grid: Sequence[float]) -> list[Curve]:
    """The plan's curves on ``grid`` (its fractions), in the plan's order: per-input functions,
    random heads (the mean over seeds, as the grid sweep's curve), static curves."""
    by: dict[str, dict[float, list[tuple[int | None, str]]]] = {}
    for p in plan.points:
        if math.isnan(p.fraction):
            continue  # extra ablations have no curve
        by.setdefault(p.score_fn, {}).setdefault(float(p.fraction), []).append((p.seed, p.spec))
    out = []
    for name, pts in by.items():
        specs = []
        for f in grid:
            got = sorted(pts.get(float(f), []), key=lambda t: -1 if t[0] is None else t[0])
            if not got:
                raise LensHeadsError(f"curve {name} has no point at fraction {f:g}")
            specs.append(tuple(s for _, s in got))
        out.append(Curve(name, tuple(specs)))
    return out


@dataclass
class SearchRun:
    """What ``search_curve`` needs besides the curve: the plan on the search's grid, the items."""

    plan: SweepPlan
    search: SearchConfig
    grid: list[float]
    items: StoreItems
    progress: bool = False

    @property
    def order(self) -> list[int]:
        return item_order(self.plan.doc_ids, self.search.order_seed)


def curve_differences(items: StoreItems, specs: Sequence[str], ids: Sequence[int]) -> np.ndarray:
    """Per item of ``ids``, Δ of a curve's point: its specs' mean correctness (one, or one per
    random seed) minus the unablated correctness (read, or evaluated, first: a run stopped between
    the two keeps the unablated batch every curve shares)."""
    base = items.correct("none", ids)
    return np.mean([items.correct(s, ids) for s in specs], axis=0) - base


def curve_pct_zeroed(items: StoreItems, specs: Sequence[str]) -> float:
    """% of units a curve's point zeroed over its stored items (the mean over its specs)."""
    return float(np.mean([items.pct_zeroed(s) for s in specs]))


def run_probe(run: SearchRun, curve: Curve, index: int, pending: bool = False,
              max_items: int | None = None) -> ProbeOutcome:
    """One probe of ``curve`` at grid ``index``: its questions in the run's order, batch by
    batch, until the confidence sequence decides (``max_items``: a cap below the search's own)."""
    N, items, search = len(run.plan.doc_ids), run.items, run.search
    alpha = search.probe_alpha(len(run.grid))
    cap = search.max_items if max_items is None else (max_items if search.max_items is None
                                                      else min(max_items, search.max_items))
    specs = curve.specs[index]
    label = f"{curve.name}@{100 * run.grid[index]:g}%"
    bar = progress_bar(N, label, enabled=run.progress, unit="item", leave=False)

    def differences(ids: Sequence[int]) -> np.ndarray:
        return curve_differences(items, specs, ids)

    def shown(n: int, lo: float, hi: float) -> None:
        bar.n = n
        bar.set_postfix_str(f"Δ in [{100 * lo:+.2f}, {100 * hi:+.2f}] pt, margin -{100 * search.margin:g}",
                            refresh=True)

    try:
        got = decide_probe(N, run.order, differences, alpha, search.margin, search.batch, curve.levels,
                           cap, shown, pending)
    finally:
        bar.close()
    got.index = index
    got.pct_zeroed = curve_pct_zeroed(items, specs)
    if got.n == N and got.decision != PENDING:
        for s in specs:
            items.complete_point(s)  # a probe run to exhaustion is a whole point: a grid sweep reads it
    return got


def stored_points(run: SearchRun, curve: Curve, skip: Iterable[int] = ()) -> list[ProbeOutcome]:
    """The grid points of ``curve`` (index 0 and ``skip`` left out) whose every item is already
    known, with and without the ablation: each with its exact Δ and decision, evaluating nothing.
    What a grid sweep (or an earlier search at another resolution) measured that the bisection
    did not probe: the evidence ``CurveOutcome.violations`` checks the monotone assumption on."""
    items, ids, skip = run.items, run.plan.doc_ids, set(skip)
    if not items.known_whole("none"):
        return []
    out = []
    for index in range(1, len(run.grid)):
        specs = curve.specs[index]
        if index in skip or not all(items.known_whole(s) for s in specs):
            continue
        delta = float(np.mean(curve_differences(items, specs, ids)))  # exact: every item
        out.append(ProbeOutcome(index, decide(delta, delta, run.search.margin + _EXACT), delta, delta, len(ids),
                                curve_pct_zeroed(items, specs)))
    return out


def search_curve(run: SearchRun, curve: Curve, pending: bool = False) -> CurveOutcome:
    """Bisect ``curve`` on the run's grid, each probe decided sequentially on the store's items,
    then read the points the store holds whole that were not probed (``stored_points``).
    ``pending`` (a replay with no model): the first probe whose items are not all stored ends the
    curve as ``pending``, with its interval so far, instead of raising ``ItemsMissing``.
    A ``constant`` curve takes the bisection's first probe only: every other probe would be the
    same ablation, so it is ``constant scores`` with no crossing, and no point is read twice."""
    if curve.constant:
        got = run_probe(run, curve, len(run.grid) // 2, pending)
        return CurveOutcome(None, PENDING if got.decision == PENDING else CONSTANT, (0, len(run.grid)), [got])
    out = bisect_crossing(len(run.grid), lambda index: run_probe(run, curve, index, pending))
    out.stored = stored_points(run, curve, (p.index for p in out.probes))
    return out


# -----------------------------------------------------------------------------
# Tables


def probe_rows(curve: Curve, outcome: CurveOutcome, grid: Sequence[float]) -> list[dict]:
    """``probes.csv`` rows of one curve: every probe in the order taken."""
    return [{"score_fn": curve.name, "step": i + 1, "fraction": grid[p.index], "pct": 100 * grid[p.index],
             "specs": ";".join(curve.specs[p.index]), "decision": p.decision, "delta_lo": p.lo, "delta_hi": p.hi,
             "n_items": p.n, "pct_zeroed": p.pct_zeroed}
            for i, p in enumerate(outcome.probes)]


def curve_cost(curve: Curve, outcome: CurveOutcome, items: StoreItems) -> tuple[float, float]:
    """(items evaluated, seconds) of the points ``outcome`` probed, the unablated one left out
    (every curve shares it): from the stored records' own timings, so the same wherever read."""
    specs = dict.fromkeys(s for p in outcome.probes for s in curve.specs[p.index] if s != "none")
    costs = [items.cost(s) for s in specs]
    return float(sum(c[0] for c in costs)), float(sum(c[1] for c in costs))


def crossing_row(curve: Curve, outcome: CurveOutcome, grid: Sequence[float], search: SearchConfig, N: int,
                 cost: tuple[float, float] | None = None) -> dict:
    """The curve's ``within_1pt.csv`` row of an adaptive search (``cost``: ``curve_cost``'s
    items evaluated and seconds, the ``eval_items`` / ``eval_seconds`` columns)."""
    lo, hi = outcome.bracket
    beyond = lambda i: math.inf if i >= len(grid) else 100 * grid[i]  # noqa: E731
    violations = outcome.violations(search.margin)
    none = outcome.status == CONSTANT  # no crossing, so no bracket either (not [0, inf): that reads "within up to the end")
    return {"score_fn": curve.name,
            "crossing_pct": math.nan if outcome.crossing is None else 100 * grid[outcome.crossing],
            "crossing_status": outcome.status, "bracket_low_pct": math.nan if none else 100 * grid[lo],
            "bracket_high_pct": math.nan if none else beyond(hi),
            "resolution_pct": 100 * search.resolution, "range_pct": 100 * grid[-1], "alpha": search.alpha,
            "margin_pts": 100 * search.margin, "n_probes": len(outcome.probes), "n_population": N,
            "item_evaluations": sum(p.n * len(curve.specs[p.index]) for p in outcome.probes),
            "probes": "; ".join(f"{100 * grid[p.index]:g}%:{p.decision}@{p.n}" for p in outcome.probes),
            "monotone_violation": "; ".join(f"{100 * grid[a]:g}%<{100 * grid[b]:g}%" for a, b in violations),
            "stored_points": "; ".join(f"{100 * grid[p.index]:g}%:{p.decision}({100 * p.lo:+.2f})" for p in outcome.stored),
            **({} if cost is None else {"eval_items": round(cost[0]), "eval_seconds": round(cost[1], 3)})}


def search_tables(curves: Iterable[Curve], outcomes: Sequence[CurveOutcome], grid: Sequence[float],
                  search: SearchConfig, N: int, items: StoreItems | None = None):
    """(within, probes) DataFrames of an adaptive search (``items``: where the curves' costs are read)."""
    import pandas as pd

    curves = list(curves)
    within = pd.DataFrame([crossing_row(c, o, grid, search, N, None if items is None else curve_cost(c, o, items))
                           for c, o in zip(curves, outcomes)])
    probes = pd.DataFrame([r for c, o in zip(curves, outcomes) for r in probe_rows(c, o, grid)])
    return within, probes


# -----------------------------------------------------------------------------
# The search of a sweep


def search_config(cfg: SweepConfig, search: SearchConfig) -> tuple[SweepConfig, list[float]]:
    """(the sweep's config on the search's grid, the grid): fractions 0, r, ... up to the
    sweep's largest; extra ablations and ``first`` have no curve and are left out."""
    grid = search.grid(max(cfg.fractions))
    return replace(cfg, fractions=grid, first=(), extra_ablations=()), grid


@dataclass
class SearchResult:
    """An adaptive search's tables (``within``: a row per curve, ``probes``: a row per probe),
    the outcomes, and what this run evaluated."""

    within: object
    probes: object
    outcomes: dict[str, CurveOutcome]
    new_items: int = 0
    seconds: float = 0.0
    complete: bool = True
    stopped: bool = False  # the time limit came first: the curves not in ``outcomes`` are left for a rerun

    @classmethod
    def load_tables(cls, out_dir) -> tuple[object, object] | None:
        """(within, probes) of a search saved in ``out_dir`` (None when it holds no ``probes.csv``):
        what the report and the figures read."""
        import pandas as pd

        out = Path(out_dir)
        if not (out / "probes.csv").is_file() or not (out / "within_1pt.csv").is_file():
            return None
        try:
            within, probes = pd.read_csv(out / "within_1pt.csv"), pd.read_csv(out / "probes.csv")
        except (pd.errors.ParserError, pd.errors.EmptyDataError, UnicodeDecodeError, OSError) as exc:
            raise LensHeadsError(f"cannot read the search tables in {out}: {str(exc).splitlines()[0]}") from None
        if "crossing_pct" not in within.columns:
            return None
        return within, probes

    def save(self, out_dir) -> None:
        """``within_1pt.csv`` (a grid sweep's table there gains the search's columns, row by
        curve) and ``probes.csv``, each written atomically."""
        import pandas as pd

        out = Path(out_dir)
        within = self.within
        grid_table = out / "within_1pt.csv"
        if grid_table.is_file():
            old = pd.read_csv(grid_table)
            if "max_pct_zeroed_within_1pt" in old.columns:  # a grid sweep's: keep its columns, add ours
                keep = [c for c in old.columns if c == "score_fn" or c not in within.columns]
                within = old[keep].merge(within, on="score_fn", how="outer")
        atomic_write_csv(within, grid_table)
        atomic_write_csv(self.probes, out / "probes.csv")


def prepare_search(model: LoadedModel, cfg: SweepConfig, search: SearchConfig, out_dir, task=None,
                   progress: bool = True, ledger: Ledger | None = None,
                   deadline: float | None = None) -> tuple[SearchRun, list[Curve]]:
    """Everything a search needs before its first probe: the thresholds and static scores on the
    search's grid (stored, or one scoring pass), the plan, the curves. ``ledger``: items known
    beyond the store (``sweep.ledger``); ``deadline``: see ``StoreItems``."""
    task = check_sweep(model, cfg, task)
    gcfg, grid = search_config(cfg, search)
    identity = gcfg.identity(model, task)
    store = ResultStore(out_dir)
    check_one_weights(store, identity)
    thresholds = ensure_thresholds(model, store, identity, gcfg, task, progress)
    static = ensure_static(model, store, identity, gcfg, task, progress)
    plan = SweepPlan.build(identity, gcfg, task, thresholds, static)
    items = StoreItems(store, plan, model, task, ledger=ledger, deadline=deadline)
    return SearchRun(plan, search, grid, items, progress), curves_of(plan, grid)


def run_search(model: LoadedModel, cfg: SweepConfig, search: SearchConfig, out_dir, task=None,
               progress: bool = True, shard: tuple[int, int] | None = None, ledger=None,
               time_limit: float | None = None) -> SearchResult:
    """Search every curve of ``cfg`` (``shard`` (i, n): every n-th curve from i, then the tables
    if every curve is done) and write the tables. Resumes from the store; reuses what a grid
    sweep stored under the same keys.

    ``ledger``: a path: the items it holds are read (a fresh machine's store may hold none of
    them) and it is written back with everything known when the run ends or stops.
    ``time_limit`` (seconds): no batch is evaluated after it (a scoring pass already running
    finishes); the curves not finished by then are left for a rerun, which resumes them, and the
    result is ``stopped`` with no tables written."""
    t0 = time.perf_counter()
    deadline = None if time_limit is None else time.monotonic() + float(time_limit)
    task = check_sweep(model, cfg, task)
    doc_ids = [r.doc_id for r in select_records(task, cfg.limit, cfg.seed)]
    book = None if ledger is None else Ledger.load(ledger, doc_ids)
    run, curves = prepare_search(model, cfg, search, out_dir, task, progress, book, deadline)
    mine = curves if shard is None else curves[shard[0]::shard[1]]
    outcomes: dict[str, CurveOutcome] = {}
    stopped = False
    try:
        for curve in mine:
            outcomes[curve.name] = search_curve(run, curve)
    except SearchStopped:
        stopped = True
    finally:
        if ledger is not None:
            run.items.to_ledger().save(ledger)
    done = [c for c in mine if c.name in outcomes]
    if stopped:
        within, probes = search_tables(done, [outcomes[c.name] for c in done], run.grid, search,
                                       len(run.plan.doc_ids))
        result = SearchResult(within, probes, outcomes, complete=False, stopped=True)
    elif shard is None:  # every curve searched here: its tables are the outcomes (a replay from the store equals them)
        within, probes = search_tables(curves, [outcomes[c.name] for c in curves], run.grid, search,
                                       len(run.plan.doc_ids))
        result = SearchResult(within, probes, outcomes)
    else:  # the other shards' curves from the store: None while any of them is still running
        result = tabulate_search(out_dir, run.plan.identity, run.plan.cfg, run.plan, search, run.grid, curves)
    if result is None:  # the last shard to finish writes the tables
        within, probes = search_tables([c for c in mine], [outcomes[c.name] for c in mine], run.grid, search,
                                       len(run.plan.doc_ids))
        result = SearchResult(within, probes, outcomes, complete=False)
    elif not stopped:
        result.save(out_dir)
    result.new_items, result.seconds = run.items.new, time.perf_counter() - t0
    return result


def run_curve_unit(model: LoadedModel, task, identity: RunIdentity, gcfg: SweepConfig, store: ResultStore,
                   search: SearchConfig, index: int) -> int:
    """The ``curve/I`` unit of an executor (``sweep.units``): search curve ``index`` of the plan
    the store's thresholds make (the launcher stored them first); the questions it evaluated."""
    thresholds = read_thresholds(store, identity, gcfg, task)
    static = stored_static(store, identity, gcfg) if gcfg.static_ids else None
    if thresholds is None or (gcfg.static_ids and static is None):
        raise LensHeadsError(f"{store.root}: curve units need the search's thresholds; run the score units first")
    plan = SweepPlan.build(identity, gcfg, task, thresholds, static)
    grid = [float(p) for p in gcfg.fractions]
    curves = curves_of(plan, grid)
    if not 0 <= index < len(curves):
        raise LensHeadsError(f"unit curve/{index}: the search has {len(curves)} curves")
    run = SearchRun(plan, search, grid, StoreItems(store, plan, model, task))
    search_curve(run, curves[index])
    return run.items.new


def tabulate_search(out_dir, identity: RunIdentity, gcfg: SweepConfig, plan: SweepPlan | None,
                    search: SearchConfig, grid: Sequence[float], curves: Sequence[Curve] | None = None,
                    task=None, ledger: Ledger | None = None, pending: bool = False,
                    costs: bool = False) -> SearchResult | None:
    """The search's tables from the store (and ``ledger``) alone, no model: every curve's search
    replayed on its stored items; None while any item a curve needs is missing, or with
    ``pending`` the curves still running as ``pending`` rows (their probes so far); ``costs``:
    with each curve's ``eval_items`` / ``eval_seconds`` (``curve_cost``)."""
    store = ResultStore(out_dir)
    if plan is None:
        thresholds = read_thresholds(store, identity, gcfg, task)
        static = stored_static(store, identity, gcfg) if gcfg.static_ids else None
        if thresholds is None or (gcfg.static_ids and static is None):
            return None
        plan = SweepPlan.build(identity, gcfg, task, thresholds, static)
    curves = list(curves) if curves is not None else curves_of(plan, grid)
    replay = SearchRun(plan, search, list(grid), StoreItems(store, plan, ledger=ledger))
    outcomes = {}
    try:
        for c in curves:
            outcomes[c.name] = search_curve(replay, c, pending)
    except ItemsMissing:
        return None
    within, probes = search_tables(curves, [outcomes[c.name] for c in curves], grid, search, len(plan.doc_ids),
                                   replay.items if costs else None)
    return SearchResult(within, probes, outcomes, complete=all(o.status != PENDING for o in outcomes.values()))


__all__ = ["ItemsMissing", "SearchStopped", "PENDING", "CONSTANT", "curve_cost", "SearchConfig", "ProbeOutcome", "CurveOutcome", "Curve", "SearchRun", "SearchResult", "StoreItems",
           "bisect_crossing", "decide_probe", "stored_points", "item_order", "max_probes", "curves_of", "prepare_search",
           "run_curve_unit", "run_probe", "run_search", "search_config", "search_curve", "search_tables", "tabulate_search", "WITHIN", "OUTSIDE",
           "UNRESOLVED"]
