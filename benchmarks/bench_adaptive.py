"""Adaptive crossing search vs the fixed 7-point grid, on real weights (docs/methods.md §13).

    LENS_HEADS_DATA=../shared/data HF_HUB_OFFLINE=1 .venv/bin/python benchmarks/bench_adaptive.py \
        --work /tmp/bench_adaptive [--limit N] [--dtype auto]

SmolLM2-135M on PIQA validation (all 1,838 questions unless ``--limit``), per-input zero ablation,
AHON(LN), AWFT, LTHON(LN) and random heads (3 seeds), fractions 0-30 %, margin 1 point, α 0.05.
Stages, each in its own folder under ``--work`` (resumed if rerun), timed in this one process:

1. ``adaptive5``: the adaptive search on the grid's own points (resolution 5 %), fresh folder;
2. ``grid``: the fixed grid (7 fractions x every question), fresh folder;
3. ``adaptive5`` again on the grid's folder: what it evaluates there (the grid decided every point);
4. ``adaptive1``: the adaptive search at 1 % resolution, fresh folder.

Item evaluations count (question, ablation) pairs evaluated, the unablated ones included; wall
time includes each run's scoring pass for its thresholds. Writes
``benchmarks/results/bench_adaptive.md`` after every stage (a stopped run keeps what it measured).
"""

from __future__ import annotations

import argparse
import json
import platform
import shutil
import sys
import time
from pathlib import Path


import lens_heads as lh
from lens_heads.data.task_routes import load_task
from lens_heads.evaluation import evaluate as evaluation
from lens_heads.sweep import SweepConfig, run_sweep
from lens_heads.sweep.adaptive import CONSTANT, SearchConfig, run_search

RESULTS = Path(__file__).resolve().parent / "results"
SCORES = ["ahon_ln", "awft", "lthon_ln"]
FRACTIONS = [0, 0.05, 0.1, 0.15, 0.2, 0.25, 0.3]


def cpu_name() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                flags = Path("/proc/cpuinfo").read_text()
                extra = [f for f in ("amx_bf16", "avx512_bf16") if f in flags]
                return line.split(":", 1)[1].strip() + (f" ({', '.join(extra)})" if extra else " (no native bf16)")
    except OSError:
        pass
    return platform.processor() or "unknown"


class Counter:
    """Questions evaluated through evaluate_task, by ablation."""

    def __init__(self):
        self.n = 0
        self.real = evaluation.evaluate_task
        evaluation.evaluate_task = self

    def __call__(self, *a, **k):
        res = self.real(*a, **k)
        self.n += len(res.questions)
        return res


def grid_crossings(summary) -> dict[str, dict]:
    """Per curve, the grid's two readings before it interpolates (random: the mean over seeds):
    ``first``, the last grid fraction before the first one beyond 1 point (what a bisection on a
    monotone curve finds), and ``last``, the largest fraction within 1 point; ``monotone``: no
    fraction within after one beyond (the readings then agree)."""
    base = float(summary.loc[summary.spec == "none", "accuracy"].iloc[0])
    out = {}
    for name, rows in summary.groupby("score_fn"):
        acc = rows.groupby("fraction")["accuracy"].mean().sort_index()
        within = [(f, a >= base - 0.01 - 1e-12) for f, a in acc.items()]
        beyond = [f for f, ok in within if not ok]
        first = max(f for f, ok in within if ok and (not beyond or f < beyond[0]))
        out[name] = {"first": 100 * first, "last": 100 * max(f for f, ok in within if ok),
                     "monotone": not beyond or all(not ok for f, ok in within if f > beyond[0]),
                     "deltas": ", ".join(f"{100 * f:g}%: {100 * (a - base):+.2f}" for f, a in acc.items() if f > 0)}
    return out


def write(report: dict, args) -> None:
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / "bench_adaptive.json").write_text(json.dumps(report, indent=2, default=str) + "\n")
    lines = ["# Adaptive crossing search vs the fixed grid", "",
             f"SmolLM2-135M, PIQA validation ({report['n']} questions), per-input zero ablation, "
             f"{', '.join(SCORES)} and random heads (3 seeds), 0-30 %, margin 1 point, alpha 0.05. "
             f"dtype {report['dtype']}, CPU: {report['cpu']}, 2 cores; `python benchmarks/bench_adaptive.py`. "
             "Item evaluations: (question, ablation) pairs evaluated, unablated included; wall time includes "
             "each run's thresholds scoring pass. " + (
                 "All stages ran in this one process." if len({st.get("process") for st in report["stages"].values()})
                 == 1 else "The stages ran in more than one process (column `process`: its start), each alone on "
                 "the machine, all on this CPU and dtype (a stage from another CPU is not kept)."), "",
             "| stage | item evaluations | wall time | vs grid: items / time | process |", "|---|---|---|---|---|"]
    grid = report["stages"].get("grid")
    for name, st in report["stages"].items():
        ratio = (f"{grid['items'] / st['items']:.2f}x / {grid['seconds'] / st['seconds']:.2f}x fewer"
                 if grid and st.get("items") and name != "grid" else "")
        lines.append(f"| {name} | {st['items']:,} | {st['seconds']:.0f} s | {ratio} | {st.get('process', '')} |")
    if "crossings" in report:
        lines += ["", "Crossings. The grid's readings before it interpolates: *first*, the last grid point before "
                  "the first one beyond 1 point (what bisection finds on a monotone curve), and *last*, the largest "
                  "within; they differ only where a point within follows one beyond (*monotone*: no).", "",
                  "| curve | grid: first | grid: last | monotone | adaptive 5 % | adaptive 5 % on the grid's folder "
                  "(`reuse`) | adaptive 1 % | grid: Δ accuracy (points) |", "|---|---|---|---|---|---|---|---|"]
        for name, row in report["crossings"].items():
            g = row.get("grid", {})
            lines.append(f"| {name} | {g.get('first', '')} % | {g.get('last', '')} % | "
                         f"{'yes' if g.get('monotone') else 'no' if g else ''} | {row.get('adaptive5', '')} | "
                         f"{row.get('reuse', '')} | {row.get('adaptive1', '')} | {g.get('deltas', '')} |")
    for note in report.get("notes", []):  # what a person read off the numbers above (kept across reruns)
        lines += ["", note]
    for stage in ("adaptive5", "adaptive1"):
        if stage in report.get("probes", {}):
            lines += ["", f"Probes of `{stage}` (fraction: decision @ questions used):", ""]
            lines += [f"- {name}: {p}" for name, p in report["probes"][stage].items()]
    (RESULTS / "bench_adaptive.md").write_text("\n".join(lines) + "\n")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--work", required=True, help="folder for the stages' stores")
    ap.add_argument("--limit", type=int, default=None)
    ap.add_argument("--dtype", default="auto")
    ap.add_argument("--fresh", action="store_true", help="delete --work first")
    ap.add_argument("--stages", default="adaptive5,grid,reuse,adaptive1")
    args = ap.parse_args(argv)
    work = Path(args.work)
    if args.fresh and work.exists():
        shutil.rmtree(work)
    model = lh.load_model("smollm2-135m", dtype=args.dtype)
    cfg = SweepConfig(task="piqa", score_ids=SCORES, fractions=FRACTIONS, random_seeds=[0, 1, 2], limit=args.limit,
                      batch_size=16)
    counter = Counter()
    n = len(load_task("piqa")) if args.limit is None else args.limit
    report = {"n": n, "dtype": str(model.dtype).removeprefix("torch."), "cpu": cpu_name(), "stages": {},
              "crossings": {}, "probes": {}}
    old = RESULTS / "bench_adaptive.json"
    if old.is_file():  # a stopped run's stages are kept; rerunning a stage measures it again
        prev = json.loads(old.read_text())
        if prev.get("n") == n and prev.get("dtype") == report["dtype"] and prev.get("cpu") == report["cpu"]:
            report.update({k: prev[k] for k in ("stages", "crossings", "probes", "notes") if k in prev})
    process = time.strftime("%Y-%m-%d %H:%M")
    for stage in args.stages.split(","):
        before, t0 = counter.n, time.perf_counter()
        if stage == "grid":
            res = run_sweep(model, cfg, work / "grid", progress=False)
            for name, v in grid_crossings(res.summary).items():
                report["crossings"].setdefault(name, {})["grid"] = v
        else:
            resolution = 0.01 if stage == "adaptive1" else 0.05
            folder = work / ("grid" if stage == "reuse" else stage)
            found = run_search(model, cfg, SearchConfig(resolution=resolution), folder, progress=False)
            for row in found.within.itertuples():
                report["crossings"].setdefault(row.score_fn, {})[stage] = (
                    (f"{row.crossing_pct:g} % " if row.crossing_status != CONSTANT else "no crossing ")
                    + f"({row.crossing_status})" + (
                        f", not monotone: {row.monotone_violation}" if isinstance(row.monotone_violation, str)
                        and row.monotone_violation else ""))
            if stage != "reuse":
                report["probes"][stage] = {row.score_fn: row.probes for row in found.within.itertuples()}
        report["stages"][stage] = {"items": counter.n - before, "seconds": time.perf_counter() - t0, "process": process}
        print(f"{stage}: {counter.n - before} item evaluations, {time.perf_counter() - t0:.0f} s", flush=True)
        write(report, args)
    return 0


if __name__ == "__main__":
    sys.exit(main())
