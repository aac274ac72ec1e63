"""One self-contained HTML report of a model's heads: scores, sweep, diagnosis, patterns.

``build_report(ReportConfig(...))`` reuses saved results (scores table, sweep folder,
diagnosis CSV) and computes what is missing: scores with ``lens_heads.scores.score_heads``,
the diagnosis with ``lens_heads.diagnose.diagnose`` and, only when a task is given, a sweep
with ``lens_heads.sweep``. Those modules are imported lazily, so the report works with what
is installed. The page needs no network: figures are PNGs in ``data:`` URIs and the
circuitsvis bundle is inlined once, in ``<head>``; every attention view only mounts into it.

Every input is checked before the model is run, and the file is written atomically.
"""

from __future__ import annotations

import base64
import html
import io
import math
import os
import time
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Sequence

import numpy as np
import pandas as pd

from lens_heads.errors import LensHeadsError
from lens_heads.viz import (
    AttentionView,
    attention_heads,
    bundle_script,
    canonical_class,
    class_label,
    diagnosis_map,
    head_label,
    parse_heads,
    read_sweep,
    score_distributions,
    score_heatmap,
    sweep_curves,
)
from lens_heads.atomic import atomic_write_text
from lens_heads.provenance import package_versions

KEY_SCORE = "ahon_ln"  # the paper's most often best function: picks the heads to show
SINK_CLASSES = ("dead", "bos_sink")
WITHIN_COLUMNS = ("score_fn", "max_pct_zeroed_within_1pt", "ci_low", "ci_high", "auc", "auc_ci_low", "auc_ci_high",
                  "rank_by_auc", "seed_min", "seed_max", "note")
VERSION_PACKAGES = ("lens_heads", "torch", "transformer_lens", "transformers", "circuitsvis", "matplotlib",
                    "pandas", "numpy")


@dataclass
class ReportConfig:
    model: str
    out: str = "report.html"
    data: str = "c4"
    n_inputs: int = 16
    max_len: int = 128
    task: str | None = None  # run a sweep on this task when no --sweep folder is given
    limit: int | None = None  # questions of the task for that sweep
    sweep_scores: str = "awft,ahon_ln,lthon_ln"  # score functions of that sweep
    sweep_fractions: Sequence[float] | None = None  # its target fractions (None: the sweep's default)
    sweep_seeds: int = 3  # its random-head seeds 0..N-1
    sweep: str | None = None  # folder with summary.csv (+ within_1pt.csv)
    diagnosis: str | None = None  # diagnosis CSV
    scores: str | None = None  # scores table (.csv/.parquet)
    top_k: int = 4  # heads per view: k most inactive, k most active by KEY_SCORE
    heads: str | None = None  # extra heads to show, "3.1,4.2"
    max_sink_views: int = 8  # cap on BOS-sink / DEAD heads shown
    view_tokens: int = 40  # tokens of the text the attention views show
    heatmaps: Sequence[str] = ("ahon_ln", "awft")
    dtype: str = "float32"
    device: str = "cpu"
    batch_size: int = 8
    progress: bool = True
    protocol: dict = field(default_factory=dict)  # resolve_protocol settings for that sweep (paper=..., ...)


@dataclass
class Section:
    title: str
    body: str
    anchor: str = ""


@dataclass
class ReportInputs:
    """What the report shows, whether read from files or computed."""

    scores: pd.DataFrame
    diagnosis: pd.DataFrame
    summary: pd.DataFrame | None = None
    within: pd.DataFrame | None = None
    sources: dict[str, str] = field(default_factory=dict)  # "scores" -> "file X" | "computed ..."


# -----------------------------------------------------------------------------
# Checking inputs (before any model work)


def check_config(cfg: ReportConfig) -> None:
    out = Path(cfg.out)
    if out.is_dir():
        raise LensHeadsError(f"--out {out} is a folder; give a file name such as {out / 'report.html'}")
    if not out.parent.is_dir():
        raise LensHeadsError(f"cannot write {out}: folder {out.parent} does not exist")
    if out.suffix.lower() not in (".html", ".htm"):
        raise LensHeadsError(f"--out must end in .html, got {out.name!r}")
    for name in ("top_k", "n_inputs", "max_len", "batch_size", "view_tokens"):
        if getattr(cfg, name) < 1:
            raise LensHeadsError(f"{name.replace('_', '-')} must be >= 1, got {getattr(cfg, name)}")
    if cfg.max_sink_views < 0:
        raise LensHeadsError(f"max-sink-views must be >= 0, got {cfg.max_sink_views}")
    if cfg.limit is not None and cfg.limit < 1:
        raise LensHeadsError(f"limit must be >= 1, got {cfg.limit}")
    if cfg.limit is not None and not cfg.task:
        raise LensHeadsError("--limit needs --task")
    if cfg.task and not cfg.sweep:
        from lens_heads.data import load_task
        from lens_heads.scores import resolve_score_ids

        resolve_score_ids(cfg.sweep_scores)
        load_task(cfg.task)  # an unknown task fails here, before the model is loaded
    if cfg.sweep is not None:
        sweep = Path(cfg.sweep)
        if not sweep.exists():
            raise LensHeadsError(f"sweep folder not found: {sweep}")
        if sweep.is_dir() and not any(sweep.iterdir()):
            raise LensHeadsError(f"sweep folder {sweep} is empty (expected summary.csv from 'lens-heads sweep')")


def read_scores(path: str | os.PathLike) -> pd.DataFrame:
    path = Path(path)
    if not path.is_file():
        raise LensHeadsError(f"scores file not found: {path}")
    try:
        frame = pd.read_parquet(path) if path.suffix.lower() == ".parquet" else pd.read_csv(path)
    except (pd.errors.EmptyDataError, pd.errors.ParserError, ValueError, OSError) as exc:
        raise LensHeadsError(f"cannot read scores file {path}: {str(exc).splitlines()[0]}") from None
    missing = {"layer", "head", "score_fn", "value"} - set(frame.columns)
    if missing or frame.empty:
        raise LensHeadsError(f"{path} is not a scores table (needs rows with columns layer, head, score_fn, value)")
    return frame


def read_diagnosis(path: str | os.PathLike) -> pd.DataFrame:
    path = Path(path)
    if not path.is_file():
        raise LensHeadsError(f"diagnosis file not found: {path}")
    try:
        frame = pd.read_csv(path)
    except (pd.errors.EmptyDataError, pd.errors.ParserError, OSError) as exc:
        raise LensHeadsError(f"cannot read diagnosis file {path}: {str(exc).splitlines()[0]}") from None
    missing = {"layer", "head", "bos_mass", "class"} - set(frame.columns)
    if missing or frame.empty:
        raise LensHeadsError(f"{path} is not a diagnosis table (needs rows with columns layer, head, "
                             f"bos_mass, entropy, class)")
    return frame


def _check_shape(frame: pd.DataFrame, geometry, what: str) -> None:
    L, H = int(frame["layer"].max()) + 1, int(frame["head"].max()) + 1
    if L != geometry.n_layers or H != geometry.n_heads:
        raise LensHeadsError(f"{what} covers {L} layers x {H} heads but the model has "
                             f"{geometry.n_layers} x {geometry.n_heads}: is it for another model?")


# -----------------------------------------------------------------------------
# Gathering results


def gather(cfg: ReportConfig, model, inputs) -> ReportInputs:
    """Read the saved results the config names and compute the missing ones."""
    g = model.geometry
    src: dict[str, str] = {}
    if cfg.scores:
        scores = read_scores(cfg.scores)
        src["scores"] = f"file {cfg.scores}"
    else:
        from lens_heads.scores import score_heads

        scores = score_heads(model, inputs, "all", batch_size=cfg.batch_size, progress=cfg.progress).to_frame()
        src["scores"] = f"computed on {len(inputs)} {cfg.data} inputs"
    _check_shape(scores, g, "the scores table")
    if cfg.diagnosis:
        diagnosis = read_diagnosis(cfg.diagnosis)
        src["diagnosis"] = f"file {cfg.diagnosis}"
    else:
        from lens_heads.diagnose import diagnose

        diagnosis = diagnose(model, inputs, batch_size=cfg.batch_size).to_frame()
        src["diagnosis"] = f"computed on {len(inputs)} {cfg.data} inputs"
    _check_shape(diagnosis, g, "the diagnosis table")
    summary = within = None
    if cfg.sweep:
        summary, within = read_sweep(cfg.sweep)
        src["sweep"] = f"folder {cfg.sweep}"
    elif cfg.task:
        summary, within = run_sweep(cfg, model)
        src["sweep"] = f"computed on {cfg.task}" + (f", {cfg.limit} questions" if cfg.limit else "")
    if summary is not None and within is None:
        within = within_from_summary(summary)
    return ReportInputs(scores, diagnosis, summary, within, src)


def sweep_dir(cfg: ReportConfig) -> Path:
    """Where a sweep run for the report is stored (beside the report; rerunning resumes it)."""
    out = Path(cfg.out)
    return out.with_name(out.stem + "_sweep")


def run_sweep(cfg: ReportConfig, model) -> tuple[pd.DataFrame, pd.DataFrame | None]:
    """Run (or resume) a sweep with ``lens_heads.sweep`` into ``sweep_dir(cfg)``, then read it."""
    try:
        from lens_heads.sweep import SweepConfig, run_sweep as run
    except ImportError:
        raise LensHeadsError("--task needs lens_heads.sweep, which this installation lacks; "
                             "pass a finished sweep with --sweep DIR instead") from None
    from lens_heads.scores import resolve_score_ids

    from lens_heads.protocol import resolve_protocol

    scfg = SweepConfig(task=cfg.task, score_ids=resolve_score_ids(cfg.sweep_scores), limit=cfg.limit,
                       random_seeds=list(range(cfg.sweep_seeds)), batch_size=max(cfg.batch_size, 1),
                       protocol=resolve_protocol(model, **cfg.protocol))
    if cfg.sweep_fractions is not None:
        scfg.fractions = list(cfg.sweep_fractions)
    result = run(model, scfg, sweep_dir(cfg), progress=cfg.progress)
    return result.summary, result.within


def within_from_summary(summary: pd.DataFrame) -> pd.DataFrame | None:
    """within-1-point and AUC per function from a summary (when the sweep folder lacks the table);
    a score tied across heads gets no values, as in ``sweep.tables``."""
    from lens_heads.curves import max_within, normalised_auc
    from lens_heads.sweep import TIED_NOTE, thresholds_tie
    from lens_heads.viz import base_accuracy, random_baseline

    base = base_accuracy(summary)
    if not np.isfinite(base):
        return None
    tol = 1.0 if summary["accuracy"].max() > 1.0 else 0.01
    curves, tied = {}, set()
    for fn, rows in summary.groupby("score_fn", sort=False):
        if fn in ("random", "none"):
            continue
        if "threshold" in rows and thresholds_tie(rows.loc[rows["fraction"] > 0, "threshold"].dropna()):
            tied.add(fn)
        curves[fn] = (rows["pct_zeroed"].to_numpy(float), rows["accuracy"].to_numpy(float))
    rnd = random_baseline(summary)
    if not rnd.empty:
        curves["random"] = (rnd["pct_zeroed"].to_numpy(float), rnd["accuracy"].to_numpy(float))
    if not curves:
        return None
    x_max = min((float(x.max()) for fn, (x, _) in curves.items() if fn not in tied), default=math.nan)
    rows = [dict(score_fn=fn, max_pct_zeroed_within_1pt=math.nan, auc=math.nan,
                 note=TIED_NOTE) if fn in tied else
            dict(score_fn=fn, max_pct_zeroed_within_1pt=max_within(np.r_[0.0, x], np.r_[base, y], base, tol),
                 auc=normalised_auc(np.r_[0.0, x], np.r_[base, y], base, x_max), note="")
            for fn, (x, y) in curves.items()]
    return pd.DataFrame(rows)


# -----------------------------------------------------------------------------
# Choosing heads to show


def pick_heads(scores: pd.DataFrame, score_fn: str, k: int) -> tuple[list[tuple[int, int]], list[tuple[int, int]]]:
    """(k most inactive, k most active) heads by ``score_fn`` (direction from the registry)."""
    from lens_heads.viz.figures import inactive_when

    sub = scores[scores["score_fn"] == score_fn].dropna(subset=["value"])
    if sub.empty:
        return [], []
    when = inactive_when(score_fn) or "low"
    ordered = sub.sort_values("value", ascending=(when == "low"), kind="stable")
    heads = [(int(r.layer), int(r.head)) for r in ordered.itertuples()]
    k = min(k, len(heads) // 2 or 1)
    return heads[:k], heads[::-1][:k]


SHORT_CLASS = {"dead": "DEAD", "bos_sink": "sink", "low_entropy": "low-H", "local": "local", "healthy": "ok"}


def head_table(scores: pd.DataFrame, diagnosis: pd.DataFrame, score_fn: str) -> pd.DataFrame:
    """One row per head: layer, head, name, score value, class, BOS mass, entropy."""
    vals = scores[scores["score_fn"] == score_fn][["layer", "head", "value"]].rename(columns={"value": score_fn})
    diag = diagnosis[["layer", "head", "class", "bos_mass"] + (["entropy"] if "entropy" in diagnosis else [])]
    table = diag.merge(vals, on=["layer", "head"], how="left")
    table.insert(2, "name", [head_label(int(L), int(h)) for L, h in zip(table["layer"], table["head"])])
    table["class"] = table["class"].map(class_label)
    return table


def head_titles(table: pd.DataFrame, score_fn: str) -> dict[tuple[int, int], str]:
    """Compact titles that fit circuitsvis's head thumbnails: "0.87 · sink" (name added by the view)."""
    titles = {}
    for r in table.to_dict("records"):
        short = SHORT_CLASS.get(canonical_class(r["class"]), str(r["class"]))
        value = r.get(score_fn)
        titles[(int(r["layer"]), int(r["head"]))] = (f"{value:.2f} · " if value == value and value is not None else "") + short
    return titles


# -----------------------------------------------------------------------------
# HTML pieces


def figure_html(fig, alt: str, dpi: int = 110) -> str:
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=dpi)
    data = base64.b64encode(buf.getvalue()).decode("ascii")
    return f'<figure><img alt="{html.escape(alt)}" src="data:image/png;base64,{data}"></figure>'


def table_html(frame: pd.DataFrame, floatfmt: str = "{:.4g}", cls: str = "") -> str:
    def cell(v) -> str:
        if isinstance(v, (float, np.floating)):
            return "" if math.isnan(v) else floatfmt.format(v)
        return html.escape(str(v))

    head = "".join(f"<th>{html.escape(str(c))}</th>" for c in frame.columns)
    rows = "".join("<tr>" + "".join(f"<td>{cell(v)}</td>" for v in row) + "</tr>"
                   for row in frame.itertuples(index=False))
    return (f'<div class="scroll"><table class="{cls}"><thead><tr>{head}</tr></thead>'
            f"<tbody>{rows}</tbody></table></div>")


def scores_summary(scores: pd.DataFrame) -> pd.DataFrame:
    """Per score function: direction, spread over heads and the most inactive head."""
    from lens_heads.viz.figures import inactive_when

    rows = []
    for fn, sub in scores.groupby("score_fn", sort=False):
        when = inactive_when(fn) or ""
        v = sub.dropna(subset=["value"])
        if v.empty:
            continue
        top = v.loc[v["value"].idxmin() if when != "high" else v["value"].idxmax()]
        rows.append({"score": fn, "inactive when": when, "mean": v["value"].mean(), "std over heads": v["value"].std(),
                     "min": v["value"].min(), "max": v["value"].max(),
                     "most inactive head": f"{head_label(int(top['layer']), int(top['head']))} ({top['value']:.3g})"})
    return pd.DataFrame(rows)


def diagnosis_summary(diagnosis: pd.DataFrame) -> pd.DataFrame:
    names = diagnosis["class"].astype(str).map(canonical_class)
    counts = names.value_counts()
    order = [c for c in ("dead", "bos_sink", "low_entropy", "local", "healthy") if c in counts] + \
            [c for c in counts.index if c not in ("dead", "bos_sink", "low_entropy", "local", "healthy")]
    total = len(diagnosis)
    return pd.DataFrame([{"class": class_label(c), "heads": int(counts[c]), "share": f"{100 * counts[c] / total:.1f} %"}
                         for c in order])


def band(diagnosis: pd.DataFrame, share: float = 0.30) -> list[int]:
    sick = diagnosis["class"].astype(str).map(canonical_class) != "healthy"
    n_layers = int(diagnosis["layer"].max()) + 1
    per_head = sick.groupby(diagnosis["head"]).sum()
    return [int(h) for h, n in per_head.items() if n > share * n_layers]


def view_block(view: AttentionView, table: pd.DataFrame) -> str:
    """A table describing the view's heads, then the circuitsvis view itself."""
    idx = table.set_index(["layer", "head"])
    rows = idx.loc[[hd for hd in view.heads]].reset_index().drop(columns=["layer", "head"])
    return f'<div class="view">{table_html(rows, cls="heads")}\n{view.mount_html()}</div>'


CSS = """
:root { --fg: #1d232a; --muted: #5b6570; --line: #dde2e7; --accent: #2b5d9a; }
* { box-sizing: border-box; }
body { font: 15px/1.5 -apple-system, "Segoe UI", Roboto, "DejaVu Sans", sans-serif; color: var(--fg);
       margin: 0; background: #f6f7f9; }
header { background: #1f3b5c; color: #fff; padding: 22px 40px 18px; }
header h1 { margin: 0 0 6px; font-size: 26px; font-weight: 600; }
header .sub { color: #c9d6e6; font-size: 14px; }
nav { background: #fff; border-bottom: 1px solid var(--line); padding: 8px 40px; font-size: 14px; }
nav a { color: var(--accent); margin-right: 18px; text-decoration: none; }
main { max-width: 1180px; margin: 0 auto; padding: 10px 40px 60px; }
section { background: #fff; border: 1px solid var(--line); border-radius: 6px; padding: 8px 26px 20px; margin: 22px 0; }
h2 { font-size: 20px; border-bottom: 2px solid var(--accent); padding-bottom: 4px; margin-top: 14px; }
h3 { font-size: 16px; margin: 20px 0 6px; color: #26384d; }
p.note, p.caption { color: var(--muted); font-size: 13.5px; margin: 4px 0 8px; }
table { border-collapse: collapse; font-size: 13px; margin: 8px 0 14px; }
div.scroll { overflow-x: auto; max-width: 100%; }
th, td { border: 1px solid var(--line); padding: 4px 10px; text-align: right; }
th { background: #eef2f6; font-weight: 600; }
td:first-child, th:first-child { text-align: left; }
tbody tr:nth-child(even) { background: #fafbfc; }
table.meta td { text-align: left; }
table.meta td:first-child { font-weight: 600; width: 170px; background: #f4f6f8; }
figure { margin: 10px 0; }
figure img { max-width: 100%; height: auto; border: 1px solid var(--line); border-radius: 4px; }
.grid2 { display: flex; flex-wrap: wrap; gap: 14px; }
.grid2 figure { flex: 1 1 420px; }
.view { border-top: 1px dashed var(--line); margin-top: 10px; padding-top: 4px; }
details summary { cursor: pointer; color: var(--accent); margin: 6px 0; }
code { background: #eef2f6; padding: 1px 4px; border-radius: 3px; }
"""


def render_page(title: str, meta: dict[str, str], sections: list[Section], with_bundle: bool) -> str:
    nav = "".join(f'<a href="#{s.anchor}">{html.escape(s.title)}</a>' for s in sections if s.anchor)
    meta_rows = "".join(f"<tr><td>{html.escape(k)}</td><td>{html.escape(v)}</td></tr>" for k, v in meta.items())
    body = "\n".join(f'<section id="{s.anchor}"><h2>{html.escape(s.title)}</h2>\n{s.body}\n</section>'
                     for s in sections)
    return f"""<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<title>{html.escape(title)}</title>
<style>{CSS}</style>
{bundle_script() if with_bundle else ""}
</head><body>
<header><h1>{html.escape(title)}</h1><div class="sub">lens_heads report · generated {html.escape(meta.get("generated", ""))}</div></header>
<nav>{nav}</nav>
<main>
<section id="run"><h2>Run</h2><table class="meta">{meta_rows}</table></section>
{body}
</main></body></html>
"""


# -----------------------------------------------------------------------------
# Sections


def scores_section(cfg: ReportConfig, res: ReportInputs, model_name: str) -> Section:
    scores = res.scores
    body = [f'<p class="note">Scores per head, mean over {_n_inputs(scores)} inputs '
            f'({html.escape(res.sources["scores"])}). “Inactive when” is the direction in which a head '
            "counts as dormant.</p>",
            table_html(scores_summary(scores))]
    present = [fn for fn in cfg.heatmaps if fn in set(scores["score_fn"])]
    if present:
        body.append('<div class="grid2">' + "".join(figure_html(score_heatmap(scores, fn), f"{fn} heatmap")
                                                    for fn in present) + "</div>")
    body.append("<h3>Distributions over heads</h3>")
    body.append(figure_html(score_distributions({Path(model_name).name: scores}), "score distributions", dpi=90))
    return Section("Head scores", "\n".join(body), "scores")


def sweep_section(res: ReportInputs) -> Section:
    if res.summary is None:
        return Section("Ablation sweep", '<p class="note">No sweep: pass <code>--sweep DIR</code> or '
                                         "<code>--task TASK</code>.</p>", "sweep")
    body = [f'<p class="note">Accuracy as heads are zeroed ({html.escape(res.sources["sweep"])}). '
            "Random: mean over seeds with its confidence band.</p>",
            figure_html(sweep_curves(res.summary, res.within), "sweep curves")]
    if res.within is not None:
        w = res.within.sort_values("max_pct_zeroed_within_1pt", ascending=False, na_position="last")
        w = w[[c for c in WITHIN_COLUMNS if c in w.columns]]
        body += ["<h3>Largest % of heads zeroed within 1 point of base accuracy</h3>", table_html(w)]
    return Section("Ablation sweep", "\n".join(body), "sweep")


def diagnosis_section(res: ReportInputs) -> Section:
    diag = res.diagnosis
    sick_band = band(diag)
    body = [f'<p class="note">Head classes from attention patterns ({html.escape(res.sources["diagnosis"])}). '
            f"Band (head indices sick in more than 30 % of layers): "
            f"{', '.join(f'H{h}' for h in sick_band) if sick_band else 'none'}.</p>",
            table_html(diagnosis_summary(diag)),
            figure_html(diagnosis_map(diag), "diagnosis map"),
            "<details><summary>Every head</summary>"
            + table_html(diag.assign(**{"class": diag["class"].map(class_label)})) + "</details>"]
    return Section("Diagnosis", "\n".join(body), "diagnosis")


def view_groups(cfg: ReportConfig, res: ReportInputs, extra_heads: list[tuple[int, int]]):
    """(caption, heads) of each attention view: most inactive / most active, sinks, requested."""
    groups: list[tuple[str, list[tuple[int, int]]]] = []
    inactive, active = pick_heads(res.scores, KEY_SCORE, cfg.top_k)
    if inactive:
        groups.append((f"{len(inactive)} most inactive heads by {KEY_SCORE}", inactive))
        groups.append((f"{len(active)} most active heads by {KEY_SCORE}", active))
    diag = res.diagnosis
    sinks = diag[diag["class"].astype(str).map(canonical_class).isin(SINK_CLASSES)]
    sinks = sinks.sort_values("bos_mass", ascending=False)
    if len(sinks) and cfg.max_sink_views:
        shown = [(int(L), int(h)) for L, h in zip(sinks["layer"], sinks["head"])][: cfg.max_sink_views]
        groups.append((f"BOS-sink and DEAD heads ({len(shown)} of {len(sinks)}, highest BOS mass first)", shown))
    if extra_heads:
        groups.append(("Requested heads", extra_heads))
    return groups


def patterns_section(cfg: ReportConfig, res: ReportInputs, model, first_input, extra_heads) -> Section:
    """circuitsvis views (mount only: the page inlines the bundle once) on the first input."""
    text = model.tokenizer.decode(first_input[: cfg.view_tokens].tolist(), skip_special_tokens=True)
    info = head_table(res.scores, res.diagnosis, KEY_SCORE)
    titles = head_titles(info, KEY_SCORE)
    body = [f'<p class="note">Attention patterns on the first {min(len(model.to_tokens(text)[0]), cfg.view_tokens)} '
            "tokens of the first input; hover a head to enlarge it, click to lock. "
            f"Text: “{html.escape(text[:200])}”</p>"]
    for caption, heads in view_groups(cfg, res, extra_heads):
        view = attention_heads(model, text, heads, titles, max_tokens=cfg.view_tokens)
        body.append(f"<h3>{html.escape(caption[0].upper() + caption[1:])}</h3>" + view_block(view, info))
    return Section("Attention patterns", "\n".join(body), "patterns")


# -----------------------------------------------------------------------------
# The report


def build_report(cfg: ReportConfig, model=None, texts: list[str] | None = None) -> Path:
    """Write the report to ``cfg.out`` and return its path.

    ``model``: an already loaded LoadedModel (else ``cfg.model`` is loaded). ``texts``: the
    inputs (else ``cfg.n_inputs`` texts of ``cfg.data``).
    """
    t0 = time.time()
    check_config(cfg)
    for path, reader in ((cfg.scores, read_scores), (cfg.diagnosis, read_diagnosis)):
        if path:
            reader(path)  # fail on a bad file before loading the model
    if cfg.sweep:
        read_sweep(cfg.sweep)
    if model is None:
        from lens_heads.models import load_model

        model = load_model(cfg.model, dtype=cfg.dtype, device=cfg.device)
    g = model.geometry
    extra_heads = parse_heads(cfg.heads, g) if cfg.heads else []

    from lens_heads.data import load_texts, tokenize_texts

    if texts is None:
        texts = load_texts(cfg.data, n=cfg.n_inputs)
    inputs = tokenize_texts(model.tokenizer, texts, cfg.max_len)
    if not inputs:
        raise LensHeadsError(f"no usable inputs in {cfg.data!r}")
    res = gather(cfg, model, inputs)

    sections = [scores_section(cfg, res, model.name), sweep_section(res), diagnosis_section(res),
                patterns_section(cfg, res, model, inputs[0], extra_heads)]
    n_views = sections[-1].body.count("CircuitsVis.render(")

    wall = time.time() - t0
    v = {k: val or "-" for k, val in package_versions(VERSION_PACKAGES).items()}
    meta = {
        "model": f"{model.name} ({g.arch.name}, {g.n_layers} layers x {g.n_heads} heads, {g.n_kv_heads} KV heads)",
        "data": f"{cfg.data}: {len(inputs)} inputs, up to {cfg.max_len} tokens",
        "dtype / device": f"{str(model.dtype).removeprefix('torch.')} / {model.device}",
        "results": "; ".join(f"{k}: {s}" for k, s in res.sources.items()),
        "versions": ", ".join(f"{k} {val}" for k, val in v.items()),
        "wall time": f"{wall:.1f} s",
        "generated": datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
    }
    page = render_page(f"Attention heads of {Path(model.name).name or model.name}", meta, sections,
                       with_bundle=n_views > 0)
    return atomic_write_text(cfg.out, page)


def _n_inputs(scores: pd.DataFrame) -> str:
    return str(int(scores["n"].iloc[0])) if "n" in scores.columns and len(scores) else "?"
