"""The surgical-repair paper's three findings about the heads surgery left alone (arXiv 2603.09616),
read off several finished ``surgery_dynamics.py`` runs side by side (docs/methods.md §7,
"Drift of the heads": the findings' definitions):

    python analyses/surgery_findings.py \\
        --runs low-c4=analyses/results/surgery_dynamics/low_c4,low-wt2=...,ext-c4=...,ext-wt2=... \\
        --out analyses/results/surgery_dynamics

A view: it loads no model and computes nothing but the comparisons below from each run's committed
tables (``run.json``, ``curves.csv``, ``epochs.csv`` and ``on-NAME/curves.csv``), so it writes the
same tables byte for byte whenever the runs are the same. Per run and per probe set:

1. **early redistribution**: frozen heads moved (pattern distance > 0.05) against the model before
   surgery right after re-initialisation, and -- what training itself moved -- against the
   re-initialised state at the first checkpoint and within the first tenth of the steps, with
   the share of the frozen heads' final mean distance to the re-initialised state reached by then;
   and how far the frozen heads had got when the re-initialised heads were half-way to their own
   final distance (above 50 %: the frozen heads move ahead of the heads that wake);
2. **late degradation**: whether the probe perplexity ends above its best; beside it, frozen heads
   moved since re-initialisation at the end minus at half the steps, and after the re-initialised
   heads settled (90 % of their final distance), with the share of the frozen heads' final mean
   distance added after that;
3. **re-optimisation**: the perplexity at the end against the model before surgery, on held-out
   text (the probes, and the run's own held-out documents) and on the training text itself
   (``--measure-on train``).

Outputs (OUT): findings.csv (one row per run and probe set), findings.png (frozen heads moved and
perplexity against steps, every run on one figure), findings.md (the table and, per finding, what
the runs show, with numbers).
"""

from __future__ import annotations

import json
import math
import sys
from pathlib import Path

import pandas as pd

sys.path.insert(0, str(Path(__file__).resolve().parent))

from common import markdown_table, out_folder, script_main, split_list, write_csv, write_figure  # noqa: E402

from lens_heads.errors import LensHeadsError  # noqa: E402
from lens_heads.files.atomic import atomic_write_text, read_csv_exact  # noqa: E402

EARLY = 0.1  # the first tenth of the steps is "early"
SETTLED = 0.9  # the re-initialised heads have settled once their mean distance reaches 90 % of its final value
LATE_MOVED_PCT = 1.0  # late degradation: >= 1 % of the frozen heads moved in the second half ...
LATE_PPL_PCT = 0.5  # ... or the held-out perplexity ends >= 0.5 % above its best


def parse_args(argv):
    import argparse

    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--runs", required=True, help="LABEL=FOLDER,... (surgery_dynamics.py output folders)")
    p.add_argument("--out", required=True, help="output folder")
    args = p.parse_args(argv)
    runs = {}
    for item in split_list(args.runs, "runs"):
        label, sep, folder = item.partition("=")
        if not sep or not label.strip() or not folder.strip():
            raise LensHeadsError(f"--runs {item!r}: give LABEL=FOLDER")
        folder = Path(folder.strip())
        if not (folder / "run.json").is_file() or not (folder / "curves.csv").is_file():
            raise LensHeadsError(f"--runs {label}: {folder} holds no surgery_dynamics.py tables (run.json, curves.csv)")
        if label.strip() in runs:
            raise LensHeadsError(f"--runs: label {label.strip()!r} given twice")
        runs[label.strip()] = folder
    args.runs = runs
    return args


def at_step(curves: pd.DataFrame, step: float) -> pd.Series:
    """The last trained state at or before ``step`` (the state right after re-initialisation when
    none was trained by then)."""
    trained = curves[curves["kind"] != "before"]
    return trained[trained["step"] <= step].iloc[-1]


def reinitialised_distance(curves: pd.DataFrame) -> pd.Series:
    """Per state, the mean distance to the re-initialised state over every re-initialised head
    (targets and, under extended surgery, the healthy heads re-initialised too)."""
    groups = [g for g in ("target", "target_healthy") if (curves[f"n_{g}"] > 0).any()]
    total = sum(curves[f"n_{g}"] * curves[f"mean_tv_reinit_{g}"] for g in groups)
    return total / sum(curves[f"n_{g}"] for g in groups)


def probe_set_row(label: str, meta: dict, where: str, curves: pd.DataFrame, epochs: pd.DataFrame) -> dict | None:
    """One row of findings.csv: a run measured on one probe set (None before it has a trained
    state). The late window ends at the last checkpoint ("end"), not at restored best weights;
    re-optimisation reads the last state, the model the run exports. ``epochs``: the run's own
    held-out perplexity (before surgery, then per epoch), the same for every probe set."""
    before = curves[curves["kind"] == "before"].iloc[0]
    trained = curves[curves["kind"] != "before"]
    checkpoints = trained[trained["kind"] == "step"]
    if checkpoints.empty:
        return None
    reinit, end, last = trained.iloc[0], checkpoints.iloc[-1], trained.iloc[-1]
    steps = int(end["step"])
    first = checkpoints.iloc[0]
    early = trained[trained["step"] <= max(EARLY * steps, float(first["step"]))]
    early_end = early.iloc[-1]
    half = at_step(checkpoints, steps / 2) if (checkpoints["step"] <= steps / 2).any() else reinit
    best = checkpoints.loc[checkpoints["ppl"].idxmin()]
    n = int(before["n_frozen"])
    tv_end = float(end["mean_tv_reinit_frozen"])

    def pct(k) -> float:
        return 100.0 * float(k) / n if n else math.nan

    def share(x) -> float:  # of the frozen heads' mean distance to the re-initialised state at the end
        return 100.0 * float(x) / tv_end if tv_end > 0 else math.nan

    held = epochs[epochs["pass"] > 0]
    woken = reinitialised_distance(checkpoints)  # the re-initialised heads' mean distance to their start
    half_woken = checkpoints[woken >= 0.5 * woken.iloc[-1]].iloc[0]
    settled = checkpoints[woken >= SETTLED * woken.iloc[-1]].iloc[0]

    return {"run": label, "probes": meta["measured_on"][where], "probe_set": where,
            "targets": meta["targets"] + (f" + healthy {meta['reinit_healthy']}" if meta["reinit_healthy"] else ""),
            "train_data": meta["train_data"], "steps": steps, "n_frozen": n,
            "moved_frozen_reinit": int(reinit["moved_frozen"]), "moved_frozen_first": int(first["moved_frozen"]),
            "first_step": int(first["step"]), "moved_frozen_early_max": int(early["moved_frozen"].max()),
            "moved_frozen_half": int(half["moved_frozen"]), "moved_frozen_end": int(end["moved_frozen"]),
            "since_reinit_first": int(first["moved_frozen_since_reinit"]),
            "since_reinit_early_max": int(early["moved_frozen_since_reinit"].max()),
            "since_reinit_half": int(half["moved_frozen_since_reinit"]),
            "since_reinit_end": int(end["moved_frozen_since_reinit"]),
            "tv_reinit_first": float(first["mean_tv_reinit_frozen"]), "tv_reinit_half": float(half["mean_tv_reinit_frozen"]),
            "tv_reinit_end": tv_end, "early_share_pct": share(early_end["mean_tv_reinit_frozen"]),
            "late_share_pct": share(tv_end - float(half["mean_tv_reinit_frozen"])),
            "late_moved_pct": pct(int(end["moved_frozen_since_reinit"]) - int(half["moved_frozen_since_reinit"])),
            "tv_reinit_reinitialised_end": float(woken.iloc[-1]), "half_woken_step": int(half_woken["step"]),
            "frozen_share_at_half_woken_pct": share(half_woken["mean_tv_reinit_frozen"]),
            "settled_step": int(settled["step"]), "since_reinit_settled": int(settled["moved_frozen_since_reinit"]),
            "after_settled_share_pct": share(tv_end - float(settled["mean_tv_reinit_frozen"])),
            "ppl_before": float(before["ppl"]), "ppl_reinit": float(reinit["ppl"]), "ppl_best": float(best["ppl"]),
            "best_step": int(best["step"]), "ppl_end": float(end["ppl"]),
            "end_above_best_pct": 100.0 * (float(end["ppl"]) / float(best["ppl"]) - 1),
            "ppl_exported": float(last["ppl"]), "exported": str(last["point"]),
            "exported_vs_before_pct": 100.0 * (float(last["ppl"]) / float(before["ppl"]) - 1),
            "heldout_ppl_before": float(epochs.loc[epochs["pass"] == 0, "ppl"].iloc[0]),
            "heldout_ppl_reinit": float(held["ppl"].iloc[0]), "heldout_ppl_end": float(held["ppl"].iloc[-1]),
            "heldout_step_end": int(held["step"].iloc[-1]),
            "complete": bool(meta["complete"])}


def findings(runs: dict[str, Path]) -> tuple[pd.DataFrame, dict[str, dict[str, pd.DataFrame]]]:
    rows, curves = [], {}
    for label, folder in runs.items():
        meta = json.loads((folder / "run.json").read_text())
        epochs = read_csv_exact(folder / "epochs.csv")
        curves[label] = {}
        for where in meta["measured_on"]:
            row = probe_set_row(label, meta, where, c := read_csv_exact(folder / where / "curves.csv"), epochs)
            if row is not None:  # a stopped run: that probe set has no trained state yet
                curves[label][where] = c
                rows.append(row)
    if not rows:
        raise LensHeadsError("no run has a checkpoint measured yet: finish (or resume) surgery_dynamics.py first")
    return pd.DataFrame(rows), curves


def verdicts(table: pd.DataFrame) -> list[str]:
    """Per finding, what the runs show (the rules: docs/methods.md §7)."""
    held = table[~table["probes"].str.contains("trained on", regex=False)]
    main = table[table["probe_set"] == "."]
    out = ["**Early redistribution** (re-initialisation zeroes the targets' output, which moves heads after "
           "them at once; what training then moves is counted against the re-initialised state, on the "
           "held-out probes of each run):"]
    out += [f"- {r.run}: {r.moved_frozen_reinit} of {r.n_frozen} frozen heads moved right after "
            f"re-initialisation; since then {r.since_reinit_first} by step {r.first_step}, at most "
            f"{r.since_reinit_early_max} within the first tenth of the steps ({r.early_share_pct:.0f} % of the "
            f"frozen heads' final mean distance {r.tv_reinit_end:.4f}), {r.since_reinit_end} at the end. The "
            f"re-initialised heads reached half their final distance ({r.tv_reinit_reinitialised_end:.4f}) at step "
            f"{r.half_woken_step}, the frozen heads {r.frozen_share_at_half_woken_pct:.0f} % of theirs by then."
            for r in main.itertuples()]
    out += ["", f"**Late degradation** (probe perplexity ending >= {LATE_PPL_PCT:g} % above its best state; beside "
            f"it, frozen heads moved since re-initialisation from half the steps to the end, and after the "
            f"re-initialised heads settled at {100 * SETTLED:g} % of their final distance):"]
    for r in held.itertuples():
        seen = r.end_above_best_pct >= LATE_PPL_PCT
        still = "" if seen or r.late_moved_pct < LATE_MOVED_PCT else " (frozen heads still moving while perplexity " \
            "falls: redistribution under way, not degradation)"
        out.append(f"- {r.run} (trained on {r.train_data}), on {r.probes}: {'yes' if seen else 'no'}{still} -- "
                   f"perplexity {r.ppl_best:.2f} at its best (step {r.best_step}) -> {r.ppl_end:.2f} at the end "
                   f"({r.end_above_best_pct:+.2f} %); frozen heads moved since re-initialisation "
                   f"{r.since_reinit_half} -> {r.since_reinit_end} over the second half "
                   f"({r.late_moved_pct:+.1f} % of them), {r.since_reinit_settled} -> {r.since_reinit_end} after "
                   f"step {r.settled_step} ({r.after_settled_share_pct:.0f} % of their final mean distance added "
                   f"after it).")
    out += ["", "**Re-optimisation** (perplexity at the end against the model before surgery; the paper: "
            "training perplexity 25 % below the original after extended surgery, C4 validation 29.30 vs 32.42):"]
    out += [f"- {r.run}, held-out documents of the run (trained on {r.train_data}): {r.heldout_ppl_before:.2f} "
            f"before, {r.heldout_ppl_reinit:.2f} after re-initialisation, {r.heldout_ppl_end:.2f} at step "
            f"{r.heldout_step_end} ({100 * (r.heldout_ppl_end / r.heldout_ppl_before - 1):+.1f} %)."
            for r in main.itertuples()]
    out += [f"- {r.run}, on {r.probes}: {r.ppl_before:.2f} before, {r.ppl_reinit:.2f} after re-initialisation, "
            f"{r.ppl_exported:.2f} in the exported model ({r.exported}; {r.exported_vs_before_pct:+.1f} %)."
            for r in table.itertuples()]
    return out


def figure(curves: dict[str, dict[str, pd.DataFrame]], table: pd.DataFrame):
    """Frozen heads moved since re-initialisation and their mean distance to that state (held-out
    probes), then perplexity per probe set, against steps; every run one colour."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    sets = list(dict.fromkeys(table["probes"]))
    fig, axes = plt.subplots(1, 2 + len(sets), figsize=(4.2 * (2 + len(sets)), 3.6))
    for label, by_set in curves.items():
        if "." not in by_set:
            continue
        c = by_set["."][lambda d: d["kind"] != "before"]
        (line,) = axes[0].plot(c["step"], 100 * c["moved_frozen_since_reinit"] / c["n_frozen"], marker=".",
                               label=label)
        axes[1].plot(c["step"], c["mean_tv_reinit_frozen"], marker=".", color=line.get_color(), label=label)
        for r in table[table["run"] == label].itertuples():
            ax = axes[2 + sets.index(r.probes)]
            d = by_set[r.probe_set]
            t = d[d["kind"] != "before"]
            ax.plot(t["step"], t["ppl"], marker=".", color=line.get_color(), label=label)
            ax.axhline(float(d["ppl"].iloc[0]), color=line.get_color(), lw=0.8, ls=":")
    axes[0].set(title="frozen heads moved since re-init", xlabel="step", ylabel="% of frozen heads")
    axes[1].set(title="frozen heads: mean distance to re-init", xlabel="step", ylabel="mean pattern distance")
    for ax, name in zip(axes[2:], sets):
        ax.set(title=f"perplexity: {name}"[:60], xlabel="step", yscale="log")
    axes[0].legend(fontsize=7)
    fig.suptitle("After surgery: what training moved in the frozen heads, and perplexity (dotted: before surgery)",
                 fontsize=10)
    fig.tight_layout()
    return fig


def main(argv=None) -> int:
    args = parse_args(argv)
    out = out_folder(args.out)
    table, curves = findings(args.runs)
    write_csv(table, out / "findings.csv")
    write_figure(figure(curves, table), out / "findings.png")
    cols = ["run", "probes", "steps", "moved_frozen_reinit", "since_reinit_first", "since_reinit_half",
            "since_reinit_end", "tv_reinit_end", "early_share_pct", "late_share_pct", "ppl_before", "ppl_reinit",
            "ppl_best", "ppl_end", "exported_vs_before_pct"]
    text = ["# After surgery: the paper's three findings on these runs", "",
            "_Written by `analyses/surgery_findings.py` from the runs' tables; do not edit by hand._", "",
            "Runs: " + ", ".join(f"{k} = `{v.as_posix()}`" for k, v in args.runs.items()), "",
            markdown_table(table, 2, cols), ""]
    if not table["complete"].all():
        text += ["**Some runs are incomplete** (" + ", ".join(sorted(set(table.loc[~table["complete"], "run"])))
                 + "): their states so far.", ""]
    atomic_write_text(out / "findings.md", "\n".join(text + verdicts(table)) + "\n", make_parents=True)
    print(f"wrote {out / 'findings.csv'}, findings.png, findings.md", flush=True)
    return 0


if __name__ == "__main__":
    script_main(main)
