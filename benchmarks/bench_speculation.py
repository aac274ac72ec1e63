"""A per-input score ablation on MMLU with and without speculative prefix sharing (docs/methods.md
§3, "Prefix sharing under a per-input ablation"), evaluated the way an adaptive search reads a
point: questions in a seeded random order, a few at a time (default one: a search's batch of 64
holds about one question of each subject), one ablation object for all of them, the prefixes
taken from the whole population (2,000 stratified questions, the Table 2 campaign's).

The questions are those of ``--subjects`` subjects in that population; the threshold zeroes
``--fraction`` of their pooled unablated per-input scores. Reports CPU seconds both ways
(process time: the machine is shared), their ratio, what the speculation did (inputs kept after a
cached prefix, suffix forwards refused, inputs run whole), and how far apart the results are.

    LENS_HEADS_DATA=../shared/data .venv/bin/python benchmarks/bench_speculation.py \
        [--model qwen2.5-coder-0.5b] [--score ahon_ln] [--fraction 0.1] [--subjects 2] [--per-subject 20] \
        [--pick largest|median] [--unablated]

Results: benchmarks/results/bench_speculation.md (one row per run, appended).
"""

from __future__ import annotations

import argparse
import math
import os
import random
import sys
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
ROOT = Path(__file__).resolve().parents[1]


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default="qwen2.5-coder-0.5b")
    ap.add_argument("--task", default="mmlu")
    ap.add_argument("--limit", type=int, default=2000, help="the population (stratified sample)")
    ap.add_argument("--score", default="ahon_ln")
    ap.add_argument("--fraction", type=float, default=0.10)
    ap.add_argument("--subjects", type=int, default=2)
    ap.add_argument("--pick", choices=["largest", "median"], default="median",
                    help="the subjects with the most questions in the population, or those around the median")
    ap.add_argument("--unablated", action="store_true", help="the unablated point instead (kept prefixes only)")
    ap.add_argument("--per-subject", type=int, default=20)
    ap.add_argument("--per-call", type=int, default=1, help="questions per evaluation call")
    ap.add_argument("--seed", type=int, default=1234)
    ap.add_argument("--out", default=str(ROOT / "benchmarks" / "results" / "bench_speculation.md"))
    args = ap.parse_args()
    import torch

    from lens_heads import evaluate_task, load_model
    from lens_heads.data import load_task
    from lens_heads.files.atomic import atomic_write_text
    from lens_heads.forward.task_requests import record_inputs, select_records
    from lens_heads.interventions.ablation import ScoreAblation
    from lens_heads.interventions.speculation import Speculation, population_prefixes
    from lens_heads.scores import SCORES, score_heads

    model = load_model(args.model)
    task = load_task(args.task)
    population = select_records(task, args.limit, args.seed)
    prefixes = population_prefixes(model, record_inputs(model, task, population, None, args.seed))
    by_subject: dict[str, list] = {}
    for r in population:
        by_subject.setdefault(r.subject, []).append(r)
    ranked = sorted(by_subject, key=lambda s: (-len(by_subject[s]), s))
    at = 0 if args.pick == "largest" else max(0, len(ranked) // 2 - args.subjects // 2)
    subjects = ranked[at:at + args.subjects]
    chosen = [r for s in subjects for r in by_subject[s][:args.per_subject]]
    random.Random(args.seed).shuffle(chosen)
    threshold = math.nan
    if not args.unablated:
        seqs = record_inputs(model, task, chosen, None, args.seed)
        s = score_heads(model, seqs, [args.score], 8, keep_per_input=True, progress=False).per_input[args.score]
        s = s.flatten()[torch.isfinite(s.flatten())].double()
        q = args.fraction if SCORES[args.score].inactive_when == "low" else 1 - args.fraction
        threshold = float(torch.quantile(s, q))

    def run(reuse: bool) -> tuple[float, list, list[int], object]:
        if args.unablated:
            abl, kept = None, Speculation()
        else:
            abl = ScoreAblation(args.score, threshold, model.geometry)
            abl.speculation = kept = Speculation()  # off by default on a per-input ablation
        kept.set_population(prefixes)
        t0 = time.process_time()
        questions, units = [], [0, 0]
        for i in range(0, len(chosen), args.per_call):
            res = evaluate_task(model, task, seed=args.seed, ablation=abl, progress=False, reuse_prefix=reuse,
                                doc_ids=[r.doc_id for r in chosen[i:i + args.per_call]], speculation=kept)
            questions += res.questions
            units = [a + b for a, b in zip(units, res.config["zeroed_units"] or [0, 0])]
        return time.process_time() - t0, questions, units, kept.counts

    plain_s, plain_q, plain_units, _ = run(False)
    spec_s, spec_q, spec_units, counts = run(True)
    diff = max(abs(a - b) for p, q_ in zip(plain_q, spec_q) for a, b in zip(p.lls, q_.lls))
    same = sum(p.pred == q_.pred for p, q_ in zip(plain_q, spec_q))
    what = "none (unablated)" if args.unablated else (f"{args.score} @ {args.fraction:.0%} ({threshold:.4g}), "
                                                      "refused inputs resumed where their masks part")
    pct = 100 * plain_units[0] / plain_units[1] if plain_units[1] else 0.0
    row = (f"| {args.model} | {what} | {len(chosen)} of {', '.join(subjects)} | {args.per_call} | {pct:.1f} | "
           f"{plain_s:.0f} | {spec_s:.0f} | {plain_s / spec_s:.2f}x | {counts.accepted} / {counts.rejected} / "
           f"{counts.whole} | {diff:.1e} | {same} of {len(chosen)} | {plain_units == spec_units} |")
    print(row, flush=True)
    out = Path(args.out)
    head = ["# bench_speculation: a per-input score ablation on MMLU, whole forwards vs speculative prefix sharing",
            "", "CPU seconds (process time, torch threads as set by the environment) of the same evaluations "
            "both ways, in one run; kept / refused / whole: inputs kept after a cached prefix, suffix forwards "
            "refused (mask not the entry's), inputs run whole.", "",
            "| model | ablation (threshold) | questions | per call | % zeroed | whole CPU s | speculative CPU s | "
            "ratio | kept / refused / whole | largest log-likelihood difference | same predictions | "
            "same zeroed units |", "|---|---|---|---|---|---|---|---|---|---|---|---|"]
    lines = out.read_text().splitlines() if out.exists() else head
    lines.append(row)
    atomic_write_text(out, "\n".join(lines) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
