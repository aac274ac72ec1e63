"""Does the paper's ranking of inactivity scores survive mean ablation, and how far below a
task-aware ranking (attribution patching) do the scores sit?

    HF_HUB_OFFLINE=1 HF_DATASETS_OFFLINE=1 LENS_HEADS_DATA=... python analyses/beyond_zero.py \\
        --models smollm2-135m --task piqa --limit 200 --out analyses/results/beyond_zero

For each model and each replacement (--replacements, default zero and mean:c4), one sweep
(lens_heads.sweep) of --limit questions with

* per-input curves: AHON(LN), AWFT and atp thresholded on each input (``score:ID@TAU``; atp per
  question, an oracle that knows the gold answer), and random heads (each (input, head) with
  probability p, --seeds seeds);
* static curves: the ceil(p x heads) least active heads by the dataset-level AHON(LN), AWFT and
  |atp|, and random head sets (a seeded order per seed), zeroed on every input;

all at the same target fractions, the ablated heads zeroed or replaced by their mean over C4.
Reported per curve: the largest % of heads zeroed within 1 accuracy point of the baseline, with
its paired bootstrap interval, and the normalised AUC. Everything is stored as it is measured
(OUT/store/REPLACEMENT, one sweep store each): a stopped run resumes where it stopped.

Outputs (OUT): within_MODEL.csv (every curve of every replacement), summary.md, store/.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pandas as pd

sys.path.insert(0, str(Path(__file__).resolve().parent))

from common import Run, base_parser, check_positive, markdown_table, model_label, out_folder, script_main, \
    split_list, write_csv  # noqa: E402

SCORES = ["ahon_ln", "awft", "atp"]
FRACTIONS = "0,0.05,0.1,0.2,0.3,0.4,0.5"


def parse_args(argv):
    from lens_heads.interventions.thresholds import parse_fractions

    p = base_parser(__doc__, "analyses/results/beyond_zero")
    p.set_defaults(models="smollm2-135m", batch_size=16)
    p.add_argument("--task", default="piqa")
    p.add_argument("--limit", type=int, default=200)
    p.add_argument("--scores", default=",".join(SCORES), help=f"curves, per input and static (default {','.join(SCORES)})")
    p.add_argument("--fractions", default=FRACTIONS, help=f"target fractions (default {FRACTIONS})")
    p.add_argument("--seeds", type=int, default=3, help="random-head seeds (default 3)")
    p.add_argument("--replacements", default="zero,mean:c4", help="what ablated heads become (default zero,mean:c4)")
    p.add_argument("--n-boot", type=int, default=1000)
    args = p.parse_args(argv)
    args.models = split_list(args.models, "models")
    args.scores = split_list(args.scores, "scores")
    args.replacements = split_list(args.replacements, "replacements")
    args.fractions = parse_fractions(args.fractions)
    check_positive(args, "limit", "seeds", "batch_size", "n_boot")
    return args


def sweep_config(args, replacement: str):
    from lens_heads.sweep import SweepConfig

    cfg = SweepConfig(task=args.task, score_ids=list(args.scores), static_ids=[*args.scores, "random"],
                      fractions=list(args.fractions), random_seeds=list(range(args.seeds)), limit=args.limit,
                      batch_size=args.batch_size, n_boot=args.n_boot, replacement=replacement)
    cfg.validate()
    return cfg


def findings(within: pd.DataFrame, scores: list[str]) -> str:
    """What the table says, in sentences computed from it (no judgement added)."""
    lines = []
    for rep, part in within.groupby("replacement", sort=False):
        w = part.set_index("score_fn")["max_pct_zeroed_within_1pt"]
        for kind, prefix in (("per input", ""), ("static", "static:")):
            inactivity = [s for s in scores if s != "atp"]
            order = sorted(inactivity, key=lambda s: -w.get(prefix + s, float("nan")))
            best = order[0]
            line = (f"- {rep}, {kind}: " + " > ".join(f"{s} {w[prefix + s]:.1f} %" for s in order)
                    + f"; random {w[prefix + 'random']:.1f} %")
            if "atp" in scores:
                line += f"; atp {w[prefix + 'atp']:.1f} % ({w[prefix + 'atp'] - w[prefix + best]:+.1f} points of heads vs {best})"
            lines.append(line)
    return "\n".join(lines)


def main(argv=None) -> int:
    from lens_heads.data import load_task
    from lens_heads.models import load_model
    from lens_heads.sweep import run_sweep

    args = parse_args(argv)
    out = out_folder(args.out)
    load_task(args.task)  # bad task names fail before any model loads
    configs = {rep: sweep_config(args, rep) for rep in args.replacements}  # bad scores / replacements too
    run = Run.start(out, args.device, __file__, argv)
    sections = []
    for spec in args.models:
        label = model_label(spec)
        model = load_model(spec, dtype=args.dtype, device=args.device)
        frames = []
        for rep, cfg in configs.items():
            res = run_sweep(model, cfg, out / "store" / rep.replace(":", "_"), progress=True)
            frames.append(res.within.assign(model=label, replacement=rep))
            print(f"{label} / {rep}: done, {run.elapsed():.0f} s", flush=True)
        within = pd.concat(frames, ignore_index=True)
        write_csv(within, out / f"within_{label}.csv")
        cols = ["replacement", "score_fn", "max_pct_zeroed_within_1pt", "ci_low", "ci_high", "crossing_gap_pct",
                "auc", "auc_ci_low", "auc_ci_high", "base_accuracy"]
        text = (f"{args.limit} {args.task} questions, {model.dtype}; fractions {', '.join(f'{p:g}' for p in args.fractions)}; "
                f"random: {args.seeds} seeds. `static:` rows zero a fixed set on every input; the others decide per "
                f"input. Within 1 point: largest % of heads zeroed with accuracy >= baseline - 1 point "
                f"[95 % paired bootstrap interval]; AUC over the common range.\n\n"
                + markdown_table(within[cols], 3) + "\n\n" + findings(within, args.scores))
        sections.append((f"{label} / {args.task}", text))
        print(text, flush=True)
    run.write_summary("beyond zero ablation: inactivity scores vs atp, zero vs mean", sections)
    return 0


if __name__ == "__main__":
    script_main(main)
