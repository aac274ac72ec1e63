"""Score distributions and Wasserstein distances: between models, and between datasets.

    HF_HUB_OFFLINE=1 HF_DATASETS_OFFLINE=1 python analyses/distributions.py \\
        --models smollm2-135m,qwen2.5-coder-0.5b,gemma-3-270m --corpus c4 --n-inputs 64 --max-len 256 \\
        --task mmlu --task-limit 64 --dataset-models smollm2-135m --out analyses/results/distributions

What is compared: for every model and score function, the *per-input* values pooled over
inputs x layers x heads (``score_heads(..., keep_per_input=True)``), on

* the corpus (C4 validation texts, truncated to --max-len tokens) for every model, and
* the task's prompts (MMLU 5-shot prompts as evaluated, truncated to --task-max-len tokens,
  default the same --max-len, so that length does not stand in for dataset) for the
  --dataset-models.

Normalisation: 1-Wasserstein distance is in the units of the score, and raw norms differ
between models (d_head, residual scale). Every function's values are therefore divided by
that model's mean of the function over its pooled corpus values ("scaled" columns): the
values become dimensionless, a dead head stays near 0, and the *same* divisor is used for
both datasets of a model, so a shift between datasets stays visible. For the ``_ln`` functions
the divisor is ~1 (their mean over a layer's heads is 1 on every input), i.e. they are already
normalised this way, per layer. Raw distances are kept too.

Stability (the paper's claim that AHON(LN) is stable across datasets, tested against AWFT):
for a model and function, ratio = W_scaled(corpus, task) / mean over model pairs of
W_scaled(model_i, model_j) on the corpus. A smaller ratio = more stable across datasets
relative to how much the function tells models apart. Bootstrap intervals resample inputs.

Outputs (OUT): wasserstein.csv, stability.csv, figures/*.png, scores/ (cached per-input
scores: a rerun reuses them when model, dtype and tokens match), summary.md.
"""

from __future__ import annotations

import gc
import itertools
import math
import sys
from pathlib import Path

import numpy as np
import pandas as pd

sys.path.insert(0, str(Path(__file__).resolve().parent))

from common import Run, base_parser, check_positive, markdown_table, model_label, out_folder, script_main, \
    split_list, write_csv, write_figure  # noqa: E402

from lens_heads.models import load_model  # noqa: E402
from lens_heads.models import check_device  # noqa: E402
from lens_heads.data import load_task, load_texts, tokenize_texts  # noqa: E402
from lens_heads.errors import LensHeadsError  # noqa: E402
from lens_heads.forward.task_requests import task_inputs  # noqa: E402
from lens_heads.scores import (HeadScores, prepare_inputs, resolve_score_ids, revision_key, score_heads,  # noqa: E402
                               score_metadata, wasserstein_distances)
from lens_heads.viz import distance_heatmap, score_distributions  # noqa: E402

KEY_FUNCTIONS = ("ahon_ln", "awft")  # the paper's stability claim: AHON(LN) vs AWFT


def parse_args(argv):
    p = base_parser(__doc__, "analyses/results/distributions")
    p.add_argument("--corpus", default="c4", help="reference corpus (c4, c4-train, wikitext2 or a file)")
    p.add_argument("--n-inputs", type=int, default=64, help="corpus texts (default 64)")
    p.add_argument("--max-len", type=int, default=256, help="tokens per corpus text (default 256)")
    p.add_argument("--task", default="mmlu", help="second dataset: a task whose prompts are scored (default mmlu)")
    p.add_argument("--task-limit", type=int, default=64, help="task questions (stratified; default 64)")
    p.add_argument("--task-max-len", type=int, default=None,
                   help="tokens per task prompt (default: --max-len; 0 = whole prompts)")
    p.add_argument("--dataset-models", default=None,
                   help="models compared across the two datasets (comma list, 'all'; default: the first model)")
    p.add_argument("--scores", default="paper", help="score functions (default: the paper's 12)")
    p.add_argument("--n-boot", type=int, default=200, help="bootstrap resamples of inputs for the ratios")
    args = p.parse_args(argv)
    args.device = check_device(args.device)  # before any folder is made
    check_positive(args, "n_inputs", "max_len", "task_limit", "batch_size", "n_boot")
    args.models = split_list(args.models, "models")
    args.score_ids = resolve_score_ids(args.scores)
    if args.dataset_models in (None, ""):
        args.dataset_models = args.models[:1]
    elif args.dataset_models == "all":
        args.dataset_models = list(args.models)
    else:
        args.dataset_models = split_list(args.dataset_models, "dataset models")
        unknown = [m for m in args.dataset_models if m not in args.models]
        if unknown:
            raise LensHeadsError(f"--dataset-models {', '.join(unknown)} not among --models")
    if args.task_max_len is None:
        args.task_max_len = args.max_len
    return args


# -----------------------------------------------------------------------------
# Scores, cached per (model, dataset)


def cached_scores(model, seqs, max_len, data: str, score_ids, path: Path, batch_size: int) -> HeadScores:
    """Per-input scores of ``seqs``; reused from ``path`` when model, dtype, tokens and ids match."""
    seqs = prepare_inputs(model, seqs, max_len)
    want = score_metadata(model, seqs, max_len, data)
    if path.is_file():
        hs = HeadScores.load(path)
        same = all(hs.meta.get(k) == want[k] for k in ("model_digest", "dtype", "tokens_sha256"))
        same = same and hs.meta.get("score_revisions", {}) == revision_key(hs.score_ids)  # no old definitions
        if same and hs.per_input is not None and set(score_ids) <= set(hs.per_input):
            return hs
    hs = score_heads(model, seqs, scores=score_ids, batch_size=batch_size, max_len=max_len, keep_per_input=True,
                     progress=True, data=data)
    path.parent.mkdir(parents=True, exist_ok=True)
    hs.save(path)
    return hs


def pooled(hs: HeadScores, sid: str, rows=None) -> np.ndarray:
    """Values over inputs x layers x heads (optionally of the inputs ``rows``), NaNs dropped."""
    v = hs.per_input[sid].double().numpy()
    v = (v if rows is None else v[rows]).ravel()
    return v[np.isfinite(v)]


def w1(a: np.ndarray, b: np.ndarray) -> float:
    from scipy.stats import wasserstein_distance

    return float(wasserstein_distance(a, b))


# -----------------------------------------------------------------------------
# main


def main(argv=None) -> int:
    args = parse_args(argv)
    texts = load_texts(args.corpus, n=args.n_inputs)
    if not texts:
        raise LensHeadsError(f"corpus {args.corpus!r} gave no texts")
    task = load_task(args.task)
    out = out_folder(args.out)
    run = Run.start(out, args.device, __file__, argv)
    corpus, tname = model_label(Path(args.corpus).stem if Path(args.corpus).is_file() else args.corpus), task.name
    task_len = args.task_max_len or None

    corpus_scores: dict[str, HeadScores] = {}
    task_scores: dict[str, HeadScores] = {}
    lengths, dtypes = [], {}
    for spec in args.models:
        label = model_label(spec)
        model = load_model(spec, dtype=args.dtype, device=args.device)
        dtypes[label] = str(model.dtype).removeprefix("torch.")
        print(f"{label}: scoring {len(texts)} {corpus} texts ({run.elapsed():.0f} s)", flush=True)
        seqs = tokenize_texts(model.tokenizer, texts, args.max_len)
        corpus_scores[label] = cached_scores(model, seqs, args.max_len, corpus, args.score_ids,
                                             out / "scores" / f"{label}__{corpus}.csv", args.batch_size)
        lengths.append({"model": label, "dataset": corpus, "n_inputs": len(seqs),
                        "mean_tokens": float(np.mean([min(len(s), args.max_len) for s in seqs]))})
        if spec in args.dataset_models:
            prompts = task_inputs(model, task, None, args.task_limit)
            print(f"{label}: scoring {len(prompts)} {tname} prompts ({run.elapsed():.0f} s)", flush=True)
            task_scores[label] = cached_scores(model, prompts, task_len, tname, args.score_ids,
                                               out / "scores" / f"{label}__{tname}.csv", args.batch_size)
            lengths.append({"model": label, "dataset": tname, "n_inputs": len(prompts),
                            "mean_tokens": float(np.mean([len(p) if task_len is None else min(len(p), task_len)
                                                          for p in prompts]))})
        del model
        gc.collect()

    # per (model, function): divide by the mean of the model's pooled corpus values
    scale = {(m, sid): float(np.mean(pooled(hs, sid))) for m, hs in corpus_scores.items() for sid in args.score_ids}
    labels = list(corpus_scores)
    rows = []
    for sid in args.score_ids:
        raw = {m: pooled(corpus_scores[m], sid) for m in labels}
        if len(labels) >= 2:
            mat_raw = wasserstein_distances(raw)
            mat_scaled = wasserstein_distances({m: raw[m] / scale[m, sid] for m in labels})
            if sid in KEY_FUNCTIONS:
                fig = distance_heatmap(mat_scaled)
                fig.suptitle(f"{sid}, scaled, on {corpus}")
                write_figure(fig, out / "figures" / f"wasserstein_models_{sid}.png")
            for a, b in itertools.combinations(labels, 2):
                rows.append({"score_fn": sid, "comparison": "models", "dataset": corpus, "model": "", "a": a, "b": b,
                             "w_raw": mat_raw.loc[a, b], "w_scaled": mat_scaled.loc[a, b]})
        for m, hs in task_scores.items():
            t = pooled(hs, sid)
            mat_raw = wasserstein_distances({corpus: raw[m], tname: t})
            mat_scaled = wasserstein_distances({corpus: raw[m] / scale[m, sid], tname: t / scale[m, sid]})
            rows.append({"score_fn": sid, "comparison": "datasets", "dataset": "", "model": m, "a": corpus,
                         "b": tname, "w_raw": mat_raw.loc[corpus, tname], "w_scaled": mat_scaled.loc[corpus, tname]})
    wass = pd.DataFrame(rows, columns=["score_fn", "comparison", "dataset", "model", "a", "b", "w_raw", "w_scaled"])
    write_csv(wass, out / "wasserstein.csv")

    stability = stability_table(args, wass, corpus_scores, task_scores, scale)
    write_csv(stability, out / "stability.csv")
    write_csv(pd.DataFrame(lengths), out / "inputs.csv")

    # figures: pooled scaled values per model on the corpus; corpus vs task per dataset model
    def frame(hs, m):
        return pd.DataFrame({"score_fn": np.concatenate([[sid] * len(pooled(hs, sid)) for sid in args.score_ids]),
                             "value": np.concatenate([pooled(hs, sid) / scale[m, sid] for sid in args.score_ids])})

    fig = score_distributions({m: frame(hs, m) for m, hs in corpus_scores.items()}, args.score_ids)
    write_figure(fig, out / "figures" / f"distributions_{corpus}.png")
    for m, hs in task_scores.items():
        fig = score_distributions({corpus: frame(corpus_scores[m], m), tname: frame(hs, m)}, args.score_ids,
                                  kind="hist")
        write_figure(fig, out / "figures" / f"datasets_{m}.png")

    run.write_summary("Score distributions and Wasserstein distances", summary_sections(
        args, corpus, tname, wass, stability, pd.DataFrame(lengths), dtypes))
    print(f"wrote {out} in {run.elapsed():.0f} s", flush=True)
    return 0


def stability_table(args, wass, corpus_scores, task_scores, scale) -> pd.DataFrame:
    """Per dataset-model and function: W(datasets) / mean W(models), with a bootstrap over inputs."""
    labels = list(corpus_scores)
    rng = np.random.default_rng(0)
    rows = []
    for m, hs_t in task_scores.items():
        for sid in args.score_ids:
            sel = wass[(wass.score_fn == sid)]
            w_d = float(sel.loc[(sel.comparison == "datasets") & (sel.model == m), "w_scaled"].iloc[0])
            between = sel.loc[sel.comparison == "models", "w_scaled"]
            w_m = float(between.mean()) if len(between) else math.nan
            row = {"model": m, "score_fn": sid, "w_datasets_scaled": w_d, "w_models_mean_scaled": w_m,
                   "ratio": w_d / w_m if w_m > 0 else math.nan, "ratio_ci_low": math.nan, "ratio_ci_high": math.nan}
            if sid in KEY_FUNCTIONS and len(labels) >= 2:
                ratios = []
                for _ in range(args.n_boot):  # resample inputs of every sample independently
                    draw = {k: rng.integers(0, hs.n, hs.n) for k, hs in corpus_scores.items()}
                    c = {k: pooled(hs, sid, draw[k]) / scale[k, sid] for k, hs in corpus_scores.items()}
                    t = pooled(hs_t, sid, rng.integers(0, hs_t.n, hs_t.n)) / scale[m, sid]
                    wm = np.mean([w1(c[a], c[b]) for a, b in itertools.combinations(labels, 2)])
                    ratios.append(w1(c[m], t) / wm)
                row["ratio_ci_low"], row["ratio_ci_high"] = np.quantile(ratios, [0.025, 0.975])
            rows.append(row)
    return pd.DataFrame(rows, columns=["model", "score_fn", "w_datasets_scaled", "w_models_mean_scaled", "ratio",
                                       "ratio_ci_low", "ratio_ci_high"])


def summary_sections(args, corpus, tname, wass, stability, lengths, dtypes):
    yield "Sizes and settings", (
        f"models: {', '.join(f'{k} ({v})' for k, v in dtypes.items())}; corpus {corpus}: {args.n_inputs} texts "
        f"<= {args.max_len} tokens; second dataset {tname}: {args.task_limit} questions' prompts as evaluated "
        f"(task's default shots), truncated to {args.task_max_len or 'no limit'} tokens, for "
        f"{', '.join(model_label(m) for m in args.dataset_models)}; functions: {', '.join(args.score_ids)}.\n\n"
        + markdown_table(lengths, 1))
    yield "Normalisation", (
        "Per-input values pooled over inputs x layers x heads. Each (model, function) is divided by the mean of "
        f"that model's pooled {corpus} values (the same divisor for both datasets of a model); `_ln` functions "
        "have divisor ~1. 1-Wasserstein distances of the scaled values are in `w_scaled`, of the raw values in "
        "`w_raw` (wasserstein.csv).")
    between = wass[wass.comparison == "models"]
    if len(between):
        mean_w = between.groupby("score_fn", sort=False)["w_scaled"].mean().reset_index()
        yield f"Between models (on {corpus}, mean over model pairs, scaled)", markdown_table(mean_w, 4)
    if len(stability):
        yield "Stability across datasets", (
            f"ratio = W({corpus}, {tname}) / mean W(model_i, model_j); smaller = more stable relative to the "
            "differences between models. 95% percentile bootstrap intervals (inputs resampled) for the key functions; "
            "resampling adds noise that raises every Wasserstein distance, so with few inputs the interval can sit "
            "beside the point estimate: read the intervals as indicative.\n\n"
            + markdown_table(stability, 4) + "\n\n" + "\n".join(verdicts(stability)))


def verdicts(stability: pd.DataFrame):
    a, b = KEY_FUNCTIONS
    for m, grp in stability.groupby("model", sort=False):
        g = grp.set_index("score_fn")
        if a not in g.index or b not in g.index or not np.isfinite(g.loc[a, "ratio"]) or not np.isfinite(g.loc[b, "ratio"]):
            yield f"- {m}: the comparison of {a} and {b} needs both functions and at least two models."
            continue
        ra, rb = g.loc[a, "ratio"], g.loc[b, "ratio"]
        separated = g.loc[a, "ratio_ci_high"] < g.loc[b, "ratio_ci_low"] or g.loc[b, "ratio_ci_high"] < g.loc[a, "ratio_ci_low"]
        more = a if ra < rb else b
        yield (f"- {m}: ratio {a} {ra:.3f} vs {b} {rb:.3f}: {more} is more stable across datasets "
               f"({'intervals do not overlap' if separated else 'intervals overlap: not a clear difference'}); "
               f"the paper's claim (AHON(LN) stable) {'is supported' if more == a and separated else 'is not clearly supported'} "
               "by this measure.")


if __name__ == "__main__":
    script_main(main)
