"""One self-contained HTML report of a model's heads: scores, sweep, diagnosis, patterns.

A view: ``render_report(ReportData)`` turns results that already exist -- ``HeadScores``,
``Diagnosis``, a ``SweepResult`` and the attention views to show -- into one page, and
``write_report`` writes it atomically. It computes nothing and imports nothing that does;
``lens_heads.viz.study.build_report`` reads or computes those results (and runs the model for the
attention patterns) and then calls it. The page needs no network: figures are PNGs in
``data:`` URIs and the circuitsvis bundle is inlined once, in ``<head>``; every attention view
only mounts into it.
"""

from __future__ import annotations

import base64
import html
import io
import math
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Sequence

import numpy as np
import pandas as pd

from lens_heads.files.atomic import atomic_write_text
from lens_heads.surgery.head_classes import CLASSES, SHORT, label
from lens_heads.interventions.specs import Head
from lens_heads.viz import AttentionView, bundle_script, crossing_overview, crossing_probes, diagnosis_map, head_label, score_distributions, \
    score_heatmap, sweep_curves

if TYPE_CHECKING:  # types only: the report reads these results, it never makes them
    from lens_heads.surgery.diagnose import Diagnosis
    from lens_heads.scores import HeadScores
    from lens_heads.sweep import SweepResult

KEY_SCORE = "ahon_ln"  # the paper's most often best function: picks the heads to show
SINK_CLASSES = ("dead", "bos_sink")
WITHIN_COLUMNS = ("score_fn", "max_pct_zeroed_within_1pt", "ci_low", "ci_high", "auc", "auc_ci_low", "auc_ci_high",
                  "rank_by_auc", "seed_min", "seed_max", "note")


@dataclass
class ViewGroup:
    """One attention view of the report and what it shows."""

    caption: str
    view: AttentionView


@dataclass
class ReportData:
    """Everything the page shows, made before it is rendered."""

    title: str  # the model's name
    scores: "HeadScores"
    diagnosis: "Diagnosis"
    sweep: "SweepResult | None" = None
    views: list[ViewGroup] = field(default_factory=list)
    view_text: str = ""  # the text the views show
    view_tokens: int = 0  # its tokens shown
    sources: dict[str, str] = field(default_factory=dict)  # "scores" -> "file X" | "computed ..."
    meta: dict[str, str] = field(default_factory=dict)  # the "Run" table: model, data, versions, ...
    heatmaps: Sequence[str] = ("ahon_ln", "awft")
    key_score: str = KEY_SCORE
    pruning: dict | None = None  # a 'lens-heads prune' run's prune_report.json
    search: tuple | None = None  # an adaptive search's (within_1pt, probes) frames (--search crossing)


@dataclass
class Section:
    title: str
    body: str
    anchor: str = ""


# -----------------------------------------------------------------------------
# Tables and picks from the results (reading only)


def pick_views(scores: "HeadScores", diagnosis: "Diagnosis", score_fn: str, k: int, max_sinks: int,
               extra: Sequence[Head] = ()) -> list[tuple[str, list[Head]]]:
    """(caption, heads) of each attention view: the k most inactive and k most active heads by
    ``score_fn`` (``HeadScores.least_active``; heads without a value left out), the DEAD and
    BOS-sink heads (highest BOS mass first, at most ``max_sinks``), and ``extra``."""
    groups: list[tuple[str, list[Head]]] = []
    if score_fn in scores.mean:
        values = scores.mean[score_fn]
        order = [hd for hd in scores.least_active(score_fn) if math.isfinite(float(values[hd]))]
        k = min(k, len(order) // 2 or 1)
        if order:
            groups.append((f"{k} most inactive heads by {score_fn}", order[:k]))
            groups.append((f"{k} most active heads by {score_fn}", order[::-1][:k]))
    sinks = sorted(diagnosis.heads(SINK_CLASSES), key=lambda hd: -float(diagnosis.bos_mass[hd]))
    if sinks and max_sinks:
        shown = sinks[:max_sinks]
        groups.append((f"BOS-sink and DEAD heads ({len(shown)} of {len(sinks)}, highest BOS mass first)", shown))
    if extra:
        groups.append(("Requested heads", list(extra)))
    return groups


def head_table(scores: "HeadScores", diagnosis: "Diagnosis", score_fn: str) -> pd.DataFrame:
    """One row per head: layer, head, name, class, BOS mass, entropy, score value."""
    table = diagnosis.to_frame()[["layer", "head", "class", "bos_mass", "entropy"]]
    if score_fn in scores.mean:
        table = table.assign(**{score_fn: scores.mean[score_fn].numpy().ravel()})
    table.insert(2, "name", [head_label(int(L), int(h)) for L, h in zip(table["layer"], table["head"])])
    table["class"] = table["class"].map(label)
    return table


def head_titles(scores: "HeadScores", diagnosis: "Diagnosis", score_fn: str) -> dict[Head, str]:
    """Compact titles that fit circuitsvis's head thumbnails: "0.87 · sink" (name added by the view)."""
    have = score_fn in scores.mean
    return {(L, h): (f"{float(scores.mean[score_fn][L, h]):.2f} · " if have and
                     math.isfinite(float(scores.mean[score_fn][L, h])) else "") + SHORT[diagnosis.classes[L][h]]
            for L in range(diagnosis.n_layers) for h in range(diagnosis.n_heads)}


def scores_summary(scores: "HeadScores") -> pd.DataFrame:
    """Per score function: direction, spread over heads and the most inactive head."""
    rows = []
    for fn in scores.score_ids:
        v = scores.mean[fn].numpy().ravel()
        v = v[np.isfinite(v)]
        if not v.size:
            continue
        L, h = scores.least_active(fn, 1)[0]
        rows.append({"score": fn, "inactive when": scores.inactive_when(fn), "mean": v.mean(),
                     "std over heads": v.std(ddof=1) if v.size > 1 else math.nan, "min": v.min(), "max": v.max(),
                     "most inactive head": f"{head_label(L, h)} ({float(scores.mean[fn][L, h]):.3g})"})
    return pd.DataFrame(rows)


def diagnosis_summary(diagnosis: "Diagnosis") -> pd.DataFrame:
    counts, total = diagnosis.counts(), diagnosis.n_layers * diagnosis.n_heads
    return pd.DataFrame([{"class": label(c), "heads": counts[c], "share": f"{100 * counts[c] / total:.1f} %"}
                         for c in CLASSES if counts[c]])


# -----------------------------------------------------------------------------
# HTML pieces


def figure_html(fig, alt: str, dpi: int = 110) -> str:
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=dpi)
    data = base64.b64encode(buf.getvalue()).decode("ascii")
    return f'<figure><img alt="{html.escape(alt)}" src="data:image/png;base64,{data}"></figure>'


TEXT_COLUMNS = ("note",)  # free text in a table: wraps, left-aligned


def table_html(frame: pd.DataFrame, floatfmt: str = "{:.4g}", cls: str = "") -> str:
    def cell(v) -> str:
        if isinstance(v, (float, np.floating)):
            return "" if math.isnan(v) else floatfmt.format(v)
        return html.escape(str(v))

    # long snake_case headers may break after an underscore, and text columns (note) wrap left-aligned,
    # so a wide table fits its section instead of pushing its last columns out of view
    text = [' class="text"' if c in TEXT_COLUMNS else "" for c in frame.columns]
    head = "".join(f"<th{t}>{html.escape(str(c)).replace('_', '_<wbr>')}</th>" for t, c in zip(text, frame.columns))
    rows = "".join("<tr>" + "".join(f"<td{t}>{cell(v)}</td>" for t, v in zip(text, row)) + "</tr>"
                   for row in frame.itertuples(index=False))
    return (f'<div class="scroll"><table class="{cls}"><thead><tr>{head}</tr></thead>'
            f"<tbody>{rows}</tbody></table></div>")


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
td.text, th.text { text-align: left; min-width: 16em; }
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


def scores_section(data: ReportData) -> Section:
    scores, frame = data.scores, data.scores.to_frame()
    body = [f'<p class="note">Scores per head, mean over {scores.n} inputs '
            f'({html.escape(data.sources.get("scores", ""))}). “Inactive when” is the direction in which a '
            "head counts as dormant.</p>",
            table_html(scores_summary(scores))]
    present = [fn for fn in data.heatmaps if fn in scores.mean]
    if present:
        body.append('<div class="grid2">' + "".join(figure_html(score_heatmap(frame, fn), f"{fn} heatmap")
                                                    for fn in present) + "</div>")
    body.append("<h3>Distributions over heads</h3>")
    body.append(figure_html(score_distributions({Path(data.title).name: frame}), "score distributions", dpi=90))
    return Section("Head scores", "\n".join(body), "scores")


SEARCH_COLUMNS = ("score_fn", "crossing_pct", "crossing_status", "bracket_low_pct", "bracket_high_pct",
                  "resolution_pct", "alpha", "n_probes", "item_evaluations", "probes", "monotone_violation",
                  "stored_points")


def search_html(data: ReportData) -> list[str]:
    """An adaptive search's crossings at a glance, then its probes with their intervals (``--search crossing``)."""
    within, probes = data.search
    w = within[[c for c in SEARCH_COLUMNS if c in within.columns]]
    return ["<h3>Crossing search: the largest % of heads within the margin</h3>",
            '<p class="note">Each curve\'s bracket: within at its left end, outside at its right (an arrow: within '
            "up to the range's end; pale: still running or unresolved); grey band: random heads' bracket, what a "
            "score must beat (docs/methods.md §13).</p>",
            figure_html(crossing_overview(within), "crossing overview"),
            "<h3>Probe by probe</h3>",
            '<p class="note">Each bar is a probe\'s interval on the accuracy change when it stopped (green: '
            "within the margin, red: outside, grey: unresolved), labelled with its step and the questions it "
            "read; dashed: the crossing (docs/methods.md §13).</p>",
            figure_html(crossing_probes(probes, within), "crossing search"), table_html(w)]


def sweep_section(data: ReportData) -> Section:
    sweep = data.sweep
    if sweep is None and data.search is not None:
        return Section("Ablation sweep", "\n".join(search_html(data)), "sweep")
    if sweep is None:
        return Section("Ablation sweep", '<p class="note">No sweep: pass <code>--sweep DIR</code> or '
                                         "<code>--task TASK</code>.</p>", "sweep")
    body = [f'<p class="note">Accuracy as heads are zeroed ({html.escape(data.sources.get("sweep", ""))}). '
            "Random: mean over seeds with its confidence band.</p>",
            figure_html(sweep_curves(sweep.summary, sweep.within), "sweep curves")]
    if data.search is not None:
        body += search_html(data)
    if sweep.within is None:
        body.append('<p class="note">No within-1-point table: the sweep folder has no within_1pt.csv '
                    "(<code>lens-heads sweep</code> writes it with summary.csv).</p>")
    else:
        w = sweep.within.sort_values("max_pct_zeroed_within_1pt", ascending=False, na_position="last")
        w = w[[c for c in WITHIN_COLUMNS if c in w.columns]]
        body += ["<h3>Largest % of heads zeroed within 1 point of base accuracy</h3>", table_html(w)]
    return Section("Ablation sweep", "\n".join(body), "sweep")


def diagnosis_section(data: ReportData) -> Section:
    diag = data.diagnosis
    band, frame = diag.band(), diag.to_frame()
    body = [f'<p class="note">Head classes from attention patterns ({html.escape(data.sources.get("diagnosis", ""))}). '
            f"Band (head indices sick in more than {100 * diag.thresholds.band_fraction:g} % of layers): "
            f"{', '.join(f'H{h}' for h in band) if band else 'none'}.</p>",
            table_html(diagnosis_summary(diag)),
            figure_html(diagnosis_map(frame), "diagnosis map"),
            "<details><summary>Every head</summary>"
            + table_html(frame.assign(**{"class": frame["class"].map(label)})) + "</details>"]
    return Section("Diagnosis", "\n".join(body), "diagnosis")


def pruning_section(data: ReportData) -> Section | None:
    """What a pruning run removed and what it cost (its prune_report.json), when one is given."""
    r = data.pruning
    if r is None:
        return None
    rows = [("heads removed", f"{len(r['removed'])} of {r['heads_before']} "
                              f"({100 * len(r['removed']) / r['heads_before']:.1f} %), by {r.get('selection', '?')}"),
            ("parameters", f"{r['parameters_before']:,} → {r['parameters_after']:,} "
                           f"({100 * (1 - r['parameters_after'] / r['parameters_before']):.2f} % fewer)"),
            ("heads per layer", ", ".join(map(str, r["heads_per_layer"]))),
            ("KV heads per layer", ", ".join(map(str, r.get("kv_heads_per_layer", []))))]
    ev = r.get("eval")
    if ev:
        rows.append((f"{ev['task']} accuracy ({ev['n_questions']} questions)",
                     f"{ev['acc_before']:.4f} → {ev['acc_after']:.4f}: {100 * ev['delta']:+.1f} "
                     f"[{100 * ev['ci_low']:+.1f}, {100 * ev['ci_high']:+.1f}] points (paired bootstrap, 95 %)"))
    table = pd.DataFrame(rows, columns=["", "value"])
    removed = ", ".join(r["removed"][:60]) + (" …" if len(r["removed"]) > 60 else "")
    body = [table_html(table), f'<p class="note">Removed: {html.escape(removed)}</p>']
    return Section("Pruning", "\n".join(body), "pruning")


def view_block(view: AttentionView, table: pd.DataFrame) -> str:
    """A table describing the view's heads, then the circuitsvis view itself."""
    idx = table.set_index(["layer", "head"])
    rows = idx.loc[[hd for hd in view.heads]].reset_index().drop(columns=["layer", "head"])
    return f'<div class="view">{table_html(rows, cls="heads")}\n{view.mount_html()}</div>'


def patterns_section(data: ReportData) -> Section:
    """circuitsvis views (mount only: the page inlines the bundle once) on the first input."""
    info = head_table(data.scores, data.diagnosis, data.key_score)
    body = [f'<p class="note">Attention patterns on the first {data.view_tokens} tokens of the first input; '
            "hover a head to enlarge it, click to lock. "
            f"Text: “{html.escape(data.view_text[:200])}”</p>"]
    for g in data.views:
        body.append(f"<h3>{html.escape(g.caption[0].upper() + g.caption[1:])}</h3>" + view_block(g.view, info))
    return Section("Attention patterns", "\n".join(body), "patterns")


# -----------------------------------------------------------------------------
# The report


def render_report(data: ReportData) -> str:
    """The page for ``data`` (HTML text)."""
    sections = [scores_section(data), sweep_section(data), pruning_section(data), diagnosis_section(data),
                patterns_section(data)]
    sections = [s for s in sections if s is not None]
    return render_page(f"Attention heads of {Path(data.title).name or data.title}", data.meta, sections,
                       with_bundle=bool(data.views))


def write_report(data: ReportData, path: str | os.PathLike) -> Path:
    """Render ``data`` and write it to ``path`` atomically."""
    return atomic_write_text(path, render_report(data))
