"""How well does attribution patching (atp) estimate what ablating a head really does?

    HF_HUB_OFFLINE=1 HF_DATASETS_OFFLINE=1 python analyses/atp_vs_exact.py \\
        --models smollm2-135m --task piqa --limit 100 --out analyses/results/atp_vs_exact

For each model: the gold answers' log-likelihoods of --limit questions (the seeded selection
evaluate and sweeps use), then for every head alone the exact change of their mean when the
head is zeroed (one evaluation per head), against atp's first-order estimate of the same change
(one forward and backward per question, lens_heads.scores.attribution), and the dataset-level
inactivity score AHON(LN) beside them. Reported: Spearman rank correlations (signed estimate vs
exact; |atp| vs |exact|; AHON(LN) vs |exact|), sign agreement, and the heads where atp and the
truth disagree most. Per-head exact effects are stored as they are measured (OUT/exact.json):
a stopped run resumes with the heads still missing.

Outputs (OUT): heads_MODEL.csv (layer, head, exact, atp, |atp|, ahon_ln), exact_MODEL.json (the resumable
exact effects), summary.md.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np
import pandas as pd

sys.path.insert(0, str(Path(__file__).resolve().parent))

from common import Run, base_parser, check_positive, markdown_table, model_label, out_folder, script_main, \
    split_list, write_csv  # noqa: E402

from lens_heads.files.atomic import atomic_write_text  # noqa: E402


def parse_args(argv):
    p = base_parser(__doc__, "analyses/results/atp_vs_exact")
    p.set_defaults(models="smollm2-135m")
    p.add_argument("--task", default="piqa")
    p.add_argument("--limit", type=int, default=100)
    p.add_argument("--n-texts", type=int, default=32, help="C4 texts for the AHON(LN) column (default 32)")
    p.add_argument("--top", type=int, default=10, help="disagreements listed (default 10)")
    args = p.parse_args(argv)
    args.models = split_list(args.models, "models")
    check_positive(args, "limit", "n_texts", "top", "batch_size")
    return args


def main(argv=None) -> int:
    from scipy.stats import spearmanr

    from lens_heads.interventions.ablation import parse_ablation
    from lens_heads.data import load_task, load_texts, tokenize_texts
    from lens_heads.forward.engine import encode_pair, loglikelihoods_tokens
    from lens_heads.forward.task_requests import select_records
    from lens_heads.models import load_model
    from lens_heads.models.load import model_digest
    from lens_heads.scores import score_heads
    from lens_heads.scores.attribution import atp_effects

    args = parse_args(argv)
    out = out_folder(args.out)
    task = load_task(args.task)  # bad task names fail before any model loads
    texts = load_texts("c4", n=args.n_texts)
    run = Run.start(out, args.device, __file__, argv)
    sections = []
    for spec in args.models:
        label = model_label(spec)
        model = load_model(spec, dtype=args.dtype, device=args.device)
        g = model.geometry
        records = select_records(task, args.limit, 1234)
        pairs = [encode_pair(model.tokenizer, *task.build(r, task.spec.n_shot)[r.gold]) for r in records]
        store = out / f"exact_{label}.json"
        key = {"model_digest": model_digest(model), "dtype": str(model.dtype), "task": task.name,
               "doc_ids": [r.doc_id for r in records]}
        saved = json.loads(store.read_text()) if store.is_file() else {}
        exact = saved.get("exact", {}) if saved.get("key") == key else {}
        base = np.array(loglikelihoods_tokens(model, pairs, batch_size=args.batch_size, progress=False))
        for L in range(g.n_layers):
            for h in range(g.heads_in(L)):
                name = f"{L}.{h}"
                if name in exact:
                    continue
                ab = parse_ablation(f"static:{name}", g)
                lls = np.array(loglikelihoods_tokens(model, pairs, ab, batch_size=args.batch_size, progress=False))
                exact[name] = float((lls - base).mean())
                atomic_write_text(store, json.dumps({"key": key, "exact": exact}))
            print(f"{label}: layer {L} done, {run.elapsed():.0f} s", flush=True)
        est = np.stack([atp_effects(model, c, x).numpy() for c, x in pairs]).mean(0)  # [layer, head]
        ahon = score_heads(model, tokenize_texts(model.tokenizer, texts, 256), ["ahon_ln"], progress=False).mean["ahon_ln"]
        rows = [{"model": label, "layer": L, "head": h, "exact": exact[f"{L}.{h}"], "atp": float(est[L, h]),
                 "abs_atp": abs(float(est[L, h])), "ahon_ln": float(ahon[L, h])}
                for L in range(g.n_layers) for h in range(g.heads_in(L))]
        frame = pd.DataFrame(rows)
        write_csv(frame, out / f"heads_{label}.csv")
        r_signed = spearmanr(frame["atp"], frame["exact"]).statistic
        r_abs = spearmanr(frame["abs_atp"], frame["exact"].abs()).statistic
        r_ahon = spearmanr(frame["ahon_ln"], frame["exact"].abs()).statistic
        big = frame["exact"].abs() >= frame["exact"].abs().quantile(0.75)
        sign = float((np.sign(frame.loc[big, "atp"]) == np.sign(frame.loc[big, "exact"])).mean())
        frame["rank_gap"] = (frame["abs_atp"].rank() - frame["exact"].abs().rank()).abs()
        worst = frame.sort_values("rank_gap", ascending=False).head(args.top)
        text = (f"{len(records)} {task.name} questions, {len(frame)} heads, {model.dtype}. Exact: mean change of the "
                f"gold answer's log-likelihood with the head zeroed alone; atp: its first-order estimate.\n\n"
                f"| comparison | Spearman |\n|---|---|\n| atp vs exact (signed) | {r_signed:.3f} |\n"
                f"| abs(atp) vs abs(exact) | {r_abs:.3f} |\n| AHON(LN) vs abs(exact) | {r_ahon:.3f} |\n\n"
                f"Sign agreement on the quarter of heads with the largest exact effect: {100 * sign:.0f} %.\n\n"
                f"Where atp and the truth disagree most (rank gap of |atp| vs |exact|):\n\n"
                + markdown_table(worst[["layer", "head", "exact", "atp", "ahon_ln", "rank_gap"]], 4))
        sections.append((f"{label} / {task.name}", text))
        print(text, flush=True)
    run.write_summary("atp vs exact single-head ablation", sections)
    return 0


if __name__ == "__main__":
    script_main(main)
