"""The surgery-drift page: what a repair did to every head, read from its drift tables.

A view: ``render_drift_report(tables, meta)`` turns the tables ``lens_heads.surgery.drift``
wrote (``heads``, ``curves``, ``generations``, ``epochs``; docs/methods.md §7, "Drift of the
heads") into one self-contained page -- the layer x head maps of signed BOS-mass change per state, the curves of
heads moved (against the model before surgery, and against the state training started from) and
held-out perplexity against training steps, and the greedy continuations of the probes -- and ``write_drift_report`` writes it atomically. It computes no measure: figures
and tables show the columns as stored.
"""

from __future__ import annotations

import html
import math
import os
from pathlib import Path

import numpy as np
import pandas as pd
from matplotlib.figure import Figure
from matplotlib.patches import Rectangle
from matplotlib.ticker import MaxNLocator

from lens_heads.errors import LensHeadsError
from lens_heads.files.atomic import atomic_write_text
from lens_heads.viz.report import Section, figure_html, render_page, table_html

GROUP_LABELS = {"target": "target heads", "target_healthy": "healthy heads re-initialised",
                "frozen_target_layer": "frozen, in a target layer", "frozen_elsewhere": "frozen, elsewhere"}
GROUP_STYLE = {"target": ("#d62728", "-"), "target_healthy": ("#9467bd", "-"),
               "frozen_target_layer": ("#ff7f0e", "--"), "frozen_elsewhere": ("#1f77b4", "--")}
CHANGE_LABELS = {"d_bos_mass": "signed BOS-mass change", "d_entropy": "signed entropy change (nats)",
                 "d_out_norm": "signed output-norm change", "tv": "pattern distance"}
MAX_MAPS = 12  # states drawn as maps (evenly spaced; the first, re-initialisations and the last kept)


def _need(frame: pd.DataFrame, columns, what: str) -> None:
    missing = [c for c in columns if c not in frame.columns]
    if missing:
        raise LensHeadsError(f"the drift table {what} lacks column(s) {', '.join(missing)}")


def shown_points(curves: pd.DataFrame, most: int = MAX_MAPS) -> list[str]:
    """The states drawn as maps: all when they fit, else every re-initialisation, the last
    state and evenly spaced others, in table order."""
    points = list(curves["point"])
    if len(points) <= most:
        return points
    keep = {points[-1]} | set(curves.loc[curves["kind"] == "reinit", "point"])
    rest = [p for p in points if p not in keep and p != "before"]
    room = max(0, most - len(keep))
    if room and rest:
        keep |= {rest[int(i)] for i in np.linspace(0, len(rest) - 1, room)}
    return [p for p in points if p in keep]


def delta_maps(heads: pd.DataFrame, points: list[str], column: str = "d_bos_mass") -> Figure:
    """One layer x head map of ``column`` per state (shared diverging scale, 0 white); target
    heads outlined black, healthy heads re-initialised outlined purple, moved heads dotted."""
    _need(heads, ["point", "step", "layer", "head", "group", "moved", column], "heads")
    n = len(points)
    cols = min(4, n)
    rows = math.ceil(n / cols)
    n_layers, n_heads = int(heads["layer"].max()) + 1, int(heads["head"].max()) + 1
    sub = heads[heads["point"].isin(points)]
    bound = float(np.nanmax(np.abs(sub[column].to_numpy()))) if len(sub) else 0.0
    bound = bound if bound > 0 else 1e-6
    per_map = max(1.6, 0.13 * n_layers + 0.9)  # inches: 30 layers -> 4.8
    fig = Figure(figsize=(3.1 * cols + 0.8, per_map * rows + 0.4), layout="constrained")
    axes = fig.subplots(rows, cols, squeeze=False)
    image = None
    for ax, point in zip(axes.ravel(), points):
        f = sub[sub["point"] == point]
        grid = np.full((n_layers, n_heads), np.nan)
        grid[f["layer"].to_numpy(), f["head"].to_numpy()] = f[column].to_numpy()
        image = ax.imshow(grid, cmap="RdBu_r", vmin=-bound, vmax=bound, aspect="auto", interpolation="nearest")
        for r in f.itertuples(index=False):
            colour = {"target": "black", "target_healthy": "#7b2cbf"}.get(r.group)
            if colour:
                ax.add_patch(Rectangle((r.head - 0.5, r.layer - 0.5), 1, 1, fill=False, lw=1.3, ec=colour))
            if bool(r.moved):
                ax.plot(r.head, r.layer, marker=".", ms=3, color="black")
        step = int(f["step"].iloc[0]) if len(f) else 0
        ax.set_title(f"{point} (step {step})", fontsize=8)
        ax.set_xlabel("head", fontsize=7)
        ax.set_ylabel("layer", fontsize=7)
        ax.tick_params(labelsize=6)
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
        ax.yaxis.set_major_locator(MaxNLocator(integer=True))
    for ax in axes.ravel()[n:]:
        ax.set_visible(False)
    if image is not None:
        fig.colorbar(image, ax=axes.ravel().tolist(), shrink=0.8, label=CHANGE_LABELS.get(column, column))
    return fig


def drift_curves(curves: pd.DataFrame, epochs: pd.DataFrame | None = None) -> Figure:
    """Two panels against training steps, re-initialisations marked by vertical lines.
    Top: heads moved per group against the model before surgery (left axis, share of the group)
    and held-out perplexity (right axis: on the probes at every state; on the run's own held-out
    documents before surgery and at each epoch end, ``epochs``). Bottom: heads moved per group
    since their pass' re-initialisation (what training moved, apart from the re-initialisation's
    immediate effect; left) and the groups' mean pattern distance to that state (right, dotted)."""
    _need(curves, ["point", "kind", "step", "ppl"], "curves")
    fig = Figure(figsize=(9, 8.2), layout="constrained")
    ax, low = fig.subplots(2, 1, sharex=True)
    trained = curves[curves["kind"] != "before"]
    present = [g for g in GROUP_STYLE if f"n_{g}" in curves.columns and (curves[f"n_{g}"] > 0).any()]
    for grp in present:
        colour, style = GROUP_STYLE[grp]
        ax.plot(trained["step"], trained[f"pct_moved_{grp}"], style, marker="o", ms=3, color=colour,
                label=f"{GROUP_LABELS[grp]} moved (of {int(trained[f'n_{grp}'].max())})")
    ax.set_ylabel("% of the group's heads moved\n(against the model before surgery)")
    ax.set_ylim(-3, 103)
    right = ax.twinx()
    right.plot(curves["step"], curves["ppl"], "-", color="black", lw=1.6, marker="s", ms=3,
               label="held-out perplexity (probes)")
    if epochs is not None and len(epochs):
        _need(epochs, ["step", "ppl"], "epochs")
        right.plot(epochs["step"], epochs["ppl"], ":", color="grey", marker="D", ms=4,
                   label="held-out perplexity (the run's documents)")
    before = curves[curves["kind"] == "before"]
    if len(before):
        right.axhline(float(before["ppl"].iloc[0]), color="black", lw=0.8, ls="--", label="perplexity before surgery")
    right.set_ylabel("held-out perplexity")
    lines, more = ax.get_legend_handles_labels(), right.get_legend_handles_labels()
    ax.legend(lines[0] + more[0], lines[1] + more[1], fontsize=7, loc="upper right")
    since = [g for g in present if f"pct_moved_since_reinit_{g}" in curves.columns]
    dist = low.twinx()
    for grp in since:
        colour, style = GROUP_STYLE[grp]
        low.plot(trained["step"], trained[f"pct_moved_since_reinit_{grp}"], style, marker="o", ms=3, color=colour,
                 label=f"{GROUP_LABELS[grp]} moved since re-initialisation")
        dist.plot(trained["step"], trained[f"mean_tv_reinit_{grp}"], ":", color=colour, lw=1.2,
                  label=f"{GROUP_LABELS[grp]}: mean distance")
    low.set_ylabel("% of the group's heads moved\n(since re-initialisation)")
    low.set_ylim(-3, 103)
    low.set_xlabel("training step (all passes)")
    dist.set_ylabel("mean pattern distance to the re-initialised state")
    dist.set_yscale("symlog", linthresh=1e-3)
    dist.set_ylim(bottom=0)  # a distance: never below 0
    lines, more = low.get_legend_handles_labels(), dist.get_legend_handles_labels()
    if lines[0] or more[0]:  # below the panel: the counts and the distances fill its whole width
        low.legend(lines[0] + more[0], lines[1] + more[1], fontsize=6.5, ncol=2, loc="upper center",
                   bbox_to_anchor=(0.5, -0.16))
    for a in (ax, low):
        for step in curves.loc[curves["kind"] == "reinit", "step"]:
            a.axvline(step, color="grey", lw=0.8, ls=":")
    return fig


def generations_table(generations: pd.DataFrame) -> pd.DataFrame:
    """One row per state, one column per prompt: its greedy continuation."""
    _need(generations, ["point", "step", "prompt", "continuation"], "generations")
    wide = generations.pivot(index=["point", "step"], columns="prompt", values="continuation")
    order = list(dict.fromkeys(generations["point"]))
    prompts = list(dict.fromkeys(generations["prompt"]))
    wide = wide.reset_index().set_index("point").loc[order].reset_index()
    return wide[["point", "step", *prompts]].fillna("")


def summary_table(curves: pd.DataFrame) -> pd.DataFrame:
    """Per state: step, perplexity, and per group that has heads its moved count and mean distance,
    against the model before surgery and since re-initialisation."""
    present = [g for g in GROUP_LABELS if f"n_{g}" in curves.columns and (curves[f"n_{g}"] > 0).any()]
    cols = ["point", "step", "ppl"] + [f"{what}_{g}" for g in present
                                      for what in ("moved", "mean_tv", "moved_since_reinit", "mean_tv_reinit")]
    return curves[[c for c in cols if c in curves.columns]]


def render_drift_report(tables: dict[str, pd.DataFrame], meta: dict[str, str]) -> str:
    """The page (HTML text) for the drift tables of one repair run; ``meta`` fills its Run table."""
    heads, curves, gens = tables["heads"], tables["curves"], tables["generations"]
    points = shown_points(curves)
    threshold = meta.get("moved when", "pattern distance > 0.05")
    maps = [f'<p class="note">Signed change of BOS mass against the model before surgery, per head, at each '
            f"state (of {len(curves)}; red: more mass on the first token). Black frames: target heads; purple: "
            f"healthy heads re-initialised (extended surgery); dots: heads moved ({html.escape(threshold)}). "
            "Measured on held-out probe texts (docs/methods.md §7).</p>",
            figure_html(delta_maps(heads, points), "signed BOS-mass change maps")]
    curve = ['<p class="note">Top: share of each group\'s heads moved against the model before surgery, and '
             "perplexity on the held-out probes, against training steps. Re-initialisation zeroes the targets' "
             "output, so heads after them move at once; the bottom panel counts only what training moved since: "
             "each head's distance to the state its pass started training from. Frozen heads moving early in "
             "training read as global redistribution; frozen heads moving late while perplexity rises read as "
             "local degradation.</p>",
             figure_html(drift_curves(curves, tables.get("epochs")), "drift curves"),
             "<details><summary>Per state: perplexity, heads moved and mean pattern distance per group</summary>"
             + table_html(summary_table(curves)) + "</details>"]
    probes = ["<style>table.generations td, table.generations th { text-align: left; white-space: pre-wrap; }"
              "</style>",
              '<p class="note">Greedy continuations of fixed prompts before surgery, after re-initialisation '
              "and at each checkpoint.</p>", table_html(generations_table(gens), cls="generations")]
    moved = heads[heads["moved"].astype(bool) & heads["group"].str.startswith("frozen")]
    last = curves["point"].iloc[-1]
    rows = moved[moved["point"] == last][["layer", "head", "group", "d_bos_mass", "d_entropy", "d_out_norm", "tv"]]
    detail = [f"<details><summary>Frozen heads moved at the last state ({html.escape(str(last))}): {len(rows)}"
              "</summary>" + (table_html(rows) if len(rows) else '<p class="note">None.</p>') + "</details>"]
    sections = [Section("Heads moved and perplexity", "\n".join(curve + detail), "curves"),
                Section("Signed BOS-mass change maps", "\n".join(maps), "maps"),
                Section("Generation probes", "\n".join(probes), "probes")]
    shown = {k: v for k, v in meta.items() if k != "title"}
    return render_page(meta.get("title", "Drift of the heads after surgery"), shown, sections, with_bundle=False)


def write_drift_report(tables: dict[str, pd.DataFrame], meta: dict[str, str], path: str | os.PathLike) -> Path:
    """Render the page and write it to ``path`` atomically."""
    return atomic_write_text(path, render_drift_report(tables, meta), make_parents=True)
