"""Where fused attention starts to win: one forward of ~2,048 tokens (batch x length) under each
backend, over input length, on SmolLM2 (docs/methods.md §10). ``auto`` runs eager below
``attention.AUTO_MIN_KEYS`` keys on a CPU; this benchmark is where that number comes from.

    HF_HUB_OFFLINE=1 .venv/bin/python benchmarks/bench_attention_crossover.py [--dtypes float32,bfloat16]

Best of 3 interleaved timings per cell. Results: benchmarks/results/bench_attention_crossover.md.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
ROOT = Path(__file__).resolve().parents[1]


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default="smollm2-135m")
    ap.add_argument("--dtypes", default="float32,bfloat16")
    ap.add_argument("--lengths", default="16,32,64,128,256,512,1024")
    ap.add_argument("--tokens", type=int, default=2048, help="tokens per forward (batch = tokens / length)")
    ap.add_argument("--out", default=str(ROOT / "benchmarks" / "results" / "bench_attention_crossover.md"))
    args = ap.parse_args()
    import torch

    from lens_heads import load_model
    from lens_heads.files.atomic import atomic_write_text
    from lens_heads.forward.engine import forward

    lines = [f"# bench_attention_crossover ({args.model}, torch threads {torch.get_num_threads()}, "
             f"load avg {os.getloadavg()[0]:.1f})", "",
             "| dtype | length | batch | eager ms | fused ms | eager / fused |", "|---|---|---|---|---|---|"]
    for dtype in args.dtypes.split(","):
        model = load_model(args.model, dtype=dtype)
        g = torch.Generator().manual_seed(0)
        for T in (int(t) for t in args.lengths.split(",")):
            b = max(1, args.tokens // T)
            ids = torch.randint(10, 1000, (b, T), generator=g)
            mask, keep = torch.ones(b, T, dtype=torch.long), torch.tensor([T - 1])
            best = {}
            for _ in range(3):
                for backend in ("eager", "fused"):
                    model.attention = backend
                    t0 = time.perf_counter()
                    forward(model, ids, mask, [], keep)
                    best[backend] = min(best.get(backend, float("inf")), time.perf_counter() - t0)
            row = (f"| {dtype} | {T} | {b} | {1000 * best['eager']:.0f} | {1000 * best['fused']:.0f} | "
                   f"{best['eager'] / best['fused']:.2f}x |")
            print(row, flush=True)
            lines.append(row)
    lines += ["", f"Command: `{' '.join(['python', 'benchmarks/bench_attention_crossover.py'] + sys.argv[1:])}`", ""]
    atomic_write_text(args.out, "\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
