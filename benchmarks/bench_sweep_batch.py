"""Benchmark: rows per forward (``batch_size``) for a per-input ablated evaluation, the forward a
sweep or an adaptive search runs for every item it reads (docs/methods.md §4, §12).

A per-input ablation zeroes a different set of heads in each input, so the engine can neither
pack inputs nor reuse a prefix: each batch is ``batch_size`` right-padded rows. On a CPU the
best size is a trade between per-forward overhead (small batches) and the working set of a
batch's activations outgrowing the core's caches (large ones). This times, in one process on
one torch thread, the same questions at several sizes, alternated for ``--rounds`` rounds
(best time per size): AHON(LN) zeroing 15 % of its pooled scores (the threshold calibrated once
on the same inputs, ``calibrated_spec``) and random heads at 15 %. The ratio against
``--baseline`` (the old default, 16) is what to read; predictions are compared across sizes.

    OMP_NUM_THREADS=1 python benchmarks/bench_sweep_batch.py --models smollm2-135m,gemma-3-270m

Writes benchmarks/results/bench_sweep_batch.md.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import torch  # noqa: E402

from lens_heads import load_model  # noqa: E402
from lens_heads.data import load_task  # noqa: E402
from lens_heads.evaluation.evaluate import evaluate_task  # noqa: E402
from lens_heads.files.atomic import atomic_write_text  # noqa: E402
from lens_heads.forward.task_requests import select_records, task_inputs  # noqa: E402
from lens_heads.interventions.ablation import parse_ablation  # noqa: E402
from lens_heads.interventions.thresholds import calibrated_spec  # noqa: E402


def timed(model, task, spec: str, ids: list[int], batch: int):
    t0 = time.perf_counter()
    r = evaluate_task(model, task, n_shot=0, ablation=parse_ablation(spec, model.geometry), batch_size=batch,
                      progress=False, doc_ids=list(ids))
    return time.perf_counter() - t0, [q.pred for q in r.questions]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--models", default="smollm2-135m,gemma-3-270m")
    ap.add_argument("--task", default="piqa")
    ap.add_argument("--questions", type=int, default=64, help="the questions timed (a search's step is 64)")
    ap.add_argument("--sizes", default="4,8,16,32")
    ap.add_argument("--baseline", type=int, default=16)
    ap.add_argument("--dtype", default="float32")
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--out", default=str(ROOT / "benchmarks" / "results" / "bench_sweep_batch.md"))
    args = ap.parse_args()
    sizes = [int(s) for s in args.sizes.split(",")]
    if args.baseline not in sizes:
        sizes.append(args.baseline)
    torch.set_num_threads(1)
    task = load_task(args.task)
    lines = [f"# bench_sweep_batch ({args.task}, {args.questions} questions, {args.dtype}, 1 torch thread, best of "
             f"{args.rounds} alternated rounds, load avg {os.getloadavg()[0]:.1f})", "",
             f"| model | ablation | {' | '.join(f'batch {b} q/s' for b in sizes)} | best | vs batch {args.baseline} | "
             f"identical predictions |", "|---|---|" + "---|" * (len(sizes) + 3)]
    for name in args.models.split(","):
        model = load_model(name, dtype=args.dtype)
        ids = [r.doc_id for r in select_records(task, args.questions, 1234)]
        spec, _ = calibrated_spec(model, task_inputs(model, task, 0, args.questions, 1234), "ahon_ln", 0.15,
                                  progress=False)
        for label, ablation in (("AHON(LN) 15 %", spec), ("random 15 %", "random:0.15@0")):
            timed(model, task, ablation, ids[:4], sizes[0])  # warm-up
            best: dict[int, float] = {}
            preds: dict[int, list] = {}
            for _ in range(args.rounds):
                for b in sizes:
                    s, p = timed(model, task, ablation, ids, b)
                    best[b] = min(best.get(b, s), s)
                    preds[b] = p
                    print(name, label, b, f"{s:.2f} s", flush=True)
            fastest = min(best, key=best.get)
            same = all(preds[b] == preds[args.baseline] for b in sizes)
            lines.append(f"| {name} | {label} | " + " | ".join(f"{len(ids) / best[b]:.2f}" for b in sizes)
                         + f" | {fastest} | {best[args.baseline] / best[fastest]:.2f}x | "
                         f"{'yes' if same else 'NO'} ({len(ids)}) |")
        del model
    lines += ["", "q/s: questions a second (both PIQA choices of a question scored). The ablated heads differ per "
              "input, so no packing and no prefix reuse: every size pads its rows to its longest input."]
    atomic_write_text(Path(args.out), "\n".join(lines) + "\n", make_parents=True)
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
