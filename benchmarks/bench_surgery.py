"""Time per optimisation step: masked surgery vs a full fine-tune, same model and batch.

Both steps do forward, backward, gradient clipping (1.0) and an AdamW update (weight decay 0).
The surgery step trains only the target slices: every tensor without a target slice has
requires_grad=False, so autograd neither computes nor stores its gradient and the optimizer
never touches it. Steps are interleaved (surgery, full, surgery, full, ...) so load changes on a
shared machine hit both alike; the ratio of medians from one run is the number to read.

    HF_HUB_OFFLINE=1 python benchmarks/bench_surgery.py --model smollm2-135m --seq-len 256 --steps 6
"""

from __future__ import annotations

import argparse
import os
import statistics
import time
from pathlib import Path

import torch
import torch.nn.functional as F

from lens_heads import load_model
from lens_heads.surgery import freeze_and_mask, plan_surgery, reinitialise


def step(model, params, opt, ids) -> float:
    t0 = time.perf_counter()
    logits = model(input_ids=ids).logits[:, :-1]
    loss = F.cross_entropy(logits.float().reshape(-1, logits.shape[-1]), ids[:, 1:].reshape(-1))
    loss.backward()
    torch.nn.utils.clip_grad_norm_(params, 1.0)
    opt.step()
    opt.zero_grad(set_to_none=True)
    return time.perf_counter() - t0


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default="smollm2-135m")
    ap.add_argument("--dtype", default="float32")
    ap.add_argument("--seq-len", type=int, default=256)
    ap.add_argument("--batch", type=int, default=1)
    ap.add_argument("--steps", type=int, default=6)
    ap.add_argument("--warmup", type=int, default=1)
    ap.add_argument("--heads-per-layer", type=int, default=3, help="targets: heads 0..k-1 of every layer")
    ap.add_argument("--out", default=str(Path(__file__).parent / "results" / "bench_surgery.md"))
    args = ap.parse_args()

    torch.manual_seed(0)
    loaded = load_model(args.model, dtype=args.dtype)
    g = loaded.geometry
    targets = [(L, h) for L in range(g.n_layers) for h in range(args.heads_per_layer)]
    plan = plan_surgery(g, targets, "q_only")
    ids = torch.randint(0, len(loaded.tokenizer), (args.batch, args.seq_len))

    surg = loaded.load_hf_model().train()
    reinitialise(surg, plan, seed=0)
    masked = freeze_and_mask(surg, plan)
    opt_s = torch.optim.AdamW(masked.params, lr=5e-5, weight_decay=0.0)

    full = loaded.load_hf_model().train()
    full_params = [p for p in full.parameters()]
    for p in full_params:
        p.requires_grad_(True)
    opt_f = torch.optim.AdamW(full_params, lr=5e-5, weight_decay=0.0)
    n_train_s = sum(int(m.sum()) for m in masked.masks.values())
    n_grad_s = sum(p.numel() for p in masked.params)
    n_full = sum(p.numel() for p in full_params)

    ts, tf = [], []
    for i in range(args.warmup + args.steps):
        a = step(surg, masked.params, opt_s, ids)
        b = step(full, full_params, opt_f, ids)
        if i >= args.warmup:
            ts.append(a)
            tf.append(b)
        print(f"step {i}: surgery {a:.3f} s  full {b:.3f} s", flush=True)
    ms, mf = statistics.median(ts), statistics.median(tf)
    ratio = ms / mf
    per_step = [s / f for s, f in zip(ts, tf)]
    lines = [
        "# Masked surgery step vs full fine-tune step",
        "",
        f"Command: `HF_HUB_OFFLINE=1 python benchmarks/bench_surgery.py --model {args.model} --dtype {args.dtype} "
        f"--seq-len {args.seq_len} --batch {args.batch} --steps {args.steps} --heads-per-layer {args.heads_per_layer}`",
        "",
        f"Machine: CPU, {torch.get_num_threads()} torch threads, {os.cpu_count()} cores (shared with other jobs: "
        "read the ratio, not the absolute times). torch " + torch.__version__ + ".",
        "",
        f"Model {loaded.name} ({g.n_layers} layers x {g.n_heads} heads, {g.n_kv_heads} KV heads), {args.dtype}, "
        f"batch {args.batch} x {args.seq_len} tokens. One step = forward + backward + clip + AdamW update.",
        f"Surgery targets: heads 0..{args.heads_per_layer - 1} of every layer ({len(targets)} heads, "
        "GQA policy q_only: Q and W_O slices), so the backward pass still runs through every layer.",
        "",
        "| | median s/step | trainable values | tensors with gradients |",
        "|---|---|---|---|",
        f"| masked surgery | {ms:.3f} | {n_train_s:,} | {len(masked.params)} ({n_grad_s:,} values) |",
        f"| full fine-tune | {mf:.3f} | {n_full:,} | {len(full_params)} ({n_full:,} values) |",
        "",
        f"**Ratio surgery / full: {ratio:.2f}x** (median of {args.steps} interleaved steps after {args.warmup} "
        f"warm-up; per-step ratios {', '.join(f'{r:.2f}' for r in per_step)}). Goal: <= 0.8x.",
        "",
    ]
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(args.out).with_suffix(".tmp")
    tmp.write_text("\n".join(lines))
    os.replace(tmp, args.out)
    print("\n".join(lines))


if __name__ == "__main__":
    main()
