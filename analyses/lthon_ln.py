"""Re-measure what the authors'-code definition of LTHON(LN) changes, and the chat-template baselines.

Until 2 Dec 2026 lens_heads' ``lthon_ln`` divided the last-token output norm by the layer's mean
of LTHON (the paper text's reading, now ``lthon_ln_text``); the authors' code, which produced the
paper's tables, divides by the layer's mean of AHON. This script re-runs, with the sizes and
settings of ``inactive_heads.py`` (fp32, stratified 200 PIQA questions, fractions 0-30 % in steps
of 5, batch 8, 1,000 bootstrap resamples):

* ``piqa``: the LTHON(LN) curve of each model's PIQA sweep (baseline + 6 per-input points), its
  within-1-point value with the paired bootstrap interval, and its normalised AUC over the common
  range of the old sweep's AUC ranking, beside the old values read from
  ``inactive_heads/table2.csv`` / ``auc_ranking.csv`` (kept there as measured, now superseded);
* ``mmlu``: Qwen's LTHON(LN) 10 % point on the 500 MMLU sweep questions (~4 h here: a 2 h scoring
  pass for the new thresholds, then ~1.6 h for the point), beside the old point from ``points.csv``;
* ``chat``: Qwen's PIQA (all 1,838) and MMLU (2,000 stratified) baselines with the chat template
  as the authors applied it (multi-turn few-shot), with the signal rule of ``inactive_heads.py``;
* ``dist``: the ``lthon_ln`` rows of ``distributions/wasserstein.csv`` and ``stability.csv`` after
  ``distributions.py`` re-ran, beside the old rows (snapshotted in OUT/distributions_*_old.csv
  before it re-ran).

Results go to OUT (default ``analyses/results/lthon_ln``); the sweep points go to the committed
store ``analyses/results/inactive_heads/store/<model>__<task>`` and every part resumes from it.
"""

from __future__ import annotations

import math
import sys
from dataclasses import replace
from pathlib import Path

import numpy as np
import pandas as pd

sys.path.insert(0, str(Path(__file__).resolve().parent))

from common import Run, base_parser, markdown_table, model_label, out_folder, script_main, split_list, write_csv  # noqa: E402

from lens_heads.sweep.curves import bootstrap_indices, normalised_auc, percentile_interval  # noqa: E402
from lens_heads.data import load_task  # noqa: E402
from lens_heads.errors import LensHeadsError  # noqa: E402
from lens_heads.forward.task_requests import select_records, task_inputs  # noqa: E402
from lens_heads.models import load_model  # noqa: E402
from lens_heads.evaluation.protocol import Protocol  # noqa: E402
from lens_heads.results.store import ResultStore  # noqa: E402
from lens_heads.sweep import SweepConfig, put_thresholds, run_sweep, stored_thresholds  # noqa: E402
from lens_heads.interventions.thresholds import compute_thresholds  # noqa: E402

HERE = Path(__file__).resolve().parent
OLD = HERE / "results" / "inactive_heads"  # the tables measured with the old definition
STORE = OLD / "store"
PARTS = ("piqa", "mmlu", "chat", "dist")
DIST = HERE / "results" / "distributions"  # re-run by distributions.py with the new definition
PIQA_MODELS = "smollm2-135m,gemma-3-270m,qwen2.5-coder-0.5b"
CHAT = Protocol(apply_chat_template=True, fewshot_as_multiturn=True)  # the authors' setting for -Instruct


def parse_args(argv):
    p = base_parser(__doc__.splitlines()[0], "analyses/results/lthon_ln")
    p.set_defaults(models=PIQA_MODELS, dtype="float32")
    p.add_argument("--parts", default="piqa", help=f"comma list of {', '.join(PARTS)} (default piqa)")
    p.add_argument("--sweep-limit", type=int, default=200, help="PIQA sweep questions (default 200)")
    p.add_argument("--sweep-limit-mmlu", type=int, default=500, help="MMLU sweep questions (default 500)")
    p.add_argument("--limit-mmlu", type=int, default=2000, help="MMLU baseline questions (default 2000)")
    p.add_argument("--limit-piqa", type=int, default=None, help="PIQA baseline questions (default all 1,838)")
    p.add_argument("--chat-model", default="qwen2.5-coder-0.5b")
    p.add_argument("--n-boot", type=int, default=1000)
    p.add_argument("--signal-se", type=float, default=2.0)
    args = p.parse_args(argv)
    args.parts = split_list(args.parts, "parts")
    bad = [x for x in args.parts if x not in PARTS]
    if bad:
        raise LensHeadsError(f"unknown part(s) {', '.join(bad)}; choose from {', '.join(PARTS)}")
    args.models = split_list(args.models, "models")
    return args


def old_rows(model: str, task: str) -> tuple[dict | None, dict | None]:
    """The superseded LTHON(LN) rows of the old sweep: Table 2's and the AUC ranking's."""
    def row(name: str) -> dict | None:
        path = OLD / f"{name}.csv"
        if not path.is_file():
            return None
        f = pd.read_csv(path)
        f = f[(f["model"] == model) & (f["task"] == task) & (f["score_fn"] == "lthon_ln")]
        return None if f.empty else f.iloc[0].to_dict()

    return row("table2"), row("auc_ranking")


def piqa_curve(model, label: str, args) -> tuple[dict, pd.DataFrame]:
    task = load_task("piqa")
    cfg = SweepConfig(task="piqa", score_ids=["lthon_ln"], random_seeds=[], limit=args.sweep_limit,
                      batch_size=args.batch_size, n_boot=args.n_boot)
    result = run_sweep(model, cfg, STORE / f"{label}__piqa", task=task, progress=True)
    new = result.within.set_index("score_fn").loc["lthon_ln"]
    table2, auc = old_rows(label, "piqa")
    x_max = float(auc["auc_range_pct"]) if auc else math.nan
    pts = result.summary[result.summary["score_fn"] == "lthon_ln"].sort_values("fraction")
    curve_auc = normalised_auc(pts["pct_zeroed"].to_numpy(), pts["accuracy"].to_numpy(),
                               float(new["base_accuracy"]), x_max)
    row = {"model": label, "task": "piqa", "n_questions": int(pts["n_questions"].iloc[0]),
           "base_accuracy": float(new["base_accuracy"]),
           "old_within_1pt": table2["max_pct_zeroed_within_1pt"] if table2 else math.nan,
           "old_ci_low": table2["ci_low"] if table2 else math.nan,
           "old_ci_high": table2["ci_high"] if table2 else math.nan,
           "new_within_1pt": float(new["max_pct_zeroed_within_1pt"]),
           "new_ci_low": float(new["ci_low"]), "new_ci_high": float(new["ci_high"]),
           "old_auc": auc["auc"] if auc else math.nan, "new_auc_same_range": curve_auc,
           "auc_range_pct": x_max, "old_rank_by_auc": auc["rank_by_auc"] if auc and "rank_by_auc" in auc else math.nan,
           "old_base_accuracy": table2["base_accuracy"] if table2 else math.nan}
    pts = pts.assign(model=label, task="piqa")[["model", "task", "fraction", "threshold", "pct_zeroed", "accuracy",
                                                "delta", "delta_ci_low", "delta_ci_high", "spec"]]
    return row, pts


def mmlu_point(model, label: str, args) -> dict:
    """The 10 % point only; its scoring pass stores LTHON(LN)'s thresholds at every fraction of
    the running Qwen/MMLU sweep, so that sweep's other points can use them too."""
    task = load_task("mmlu")
    store_dir = STORE / f"{label}__mmlu"
    full = SweepConfig(task="mmlu", score_ids=["lthon_ln"], random_seeds=[], limit=args.sweep_limit_mmlu,
                       batch_size=args.batch_size, n_boot=args.n_boot)
    full.validate()
    store, identity = ResultStore(store_dir), full.identity(model, task)
    if stored_thresholds(store, identity, full) is None:
        inputs = task_inputs(model, task, None, full.limit, full.seed, full.protocol)
        put_thresholds(store, identity, full, compute_thresholds(model, inputs, full.score_ids, full.fractions,
                                                             full.threshold_batch_size,
                                                             rule=full.protocol.threshold_rule), len(inputs))
    cfg = replace(full, fractions=[0.0, 0.1])
    result = run_sweep(model, cfg, store_dir, task=task, progress=True)
    pt = result.summary[(result.summary["score_fn"] == "lthon_ln") & (result.summary["fraction"] == 0.1)].iloc[0]
    old = pd.read_csv(OLD / "points.csv")
    old = old[(old["model"] == label) & (old["task"] == "mmlu") & (old["score_fn"] == "lthon_ln")]
    o = old.iloc[0].to_dict() if len(old) else {}
    return {"model": label, "task": "mmlu", "fraction": 0.1, "old_pct_zeroed": o.get("pct_zeroed", math.nan),
            "old_delta_pt": o.get("delta_pt", math.nan), "new_pct_zeroed": float(pt["pct_zeroed"]),
            "new_accuracy": float(pt["accuracy"]), "new_delta_pt": 100 * float(pt["delta"]),
            "new_delta_ci_low_pt": 100 * float(pt["delta_ci_low"]),
            "new_delta_ci_high_pt": 100 * float(pt["delta_ci_high"])}


def signal_stats(task, rec: dict, limit, args) -> dict:
    """The signal rule of inactive_heads.py (a): accuracy - chance > signal_se x bootstrap SE."""
    correct = np.array([float(q.correct) for q in rec.questions])
    boot = correct[bootstrap_indices(len(correct), args.n_boot, 0)].mean(1)
    chance = float(np.mean([1.0 / len(r.choices) for r in select_records(task, limit, 1234)]))
    acc, se = rec.accuracy, float(boot.std(ddof=1))
    lo, hi = percentile_interval(boot)
    return {"accuracy": acc, "boot_se": se, "ci_low": lo, "ci_high": hi, "chance": chance,
            "z": (acc - chance) / se, "signal": bool(acc - chance > args.signal_se * se),
            "n_questions": len(correct), "eval_min": float(rec.eval_config["seconds"]) / 60}


def plain_row(label: str, task: str, n: int) -> dict:
    """The plain-prompt baseline of ``inactive_heads.py`` on as many questions: (a) for the full
    sizes, (b) for a sweep's own questions."""
    for name in ("baseline", "sweep_baseline"):
        f = pd.read_csv(OLD / f"{name}.csv")
        f = f[(f["model"] == label) & (f["task"] == task) & (f["n_questions"] == n)]
        if len(f):
            return f.iloc[0].to_dict()
    return {}


def chat_baselines(model, label: str, args, out: Path) -> pd.DataFrame:
    """Rows merge into OUT/chat_baselines.csv by (task, questions), so sizes can be added."""
    rows = []
    for tname, limit in (("piqa", args.limit_piqa), ("mmlu", args.limit_mmlu)):
        task = load_task(tname)
        cfg = SweepConfig(task=tname, score_ids=[], fractions=[0.0], random_seeds=[0], limit=limit,
                          batch_size=args.batch_size, n_boot=args.n_boot, protocol=CHAT)
        rec = run_sweep(model, cfg, STORE / f"{label}__{tname}", task=task, progress=True).records["none"]
        chat = signal_stats(task, rec, limit, args)
        p = plain_row(label, tname, chat["n_questions"])
        rows.append({"model": label, "task": tname, "n_questions": chat["n_questions"], "protocol": str(CHAT),
                     **{f"chat_{k}": v for k, v in chat.items() if k != "n_questions"},
                     "plain_accuracy": p.get("accuracy", math.nan), "plain_z": p.get("z", math.nan),
                     "plain_signal": p.get("signal", math.nan),
                     "same_decision": bool(p) and bool(p.get("signal")) == chat["signal"]})
        print(f"  {label}/{tname} with the chat template: acc {chat['accuracy']:.4f} (z {chat['z']:.1f}; "
              f"plain {p.get('accuracy', math.nan):.4f}, {chat['n_questions']} questions)", flush=True)
    new = pd.DataFrame(rows)
    path = out / "chat_baselines.csv"
    if path.is_file():
        old = pd.read_csv(path)
        keep = ~old.set_index(["task", "n_questions"]).index.isin(new.set_index(["task", "n_questions"]).index)
        new = pd.concat([old[keep], new], ignore_index=True).sort_values(["task", "n_questions"], ignore_index=True)
    return new


def distribution_rows(out: Path) -> tuple[pd.DataFrame, pd.DataFrame]:
    """Old and new ``lthon_ln`` rows of the distributions tables, side by side."""
    keys = {"wasserstein": ["comparison", "dataset", "model", "a", "b"], "stability": ["model"]}
    value = {"wasserstein": ["w_raw", "w_scaled"], "stability": ["w_datasets_scaled", "w_models_mean_scaled", "ratio"]}
    frames = []
    for name in ("wasserstein", "stability"):
        old = pd.read_csv(out / f"distributions_{name}_old.csv")
        new = pd.read_csv(DIST / f"{name}.csv")
        new = new[new["score_fn"] == "lthon_ln"]
        both = old[keys[name] + value[name]].merge(new[keys[name] + value[name]], on=keys[name], how="outer",
                                                   suffixes=("_old", "_new"))
        frames.append(both)
    return frames[0], frames[1]


def main(argv=None) -> int:
    args = parse_args(argv)
    out = out_folder(args.out)
    run = Run.start(out, args.device, __file__, argv)
    sections = []
    if "piqa" in args.parts:
        rows, points = [], []
        for spec in args.models:
            label = model_label(spec)
            print(f"{label}: PIQA LTHON(LN) curve (authors' definition)", flush=True)
            model = load_model(spec, dtype=args.dtype, device=args.device)
            row, pts = piqa_curve(model, label, args)
            rows.append(row)
            points.append(pts)
            write_csv(pd.DataFrame(rows), out / "piqa_within_1pt.csv")
            write_csv(pd.concat(points), out / "piqa_points.csv")
            print(f"  within 1 point: {row['old_within_1pt']:.1f} % (old) -> {row['new_within_1pt']:.1f} % "
                  f"[{row['new_ci_low']:.1f}, {row['new_ci_high']:.1f}] (new)", flush=True)
        run.keep_section("piqa", "LTHON(LN) on the PIQA sweeps: old (text's reading) vs new (authors' code)",
                         markdown_table(pd.DataFrame(rows), 3) + "\n\nPoints:\n\n"
                         + markdown_table(pd.concat(points), 4))
    if "mmlu" in args.parts:
        label = model_label(args.chat_model)
        model = load_model(args.chat_model, dtype=args.dtype, device=args.device)
        row = mmlu_point(model, label, args)
        write_csv(pd.DataFrame([row]), out / "mmlu_point.csv")
        run.keep_section("mmlu", "LTHON(LN) at 10 % on Qwen/MMLU (500 questions): old vs new",
                         markdown_table(pd.DataFrame([row]), 2))
    if "chat" in args.parts:
        label = model_label(args.chat_model)
        model = load_model(args.chat_model, dtype=args.dtype, device=args.device)
        rows = chat_baselines(model, label, args, out)
        write_csv(rows, out / "chat_baselines.csv")
        run.keep_section("chat", "Baselines with the chat template (multi-turn few-shot, as the authors ran "
                                 "-Instruct models) against the plain prompts on the same questions",
                         markdown_table(rows, 4))
    if "dist" in args.parts:
        wass, stab = distribution_rows(out)
        write_csv(wass, out / "distributions_wasserstein.csv")
        write_csv(stab, out / "distributions_stability.csv")
        run.keep_section("dist", "lthon_ln score distributions (distributions.py, re-run): old vs new",
                         "Wasserstein distances (scaled):\n\n" + markdown_table(wass, 4)
                         + "\n\nStability (datasets vs models):\n\n" + markdown_table(stab, 4))
    run.write_summary("LTHON(LN) as the authors compute it, and chat-template baselines",
                      run.kept_sections(PARTS))
    return 0


if __name__ == "__main__":
    script_main(main)
