"""Benchmark: one sweep's part units on the local executor and on a local Ray cluster with 1 and
2 workers (one CPU and one torch thread each), on a real model.

    python benchmarks/bench_scaleout.py                        # SmolLM2, 96 PIQA questions, 30 units
    python benchmarks/bench_scaleout.py --limit 48 --chunk 16

The thresholds are computed once and copied into every run's folder, so each run times the same
30 part units with the model already loaded (Ray: the actors report their model loads first).
Reports, per executor: units/s, the wall time per unit against the unit's own compute (the
``seconds`` each stored part records: ``evaluate_task`` alone), so the executor's overhead
(scheduling, claims, store I/O) is a measured share; 2 workers' speed-up over 1; model loads per
worker; and a projection of the full Qwen2.5-Coder-0.5B / MMLU Table-2 sweep from the per-question
cost its committed store records. Writes benchmarks/results/bench_scaleout.md.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
ROOT = Path(__file__).resolve().parents[1]


def unit_seconds(out: Path) -> list[float]:
    """The compute seconds each stored part (or point) of a run records."""
    secs = []
    for f in [*out.glob("parts/*.json"), *out.glob("points/*.json")]:
        secs.append(json.loads(f.read_text())["eval_config"]["seconds"])
    return secs


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default="smollm2-135m")
    ap.add_argument("--task", default="piqa")
    ap.add_argument("--limit", type=int, default=96)
    ap.add_argument("--chunk", type=int, default=16)
    ap.add_argument("--out", default=str(ROOT / "benchmarks" / "results" / "bench_scaleout.md"))
    args = ap.parse_args()

    import torch

    from lens_heads.files.atomic import atomic_write_text
    from lens_heads.results.store import ResultStore
    from lens_heads.sweep import SweepConfig
    from lens_heads.sweep.executors import LocalConfig, RayConfig, job_for, start
    from lens_heads.sweep.units import UnitRef, Worker

    cfg = SweepConfig(task=args.task, score_ids=["ahon_ln"], fractions=[0.0, 0.1, 0.2], random_seeds=[0],
                      limit=args.limit, chunk_questions=args.chunk, batch_size=16)
    cfg.validate()
    work = Path(tempfile.mkdtemp(prefix="bench_scaleout_"))
    base = work / "thresholds_only"
    job = job_for(args.model, "float32", "cpu", cfg, base, n_shards=1)
    torch.set_num_threads(1)
    worker = Worker(job)
    worker.run(UnitRef("score", 0))  # the scoring pass, once
    from lens_heads.batching import device_floor
    from lens_heads.sweep.units import merge_score_shards

    merge_score_shards(ResultStore(base), worker.identity, cfg, 1, device_floor("cpu"))
    plan = worker.plan()
    refs = [UnitRef("part", i) for i in range(len(plan.all_units))]
    print(f"{len(refs)} part units of {args.chunk} questions, {len(plan.order)} points", flush=True)

    rows, stats = [], {}

    def fresh(name: str) -> Path:
        out = work / name
        shutil.copytree(base, out)
        return out

    # local: this process, one thread, model already loaded (the worker above)
    out = fresh("local")
    from dataclasses import replace

    local = start("local", replace(job, out_dir=str(out), threads=1), LocalConfig())
    local.worker._model, local.worker._task = worker._model, worker._task  # loaded: time the units only
    t0 = time.perf_counter()
    local.run(refs)
    stats["local"] = (time.perf_counter() - t0, unit_seconds(out), 1, [1])
    for n in (1, 2):
        out = fresh(f"ray{n}")
        session = start("ray", replace(job, out_dir=str(out)), RayConfig(workers=n, cpus_per_worker=1))
        loads = [s[2] for s in session.stats()]  # waits until every actor has loaded the model
        t0 = time.perf_counter()
        session.run(refs)
        wall = time.perf_counter() - t0
        after = session.stats()
        session.close()
        stats[f"ray, {n} worker{'s' if n > 1 else ''}"] = (wall, unit_seconds(out), n, [s[2] for s in after])
        assert loads == [1] * n, loads
    n_units = len(refs)
    lines = [f"# bench_scaleout ({args.model}, {args.task}, {args.limit} questions in units of {args.chunk}, fp32, "
             f"{os.cpu_count()} cores, load avg {os.getloadavg()[0]:.1f})", "",
             "| executor | workers | units | wall s | units/s | compute per unit s (median) | wall per unit x workers / "
             "compute | overhead | model loads per worker |", "|---|---|---|---|---|---|---|---|---|"]
    for name, (wall, secs, n, loads) in stats.items():
        per = statistics.median(secs)
        ratio = wall * n / n_units / statistics.mean(secs)
        rows.append((name, n, wall))
        lines.append(f"| {name} | {n} | {n_units} | {wall:.1f} | {n_units / wall:.2f} | {per:.2f} | {ratio:.3f} | "
                     f"{100 * (ratio - 1):+.1f} % | {', '.join(map(str, loads))} |")
    one, two = stats["ray, 1 worker"][0], stats["ray, 2 workers"][0]
    lines += ["", f"2 Ray workers / 1: {one / two:.2f}x units/s on {os.cpu_count()} cores "
              f"(each worker one CPU and one torch thread; the ideal is 2.00x where the cores are free)."]
    # projection: the full Qwen/MMLU Table-2 sweep from the committed store's per-question cost
    store = ROOT / "analyses" / "results" / "inactive_heads" / "store" / "qwen2.5-coder-0.5b__mmlu" / "points"
    per_q = [json.loads(f.read_text())["eval_config"] for f in store.glob("*.json")]
    per_q = [e["seconds"] / e["n_questions"] for e in per_q if e.get("n_questions")]
    if per_q:
        q = min(per_q)  # the least contended measurement (the machine was shared while the store was filled)
        n_points, n_questions = 1 + 12 * 6 + 3 * 6, 14042
        total_h = n_points * n_questions * q / 3600
        lines += ["", "Projection, Qwen2.5-Coder-0.5B / MMLU Table 2 (12 functions x 6 fractions + 3 random seeds x 6 "
                  f"+ baseline = {n_points} points x {n_questions} questions): {q:.2f} s per question-point measured on "
                  f"this CPU (2 threads, fp32; the fastest of {len(per_q)} stored points, {statistics.median(per_q):.2f} "
                  f"s median) -> {total_h:.0f} CPU-hours; at the overhead measured above, N workers take "
                  f"{total_h:.0f} / N hours ({total_h / 16:.1f} h on 16, {total_h / 64:.1f} h on 64 such workers). "
                  "On GPUs the per-question cost was not measured (no GPU was lent to this project's sessions); "
                  "the wall time is then (points x questions x that cost) / N GPUs plus one model load per worker."]
    lines += ["", "wall: session.run over the same units from copies of one store holding only the thresholds; "
              "compute: the seconds each stored part records (evaluate_task alone); overhead: wall x workers / "
              "units over the mean compute, minus 1."]
    atomic_write_text(args.out, "\n".join(lines) + "\n", make_parents=True)
    print("\n".join(lines))
    shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
