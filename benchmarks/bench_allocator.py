"""Benchmark: glibc's malloc with lens_heads' tuning (``lens_heads.models.allocator``) vs its defaults.

The tuning is process-wide, so each setting runs in its own subprocess (the same evaluation,
alternated, ``--rounds`` times each; the best time per setting is reported, and the ratio of the
two is what to read on a shared machine). Each child loads SmolLM2, warms up, then times
``evaluate_task`` on PIQA 0-shot and MMLU 5-shot, and reports its peak RSS (the tuning's cost:
freed heap is kept). Predictions are compared across the settings (they must be identical).

    python benchmarks/bench_allocator.py                       # fp32 and bf16
    python benchmarks/bench_allocator.py --dtypes float32 --rounds 3

Writes benchmarks/results/bench_allocator.md.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
CHILD = r"""
import json, os, resource, sys, time
os.environ.setdefault("HF_HUB_OFFLINE", "1"); os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
import torch
from lens_heads import load_model
from lens_heads.models import allocator
from lens_heads.data import load_task
from lens_heads.evaluation.evaluate import evaluate_task
dtype, piqa, mmlu, batch = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
model = load_model("smollm2-135m", dtype=dtype)
out = {"tuned": allocator.keep_freed_memory(), "threads": torch.get_num_threads()}
for name, task, n, shots in (("PIQA 0-shot", "piqa", piqa, 0), ("MMLU 5-shot", "mmlu", mmlu, 5)):
    t = load_task(task)
    evaluate_task(model, t, limit=2, n_shot=shots, progress=False, batch_size=batch)
    t0 = time.perf_counter()
    r = evaluate_task(model, t, limit=n, n_shot=shots, progress=False, batch_size=batch)
    out[name] = {"s": time.perf_counter() - t0, "preds": [q.pred for q in r.questions]}
out["peak_rss_mb"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
print(json.dumps(out))
"""


def run_child(dtype: str, tuned: bool, args) -> dict:
    env = dict(os.environ, LENS_HEADS_KEEP_FREED_MEMORY="1" if tuned else "0")
    cmd = [sys.executable, "-c", CHILD, dtype, str(args.piqa), str(args.mmlu), str(args.batch_size)]
    res = subprocess.run(cmd, env=env, capture_output=True, text=True, cwd=ROOT)
    if res.returncode != 0:
        raise SystemExit(res.stderr[-3000:])
    return json.loads(res.stdout.strip().splitlines()[-1])


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--dtypes", nargs="+", default=["float32", "bfloat16"])
    ap.add_argument("--piqa", type=int, default=80)
    ap.add_argument("--mmlu", type=int, default=10)
    ap.add_argument("--batch-size", type=int, default=16)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--out", default=str(ROOT / "benchmarks" / "results" / "bench_allocator.md"))
    args = ap.parse_args()
    sys.path.insert(0, str(ROOT))
    from lens_heads.files.atomic import atomic_write_text

    tasks = ("PIQA 0-shot", "MMLU 5-shot")
    lines = [f"# bench_allocator (smollm2-135m, batch {args.batch_size}, {args.piqa} PIQA / {args.mmlu} MMLU "
             f"questions, best of {args.rounds} alternated runs per setting, load avg {os.getloadavg()[0]:.1f})", "",
             "| dtype | task | glibc defaults s | tuned s | speed-up | identical predictions |", "|---|---|---|---|---|---|"]
    rss = []
    for dtype in args.dtypes:
        runs: dict[bool, list[dict]] = {False: [], True: []}
        for _ in range(args.rounds):
            for tuned in (False, True):
                runs[tuned].append(run_child(dtype, tuned, args))
                print(dtype, tuned, {t: round(runs[tuned][-1][t]["s"], 2) for t in tasks}, flush=True)
        assert all(r["tuned"] is t for t in runs for r in runs[t])
        for task in tasks:
            best = {t: min(r[task]["s"] for r in runs[t]) for t in runs}
            same = runs[False][0][task]["preds"] == runs[True][0][task]["preds"]
            lines.append(f"| {dtype} | {task} | {best[False]:.2f} | {best[True]:.2f} | {best[False] / best[True]:.2f}x | "
                         f"{'yes' if same else 'NO'} ({len(runs[True][0][task]['preds'])}) |")
        rss.append(f"{dtype}: peak RSS {max(r['peak_rss_mb'] for r in runs[False]):.0f} MB with glibc's defaults, "
                   f"{max(r['peak_rss_mb'] for r in runs[True]):.0f} MB tuned")
    lines += ["", "Memory cost (the whole process, model included): " + "; ".join(rss) + ".", "",
              "Tuned: `lens_heads.models.allocator.keep_freed_memory()` (mmap threshold 1 GiB, trim threshold 2 GiB), "
              "which `load_model` applies on the CPU; defaults: `LENS_HEADS_KEEP_FREED_MEMORY=0`."]
    atomic_write_text(Path(args.out), "\n".join(lines) + "\n", make_parents=True)
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
