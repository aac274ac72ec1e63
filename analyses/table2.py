"""The paper's Table 2 (arXiv 2504.03889) at paper resolution: each curve's within-1-point
crossing searched adaptively (docs/methods.md §12-13) on the full benchmark, as a resumable
campaign over many sessions that commits as it goes.

    export LENS_HEADS_DATA=/work/shared/data HF_HUB_OFFLINE=1 HF_DATASETS_OFFLINE=1
    nohup python analyses/table2.py --workers 2 --time-limit 140 --commit-every 30 --no-progress > /tmp/table2.log 2>&1 &

``--workers N`` runs N worker processes (this script with ``--worker``), each pinned to one CPU
core with one torch thread and given one stage of the work list whose pair no other worker
holds; this process schedules them in the work list's order, rebuilds the tables and commits.

The work list (``work_list``), in the order of issue 55, so that every session leaves finished
rows: PIQA for SmolLM2, Gemma and Qwen (the twelve paper functions, random heads over three
seeds, static AHON(LN)); Qwen/MMLU (stratified 2,000 5-shot) for random, AWFT, AHON(LN),
LTHON(LN); Gemma/WinoGrande (all functions); the other Qwen/MMLU functions; then mean ablation
(``mean:c4``) for random, AWFT, AHON(LN), LTHON(LN) on the same five pairs. One *unit* is one
curve of one (model, task, ablation) *group*; a group is one adaptive search (``SweepConfig`` on
0-60 % at 1 %, margin 1 point, alpha 0.05 per curve). A pair's two groups share one store,
``OUT/table2/store/<model>__<task>/``: the unablated point and the thresholds are the same under
zero and mean ablation (each ablated point has its own key), so they are computed once.

The campaign's dtype is float32 (``CAMPAIGN_DTYPE``, ``--dtype``): the full-size dtype check
moved a decision at a crossing in bfloat16 (table2_dtype_check.csv). A search in the other dtype
(``--dtype bfloat16``, native bf16 CPUs; the first 11 SmolLM2/PIQA curves ran so) keeps its own
store beside the campaign's, ``<model>__<task>__bfloat16/``; every table is the campaign
dtype's, and table2_dtype_crossings.csv sets each curve decided in both dtypes side by side.

Each unit is skipped when the store (or its ledger) already decides it; else the group's
thresholds are read (or computed: one scoring pass over the population, in ``SCORE_SHARDS``
shards each stored as it ends, so a pass longer than one run resumes at its next shard) and
the curve is searched, every batch stored as it is evaluated. ``--time-limit``: no batch starts
after it (the run stops between batches and exits 0; the next run resumes, evaluating nothing
twice). After every finished unit (and at the stop) the group's ledger
(``OUT/table2/store/<model>__<task>/ledger_<ablation>.json``, the per-item results in ~N/4
bytes a point, docs/methods.md §13) is written and every table is rebuilt from the stores and
ledgers alone, no model. With ``--commit-every M``: every M minutes (checked after each unit and
after each batch within one, the ledger written first) and at the end, a git commit of the
results only: the tables, the figures, and per pair the ledgers, the scoring-pass log, the
thresholds and the static scores (never the per-item store, never anything outside OUT: the
paths are named, no ``git add -A``). A shard of a scoring pass starts only while its share of
``--pass-minutes`` fits the time left (else the group waits for a later run); with ``--dtype bfloat16`` a CPU without native bf16
only rebuilds the tables (``--allow-emulated`` to run there anyway).

Outputs (OUT, beside the old 200-question tables, which this script never writes):
table2_crossings.csv (a row per unit: crossing, status and reason, intervals, probes, items and
hours spent, the fixed 7-point grid's cost), table2_probes.csv, table2_groups.csv (per group:
the unablated items, the population, the scoring pass, totals), table2_remaining.csv (per group:
an estimate of the items and hours its undecided rows still need), table2_paper_comparison.csv,
table2_paper_claims.csv, table2_dtype_crossings.csv, table2_dtype_check.csv (``--check-dtype``:
a bfloat16 search's probes again in float32), table2_runs.csv (one row
per run that computed something: machine, dtype, items, hours), table2_summary.md and
figures/table2_<group>.png (each curve's probes) and figures/table2_overview__<ablation>.png (every pair's
crossings side by side, the paper's MMLU row marked). Rerunning with nothing left to compute (or ``--tabulate-only``)
rewrites every one of them byte for byte.

Hours are compute hours (docs/methods.md §13, "Cost per curve"): on a CPU the evaluating
process's CPU time, so a campaign run sharing its core with other work is not billed for it;
records and scoring passes logged before CPU time was kept count their wall time.
"""

from __future__ import annotations

import math
import os
import platform
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pandas as pd

sys.path.insert(0, str(Path(__file__).resolve().parent))

from common import markdown_table, out_folder, script_main, split_list, write_csv  # noqa: E402

from lens_heads.data import load_task  # noqa: E402
from lens_heads.errors import LensHeadsError  # noqa: E402
from lens_heads.evaluation.timing import compute_seconds, device_kind  # noqa: E402
from lens_heads.files.atomic import atomic_path, atomic_write_text  # noqa: E402
from lens_heads.files.claims import claim  # noqa: E402
from lens_heads.forward.task_requests import select_records  # noqa: E402
from lens_heads.models import check_device  # noqa: E402
from lens_heads.models.load import native_bf16  # noqa: E402
from lens_heads.results.store import ResultStore  # noqa: E402
from lens_heads.sweep import SweepConfig  # noqa: E402
from lens_heads.sweep.adaptive import CONSTANT, PENDING, SearchConfig, SearchRun, SearchStopped, StoreItems, curve_cost, \
    curves_of, max_probes, prepare_search, run_probe, search_config, search_curve, search_tables  # noqa: E402
from lens_heads.sweep.ledger import Ledger  # noqa: E402
from lens_heads.sweep.plan import SweepPlan, stored_static  # noqa: E402
from lens_heads.sweep.run import check_one_weights, read_thresholds  # noqa: E402
from lens_heads.sweep.units import score_in_shards  # noqa: E402
from lens_heads.viz.study import ModelRef  # noqa: E402

MODELS = ("smollm2-135m", "gemma-3-270m", "qwen2.5-coder-0.5b")
LIMITS = {"piqa": None, "winogrande": None, "mmlu": 2000}  # the population: the full benchmark, MMLU's stratified 2,000
FIRST = ("random", "awft", "ahon_ln", "lthon_ln")  # the curves the paper's claims turn on, first in every pair
STATIC = "static:ahon_ln"
OUTPUT_NORM = ("ahon", "ahon_ln", "lthon", "lthon_ln")  # the paper's output-norm scores
ZERO, MEAN = "zero", "mean_c4"
REPLACEMENT = {ZERO: None, MEAN: "mean:c4"}
DECIDED = ("resolved", "lower bound")  # the statuses that settle a row
RANDOM_CURVES = ("random", "static:random")  # three seeds a probe
RESOLVING_STAGES = 4  # stages 1-4 (PIQA x 3 models, Qwen/MMLU's FIRST curves) resolve the issue
GRID7 = 6  # the fixed grid's ablated points per curve (0-30 % in 5s; the unablated point is shared)

# The paper's numbers (arXiv 2504.03889, Table 2 and its text)
PAPER_ROW = {"model": "Qwen2.5-0.5B", "task": "mmlu", "base_accuracy": 47.49, "awft": 7.4, "ahon_ln": 7.4,
             "lthon_ln": 14.4}
PAPER_RANDOM = (0.5, 1.9)
PAPER_AVERAGES = {"awft": 4.61, "best_non_awft": 12.18}

# A group's scoring pass (thresholds + static scores over the whole population) runs in shards of
# whole batches (``sweep.units.score_in_shards``), each stored as it ends, so a pass longer than one
# session resumes at its next shard; bit-identical to one pass (docs/methods.md §8). Fixed per task:
# the shard count is part of each shard's store key (changing it orphans shards already stored).
SCORE_SHARDS = {"piqa": 4, "winogrande": 8, "mmlu": 64}
# Minutes a group's whole scoring pass may take, by task: a shard starts only while its share
# (PASS_MINUTES / SCORE_SHARDS), or the last shard's measured wall time if longer, fits in the time left. From the unablated passes measured in fp32 on
# a 2-core AVX2 EPYC (analyses/results/README.md): Qwen/MMLU's 500 took ~2 h (its 2,000: ~8 h),
# Gemma/WinoGrande ~30 min, PIQA 10-30 min.
PASS_MINUTES = {"piqa": 30.0, "winogrande": 60.0, "mmlu": 480.0}

# CPU seconds per item of a pair's ablated evaluation relative to SmolLM2/PIQA's, for the pairs the
# campaign has not timed yet (float32, one torch thread, the same run: benchmarks/results/
# bench_campaign_rates.md, 7 Dec). Only the remaining-compute estimate reads them; Gemma/PIQA's
# 1.63 against the campaign's own 1.93 shows how far such a ratio can be off (~20 %, low).
RATE_VS_SMOLLM2_PIQA = {("smollm2-135m", "piqa"): 1.0, ("gemma-3-270m", "piqa"): 1.63,
                        ("qwen2.5-coder-0.5b", "piqa"): 3.02, ("qwen2.5-coder-0.5b", "mmlu"): 22.89,
                        ("gemma-3-270m", "winogrande"): 3.26}

# The campaign's dtype: float32. The full-size dtype check (table2_dtype_check.csv, 6 Dec) found bf16
# moving a decision at the crossing (SmolLM2/PIQA AHON(LN) at 15 %: bf16 -1.41 pt, fp32 -0.49 pt on the
# same 1,838 questions), so the curves are searched in float32; a pair's store for any other dtype sits
# beside its float32 one, suffixed with the dtype (``store_folder``).
CAMPAIGN_DTYPE = "float32"

TABLES = ("table2_crossings.csv", "table2_probes.csv", "table2_groups.csv", "table2_remaining.csv",
          "table2_paper_comparison.csv", "table2_paper_claims.csv", "table2_dtype_crossings.csv", "table2_summary.md")
DTYPES = ("float32", "bfloat16")
OTHER_DTYPE = next(d for d in DTYPES if d != CAMPAIGN_DTYPE)  # the comparison's: its store sits beside


# -----------------------------------------------------------------------------
# The work list


@dataclass(frozen=True)
class Group:
    """One adaptive search: a model on a task under one ablation kind."""

    model: str
    task: str
    ablation: str  # ZERO or MEAN

    @property
    def name(self) -> str:
        return f"{self.model}__{self.task}__{self.ablation}"


@dataclass(frozen=True)
class Unit:
    group: Group
    curve: str  # a score id, "random" or "static:ahon_ln"
    stage: int  # 1-based, the order

    @property
    def name(self) -> str:
        return f"{self.group.model}/{self.group.task}/{self.group.ablation}/{self.curve}"


def group_curves(args, ablation: str) -> list[str]:
    """Every curve of a group, in search order: random and the claims' three first."""
    scores = args.scores if ablation == ZERO else args.mean_scores
    first = [c for c in FIRST if c == "random" and args.seeds or c in scores]
    rest = [s for s in scores if s not in first]
    return first + rest + ([f"static:{s}" for s in args.static] if ablation == ZERO else [])


def work_list(args, only: bool = True) -> list[Unit]:
    """The units in the issue's order (``only``: those whose name starts with an item of ``--only``)."""
    smol, gemma, qwen = args.model_names
    zero = lambda m, t: Group(m, t, ZERO)  # noqa: E731
    allc = group_curves(args, ZERO)
    first = [c for c in allc if c in FIRST]
    stages = [(zero(smol, "piqa"), allc), (zero(gemma, "piqa"), allc), (zero(qwen, "piqa"), allc),
              (zero(qwen, "mmlu"), first), (zero(gemma, "winogrande"), allc),
              (zero(qwen, "mmlu"), [c for c in allc if c not in first])]
    for m, t in ((smol, "piqa"), (gemma, "piqa"), (qwen, "piqa"), (qwen, "mmlu"), (gemma, "winogrande")):
        stages.append((Group(m, t, MEAN), group_curves(args, MEAN)))
    units = [Unit(g, c, i + 1) for i, (g, curves) in enumerate(stages) for c in curves]
    if only and args.only:
        units = [u for u in units if any(u.name.startswith(o) for o in args.only)]
    if only and getattr(args, "units", None):  # a --workers worker's units, by exact name
        names = set(args.units)
        units = [u for u in units if u.name in names]
    return units


def store_folder(out: Path, group: Group, dtype: str) -> Path:
    """A pair's store for one dtype: ``<model>__<task>`` in the campaign's dtype, else
    ``<model>__<task>__<dtype>`` (both ablation kinds of the pair share it)."""
    suffix = "" if dtype == CAMPAIGN_DTYPE else f"__{dtype}"
    return out / "table2" / "store" / f"{group.model}__{group.task}{suffix}"


def group_states(args, out: Path, units: list[Unit], dtype: str) -> dict[Group, "GroupState"]:
    """Every group of ``units`` in one dtype: its search settings and its store (``store_folder``)."""
    search = search_settings(args)
    return {g: GroupState(g, sweep_cfg(args, g), search, store_folder(out, g, dtype),
                          ModelRef(args.model_specs[g.model], dtype, args.device), dtype)
            for g in dict.fromkeys(u.group for u in units)}


def sweep_cfg(args, group: Group) -> SweepConfig:
    scores = args.scores if group.ablation == ZERO else args.mean_scores
    limit = args.limit if args.limit is not None else LIMITS.get(group.task)
    if args.limit is not None and LIMITS.get(group.task) is not None:
        limit = min(args.limit, LIMITS[group.task])
    return SweepConfig(task=group.task, score_ids=list(scores), fractions=[0.0, args.range],
                       random_seeds=list(range(args.seeds)), limit=limit, batch_size=args.batch_size,
                       static_ids=list(args.static) if group.ablation == ZERO else [], chunk_questions=None,
                       replacement=REPLACEMENT[group.ablation])


def search_settings(args) -> SearchConfig:
    return SearchConfig(margin=args.margin / 100, alpha=args.alpha, resolution=args.resolution / 100,
                        batch=args.search_batch, order_seed=args.order_seed)


# -----------------------------------------------------------------------------
# A group's search: its store, ledger and plan


@dataclass
class GroupState:
    group: Group
    cfg: SweepConfig
    search: SearchConfig
    folder: Path
    ref: ModelRef
    dtype: str
    task: object = None
    run: SearchRun | None = None  # with a model, once prepared
    replay: SearchRun | None = None  # without one, from the store and the ledger
    curves: dict = field(default_factory=dict)

    @property
    def ledger_path(self) -> Path:
        """This group's ledger; its pair's other groups (the other ablation kind) keep theirs beside it."""
        return self.folder / f"ledger_{self.group.ablation}.json"

    @property
    def passes_path(self) -> Path:
        return self.folder / "passes.csv"

    def load_task(self):
        if self.task is None:
            self.task = _task(self.group.task)
        return self.task

    def doc_ids(self) -> list[int]:
        return [r.doc_id for r in select_records(self.load_task(), self.cfg.limit, self.cfg.seed)]

    def ledger(self) -> Ledger:
        """Every ledger of the pair's store, merged: the groups share the unablated point (and
        thresholds), so one group's ledger can hold what the other needs. Where two hold the
        same point, the one that knows more questions is taken."""
        ids = self.doc_ids()
        merged = Ledger(ids)
        for path in sorted(self.folder.glob("ledger_*.json")):
            for digest, e in Ledger.load(path, ids).entries.items():
                if digest not in merged.entries or len(e.known) > len(merged.entries[digest].known):
                    merged.entries[digest] = e
        return merged

    def replayed(self) -> SearchRun | None:
        """The search on the store and ledger alone (None until the thresholds are stored)."""
        if self.replay is not None:
            return self.replay
        gcfg, grid = search_config(self.cfg, self.search)
        if not self.folder.is_dir():
            return None
        store = ResultStore(self.folder)
        task = self.load_task()
        identity = gcfg.identity_for(self.ref.digest, self.dtype, task)
        thresholds = read_thresholds(store, identity, gcfg, task)
        static = stored_static(store, identity, gcfg) if gcfg.static_ids else None
        if thresholds is None or (gcfg.static_ids and static is None):
            return None
        plan = SweepPlan.build(identity, gcfg, task, thresholds, static)
        self.replay = SearchRun(plan, self.search, grid, StoreItems(store, plan, ledger=self.ledger()))
        self.curves = {c.name: c for c in curves_of(plan, grid)}
        return self.replay

    def decided(self, curve: str) -> bool:
        """Whether the curve needs no more evaluations: its search is settled (a ``constant scores``
        curve, one ablation over the whole range, once its one probe is)."""
        run = self.replayed()
        if run is None:
            return False
        return search_curve(run, self.curves[curve], pending=True).status != PENDING

    def tied_threshold(self, curve: str) -> float | None:
        """The one threshold a ``constant scores`` curve has at every fraction of the range. Gemma-3-270m's
        FTVVN(LN) and AVVN(LN) are such: one key/value head per layer makes a value norm ÷ the
        layer's mean exactly 1 for every head (docs/methods.md §3). None for a curve with no
        thresholds (a static ranking whose head count is the same at every fraction)."""
        run = self.replayed()
        return run.plan.thresholds.get(curve, {}).get(float(run.grid[-1]))

    def pass_progress(self) -> str:
        """How far a scoring pass still in shards has come, from passes.csv alone (committed, so a
        fresh machine reads the same): "k of n shards", or "" before the first shard."""
        done, n = self.pass_shards()
        return f"{done} of {n} shards" if done else ""

    def pass_shards(self) -> tuple[int, int]:
        """(shards stored, shards) of the scoring pass, from passes.csv alone."""
        n = SCORE_SHARDS.get(self.group.task, 1)
        if not self.passes_path.is_file():
            return 0, n
        return int(pd.read_csv(self.passes_path)["what"].str.fullmatch(rf"scoring shard \d+ of {n}").sum()), n

    def last_shard_minutes(self) -> float | None:
        """Wall minutes the scoring pass's last computed shard took (passes.csv), None before any.
        The shards run the longest inputs first, so it bounds the next one: Qwen/MMLU's first shard
        (32 five-shot prompts of 2,269-3,022 tokens, eager attention) runs ~10x the pass's average."""
        n = SCORE_SHARDS.get(self.group.task, 1)
        if not self.passes_path.is_file():
            return None
        log = pd.read_csv(self.passes_path)
        rows = log[log["what"].str.fullmatch(rf"scoring shard \d+ of {n}")]
        return float(rows["wall_seconds"].iloc[-1]) / 60 if len(rows) else None

    def shard_hours(self) -> float:
        """Compute hours (``pass_seconds``) per scoring shard stored so far, their mean; NaN before
        any. The shards run the longest prefixes first, so it bounds the ones left."""
        n = SCORE_SHARDS.get(self.group.task, 1)
        if not self.passes_path.is_file():
            return math.nan
        log = pd.read_csv(self.passes_path)
        rows = log[log["what"].str.fullmatch(rf"scoring shard \d+ of {n}")]
        return pass_seconds(rows) / 3600 / len(rows) if len(rows) else math.nan

    def pass_left(self) -> float:
        """The share of the scoring pass still to run: 0 once the thresholds are stored."""
        if (self.folder / "thresholds").is_dir():
            return 0.0
        done, n = self.pass_shards()
        return 1 - done / n

    def score(self, model, start_by: float | None) -> bool:
        """The group's thresholds and static scores by the scoring pass's ``SCORE_SHARDS`` shards,
        resuming at the next missing one; no shard starts after ``start_by``. Each computed shard
        is timed into passes.csv. True once the thresholds are whole (merged and stored; the static
        scores with them, or ``prepare`` scores what they lack)."""
        task = self.load_task()
        gcfg, _ = search_config(self.cfg, self.search)
        identity = gcfg.identity(model, task)
        store = ResultStore(self.folder)
        check_one_weights(store, identity)
        n = SCORE_SHARDS.get(self.group.task, 1)

        def logged(j: int, wall: float, cpu: float) -> None:
            log_pass(self.passes_path, wall, cpu, self.dtype, self.ref.device, f"scoring shard {j + 1} of {n}")
            print(f"[{time.strftime('%H:%M:%S')}] {self.group.name}: scoring shard {j + 1} of {n} "
                  f"stored ({wall:.0f} s)", flush=True)

        return score_in_shards(model, task, identity, gcfg, store, n, start_by, logged) is not None

    def prepare(self, model, deadline: float | None, progress: bool) -> SearchRun:
        """The search with the model: the thresholds (``score``'s shards; else one scoring pass,
        timed into passes.csv), the store, the ledger."""
        if self.run is None:
            had = self.replayed() is not None
            t0, c0 = time.perf_counter(), time.process_time()
            self.run, curves = prepare_search(model, self.cfg, self.search, self.folder, self.load_task(),
                                              progress, self.ledger(), deadline)
            if not had:
                log_pass(self.passes_path, time.perf_counter() - t0, time.process_time() - c0, self.dtype,
                         self.ref.device)
            self.curves = {c.name: c for c in curves}
            self.replay = None  # rebuilt from the store when tabulating
        return self.run

    def save_ledger(self) -> None:
        if self.run is not None:
            self.run.items.to_ledger().save(self.ledger_path)
            self.replay = None


_TASKS: dict[str, object] = {}


def _task(name: str):
    """A task, loaded once per process (a pair's groups share it)."""
    if name not in _TASKS:
        _TASKS[name] = load_task(name)
    return _TASKS[name]


def log_pass(path: Path, wall: float, cpu: float, dtype: str, device: str,
             what: str = "thresholds and static scores (one scoring pass)") -> None:
    row = pd.DataFrame([{"what": what, "wall_seconds": round(wall, 1),
                         "cpu_seconds": round(cpu, 1), "dtype": dtype, "cpu": cpu_name(),
                         "date": time.strftime("%Y-%m-%d"), "device": device_kind(device)}])
    old = pd.read_csv(path) if path.is_file() else None
    write_csv(row if old is None else pd.concat([old, row], ignore_index=True), path)


def pass_seconds(passes: pd.DataFrame) -> float:
    """What a pair's scoring passes cost (``compute_seconds`` per row of passes.csv: CPU seconds on
    a CPU, wall seconds on an accelerator; rows logged before the device column ran on a CPU)."""
    device = passes["device"] if "device" in passes else pd.Series("cpu", index=passes.index)
    return float(sum(compute_seconds({"seconds": w, "cpu_seconds": c, "device": d if isinstance(d, str) else "cpu"})
                     for w, c, d in zip(passes["wall_seconds"], passes["cpu_seconds"], device)))


def cpu_name() -> str:
    try:
        text = Path("/proc/cpuinfo").read_text()
        name = next(line.split(":", 1)[1].strip() for line in text.splitlines() if line.startswith("model name"))
        flags = [f for f in ("amx_bf16", "avx512_bf16") if f in text]
        return f"{name} ({', '.join(flags) if flags else 'no native bf16'}), {os.cpu_count()} cores"
    except (OSError, StopIteration):
        return platform.processor() or platform.machine()


# -----------------------------------------------------------------------------
# Tables, from the stores and ledgers alone


def fmt_pct(x) -> str:
    return "" if x is None or (isinstance(x, float) and not math.isfinite(x)) else f"{x:g}"


def unit_row(u: Unit, st: GroupState, outcome, within: dict | None, probes: pd.DataFrame | None,
             N: int | None, cost: tuple[float, float] | None) -> dict:
    """One row of table2_crossings.csv."""
    row = {"stage": u.stage, "model": u.group.model, "task": u.group.task, "ablation": u.group.ablation,
           "score_fn": u.curve, "n_population": N, "dtype": st.dtype, "resolution_pct": 100 * st.search.resolution,
           "range_pct": 100 * st.cfg.fractions[-1], "alpha": st.search.alpha, "margin_pts": 100 * st.search.margin}
    if outcome is None:
        n = len(st.doc_ids())
        scored = st.pass_progress()
        return {**row, "n_population": n, "status": "not started",
                "reason": "not run yet (thresholds stored)" if (st.folder / "thresholds").is_dir()
                else f"not run yet (scoring pass: {scored} stored)" if scored else "not run yet",
                "grid7_items": GRID7 * n * (len(st.cfg.random_seeds) if u.curve in RANDOM_CURVES else 1)}
    grid = st.replayed().grid
    levels = st.curves[u.curve].levels
    status = outcome.status
    if status == CONSTANT:  # no crossing exists; what its one probe zeroed and cost stays
        one, (items, seconds) = outcome.probes[0], cost
        tied = st.tied_threshold(u.curve)
        return {**row, "n_population": N, "status": CONSTANT, "constant": True,
                "reason": f"every fraction of 1-{fmt_pct(100 * grid[-1])} % is the same ablation"
                          + (f" (scores tie at {tied:g})" if tied is not None else "")
                          + f": its one probe zeroed {one.pct_zeroed:.2f} % of the units, {one.decision} after "
                            f"{one.n} items with Δ in [{100 * one.lo:+.2f}, {100 * one.hi:+.2f}] pt, so no crossing "
                            f"exists",
                "outside_pct_zeroed": one.pct_zeroed, "outside_delta_lo_pts": 100 * one.lo,
                "outside_delta_hi_pts": 100 * one.hi, "n_probes": 1, "probes": within["probes"],
                "item_reads": within["item_evaluations"], "eval_items": round(items),
                "eval_seconds": round(seconds, 3), "eval_hours": round(seconds / 3600, 6)}
    row["constant"] = st.curves[u.curve].constant  # one ablation over the range: one probe, no crossing
    if status == PENDING and len(outcome.probes) == 1 and outcome.probes[0].n == 0:
        return {**row, "n_population": N, "status": "not started", "reason": "not run yet (thresholds stored)"
                + ("; every fraction is one ablation: one probe" if row["constant"] else "")}
    lo, hi = outcome.bracket
    by_index = {p.index: p for p in outcome.probes}
    at, nxt = by_index.get(lo), by_index.get(hi)
    last = outcome.probes[-1] if outcome.probes else None
    reason = {"resolved": "",
              "lower bound": f"within {100 * st.search.margin:g} pt up to the range's end ({100 * grid[-1]:g} %)",
              "unresolved": (f"probe at {100 * grid[last.index]:g} % undecided after {last.n} items" if last else ""),
              PENDING: (f"running: probe at {100 * grid[last.index]:g} % read {last.n} of {N} items, Δ in "
                        f"[{100 * last.lo:+.2f}, {100 * last.hi:+.2f}] pt" if last else "running")}[status]
    items, seconds = cost
    grid_items = GRID7 * N * levels
    per_item = seconds / items if items else math.nan
    return {**row, "status": status, "reason": reason,
            "crossing_pct": within["crossing_pct"] if status in DECIDED else math.nan,
            "bracket_low_pct": 100 * grid[lo], "bracket_high_pct": math.inf if hi >= len(grid) else 100 * grid[hi],
            "within_delta_lo_pts": 100 * at.lo if at else (0.0 if lo == 0 else math.nan),
            "within_delta_hi_pts": 100 * at.hi if at else (0.0 if lo == 0 else math.nan),
            "within_pct_zeroed": at.pct_zeroed if at else (0.0 if lo == 0 else math.nan),
            "outside_delta_lo_pts": 100 * nxt.lo if nxt else math.nan,
            "outside_delta_hi_pts": 100 * nxt.hi if nxt else math.nan,
            "outside_pct_zeroed": nxt.pct_zeroed if nxt else math.nan,
            "n_probes": len(outcome.probes), "probes": within["probes"],
            "item_reads": within["item_evaluations"], "eval_items": round(items),
            "eval_seconds": round(seconds, 3), "eval_hours": round(seconds / 3600, 6),
            "grid7_items": grid_items, "grid7_est_hours": round(grid_items * per_item / 3600, 6)
            if math.isfinite(per_item) else math.nan,
            "monotone_violation": within["monotone_violation"]}


def tabulate(args, units: list[Unit], states: dict[Group, GroupState]):
    """(crossings, probes, groups) frames of every unit of the work list."""
    rows, probe_rows, group_rows = [], [], []
    outcomes: dict[Group, dict] = {}
    for g in dict.fromkeys(u.group for u in units):
        st = states[g]
        run = st.replayed()
        if run is None:
            scored = st.pass_progress()
            group_rows.append({"group": g.name, "model": g.model, "task": g.task, "ablation": g.ablation,
                               "status": f"scoring pass: {scored} stored" if scored else "not started",
                               "scoring_pass_left": round(st.pass_left(), 6),
                               "scoring_shard_hours": round(st.shard_hours(), 4)})
            continue
        mine = [u for u in units if u.group == g]
        curves = [st.curves[u.curve] for u in mine]
        got = [search_curve(run, c, pending=True) for c in curves]
        within, probes = search_tables(curves, got, run.grid, st.search, len(run.plan.doc_ids))
        outcomes[g] = {}
        N = len(run.plan.doc_ids)
        for u, c, o, w in zip(mine, curves, got, within.to_dict("records")):
            outcomes[g][u.curve] = (o, unit_row(u, st, o, w, None, N, curve_cost(c, o, run.items)))
        probes = probes[~((probes["decision"] == PENDING) & (probes["n_items"] == 0))] if len(probes) else probes
        if len(probes):  # (a curve's next probe with no question read yet is no probe to show)
            probes = probes.assign(model=g.model, task=g.task, ablation=g.ablation,
                                   pct=probes["pct"].round(9))
            probe_rows.append(probes)
        base_items, base_seconds = run.items.cost("none")
        known = run.items._load(run.plan.point_key("none"))
        passes = pd.read_csv(st.passes_path) if st.passes_path.is_file() else None
        group_rows.append({
            "group": g.name, "model": g.model, "task": g.task, "ablation": g.ablation, "status": "started",
            "dtype": st.dtype, "n_population": N, "unablated_items_known": len(known),
            "unablated_accuracy_on_known": float(np.mean([q.correct for q in known.values()])) if known else math.nan,
            "pair_unablated_eval_hours": round(base_seconds / 3600, 6),
            "pair_scoring_pass_hours": round(pass_seconds(passes) / 3600, 4) if passes is not None
            else math.nan, "scoring_pass_left": 0.0})
    for u in units:
        st = states[u.group]
        if u.group in outcomes and u.curve in outcomes[u.group]:
            rows.append(outcomes[u.group][u.curve][1])
        else:
            rows.append(unit_row(u, st, None, None, None, None, None))
    crossings = pd.DataFrame(rows)
    if "constant" in crossings:  # the newest column last
        crossings = crossings[[c for c in crossings.columns if c != "constant"] + ["constant"]]
    for c in ("crossing_pct", "bracket_low_pct", "bracket_high_pct", "resolution_pct", "range_pct", "margin_pts"):
        if c in crossings:
            crossings[c] = crossings[c].round(9)  # 100 x 0.07 is 7.000000000000001
    for c in ("n_population", "n_probes", "item_reads", "eval_items", "grid7_items"):
        if c in crossings:
            crossings[c] = crossings[c].astype("Int64")
    probes = (pd.concat(probe_rows, ignore_index=True) if probe_rows else
              pd.DataFrame(columns=["model", "task", "ablation", "score_fn", "step", "pct", "decision"]))
    front = ["model", "task", "ablation"]
    probes = probes[front + [c for c in probes.columns if c not in front]]
    groups = pd.DataFrame(group_rows)
    for c in ("n_population", "unablated_items_known"):
        if c in groups:
            groups[c] = groups[c].astype("Int64")
    sums = {"curves_eval_hours": "eval_hours", "curves_eval_items": "eval_items", "grid7_items": "grid7_items",
            "grid7_est_hours": "grid7_est_hours"}
    sums = {k: (v, "sum") for k, v in sums.items() if v in crossings}
    if len(crossings) and sums:
        per_group = crossings.groupby(["model", "task", "ablation"], sort=False).agg(**sums).reset_index()
        for c in ("curves_eval_items", "grid7_items"):
            if c in per_group:
                per_group[c] = per_group[c].astype("Int64")
        groups = groups.merge(per_group, on=["model", "task", "ablation"], how="left")
    return crossings, probes, groups


def dtype_crossings(args, out: Path, units: list[Unit], cross: pd.DataFrame) -> tuple[pd.DataFrame, pd.DataFrame | None]:
    """Every curve searched in both dtypes, side by side (table2_dtype_crossings.csv): the
    campaign's row and the row of the same search in the other dtype, replayed from that dtype's
    store beside the campaign's (``store_folder``; no model). ``same_crossing`` where both are
    decided; the hours are each search's own evaluation time, so their ratio is the measured
    price of the campaign's dtype. Also the other dtype's probes (None without its stores), for
    the figures."""
    other = OTHER_DTYPE
    theirs = {g: st for g, st in group_states(args, out, units, other).items() if st.folder.is_dir()}
    mine = [u for u in units if u.group in theirs]
    keys = ["model", "task", "ablation", "score_fn"]
    cols = ["status", "crossing_pct", "bracket_low_pct", "bracket_high_pct", "eval_items", "eval_hours"]
    out_cols = keys + [f"{c}_{d}" for d in (CAMPAIGN_DTYPE, other) for c in cols] + ["same_crossing", "hours_ratio"]
    if not mine:
        return pd.DataFrame(columns=out_cols), None
    them, their_probes, _ = tabulate(args, mine, theirs)
    them = them[them.status.isin(DECIDED)]
    # every column on both sides (a table with no curve started has no crossing columns), so each
    # side's values come out under its own suffix
    both = cross.reindex(columns=keys + cols).merge(them.reindex(columns=keys + cols), on=keys, how="inner",
                                                    suffixes=(f"_{CAMPAIGN_DTYPE}", f"_{other}"))
    decided = both[f"status_{CAMPAIGN_DTYPE}"].isin(DECIDED)
    same = (both[f"bracket_low_pct_{CAMPAIGN_DTYPE}"] == both[f"bracket_low_pct_{other}"]) & (
        both[f"bracket_high_pct_{CAMPAIGN_DTYPE}"] == both[f"bracket_high_pct_{other}"])
    both["same_crossing"] = pd.Series(same, dtype="boolean").where(decided, pd.NA)
    ratio = both[f"eval_hours_{CAMPAIGN_DTYPE}"] / both[f"eval_hours_{other}"]
    both["hours_ratio"] = ratio.where(decided).round(3)
    return both[out_cols], their_probes


# -----------------------------------------------------------------------------
# The paper beside ours, judged from our intervals


def _decided(r) -> bool:
    return r is not None and r["status"] in DECIDED


def _bracket(r) -> str:
    """``[c, c')``: within at c, beyond at c' (inf: within up to the range's end)."""
    hi = float(r["bracket_high_pct"])
    return f"[{fmt_pct(float(r['bracket_low_pct']))}, {'inf' if math.isinf(hi) else fmt_pct(hi)})"


def paper_comparison(cross: pd.DataFrame, args) -> pd.DataFrame:
    """The paper's Qwen2.5-0.5B MMLU row beside our Qwen2.5-Coder-0.5B / MMLU rows."""
    qwen = args.model_names[2]
    rows = []
    sel = cross[(cross.model == qwen) & (cross.task == "mmlu") & (cross.ablation == ZERO)].set_index("score_fn")
    for fn, paper in (("awft", PAPER_ROW["awft"]), ("ahon_ln", PAPER_ROW["ahon_ln"]),
                      ("lthon_ln", PAPER_ROW["lthon_ln"]), ("random", f"{PAPER_RANDOM[0]}-{PAPER_RANDOM[1]}")):
        r = sel.loc[fn] if fn in sel.index else None
        row = {"quantity": f"{fn}: % of heads within 1 pt", "paper": paper, "paper_model": PAPER_ROW["model"],
               "our_model": qwen, "task": "mmlu"}
        if not _decided(r):
            rows.append({**row, "ours": "", "verdict": "not resolved at this size: " + (
                "not run yet" if r is None or r["status"] == "not started" else f"{r['status']}, {r['reason']}")})
            continue
        lo, hi = float(r["bracket_low_pct"]), float(r["bracket_high_pct"])
        p_lo, p_hi = (PAPER_RANDOM if fn == "random" else (float(paper), float(paper)))
        if hi <= p_lo:
            verdict = f"disagrees: ours below the paper's (our crossing in {_bracket(r)} %)"
        elif lo > p_hi:
            verdict = f"disagrees: ours above the paper's (our crossing in {_bracket(r)} %)"
        else:
            verdict = f"agrees: the paper's value lies in our bracket {_bracket(r)} %"
        rows.append({**row, "ours": r["crossing_pct"], "ours_bracket_low": lo, "ours_bracket_high": hi,
                     "verdict": verdict})
    return pd.DataFrame(rows)


def paper_claims(cross: pd.DataFrame) -> pd.DataFrame:
    """Each claim of the paper, per pair and over the pairs, judged from our brackets: the crossing
    c on a 1 % grid means Δ(c) ≥ -1 pt and Δ(c + 1 %) < -1 pt, each with probability ≥ 1 - α."""
    rows = []
    zero = cross[cross.ablation == ZERO]
    pairs = list(dict.fromkeys(zip(zero.model, zero.task)))
    best_lo, best_hi, pending_pairs = [], [], []
    for m, t in pairs:
        g = zero[(zero.model == m) & (zero.task == t) & (zero.status != CONSTANT)].set_index("score_fn")  # no crossing
        dec = {fn: r for fn, r in g.iterrows() if _decided(r)}
        open_ = [fn for fn, r in g.iterrows() if not _decided(r)]
        # (1) output-norm scores beat AWFT
        norm = {fn: dec[fn] for fn in OUTPUT_NORM if fn in dec}
        row = {"claim": "output-norm scores keep more heads within 1 pt than AWFT", "model": m, "task": t}
        if "awft" not in dec or not norm:
            rows.append({**row, "verdict": "not resolved at this size",
                         "reason": "AWFT or every output-norm curve not decided yet"})
        else:
            a = dec["awft"]
            best = max(norm, key=lambda fn: (float(norm[fn]["bracket_low_pct"]), fn))
            b = norm[best]
            if float(b["bracket_low_pct"]) >= float(a["bracket_high_pct"]):
                verdict, why = "confirmed", f"{best} {_bracket(b)} % lies above AWFT {_bracket(a)} %"
            elif all(float(n["bracket_high_pct"]) <= float(a["bracket_low_pct"]) for n in norm.values()) and \
                    len(norm) == len([fn for fn in OUTPUT_NORM if fn in g.index]):
                verdict, why = "refuted", f"every output-norm curve lies below AWFT {_bracket(a)} %"
            else:
                below = all(float(n["bracket_high_pct"]) <= float(a["bracket_low_pct"]) for n in norm.values())
                waiting = [fn for fn in OUTPUT_NORM if fn in g.index and fn not in norm]
                verdict, why = "not resolved at this size", (
                    f"AWFT {_bracket(a)} %, best output-norm {best} {_bracket(b)} %: " + (
                        f"every decided output-norm curve lies below AWFT; not decided yet: {', '.join(waiting)}"
                        if below and waiting else "the brackets touch or cross"))
            rows.append({**row, "verdict": verdict, "reason": why})
        # (2) random heads only 0.5-1.9 %
        row = {"claim": f"random heads stay within 1 pt only up to {PAPER_RANDOM[0]}-{PAPER_RANDOM[1]} %",
               "model": m, "task": t}
        if "random" not in dec:
            rows.append({**row, "verdict": "not resolved at this size", "reason": "random heads not decided yet"})
        else:
            r = dec["random"]
            lo, hi = float(r["bracket_low_pct"]), float(r["bracket_high_pct"])
            if lo > PAPER_RANDOM[1]:
                verdict = "refuted"
            elif hi <= PAPER_RANDOM[0]:
                verdict = "refuted"
            elif hi <= math.ceil(PAPER_RANDOM[1]):
                verdict = "confirmed"
            else:
                verdict = "not resolved at this size"
            rows.append({**row, "verdict": verdict, "reason": f"our random-heads crossing lies in {_bracket(r)} %"})
        # (3) the best non-AWFT function, per pair (averaged below)
        non_awft = {fn: r for fn, r in dec.items() if fn not in ("awft", "random") and not fn.startswith("static:")}
        undecided = [fn for fn in open_ if fn not in ("awft", "random") and not fn.startswith("static:")]
        if non_awft and not undecided:
            best = max(non_awft, key=lambda fn: (float(non_awft[fn]["bracket_low_pct"]), fn))
            hi_all = max(float(r["bracket_high_pct"]) for r in non_awft.values())
            best_lo.append(float(non_awft[best]["bracket_low_pct"]))
            best_hi.append(hi_all)
        else:
            pending_pairs.append(f"{m}/{t}")
    row = {"claim": f"more than 12 % of heads within 1 pt on average for the best non-AWFT score "
                    f"(paper: {PAPER_AVERAGES['best_non_awft']} % vs AWFT {PAPER_AVERAGES['awft']} %)",
           "model": "mean over pairs", "task": ""}
    if pending_pairs or not best_lo:
        rows.append({**row, "verdict": "not resolved at this size",
                     "reason": "functions not all decided on " + (", ".join(pending_pairs) or "any pair")})
    else:
        lo, hi = float(np.mean(best_lo)), float(np.mean(best_hi))
        verdict = "confirmed" if lo > 12 else "refuted" if hi <= 12 else "not resolved at this size"
        rows.append({**row, "verdict": verdict,
                     "reason": f"mean over {len(best_lo)} pairs of the best non-AWFT crossing in "
                               f"[{lo:.2f}, {hi:.2f}) %"})
    return pd.DataFrame(rows, columns=["claim", "model", "task", "verdict", "reason"])


# -----------------------------------------------------------------------------
# Figures and the summary


def write_figures(out: Path, probes: pd.DataFrame, cross: pd.DataFrame, args,
                  other: pd.DataFrame | None = None) -> list[str]:
    """A figure per group with probes: the campaign's, and ``other`` (the other dtype's search of
    the same curves, from ``dtype_crossings``) beside them; then the overviews (``write_overviews``)."""
    from lens_heads.viz.figures import crossing_probes

    keys = ["model", "task", "ablation"]
    groups = pd.concat([probes[keys], other[keys]] if other is not None and len(other) else [probes[keys]])
    names = []
    for m, t, a in dict.fromkeys(map(tuple, groups.itertuples(index=False))):
        got = probes[(probes.model == m) & (probes.task == t) & (probes.ablation == a)]
        theirs = None if other is None else other[(other.model == m) & (other.task == t) & (other.ablation == a)]
        if not len(got) and theirs is not None:
            got = theirs.iloc[0:0]  # none of the campaign's yet (an empty probes table has few columns)
        within = cross[(cross.model == m) & (cross.task == t) & (cross.ablation == a)].rename(
            columns={"status": "crossing_status"})
        fig = crossing_probes(got, within, theirs if theirs is not None and len(theirs) else None, OTHER_DTYPE)
        fig.suptitle(f"{m} / {t} / {a} ({CAMPAIGN_DTYPE}): probes (interval on Δ when decided) and the crossing"
                     + (f"; hollow: the {OTHER_DTYPE} search" if theirs is not None and len(theirs) else ""))
        name = f"figures/table2_{m}__{t}__{a}.png"
        with atomic_path(out / name, make_parents=True) as tmp:
            fig.savefig(tmp, format="png", dpi=100, metadata={"Software": None})
        names.append(name)
    return names + write_overviews(out, cross, args)


def write_overviews(out: Path, cross: pd.DataFrame, args) -> list[str]:
    """Table 2 as a figure, one per ablation begun (zero always): every pair's crossings side by
    side, the paper's Qwen2.5-0.5B / MMLU values marked on our Qwen / MMLU panel."""
    from lens_heads.viz.figures import crossing_overview

    names = []
    for a in dict.fromkeys(cross["ablation"]):
        rows = cross[cross.ablation == a]
        if a != ZERO and (rows.status == "not started").all():
            continue
        paper = pd.DataFrame([{"model": args.model_names[2], "task": "mmlu", "score_fn": fn, "pct": PAPER_ROW[fn]}
                              for fn in ("awft", "ahon_ln", "lthon_ln")]) if a == ZERO else None
        fig = crossing_overview(rows, by=["model", "task"], reference=paper,
                                reference_label=f"paper: {PAPER_ROW['model']} / MMLU")
        band = ((rows.score_fn == "random") & (rows.status == "resolved")).any()
        fig.suptitle(f"Within {fmt_pct(args.margin)} pt: each curve's crossing bracket ({a} ablation, {CAMPAIGN_DTYPE}, "
                     f"{fmt_pct(args.resolution)} % grid, alpha {args.alpha:g} per curve)"
                     + ("; grey band: random heads' bracket" if band else ""))
        name = f"figures/table2_overview__{a}.png"
        with atomic_path(out / name, make_parents=True) as tmp:
            fig.savefig(tmp, format="png", dpi=100, metadata={"Software": None})
        names.append(name)
    return names


def dtype_text(out: Path, dtypes: pd.DataFrame) -> list[str]:
    """The summary's dtype section: the curves searched in both dtypes (``dtype_crossings``) and
    the probe-by-probe check (table2_dtype_check.csv) when there is one."""
    dtype, other = CAMPAIGN_DTYPE, OTHER_DTYPE
    lines = ["## bf16 vs fp32", "", f"The campaign's curves are searched in {dtype}."]
    both = dtypes[dtypes["same_crossing"].notna()] if len(dtypes) else dtypes
    if len(both):
        same = both[both["same_crossing"].astype(bool)]
        ratio = both["hours_ratio"].dropna()
        lines[-1] += (f" {len(both)} {'curve is' if len(both) == 1 else 'curves are'} decided in both {dtype} and {other} on the same questions "
                      f"(table2_dtype_crossings.csv): {len(same)} have the same bracket"
                      + (f"; {dtype} took {ratio.median():.2f}x the evaluation hours of {other} (median over "
                         f"them, {ratio.min():.2f}-{ratio.max():.2f}x)." if len(ratio) else "."))
        lines.append("")
        for _, r in both[~both["same_crossing"].astype(bool)].iterrows():
            lines.append(f"- {r.score_fn} ({r.model}/{r.task}/{r.ablation}) crosses in {dtype} "
                         f"{_bracket(_dtype_row(r, dtype))} %, in {other} {_bracket(_dtype_row(r, other))} %")
    only = dtypes[dtypes["same_crossing"].isna()] if len(dtypes) else dtypes
    if len(only):
        lines += ["", f"{len(only)} {'curve is' if len(only) == 1 else 'curves are'} decided in {other} and not "
                      f"yet in {dtype}: " + ", ".join(f"{r.score_fn} ({r.model}/{r.task}/{r.ablation}) "
                                                      f"{_bracket(_dtype_row(r, other))} %"
                                                      for _, r in only.iterrows()) + "."]
    lines.append("")
    path = out / "table2_dtype_check.csv"
    if not path.is_file():
        return lines + ["Probe by probe: not checked (`--check-dtype`, analyses/results/README.md).", ""]
    d = pd.read_csv(path)
    same = int(d["same_decision"].sum())
    decided = d[(d["decision"] != "unresolved") | (d["decision_float32"] != "unresolved")]
    full = d[d["n_items"] >= d["campaign_probe_items"]]
    lines += [f"Probe by probe (`--check-dtype`, a {d['dtype'].iloc[0]} search's probes again in float32): "
             f"{same} of {len(d)} probes reach the same decision in both dtypes on the same questions "
             f"(at most {int(d['n_items'].max())} a probe; table2_dtype_check.csv); {len(decided)} of them are decided "
             f"in either dtype at that size, the rest unresolved in both. The unablated answers agree on "
             f"{100 * d['unablated_correct_agreement'].mean():.1f} % of the questions, the ablated on "
             f"{100 * d['ablated_correct_agreement'].mean():.1f} % (at least "
             f"{100 * d['ablated_correct_agreement'].min():.1f} % a probe). {len(full)} of the {len(d)} probes were "
             f"checked on as many questions as the bfloat16 search read for them"
             + ("." if len(full) == len(d) else
                " (--check-dtype-items caps the rest): where the cap is below the search's count, the check "
                "shows the answers agree, not that the search's decision is the one float32 would reach.")]
    differ = d[~d["same_decision"].astype(bool)]
    for r in differ.itertuples():
        lines.append(f"- differs: {r.model}/{r.task} {r.score_fn} at {r.pct:g} % on {r.n_items} questions: "
                     f"{r.dtype} {r.decision} [{r.delta_lo_pts:+.2f}, {r.delta_hi_pts:+.2f}] pt, float32 "
                     f"{r.decision_float32} [{r.delta_lo_pts_float32:+.2f}, {r.delta_hi_pts_float32:+.2f}] pt")
    return lines + [""]


def _dtype_row(r: pd.Series, dtype: str) -> pd.Series:
    """One dtype's side of a table2_dtype_crossings.csv row, under the crossings table's names."""
    return pd.Series({c: r[f"{c}_{dtype}"] for c in ("bracket_low_pct", "bracket_high_pct")})


def remaining(cross: pd.DataFrame, groups: pd.DataFrame) -> tuple[pd.DataFrame, dict]:
    """An estimate of the compute each group still needs: (a row per stage of the work list, with
    the hours through it, ``basis``).

    Items: a row not decided yet needs the median items a decided row of its kind needed (random
    heads apart: three seeds a probe; a ``constant`` curve one probe: the median of those decided,
    else a curve's over the most probes a bisection takes), as a multiple of its population, less
    what it has read.
    Seconds per item: the group's own (its evaluations' stored timings), else its pair's other
    group's, else SmolLM2/PIQA's zero-ablation rate times ``RATE_VS_SMOLLM2_PIQA``. A pair whose
    scoring pass is not whole adds its missing shards, once per pair: at the mean cost of its shards
    stored so far (``scoring_shard_hours``; the longest prefixes run first, so an upper bound), else
    at one census probe's cost."""
    decided = cross[cross.status.isin(DECIDED) & (cross["eval_items"].fillna(0) > 0)] \
        if "eval_items" in cross else cross.iloc[0:0]
    is_random = decided.score_fn.isin(RANDOM_CURVES)

    def factor(rows: pd.DataFrame) -> float:
        return float(np.median(rows["eval_items"].astype(float) / rows["n_population"].astype(float))) \
            if len(rows) else math.nan

    f_curve, f_random = factor(decided[~is_random]), factor(decided[is_random])
    ones = cross[(cross.status == CONSTANT) & (cross["eval_items"].fillna(0) > 0)] if "eval_items" in cross \
        else cross.iloc[0:0]
    constant = cross["constant"].eq(True) if "constant" in cross else pd.Series(False, cross.index)
    f_one = factor(ones) if len(ones) or not constant.any() else f_curve / max_probes(
        int(round(float(cross["range_pct"].max()) / float(cross["resolution_pct"].max()))) + 1)
    spent = cross.assign(_items=cross.get("eval_items", pd.Series(dtype=float)).astype(float).fillna(0.0),
                         _secs=cross.get("eval_seconds", pd.Series(dtype=float)).astype(float).fillna(0.0))
    by_group = spent.groupby(["model", "task", "ablation"], sort=False)[["_items", "_secs"]].sum()
    by_pair = spent.groupby(["model", "task"], sort=False)[["_items", "_secs"]].sum()

    def rate(model: str, task: str, ablation: str) -> tuple[float, str]:
        g = by_group.loc[(model, task, ablation)]
        if g["_items"] > 0:
            return float(g["_secs"] / g["_items"]), "measured"
        p = by_pair.loc[(model, task)]
        if p["_items"] > 0:
            return float(p["_secs"] / p["_items"]), "the pair's other group"
        ref = ("smollm2-135m", "piqa", ZERO)
        ratio = RATE_VS_SMOLLM2_PIQA.get((model, task))
        if ref not in by_group.index or not by_group.loc[ref, "_items"] or ratio is None:
            return math.nan, "no rate measured"
        return float(by_group.loc[ref, "_secs"] / by_group.loc[ref, "_items"] * ratio), f"SmolLM2/PIQA's x {ratio:g}"

    pass_left = dict(zip(groups["group"], groups["scoring_pass_left"])) if len(groups) else {}
    shard_hours = dict(zip(groups["group"], groups["scoring_shard_hours"])) \
        if len(groups) and "scoring_shard_hours" in groups else {}
    rows, passes_counted = [], set()
    for (stage, m, t, a), g in spent.groupby(["stage", "model", "task", "ablation"], sort=True):  # the work order
        left = g[~g.status.isin((*DECIDED, CONSTANT))]  # a constant row has nothing left to search
        f = np.where(constant[left.index], f_one, np.where(left.score_fn.isin(RANDOM_CURVES), f_random, f_curve))
        items = float(np.clip(f * left["n_population"].astype(float) - left["_items"], 0, None).sum()) \
            if len(left) else 0.0
        sec, basis = rate(m, t, a)
        name = f"{m}__{t}__{a}"
        N = float(g["n_population"].astype(float).max())
        share = 0.0 if (m, t) in passes_counted else float(pass_left.get(name, 1.0))
        passes_counted.add((m, t))  # a pair's two groups share one pass
        per_shard = float(shard_hours.get(name, math.nan))
        if share and math.isfinite(per_shard):  # the shards measured so far, for the ones left
            pass_hours, pass_basis = share * SCORE_SHARDS.get(t, 1) * per_shard, "its measured shards"
        else:  # one census probe
            pass_hours = N * share * sec / 3600 if math.isfinite(sec) else math.nan
            pass_basis = "one census probe" if share else ""
        rows.append({"stage": stage, "group": name, "rows_left": len(left), "est_items": round(items),
                     "seconds_per_item": round(sec, 4) if math.isfinite(sec) else math.nan, "rate_basis": basis,
                     "est_eval_hours": round(items * sec / 3600, 2) if math.isfinite(sec) else math.nan,
                     "est_pass_hours": round(pass_hours, 2) if math.isfinite(pass_hours) else math.nan,
                     "pass_basis": pass_basis})
    out = pd.DataFrame(rows)
    if len(out):
        out["est_hours"] = (out["est_eval_hours"] + out["est_pass_hours"]).round(2)
        out["through_here_hours"] = out["est_hours"].cumsum().round(2)  # this stage and every one before it
    return out, {"items_per_population": f_curve, "items_per_population_random": f_random}


def coarse_steps_text(done: pd.DataFrame, resolution_pct: float) -> list[str]:
    """The decided rows whose first point beyond the crossing zeroed more than a grid step past its
    target: tied scores (a grouped-query head's value score repeats over the query heads sharing
    its key/value head, docs/methods.md §3) move in blocks, so the bracket is coarser than it reads."""
    if "outside_pct_zeroed" not in done.columns:
        return []
    high = done["bracket_high_pct"].astype(float)
    step = done["resolution_pct"].astype(float) if "resolution_pct" in done.columns else resolution_pct
    coarse = done[np.isfinite(high) & (done["outside_pct_zeroed"].astype(float) > high + step)]
    if not len(coarse):
        return []
    lines = ["## Where a step zeroes more than it names", "",
             "The bracket is in target fractions; the probe beyond it zeroed this share of the (question, layer, "
             "head) units instead, because the function's scores tie in blocks (docs/methods.md §3). The crossing "
             "then says no ablation the function can make up to that share stays within the margin.", ""]
    for r in coarse.itertuples():
        lines.append(f"- {r.model}/{r.task}/{r.ablation} {r.score_fn}: the probe at {r.bracket_high_pct:g} % zeroed "
                     f"{r.outside_pct_zeroed:.2f} % (Δ {r.outside_delta_hi_pts:+.2f} pt at its upper end)")
    return lines + [""]


def summary_text(cross: pd.DataFrame, groups: pd.DataFrame, claims: pd.DataFrame, comparison: pd.DataFrame,
                 dtypes: pd.DataFrame, figures: list[str], args, left: tuple[pd.DataFrame, dict] | None = None) -> str:
    done = cross[cross.status.isin(DECIDED)]
    cross = cross.astype(object).where(cross.notna(), None)  # blank cells, not <NA>
    groups = groups.astype(object).where(groups.notna(), None)
    lines = ["# Table 2 at paper resolution: adaptive crossings on the full benchmarks", "",
             "_Written by `analyses/table2.py` from the stores and ledgers under `table2/store/`; do not edit by "
             "hand. The 200-question tables beside it (table2.csv, paper_comparison.csv, ...) are the earlier, "
             "fixed-grid rows._", "",
             f"Per curve: the largest fraction of heads ({fmt_pct(args.resolution)} % grid, 0-{fmt_pct(100 * args.range)} %) "
             f"whose ablation "
             f"keeps accuracy within {fmt_pct(args.margin)} point of the unablated model over the whole benchmark, "
             f"found by bisection with every probe decided by a confidence sequence for sampling without "
             f"replacement (alpha {args.alpha:g} per curve; docs/methods.md §12-13). A bracket [c, c') reads: "
             f"within at c, beyond at c' (inf: within up to the range's end, a lower bound).", "",
             f"**Progress**: {len(done)} of {len(cross)} rows decided; "
             f"{int((cross.status == PENDING).sum())} running; {int((cross.status == 'not started').sum())} not "
             f"started; {int((cross.status == 'unresolved').sum())} unresolved"
             + (f"; {int((cross.status == CONSTANT).sum())} with constant scores (no crossing exists: every "
                f"fraction of the range is the same ablation)" if (cross.status == CONSTANT).any() else "")
             + ".", "",
             "## The paper's claims", ""]
    for r in claims.itertuples():
        lines.append(f"- **{r.verdict}** — {r.claim} ({r.model}{'/' + r.task if r.task else ''}): {r.reason}")
    lines += ["", "## The paper's Qwen2.5-0.5B MMLU row beside Qwen2.5-Coder-0.5B / MMLU", "",
              markdown_table(comparison, 2, [c for c in ("quantity", "paper", "ours", "verdict")
                                             if c in comparison.columns]) if len(comparison) else "(nothing yet)", ""]
    cols = ["stage", "model", "task", "ablation", "score_fn", "status", "crossing_pct", "bracket_low_pct",
            "bracket_high_pct", "within_delta_lo_pts", "within_delta_hi_pts", "n_probes", "item_reads", "eval_items",
            "eval_hours", "grid7_items", "grid7_est_hours", "reason"]
    lines += ["## Every row", "", markdown_table(cross, 3, [c for c in cols if c in cross.columns]), ""]
    lines += coarse_steps_text(done, args.resolution)
    if "grid7_items" in groups.columns:
        gcols = [c for c in ("group", "status", "dtype", "n_population", "unablated_items_known",
                             "unablated_accuracy_on_known", "pair_unablated_eval_hours", "pair_scoring_pass_hours",
                             "curves_eval_items", "curves_eval_hours", "grid7_items", "grid7_est_hours")
                 if c in groups.columns]
        lines += ["## Cost per group", "", "Hours are the evaluation's own timings stored with each batch: "
                  "compute hours, the evaluating process's CPU time on a CPU (wall clock in batches stored before "
                  "CPU time was recorded; table2_runs.csv says which machine ran them); a pair's two groups "
                  "share one unablated point and one scoring pass (the pair_ columns); grid7 is the fixed "
                  "7-point grid (0-30 % in 5s) on the same population, at the row's measured seconds per item.", "",
                  markdown_table(groups, 3, gcols), ""]
    if left is not None and len(left[0]):
        est, basis = left
        through = est.loc[est["stage"] <= RESOLVING_STAGES, "est_hours"].sum()
        lines += ["## What remains (an estimate)", "",
                  f"A row not decided yet is taken to need the median items a decided row needed: "
                  f"{basis['items_per_population']:.2f} x its population (random heads, three seeds a probe: "
                  f"{basis['items_per_population_random']:.2f} x), less what it has read; at the group's measured "
                  f"seconds per item, else its pair's, else SmolLM2/PIQA's scaled by the ratio "
                  f"benchmarks/bench_campaign_rates.py measured (one torch thread). A scoring pass not yet whole "
                  f"adds its missing shards at the mean cost of those it has stored (the longest prefixes run "
                  f"first), else its missing share at one census probe's cost. Hours are one campaign process's, on one "
                  f"core: **{through:.0f} h** through stage {RESOLVING_STAGES} (what resolves issue 55: PIQA for "
                  f"the three models, Qwen/MMLU's first four curves), **{est['est_hours'].sum():.0f} h** for "
                  f"every row (table2_remaining.csv).",
                  "", markdown_table(est.astype(object).where(est.notna(), None), 2, list(est.columns)), ""]
    lines += dtype_text(Path(args.out), dtypes)
    if figures:
        lines += ["## Figures", ""] + [f"![{f}]({f})" for f in figures if "overview" in f] + [""] \
            + [f"- [{f}]({f})" for f in figures] + [""]
    return "\n".join(lines) + "\n"


def write_tables(out: Path, args, units: list[Unit], states: dict[Group, GroupState]) -> pd.DataFrame:
    """Every table, in the campaign's dtype (``states``, which a run in the other dtype builds
    apart from its own), from the stores and ledgers alone."""
    cross, probes, groups = tabulate(args, units, states)
    comparison, claims = paper_comparison(cross, args), paper_claims(cross)
    dtypes, other_probes = dtype_crossings(args, out, units, cross)
    write_csv(cross, out / "table2_crossings.csv")
    write_csv(dtypes, out / "table2_dtype_crossings.csv")
    write_csv(probes, out / "table2_probes.csv")
    write_csv(groups, out / "table2_groups.csv")
    left, basis = remaining(cross, groups)
    write_csv(left, out / "table2_remaining.csv")
    write_csv(comparison, out / "table2_paper_comparison.csv")
    write_csv(claims, out / "table2_paper_claims.csv")
    figures = (write_figures(out, probes, cross, args, other_probes)
               if args.figures and (len(probes) or other_probes is not None and len(other_probes)) else [])
    atomic_write_text(out / "table2_summary.md", summary_text(cross, groups, claims, comparison, dtypes, figures, args,
                                                              (left, basis)))
    return cross


# -----------------------------------------------------------------------------
# Commits: the results only


def result_paths(out: Path) -> list[Path]:
    """What a commit takes: the tables, the figures, and per group its ledger, scoring-pass log,
    thresholds and static scores (never the per-item points and parts)."""
    paths = [out / n for n in (*TABLES, "table2_dtype_check.csv", "table2_runs.csv")]
    paths += sorted((out / "figures").glob("table2_*.png"))
    for g in sorted((out / "table2" / "store").glob("*")):
        paths += [*sorted(g.glob("ledger_*.json")), g / "passes.csv"]
        for kind in ("thresholds", "static_scores"):
            paths += sorted((g / kind).glob("*.json"))
    return [p for p in paths if p.is_file()]


def commit_results(out: Path, message: str) -> bool:
    """``git add`` the named result files and commit them alone (``git commit -- paths``: whatever
    else is staged stays out). False when there is nothing new or no repository."""
    paths = result_paths(out)
    if not paths:
        return False
    top = subprocess.run(["git", "-C", str(out), "rev-parse", "--show-toplevel"], capture_output=True, text=True)
    if top.returncode != 0:
        print(f"commit skipped: {out} is not in a git repository", file=sys.stderr)
        return False
    root = Path(top.stdout.strip()).resolve()
    rel = [str(p.resolve().relative_to(root)) for p in paths]
    try:
        subprocess.run(["git", "-C", str(root), "add", "--", *rel], check=True, capture_output=True, text=True)
        diff = subprocess.run(["git", "-C", str(root), "diff", "--cached", "--quiet", "--", *rel])
        if diff.returncode == 0:
            return False
        subprocess.run(["git", "-C", str(root), "commit", "-q", "-m", message, "--", *rel], check=True,
                       capture_output=True, text=True)
    except (subprocess.CalledProcessError, OSError) as exc:  # a failed commit must not stop the campaign
        err = getattr(exc, "stderr", "") or str(exc)
        print(f"commit failed (the campaign goes on; the files stay on disk): {err.strip()}", file=sys.stderr)
        return False
    return True


# -----------------------------------------------------------------------------
# The dtype check: a bfloat16 search's probes again in float32, on the same questions


def check_dtype(args, out: Path, units: list[Unit], states: dict[Group, GroupState], deadline) -> pd.DataFrame:
    """For each decided curve of ``--check-dtype-curves`` in the bfloat16 groups run (``states``):
    every probe of the bfloat16 search again in float32 (the campaign's store and thresholds, so
    the campaign reuses what the check evaluates), on the same questions in the same order, capped
    at ``--check-dtype-items``; the bfloat16 search replayed to the same number of items; both
    decisions side by side. The ``campaign_*`` columns are the bfloat16 search's full probe. It
    saves the float32 ledger from its own view: not beside a campaign running the same pair."""
    rows = []
    path = out / "table2_dtype_check.csv"
    for g in dict.fromkeys(u.group for u in units):
        st = states[g]
        run = st.replayed()
        if run is None or st.dtype == "float32":
            continue
        wanted = [c for c in args.check_dtype_curves if c in st.curves and st.decided(c)]
        if not wanted:
            continue
        ref32 = ModelRef(args.model_specs[g.model], "float32", args.device)
        other = GroupState(g, st.cfg, st.search, store_folder(out, g, "float32"), ref32, "float32")
        model = ref32.model
        run32 = other.prepare(model, deadline, not args.no_progress)
        run32.items.deadline = deadline
        try:
            for c in wanted:
                outcome = search_curve(run, st.curves[c], pending=True)
                for p in outcome.probes:
                    cap = min(p.n, args.check_dtype_items)
                    mine = run_probe(run, st.curves[c], p.index, max_items=cap)
                    theirs = run_probe(run32, other.curves[c], p.index, max_items=cap)
                    ids = run.order[:cap]
                    agree = [float(np.mean(run.items.correct(s, ids) == run32.items.correct(t, ids)))
                             for s, t in zip(st.curves[c].specs[p.index], other.curves[c].specs[p.index])]
                    rows.append({"model": g.model, "task": g.task, "ablation": g.ablation, "score_fn": c,
                                 "pct": 100 * run.grid[p.index], "n_items": cap, "dtype": st.dtype,
                                 "decision": mine.decision, "delta_lo_pts": 100 * mine.lo,
                                 "delta_hi_pts": 100 * mine.hi, "pct_zeroed": mine.pct_zeroed,
                                 "decision_float32": theirs.decision, "delta_lo_pts_float32": 100 * theirs.lo,
                                 "delta_hi_pts_float32": 100 * theirs.hi, "pct_zeroed_float32": theirs.pct_zeroed,
                                 "same_decision": mine.decision == theirs.decision,
                                 "unablated_correct_agreement": float(np.mean(
                                     run.items.correct("none", ids) == run32.items.correct("none", ids))),
                                 "ablated_correct_agreement": float(np.mean(agree)),
                                 "campaign_decision_at_full_probe": p.decision, "campaign_probe_items": p.n})
        except SearchStopped:
            print("dtype check: stopped at the time limit; rerun --check-dtype to resume", flush=True)
            break
        finally:
            other.save_ledger()
        del model
        ref32.loaded = None
    frame = pd.DataFrame(rows)
    if len(frame):
        write_csv(frame, path)
    return frame


# -----------------------------------------------------------------------------
# main


def parse_args(argv):
    p = __import__("argparse").ArgumentParser(description=__doc__, formatter_class=__import__(
        "argparse").RawDescriptionHelpFormatter)
    p.add_argument("--out", default="analyses/results/inactive_heads", help="results folder (default %(default)s)")
    p.add_argument("--time-limit", type=float, default=None, metavar="MINUTES",
                   help="start no batch after this many minutes (default: none); rerun to resume")
    p.add_argument("--commit-every", type=float, default=None, metavar="MINUTES",
                   help="git commit the results (only OUT's result files) at most every M minutes and at the end "
                        "(default: never)")
    p.add_argument("--tabulate-only", action="store_true", help="compute nothing: rebuild the tables")
    p.add_argument("--list", action="store_true", help="print the work list with each unit's status and exit")
    p.add_argument("--only", default="", help="comma list of unit-name prefixes (MODEL/TASK/ABLATION/CURVE) to run "
                                              "and tabulate")
    p.add_argument("--dtype", default=CAMPAIGN_DTYPE,
                   help="float32 (default: the campaign's dtype, see table2_dtype_check.csv) or bfloat16 (its own "
                        "store beside the campaign's, for comparison); it is part of every store key")
    p.add_argument("--allow-emulated", action="store_true",
                   help="run bfloat16 on a CPU without native bf16 (else such a machine only rebuilds the tables)")
    p.add_argument("--device", default="cpu")
    p.add_argument("--batch-size", type=int, default=8,
                   help="rows per forward (default 8: on one CPU thread in float32, 1.05x the questions a second "
                        "of 16 on SmolLM2/PIQA and 1.14x on Gemma, benchmarks/results/bench_sweep_batch.md; "
                        "not in any store key)")
    p.add_argument("--search-batch", type=int, default=64, help="questions per sequential step (default 64)")
    p.add_argument("--range", type=float, default=0.6, help="largest fraction of heads (default 0.6)")
    p.add_argument("--resolution", type=float, default=1.0, help="%% of heads between grid points (default 1)")
    p.add_argument("--margin", type=float, default=1.0, help="accuracy points (default 1)")
    p.add_argument("--alpha", type=float, default=0.05, help="per curve (default 0.05)")
    p.add_argument("--order-seed", type=int, default=0)
    p.add_argument("--scores", default="paper", help="per-input functions of the zero-ablation groups")
    p.add_argument("--mean-scores", default="awft,ahon_ln,lthon_ln", help="functions under mean ablation")
    p.add_argument("--static", default="ahon_ln", help="static curves' dataset-level scores (zero ablation)")
    p.add_argument("--seeds", type=int, default=3, help="random-head seeds")
    p.add_argument("--limit", type=int, default=None, help="a smaller population for every task (tests)")
    p.add_argument("--models", default=",".join(MODELS),
                   help="the three models' specs, in the order SmolLM2, Gemma, Qwen (default the zoo's); "
                        "NAME=SPEC keeps the table's name for another spec")
    p.add_argument("--pass-minutes", dest="pass_minutes_text", default="",
                   help="TASK=MINUTES,...: how long a group's whole scoring pass may take (default "
                        + ", ".join(f"{k}={v:g}" for k, v in PASS_MINUTES.items())
                        + "); the pass runs in shards (" + ", ".join(f"{k}={v}" for k, v in SCORE_SHARDS.items())
                        + "), and with --time-limit a shard starts only while its share fits in the time left")
    p.add_argument("--workers", type=int, default=1,
                   help="campaign processes side by side, one pair (model/task) each, each pinned to its own CPU "
                        "core with one torch thread; this process schedules the pairs in work-list order, "
                        "rebuilds the tables and commits (default 1: this process computes)")
    p.add_argument("--worker", action="store_true", help=__import__("argparse").SUPPRESS)  # one of --workers'
    p.add_argument("--units", default="", help=__import__("argparse").SUPPRESS)  # a worker's units, exact names
    p.add_argument("--no-figures", dest="figures", action="store_false")
    p.add_argument("--no-progress", action="store_true")
    p.add_argument("--check-dtype", action="store_true",
                   help="with --dtype bfloat16, instead of the work list: every probe of --check-dtype-curves "
                        "decided in the bfloat16 groups of --only, again in float32 on the same questions "
                        "(table2_dtype_check.csv)")
    p.add_argument("--check-dtype-curves", default="ahon_ln,random")
    p.add_argument("--check-dtype-items", type=int, default=256, help="at most this many items per probe")
    args = p.parse_args(argv)
    args.device = check_device(args.device)
    from lens_heads.scores import resolve_score_ids

    args.scores = resolve_score_ids(args.scores)
    args.mean_scores = resolve_score_ids(args.mean_scores)
    args.static = resolve_score_ids(args.static) if args.static.strip() else []
    args.check_dtype_curves = split_list(args.check_dtype_curves, "curves")
    specs = split_list(args.models, "models")
    if len(specs) != 3:
        raise LensHeadsError("--models: give three specs, in the order SmolLM2, Gemma, Qwen")
    pairs = [s.split("=", 1) if "=" in s else (s, s) for s in specs]
    args.model_names = [n for n, _ in pairs]
    args.model_specs = dict(pairs)
    if len(set(args.model_names)) != 3:
        raise LensHeadsError("--models: three different names")
    args.only = [o.strip() for o in args.only.split(",") if o.strip()]
    args.pass_minutes = dict(PASS_MINUTES)
    for item in split_list(args.pass_minutes_text, "pass minutes") if args.pass_minutes_text.strip() else []:
        task, _, minutes = item.partition("=")
        try:
            args.pass_minutes[task.strip()] = float(minutes)
        except ValueError:
            raise LensHeadsError(f"--pass-minutes: write TASK=MINUTES, got {item!r}") from None
    if args.workers < 1:
        raise LensHeadsError("--workers must be >= 1")
    if args.workers > 1:
        if args.check_dtype:
            raise LensHeadsError("--workers runs the work list, not --check-dtype")
        if args.device != "cpu":
            raise LensHeadsError("--workers pins CPU cores; on a GPU run one process (--workers 1)")
        if args.workers > len(usable_cores()):
            raise LensHeadsError(f"--workers {args.workers}: only {len(usable_cores())} CPU cores are usable here")
    args.units = [n.strip() for n in args.units.split(",") if n.strip()]
    for name in ("time_limit", "commit_every"):
        v = getattr(args, name)
        if v is not None and not v > 0:
            raise LensHeadsError(f"--{name.replace('_', '-')} must be > 0 minutes")
    if args.check_dtype and args.dtype == "float32":
        raise LensHeadsError("--check-dtype runs a bfloat16 search's probes again in float32: add --dtype bfloat16")
    if args.dtype not in DTYPES:
        raise LensHeadsError("--dtype: bfloat16 or float32 (not auto: the dtype is part of every store key, and "
                             "auto would change it with the machine)")
    search_settings(args).grid(args.range)  # a range that holds a step
    return args


def main(argv=None) -> int:
    args = parse_args(argv)
    t0 = time.monotonic()
    deadline = None if args.time_limit is None else t0 + 60 * args.time_limit
    out = out_folder(args.out)
    units, todo = work_list(args, only=False), work_list(args)
    if not todo:
        raise LensHeadsError(f"--only {','.join(args.only)} matches no unit of the work list")
    refs = {m: ModelRef(args.model_specs[m], args.dtype, args.device) for m in args.model_names}
    states = group_states(args, out, units, args.dtype)

    def tables() -> dict[Group, GroupState]:
        """The states the tables are built from: the campaign dtype's, whatever this run computes
        (a run in the other dtype reads them afresh at each write: a campaign may run beside it)."""
        return states if args.dtype == CAMPAIGN_DTYPE else group_states(args, out, units, CAMPAIGN_DTYPE)
    if args.list:
        for u in todo:
            print(f"{u.stage:>2} {u.name:<55} {'decided' if states[u.group].decided(u.curve) else 'to do'}")
        return 0
    if args.dtype == "bfloat16" and not native_bf16(args.device) and not args.tabulate_only:
        if not args.allow_emulated:
            print(f"bfloat16 is emulated on this machine ({cpu_name()}), 6-25x slower than float32 per matmul: "
                  f"nothing computed (--allow-emulated runs it anyway; the campaign's dtype is {CAMPAIGN_DTYPE}). "
                  f"Tables rebuilt.", file=sys.stderr)
            args.tabulate_only = True
        else:
            print(f"warning: bfloat16 is emulated on this machine ({cpu_name()}): running anyway, slowly",
                  file=sys.stderr)
    if args.workers > 1 and not args.tabulate_only:
        return run_workers(args, sys.argv[1:] if argv is None else list(argv), out, units, todo, deadline)
    evaluated, evaluated_s, stopped, last_commit = 0, 0.0, False, time.monotonic()
    loaded: dict[str, object] = {}
    skipped: set[Group] = set()

    def load(name: str) -> None:
        """``name``'s model into ``loaded``, alone (one model in memory at a time)."""
        if name not in loaded:
            loaded.clear()
            for other in states.values():
                other.run = None
            loaded[name] = refs[name].model
            refs[name].loaded = None  # only ``loaded`` holds it
    if args.check_dtype and not args.tabulate_only:
        check_dtype(args, out, todo, states, deadline)
    elif not args.tabulate_only:
        for u in todo:
            st = states[u.group]
            if st.decided(u.curve):
                continue
            if (deadline is not None and time.monotonic() >= deadline) or (args.worker and orphaned()):
                stopped = True
                break
            if u.group in skipped:
                continue
            if st.replayed() is None:  # the thresholds first: the scoring pass, shard by shard
                shard = max(args.pass_minutes.get(u.group.task, 0.0) / SCORE_SHARDS.get(u.group.task, 1),
                            st.last_shard_minutes() or 0.0)  # a shard measured before bounds the next
                start_by = None if deadline is None else deadline - 60 * shard
                if start_by is not None and time.monotonic() >= start_by:
                    why = (f"a shard of its scoring pass may take {shard:g} min and "
                           f"{(deadline - time.monotonic()) / 60:.0f} are left")
                else:
                    load(u.group.model)
                    why = None if st.score(loaded[u.group.model], start_by) else \
                        f"its scoring pass is not whole yet (shards of ~{shard:.0f} min)"
                if why is not None:
                    print(f"[{time.strftime('%H:%M:%S')}] {u.group.name}: {why}: skipped for now", flush=True)
                    skipped.add(u.group)
                    continue
            load(u.group.model)
            print(f"[{time.strftime('%H:%M:%S')}] {u.name}", flush=True)
            run = st.prepare(loaded[u.group.model], deadline, not args.no_progress)
            run.items.deadline = deadline

            def checkpoint(st=st, u=u) -> None:
                """Within a long curve: the ledger, the tables and a commit, every --commit-every."""
                nonlocal last_commit
                if args.worker and orphaned():
                    run.items.deadline = 0.0  # the parent is gone: stop before the next batch (ledger saved)
                if args.commit_every is None or time.monotonic() - last_commit < 60 * args.commit_every:
                    return
                st.save_ledger()
                if args.worker:  # the --workers parent tabulates and commits
                    last_commit = time.monotonic()
                    return
                write_tables(out, args, units, tables())
                commit_results(out, f"table2: {u.name} running; the campaign's ledgers and tables so far")
                last_commit = time.monotonic()

            run.items.after_batch = checkpoint
            new0, s0 = run.items.new, run.items.new_seconds
            try:
                outcome = search_curve(run, st.curves[u.curve])
                print(f"  {outcome.status}: crossing index {outcome.crossing}, bracket {outcome.bracket}, "
                      f"{run.items.new - new0} items evaluated", flush=True)
            except SearchStopped:
                stopped = True
            finally:
                evaluated += run.items.new - new0
                evaluated_s += run.items.new_seconds - s0
                st.save_ledger()
            if not args.worker:  # a --workers parent tabulates and commits for its workers
                write_tables(out, args, units, tables())
                if args.commit_every is not None and time.monotonic() - last_commit >= 60 * args.commit_every:
                    commit_results(out, f"table2: {u.name} {'stopped at the time limit' if stopped else 'decided'}; "
                                        f"the campaign's ledgers and tables so far")
                    last_commit = time.monotonic()
            if stopped:
                break
    if evaluated:
        log_run(out, args, evaluated, evaluated_s, time.monotonic() - t0, stopped)
    if args.worker:
        print(("stopped at the time limit. " if stopped else "") + f"{evaluated} items evaluated", flush=True)
        return 0
    write_tables(out, args, units, tables())
    if args.commit_every is not None and not args.tabulate_only:
        commit_results(out, "table2: the campaign's ledgers and tables at the end of a run"
                       + (" (stopped at the time limit)" if stopped else ""))
    print(("stopped at the time limit; rerun to resume. " if stopped else "")
          + f"{evaluated} items evaluated in {time.monotonic() - t0:.0f} s; tables in {out}")
    return 0


# -----------------------------------------------------------------------------
# --workers: pairs side by side, one process and one core each


WORKER_DROP = {"--workers": 1, "--only": 1, "--units": 1, "--time-limit": 1, "--worker": 0}  # option -> values
WORKER_GRACE_S = 900  # past the deadline, a worker still running (a batch, a scoring shard) is stopped
PARENT_ENV = "LENS_HEADS_TABLE2_PARENT"  # a worker's parent pid: a worker whose parent is gone stops


def usable_cores() -> list[int]:
    return sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else list(range(os.cpu_count() or 1))


def worker_argv(argv: list[str], names: list[str], minutes: float | None, commit_every: float | None) -> list[str]:
    """A worker's command line: this run's options without ``WORKER_DROP``'s, then its own units
    by exact name (``--units``), the time left and ``--worker`` (it saves its ledgers every
    ``--commit-every`` but writes no tables and makes no commit: the parent does)."""
    kept, skip = [], 0
    for a in argv:
        if skip:
            skip -= 1
            continue
        name = a.split("=", 1)[0]
        if name in WORKER_DROP:
            skip = WORKER_DROP[name] if "=" not in a else 0
            continue
        kept.append(a)
    kept += ["--units", ",".join(names), "--worker"]
    if minutes is not None:
        kept += ["--time-limit", f"{minutes:.3f}"]
    if commit_every is not None and "--commit-every" not in [a.split("=", 1)[0] for a in kept]:
        kept += ["--commit-every", f"{commit_every:g}"]
    return kept


def spawn_worker(cmd: list[str], core: int) -> subprocess.Popen:
    """A worker process with one torch thread, pinned to ``core`` once started."""
    env = {**os.environ, "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1", PARENT_ENV: str(os.getpid())}
    proc = subprocess.Popen(cmd, env=env)
    if hasattr(os, "sched_setaffinity"):
        try:
            os.sched_setaffinity(proc.pid, {core})
        except OSError:  # already gone: its exit code says why
            pass
    return proc


def orphaned() -> bool:
    """A worker whose ``--workers`` parent is gone (it stops between batches, its ledger saved)."""
    parent = os.environ.get(PARENT_ENV)
    return parent is not None and str(os.getppid()) != parent


def run_workers(args, argv: list[str], out: Path, units: list[Unit], todo: list[Unit], deadline) -> int:
    """``--workers N``: the work list's stages with undecided units of ``todo``, in order, each
    searched by a worker process (this script with ``--worker``) pinned to one core with one
    torch thread; a free core takes the first stage whose pair (model, task) no worker holds, so
    no two workers share a pair's store, ledgers and scoring-pass log, and the issue's order
    holds as far as the pairs allow. A worker that ends (its stage decided, or its scoring pass
    waiting for a later run) frees its core. Every ``--commit-every`` minutes and at the end this
    process rebuilds the tables from the stores and ledgers and commits them. SIGTERM or Ctrl-C
    stop the workers too; a worker still running ``WORKER_GRACE_S`` past the deadline is stopped."""
    import signal

    states = group_states(args, out, units, args.dtype)
    stages: dict[int, list[Unit]] = {}
    for u in todo:
        if not states[u.group].decided(u.curve):
            stages.setdefault(u.stage, []).append(u)
    jobs = [((us[0].group.model, us[0].group.task), [u.name for u in us]) for us in stages.values()]
    cores = usable_cores()
    running: dict[int, tuple[subprocess.Popen, tuple[str, str]]] = {}
    failed: list[str] = []
    stopped = False
    last_commit = time.monotonic()

    def tabulate_and_commit(message: str) -> None:
        write_tables(out, args, units, group_states(args, out, units, CAMPAIGN_DTYPE))
        if args.commit_every is not None:
            commit_results(out, message)

    def on_term(signum, frame):
        raise SystemExit(143)

    previous = signal.signal(signal.SIGTERM, on_term)
    try:
        while jobs or running:
            for slot in range(args.workers):
                left = None if deadline is None else (deadline - time.monotonic()) / 60
                busy = {pair for _, pair in running.values()}
                ready = [j for j in jobs if j[0] not in busy]
                if slot in running or not ready or (left is not None and left < 0.5):
                    continue
                pair, names = ready[0]
                jobs.remove(ready[0])
                core = cores[slot]
                print(f"[{time.strftime('%H:%M:%S')}] worker {slot} on core {core}: {pair[0]}/{pair[1]}, "
                      f"{len(names)} units", flush=True)
                cmd = [sys.executable, str(Path(__file__).resolve()),
                       *worker_argv(argv, names, left, args.commit_every)]
                running[slot] = (spawn_worker(cmd, core), pair)
            if deadline is not None and time.monotonic() >= deadline:
                stopped = stopped or bool(jobs or running)
                jobs.clear()  # the workers stop themselves between batches
                if time.monotonic() >= deadline + WORKER_GRACE_S:
                    for proc, pair in running.values():
                        print(f"worker on {pair[0]}/{pair[1]} still running {WORKER_GRACE_S // 60} min past the "
                              f"time limit: stopped", file=sys.stderr)
                        proc.terminate()
            time.sleep(2.0)
            for slot, (proc, pair) in list(running.items()):
                if proc.poll() is not None:
                    del running[slot]
                    if proc.returncode != 0:
                        failed.append(f"{pair[0]}/{pair[1]} (exit {proc.returncode})")
            if args.commit_every is not None and time.monotonic() - last_commit >= 60 * args.commit_every:
                tabulate_and_commit("table2: the workers' ledgers and tables so far")
                last_commit = time.monotonic()
    finally:
        signal.signal(signal.SIGTERM, previous)
        for proc, _ in running.values():  # interrupted: the workers stop too (their stores keep every batch)
            proc.terminate()
        for proc, _ in running.values():
            try:
                proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                proc.kill()
    tabulate_and_commit("table2: the campaign's ledgers and tables at the end of a --workers run"
                        + (" (stopped at the time limit)" if stopped else ""))
    if failed:
        print(f"workers failed: {', '.join(failed)}; the others' results are in {out}", file=sys.stderr)
        return 1
    print(("stopped at the time limit; rerun to resume. " if stopped else "") + f"workers done; tables in {out}")
    return 0


def log_run(out: Path, args, items: int, eval_seconds: float, wall: float, stopped: bool) -> None:
    """One row of table2_runs.csv, appended under a claim (--workers' processes log side by side)."""
    path = out / "table2_runs.csv"
    while True:
        with claim(path) as mine:
            if mine:
                _append_run(path, args, items, eval_seconds, wall, stopped)
                return
        time.sleep(0.2)


def units_label(names: list[str]) -> str:
    """A worker's units for the run log: their common group and how many (``g/t/zero/ (4 units)``)."""
    if not names:
        return ""
    groups = sorted({n.rsplit("/", 1)[0] for n in names})
    return ",".join(f"{g}/ ({sum(n.startswith(g + '/') for n in names)} units)" for g in groups)


def _append_run(path: Path, args, items: int, eval_seconds: float, wall: float, stopped: bool) -> None:
    row = pd.DataFrame([{"date": time.strftime("%Y-%m-%d %H:%M"), "cpu": cpu_name(), "dtype": args.dtype,
                         "items_evaluated": items, "eval_hours": round(eval_seconds / 3600, 6),
                         "wall_hours": round(wall / 3600, 4), "stopped_at_time_limit": stopped,
                         "batch_size": args.batch_size,
                         "only": ",".join(args.only) if args.only else units_label(args.units)}])
    old = pd.read_csv(path) if path.is_file() else None
    frame = row if old is None else pd.concat([old, row], ignore_index=True)
    frame["batch_size"] = frame["batch_size"].astype("Int64")  # blank in rows logged before it was
    write_csv(frame, path)


if __name__ == "__main__":
    script_main(main)
