"""A sweep's scoring pass with and without prefix sharing (docs/methods.md §1, "Prefix sharing"):
the inputs of some of a pass's scoring shards (MMLU five-shot, 2,000 stratified questions, 64
shards: the Table 2 campaign's pass), scored with the paper's twelve functions both ways, on
the same model in one run. Reports CPU seconds of each (process time: the machine is shared),
their ratio, the tokens each runs, and how far apart the per-input scores are.

    LENS_HEADS_DATA=../shared/data .venv/bin/python benchmarks/bench_shared_prefix.py \
        [--model qwen2.5-coder-0.5b] [--shards 4,32] [--batches 2]

Results: benchmarks/results/bench_shared_prefix.md.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
ROOT = Path(__file__).resolve().parents[1]


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default="qwen2.5-coder-0.5b")
    ap.add_argument("--task", default="mmlu")
    ap.add_argument("--limit", type=int, default=2000)
    ap.add_argument("--n-shards", type=int, default=64)
    ap.add_argument("--shards", default="4,32", help="which shards' inputs (comma list)")
    ap.add_argument("--batches", type=int, default=0, help="the first N batches of each shard (0: all)")
    ap.add_argument("--out", default=str(ROOT / "benchmarks" / "results" / "bench_shared_prefix.md"))
    args = ap.parse_args()
    import torch

    from lens_heads import load_model
    from lens_heads.files.atomic import atomic_write_text
    from lens_heads.forward.task_requests import task_inputs
    from lens_heads.interventions.thresholds import SCORING_BATCH, scoring_shard_batches
    from lens_heads.scores import pass_prefixes, score_heads
    from lens_heads.scores.functions import PAPER_SCORES
    from lens_heads.sweep.units import batch_floor

    model = load_model(args.model)
    inputs = task_inputs(model, args.task, None, args.limit)
    prefixes = pass_prefixes(model, inputs)
    shards = scoring_shard_batches(inputs, SCORING_BATCH, args.n_shards, batch_floor(model), prefixes)
    pass_tokens = sum(len(x) for x in inputs)
    pass_shared = sum(len(x) - p for x, p in zip(inputs, prefixes)) + sum(
        len(k) for k in {tuple(x[:p].tolist()) for x, p in zip(inputs, prefixes) if p})
    lines = [f"# bench_shared_prefix ({args.model}, {args.task} {len(inputs)} inputs, {args.n_shards} shards, "
             f"torch threads {torch.get_num_threads()}, load avg {os.getloadavg()[0]:.1f})", "",
             f"The whole pass: {pass_tokens:,} tokens in its inputs; with shared prefixes (each distinct prefix "
             f"once) {pass_shared:,} ({pass_tokens / pass_shared:.2f}x fewer).", "",
             "| shard | inputs | tokens | distinct prefixes | shared CPU s | whole CPU s | whole / shared | "
             "largest relative difference | scores bit-equal |", "|---|---|---|---|---|---|---|---|---|"]
    for j in (int(s) for s in args.shards.split(",")):
        batches = shards[j][:args.batches] if args.batches else shards[j]
        idx = [i for b in batches for i in b]
        seqs, lengths = [inputs[i] for i in idx], [prefixes[i] for i in idx]
        timed = {}
        for how, shared in (("shared", lengths), ("whole", False)):
            t0 = time.process_time()
            hs = score_heads(model, seqs, list(PAPER_SCORES), SCORING_BATCH, keep_per_input=True, progress=False,
                             shared_prefix=shared)
            timed[how] = (time.process_time() - t0, hs.per_input)
        rel, equal = 0.0, 0
        for s in PAPER_SCORES:
            a, b = timed["shared"][1][s].double(), timed["whole"][1][s].double()
            rel = max(rel, float(((a - b).abs() / b.abs().clamp_min(1e-12)).nan_to_num().max()))
            equal += int(torch.equal(timed["shared"][1][s], timed["whole"][1][s]))
        distinct = len({tuple(inputs[i][:prefixes[i]].tolist()) for i in idx if prefixes[i]})
        row = (f"| {j} | {len(idx)} | {sum(len(x) for x in seqs):,} | {distinct} | {timed['shared'][0]:.0f} | "
               f"{timed['whole'][0]:.0f} | {timed['whole'][0] / timed['shared'][0]:.2f}x | {rel:.1e} | "
               f"{equal} of {len(PAPER_SCORES)} |")
        print(row, flush=True)
        lines.append(row)
    lines += ["", f"Command: `{' '.join(['python', 'benchmarks/bench_shared_prefix.py'] + sys.argv[1:])}`", ""]
    atomic_write_text(args.out, "\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
