"""Benchmark: where one forward's time goes, and what fused attention would save.

Per-input ablation cannot reuse a few-shot prefix, so a sweep point costs one full forward
per question. This times, on one model and random tokens of several lengths:

* the bridge (``run_with_hooks``, no hooks: what every evaluation runs),
* the plain HF model with eager attention and with torch's fused ``sdpa`` (a fresh copy of
  the weights: the bridge rewires the HF modules it wraps),
* the share of the bridge's time spent in dense matmuls (``aten::mm``/``addmm``: the
  projections and MLP, which no attention kernel changes), from ``torch.profiler``.

Then it fits ``t(T) = a*T + b*T^2`` to each path and sums it over the prompt lengths of
a task sample (default: the 500 Qwen MMLU 5-shot sweep prompts), which predicts the time of
one per-input sweep point under each path. Ratios, measured back to back in one process.

    python benchmarks/bench_forward.py                        # qwen2.5-coder-0.5b, MMLU 500
    python benchmarks/bench_forward.py --lengths 256,700,1600 --task-limit 500

Writes benchmarks/results/bench_forward.md.
"""

from __future__ import annotations

import argparse
import os
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")

import numpy as np  # noqa: E402
import torch  # noqa: E402


def timed(fn, repeats: int) -> float:
    fn()  # warm-up
    best = float("inf")
    for _ in range(repeats):
        t = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t)
    return best


def matmul_share(fn) -> float:
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU]) as prof:
        fn()
    rows = prof.key_averages()
    total = sum(r.self_cpu_time_total for r in rows)
    dense = sum(r.self_cpu_time_total for r in rows if r.key in ("aten::mm", "aten::addmm"))
    return dense / total


def fit(lengths: list[int], seconds: list[float]) -> tuple[float, float]:
    """Least squares ``t = a*T + b*T^2`` (no constant: a forward of 0 tokens costs nothing)."""
    T = np.asarray(lengths, dtype=float)
    coef, *_ = np.linalg.lstsq(np.stack([T, T * T], 1), np.asarray(seconds), rcond=None)
    return float(coef[0]), float(coef[1])


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default="qwen2.5-coder-0.5b")
    ap.add_argument("--lengths", default="256,700,1600")
    ap.add_argument("--repeats", type=int, default=1)
    ap.add_argument("--task", default="mmlu")
    ap.add_argument("--task-limit", type=int, default=500)
    ap.add_argument("--out", default=str(Path(__file__).parent / "results" / "bench_forward.md"))
    args = ap.parse_args()

    from lens_heads.files.atomic import atomic_write_text
    from lens_heads.forward.task_requests import task_inputs
    from lens_heads.models.hooks import run_with_hooks
    from lens_heads.models.load import load_hf, load_model, resolve_source

    lengths = [int(x) for x in args.lengths.split(",")]
    bridge = load_model(args.model)
    hf, _ = load_hf(resolve_source(args.model), torch.float32)
    prompts = [len(x) for x in task_inputs(bridge, args.task, limit=args.task_limit)]

    rows, times = [], {"bridge": [], "hf eager": [], "hf sdpa": []}
    gen = torch.Generator().manual_seed(0)
    with torch.inference_mode():
        for T in lengths:
            ids = torch.randint(100, 20000, (1, T), generator=gen)
            keep = torch.tensor([T - 1])
            run_bridge = lambda: run_with_hooks(bridge, ids, None, [], logits_to_keep=keep)  # noqa: E731
            times["bridge"].append(timed(run_bridge, args.repeats))
            for impl in ("eager", "sdpa"):
                hf.set_attn_implementation(impl)
                times[f"hf {impl}"].append(timed(lambda: hf(ids, logits_to_keep=1), args.repeats))
            share = matmul_share(run_bridge)
            rows.append(f"| {T} | {times['bridge'][-1]:.2f} | {times['hf eager'][-1]:.2f} | "
                        f"{times['hf sdpa'][-1]:.2f} | {times['hf sdpa'][-1] / times['bridge'][-1]:.3f} | {share:.0%} |")
            print(rows[-1], flush=True)

    fits = {k: fit(lengths, v) for k, v in times.items()}
    point = {k: sum(a * T + b * T * T for T in prompts) for k, (a, b) in fits.items()}
    lines = [
        "# bench_forward: where a forward's time goes; what fused attention would save",
        "",
        f"Model {args.model}, float32, CPU, {torch.get_num_threads()} torch thread(s), batch 1, random tokens; "
        f"best of {args.repeats} after a warm-up. `sdpa/bridge` < 1 means fused attention is faster.",
        "",
        "| tokens | bridge s | HF eager s | HF sdpa s | sdpa/bridge | bridge time in dense matmuls |",
        "|---|---|---|---|---|---|",
        *rows,
        "",
        f"Fit t = a·T + b·T² and its sum over the {len(prompts)} {args.task} prompts "
        f"(tokens: min {min(prompts)}, mean {np.mean(prompts):.0f}, max {max(prompts)}) = one per-input sweep point:",
        "",
        "| path | a (s/token) | b (s/token²) | predicted point, h | vs bridge |",
        "|---|---|---|---|---|",
        *(f"| {k} | {a:.2e} | {b:.2e} | {point[k] / 3600:.2f} | {point[k] / point['bridge']:.3f} |"
          for k, (a, b) in fits.items()),
        "",
        f"Command: `python benchmarks/bench_forward.py --model {args.model} --lengths {args.lengths} "
        f"--task {args.task} --task-limit {args.task_limit}`",
    ]
    atomic_write_text(args.out, "\n".join(lines) + "\n")
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
