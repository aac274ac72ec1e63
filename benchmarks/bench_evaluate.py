"""Benchmark: lens_heads' evaluation engine vs lm-evaluation-harness's HF backend on SmolLM2.

Same questions, same weights (fp32 unless --dtype), one process, timed back to back (this
machine is shared: compare the ratios measured in one run, not absolute times).

    python benchmarks/bench_evaluate.py                  # 100 MMLU 5-shot (prompts <= 1024 tokens), 200 PIQA
    python benchmarks/bench_evaluate.py --mmlu 40 --piqa 80 --subjects 4
    python benchmarks/bench_evaluate.py --dtype bfloat16 --mmlu 40 --piqa 80 --batch-size 16 --lm-eval-by-subject

Reports the matmul roof (fp32 and bf16 GEMMs at the model's block shapes, measured in the same
run) and, for each task: the positions each side computes, lens_heads' positions/s as a share of
the roof, wall time of lm-eval (HFLM.loglikelihood on the same requests, the model in SDPA attention as lm-eval loads one,
batch size 16, its logits cache on) and of lens_heads (evaluate_task), whether the
per-question predictions are identical, the max |Δ log-likelihood|; and the cost of MMLU
5-shot relative to 0-shot in lens_heads, on a stratified sample (few questions per
subject) and on ``--subjects`` subjects with many questions each (how a full MMLU run looks:
~246 questions per subject). lens_heads runs under each attention backend (docs/methods.md §10):
``auto`` (the fused kernel) and ``eager`` (TransformerLens' attention), timed back to back, with
their predictions compared; and one per-input sweep point (``score:ahon_ln`` at its 10 %
threshold) on MMLU 5-shot, fused and eager, against the unablated fused evaluation without
prefix reuse (what a per-input point must compute), and eager once more in a process of its own
with glibc's malloc defaults and batches of the batch size (the point as it ran before the fused
path, the malloc tuning and even batches). lm-eval is timed in this process (sharing lens_heads' malloc tuning) and in one of its own; with
``--lm-eval-by-subject`` it is also compared on the ``--subjects`` x ``--per-subject`` sample.
And what torch's kernels allow (``kernel_bound``): the block linears at the roof plus each
call of the attention kernel, the LM head and the scored log-softmax that lens_heads made,
replayed alone -- the fastest any engine computing the same positions with these kernels
could run, so the most of the roof it could reach.
Writes benchmarks/results/bench_evaluate.md.
"""

from __future__ import annotations

import argparse
import os
import random
import sys
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")

import torch  # noqa: E402


def lm_eval_lls(lm, reqs):
    from lm_eval.api.instance import Instance

    inst = [Instance("loglikelihood", {}, r, i) for i, r in enumerate(reqs)]
    return [ll for ll, _ in lm.loglikelihood(inst, disable_tqdm=True)]


# lm-eval in a process of its own, as a user runs it: glibc's malloc untouched (lens_heads tunes
# it process-wide when it loads a model on the CPU, docs/methods.md §10, which lm-eval in this
# process then shares); the same weights, dtype, SDPA attention, batch size and requests
OWN_PROCESS = r"""
import json, sys, time
from lens_heads import load_model
from lens_heads.models import allocator
sys.path.insert(0, sys.argv[5])
from bench_evaluate import lm_eval_lls
from lm_eval.models.huggingface import HFLM
model = load_model(sys.argv[1], dtype=sys.argv[2])
assert not allocator.keep_freed_memory()
hf = model.load_hf_model()
hf.set_attn_implementation("sdpa")
lm = HFLM(pretrained=hf, tokenizer=model.tokenizer, batch_size=int(sys.argv[3]))
reqs = [tuple(r) for r in json.load(open(sys.argv[4]))]
lm_eval_lls(lm, reqs[:4])  # warm-up, as the in-process runs had
t0 = time.perf_counter()
lls = lm_eval_lls(lm, reqs)
print(json.dumps({"s": time.perf_counter() - t0, "lls": lls}))
"""


# one evaluation by lens_heads in a process of its own with glibc's malloc untouched: the per-input
# point as the issue that asked for the fused path found it (before the malloc tuning)
POINT_OWN_PROCESS = r"""
import json, sys, time
from lens_heads import batching, load_model
from lens_heads.models import allocator
from lens_heads.interventions.ablation import parse_ablation
from lens_heads.data import load_task
from lens_heads.evaluation.evaluate import evaluate_task
model = load_model(sys.argv[1], dtype=sys.argv[2])
assert not allocator.keep_freed_memory()
batching.MIN_BATCH_TOKENS = None  # batches of the batch size, as before even_batch
model.attention = sys.argv[4]
ids = json.load(open(sys.argv[6]))
task, abl = load_task("mmlu"), parse_ablation(sys.argv[5], model.geometry)
run = lambda doc_ids: evaluate_task(model, task, n_shot=5, doc_ids=doc_ids, batch_size=int(sys.argv[3]),
                                    ablation=abl, progress=False)
run(ids[:4])  # warm-up, as the in-process runs had
t0 = time.perf_counter()
res = run(ids)
print(json.dumps({"s": time.perf_counter() - t0, "preds": [q.pred for q in res.questions]}))
"""


def own_process(script: str, payload, *args: str) -> dict:
    """The JSON a ``script`` prints last, run in a fresh process with glibc's malloc defaults
    (``LENS_HEADS_KEEP_FREED_MEMORY=0``); ``payload`` goes in a JSON file, its path after ``args``,
    then this folder (for imports)."""
    import json
    import subprocess
    import tempfile

    with tempfile.NamedTemporaryFile("w", suffix=".json", delete=False) as f:
        json.dump(payload, f)
    try:
        env = dict(os.environ, LENS_HEADS_KEEP_FREED_MEMORY="0")
        res = subprocess.run([sys.executable, "-c", script, *args, f.name, str(Path(__file__).parent)], env=env,
                             capture_output=True, text=True)
    finally:
        os.unlink(f.name)
    if res.returncode != 0:
        raise SystemExit(res.stderr[-3000:])
    return json.loads(res.stdout.strip().splitlines()[-1])


def lm_eval_own_process(model_name: str, dtype: str, batch_size: int, reqs) -> tuple[float, list[float]]:
    """Seconds and log-likelihoods of lm-eval's HFLM on ``reqs`` in a fresh process with glibc's defaults."""
    out = own_process(OWN_PROCESS, [list(r) for r in reqs], model_name, dtype, str(batch_size))
    return out["s"], out["lls"]


class PositionCounter:
    """Counts the positions each model computes: a forward hook on its input embedding adds the
    ids' numel (padding included: it is computed; a K/V-reusing call counts its new positions only)."""

    def __init__(self, hf_model):
        self.n = 0
        self.handle = hf_model.get_input_embeddings().register_forward_hook(self._hook)

    def _hook(self, module, args, output):
        self.n += args[0].numel()

    def take(self) -> int:
        n, self.n = self.n, 0
        return n


def linear_shapes(hf_model) -> list[tuple[int, int]]:
    """(in, out) of every linear layer of the decoder blocks (the LM head excluded: lens_heads
    computes logits at the scored positions only)."""
    blocks = [m for name, m in hf_model.named_modules() if name.endswith("layers")][0]
    return [(m.in_features, m.out_features) for b in blocks for m in b.modules() if isinstance(m, torch.nn.Linear)]


def gemm_roof(shapes, dtype, rows: int = 512, repeats: int = 5) -> float:
    """Tokens/s if a forward were nothing but its block matmuls: ``rows`` tokens through every
    (in, out) linear shape in ``dtype``, the best of ``repeats`` timings (the matmul roof at the
    model's own shapes; attention's score/value products and the LM head are not in it)."""
    xs = {i: torch.randn(rows, i, dtype=dtype) for i in {i for i, _ in shapes}}
    ws = [torch.randn(o, i, dtype=dtype) for i, o in shapes]
    for i, w in zip((i for i, _ in shapes), ws):  # warm-up
        torch.nn.functional.linear(xs[i], w)
    best = float("inf")
    for _ in range(repeats):
        t0 = time.perf_counter()
        for (i, _), w in zip(shapes, ws):
            torch.nn.functional.linear(xs[i], w)
        best = min(best, time.perf_counter() - t0)
    return rows / best


def matmul_flops(fn) -> tuple[int, int]:
    """(all, attention) matmul FLOPs of ``fn()``, counted by torch's FlopCounterMode: the linears
    and LM head (mm, addmm), eager attention's products (bmm), and the fused kernel's products
    over the query-key pairs it computes (causal: the lower triangle; with a mask: all of them)."""
    from torch.utils.flop_counter import FlopCounterMode

    aten = torch.ops.aten

    def fused(q, k, v, dropout_p=0.0, is_causal=False, *args, out_shape=None, **kwargs) -> int:
        b, h, tq, d = q
        tk = k[-2]
        pairs = tq * (tk - tq) + tq * (tq + 1) // 2 if is_causal else tq * tk
        return 4 * b * h * d * pairs  # QK^T and AV: 2 d FLOPs each per pair and query head

    with FlopCounterMode(display=False, custom_mapping={aten._scaled_dot_product_flash_attention_for_cpu: fused}) as fc:
        fn()
    counts = fc.get_flop_counts()["Global"]
    attn = sum(n for op, n in counts.items() if op in (aten._scaled_dot_product_flash_attention_for_cpu,
                                                       aten.bmm, aten.baddbmm))
    return fc.get_total_flops(), attn


KERNEL_KINDS = ("attention kernel", "LM head", "log-softmax")


def _kind(func, args, vocab: int) -> str | None:
    """Which of the kernels an evaluation cannot do without ``func`` is, if any (under inference
    mode a dispatch mode sees the composite ops -- ``linear``, ``scaled_dot_product_attention``;
    elsewhere what they decompose to)."""
    aten = torch.ops.aten
    if func in (aten.scaled_dot_product_attention.default, aten._scaled_dot_product_flash_attention_for_cpu.default,
                aten._scaled_dot_product_flash_attention.default, aten._scaled_dot_product_efficient_attention.default):
        return "attention kernel"
    if func in (aten.matmul.default, aten.softmax.int, aten._softmax.default) and args[0].dim() == 4:
        return "attention kernel"  # eager attention (short inputs on a CPU: attention.AUTO_MIN_KEYS)
    if (func is aten.linear.default and args[1].shape[0] == vocab) or (
            func in (aten.mm.default, aten.addmm.default) and args[-1].shape[-1] == vocab):
        return "LM head"
    if func in (aten.log_softmax.int, aten._log_softmax.default) and args[0].shape[-1] == vocab:
        return "log-softmax"
    return None


def kernel_bound(fn, vocab: int, repeats: int = 5) -> dict[str, float]:
    """Seconds the kernels an evaluation cannot do without take at the calls ``fn()`` makes:
    torch's fused attention kernel, the LM head's matmul and the log-softmax of the scored
    logits. Each call is recorded in an untimed run -- the layout (shape, strides, dtype, device)
    of its floating-point inputs, its flags, and its boolean masks and other small or integer
    tensors as such (a large additive mask is random like the rest: its values do not change the
    kernel's time) -- then replayed alone on random inputs of that layout, the best of ``repeats``.
    Calls alike (the same layout and flags, masks of the same shape and count of True: a
    forward's layers) are replayed once and counted as often as they were made. (The scored
    log-softmax is taken a row's continuation at a time; one call over all rows measured slower,
    its [rows, vocab] float32 output leaving the caches.) With the block linears at
    the roof, the sum is the fastest an engine built on these kernels could evaluate these
    requests (elementwise work, norms, copies and Python all free)."""
    from torch.utils._python_dispatch import TorchDispatchMode

    calls: dict[tuple, list] = {}  # signature -> [kind, func, args, kwargs, count]

    def layout(x):
        if isinstance(x, torch.Tensor) and x.is_floating_point() and x.numel() > 4096:
            return ("random", tuple(x.shape), tuple(x.stride()), x.dtype, x.device)
        return x

    def signature(x):
        if isinstance(x, torch.Tensor):
            return (tuple(x.shape), x.dtype, int(x.sum()) if x.dtype == torch.bool else float(x.float().sum()))
        return tuple(x) if isinstance(x, list) else x

    class Record(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            kwargs = kwargs or {}
            kind = _kind(func, args, vocab)
            if kind is not None:
                a, kw = [layout(x) for x in args], {k: layout(v) for k, v in kwargs.items()}
                sig = (func, tuple(signature(x) for x in a), tuple((k, signature(v)) for k, v in kw.items()))
                if sig in calls:
                    calls[sig][4] += 1
                else:
                    calls[sig] = [kind, func, [x.clone() if isinstance(x, torch.Tensor) else x for x in a],
                                  {k: v.clone() if isinstance(v, torch.Tensor) else v for k, v in kw.items()}, 1]
            return func(*args, **kwargs)

    with Record():
        fn()

    def make(x):
        if isinstance(x, tuple) and x and x[0] == "random":
            _, shape, stride, dtype, device = x
            size = 1 + sum((n - 1) * st for n, st in zip(shape, stride))
            return torch.randn(size, dtype=dtype, device=device).as_strided(shape, stride)
        return x

    def best_of(f, device) -> float:
        sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
        f()  # warm
        best = float("inf")
        for _ in range(repeats):
            sync()
            t0 = time.perf_counter()
            f()
            sync()
            best = min(best, time.perf_counter() - t0)
        return best

    spent = dict.fromkeys(KERNEL_KINDS, 0.0)
    with torch.inference_mode():
        for kind, func, args, kwargs, count in calls.values():
            a, kw = [make(x) for x in args], {k: make(v) for k, v in kwargs.items()}
            device = next(x.device for x in a if isinstance(x, torch.Tensor))
            spent[kind] += count * best_of(lambda: func(*a, **kw), device)
    return spent


def per_input_point(model, model_name: str, task, recs, batch_size, lines, max_tokens: int) -> None:
    """One per-input sweep point (``score:ahon_ln`` at the threshold that zeroes 10 % of the
    heads over these questions' 5-shot inputs) fused and eager, against the unablated fused
    evaluation without prefix reuse (a per-input point cannot reuse one); and eager once more in a
    process of its own with glibc's malloc defaults and batches of the batch size, as the point ran
    before the fused path, the malloc tuning and even batches."""
    from lens_heads.interventions.ablation import parse_ablation
    from lens_heads.evaluation.evaluate import evaluate_task
    from lens_heads.forward.task_requests import task_inputs
    from lens_heads.interventions.thresholds import compute_thresholds

    ids = [r.doc_id for r in recs]
    # the threshold from a stratified sample of the same size (as a sweep takes it from its own run's inputs)
    inputs = [x for x in task_inputs(model, task, 5, limit=len(recs)) if len(x) <= max_tokens]
    tau = compute_thresholds(model, inputs, ["ahon_ln"], [0.1], progress=False)["ahon_ln"][0.1]
    spec = f"score:ahon_ln@{tau!r}"
    times, results = {}, {}
    for name, attn, abl, reuse in (("unablated, fused, no prefix reuse", "auto", None, False),
                                   ("score:ahon_ln@10 %, fused", "auto", spec, True),
                                   ("score:ahon_ln@10 %, eager", "eager", spec, True)):
        model.attention = attn
        t0 = time.perf_counter()
        results[name] = evaluate_task(model, task, n_shot=5, doc_ids=ids, batch_size=batch_size, progress=False,
                                      ablation=None if abl is None else parse_ablation(abl, model.geometry),
                                      reuse_prefix=reuse)
        times[name] = time.perf_counter() - t0
    model.attention = "auto"
    before = "score:ahon_ln@10 %, eager, own process, glibc's malloc defaults, fixed batches"
    dtype = str(model.dtype).removeprefix("torch.")
    old = own_process(POINT_OWN_PROCESS, ids, model_name, dtype, str(batch_size), "eager", spec)
    times[before] = old["s"]
    (base, t_base), (fused, t_fused), (eager, t_eager) = ((k, times[k]) for k in list(times)[:3])
    same = sum(a.pred == b.pred for a, b in zip(results[fused].questions, results[eager].questions))
    same_before = sum(a.pred == p for a, p in zip(results[fused].questions, old["preds"]))
    lines += ["", f"Per-input sweep point on MMLU 5-shot ({len(recs)} questions; {spec}, zeroing "
              f"{100 * results[fused].zeroed_fraction:.1f} % of heads):", "",
              "| run | s | vs unablated fused |", "|---|---|---|"]
    lines += [f"| {k} | {t:.1f} | {t / t_base:.2f}x |" for k, t in times.items()]
    lines += ["", f"Fused per-input point {t_eager / t_fused:.2f}x faster than eager in this process; "
              f"{times[before] / t_fused:.2f}x faster than eager in a process of its own with glibc's malloc "
              f"defaults and batches of the batch size (the point as it ran before the fused path, the malloc tuning "
              f"and even batches); identical predictions "
              f"{same}/{len(recs)} and {same_before}/{len(recs)}."]
    print("\n".join(lines[-9:]), flush=True)


def argmax(xs):
    return max(range(len(xs)), key=lambda j: (xs[j], -j))


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default="smollm2-135m")
    ap.add_argument("--dtype", default="float32")
    ap.add_argument("--mmlu", type=int, default=100)
    ap.add_argument("--piqa", type=int, default=200)
    ap.add_argument("--winogrande", type=int, default=40, help="WinoGrande 5-shot questions (0: skip)")
    ap.add_argument("--subjects", type=int, default=3, help="subjects for the many-questions 5-shot/0-shot ratio")
    ap.add_argument("--per-subject", type=int, default=30)
    ap.add_argument("--lm-eval-by-subject", action="store_true",
                    help="also compare with lm-eval on --subjects x --per-subject MMLU 5-shot questions (the shape "
                         "of a whole MMLU run, where the questions of a subject share their 5 shots)")
    ap.add_argument("--batch-size", type=int, default=4)
    ap.add_argument("--max-prompt-tokens", type=int, default=1024, help="MMLU: skip longer 5-shot prompts")
    ap.add_argument("--out", default=str(Path(__file__).parent / "results" / "bench_evaluate.md"))
    args = ap.parse_args()

    from lm_eval.models.huggingface import HFLM

    from lens_heads import load_model
    from lens_heads.data import load_task
    from lens_heads.files.atomic import atomic_write_text
    from lens_heads.forward.task_requests import select_records
    from lens_heads.evaluation.evaluate import evaluate_task

    model = load_model(args.model, dtype=args.dtype)
    theirs_hf = model.load_hf_model()  # loaded eager (lens_heads' bridge needs it); lm-eval's own
    theirs_hf.set_attn_implementation("sdpa")  # load of a model name runs transformers' default, SDPA
    lm = HFLM(pretrained=theirs_hf, tokenizer=model.tokenizer, batch_size=args.batch_size)
    lines = [f"# bench_evaluate ({args.model}, {args.dtype}, batch {args.batch_size}, "
             f"torch threads {torch.get_num_threads()}, load avg {os.getloadavg()[0]:.1f})", ""]
    from lens_heads.evaluation.lm_eval_model import LensHeadsLM

    ours_lm = LensHeadsLM(model, batch_size=args.batch_size, progress=False)  # lens_heads under lm-eval's API
    shapes = linear_shapes(model.hf_model)
    roofs = {d: gemm_roof(shapes, getattr(torch, d)) for d in ("float32", "bfloat16")}
    roof = roofs[str(model.dtype).removeprefix("torch.")]
    roof_flops = roof * 2 * sum(i * o for i, o in shapes)  # FLOP/s of the block GEMMs at the roof
    theirs_count, ours_count = PositionCounter(lm.model), PositionCounter(model.hf_model)
    lines += [f"Matmul roof at the model's block shapes ({len(shapes)} linears, 512 rows, best of 5, measured in "
              f"this run): fp32 {roofs['float32']:.0f} tokens/s, bf16 {roofs['bfloat16']:.0f} tokens/s "
              f"(bf16/fp32 {roofs['bfloat16'] / roofs['float32']:.2f}x); this run's dtype: {model.dtype}, its roof "
              f"{roof_flops / 1e9:.0f} GFLOP/s.", ""]
    lines += ["| task | n | lm-eval s | lens_heads s | speed-up | lm-eval in its own process s | speed-up | LensHeadsLM s | its speed-up | identical preds "
              "(evaluate / LensHeadsLM) | max abs dll | lens_heads unpacked s (positions, identical preds) | positions computed (lm-eval / lens_heads) | "
              "lens_heads positions/s | of the roof | eager attention s | fused / eager speed-up | "
              "eager of the roof | identical preds fused / eager | lens_heads matmul GFLOP (attention) | of the FLOP roof |",
              "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"]

    def compare(name, task, recs, k):
        reqs, spans = [], []
        for r in recs:
            b = task.build(r, k)
            spans.append((len(reqs), len(reqs) + len(b)))
            reqs.extend(b)
        theirs_count.take()
        t0 = time.perf_counter()
        theirs = lm_eval_lls(lm, reqs)
        t_lm = time.perf_counter() - t0
        n_theirs = theirs_count.take()
        t_own, own_lls = lm_eval_own_process(args.model, args.dtype, args.batch_size, reqs)
        assert max(abs(a - b) for a, b in zip(own_lls, theirs)) <= 1e-3, "lm-eval's two runs disagree"
        ours_count.take()
        t0 = time.perf_counter()
        res = evaluate_task(model, task, n_shot=k, doc_ids=[r.doc_id for r in recs],
                            batch_size=args.batch_size, progress=False)
        t_us = time.perf_counter() - t0
        n_ours = ours_count.take()
        flops, attn_flops = matmul_flops(lambda: evaluate_task(  # untimed: the counter slows every op
            model, task, n_shot=k, doc_ids=[r.doc_id for r in recs], batch_size=args.batch_size, progress=False))
        spent = kernel_bound(lambda: evaluate_task(  # untimed
            model, task, n_shot=k, doc_ids=[r.doc_id for r in recs], batch_size=args.batch_size, progress=False), vocab)
        ours_count.take()
        t0 = time.perf_counter()
        unpacked = evaluate_task(model, task, n_shot=k, doc_ids=[r.doc_id for r in recs],
                                 batch_size=args.batch_size, progress=False, pack=False)
        t_unpacked = time.perf_counter() - t0
        n_unpacked = ours_count.take()
        same_unpacked = sum(a.pred == b.pred for a, b in zip(unpacked.questions, res.questions))
        t0 = time.perf_counter()
        via_lm = lm_eval_lls(ours_lm, reqs)
        t_ours_lm = time.perf_counter() - t0
        model.attention = "eager"
        t0 = time.perf_counter()
        eager = evaluate_task(model, task, n_shot=k, doc_ids=[r.doc_id for r in recs],
                              batch_size=args.batch_size, progress=False)
        t_eager = time.perf_counter() - t0
        model.attention = "auto"
        same_eager = sum(a.pred == b.pred for a, b in zip(res.questions, eager.questions))
        same = sum(argmax(theirs[a:b]) == q.pred for q, (a, b) in zip(res.questions, spans))
        same_lm = sum(argmax(theirs[a:b]) == argmax(via_lm[a:b]) for a, b in spans)
        dll = max(abs(x - y) for q, (a, b) in zip(res.questions, spans) for x, y in zip(q.lls, theirs[a:b]))
        dll = max(dll, max(abs(x - y) for x, y in zip(via_lm, theirs)))
        row = (f"| {name} | {len(recs)} | {t_lm:.1f} | {t_us:.1f} | {t_lm / t_us:.2f}x | {t_own:.1f} | "
               f"{t_own / t_us:.2f}x | {t_ours_lm:.1f} | "
               f"{t_lm / t_ours_lm:.2f}x | {same}/{len(recs)} / {same_lm}/{len(recs)} | {dll:.2e} | "
               f"{t_unpacked:.1f} ({n_unpacked}, {same_unpacked}/{len(recs)}) | {n_theirs} / {n_ours} | {n_ours / t_us:.0f} | {100 * n_ours / t_us / roof:.0f} % | "
               f"{t_eager:.1f} | {t_eager / t_us:.2f}x | {100 * n_ours / t_eager / roof:.0f} % | "
               f"{same_eager}/{len(recs)} | {flops / 1e9:.0f} ({100 * attn_flops / flops:.0f} %) | "
               f"{100 * flops / t_us / roof_flops:.0f} % |")
        print(row, flush=True)
        lines.append(row)
        t_linears = n_ours / roof
        bound = t_linears + sum(spent.values())
        brow = (f"| {name} | {t_linears:.2f} | " + " | ".join(f"{spent[kind]:.2f}" for kind in KERNEL_KINDS)
                + f" | {bound:.2f} | {t_us:.2f} | {100 * t_linears / bound:.0f} % | "
                  f"{100 * flops / roof_flops / bound:.0f} % | {100 * bound / t_us:.0f} % |")
        print(brow, flush=True)
        bound_lines.append(brow)
        return t_us

    vocab = model.hf_model.get_output_embeddings().weight.shape[0]
    bound_lines = [
        "", "What torch's kernels allow: the block linears at the roof, plus the kernels the evaluation cannot do "
        "without (`kernel_bound`: each call of torch's attention kernel, the LM head's matmul and the log-softmax "
        "of the scored logits that lens_heads made, replayed alone in this run on random inputs of the same layout). "
        "Their sum is the fastest any engine computing these positions with these kernels could run, with "
        "elementwise work, norms, copies and Python free; its share of the roof is the most such an engine reaches.",
        "",
        "| task | block linears at the roof s | " + " | ".join(f"{kind} s" for kind in KERNEL_KINDS)
        + " | bound s | lens_heads s | bound's share of the roof | bound's share of the FLOP roof | "
          "lens_heads at the bound's speed |",
        "|---|---|---|---|---|---|---|---|---|---|"]
    mmlu, piqa = load_task("mmlu"), load_task("piqa")
    # stratified, kept to 5-shot prompts of <= --max-prompt-tokens (lm-eval's eager attention on the
    # ~4k-token history/law prompts takes ~5 min per batch here)
    pool = select_records(mmlu, 3 * args.mmlu, seed=1234)
    short = [r for r in pool if len(model.tokenizer(mmlu.build(r, 5)[0][0])["input_ids"]) <= args.max_prompt_tokens]
    mmlu_recs = sorted(random.Random(0).sample(short, min(args.mmlu, len(short))), key=lambda r: r.doc_id)
    by_subject: dict[str, list] = {}
    for r in mmlu.records:
        by_subject.setdefault(r.subject, []).append(r)
    picked = [s for s in sorted(by_subject) if len(by_subject[s]) >= args.per_subject][: args.subjects]
    subject_recs = [r for s in picked for r in by_subject[s][: args.per_subject]]
    compare(f"MMLU 5-shot (stratified, {len({r.subject for r in mmlu_recs})} subjects)", mmlu, mmlu_recs, 5)
    if args.lm_eval_by_subject:  # as a whole MMLU run is made: ~250 questions per subject share its 5 shots
        compare(f"MMLU 5-shot ({len(picked)} subjects x {args.per_subject})", mmlu, subject_recs, 5)
    compare("PIQA 0-shot", piqa, piqa.records[:args.piqa], 0)
    if args.winogrande:
        wino = load_task("winogrande")
        compare("WinoGrande 5-shot", wino, wino.records[:args.winogrande], 5)
    lines += bound_lines
    per_input_point(model, args.model, mmlu, mmlu_recs, args.batch_size, lines, args.max_prompt_tokens)

    # 5-shot vs 0-shot cost in lens_heads
    lines += ["", "| MMLU sample | n | 0-shot s | 5-shot s | 5-shot / 0-shot |", "|---|---|---|---|---|"]

    def ratio(name, recs):
        ids = [r.doc_id for r in recs]
        t = []
        for k in (0, 5):
            t0 = time.perf_counter()
            evaluate_task(model, mmlu, n_shot=k, doc_ids=ids, batch_size=args.batch_size, progress=False)
            t.append(time.perf_counter() - t0)
        row = f"| {name} | {len(recs)} | {t[0]:.1f} | {t[1]:.1f} | {t[1] / t[0]:.2f}x |"
        print(row, flush=True)
        lines.append(row)

    ratio(f"stratified ({len({r.subject for r in mmlu_recs})} subjects)", mmlu_recs)
    ratio(f"{len(picked)} subjects x {args.per_subject} ({', '.join(picked)})", subject_recs)
    lines += ["", "lm-eval: HFLM.loglikelihood on the same requests (its one-token-continuation logits cache on; "
              "the model with transformers' default SDPA attention, as lm-eval loads one by name), in this process, "
              "so with the malloc tuning lens_heads applies on the CPU (docs/methods.md §10); in its own process: "
              "the same, in a fresh process with glibc's defaults, as lm-eval runs on its own; "
              "lens_heads: evaluate_task (distinct inputs once, last-position logits, shared-prefix K/V reuse, "
              "packing: docs/methods.md §4); unpacked: the same with packing off (pack=False); "
              "LensHeadsLM: the same engine behind lm-eval's LM.loglikelihood on the same requests. "
              "Positions computed: ids through each model's input embedding (padding included); "
              "of the roof: lens_heads' positions/s over the matmul roof in this run's dtype (a position's block linears "
              "only: attention's products and the LM head are work it does not count). Matmul GFLOP: every matmul "
              "lens_heads' evaluation computes (block linears, LM head at the scored positions, attention products "
              "over the query-key pairs computed), counted by torch's FlopCounterMode in an untimed repeat; of the "
              "FLOP roof: those FLOPs per second of lens_heads' time over the block GEMMs' FLOP/s at the roof."]
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    atomic_write_text(args.out, "\n".join(lines) + "\n")
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
