"""Simulation: would a probe decide on fewer questions if its differences were taken against the
nearest point of its curve already known on every question, instead of the unablated model?
(docs/methods.md §12-13; a control variate for the adaptive search.)

A probe at fraction p reads d_i = c_i(p) - c_i(0) and stops when §12's confidence sequence puts
Δ(p) on one side of the margin. If a point q of the same curve is known on all N questions (a
probe run to exhaustion, exact Δ(q)), then Δ(p) = Δ(q) + mean_i (c_i(p) - c_i(q)) and the same
sequence on e_i = c_i(p) - c_i(q), with the margin moved by Δ(q), decides the same question,
equally valid (Δ(q) is a constant). Near the crossing p and q zero mostly the same heads, so e_i
is nonzero for fewer questions than d_i, and the sequence could narrow sooner.

This replays every probe of the Table 2 campaign that read all N questions (so both sequences can
be run on its real per-question answers, from the ledgers in
``analyses/results/inactive_heads/table2/store/``): q is the nearest (in p) earlier probe of the
curve that read all N questions, or the unablated model. For ``--orders`` random orders it counts
the questions each sequence reads before it decides (α / 6 per probe, batches of 64, margin 1
point, as the campaign).

    python benchmarks/sim_reference_probe.py

Writes benchmarks/results/sim_reference_probe.md.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402

from lens_heads.files.atomic import atomic_write_text  # noqa: E402
from lens_heads.sweep.adaptive import _EXACT, max_probes  # noqa: E402
from lens_heads.sweep.confseq import WoRConfidenceSequence  # noqa: E402

RESULTS = ROOT / "analyses" / "results" / "inactive_heads"
PAIRS = ("smollm2-135m__piqa", "gemma-3-270m__piqa", "qwen2.5-coder-0.5b__piqa")
MARGIN, BATCH, GRID_POINTS = 0.01, 64, 61  # the campaign's: 1 point, 64 questions a step, 0-60 % at 1 %


def answers(hexmask: str, n: int) -> np.ndarray:
    return np.unpackbits(np.frombuffer(bytes.fromhex(hexmask), dtype=np.uint8))[:n].astype(float)


def questions_to_decide(values: np.ndarray, margin: float, levels: int, order: np.ndarray, alpha: float) -> int:
    """Questions §12's sequence reads, in ``order``, before it puts the mean on one side of -margin."""
    cs = WoRConfidenceSequence(len(values), alpha, -1.0, 1.0, 1.0 / levels)
    n = 0
    while n < len(values):
        lo, hi = cs.update(values[order[n:n + BATCH]])
        n = min(len(values), n + BATCH)
        if lo >= -margin - _EXACT or hi < -margin - _EXACT:
            return n
    return n


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--orders", type=int, default=4)
    ap.add_argument("--out", default=str(ROOT / "benchmarks" / "results" / "sim_reference_probe.md"))
    args = ap.parse_args()
    alpha = 0.05 / max_probes(GRID_POINTS)
    probes = pd.read_csv(RESULTS / "table2_probes.csv")
    rows = []
    for pair in PAIRS:
        ledger = json.loads((RESULTS / "table2" / "store" / pair / "ledger_zero.json").read_text())
        N = int(ledger["n_population"])
        whole = {p["spec"]: answers(p["correct"], N) for p in ledger["points"].values() if p["n_known"] == N}
        base = whole["none"]
        model = pair.split("__")[0]
        for fn, curve in probes[(probes.model == model) & (probes.ablation == "zero")].groupby("score_fn", sort=False):
            known = {0.0: (base, 1)}  # p -> (mean correctness per question, seeds)
            for _, r in curve.sort_values("step").iterrows():
                specs = r.specs.split(";")
                if not all(s in whole for s in specs):
                    continue  # decided before the last question: nothing to replay it on
                c = np.mean([whole[s] for s in specs], axis=0)
                q = min(known, key=lambda x: (abs(x - r.pct), x))
                cq, seeds_q = known[q]
                levels = int(np.lcm(len(specs), seeds_q))
                d, e = c - base, c - cq
                shift = float(np.mean(cq - base))
                plain, ref = [], []
                for o in range(args.orders):
                    order = np.random.default_rng(o).permutation(N)
                    plain.append(questions_to_decide(d, MARGIN, levels, order, alpha))
                    ref.append(questions_to_decide(e, MARGIN + shift, levels, order, alpha))
                rows.append(dict(model=model, score=fn, pct=r.pct, delta_pts=100 * d.mean(), reference_pct=q,
                                 nonzero_d=np.mean(d != 0), nonzero_e=np.mean(e != 0), n_plain=np.mean(plain),
                                 n_reference=np.mean(ref), N=N))
                known[r.pct] = (c, len(specs))
                print(rows[-1], flush=True)
    df = pd.DataFrame(rows)
    lines = [f"# sim_reference_probe ({len(df)} probes of the Table 2 campaign that read every question, "
             f"{args.orders} orders each, alpha {alpha:.4f} a probe)", "",
             "| model | probes | questions read, against the unablated model | against the nearest known point | ratio |",
             "|---|---|---|---|---|"]
    for m, g in df.groupby("model", sort=False):
        lines.append(f"| {m} | {len(g)} | {g.n_plain.sum():.0f} | {g.n_reference.sum():.0f} | "
                     f"{g.n_plain.sum() / g.n_reference.sum():.3f}x |")
    lines.append(f"| all | {len(df)} | {df.n_plain.sum():.0f} | {df.n_reference.sum():.0f} | "
                 f"{df.n_plain.sum() / df.n_reference.sum():.3f}x |")
    lines += ["", f"Questions whose difference is nonzero: {100 * df.nonzero_d.mean():.1f} % against the unablated "
              f"model, {100 * df.nonzero_e.mean():.1f} % against the nearest known point (mean over probes). "
              f"Probes decided before the last question with either reference: {(df.n_plain < df.N).sum()} and "
              f"{(df.n_reference < df.N).sum()} of {len(df)}; |Δ + 1 point| at the probes: median "
              f"{np.median(np.abs(df.delta_pts + 1)):.2f} points.", "",
              "| model | score | p % | Δ (points) | reference p % | nonzero d | nonzero e | read (unablated) | "
              "read (reference) |", "|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        lines.append(f"| {r['model']} | {r['score']} | {r['pct']:g} | {r['delta_pts']:+.2f} | {r['reference_pct']:g} | "
                     f"{100 * r['nonzero_d']:.1f} % | {100 * r['nonzero_e']:.1f} % | {r['n_plain']:.0f} | "
                     f"{r['n_reference']:.0f} |")
    atomic_write_text(Path(args.out), "\n".join(lines) + "\n", make_parents=True)
    print("\n".join(lines[:12]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
