"""Where the time of an evaluation goes: a torch profile of ``evaluate_task``, by kind of work.

    python benchmarks/profile_evaluate.py                      # SmolLM2, bf16, PIQA 80 and MMLU 5-shot 10
    python benchmarks/profile_evaluate.py --dtype float32

``bench_evaluate.py`` measures lens_heads' positions/s against a matmul roof (the decoder blocks'
linears alone, at 512 rows). This profile says what the rest of the time is: each aten operator's
self time, put in one class by its name and, for matmuls, by its shapes (a dimension equal to the
vocabulary: the LM head). Shares are of the profiled time; the profiler's own overhead (shapes
are recorded) inflates small operators, so read the large classes. Writes
``benchmarks/results/profile_evaluate_<dtype>.md``.
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

MATMULS = {"aten::mm", "aten::addmm", "aten::bmm", "aten::baddbmm"}
CLASSES = {  # operator -> class (matmuls are split by shape in classify)
    "aten::_softmax": "attention softmax (float32)", "aten::_log_softmax": "log-softmax of the scored logits",
    "aten::copy_": "copies and dtype casts", "aten::_to_copy": "copies and dtype casts",
    "aten::index": "gathers and indexing", "aten::gather": "gathers and indexing", "aten::cat": "gathers and indexing",
    "aten::_scaled_dot_product_flash_attention_for_cpu": "fused attention kernel",
    "aten::_scaled_dot_product_flash_attention": "fused attention kernel",
    "aten::_scaled_dot_product_efficient_attention": "fused attention kernel",
}
ELEMENTWISE = ("mul", "add", "sub", "div", "silu", "gelu", "pow", "mean", "rsqrt", "sqrt", "neg", "tanh", "sum",
               "masked_fill", "where", "exp", "embedding")


def classify(name: str, shapes, vocab: int) -> str:
    if name in MATMULS:
        if name in ("aten::bmm", "aten::baddbmm"):
            return "attention products (QK^T, AV)"
        return "LM head" if any(vocab in (s or []) for s in shapes) else "block linears"
    if name in CLASSES:
        return CLASSES[name]
    if name.removeprefix("aten::").rstrip("_") in ELEMENTWISE:
        return "elementwise and norms"
    return "other"


def profile_task(model, task, limit: int, n_shot: int, batch_size: int
                 ) -> tuple[float, dict[str, float], dict[str, float]]:
    from torch.profiler import ProfilerActivity, profile

    from lens_heads.evaluation.evaluate import evaluate_task

    evaluate_task(model, task, limit=min(limit, 8), n_shot=n_shot, progress=False, batch_size=batch_size)  # warm
    t0 = time.perf_counter()
    evaluate_task(model, task, limit=limit, n_shot=n_shot, progress=False, batch_size=batch_size)
    wall = time.perf_counter() - t0
    with profile(activities=[ProfilerActivity.CPU], record_shapes=True) as prof:
        evaluate_task(model, task, limit=limit, n_shot=n_shot, progress=False, batch_size=batch_size)
    vocab = model.hf_model.get_output_embeddings().weight.shape[0]
    by_class: dict[str, float] = {}
    by_op: dict[str, float] = {}
    for ev in prof.key_averages(group_by_input_shape=True):
        c = classify(ev.key, ev.input_shapes, vocab)
        by_class[c] = by_class.get(c, 0.0) + ev.self_cpu_time_total / 1e6
        by_op[ev.key] = by_op.get(ev.key, 0.0) + ev.self_cpu_time_total / 1e6
    return wall, by_class, by_op


def module_split(model, task, limit: int, n_shot: int, batch_size: int) -> dict[str, float]:
    """Wall seconds of one evaluation in each block's attention component (its projections and
    kernel) and MLP, from forward pre- / post-hooks on the bridge's components, without the
    profiler; "rest" is the remainder (embedding, norms, residual adds, LM head, the engine)."""
    from lens_heads.evaluation.evaluate import evaluate_task

    spent = {"attention (projections and kernel)": 0.0, "MLP": 0.0}
    started: dict[str, float] = {}
    handles = []
    for block in model.bridge.blocks:
        for attr, key in (("attn", "attention (projections and kernel)"), ("mlp", "MLP")):
            mod = getattr(block, attr)
            handles.append(mod.register_forward_pre_hook(lambda m, a, key=key: started.__setitem__(key, time.perf_counter())))
            handles.append(mod.register_forward_hook(
                lambda m, a, o, key=key: spent.__setitem__(key, spent[key] + time.perf_counter() - started[key])))
    try:
        t0 = time.perf_counter()
        evaluate_task(model, task, limit=limit, n_shot=n_shot, progress=False, batch_size=batch_size)
        wall = time.perf_counter() - t0
    finally:
        for h in handles:
            h.remove()
    spent["rest"] = wall - sum(spent.values())
    return {k: v / wall for k, v in spent.items()} | {"wall": wall}


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default="smollm2-135m")
    ap.add_argument("--dtype", default="bfloat16")
    ap.add_argument("--piqa", type=int, default=80)
    ap.add_argument("--mmlu", type=int, default=10)
    ap.add_argument("--batch-size", type=int, default=16)
    ap.add_argument("--out", default=None)
    args = ap.parse_args()

    import torch

    from lens_heads import load_model
    from lens_heads.files.atomic import atomic_write_text
    from lens_heads.data import load_task

    out = Path(args.out or ROOT / "benchmarks" / "results" / f"profile_evaluate_{args.dtype}.md")
    model = load_model(args.model, dtype=args.dtype)
    runs = [("PIQA 0-shot", load_task("piqa"), args.piqa, 0), ("MMLU 5-shot", load_task("mmlu"), args.mmlu, 5)]
    results = {name: profile_task(model, task, n, k, args.batch_size) for name, task, n, k in runs}
    split = {name: module_split(model, task, n, k, args.batch_size) for name, task, n, k in runs}
    classes = sorted({c for _, by, _ in results.values() for c in by},
                     key=lambda c: -sum(by.get(c, 0.0) for _, by, _ in results.values()))
    lines = [f"# profile_evaluate ({args.model}, {args.dtype}, batch {args.batch_size}, torch threads "
             f"{torch.get_num_threads()}, load avg {os.getloadavg()[0]:.1f})", "",
             f"`python benchmarks/profile_evaluate.py --dtype {args.dtype}`: evaluate_task's self CPU time by "
             "class of aten operator (matmuls with a vocabulary-sized dimension are the LM head), as shares of "
             "the profiled time.", "",
             "| class | " + " | ".join(f"{name} ({n} q)" for name, _, n, _ in runs) + " |",
             "|---|" + "---|" * len(runs)]
    for c in classes:
        lines.append(f"| {c} | " + " | ".join(
            f"{100 * by.get(c, 0.0) / sum(by.values()):.1f} %" for _, by, _ in results.values()) + " |")
    lines.append("| wall time without the profiler | " + " | ".join(f"{w:.2f} s" for w, _, _ in results.values()) + " |")
    lines += ["", "Wall time by module, from forward hooks on each block's attention and MLP components, without "
              "the profiler (read this split first: the profiler's self times below put much of the matmul and "
              "attention kernels' time on the elementwise operators that follow them -- measured with fp32 MMLU: "
              "the MLP component 293 ms per layer in all, where the profiler gives its SiLU and product 280 ms "
              "each):", "", "| module | " + " | ".join(name for name, _, _, _ in runs) + " |",
              "|---|" + "---|" * len(runs)]
    for key in ("attention (projections and kernel)", "MLP", "rest"):
        lines.append(f"| {key} | " + " | ".join(f"{100 * sp[key]:.1f} %" for sp in split.values()) + " |")
    lines.append("| wall time | " + " | ".join(f"{sp['wall']:.2f} s" for sp in split.values()) + " |")
    ops = sorted({o for _, _, by in results.values() for o in by},
                 key=lambda o: -max(by.get(o, 0.0) / sum(by.values()) for _, _, by in results.values()))[:15]
    lines += ["", "The operators with the largest self time (share of the profiled time, either task's top 15):", "",
              "| operator | " + " | ".join(name for name, _, _, _ in runs) + " |", "|---|" + "---|" * len(runs)]
    for o in ops:
        lines.append(f"| `{o}` | " + " | ".join(
            f"{100 * by.get(o, 0.0) / sum(by.values()):.1f} %" for _, _, by in results.values()) + " |")
    atomic_write_text(out, "\n".join(lines) + "\n", make_parents=True)
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
