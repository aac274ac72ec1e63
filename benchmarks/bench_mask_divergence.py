"""Benchmark: how far into the network two MMLU questions of one subject realise the same mask
under a per-input score ablation, and what resuming a forward at the layer where the masks part
would cost (docs/methods.md §2, "Prefixes kept across evaluations, and under a per-input
ablation").

The speculation of ``interventions.speculation`` keeps an input's suffix forward after a cached
prefix only when the input realises the cached prefix's mask at *every* layer; otherwise the
suffix forward is thrown away and the input runs whole. But up to the first layer k where the two
masks part, the suffix forward computed exactly what the input's own whole forward computes (the
same induction over layers), so a forward could resume there: layers k..L-1 over the whole input,
its residual stream at layer k taken from the cached prefix and the suffix forward. This script
measures k and the cost that resuming would have:

* per (score function, fraction): questions of two MMLU subjects (the two smallest with at least
  30 questions in the 2,000-question stratified population), each run whole on its own; per
  question after a subject's first, k = the most layers it agrees on with an earlier question of
  its subject (the entry it would find), L when the masks are identical;
* projected cost per question, in tokens through the network with a forward's fixed cost F
  (``speculation.FIXED_TOKENS``): whole W = P + S + F; kept-or-whole (today's speculation) S + F
  when k = L, else S + F + W; resumed (S + F) k / L + W (L - k) / L. Thresholds: calibrated on the
  same questions (``calibrated_spec``).
* the resume itself (``hooks.resumed_at``), on the real model: one random input's forward resumed
  at layer L/2 from its own residual stream: the largest logit difference from its whole forward
  and the CPU-time ratio.

    OMP_NUM_THREADS=1 python benchmarks/bench_mask_divergence.py

Writes benchmarks/results/bench_mask_divergence.md.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import numpy as np  # noqa: E402
import torch  # noqa: E402

from lens_heads import load_model  # noqa: E402
from lens_heads.data import load_task  # noqa: E402
from lens_heads.evaluation.evaluate import evaluate_task  # noqa: E402
from lens_heads.files.atomic import atomic_write_text  # noqa: E402
from lens_heads.forward.task_requests import record_inputs, select_records  # noqa: E402
from lens_heads.interventions.ablation import ScoreAblation, parse_ablation  # noqa: E402
from lens_heads.interventions.speculation import FIXED_TOKENS, population_prefixes  # noqa: E402
from lens_heads.interventions.thresholds import calibrated_spec  # noqa: E402
from lens_heads.models.hooks import resumed_at, run_with_hooks  # noqa: E402

SEED = 1234


def realised_masks(model, task, spec: str, records) -> dict[int, torch.Tensor]:
    """doc id -> the [layer, head] mask its whole forward (batch 1) realised under ``spec``."""
    seen: list[torch.Tensor] = []
    original = ScoreAblation.crosses

    def crosses(self, scores):
        out = original(self, scores)
        seen.append(out[0].detach().clone())
        return out

    ScoreAblation.crosses = crosses
    try:
        masks = {}
        for r in records:
            seen.clear()
            evaluate_task(model, task, ablation=parse_ablation(spec, model.geometry), batch_size=1, progress=False,
                          doc_ids=[r.doc_id])
            masks[r.doc_id] = torch.stack(seen)
        return masks
    finally:
        ScoreAblation.crosses = original


def agreement(a: torch.Tensor, b: torch.Tensor) -> int:
    """Layers from the first on where masks ``a`` and ``b`` are equal (all of them when identical)."""
    parted = (a != b).any(-1).nonzero()
    return int(parted[0]) if len(parted) else a.shape[0]


def resume_check(model, n_tokens: int) -> tuple[float, float, int]:
    """(largest |logit difference|, CPU time resumed / whole, layer) for one random input resumed
    at the middle layer from its own residual stream (``hooks.resumed_at``); the last position's
    logits only, as the engine computes for MMLU."""
    k = model.geometry.n_layers // 2
    ids = torch.randint(100, 5000, (1, n_tokens), generator=torch.Generator().manual_seed(SEED))
    last = torch.tensor([n_tokens - 1])
    saved = {}

    def save(t, hook):
        saved["x"] = t.clone()
        return t

    run_with_hooks(model, ids, None, [], logits_to_keep=last)  # warm-up
    c0 = time.process_time()
    whole = run_with_hooks(model, ids, None, [(f"blocks.{k}.hook_resid_pre", save)], logits_to_keep=last)
    t_whole = time.process_time() - c0
    with resumed_at(model, k, saved["x"]) as put:
        c0 = time.process_time()
        part = run_with_hooks(model, ids, None, put, logits_to_keep=last)
        t_part = time.process_time() - c0
    return float((whole - part).abs().max()), t_part / t_whole, k


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="qwen2.5-coder-0.5b")
    ap.add_argument("--scores", default="ahon_ln,awft,lthon_ln")
    ap.add_argument("--fractions", default="0.05,0.15,0.3")
    ap.add_argument("--questions", type=int, default=6, help="per subject")
    ap.add_argument("--resume-tokens", type=int, default=300)
    ap.add_argument("--out", default=str(ROOT / "benchmarks" / "results" / "bench_mask_divergence.md"))
    args = ap.parse_args()
    torch.set_num_threads(1)
    model = load_model(args.model, dtype="float32")
    task = load_task("mmlu")
    by: dict[str, list] = {}
    for r in select_records(task, 2000, SEED):
        by.setdefault(r.subject, []).append(r)
    subjects = [s for s in sorted(by, key=lambda s: (len(by[s]), s)) if len(by[s]) >= 30][:2]
    chosen = [r for s in subjects for r in by[s][:args.questions]]
    inputs = record_inputs(model, task, chosen, None, SEED)
    population = [r for s in subjects for r in by[s]]  # each input's prefix as the search's population shares it
    shared = population_prefixes(model, record_inputs(model, task, population, None, SEED))
    P = {r.doc_id: shared.get(tuple(x.tolist()), 0) for r, x in zip(chosen, inputs)}
    T = {r.doc_id: len(x) for r, x in zip(chosen, inputs)}
    F = FIXED_TOKENS
    rows = []
    for fn in args.scores.split(","):
        for frac in (float(f) for f in args.fractions.split(",")):
            spec, _ = calibrated_spec(model, inputs, fn, frac, progress=False)
            masks = realised_masks(model, task, spec, chosen)
            L = next(iter(masks.values())).shape[0]
            for s in subjects:
                ids = [r.doc_id for r in by[s][:args.questions]]
                ks, whole, kept, resumed = [], 0.0, 0.0, 0.0
                for i, d in enumerate(ids[1:], start=1):
                    k = max(agreement(masks[d], masks[e]) for e in ids[:i])
                    S, W = T[d] - P[d], T[d] + F
                    ks.append(k)
                    whole += W
                    kept += (S + F) if k == L else (S + F + W)
                    resumed += (S + F) * k / L + W * (L - k) / L
                rows.append((fn, frac, s, ks, L, kept / whole, resumed / whole))
                print(rows[-1], flush=True)
    err, ratio, k = resume_check(model, args.resume_tokens)
    prefix_share = np.mean([P[d] / T[d] for d in P])
    lines = [f"# bench_mask_divergence ({args.model}, float32, MMLU 5-shot, 1 torch thread, load avg "
             f"{os.getloadavg()[0]:.1f})", "",
             f"Subjects: {', '.join(subjects)} ({args.questions} questions each; shared prefix {100 * prefix_share:.0f} % "
             f"of a prompt's tokens on average); F = {F} tokens.", "",
             "| score | fraction | subject | layers agreed with the best earlier question (of L) | "
             "identical | kept-or-whole / whole | resumed / whole |", "|---|---|---|---|---|---|---|"]
    for fn, frac, s, ks, L, kept, resumed in rows:
        lines.append(f"| {fn} | {100 * frac:g} % | {s} | {', '.join(map(str, ks))} (L = {L}) | "
                     f"{sum(k == L for k in ks)}/{len(ks)} | {kept:.2f} | {resumed:.2f} |")
    mean_resumed = np.mean([r[6] for r in rows])
    lines += ["", f"Mean projected cost resumed / whole over the rows: {mean_resumed:.2f} "
              f"(kept-or-whole: {np.mean([r[5] for r in rows]):.2f}).", "",
              f"Resume check: a {args.resume_tokens}-token input resumed at layer {k} from its own residual stream: "
              f"largest |logit difference| from its whole forward {err:.3g}; CPU time {ratio:.2f} of the whole forward's "
              f"(the last position's logits).", "",
              "Projected costs count tokens through the network (a whole forward P + S + F; layers < k of a resumed "
              "input at the suffix's S + F); the first question of each subject runs whole in every column and is "
              "left out."]
    atomic_write_text(Path(args.out), "\n".join(lines) + "\n", make_parents=True)
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
