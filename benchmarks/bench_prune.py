"""Benchmark: what physical head pruning saves, measured (lens_heads.surgery.prune).

    python benchmarks/bench_prune.py                          # SmolLM2 and Qwen2.5-Coder-0.5B, 10/20/30 %
    python benchmarks/bench_prune.py --models smollm2-135m --piqa 100
    python benchmarks/bench_prune.py --models qwen2.5-coder-0.5b --fractions 0.3 --kinds groups

For each model, the heads are ranked by dataset-level AHON(LN) on 16 shipped C4 texts and the
least active 10 / 20 / 30 % removed. Reported per model x fraction: parameters, attention FLOPs
per token (projections plus scores and values at a 512-token prefill), KV-cache bytes per token,
wall-clock prefill tokens/s (one 512-token input) and decode tokens/s (64 greedy tokens after a
128-token prompt, KV cache on) of the plain transformers model, pruned vs unpruned, in fp32 and
(where the CPU runs it natively) bf16, measured back to back in this run; the speed-up the FLOP
reduction predicts and the share of it realised; and the PIQA accuracy change with its paired
bootstrap interval. Writes benchmarks/results/bench_prune.md.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
ROOT = Path(__file__).resolve().parents[1]


def flops_per_token(model, ctx: int) -> dict[str, float]:
    """Matmul FLOPs per token of a forward at mean context ``ctx``: attention (q/k/v/o projections,
    scores and values), the rest of the blocks (MLP), and the LM head."""
    g, cfg = model.geometry, model.hf_model.config
    d, dm = g.d_head, g.d_model
    attn = 0.0
    for L in range(g.n_layers):
        q, kv = g.heads_in(L), g.kv_in(L)
        attn += 2 * dm * (q * d + 2 * kv * d) + 2 * q * d * dm + 2 * 2 * q * d * ctx
    mlp = g.n_layers * 2 * 3 * dm * cfg.intermediate_size
    head = 2 * dm * cfg.vocab_size
    return {"attention": attn, "total": attn + mlp + head}


def kv_bytes_per_token(model, elem: int) -> int:
    g = model.geometry
    return sum(2 * g.kv_in(L) * g.d_head * elem for L in range(g.n_layers))


def paired_speeds(a, b, vocab: int, repeats: int) -> tuple[tuple[float, float], tuple[float, float]]:
    """((prefill tok/s at 512, decode tok/s) of plain HF model ``a``, the same of ``b``), each the
    best of ``repeats`` timings taken alternately (a, b, a, b, ...): drift of the machine's speed
    hits both alike."""
    import torch

    g = torch.Generator().manual_seed(0)
    prompt = torch.randint(0, vocab, (1, 512), generator=g)
    short = prompt[:, :128]

    def prefill(m):
        return lambda: m(prompt)

    def decode(m):
        return lambda: m.generate(short, attention_mask=torch.ones_like(short), max_new_tokens=64,
                                  min_new_tokens=64, do_sample=False, pad_token_id=0)

    def best_pair(make, n):
        fa, fb = make(a), make(b)
        fa(), fb()  # warm-up
        ta = tb = float("inf")
        for _ in range(n):
            t0 = time.perf_counter()
            fa()
            ta = min(ta, time.perf_counter() - t0)
            t0 = time.perf_counter()
            fb()
            tb = min(tb, time.perf_counter() - t0)
        return ta, tb

    with torch.inference_mode():
        pa, pb = best_pair(prefill, repeats)
        da, db = best_pair(decode, max(1, repeats // 2))
        sa, sb = best_pair(lambda m: (lambda: m(short)), repeats)  # the decode's own prompt, taken off
    return (512 / pa, 64 / (da - sa)), (512 / pb, 64 / (db - sb))


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--models", default="smollm2-135m,qwen2.5-coder-0.5b")
    ap.add_argument("--fractions", default="0.1,0.2,0.3")
    ap.add_argument("--kinds", default="heads,groups",
                    help="which selections: heads one by one, whole KV groups (default both)")
    ap.add_argument("--piqa", type=int, default=200, help="PIQA questions for the accuracy change")
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--out", default=str(ROOT / "benchmarks" / "results" / "bench_prune.md"))
    args = ap.parse_args()

    import torch

    from lens_heads import load_model
    from lens_heads.files.atomic import atomic_write_text
    from lens_heads.sweep.curves import bootstrap_indices, paired_difference
    from lens_heads.data import load_task, load_texts, tokenize_texts
    from lens_heads.evaluation.evaluate import evaluate_task
    from lens_heads.models.load import native_bf16
    from lens_heads.surgery.prune import prune
    from lens_heads.scores import score_heads

    dtypes = ["float32"] + (["bfloat16"] if native_bf16() else [])
    fractions = [float(f) for f in args.fractions.split(",")]
    piqa = load_task("piqa")
    lines = [f"# bench_prune ({', '.join(dtypes)}, torch threads {torch.get_num_threads()}, "
             f"load avg {os.getloadavg()[0]:.1f})", "",
             "Heads removed: the least active by dataset-level AHON(LN) on 16 C4 texts (static), either heads one by one "
             "(a KV head goes only with its whole group; GQA groups keep zero-output padding heads) or whole KV groups "
             "by their heads' mean score (--select ahon_ln@P%:groups). Speeds: the plain "
             "transformers model, best of the repeats, timed alternately with the unpruned model (the reference of each "
             "row); predicted speed-up = total matmul FLOPs before / "
             "after at a 512-token prefill; realised = (measured - 1) / (predicted - 1).", "",
             "| model | removed | params | attn FLOPs/token | KV bytes/token (fp32) | dtype | prefill tok/s | "
             "decode tok/s | prefill speed-up (predicted) | realised | PIQA acc | change [95 % CI] |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for spec in args.models.split(","):
        base = {dt: load_model(spec, dtype=dt) for dt in dtypes}
        m32 = base["float32"]
        texts = load_texts("c4", n=16)
        hs = score_heads(m32, tokenize_texts(m32.tokenizer, texts, 256), ["ahon_ln"], progress=False)
        order = hs.least_active("ahon_ln")
        from lens_heads.surgery.prune import whole_groups
        ref = evaluate_task(m32, piqa, limit=args.piqa, progress=False)
        base_hf = {dt: base[dt].load_hf_model().eval() for dt in dtypes}
        vocab = m32.hf_model.config.vocab_size
        f0 = flops_per_token(m32, 256)
        kinds = [k for k in ("heads", "groups") if k in args.kinds.split(",")]
        for frac, how in [(0.0, "heads"), *((f, h) for f in fractions for h in kinds)]:
            chosen = order[:round(frac * m32.geometry.n_units)] if how == "heads" else \
                whole_groups(m32.geometry, hs.mean["ahon_ln"], "ahon_ln", frac)
            k = len(chosen)
            row_models = {dt: (prune(base[dt], chosen) if k else base[dt]) for dt in dtypes}
            p32 = row_models["float32"]
            f = flops_per_token(p32, 256)
            if k:
                res = evaluate_task(p32, piqa, limit=args.piqa, progress=False)
                d = paired_difference([q.correct for q in res.questions], [q.correct for q in ref.questions],
                                      bootstrap_indices(len(ref.questions), 1000))
                acc = f"{res.metrics['acc']:.4f} | {100 * d['delta']:+.1f} [{100 * d['ci_low']:+.1f}, {100 * d['ci_high']:+.1f}]"
            else:
                acc = f"{ref.metrics['acc']:.4f} | (baseline)"
            for dt in dtypes:
                pruned_hf = row_models[dt].load_hf_model().eval() if k else base_hf[dt]
                (b_pre, _), (pre, dec) = paired_speeds(base_hf[dt], pruned_hf, vocab, args.repeats)
                predicted = f0["total"] / f["total"]
                measured = pre / b_pre
                realised = (measured - 1) / (predicted - 1) if k else float("nan")
                line = (f"| {spec} | {100 * k / m32.geometry.n_units:.1f} % ({k}{', whole KV groups' if how == 'groups' else ''}) | {p32.parameter_count():,} | "
                        f"{f['attention'] / 1e6:.2f} M | {kv_bytes_per_token(p32, 4):,} | {dt} | {pre:.0f} | {dec:.1f} | "
                        f"{measured:.3f}x ({predicted:.3f}x) | {realised:.2f} | {acc} |")
                print(line, flush=True)
                lines.append(line)
    atomic_write_text(args.out, "\n".join(lines) + "\n", make_parents=True)
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
