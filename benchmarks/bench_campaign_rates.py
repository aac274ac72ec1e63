"""Benchmark: the CPU cost of one item of each Table 2 pair's adaptive search, relative to
SmolLM2/PIQA in float32 measured in the same run (docs/methods.md §12-13).

Every probe of the campaign (analyses/table2.py) is a per-input ablated evaluation: no packing,
no prefix reuse, ``batch_size`` 8 on one torch thread. A pair the campaign has not reached yet
has no measured rate, so its remaining hours are estimated from this ratio and the rate the
campaign measured on SmolLM2/PIQA (``analyses/table2.py``'s ``RATE_VS_SMOLLM2_PIQA``). Each
(pair, dtype) is timed on the same ``--questions`` questions (MMLU: ``--questions-mmlu``, its
5-shot prompts are ~7x longer) with AHON(LN) zeroing 15 % of its pooled scores (threshold
calibrated once on those inputs); CPU time of this process (``time.process_time``), so a busy
machine slows the wall clock more than the figure, and the ratio is what to read. bfloat16 runs
only where the CPU has native bf16 (``--dtypes``).

    OMP_NUM_THREADS=1 python benchmarks/bench_campaign_rates.py

Writes benchmarks/results/bench_campaign_rates.md.
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
from lens_heads.models.load import native_bf16  # noqa: E402

PAIRS = "smollm2-135m/piqa,gemma-3-270m/piqa,qwen2.5-coder-0.5b/piqa,qwen2.5-coder-0.5b/mmlu,gemma-3-270m/winogrande"
REFERENCE = ("smollm2-135m", "piqa", "float32")
SEED = 1234


def cpu_seconds_per_item(model, task, spec: str, ids: list[int]) -> tuple[float, float]:
    """(CPU seconds, wall seconds) per question of one ablated evaluation of ``ids``."""
    ablation = parse_ablation(spec, model.geometry)
    evaluate_task(model, task, ablation=ablation, batch_size=8, progress=False, doc_ids=ids[:8])  # warm-up
    c0, t0 = time.process_time(), time.perf_counter()
    evaluate_task(model, task, ablation=ablation, batch_size=8, progress=False, doc_ids=ids)
    return (time.process_time() - c0) / len(ids), (time.perf_counter() - t0) / len(ids)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--pairs", default=PAIRS, help="MODEL/TASK list; the first must be the reference "
                    f"{REFERENCE[0]}/{REFERENCE[1]}")
    ap.add_argument("--dtypes", default="float32,bfloat16")
    ap.add_argument("--questions", type=int, default=48)
    ap.add_argument("--questions-mmlu", type=int, default=16)
    ap.add_argument("--out", default=str(ROOT / "benchmarks" / "results" / "bench_campaign_rates.md"))
    args = ap.parse_args()
    pairs = [tuple(p.split("/")) for p in args.pairs.split(",")]
    dtypes = [d for d in args.dtypes.split(",") if d == "float32" or native_bf16()]
    if pairs[0] != REFERENCE[:2] or "float32" not in dtypes:
        ap.error(f"the first pair must be {REFERENCE[0]}/{REFERENCE[1]} and float32 among --dtypes: "
                 "every ratio is against it")
    out = Path(args.out)
    torch.set_num_threads(1)
    rows: list[tuple[str, str, str, int, float, float]] = []
    for model_name, task_name in pairs:
        task = load_task(task_name)
        n = args.questions_mmlu if task_name == "mmlu" else args.questions
        ids = [r.doc_id for r in select_records(task, n, SEED)]
        for dtype in dtypes:
            model = load_model(model_name, dtype=dtype)
            spec, _ = calibrated_spec(model, task_inputs(model, task, None, n, SEED), "ahon_ln", 0.15,
                                      progress=False)
            cpu, wall = cpu_seconds_per_item(model, task, spec, ids)
            rows.append((model_name, task_name, dtype, n, cpu, wall))
            print(model_name, task_name, dtype, f"{cpu:.3f} CPU s/item", flush=True)
            del model
    ref = next(r[4] for r in rows if r[:3] == REFERENCE)
    fp32 = {(r[0], r[1]): r[4] for r in rows if r[2] == "float32"}
    lines = [f"# bench_campaign_rates (AHON(LN) 15 % per input, batch 8, 1 torch thread, load avg "
             f"{os.getloadavg()[0]:.1f})", "",
             "| model | task | dtype | questions | CPU s / question | wall s / question | vs SmolLM2/PIQA fp32 | "
             "fp32 / this |", "|---|---|---|---|---|---|---|---|"]
    for m, t, d, n, cpu, wall in rows:
        lines.append(f"| {m} | {t} | {d} | {n} | {cpu:.3f} | {wall:.3f} | {cpu / ref:.2f}x | "
                     f"{fp32[(m, t)] / cpu:.2f}x |")
    lines += ["", "CPU s: this process's CPU time (one torch thread), so another job on the core slows the wall "
              "clock, not the figure; the ratios are what carry to another machine. A question is every choice "
              "of it scored (MMLU: its 5-shot prompt once, the four letters read at its end)."]
    atomic_write_text(out, "\n".join(lines) + "\n", make_parents=True)
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
