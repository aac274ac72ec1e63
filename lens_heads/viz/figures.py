"""Matplotlib figures of saved results: score heatmaps and distributions, sweep curves,
Wasserstein distances between score distributions, and the diagnosis map.

Every function takes data (tidy frames, arrays) and returns a ``matplotlib.figure.Figure``
built without pyplot: nothing is shown, no global figure state is touched, any backend works.
"""

from __future__ import annotations

import math

from typing import Mapping, Sequence

import matplotlib
import numpy as np
import pandas as pd
from matplotlib.colors import ListedColormap
from matplotlib.figure import Figure
from matplotlib.lines import Line2D
from matplotlib.patches import Patch
from matplotlib.ticker import FixedLocator, FuncFormatter, NullLocator

from lens_heads.errors import LensHeadsError
from lens_heads.surgery.head_classes import CLASSES
from lens_heads.surgery.head_classes import canonical as canonical_class
from lens_heads.surgery.head_classes import label as class_label
from lens_heads.scores.functions import SCORES  # the registry's definitions, read only

DIAGNOSIS_COLOURS: dict[str, str] = {"dead": "#1f1f1f", "bos_sink": "#d62728", "low_entropy": "#ff7f0e",
                                     "local": "#9467bd", "healthy": "#2ca02c"}  # per head_classes.CLASSES
_EXTRA_COLOURS = ["#8c564b", "#e377c2", "#7f7f7f", "#bcbd22", "#17becf"]


def _require(frame: pd.DataFrame, columns: Sequence[str], what: str) -> None:
    if not isinstance(frame, pd.DataFrame):
        raise LensHeadsError(f"{what}: expected a pandas DataFrame, got {type(frame).__name__}")
    missing = [c for c in columns if c not in frame.columns]
    if missing:
        raise LensHeadsError(f"{what} lacks column(s) {', '.join(missing)} "
                             f"(has: {', '.join(map(str, frame.columns))})")
    if frame.empty:
        raise LensHeadsError(f"{what} is empty")


def inactive_when(score_fn: str) -> str | None:
    """"high"/"low" from the score registry, or None when the registry does not know it."""
    fn = SCORES.get(score_fn)
    return getattr(fn, "inactive_when", None)


def score_grid(frame: pd.DataFrame, score_fn: str) -> pd.DataFrame:
    """[layer x head] table of one score function's dataset-level value."""
    _require(frame, ["layer", "head", "score_fn", "value"], "scores frame")
    sub = frame[frame["score_fn"] == score_fn]
    if sub.empty:
        known = ", ".join(sorted(frame["score_fn"].unique()))
        raise LensHeadsError(f"score function {score_fn!r} not in the scores frame (has: {known})")
    return sub.pivot_table(index="layer", columns="head", values="value", aggfunc="mean").sort_index()


def score_heatmap(frame: pd.DataFrame, score_fn: str, annotate: bool | None = None) -> Figure:
    """Heatmap of one score over layer x head (rows = layers, top to bottom)."""
    grid = score_grid(frame, score_fn)
    n_layers, n_heads = grid.shape
    fig = Figure(figsize=(min(14.0, 2.2 + 0.55 * n_heads), min(16.0, 1.6 + 0.32 * n_layers)),
                 layout="constrained")
    ax = fig.add_subplot()
    im = ax.imshow(grid.to_numpy(dtype=float), aspect="auto", cmap="viridis", interpolation="nearest")
    ax.set_xticks(range(n_heads), [str(h) for h in grid.columns])
    step = max(1, n_layers // 16)
    ax.set_yticks(range(0, n_layers, step), [str(L) for L in grid.index[::step]])
    ax.set_xlabel("head")
    ax.set_ylabel("layer")
    when = inactive_when(score_fn)
    ax.set_title(f"{score_fn}" + (f"  (inactive when {when})" if when else ""))
    fig.colorbar(im, ax=ax, shrink=0.9, label=score_fn)
    if annotate is None:
        annotate = n_layers * n_heads <= 160
    if annotate:
        values = grid.to_numpy(dtype=float)
        mid = np.nanmean(values)
        for (i, j), v in np.ndenumerate(values):
            if np.isfinite(v):
                ax.text(j, i, f"{v:.2g}", ha="center", va="center", fontsize=7,
                        color="black" if v > mid else "white")
    return fig


# --- sweeps -----------------------------------------------------------------------------

SUMMARY_COLUMNS = ["score_fn", "fraction", "pct_zeroed", "accuracy", "ci_low", "ci_high", "seed", "threshold"]


def base_accuracy(summary: pd.DataFrame) -> float:
    """Accuracy with nothing zeroed: the rows at fraction 0 (or score_fn "none")."""
    base = summary[(summary["fraction"] == 0) | (summary["score_fn"] == "none")]
    return float(base["accuracy"].mean()) if not base.empty else float("nan")


def random_baseline(summary: pd.DataFrame) -> pd.DataFrame:
    """Random rows averaged over seeds per fraction: pct_zeroed, accuracy, band_low, band_high, n_seeds.

    The band is the mean of the per-seed confidence intervals when the sweep gives them,
    else the min-max over seeds.
    """
    rnd = summary[summary["score_fn"] == "random"]
    if rnd.empty:
        return pd.DataFrame(columns=["fraction", "pct_zeroed", "accuracy", "band_low", "band_high", "n_seeds"])
    has_ci = {"ci_low", "ci_high"} <= set(rnd.columns) and rnd[["ci_low", "ci_high"]].notna().all().all()
    out = rnd.groupby("fraction").agg(
        pct_zeroed=("pct_zeroed", "mean"), accuracy=("accuracy", "mean"),
        band_low=("ci_low" if has_ci else "accuracy", "mean" if has_ci else "min"),
        band_high=("ci_high" if has_ci else "accuracy", "mean" if has_ci else "max"),
        n_seeds=("accuracy", "size"))
    return out.reset_index().sort_values("pct_zeroed")


def sweep_curves(summary: pd.DataFrame, within: pd.DataFrame | None = None,
                 base: float | None = None, title: str | None = None, tol: float = 0.01) -> Figure:
    """Accuracy (a fraction in [0, 1], as sweeps store it) vs % heads zeroed: one line per score
    function, the random baseline (mean over seeds, with its band), the base accuracy and the
    "-1 point" line (``base - tol``)."""
    _require(summary, ["score_fn", "fraction", "pct_zeroed", "accuracy"], "sweep summary")
    base = base_accuracy(summary) if base is None else float(base)
    labels, tied = {}, set()
    if within is not None and {"score_fn", "max_pct_zeroed_within_1pt"} <= set(within.columns):
        labels = {r.score_fn: f" ({r.max_pct_zeroed_within_1pt:.1f} %)" for r in within.itertuples()}
        if "note" in within.columns:  # a score tied across heads has one point, not a curve (sweep.tables)
            tied = {r.score_fn for r in within.itertuples() if isinstance(r.note, str) and r.note}

    fig = Figure(figsize=(9.5, 5.0), layout="constrained")
    ax = fig.add_subplot()
    fns = [f for f in summary["score_fn"].unique() if f not in ("random", "none")]
    # a raw score and its layer-normalised _ln version share a colour; _ln is dash-dotted
    families = list(dict.fromkeys(f.removesuffix("_ln") for f in fns))
    palette = matplotlib.colormaps["tab10" if len(families) <= 10 else "tab20"]
    for fn in fns:
        if fn in tied:
            ax.plot([], [], ls="none", label=f"{fn}: ties across heads, no curve")
            continue
        rows = summary[summary["score_fn"] == fn].sort_values("pct_zeroed")
        ax.plot(rows["pct_zeroed"], rows["accuracy"], marker="o", ms=3.5, lw=1.6, label=fn + labels.get(fn, ""),
                color=palette(families.index(fn.removesuffix("_ln"))), ls="-." if fn.endswith("_ln") else "-")
    rnd = random_baseline(summary)
    if not rnd.empty:
        seeds = int(rnd["n_seeds"].max())
        ax.plot(rnd["pct_zeroed"], rnd["accuracy"], color="grey", ls="--", lw=1.6, marker="s", ms=3,
                label=f"random (mean of {seeds} seed{'s' * (seeds > 1)})" + labels.get("random", ""))
        ax.fill_between(rnd["pct_zeroed"], rnd["band_low"], rnd["band_high"], color="grey", alpha=0.2,
                        lw=0, label="random band")
    if np.isfinite(base):
        ax.axhline(base, color="black", lw=1, label=f"base {base:.3g}")
        ax.axhline(base - tol, color="black", lw=1, ls=":", label="base - 1 point")
    _zeroed_axes(ax, "accuracy", title or "Accuracy as heads are zeroed")
    return fig


def point_changes(points: pd.DataFrame, title: str | None = None) -> Figure:
    """Single sweep points as accuracy changes: x = % heads zeroed (realised), y = change against
    the unablated baseline in points with its paired interval (``delta_ci_low``/``delta_ci_high``),
    one marker per point (random heads grey squares), and the 0 and -1-point lines. For sweeps
    whose curves are not complete, where a point says more than a line through too few."""
    _require(points, ["score_fn", "pct_zeroed", "delta_pt", "delta_ci_low", "delta_ci_high"], "points frame")
    fig = Figure(figsize=(8.0, 4.5), layout="constrained")
    ax = fig.add_subplot()
    fns = list(dict.fromkeys(points["score_fn"]))
    palette = matplotlib.colormaps["tab10" if len(fns) <= 10 else "tab20"]
    for i, fn in enumerate(fns):
        rows = points[points["score_fn"] == fn].sort_values("pct_zeroed")
        y = rows["delta_pt"].to_numpy(float)
        err = np.vstack([y - rows["delta_ci_low"].to_numpy(float), rows["delta_ci_high"].to_numpy(float) - y])
        rnd = fn == "random"
        ax.errorbar(rows["pct_zeroed"].to_numpy(float), y, yerr=err, fmt="s" if rnd else "o", ms=5, capsize=3, lw=1.2,
                    color="grey" if rnd else palette(i), label=fn)
    ax.axhline(0.0, color="black", lw=1, label="baseline")
    ax.axhline(-1.0, color="black", lw=1, ls=":", label="-1 point")
    ax.set_xlim(left=0)
    _zeroed_axes(ax, "accuracy change (points), 95% paired CI", title or "Single sweep points against the baseline")
    return fig


def crossing_probes(probes: pd.DataFrame, within: pd.DataFrame | None = None, other: pd.DataFrame | None = None,
                    other_label: str = "other") -> Figure:
    """An adaptive search (``probes.csv``): one panel per curve, each probe at its fraction with
    its interval on Δ (points) when it stopped, coloured by its decision (within green, outside
    red, unresolved grey) and labelled with its step, and with the questions it read where it
    stopped before the whole population (``n_population`` of ``probes`` or ``within``, else the
    most any probe read); the -margin line and, from ``within`` (its ``crossing_pct`` /
    ``margin_pts`` columns), the crossing. The Δ axis is linear within twice the margin and
    logarithmic beyond, so the probes that decide a crossing stay legible beside those 20
    points out.

    ``other``: the probes of the same search run another way (another dtype), drawn thin and
    hollow a little to the right of each fraction, labelled ``other_label`` (panels for the
    curves either frame holds)."""
    if other is None or len(probes):  # with ``other``, the search's own may have no probe yet
        _require(probes, ["score_fn", "pct", "decision", "delta_lo", "delta_hi", "n_items", "step"], "probes frame")
    if other is not None:
        _require(other, ["score_fn", "pct", "decision", "delta_lo", "delta_hi"], "other probes frame")
    curves = list(dict.fromkeys([*probes["score_fn"], *([] if other is None else other["score_fn"])]))
    if within is not None and "score_fn" in within:  # in the table's order
        order = {c: i for i, c in enumerate(within["score_fn"])}
        curves.sort(key=lambda c: order.get(c, len(order)))
    cols = min(3, max(1, len(curves)))
    rows = math.ceil(len(curves) / cols)
    fig = Figure(figsize=(4.2 * cols, 3.2 * rows), layout="constrained")
    colour = {"within": "tab:green", "outside": "tab:red", "unresolved": "grey"}
    rows_of = {} if within is None else {r["score_fn"]: r for _, r in within.iterrows()}
    census = next((float(f["n_population"].max()) for f in (probes, within) if f is not None and "n_population" in f
                   and len(f)), float(probes["n_items"].max()) if len(probes) else 0.0)
    for i, name in enumerate(curves):
        ax = fig.add_subplot(rows, cols, i + 1)
        got = probes[probes["score_fn"] == name]
        for _, p in got.iterrows():
            lo, hi = 100 * float(p["delta_lo"]), 100 * float(p["delta_hi"])
            c = colour.get(p["decision"], "grey")
            ax.plot([p["pct"], p["pct"]], [lo, hi], color=c, lw=3, solid_capstyle="butt")
            ax.plot([p["pct"]], [(lo + hi) / 2], "o", color=c, ms=4)  # an exhausted probe's interval is a point
            n = int(p["n_items"])
            ax.annotate(f"{int(p['step'])}" + (f": n={n}" if n < census else ""), (p["pct"], hi),
                        textcoords="offset points", xytext=(3, 2), fontsize=7)
        if other is not None:
            theirs = other[other["score_fn"] == name]
            shift = 0.006 * float(np.nanmax([*probes["pct"], *other["pct"], 1.0]))
            for _, p in theirs.iterrows():
                lo, hi = 100 * float(p["delta_lo"]), 100 * float(p["delta_hi"])
                c = colour.get(p["decision"], "grey")
                ax.plot([p["pct"] + shift] * 2, [lo, hi], color=c, lw=1, alpha=0.7)
                ax.plot([p["pct"] + shift], [(lo + hi) / 2], "o", mfc="none", mec=c, ms=4, alpha=0.7)
            if len(theirs):
                ax.plot([], [], "o", mfc="none", mec="grey", ms=4, label=other_label)
                ax.legend(fontsize=7, loc="lower left", frameon=False)
        row = rows_of.get(name)
        margin = float(row["margin_pts"]) if row is not None and "margin_pts" in row else 1.0
        ax.axhline(0.0, color="black", lw=0.8)
        ax.axhline(-margin, color="black", lw=0.8, ls=":")
        ax.set_yscale("symlog", linthresh=2 * margin, linscale=2)
        ax.yaxis.set_major_locator(FixedLocator([s * v for s in (-1, 1) for v in (1, 2, 5, 10, 20, 50, 100)] + [0]))
        ax.yaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:g}"))
        ax.yaxis.set_minor_locator(NullLocator())
        if row is not None and "crossing_pct" in row and np.isfinite(float(row["crossing_pct"])):
            ax.axvline(float(row["crossing_pct"]), color="tab:blue", lw=1, ls="--")
            title = f"{name}: {float(row['crossing_pct']):g} % ({row['crossing_status']})"
        elif row is not None and row.get("crossing_status") == "constant scores":  # one ablation over the range
            title = f"{name}: no crossing (constant scores)"
        else:
            title = name
        top = float(row["range_pct"]) if row is not None and "range_pct" in row else float(
            pd.concat([got["pct"], other.loc[other["score_fn"] == name, "pct"] if other is not None else got["pct"]]).max())
        ax.set_xlim(-0.03 * top, 1.12 * top)
        ax.set_title(title, fontsize=9)
        ax.set_xlabel("% heads (target)", fontsize=8)
        ax.set_ylabel("Δ accuracy (points)", fontsize=8)
        ax.tick_params(labelsize=7)
        ax.grid(alpha=0.3)
    return fig


READS_FAMILY = {"z": "output norm", "rows": "attention weights", "pattern": "attention weights",
                "v": "value norm"}  # the paper's three groups of functions, by the hook a score reads
FAMILY_COLOUR = {"output norm": "tab:blue", "attention weights": "tab:orange", "value norm": "tab:green",
                 "random heads": "dimgrey", "static ranking": "tab:purple", "other": "tab:brown"}


def curve_family(name: str) -> str:
    """The group a curve's colour says: random heads, a static ranking (``static:ID``), or the
    paper's group of a score function by what the registry says it reads (``ScoreFn.reads``:
    head outputs, the pattern, value vectors); other."""
    if name == "random":
        return "random heads"
    if name.startswith("static:"):
        return "static ranking"
    reads = SCORES[name].reads if name in SCORES else ()
    return READS_FAMILY[reads[0]] if len(reads) == 1 and reads[0] in READS_FAMILY else "other"


def crossing_overview(within: pd.DataFrame, by: Sequence[str] = (), reference: pd.DataFrame | None = None,
                      reference_label: str = "reference") -> Figure:
    """Adaptive crossings side by side (Table 2 as a figure): a panel per group of ``by`` columns
    (a (model, task) pair), a row per curve, each curve's bracket [low, high) on the % of heads
    axis -- a short bar for a resolved crossing (its dot at the crossing), an arrow to the
    range's end for a lower bound, a pale bar for a search still running (or unresolved) over
    the bracket it has got to, and a word where there is no bracket (constant scores, not
    started). Random heads' bracket is a grey band across its panel: what a function must beat.
    Colours are the paper's groups of functions (output norm, attention weights, value norm).

    ``within``: ``within_1pt.csv`` rows of searches (``score_fn``, ``crossing_status`` or
    ``status``, ``range_pct``, the ``by`` columns, and ``bracket_low_pct`` / ``bracket_high_pct``
    where a row has a bracket: a table whose rows have none yet may lack them), not empty;
    ``reference``: values to mark beside them (the paper's), a red cross at ``pct`` for each row
    of the same ``by`` values and ``score_fn``, named ``reference_label``."""
    frame = within.rename(columns={"status": "crossing_status"})
    _require(frame, ["score_fn", "crossing_status", "range_pct", *by], "crossings frame")
    frame = frame.reindex(columns=frame.columns.union(["bracket_low_pct", "bracket_high_pct"], sort=False))
    if reference is not None:
        _require(reference, ["score_fn", "pct", *by], "reference frame")
    groups = list(dict.fromkeys(map(tuple, frame[list(by)].itertuples(index=False)))) if by else [()]
    curves = list(dict.fromkeys(frame["score_fn"]))
    row_of = {c: i for i, c in enumerate(curves)}
    fig = Figure(figsize=(3.4 * len(groups) + 1.2, 0.32 * len(curves) + 1.4), layout="constrained")
    axes = fig.subplots(1, len(groups), sharey=True, squeeze=False)[0]
    for ax, key in zip(axes, groups):
        rows = frame[np.logical_and.reduce([frame[c] == v for c, v in zip(by, key)])] if by else frame
        top = float(rows["range_pct"].max()) if len(rows) else 1.0
        idle = bool(len(rows)) and (rows["crossing_status"] == "not started").all()
        if idle:  # one word for the panel, not one a row
            ax.text(0.5, 0.5, "not started", transform=ax.transAxes, ha="center", va="center", color="grey")
        for _, r in rows.iterrows():
            y, status = row_of[r["score_fn"]], str(r["crossing_status"])
            if idle:
                continue
            lo, hi = float(r["bracket_low_pct"]), float(r["bracket_high_pct"])
            colour = FAMILY_COLOUR[curve_family(r["score_fn"])]
            if not np.isfinite(lo):  # no bracket: constant scores, not started
                ax.text(0.0, y, status, va="center", fontsize=7, color="grey")
                continue
            if r["score_fn"] == "random" and status == "resolved":
                ax.axvspan(lo, hi, color="lightgrey", alpha=0.6, lw=0, zorder=0)
            if status == "resolved":
                ax.plot([lo, hi], [y, y], color=colour, lw=5, solid_capstyle="butt")
                ax.plot([lo], [y], "o", color=colour, ms=5)
                ax.text(hi, y, f" {lo:g}", va="center", fontsize=7, color=colour)
            elif status == "lower bound":
                ax.plot([lo], [y], "o", color=colour, ms=5)
                ax.annotate("", (top, y), (lo, y), arrowprops=dict(arrowstyle="->", color=colour, lw=1.5))
            else:  # a search still running (or unresolved): the bracket it has got to
                ax.plot([lo, min(hi, top)], [y, y], color=colour, lw=5, alpha=0.3, solid_capstyle="butt")
                ax.text(min(hi, top), y, f" {'running' if status == 'pending' else status}", va="center", fontsize=7,
                        color="grey")
        if reference is not None and len(reference):
            theirs = reference[np.logical_and.reduce([reference[c] == v for c, v in zip(by, key)])] if by else reference
            for _, r in theirs.iterrows():
                if r["score_fn"] in row_of and np.isfinite(float(r["pct"])):
                    ax.plot([float(r["pct"])], [row_of[r["score_fn"]]], "x", color="tab:red", ms=6, mew=1.5)
        ax.set_xlim(-0.02 * top, 1.04 * top)
        ax.set_title(" / ".join(str(v) for v in key), fontsize=9)
        ax.set_xlabel("% heads (target)", fontsize=8)
        ax.grid(axis="x", alpha=0.3)
        ax.tick_params(labelsize=7)
    axes[0].set_yticks(range(len(curves)), curves)
    axes[0].set_ylim(len(curves) - 0.5, -0.5)  # the table's order, top to bottom
    handles = [Patch(color=c, label=f) for f, c in FAMILY_COLOUR.items()
               if any(curve_family(x) == f for x in curves)]
    if reference is not None and len(reference):
        handles.append(Line2D([], [], marker="x", ls="", color="tab:red", label=reference_label))
    fig.legend(handles=handles, loc="outside lower center", ncols=len(handles), fontsize=7, frameon=False)
    return fig


def _zeroed_axes(ax, ylabel: str, title: str) -> None:
    """Labels, grid and an outside legend for a plot against % heads zeroed."""
    ax.set_xlabel("% heads zeroed (realised)")
    ax.set_ylabel(ylabel)
    ax.set_title(title)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.01, 1.0), frameon=False)


# --- distributions ----------------------------------------------------------------------

def _values(frame: pd.DataFrame, score_fn: str, label: str) -> np.ndarray:
    _require(frame, ["score_fn", "value"], f"scores frame {label!r}")
    v = frame.loc[frame["score_fn"] == score_fn, "value"].to_numpy(dtype=float)
    return v[np.isfinite(v)]


def score_distributions(frames: Mapping[str, pd.DataFrame], score_fn: str | Sequence[str] | None = None,
                        kind: str = "violin") -> Figure:
    """Distribution over heads of each score function, one violin (or histogram) per
    model/dataset label. ``score_fn``: one id, several, or None for every id all frames share."""
    if not frames:
        raise LensHeadsError("no score frames to compare")
    if kind not in ("violin", "hist"):
        raise LensHeadsError(f"kind must be 'violin' or 'hist', not {kind!r}")
    for label, frame in frames.items():
        _require(frame, ["score_fn", "value"], f"scores frame {label!r}")
    if score_fn is None:
        shared = set.intersection(*(set(f["score_fn"].unique()) for f in frames.values()))
        order = list(dict.fromkeys(next(iter(frames.values()))["score_fn"]))
        fns = [f for f in order if f in shared]
    else:
        fns = [score_fn] if isinstance(score_fn, str) else list(score_fn)
    if not fns:
        raise LensHeadsError("the score frames share no score function")
    labels = list(frames)
    single = len(labels) == 1
    ncols = min(5 if single else 3, len(fns))
    nrows = -(-len(fns) // ncols)
    w, h = (2.9, 2.1) if single else (4.2, 3.2)
    fig = Figure(figsize=(w * ncols, h * nrows), layout="constrained")
    if single:
        fig.suptitle(f"Per-head score distributions: {labels[0]}", fontsize=11)
    axes = fig.subplots(nrows, ncols, squeeze=False).ravel()
    for ax, fn in zip(axes, fns):
        data = [_values(frames[lb], fn, lb) for lb in labels]
        if not any(len(d) for d in data):
            raise LensHeadsError(f"score function {fn!r} has no values in any frame")
        if kind == "violin":
            pos = [i for i, d in enumerate(data) if len(d) > 1]
            if pos:
                ax.violinplot([data[i] for i in pos], positions=pos, showmedians=True)
            if single:
                ax.set_xticks([])
            else:
                ax.set_xticks(range(len(labels)), labels, rotation=20 if len(labels) > 2 else 0)
        else:
            for lb, d in zip(labels, data):
                ax.hist(d, bins=30, alpha=0.5, label=lb)
            ax.legend(fontsize=7)
        ax.set_title(fn, fontsize=10)
        ax.grid(alpha=0.3)
    for ax in axes[len(fns):]:
        ax.set_visible(False)
    return fig


def distance_heatmap(matrix: pd.DataFrame, title: str = "Wasserstein distance") -> Figure:
    """A labelled square matrix of distances (``scores.wasserstein_distances``) as a heatmap
    with each value printed in its cell."""
    labels = list(matrix.index)
    d = matrix.to_numpy(dtype=float)
    n = len(labels)
    fig = Figure(figsize=(2.5 + 0.9 * n, 2.0 + 0.8 * n), layout="constrained")
    ax = fig.add_subplot()
    im = ax.imshow(d, cmap="magma_r", interpolation="nearest")
    ax.set_xticks(range(n), labels, rotation=30, ha="right")
    ax.set_yticks(range(n), labels)
    top = d.max() if d.max() > 0 else 1.0
    for (i, j), v in np.ndenumerate(d):
        ax.text(j, i, f"{v:.3g}", ha="center", va="center", fontsize=8,
                color="white" if v > 0.6 * top else "black")
    ax.set_title(title)
    fig.colorbar(im, ax=ax, shrink=0.85)
    return fig


# --- diagnosis --------------------------------------------------------------------------

def diagnosis_map(diag: pd.DataFrame) -> Figure:
    """Class of every head (layer x head, categorical colours), with each head's ALiBi slope
    on an axis above it when the frame has finite ``alibi_slope`` values."""
    _require(diag, ["layer", "head", "class"], "diagnosis frame")
    names = diag["class"].astype(str).map(canonical_class)
    present = list(names.unique())
    classes = [c for c in CLASSES if c in present] + [c for c in present if c not in CLASSES]
    extra = iter(_EXTRA_COLOURS * 4)
    colours = [DIAGNOSIS_COLOURS[c] if c in DIAGNOSIS_COLOURS else next(extra) for c in classes]
    code = {c: i for i, c in enumerate(classes)}
    n_layers, n_heads = int(diag["layer"].max()) + 1, int(diag["head"].max()) + 1
    grid = np.full((n_layers, n_heads), np.nan)
    grid[diag["layer"].to_numpy(int), diag["head"].to_numpy(int)] = names.map(code).to_numpy(float)

    slopes = None
    if "alibi_slope" in diag.columns:
        s = diag.groupby("head")["alibi_slope"].mean().reindex(range(n_heads))
        if np.isfinite(s.to_numpy(dtype=float)).any():
            slopes = s.to_numpy(dtype=float)

    width = min(16.0, 3.0 + 0.42 * n_heads)
    height = min(18.0, 1.8 + 0.28 * n_layers) + (1.4 if slopes is not None else 0)
    fig = Figure(figsize=(width, height), layout="constrained")
    if slopes is not None:
        ax_s, ax = fig.subplots(2, 1, sharex=True, height_ratios=[1, 4])
        ax_s.bar(range(n_heads), slopes, color="#4c72b0")
        ax_s.set_yscale("log")
        ax_s.set_ylabel("ALiBi\nslope")
        ax_s.set_title("Head classes and ALiBi slope per head")
        ax_s.grid(alpha=0.3, axis="y")
    else:
        ax = fig.add_subplot()
        ax.set_title("Head classes")
    ax.imshow(grid, aspect="auto", cmap=ListedColormap(colours), vmin=-0.5, vmax=len(classes) - 0.5,
              interpolation="nearest")
    ax.set_xticks(range(n_heads), [str(h) for h in range(n_heads)],
                  fontsize=8 if n_heads <= 24 else 6)
    step = max(1, n_layers // 16)
    ax.set_yticks(range(0, n_layers, step), [str(L) for L in range(0, n_layers, step)])
    ax.set_xlabel("head")
    ax.set_ylabel("layer")
    counts = names.value_counts()
    handles = [Patch(color=col, label=f"{class_label(c)} ({counts.get(c, 0)})") for c, col in zip(classes, colours)]
    fig.legend(handles=handles, loc="outside lower center", ncols=min(len(handles), 5), fontsize=8, frameon=False)
    return fig
