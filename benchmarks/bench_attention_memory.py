"""Peak activation memory of a score pass and of a per-input ablated forward, fused vs eager
attention, over sequence length (docs/methods.md §10).

    HF_HUB_OFFLINE=1 .venv/bin/python benchmarks/bench_attention_memory.py                 # Qwen2.5-Coder-0.5B
    HF_HUB_OFFLINE=1 .venv/bin/python benchmarks/bench_attention_memory.py --lengths 256,512 --model smollm2-135m

Each (backend, pass, length) runs in its own subprocess: the model is loaded and warmed up on
a short input, then one input of T tokens (C4 validation text, tiled) runs while a thread
samples the process RSS every millisecond. "work" = peak RSS minus the RSS just before the
pass (the weights are the same in every run, so work is what the pass itself holds).

Passes
- ``scores``: ``score_heads`` with every input-level score (AWFT, AEQD and the rest: the
  statistics fused attention computes from its log-sum-exp, eager from the pattern).
- ``ablated``: one forward under ``score:ahon_ln@1.0`` (heads zeroed per input at hook_z),
  logits at the last position only (a multiple-choice read).

Backends: ``eager`` (TransformerLens' attention: the [batch, head, q, k] pattern) and ``fused``
(``--attention fused``). Results: benchmarks/results/bench_attention_memory.md.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(Path(__file__).parent))

from bench_scores import RssPeak  # noqa: E402  (the same RSS sampler)


def measure(backend: str, what: str, T: int, model_spec: str, dtype: str) -> dict:
    import torch

    from lens_heads import load_model
    from lens_heads.interventions.ablation import parse_ablation
    from lens_heads.data import load_texts
    from lens_heads.forward.engine import forward
    from lens_heads.scores import score_heads
    from lens_heads.scores.functions import input_level

    torch.set_num_threads(int(os.environ.get("BENCH_THREADS", "2")))
    model = load_model(model_spec, dtype=dtype, attention=backend)
    text = " ".join(load_texts("c4", n=64))
    ids = torch.tensor(model.tokenizer(text)["input_ids"], dtype=torch.long)
    ids = ids.repeat(T // len(ids) + 1)[:T]
    mask = torch.ones(1, T, dtype=torch.long)
    abl = parse_ablation("score:ahon_ln@1.0", model.geometry)

    def run(x: torch.Tensor) -> None:
        if what == "scores":
            score_heads(model, [x], scores=input_level(), batch_size=1, progress=False)
        else:
            m = torch.ones(1, len(x), dtype=torch.long)
            forward(model, x[None], m, abl.hooks(model, m, [0]), keep=torch.tensor([len(x) - 1]))

    run(ids[:32])  # warm-up (first-call costs, lazy imports)
    with RssPeak() as mem:
        t0 = time.perf_counter()
        run(ids)
        wall = time.perf_counter() - t0
    return {"backend": backend, "what": what, "T": T, "wall_s": wall, "work_mb": (mem.peak - mem.base) / 2**20,
            "dtype": str(model.dtype).removeprefix("torch.")}


def run_child(args, backend: str, what: str, T: int) -> dict | None:
    cmd = [sys.executable, __file__, "--child", backend, what, str(T), "--model", args.model, "--dtype", args.dtype]
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1"}
    out = subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=ROOT, timeout=args.child_timeout)
    if out.returncode != 0:
        print(f"  {backend} {what} T={T} failed: {out.stderr.strip().splitlines()[-1:]}", flush=True)
        return None
    r = json.loads(out.stdout.strip().splitlines()[-1])
    print(f"  {backend:6s} {what:8s} T={T:<5} wall {r['wall_s']:8.2f} s  work {r['work_mb']:8.0f} MB", flush=True)
    return r


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--child", nargs=3, metavar=("BACKEND", "WHAT", "T"))
    p.add_argument("--model", default="qwen2.5-coder-0.5b")
    p.add_argument("--dtype", default="auto")
    p.add_argument("--lengths", default="512,1024,2048,4096,8192")
    p.add_argument("--child-timeout", type=int, default=1800)
    p.add_argument("--out", default=str(ROOT / "benchmarks" / "results" / "bench_attention_memory.md"))
    args = p.parse_args()
    if args.child:
        backend, what, T = args.child
        print(json.dumps(measure(backend, what, int(T), args.model, args.dtype)))
        return 0
    lengths = [int(t) for t in args.lengths.split(",")]
    res = {}
    for T in lengths:
        for what in ("scores", "ablated"):
            for backend in ("fused", "eager"):
                res[(backend, what, T)] = run_child(args, backend, what, T)
    dtype = next((r["dtype"] for r in res.values() if r), args.dtype)
    lines = [f"# bench_attention_memory ({args.model}, {dtype}, batch 1, "
             f"{os.environ.get('BENCH_THREADS', '2')} torch threads)", "",
             "Work memory = peak RSS minus RSS before the pass (weights excluded); wall time of the pass. "
             "One subprocess per cell; shared machine: compare within a row.", "",
             "| pass | T | fused work MB | eager work MB | eager / fused memory | fused s | eager s | eager / fused time |",
             "|---|---|---|---|---|---|---|---|"]
    for what in ("scores", "ablated"):
        for T in lengths:
            f, e = res[("fused", what, T)], res[("eager", what, T)]
            cell = lambda r, k, fmt: format(r[k], fmt) if r else "failed"  # noqa: E731
            ratio = lambda k: f"{e[k] / max(f[k], 1e-9):.2f}x" if f and e else "-"  # noqa: E731
            lines.append(f"| {what} | {T} | {cell(f, 'work_mb', '.0f')} | {cell(e, 'work_mb', '.0f')} | "
                         f"{ratio('work_mb')} | {cell(f, 'wall_s', '.1f')} | {cell(e, 'wall_s', '.1f')} | "
                         f"{ratio('wall_s')} |")
    for what in ("scores", "ablated"):
        pts = [(T, res[("fused", what, T)]["work_mb"]) for T in lengths if res[("fused", what, T)]]
        if len(pts) >= 2:
            (t0, m0), (t1, m1) = pts[0], pts[-1]
            lines.append(f"\n{what}, fused: work memory grows {m1 / max(m0, 1e-9):.1f}x for {t1 / t0:.0f}x the length "
                         f"({t0} -> {t1} tokens; linear would be {t1 / t0:.0f}x, quadratic {(t1 / t0) ** 2:.0f}x).")
    lines += ["", f"Command: `{' '.join(['python', 'benchmarks/bench_attention_memory.py'] + sys.argv[1:])}`", ""]
    from lens_heads.files.atomic import atomic_write_text

    atomic_write_text(args.out, "\n".join(lines) + "\n")
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
