"""The first check on a GPU machine: ``python benchmarks/gpu_check.py`` (zoo weights present).

On a CUDA device it runs the suite's ``gpu`` tests with ``--device cuda``, compares a bf16
forward of SmolLM2 with fp32 on 64 PIQA prompts (max |d log p|, argmax agreement, the accuracy
both give), times a 500-question MMLU 5-shot point (batch size ``auto``), and checks the fused
attention path (docs/methods.md §10): fused vs eager log-likelihoods and predictions on 100
MMLU 5-shot questions and tokens/s of both, and peak GPU memory of one forward of 512 ... 8,192
tokens under each backend; then writes ``benchmarks/results/gpu_check.md``. Without one it says so and exits 0, writing nothing.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
ROOT = Path(__file__).resolve().parents[1]


def main() -> int:
    import argparse

    ap = argparse.ArgumentParser(description="the first check on a GPU machine (see the module docstring)")
    ap.add_argument("--device", default="cuda", help="the CUDA device (default cuda)")
    args = ap.parse_args()
    import torch

    if not torch.cuda.is_available():
        print(f"gpu_check: no CUDA device here (torch {torch.__version__}, CUDA build "
              f"{torch.version.cuda or 'none'}): nothing to check, nothing written")
        return 0
    device = args.device
    lines = [f"# gpu_check ({torch.cuda.get_device_name(0)}, torch {torch.__version__}, CUDA {torch.version.cuda})", ""]
    t0 = time.perf_counter()
    tests = subprocess.run([sys.executable, "-m", "pytest", "-q", "-m", "gpu", "--device", device, "-p", "no:cacheprovider",
                            str(ROOT / "tests")], capture_output=True, text=True, cwd=ROOT)
    summary = (tests.stdout.strip().splitlines() or ["(no output)"])[-1]
    lines += [f"- `pytest -m gpu --device cuda`: {summary} ({time.perf_counter() - t0:.0f} s, exit {tests.returncode})"]

    from lens_heads import load_model
    from lens_heads.data import load_task
    from lens_heads.evaluate import evaluate_task
    from lens_heads.hooks import run_with_hooks

    fp32, bf16 = load_model("smollm2-135m", device=device), load_model("smollm2-135m", "bfloat16", device=device)
    piqa = load_task("piqa")
    worst, agree, n = 0.0, 0, 0
    for rec in piqa.records[:64]:
        ctx, cont = piqa.build(rec, 0)[0]
        ids = torch.tensor([fp32.tokenizer(ctx + cont)["input_ids"]])
        a = run_with_hooks(fp32, ids, None, []).float().log_softmax(-1)
        b = run_with_hooks(bf16, ids, None, []).float().log_softmax(-1)
        worst = max(worst, (a - b).abs().max().item())
        agree += int((a.argmax(-1) == b.argmax(-1)).sum())
        n += ids.shape[1]
    acc = {name: evaluate_task(m, piqa, limit=200, batch_size="auto", progress=False).metrics["acc"]
           for name, m in (("fp32", fp32), ("bf16", bf16))}
    lines += [f"- bf16 vs fp32 forward, 64 PIQA prompts: max |d log p| {worst:.3f}, argmax agreement "
              f"{100 * agree / n:.1f} % of {n} positions; PIQA acc (200 q) fp32 {acc['fp32']:.4f}, bf16 {acc['bf16']:.4f}"]
    mmlu = load_task("mmlu")
    for name, m in (("fp32", fp32), ("bf16", bf16)):
        torch.cuda.synchronize()
        t = time.perf_counter()
        res = evaluate_task(m, mmlu, n_shot=5, limit=500, batch_size="auto", progress=False)
        torch.cuda.synchronize()
        lines += [f"- MMLU 5-shot, 500 questions, {name}, batch auto: acc {res.metrics['acc']:.4f}, "
                  f"{time.perf_counter() - t:.1f} s"]
    lines += fused_check(bf16, mmlu)
    lines += packing_check(bf16, piqa)
    out = ROOT / "benchmarks" / "results" / "gpu_check.md"
    from lens_heads.atomic import atomic_write_text

    atomic_write_text(out, "\n".join(lines) + "\n")
    print("\n".join(lines))
    return 0 if tests.returncode in (0, 5) else 1


def fused_check(model, mmlu) -> list[str]:
    """Fused vs eager attention on the GPU: equality on MMLU 5-shot, speed, peak memory by length."""
    import torch

    from lens_heads.evaluate import evaluate_task
    from lens_heads.engine import forward

    out, res, times = [], {}, {}
    for backend in ("fused", "eager"):
        model.attention = backend
        torch.cuda.synchronize()
        t = time.perf_counter()
        res[backend] = evaluate_task(model, mmlu, n_shot=5, limit=100, batch_size=8, progress=False)
        torch.cuda.synchronize()
        times[backend] = time.perf_counter() - t
    f, e = res["fused"], res["eager"]
    dll = max(abs(a - b) for qf, qe in zip(f.questions, e.questions) for a, b in zip(qf.lls, qe.lls))
    same = sum(qf.pred == qe.pred for qf, qe in zip(f.questions, e.questions))
    out.append(f"- fused vs eager attention, MMLU 5-shot 100 q ({model.dtype}): max |d ll| {dll:.2e}, identical "
               f"predictions {same}/100; fused {times['fused']:.1f} s, eager {times['eager']:.1f} s "
               f"({times['eager'] / times['fused']:.2f}x)")
    ids = torch.randint(10, 1000, (1, 8192))
    for T in (512, 1024, 2048, 4096, 8192):
        row = []
        for backend in ("fused", "eager"):
            model.attention = backend
            torch.cuda.empty_cache()
            torch.cuda.reset_peak_memory_stats()
            base = torch.cuda.memory_allocated()
            torch.cuda.synchronize()
            t = time.perf_counter()
            try:
                forward(model, ids[:, :T], torch.ones(1, T, dtype=torch.long), [], keep=torch.tensor([T - 1]))
                torch.cuda.synchronize()
                row.append(f"{backend} {(torch.cuda.max_memory_allocated() - base) / 2**20:.0f} MB, "
                           f"{T / (time.perf_counter() - t):.0f} tokens/s")
            except torch.cuda.OutOfMemoryError:
                row.append(f"{backend} out of memory")
        out.append(f"- one forward of {T} tokens: " + "; ".join(row))
    model.attention = "auto"
    return out


def packing_check(model, piqa) -> list[str]:
    """Packed vs padded rows on the GPU (docs/methods.md §4): PIQA 200 q, equality and speed."""
    import torch

    from lens_heads.evaluate import evaluate_task

    res, times = {}, {}
    for pack in (True, False):
        torch.cuda.synchronize()
        t = time.perf_counter()
        res[pack] = evaluate_task(model, piqa, limit=200, batch_size=16, progress=False, pack=pack)
        torch.cuda.synchronize()
        times[pack] = time.perf_counter() - t
    dll = max(abs(a - b) for qa, qb in zip(res[True].questions, res[False].questions) for a, b in zip(qa.lls, qb.lls))
    same = sum(qa.pred == qb.pred for qa, qb in zip(res[True].questions, res[False].questions))
    return [f"- packed vs padded rows, PIQA 200 q ({model.dtype}, batch 16): max |d ll| {dll:.2e}, identical "
            f"predictions {same}/200; packed {times[True]:.1f} s, padded {times[False]:.1f} s "
            f"({times[False] / times[True]:.2f}x)"]


if __name__ == "__main__":
    sys.exit(main())
