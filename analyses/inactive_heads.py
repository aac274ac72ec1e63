"""The paper's Table 2 (arXiv 2504.03889): how many heads can be zeroed within 1 accuracy point.

    HF_HUB_OFFLINE=1 HF_DATASETS_OFFLINE=1 python analyses/inactive_heads.py \\
        --models smollm2-135m,qwen2.5-coder-0.5b,gemma-3-270m --tasks piqa,winogrande,mmlu \\
        --limit-piqa 1838 --limit-winogrande 1267 --limit-mmlu 2000 --out analyses/results/inactive_heads

For every (model, task):

(a) the unablated accuracy, with a bootstrap standard error over questions. A pair *carries
    signal* when  accuracy - chance > K x SE  (K = ``--signal-se``, default 2), chance being
    the mean of 1/#choices over the evaluated questions (0.5 PIQA, 0.5 WinoGrande, 0.25 MMLU).
    The rule is applied to the measured numbers; no pair is assumed to have signal.
(b) on pairs with signal: per-input threshold sweeps for the 12 paper score functions and
    random heads (3 seeds) at 0-30 % in steps of 5 (``lens_heads.sweep.run_sweep``: every
    point is stored atomically under OUT/store/<model>__<task>/ and a rerun resumes), and the
    rule of (a) once more on the sweep's own questions (a --sweep-limit subset can lose the
    signal of the whole set; its Table 2 values are then marked as noise);
(c) "% zeroed within 1 point" with paired bootstrap intervals, and the ranking of the
    functions by normalised area under the accuracy curve;
(d) the Qwen2.5-0.5B MMLU row of the paper beside ours (``--paper-model``; note that the zoo
    holds Qwen2.5-*Coder*-0.5B, not the paper's base model), agreement judged from our intervals;
(e) STATIC ablation: heads ranked by their dataset-level AHON(LN) on the task's own inputs
    (``score_heads``), the k lowest zeroed on every input, k = ceil(p x layers x heads) for the
    same fractions p; evaluated through the same store (``extra_ablations``);
(g) every stored point of every sweep, finished or running, against the baseline and against
    random heads at the same target fraction, paired over questions, with the questions it
    would need for a paired SE of half a point. ``--first`` puts chosen points right after the
    baseline, so a sweep that cannot finish where it runs measures those first.

Resuming: points come from the store first. A pair whose store is gone (stores are big and, but
for this script's, git-ignored) while OUT's tables hold its baseline or its sweep on as many
questions is not recomputed: those rows are carried over and the summary says so. The tables
keep the rows of pairs a run does not cover, so runs of single pairs add up.

Outputs (OUT): baseline.csv, sweep_baseline.csv, table2.csv, auc_ranking.csv, static_ahon_ln.csv,
static_within_1pt.csv, points.csv (every stored point against the baseline and random heads at the
same fraction, section (g)), figures/curves_<model>__<task>.png (figures/points_<model>__<task>.png
while a sweep runs), paper_comparison.csv, paper_claims.csv, summary.md; with --check-dtype,
dtype_check.csv (the bf16 pipeline vs the fp32 one, unablated and per-input AHON(LN) at 10 %, on
--check-dtype-limit questions, stored like every point).
"""

from __future__ import annotations

import gc
import math
import sys
from dataclasses import replace
from pathlib import Path

import numpy as np
import pandas as pd

sys.path.insert(0, str(Path(__file__).resolve().parent))

from common import Run, base_parser, check_positive, markdown_table, model_label, out_folder, script_main, \
    split_list, split_tasks, write_csv, write_figure  # noqa: E402

from lens_heads.models import check_device  # noqa: E402
from lens_heads.sweep.curves import bootstrap_indices, max_within, normalised_auc, paired_difference, \
    percentile_interval  # noqa: E402
from lens_heads.data import load_task  # noqa: E402
from lens_heads.errors import LensHeadsError  # noqa: E402
from lens_heads.forward.task_requests import select_records, task_inputs  # noqa: E402
from lens_heads.scores import SCORES, least_active, resolve_score_ids, score_heads  # noqa: E402
from lens_heads.results.store import ResultStore  # noqa: E402
from lens_heads.interventions.specs import StaticHeads  # noqa: E402
from lens_heads.viz.study import ModelRef  # noqa: E402
from lens_heads.sweep import RANDOM, StaticScoresRecord, SweepConfig, put_thresholds, stored_thresholds  # noqa: E402
from lens_heads.interventions.thresholds import parse_fractions, thresholds_of  # noqa: E402
from lens_heads.viz.figures import point_changes, sweep_curves  # noqa: E402

# The paper's headline results (docs/methods.md cites it) (MMLU 5-shot, % of heads zeroed within 1 point)
PAPER_ROW = {"model": "Qwen2.5-0.5B", "task": "mmlu", "base_accuracy": 47.49, "awft": 7.4, "ahon_ln": 7.4,
             "best_fn": "lthon_ln", "best": 14.4}
PAPER_RANDOM = (0.5, 1.9)  # random heads stay within 1 point only up to 0.5-1.9 %
PAPER_AVERAGES = {"awft": 4.61, "best_non_awft": 12.18}  # over 14 models


def parse_args(argv):
    p = base_parser(__doc__, "analyses/results/inactive_heads")
    p.add_argument("--tasks", default="piqa,winogrande,mmlu",
                   help="comma list of task names (piqa, winogrande, mmlu) or file:... specs")
    for t in ("piqa", "winogrande", "mmlu"):
        p.add_argument(f"--limit-{t}", type=int, default=None, help=f"{t} questions (default all; stratified sample)")
    p.add_argument("--limit", type=int, default=None, help="questions for any other task (default all)")
    p.add_argument("--sweep-limit", type=int, default=None,
                   help="cap on the questions of the sweeps (a stratified subset; its own baseline): the signal "
                        "decision uses the --limit-* questions, the sweeps at most this many (default: no cap)")
    for t in ("piqa", "winogrande", "mmlu"):
        p.add_argument(f"--sweep-limit-{t}", type=int, default=None,
                       help=f"cap on the questions of the {t} sweeps, in place of --sweep-limit")
    p.add_argument("--scores", default="paper", help="score functions to sweep (default: the paper's 12)")
    p.add_argument("--fractions", default="0,0.05,0.1,0.15,0.2,0.25,0.3")
    p.add_argument("--seeds", type=int, default=3, help="random-head seeds (default 3)")
    p.add_argument("--first", default="",
                   help="comma list of sweep points to evaluate right after the baseline, before the rest of the "
                        "sweep (ID@FRACTION, random@FRACTION@SEED; e.g. ahon_ln@0.1,random@0.1@0): for a sweep "
                        "that cannot finish here, the points that answer the question at hand come first")
    p.add_argument("--static-score", default="ahon_ln", help="dataset-level score for the static ablation")
    p.add_argument("--signal-se", type=float, default=2.0,
                   help="a pair carries signal when accuracy - chance > this many bootstrap SEs (default 2)")
    p.add_argument("--sweep-all", action="store_true",
                   help="sweep every pair, with or without signal (the decision is still reported)")
    p.add_argument("--baseline-only", action="store_true",
                   help="stop after (a): baselines and signal decisions only (a later run without it resumes)")
    p.add_argument("--from-store", action="store_true",
                   help="compute nothing: tabulate what the store already holds (pairs it lacks are listed as "
                        "not measured), e.g. to merge runs made with different --models/--tasks")
    p.add_argument("--n-boot", type=int, default=1000)
    p.add_argument("--paper-model", default="qwen2.5-coder-0.5b",
                   help="which of --models stands beside the paper's Qwen2.5-0.5B row (default qwen2.5-coder-0.5b)")
    p.add_argument("--paper-task", default="mmlu", help="task of the paper's row (default mmlu)")
    p.add_argument("--check-dtype", action="store_true",
                   help="compare the bfloat16 pipeline with the float32 one on a subset (slow where bf16 is emulated)")
    p.add_argument("--check-dtype-limit", type=int, default=200)
    args = p.parse_args(argv)
    args.device = check_device(args.device)  # before any folder is made
    check_positive(args, "batch_size", "n_boot", "limit", "sweep_limit", "limit_piqa", "limit_winogrande", "limit_mmlu",
                   "sweep_limit_piqa", "sweep_limit_winogrande", "sweep_limit_mmlu", "check_dtype_limit")
    if args.seeds < 0:
        raise LensHeadsError(f"--seeds must be >= 0, got {args.seeds}")
    args.models = split_list(args.models, "models")
    args.tasks = split_tasks(args.tasks)
    args.score_ids = resolve_score_ids(args.scores)
    args.fractions = sorted({0.0, *parse_fractions(args.fractions)})
    first = SweepConfig(task="", score_ids=args.score_ids, fractions=args.fractions, random_seeds=list(range(args.seeds)),
                        first=[f.strip() for f in args.first.split(",") if f.strip()])
    first.validate()  # a bad --first label fails here, before any model, store or scoring pass
    args.first = [str(p) for p in first.first]  # canonical labels
    resolve_score_ids(args.static_score)
    return args


def task_limit(args, spec: str) -> int | None:
    return getattr(args, f"limit_{spec}", None) if spec in ("piqa", "winogrande", "mmlu") else args.limit


def sweep_limit(args, spec: str) -> int | None:
    own = getattr(args, f"sweep_limit_{spec}", None) if spec in ("piqa", "winogrande", "mmlu") else None
    caps = [x for x in (task_limit(args, spec), args.sweep_limit if own is None else own) if x is not None]
    return min(caps) if caps else None


# -----------------------------------------------------------------------------
# (a) baseline and the signal rule


def baseline(ref: ModelRef, task, spec: str, limit, args, store_dir: Path, compute: bool) -> dict | None:
    """Unablated accuracy (stored in the pair's sweep store), bootstrap SE/CI, chance, signal;
    None when the store lacks it and ``compute`` is False."""
    cfg = SweepConfig(task=spec, score_ids=[], fractions=[0.0], random_seeds=[0], limit=limit,
                      batch_size=args.batch_size, n_boot=args.n_boot)
    result = ref.sweep(cfg, store_dir, task, compute=compute)
    if result is None:
        return None
    rec = result.records["none"]
    return {**accuracy_stats(task, rec, limit, args, cfg), "n_total": len(task.records),
            "acc_norm": rec.metrics.get("acc_norm", math.nan),
            "eval_seconds": float(rec.eval_config.get("seconds", math.nan))}


def accuracy_stats(task, rec, limit, args, cfg: SweepConfig) -> dict:
    """Accuracy of a stored unablated point with its bootstrap SE/CI, chance on the same
    questions, z = (accuracy - chance) / SE and the signal decision (``--signal-se``)."""
    correct = np.array([float(q.correct) for q in rec.questions])
    boot = correct[bootstrap_indices(len(correct), args.n_boot, cfg.boot_seed)].mean(1)
    chance = float(np.mean([1.0 / len(r.choices) for r in select_records(task, limit, cfg.seed)]))
    acc, se = rec.accuracy, float(boot.std(ddof=1))
    lo, hi = percentile_interval(boot)
    return {"accuracy": acc, "boot_se": se, "ci_low": lo, "ci_high": hi, "chance": chance,
            "z": (acc - chance) / se if se > 0 else math.inf * np.sign(acc - chance),
            "signal": bool(acc - chance > args.signal_se * se), "n_questions": len(correct)}


# -----------------------------------------------------------------------------
# Rows of earlier runs

PAIR_TABLES = ("baseline", "sweep_baseline", "table2", "auc_ranking", "static_ahon_ln", "static_within_1pt",
               "points", "dtype_check", "superseded")  # OUT/<name>.csv, one or more rows per (model, task)


def earlier_tables(out: Path) -> dict[str, pd.DataFrame]:
    """The per-(model, task) tables an earlier run left in OUT (empty frames where there is none).

    A run covering some pairs, or whose store lacks a pair (a fresh checkout has the tables but
    not the git-ignored stores that measured them), keeps the other pairs' rows instead of
    dropping them; ``with_earlier`` merges, and the summary names what was carried over."""
    frames = {}
    for name in PAIR_TABLES:
        path = out / f"{name}.csv"
        frames[name] = pd.read_csv(path) if path.is_file() else pd.DataFrame(columns=["model", "task"])
    return frames


def pairs_of(frame: pd.DataFrame) -> set[tuple[str, str]]:
    return set(zip(frame["model"], frame["task"])) if len(frame) else set()


def with_earlier(new: pd.DataFrame, old: pd.DataFrame) -> pd.DataFrame:
    """``old`` with each pair's rows replaced by ``new``'s where it has them, then ``new``'s other pairs."""
    if not len(old) or not len(new):
        return (new if len(new) else old).reset_index(drop=True)
    key = lambda f: list(zip(f["model"], f["task"]))  # noqa: E731
    have, pieces = pairs_of(new), []
    for pair in dict.fromkeys(key(old) + key(new)):  # the earlier order, then the pairs new here
        src = new if pair in have else old
        pieces.append(src[[k == pair for k in key(src)]])
    return pd.concat(pieces, ignore_index=True)


def earlier_rows(frame: pd.DataFrame, model: str, task: str, n_questions: int) -> pd.DataFrame:
    """An earlier run's rows for the pair, if they were measured on ``n_questions`` questions."""
    if not len(frame):
        return frame
    return frame[(frame["model"] == model) & (frame["task"] == task) & (frame["n_questions"] == n_questions)]


def earlier_row(frame: pd.DataFrame, model: str, task: str, n_questions: int) -> dict | None:
    rows = earlier_rows(frame, model, task, n_questions)
    return rows.iloc[0].to_dict() if len(rows) else None


def earlier_sweep(table2: pd.DataFrame, model: str, task: str, n_questions: int, cfg: SweepConfig) -> bool:
    """Whether an earlier run's Table 2 holds this pair's sweep on as many questions, with every
    function of ``cfg`` (and random heads when it has seeds)."""
    rows = earlier_rows(table2, model, task, n_questions)
    wanted = set(cfg.score_ids) | ({RANDOM} if cfg.random_seeds else set())
    return bool(len(rows)) and wanted <= set(rows["score_fn"])


REVISED_TABLES = ("table2", "auc_ranking", "points")  # per-function rows that carry a score_revision
SUPERSEDED_WHY = {  # (score id, revision that replaced the rows' definition) -> why
    ("lthon_ln", 2): "lthon_ln was the paper text's reading (||O_last|| / layer mean of LTHON, now lthon_ln_text); "
                     "the authors' code, which made the paper's tables, divides by the layer mean of AHON",
}


def revision_of(score_fn: str) -> int:
    """The current definition's revision of a score function (1 for random heads and the rest)."""
    return SCORES[score_fn].revision if score_fn in SCORES else 1


def split_superseded(frame: pd.DataFrame) -> tuple[pd.DataFrame, pd.DataFrame]:
    """(current rows, rows measured under an older definition of their score function). Rows
    written before revisions were recorded carry none: revision 1."""
    if not len(frame) or "score_fn" not in frame:
        return frame, frame.iloc[0:0]
    rev = frame["score_revision"] if "score_revision" in frame else pd.Series(1, index=frame.index)
    old = rev.fillna(1).astype(int) < frame["score_fn"].map(revision_of)
    current = frame[~old].copy()
    current["score_revision"] = current["score_fn"].map(revision_of)
    return current.reset_index(drop=True), frame[old].reset_index(drop=True)


def remeasured_rows(ref: ModelRef, task, cfg: SweepConfig, store_dir: Path, carried: pd.DataFrame,
                    carried_auc: pd.DataFrame, args, limit) -> tuple[list[dict], list[dict]]:
    """Table 2 and AUC rows for the functions of a carried-over sweep whose definition changed
    and whose whole curve the store holds under the new one (re-measured alone, with the
    baseline); the AUC over the carried sweep's common range. Nothing is computed."""
    t2, auc = [], []
    for sid in cfg.score_ids:
        if revision_of(sid) == 1:
            continue
        one = replace(cfg, score_ids=[sid], random_seeds=[], extra_ablations=[], first=[])
        result = ref.sweep(one, store_dir, task, compute=False)
        if result is None:
            continue
        w = result.within.set_index("score_fn").loc[sid]
        old = carried[carried["score_fn"] == sid]
        stats = accuracy_stats(task, result.records["none"], limit, args, one)
        t2.append({"model": old["model"].iloc[0], "task": old["task"].iloc[0], "score_fn": sid,
                   **{k: w[k] for k in ("max_pct_zeroed_within_1pt", "ci_low", "ci_high", "seed_min", "seed_max",
                                        "max_pct_measured", "crossing_gap_pct", "n_ablated_points", "note",
                                        "base_accuracy")},
                   "n_questions": len(result.records["none"].questions),
                   "lower_bound": bool(w["max_pct_zeroed_within_1pt"] >= w["max_pct_measured"]),
                   "signal": old["signal"].iloc[0], "sweep_z": stats["z"], "sweep_signal": stats["signal"],
                   "score_revision": revision_of(sid)})
        prior = carried_auc[carried_auc["score_fn"] == sid]
        if len(prior):
            pts = result.summary[result.summary["score_fn"] == sid].sort_values("fraction")
            x_max = float(prior["auc_range_pct"].iloc[0])
            auc.append({**prior.iloc[0].to_dict(), "score_revision": revision_of(sid),
                        "auc": normalised_auc(pts["pct_zeroed"].to_numpy(), pts["accuracy"].to_numpy(),
                                              float(w["base_accuracy"]), x_max),
                        "auc_ci_low": math.nan, "auc_ci_high": math.nan, "rank_by_auc": math.nan})
    return t2, auc


def with_overrides(frame: pd.DataFrame, rows: list[dict]) -> pd.DataFrame:
    """``frame`` with the (model, task, score_fn) rows of ``rows`` put in place of its own."""
    if not rows:
        return frame
    new = pd.DataFrame(rows)
    key = lambda f: list(zip(f["model"], f["task"], f["score_fn"]))  # noqa: E731
    by_key = {k: i for i, k in enumerate(key(new))}
    out = [new.iloc[[by_key[k]]] if k in by_key else frame.iloc[[i]] for i, k in enumerate(key(frame))]
    return pd.concat(out, ignore_index=True)


def rerank(auc: pd.DataFrame) -> pd.DataFrame:
    """Ranks by AUC within each (model, task), after re-measured rows replaced old ones."""
    if not len(auc):
        return auc
    auc = auc.copy()
    auc["rank_by_auc"] = auc.groupby(["model", "task"])["auc"].rank(ascending=False, method="min")
    return auc


def n_questions(task, limit) -> int:
    return len(select_records(task, limit, SweepConfig.seed))


# -----------------------------------------------------------------------------
# (e) static ablation by a dataset-level score


def static_specs(ref: ModelRef, task, sweep: SweepConfig, args, store_dir: Path, compute: bool) -> list[dict] | None:
    """One static head set per fraction > 0: the k least active heads by the dataset-level score
    (None when the store lacks the scores and ``compute`` is False).

    The scoring pass that ranks the heads also stores the thresholds of ``sweep`` (same inputs,
    same batches): one pass instead of two, each ~2 h on Qwen's 500 MMLU 5-shot prompts here."""
    sid = resolve_score_ids(args.static_score)[0]
    cfg = SweepConfig(task=sweep.task, score_ids=[], limit=sweep.limit)
    key = ref.identity(cfg, task).static_scores(sid)
    store = ResultStore(store_dir)
    rec = store.load(key, StaticScoresRecord)
    if rec is None and not compute:
        return None
    if rec is None:
        model = ref.model
        inputs = task_inputs(model, task, sweep.n_shot, sweep.limit, sweep.seed, sweep.protocol)
        identity = ref.identity(sweep, task)
        todo = sweep.score_ids if stored_thresholds(store, identity, sweep) is None else []
        hs = score_heads(model, inputs, list(dict.fromkeys([*todo, sid])), batch_size=sweep.threshold_batch_size,
                         keep_per_input=bool(todo), progress=True)
        if todo:
            put_thresholds(store, identity, sweep,
                           thresholds_of(hs, todo, sweep.fractions, sweep.protocol.threshold_rule), len(inputs))
        rec = StaticScoresRecord(hs.mean[sid].tolist(), hs.n)
        store.save(key, rec)
    order = least_active(np.array(rec.mean, dtype=float), SCORES[sid].inactive_when)  # NaN scores last
    out = []
    for p in args.fractions:
        k = math.ceil(p * len(order) - 1e-9)
        if k == 0:
            continue
        chosen = sorted(order[:k])
        out.append({"fraction": p, "k_heads": k, "spec": str(StaticHeads(tuple(chosen)))})
    return out


def static_curve(result, statics: list[dict], args, x_max: float) -> tuple[pd.DataFrame, dict]:
    """Per-point rows for the static sets and their within-1-point / AUC with paired intervals."""
    rows = []
    for s in statics:
        r = result.summary.loc[result.summary["spec"] == s["spec"]].iloc[0]
        rows.append({"fraction": s["fraction"], "k_heads": s["k_heads"], "pct_zeroed": r["pct_zeroed"],
                     "accuracy": r["accuracy"], "ci_low": r["ci_low"], "ci_high": r["ci_high"],
                     "delta": r["delta"], "delta_ci_low": r["delta_ci_low"], "delta_ci_high": r["delta_ci_high"],
                     "heads": s["spec"].removeprefix("static:")})
    points = pd.DataFrame(rows)
    # correctness matrix [point, question] aligned on the baseline's questions, same resamples as run_sweep
    ref = [q.doc_id for q in result.records["none"].questions]
    specs = ["none"] + [s["spec"] for s in statics]
    C = np.array([[float(result.records[sp].correct_by_doc()[d]) for d in ref] for sp in specs])
    idx = bootstrap_indices(len(ref), args.n_boot, 0)
    boot = C[:, idx].mean(-1)  # [point, boot]
    base = result.records["none"].accuracy
    x = np.array([0.0] + list(points["pct_zeroed"]))
    y = np.array([base] + list(points["accuracy"]))
    w = max_within(x, y, base, 0.01)
    wb = np.array([max_within(x, boot[:, b], boot[0, b], 0.01) for b in range(boot.shape[1])])
    a = normalised_auc(x, y, base, x_max)
    ab = np.array([normalised_auc(x, boot[:, b], boot[0, b], x_max) for b in range(boot.shape[1])])
    within = {"static_max_pct_within_1pt": w, "static_ci_low": percentile_interval(wb)[0],
              "static_ci_high": percentile_interval(wb)[1], "static_auc": a,
              "static_auc_ci_low": percentile_interval(ab)[0], "static_auc_ci_high": percentile_interval(ab)[1],
              "auc_range_pct": x_max}
    return points, within


# -----------------------------------------------------------------------------
# (g) every stored point, against the baseline and against random heads at the same fraction

SE_GOAL = 0.005  # half a point: the paired SE at which a 1-point drop is two SEs


def paper_within(score_fn: str, pct: float) -> str:
    """What the paper's Qwen2.5-0.5B MMLU row implies at ``pct`` % zeroed for ``score_fn``."""
    if score_fn == RANDOM:
        return "beyond" if pct > PAPER_RANDOM[1] else "within" if pct <= PAPER_RANDOM[0] else ""
    value = PAPER_ROW["best"] if score_fn == PAPER_ROW["best_fn"] else PAPER_ROW.get(score_fn)
    return "" if value is None else "within" if pct <= value else "beyond"


def _one_point_verdict(lo: float, hi: float) -> str:
    return ("within 1 pt (CI above -1)" if lo >= -1 else "loses > 1 pt (CI below -1)" if hi < -1
            else "undecided (CI spans -1)")


def point_rows(result, label: str, tname: str, args, paper_pair: bool) -> list[dict]:
    """One row per stored ablated point of a sweep (finished or not): its accuracy change against
    the baseline and against random heads at the same target fraction (the mean over the seeds
    stored there), both paired over the questions (percentile intervals, in points), and how many
    questions the change to the baseline would need for a paired SE of half a point (SE ~ 1/sqrt(n)).
    On the paper's pair, ``paper`` says what its Qwen2.5-0.5B row implies at the realised %
    ("within": inside its within-1-point range)."""
    recs = result.records
    ref = [q.doc_id for q in recs["none"].questions]

    def correct(spec: str) -> np.ndarray:
        by_id = recs[spec].correct_by_doc()
        return np.array([float(by_id[d]) for d in ref])

    idx = bootstrap_indices(len(ref), args.n_boot, 0)
    base = correct("none")
    pts = result.summary[result.summary["fraction"] > 0]
    rows = []
    for r in pts.itertuples():
        c = correct(r.spec)
        d = paired_difference(c, base, idx)
        row = {"model": label, "task": tname, "score_fn": r.score_fn, "fraction": r.fraction, "seed": r.seed,
               "pct_zeroed": r.pct_zeroed, "accuracy_pct": 100 * r.accuracy, "delta_pt": 100 * d["delta"],
               "delta_ci_low": 100 * d["ci_low"], "delta_ci_high": 100 * d["ci_high"], "delta_se_pt": 100 * d["se"],
               "verdict": _one_point_verdict(100 * d["ci_low"], 100 * d["ci_high"]),
               "questions_for_se_half_point": math.ceil(len(ref) * (d["se"] / SE_GOAL) ** 2),
               "vs_random_pt": math.nan, "vs_random_ci_low": math.nan, "vs_random_ci_high": math.nan,
               "random_seeds_here": 0, "paper": paper_within(r.score_fn, r.pct_zeroed) if paper_pair else "",
               "n_questions": len(ref)}
        rand = pts[(pts["score_fn"] == RANDOM) & (pts["fraction"] == r.fraction)]
        if r.score_fn != RANDOM and len(rand):
            v = paired_difference(c, np.mean([correct(x) for x in rand["spec"]], axis=0), idx)
            row.update(vs_random_pt=100 * v["delta"], vs_random_ci_low=100 * v["ci_low"],
                       vs_random_ci_high=100 * v["ci_high"], random_seeds_here=len(rand))
        rows.append(row)
    return rows


# -----------------------------------------------------------------------------
# (d) the paper's row beside ours


def _verdict(paper: float, lo: float, hi: float) -> str:
    if any(math.isnan(v) for v in (lo, hi)):
        return "no interval"
    if lo <= paper <= hi:
        return "agrees (paper value inside our 95% CI)"
    return "disagrees: paper " + ("higher" if paper > hi else "lower") + " than our 95% CI"


def _point_verdict(paper: str, lo: float, hi: float) -> str:
    """A single point's paired change (in points) against what the paper's row implies there."""
    if lo <= -1 <= hi:
        return "undecided (our CI spans -1 pt)"
    ours = "within" if lo > -1 else "beyond"
    return f"agrees ({ours} 1 pt)" if ours == paper else f"disagrees (ours: {ours} 1 pt)"


def paper_comparison(table2: pd.DataFrame, base: pd.DataFrame, claims: pd.DataFrame, args,
                     running: pd.DataFrame | None = None, points: pd.DataFrame | None = None) -> pd.DataFrame:
    """The paper's row beside ours. While the pair's sweep is still running, its complete
    curves stand in (``running``: section (f)), and the 'best function' is the best so far;
    single stored points of the paper's functions and of random heads whose curves are not
    complete yet (``points``: section (g)) are set against what the paper's row implies at
    their % zeroed (within or beyond 1 point)."""
    label, task = model_label(args.paper_model), args.paper_task
    cols = ["model", "task", "score_fn", "max_pct_zeroed_within_1pt", "ci_low", "ci_high", "seed_min", "seed_max"]
    table2 = table2 if len(table2) else pd.DataFrame(columns=cols)  # no pair was swept (none carried signal)
    t = table2[(table2["model"] == label) & (table2["task"] == task)].set_index("score_fn")
    so_far = ""
    if not len(t) and running is not None and len(running):
        t = running[(running["model"] == label) & (running["task"] == task)].set_index("score_fn")
        if len(t):
            so_far = f" (sweep running: {t['points_stored'].iloc[0]} of {t['points_planned'].iloc[0]} points)"
    b = base[(base["model"] == label) & (base["task"] == task)] if len(base) else base
    rows = []
    if len(b):
        r = b.iloc[0]
        rows.append({"quantity": "base accuracy (%)", "paper": PAPER_ROW["base_accuracy"], "ours": 100 * r.accuracy,
                     "ours_ci_low": 100 * r.ci_low, "ours_ci_high": 100 * r.ci_high,
                     "verdict": _verdict(PAPER_ROW["base_accuracy"], 100 * r.ci_low, 100 * r.ci_high)})
    if len(t):
        for fn in ("awft", "ahon_ln", PAPER_ROW["best_fn"]):
            if fn in t.index:
                r = t.loc[fn]
                paper = PAPER_ROW["best"] if fn == PAPER_ROW["best_fn"] else PAPER_ROW[fn]
                rows.append({"quantity": f"{fn} % zeroed within 1 pt", "paper": paper,
                             "ours": r.max_pct_zeroed_within_1pt, "ours_ci_low": r.ci_low, "ours_ci_high": r.ci_high,
                             "verdict": _verdict(paper, r.ci_low, r.ci_high)})
        funcs = t.drop(index=[RANDOM], errors="ignore")
        if len(funcs):
            best = funcs["max_pct_zeroed_within_1pt"].idxmax()
            r = funcs.loc[best]
            same = "same function" if best == PAPER_ROW["best_fn"] else f"paper's best is {PAPER_ROW['best_fn']}"
            rows.append({"quantity": f"best function ({best}) % within 1 pt" + (", of those measured" if so_far else ""),
                         "paper": PAPER_ROW["best"],
                         "ours": r.max_pct_zeroed_within_1pt, "ours_ci_low": r.ci_low, "ours_ci_high": r.ci_high,
                         "verdict": _verdict(PAPER_ROW["best"], r.ci_low, r.ci_high) + f"; {same}"})
        if RANDOM in t.index:
            r = t.loc[RANDOM]
            overlap = not (r.seed_max < PAPER_RANDOM[0] or r.seed_min > PAPER_RANDOM[1])
            rows.append({"quantity": "random heads % within 1 pt (seed range)", "paper": f"{PAPER_RANDOM[0]}-{PAPER_RANDOM[1]}",
                         "ours": f"{r.seed_min:.1f}-{r.seed_max:.1f}", "ours_ci_low": r.ci_low, "ours_ci_high": r.ci_high,
                         "verdict": "agrees (seed ranges overlap)" if overlap else "disagrees (seed ranges do not overlap)"})
    if points is not None and len(points):
        curves = set(t.index)
        p = points[(points["model"] == label) & (points["task"] == task) & (points["paper"].isin(["within", "beyond"]))
                   & ~points["score_fn"].isin(curves)]
        for r in p.itertuples():
            who = "random heads" + (f" (seed {r.seed})" if not pd.isna(r.seed) else "") if r.score_fn == RANDOM else r.score_fn
            rows.append({"quantity": f"{who} at {r.pct_zeroed:.1f} % zeroed: accuracy change (pt)",
                         "paper": f"{r.paper} 1 pt", "ours": r.delta_pt, "ours_ci_low": r.delta_ci_low,
                         "ours_ci_high": r.delta_ci_high,
                         "verdict": _point_verdict(r.paper, r.delta_ci_low, r.delta_ci_high)
                                    + f" ({r.n_questions} questions, one point of a curve)"})
    # the averaged claim: AWFT vs the best non-AWFT function, over our pairs on the paper's task
    on_task = claims[claims["task"] == task] if len(claims) else claims
    if len(on_task):
        ours_awft, ours_best = float(on_task["awft"].mean()), float(on_task["best"].mean())
        claim = PAPER_AVERAGES["best_non_awft"] > PAPER_AVERAGES["awft"]
        rows.append({"quantity": f"mean over our {len(on_task)} model(s): awft vs best non-AWFT",
                     "paper": f"{PAPER_AVERAGES['awft']} vs {PAPER_AVERAGES['best_non_awft']}",
                     "ours": f"{ours_awft:.1f} vs {ours_best:.1f}", "ours_ci_low": math.nan, "ours_ci_high": math.nan,
                     "verdict": ("agrees" if (ours_best > ours_awft) == claim else "disagrees")
                                + " on the direction (best non-AWFT > AWFT)"})
    out = pd.DataFrame(rows, columns=["quantity", "paper", "ours", "ours_ci_low", "ours_ci_high", "verdict"])
    if so_far:
        out.loc[~out["quantity"].str.startswith(("base accuracy", "mean over")), "verdict"] += so_far
    return out


def paper_claims(table2: pd.DataFrame) -> pd.DataFrame:
    """The paper's two general claims on every swept pair, whatever its task: some non-AWFT
    function keeps more heads zeroed within 1 point than AWFT (14-model means 12.18 vs 4.61 %),
    and random heads stay within 1 point only up to 0.5-1.9 %."""
    rows = []
    for (m, t), grp in (table2.groupby(["model", "task"], sort=False) if len(table2) else []):
        g = grp.set_index("score_fn")
        funcs = g.drop(index=[RANDOM, "awft", "awft_ln"], errors="ignore")
        if "awft" not in g.index or not len(funcs):
            continue
        best = funcs["max_pct_zeroed_within_1pt"].idxmax()
        a, b = g.loc["awft"], funcs.loc[best]
        beats = ("yes, intervals apart" if b.ci_low > a.ci_high else
                 "yes, intervals overlap" if b.max_pct_zeroed_within_1pt > a.max_pct_zeroed_within_1pt else "no")
        row = {"model": m, "task": t, "awft": a.max_pct_zeroed_within_1pt, "awft_ci_low": a.ci_low,
               "awft_ci_high": a.ci_high, "best_non_awft": best, "best": b.max_pct_zeroed_within_1pt,
               "best_ci_low": b.ci_low, "best_ci_high": b.ci_high, "best_beats_awft": beats}
        if RANDOM in g.index:
            r = g.loc[RANDOM]
            row.update(random_seed_min=r.seed_min, random_seed_max=r.seed_max,
                       random_in_paper_range=bool(r.seed_max >= PAPER_RANDOM[0] and r.seed_min <= PAPER_RANDOM[1]))
        rows.append(row)
    return pd.DataFrame(rows)


def curve_figure(result, points: pd.DataFrame, within: dict, sid: str, title: str):
    """Accuracy vs % zeroed: the per-input curves and random (from the sweep) and the static
    curve (``static <sid>``), each labelled with its % within 1 point."""
    per_input = result.summary[~result.summary["score_fn"].str.startswith("static:")]
    base = result.records["none"].accuracy
    static = pd.concat([pd.DataFrame([{"fraction": 0.0, "pct_zeroed": 0.0, "accuracy": base}]),
                        points[["fraction", "pct_zeroed", "accuracy"]]]).assign(score_fn=f"static {sid}")
    summary = pd.concat([per_input, static], ignore_index=True)
    marks = pd.concat([result.within[["score_fn", "max_pct_zeroed_within_1pt", "note"]],
                       pd.DataFrame([{"score_fn": f"static {sid}",
                                      "max_pct_zeroed_within_1pt": within["static_max_pct_within_1pt"]}])])
    return sweep_curves(summary, marks, base=base, title=f"{title}: accuracy as heads are zeroed")


# -----------------------------------------------------------------------------
# --check-dtype: the bfloat16 pipeline vs the float32 one on a subset


def check_dtype(spec: str, ref: ModelRef, tasks: dict, args, out: Path) -> pd.DataFrame:
    """For each task: the unablated point and a per-input AHON(LN) 10 % point, each dtype with its
    own thresholds, through the store (OUT/store/<model>__<task>/dtype_check). Runs where bf16 is
    emulated too (slowly): the check is about the numbers, not the speed."""
    from lens_heads.models.load import native_bf16

    label, rows = model_label(spec), []
    refs = {d: ref if d == ref.dtype_name else ModelRef(spec, d, args.device)  # the run's model is one of the two
            for d in ("float32", "bfloat16")}
    for name, task in tasks.items():
        res = {}
        for d, m in refs.items():
            cfg = SweepConfig(task=name, score_ids=["ahon_ln"], fractions=[0.1], random_seeds=[],
                              limit=args.check_dtype_limit, batch_size=args.batch_size, n_boot=args.n_boot)
            res[d] = m.sweep(cfg, out / "store" / f"{label}__{name}" / "dtype_check", task,
                             compute=not args.from_store)
        if any(r is None for r in res.values()):
            continue
        for abl in ("none", "ahon_ln@0.1"):
            recs = {}
            for d, r in res.items():
                pts = r.summary.loc[(r.summary["score_fn"] == "ahon_ln") & (r.summary["fraction"] > 0), "spec"]
                spec_d = "none" if abl == "none" else pts.iloc[0]
                recs[d] = r.records[spec_d]
            a, b = (recs[d].questions for d in ("float32", "bfloat16"))
            dll = max(abs(x - y) for qa, qb in zip(a, b) for x, y in zip(qa.lls, qb.lls))
            rows.append({"model": label, "task": name, "ablation": abl, "n_questions": len(a),
                         "acc_float32": recs["float32"].metrics["acc"],
                         "acc_bfloat16": recs["bfloat16"].metrics["acc"],
                         "prediction_agreement": float(np.mean([qa.pred == qb.pred for qa, qb in zip(a, b)])),
                         "max_abs_dll": dll,
                         "zeroed_float32": recs["float32"].zeroed_fraction,
                         "zeroed_bfloat16": recs["bfloat16"].zeroed_fraction,
                         "bf16_native": native_bf16(args.device)})
    return pd.DataFrame(rows)


# -----------------------------------------------------------------------------
# main


def main(argv=None) -> int:
    args = parse_args(argv)
    tasks = {spec: load_task(spec) for spec in args.tasks}  # a bad task fails before any file or model work
    out = out_folder(args.out)
    earlier = earlier_tables(out)  # before this run writes any of them
    run = Run.start(out, args.device, __file__, argv)
    names = {spec: task.name for spec, task in tasks.items()}
    base_rows, table_rows, auc_rows, static_rows, static_within, dtype_rows = [], [], [], [], [], []
    sweep_base = []  # (b) the baseline on each sweep's own questions, finished or running
    missing = []  # with --from-store: what the store does not hold yet
    running = []  # with --from-store: the complete curves of sweeps the store holds in part
    point_table = []  # (g) every stored point of every sweep, finished or running
    carried = []  # pairs whose baseline or sweep rows come from the tables of an earlier run
    overrides = {"table2": [], "auc_ranking": []}  # re-measured rows of carried sweeps (remeasured_rows)
    dtypes = {}

    def tables() -> dict[str, pd.DataFrame]:
        """This run's rows, plus the earlier rows of every pair it has none for."""
        rows = {"baseline": base_rows, "sweep_baseline": sweep_base, "table2": table_rows, "auc_ranking": auc_rows,
                "static_ahon_ln": static_rows, "static_within_1pt": static_within, "points": point_table}
        frames = {k: with_earlier(pd.DataFrame(v), earlier[k]) for k, v in rows.items()}
        frames["dtype_check"] = with_earlier(pd.concat([pd.DataFrame(), *dtype_rows], ignore_index=True),
                                             earlier["dtype_check"])
        gone = [earlier["superseded"]]
        for name in REVISED_TABLES:  # rows of an older definition move to superseded.csv, with why
            frames[name] = with_overrides(frames[name], overrides.get(name, []))
            frames[name], old = split_superseded(frames[name])
            _, old_earlier = split_superseded(earlier[name])
            for o in (old, old_earlier):
                if len(o):
                    gone.append(o.assign(table=name, why=[SUPERSEDED_WHY.get((f, revision_of(f)), "")
                                                          for f in o["score_fn"]]))
        frames["auc_ranking"] = rerank(frames["auc_ranking"])
        frames["superseded"] = pd.concat([g for g in gone if len(g)], ignore_index=True).drop_duplicates(
            subset=None, ignore_index=True) if any(len(g) for g in gone) else earlier["superseded"]
        if len(frames["points"]):  # blank seed: not a random-heads point
            frames["points"] = frames["points"].astype({"seed": "Int64"})
        if len(frames["auc_ranking"]):  # blank rank: tied score, no curve
            frames["auc_ranking"] = frames["auc_ranking"].astype({"rank_by_auc": "Int64"}).sort_values(
                ["model", "task", "rank_by_auc"], ignore_index=True)
        return frames

    def write_tables():
        for name, frame in tables().items():
            if len(frame) or name == "baseline":
                write_csv(frame, out / f"{name}.csv")

    for spec_m in args.models:
        label = model_label(spec_m)
        ref = ModelRef(spec_m, args.dtype, args.device)  # loaded only when something is computed
        dtypes[label] = ref.dtype_name
        print(f"{label}: {dtypes[label]}, {run.elapsed():.0f} s", flush=True)
        for spec_t, task in tasks.items():
            tname, limit = names[spec_t], task_limit(args, spec_t)
            store_dir = out / "store" / f"{label}__{tname}"
            # the store's, else an earlier run's on as many questions (not recomputed), else computed
            b = baseline(ref, task, spec_t, limit, args, store_dir, compute=False)
            if b is None and (b := earlier_row(earlier["baseline"], label, tname, n_questions(task, limit))):
                carried.append(f"{label} / {tname}: baseline ({b['n_questions']} questions)")
            if b is None and not args.from_store:
                b = baseline(ref, task, spec_t, limit, args, store_dir, compute=True)
            if b is None:
                missing.append(f"{label} / {tname}: baseline")
                print(f"  {tname}: not in the store", flush=True)
                continue
            base_rows.append({"model": label, "task": tname, "dtype": dtypes[label], **b})
            print(f"  {tname}: acc {b['accuracy']:.4f} +- {b['boot_se']:.4f} (chance {b['chance']:.3f}, "
                  f"{b['n_questions']} q) -> {'signal' if b['signal'] else 'no signal'}", flush=True)
            write_tables()
            if args.baseline_only or not (b["signal"] or args.sweep_all):
                continue
            limit = sweep_limit(args, spec_t)
            cfg = SweepConfig(task=spec_t, score_ids=args.score_ids, fractions=args.fractions,
                              random_seeds=list(range(args.seeds)), limit=limit, batch_size=args.batch_size,
                              n_boot=args.n_boot, first=args.first)
            # the store's complete sweep, else an earlier run's rows for it (not recomputed), else computed
            statics, result = static_specs(ref, task, cfg, args, store_dir, compute=False), None
            if statics is not None:
                cfg = replace(cfg, extra_ablations=[s["spec"] for s in statics])
                result = ref.sweep(cfg, store_dir, task, compute=False)
            if result is None and earlier_sweep(earlier["table2"], label, tname, n := n_questions(task, limit), cfg):
                carried.append(f"{label} / {tname}: sweep ({n} questions)")
                t2, auc = remeasured_rows(ref, task, cfg, store_dir, earlier_rows(earlier["table2"], label, tname, n),
                                          earlier["auc_ranking"][(earlier["auc_ranking"]["model"] == label)
                                                                 & (earlier["auc_ranking"]["task"] == tname)]
                                          if len(earlier["auc_ranking"]) else earlier["auc_ranking"], args, limit)
                overrides["table2"] += t2
                overrides["auc_ranking"] += auc
                if t2:
                    carried.append(f"{label} / {tname}: re-measured from the store: "
                                   + ", ".join(r["score_fn"] for r in t2) + " (old rows in superseded.csv)")
                continue
            if result is None and not args.from_store:
                if statics is None:
                    statics = static_specs(ref, task, cfg, args, store_dir, compute=True)
                    cfg = replace(cfg, extra_ablations=[s["spec"] for s in statics])
                result = ref.sweep(cfg, store_dir, task, progress=True)
            part = result
            if result is None:
                part = None if statics is None else ref.sweep(cfg, store_dir, task, compute=False, partial=True)
            sweep_stats = None  # the rule of (a) on the sweep's own questions, once its baseline is stored
            if part is not None and "none" in part.records:
                sweep_stats = accuracy_stats(task, part.records["none"], limit, args, cfg)
                sweep_base.append({"model": label, "task": tname, "sweep": "running" if result is None else "done",
                                   **sweep_stats})
                paper_pair = (label, tname) == (model_label(args.paper_model), args.paper_task)
                rows = point_rows(part, label, tname, args, paper_pair)
                point_table.extend({**r, "sweep": "running" if result is None else "done",  # from the store:
                                    "score_revision": revision_of(r["score_fn"])} for r in rows)  # today's definitions
                if result is None and rows:  # no curve figure yet: the points themselves
                    write_figure(point_changes(pd.DataFrame(rows), f"{label} / {tname}: points stored so far "
                                               f"({part.n_stored} of {part.n_points}), change against the baseline"),
                                 out / "figures" / f"points_{label}__{tname}.png")
                write_tables()
            if result is None:
                stored = f" ({part.n_stored} of {part.n_points} points stored)" if part is not None else ""
                missing.append(f"{label} / {tname}: sweep{stored}")
                if part is not None and len(part.within):
                    running.append(part.within.assign(model=label, task=tname, points_stored=part.n_stored,
                                                      points_planned=part.n_points,
                                                      base_pct=100 * part.within["base_accuracy"],
                                                      sweep_signal=sweep_stats["signal"]))
                continue
            keep = ["score_fn", "max_pct_zeroed_within_1pt", "ci_low", "ci_high", "seed_min", "seed_max",
                    "max_pct_measured", "crossing_gap_pct", "n_ablated_points", "note", "base_accuracy"]
            for r in result.within[keep].to_dict("records"):
                table_rows.append({"model": label, "task": tname, **r,
                                   "n_questions": len(result.records["none"].questions),
                                   "lower_bound": bool(r["max_pct_zeroed_within_1pt"] >= r["max_pct_measured"]),
                                   "signal": b["signal"], "sweep_z": sweep_stats["z"],
                                   "sweep_signal": sweep_stats["signal"]})
            for r in result.within[["score_fn", "auc", "auc_ci_low", "auc_ci_high", "auc_range_pct",
                                    "rank_by_auc"]].to_dict("records"):
                auc_rows.append({"model": label, "task": tname, **r, "rank_by_auc": r["rank_by_auc"]})
            x_max = float(result.within["auc_range_pct"].iloc[0])
            points, within = static_curve(result, statics, args, x_max)
            per_input = result.within.set_index("score_fn")
            sid = resolve_score_ids(args.static_score)[0]
            for r in points.to_dict("records"):
                static_rows.append({"model": label, "task": tname, "score_fn": sid, **r})
            static_within.append({"model": label, "task": tname, "score_fn": sid, **within,
                                  "per_input_max_pct_within_1pt": per_input.loc[sid, "max_pct_zeroed_within_1pt"]
                                  if sid in per_input.index else math.nan,
                                  "per_input_auc": per_input.loc[sid, "auc"] if sid in per_input.index else math.nan})
            write_figure(curve_figure(result, points, within, sid, f"{label} / {tname}"),
                         out / "figures" / f"curves_{label}__{tname}.png")
            write_tables()
        if args.check_dtype:
            dtype_rows.append(check_dtype(spec_m, ref, {names[s]: t for s, t in tasks.items()}, args, out))
            write_tables()
        del ref
        gc.collect()

    write_tables()
    t = tables()
    base, table2 = t["baseline"], t["table2"]
    others = sorted(pairs_of(base) - {(model_label(m), names[s]) for m in args.models for s in args.tasks})
    carried += [f"{m} / {k}: not in this run" for m, k in others]
    claims = paper_claims(table2)
    if len(claims):
        write_csv(claims, out / "paper_claims.csv")
    comparison = paper_comparison(table2, base, claims, args, pd.concat(running, ignore_index=True) if running else None,
                                  t["points"])
    write_csv(comparison, out / "paper_comparison.csv")
    run.write_summary("Inactive heads: Table 2 (% of heads zeroed within 1 accuracy point)",
                      summary_sections(args, base, table2, t["auc_ranking"], t["static_within_1pt"],
                                       comparison, claims, [t["dtype_check"]], dtypes, missing, running,
                                       t["sweep_baseline"], carried, t["points"], t["superseded"]))
    print(f"wrote {out} in {run.elapsed():.0f} s", flush=True)
    return 0


def _within_cell(r, wide_gap: float) -> str:
    """One Table 2 cell: value [CI] (random: the seed range), † for a crossing in a wide gap."""
    if isinstance(r.note, str) and r.note:
        return "n/a (ties)"
    gap = " †" if r.crossing_gap_pct > wide_gap else ""
    if r.score_fn == RANDOM:
        return f"{r.max_pct_zeroed_within_1pt:.1f} (seeds {r.seed_min:.1f}-{r.seed_max:.1f}){gap}"
    return f"{r.max_pct_zeroed_within_1pt:.1f} [{r.ci_low:.1f}, {r.ci_high:.1f}]{gap}"


def summary_sections(args, base, table2, aucs, static_within, comparison, claims, dtype_rows, dtypes,
                     missing=(), running=(), sweep_base=None, carried=(), points=None, superseded=None):
    def size(s):
        n, m = task_limit(args, s), sweep_limit(args, s)
        return f"{'all' if n is None else n}" + (f" (sweeps: {m})" if m != n else "")

    sizes = ", ".join(f"{s}: {size(s)}" for s in args.tasks)
    yield "Sizes and settings", (
        f"models: {', '.join(f'{k} ({v})' for k, v in dtypes.items())}; tasks (question limits, stratified "
        f"samples): {sizes}; score functions: {', '.join(args.score_ids)}; fractions: "
        f"{', '.join(f'{p:g}' for p in args.fractions)}; random seeds: {args.seeds}; bootstrap resamples: "
        f"{args.n_boot}; static ablation by dataset-level {args.static_score}.")
    yield "(a) Baseline accuracy and signal", (
        f"Rule: a (model, task) pair carries signal when accuracy - chance > {args.signal_se:g} x SE, SE = standard "
        f"deviation of the accuracy over {args.n_boot} bootstrap resamples of the questions; chance = mean of "
        f"1/#choices over the evaluated questions. "
        + ("This run stopped after the baselines (--baseline-only): no sweeps yet." if args.baseline_only else
           "Tabulated from the result store (--from-store; this run computed nothing): sweeps are shown for the "
           "pairs with signal" + (" (with --sweep-all, every pair)" if args.sweep_all else "") + " whose sweep the "
           "store holds." if args.from_store else
           "Sweeps ran on pairs with signal" + (" (and, with --sweep-all, on every pair)." if args.sweep_all else "."))
        + "\n\n"
        + (markdown_table(base.assign(eval_min=base["eval_seconds"] / 60), 4,
                          ["model", "task", "n_questions", "accuracy", "boot_se", "ci_low", "ci_high", "chance", "z",
                           "signal", "eval_min"]) + "\n\neval_min: wall minutes of the unablated evaluation when it "
           "was computed (from the store)." if len(base) else "No baseline measured yet.")
        + ("\n\nNot measured yet: " + "; ".join(missing) + "." if missing else "")
        + ("\n\nCarried over from the tables of earlier runs (this run's store does not hold them, or it did "
           "not cover the pair; their sizes are the ones measured then): " + "; ".join(carried) + "."
           if carried else ""))
    if sweep_base is not None and len(sweep_base):
        yield "(b) Signal on each sweep's own questions", (
            "A sweep on a subset (--sweep-limit) has its own baseline; the rule of (a) applied to it says whether "
            "those questions can show a 1-point drop at all. Where they cannot (signal False), the pair's "
            "within-1-point values below are marked ‡: they measure noise around chance, not tolerance to "
            "zeroing.\n\n" + markdown_table(sweep_base, 4, ["model", "task", "sweep", "n_questions", "accuracy",
                                                         "boot_se", "ci_low", "ci_high", "chance", "z", "signal"]))
    if len(table2):
        steps = np.diff(sorted(args.fractions))
        wide_gap = 2 * 100 * float(steps.min()) if len(steps) else math.inf  # twice the sweep's step, in %
        cell = table2.assign(cell=[_within_cell(r, wide_gap) for r in table2.itertuples()])
        wide = cell.pivot_table(index="score_fn", columns=["model", "task"], values="cell", aggfunc="first", sort=False)
        noise = set(map(tuple, table2.loc[~table2["sweep_signal"].astype(bool), ["model", "task"]].values))
        wide.columns = [f"{m} / {t}" + (" ‡" if (m, t) in noise else "") for m, t in wide.columns]
        yield "(c) % of heads zeroed within 1 point (per-input ablation, 95% paired bootstrap CI)", (
            "Largest % of (input, layer, head) units zeroed with accuracy >= baseline - 1 point (last crossing of "
            "the interpolated curve; a value equal to the largest measured % is a lower bound). "
            f"†: the crossing lies between measured points more than {wide_gap:g} points of % zeroed apart "
            "(crossing_gap_pct in table2.csv), so it is mostly interpolation. n/a (ties): the score ties across "
            "heads, every target fraction got the same threshold and the sweep has one point, not a curve. "
            "‡: no signal on the sweep's own questions (section (b)).\n\n"
            + markdown_table(wide.reset_index(), 1))
        top = aucs.sort_values(["model", "task", "rank_by_auc"]).groupby(["model", "task"]).head(3)
        yield "(c) Ranking by normalised AUC (top 3 per pair; full list in auc_ranking.csv)", markdown_table(
            top, 3, ["model", "task", "rank_by_auc", "score_fn", "auc", "auc_ci_low", "auc_ci_high", "auc_range_pct"])
    if len(comparison):
        caveat = (" The zoo's model is Qwen2.5-Coder-0.5B, a code-tuned sibling of the paper's Qwen2.5-0.5B, so "
                  "exact agreement is not expected." if "coder" in args.paper_model.lower() else "")
        yield "(d) The paper's Qwen2.5-0.5B MMLU row beside ours", (
            f"Ours: {model_label(args.paper_model)} on {args.paper_task}.{caveat} Verdicts compare the paper's "
            "number with our 95% bootstrap interval.\n\n" + markdown_table(comparison, 2))
    if len(claims):
        yield "(d) The paper's general claims on every swept pair", (
            "AWFT against the best of the other non-AWFT functions (the paper: 4.61 vs 12.18 % averaged over 14 "
            "models; picking the best of ten after the fact flatters it, so 'intervals overlap' is no win), and the "
            f"random-head seed range against the paper's {PAPER_RANDOM[0]}-{PAPER_RANDOM[1]} %.\n\n"
            + markdown_table(claims, 1))
    if len(static_within):
        yield f"(e) Static ablation by dataset-level {args.static_score}", (
            "The k heads with the lowest mean score over the task's inputs are zeroed on every input "
            "(k = ceil(p x layers x heads)); beside it the per-input ablation by the same function.\n\n"
            + markdown_table(static_within, 3, ["model", "task", "static_max_pct_within_1pt", "static_ci_low",
                                                "static_ci_high", "per_input_max_pct_within_1pt", "static_auc",
                                                "per_input_auc"]))
    if running:
        yield "(f) Sweeps still running: their complete curves so far", (
            "From the result store of sweeps not finished yet (a sweep computes the baseline, then random heads, "
            "then one function's curve after another). These within-1-point values are final; these pairs are in "
            "none of the tables above, and their AUCs are left out because the common AUC range depends on the "
            "curves still missing. sweep_signal False: no signal on the sweep's own questions (section (b)).\n\n"
            + markdown_table(pd.concat(running, ignore_index=True), 1,
                             ["model", "task", "points_stored", "points_planned", "score_fn",
                              "max_pct_zeroed_within_1pt", "ci_low", "ci_high", "seed_min", "seed_max",
                              "crossing_gap_pct", "n_ablated_points", "base_pct", "sweep_signal", "note"]))
    live = points[points["sweep"] == "running"] if points is not None and len(points) else None
    if live is not None and len(live):
        yield "(g) Sweeps still running: every point stored so far", (
            "Each stored ablated point of a sweep not finished yet, curves complete or not: accuracy change against "
            "the unablated baseline and against random heads at the same target fraction (mean over the seeds "
            "stored there; blank where none is), in points, paired over the same questions (95% percentile "
            "intervals). verdict: whether the interval lies above or below the 1-point line or spans it. "
            "q_for_se_0.5: questions this point would need for a paired SE of half a point, the precision at "
            "which a 1-point drop is two SEs. paper: what the paper's Qwen2.5-0.5B row implies at the realised "
            "% zeroed (within: inside its within-1-point range; random heads: beyond 1.9 %). target_pct: the "
            "fraction the threshold was set for; pct_zeroed: what it zeroed. points.csv has "
            "every point of every sweep, finished ones too.\n\n"
            + markdown_table(live.rename(columns={"questions_for_se_half_point": "q_for_se_0.5"})
                             .assign(target_pct=100 * live["fraction"]), 1,
                             ["model", "task", "score_fn", "target_pct", "seed", "pct_zeroed", "accuracy_pct",
                              "delta_pt", "delta_ci_low", "delta_ci_high", "verdict", "vs_random_pt",
                              "vs_random_ci_low", "vs_random_ci_high", "q_for_se_0.5", "paper"]))
    if sum(len(d) for d in dtype_rows):
        yield "bfloat16 vs float32 check", markdown_table(pd.concat(dtype_rows, ignore_index=True), 4)
    if superseded is not None and len(superseded):
        cols = [c for c in ("table", "model", "task", "score_fn", "fraction", "max_pct_zeroed_within_1pt", "ci_low",
                            "ci_high", "auc", "pct_zeroed", "delta_pt", "delta_ci_low", "delta_ci_high")
                if c in superseded]
        yield "Superseded rows (measured under an older definition; kept as measured)", (
            "These rows were measured before a score function's definition changed and are no longer in the "
            "tables above; where the new definition has been measured, its row stands there instead. Why: "
            + "; ".join(sorted(set(superseded["why"].dropna()))) + ".\n\n" + markdown_table(superseded, 2, cols))


if __name__ == "__main__":
    script_main(main)
