"""Cost of streaming head scores vs a plain forward and vs caching activations.

    HF_HUB_OFFLINE=1 .venv/bin/python benchmarks/bench_scores.py            # ~5 min quiet, ~12 min on busy cores
    HF_HUB_OFFLINE=1 .venv/bin/python benchmarks/bench_scores.py --quick    # fewer inputs

Each measured (mode, dtype, length) runs in its own subprocess so memory peaks do not mix.
Inside it the model is loaded and warmed up on a short input, then the measured batches
run while a thread samples the process RSS every millisecond. Reported: wall time of the
batches, peak RSS, and "work" = peak RSS minus the RSS just before the batches (the model
weights are the same in every mode, so work memory is what the mode itself costs).

Modes
- ``forward``: the bridge's forward with no hooks (``return_logits=False``).
- ``scores``:  ``score_heads`` with all 15 functions (one pass, hooks reduce at once).
- ``cache``:   ``run_with_cache`` of hook_pattern/v/z for every layer, then the same 15
               scores computed from the cache (the approach streaming avoids).

Default: one torch thread (BENCH_THREADS): on 2 cores shared with other jobs, 2 threads
spin against each other and a forward ran ~8x slower. Machines are shared, so only ratios measured in one run mean anything; ``--repeats`` runs
each mode that many times, interleaved, and keeps the fastest time and the lowest peak.
Results go to benchmarks/results/bench_scores.md.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


# -----------------------------------------------------------------------------
# One measurement (runs in a subprocess)


class RssPeak:
    def __init__(self, interval: float = 0.001):
        import psutil

        self.proc, self.interval = psutil.Process(), interval
        self.peak = self.base = self.proc.memory_info().rss
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self):
        while not self._stop.is_set():
            self.peak = max(self.peak, self.proc.memory_info().rss)
            time.sleep(self.interval)

    def __enter__(self):
        self._thread.start()
        return self

    def __exit__(self, *exc):
        self._stop.set()
        self._thread.join()
        self.peak = max(self.peak, self.proc.memory_info().rss)


def measure(mode: str, dtype: str, n_inputs: int, seq_len: int, batch_size: int, model_spec: str) -> dict:
    import torch

    from lens_heads import load_model
    from lens_heads.data import iter_batches, load_texts, tokenize_texts
    from lens_heads.models.hooks import hook_name, run_with_hooks
    from lens_heads.scores import ScoreCollector, score_heads
    from lens_heads.scores.functions import input_level

    torch.set_num_threads(int(os.environ.get("BENCH_THREADS", "1")))
    model = load_model(model_spec, dtype=dtype)
    texts = load_texts("c4", n=max(64, n_inputs * seq_len // 200))
    seqs = tokenize_texts(model.tokenizer, texts, seq_len, mode="chunks", n_inputs=n_inputs)
    assert len(seqs) == n_inputs and all(len(s) == seq_len for s in seqs)
    ids = input_level()
    g = model.geometry

    def run_forward(batch):
        for _, x, m in iter_batches(batch, batch_size, pad_id=0):
            run_with_hooks(model, x, m, [], return_logits=False)

    def run_scores(batch):
        score_heads(model, batch, scores=ids, batch_size=batch_size, progress=False)

    def run_cache(batch):
        names = {hook_name(k, L) for L in range(g.n_layers) for k in ("pattern", "v", "z")}
        collector = ScoreCollector(model, ids)
        out = []
        for _, x, m in iter_batches(batch, batch_size, pad_id=0):
            with torch.inference_mode():
                _, cache = model.bridge.run_with_cache(x, attention_mask=m, names_filter=lambda n: n in names,
                                                       stop_at_layer=g.n_layers)
                hooks = dict(collector.hooks(m))  # the same reductions, applied to cached tensors
                for L in range(g.n_layers):
                    for kind in ("pattern", "v", "z"):
                        name = hook_name(kind, L)
                        if name in hooks:
                            hooks[name](cache[name])
            out.append(collector.batch_scores())
            del cache
        return out

    run = {"forward": run_forward, "scores": run_scores, "cache": run_cache}[mode]
    run([s[:16] for s in seqs[:1]])  # warm-up on a short input (first-call costs, lazy imports)
    with RssPeak() as mem:
        t0 = time.perf_counter()
        run(seqs)
        wall = time.perf_counter() - t0
    return {"mode": mode, "dtype": dtype, "seq_len": seq_len, "n_inputs": n_inputs, "batch_size": batch_size,
            "wall_s": wall, "peak_mb": mem.peak / 2**20, "base_mb": mem.base / 2**20,
            "work_mb": (mem.peak - mem.base) / 2**20}


# -----------------------------------------------------------------------------
# Driver


def run_child(args, mode, dtype, n_inputs, seq_len, batch_size) -> dict:
    cmd = [sys.executable, __file__, "--child", mode, "--dtype", dtype, "--n-inputs", str(n_inputs),
           "--seq-len", str(seq_len), "--batch-size", str(batch_size), "--model", args.model]
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1",
           "OMP_NUM_THREADS": os.environ.get("BENCH_THREADS", "1")}
    out = subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=ROOT)
    if out.returncode != 0:
        raise SystemExit(f"child {mode} {dtype} failed:\n{out.stderr[-3000:]}")
    result = json.loads(out.stdout.strip().splitlines()[-1])
    print(f"  {mode:8s} {dtype:9s} {n_inputs:>3} x {seq_len:<5} wall {result['wall_s']:7.2f} s  "
          f"peak {result['peak_mb']:7.0f} MB  work {result['work_mb']:7.0f} MB", flush=True)
    return result


def best(results: list[dict]) -> dict:
    return {**results[0], "wall_s": min(r["wall_s"] for r in results),
            "peak_mb": min(r["peak_mb"] for r in results), "work_mb": min(r["work_mb"] for r in results)}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--child", choices=["forward", "scores", "cache"])
    p.add_argument("--model", default="smollm2-135m")
    p.add_argument("--dtype", default="float32")
    p.add_argument("--dtypes", default="float32,bfloat16")
    p.add_argument("--n-inputs", type=int, default=8)
    p.add_argument("--seq-len", type=int, default=512)
    p.add_argument("--batch-size", type=int, default=8)
    p.add_argument("--cache-len", type=int, default=1024, help="length for the cache comparison")
    p.add_argument("--cache-inputs", type=int, default=2)
    p.add_argument("--repeats", type=int, default=2)
    p.add_argument("--quick", action="store_true", help="4 inputs x 256 tokens, 1 repeat")
    p.add_argument("--out", default=str(ROOT / "benchmarks" / "results" / "bench_scores.md"))
    args = p.parse_args()
    if args.child:
        print(json.dumps(measure(args.child, args.dtype, args.n_inputs, args.seq_len, args.batch_size,
                                 args.model)))
        return
    if args.quick:
        args.n_inputs, args.seq_len, args.repeats = 4, 256, 1

    rows = []
    print(f"forward vs scores: {args.n_inputs} inputs x {args.seq_len} tokens, batch {args.batch_size}")
    for dtype in args.dtypes.split(","):
        got = {"forward": [], "scores": []}
        for _ in range(args.repeats):
            for mode in got:
                got[mode].append(run_child(args, mode, dtype, args.n_inputs, args.seq_len, args.batch_size))
        f, s = best(got["forward"]), best(got["scores"])
        rows.append(("scores / forward", dtype, args.n_inputs, args.seq_len, f, s))
    print(f"scores vs cache: {args.cache_inputs} inputs x {args.cache_len} tokens, batch {args.cache_inputs}")
    got = {"forward": [], "scores": [], "cache": []}
    for mode in got:
        got[mode].append(run_child(args, mode, "float32", args.cache_inputs, args.cache_len, args.cache_inputs))
    f, s, c = (best(got[m]) for m in ("forward", "scores", "cache"))
    rows.append(("scores / forward", "float32", args.cache_inputs, args.cache_len, f, s))
    rows.append(("cache / scores", "float32", args.cache_inputs, args.cache_len, s, c))

    lines = [
        "# bench_scores: streaming head scores (all 15 functions)",
        "",
        f"Model {args.model}, CPU, {os.environ.get('BENCH_THREADS', '1')} torch thread(s), C4 validation chunks; "
        f"best of {args.repeats} interleaved run(s) for the forward/scores rows. "
        "work = peak RSS minus RSS before the batches (weights excluded). Shared machine: compare ratios only.",
        "",
        "| comparison | dtype | inputs x tokens | A wall s | B wall s | time B/A | A peak MB | B peak MB "
        "| peak B/A | A work MB | B work MB | work B/A |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for name, dtype, n, T, a, b in rows:
        lines.append(
            f"| {name} | {dtype} | {n} x {T} | {a['wall_s']:.2f} | {b['wall_s']:.2f} | "
            f"{b['wall_s'] / a['wall_s']:.3f} | {a['peak_mb']:.0f} | {b['peak_mb']:.0f} | "
            f"{b['peak_mb'] / a['peak_mb']:.3f} | {a['work_mb']:.0f} | {b['work_mb']:.0f} | "
            f"{b['work_mb'] / max(a['work_mb'], 1):.2f} |")
    lines += ["", "Goals: scores/forward time <= 1.15 and peak <= 1.10; cache/scores peak >= 5 at 1,024 tokens.",
              f"Command: `{' '.join(['python', 'benchmarks/bench_scores.py'] + sys.argv[1:])}`", ""]
    text = "\n".join(lines)
    print("\n" + text)
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_name(out.name + ".tmp")
    tmp.write_text(text)
    os.replace(tmp, out)


if __name__ == "__main__":
    main()
