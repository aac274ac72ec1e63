"""Collapsed heads (arXiv 2603.09616): diagnosis of the zoo models, surgical repair on SmolLM2,
and a small BLOOM-architecture (ALiBi) model trained from scratch, diagnosed beside its slopes.

    HF_HUB_OFFLINE=1 HF_DATASETS_OFFLINE=1 python analyses/collapse_repair.py \\
        --models smollm2-135m,qwen2.5-coder-0.5b,gemma-3-270m --repair-model smollm2-135m \\
        --steps 60 --bloom-steps 600 --out analyses/results/collapse_repair

1. Diagnosis (``lens_heads.surgery.diagnose.diagnose``) of every --models model on --diag-n C4
   validation documents (<= --diag-len tokens): class counts (dead / BOS-sink / low-entropy /
   local / healthy), the band, and the per-head table.
2. Repair (``lens_heads.surgery.repair``) of --repair-model, once per target rule:
   ``sinks``       the DEAD + BOS-sink heads (the paper's targets);
   ``low_output``  heads selected by output norm, --low-output-select (default ``ahon_ln<0.6``).
   Training on C4 *train* documents; perplexity on C4 *validation* documents that are used
   neither for training nor for the diagnosis (documents diag_n .. diag_n + n_eval - 1).
   Before / after re-initialisation / after training, and healthy counts before and after.
3. BLOOM from scratch (``transformers.BloomConfig``: --bloom-layers x --bloom-heads, width
   --bloom-d, a byte-level BPE tokenizer of --bloom-vocab trained here on the same C4 train
   text), trained --bloom-steps steps, then diagnosed with each head's ALiBi slope beside its
   class. Whether a sink formed is reported as measured (a 5-minute run here formed none).

Heavy outputs (repaired models, checkpoints, the trained BLOOM) go to OUT/work/ (git-ignored);
every stage resumes: the repair from its checkpoints / report, BLOOM from its saved folder.
Outputs (OUT): diagnosis_counts.csv, diagnosis/<model>.csv, repair.csv, bloom_heads.csv,
bloom_slopes.csv, bloom_training.csv, summary.md.
"""

from __future__ import annotations

import gc
import json
import math
import sys
import time
from dataclasses import asdict
from pathlib import Path

import numpy as np
import pandas as pd
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))

from common import Run, base_parser, check_positive, markdown_table, model_label, out_folder, script_main, \
    split_list, write_csv  # noqa: E402

from lens_heads.models import load_model  # noqa: E402
from lens_heads.models import check_device  # noqa: E402
from lens_heads.files.atomic import atomic_write_text  # noqa: E402
from lens_heads.data import load_texts, tokenize_texts  # noqa: E402
from lens_heads.surgery.diagnose import CLASSES, diagnose, format_band  # noqa: E402
from lens_heads.errors import LensHeadsError  # noqa: E402
from lens_heads.surgery import (RepairConfig, RepairReport, TargetSelector, TrainConfig, export_model,  # noqa: E402
                                parse_select, repair)

REPAIRS = ("sinks", "low_output")


def parse_args(argv):
    p = base_parser(__doc__, "analyses/results/collapse_repair")
    p.add_argument("--parts", default="diagnose,repair,bloom", help="which parts to run (default all three)")
    p.add_argument("--diag-data", default="c4", help="diagnosis / held-out corpus (default c4 validation)")
    p.add_argument("--diag-n", type=int, default=32)
    p.add_argument("--diag-len", type=int, default=256)
    # repair
    p.add_argument("--repair-model", default="smollm2-135m")
    p.add_argument("--repairs", default=",".join(REPAIRS), help="target rules: sinks, low_output")
    p.add_argument("--low-output-select", default="ahon_ln<0.6")
    p.add_argument("--train-data", default="c4-train")
    p.add_argument("--n-train-docs", type=int, default=200)
    p.add_argument("--n-eval", type=int, default=16, help="held-out C4 validation documents for perplexity")
    p.add_argument("--eval-len", type=int, default=256)
    p.add_argument("--steps", type=int, default=60, help="optimisation steps per pass")
    p.add_argument("--passes", type=int, default=1)
    p.add_argument("--chunk-len", type=int, default=256)
    p.add_argument("--grad-accum", type=int, default=8)
    p.add_argument("--lr", type=float, default=5e-5)
    p.add_argument("--gqa-policy", default="q_only", choices=["q_only", "group"])
    # BLOOM from scratch
    p.add_argument("--bloom-layers", type=int, default=4)
    p.add_argument("--bloom-heads", type=int, default=8)
    p.add_argument("--bloom-d", type=int, default=256)
    p.add_argument("--bloom-vocab", type=int, default=4096)
    p.add_argument("--bloom-train-docs", type=int, default=1000)
    p.add_argument("--bloom-seq", type=int, default=128)
    p.add_argument("--bloom-batch", type=int, default=16)
    p.add_argument("--bloom-steps", type=int, default=600)
    p.add_argument("--bloom-lr", type=float, default=1e-3)
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args(argv)
    args.device = check_device(args.device)  # before any folder is made
    check_positive(args, "diag_n", "diag_len", "n_train_docs", "n_eval", "eval_len", "steps", "passes", "chunk_len",
                   "grad_accum", "bloom_layers", "bloom_heads", "bloom_d", "bloom_vocab", "bloom_train_docs",
                   "bloom_seq", "bloom_batch", "bloom_steps", "batch_size")
    args.models = split_list(args.models, "models")
    args.parts = split_list(args.parts, "parts")
    args.repairs = split_list(args.repairs, "repairs")
    for name, allowed in (("parts", ("diagnose", "repair", "bloom")), ("repairs", REPAIRS)):
        bad = [x for x in getattr(args, name) if x not in allowed]
        if bad:
            raise LensHeadsError(f"--{name}: unknown {', '.join(bad)}; choose from {', '.join(allowed)}")
    parse_select(args.low_output_select)
    if args.bloom_d % args.bloom_heads:
        raise LensHeadsError(f"--bloom-d {args.bloom_d} is not a multiple of --bloom-heads {args.bloom_heads}")
    return args


# -----------------------------------------------------------------------------
# 1. diagnosis


def diagnosis_row(label: str, diag) -> dict:
    counts = diag.counts()
    return {"model": label, "n_layers": diag.n_layers, "n_heads": diag.n_heads,
            "heads_total": diag.n_layers * diag.n_heads, **counts,
            "sick_pct": 100 * (1 - counts["healthy"] / (diag.n_layers * diag.n_heads)),
            "band": format_band(diag.band()), "max_bos_mass": float(diag.bos_mass.max()), "n_inputs": diag.n_inputs}


# -----------------------------------------------------------------------------
# 2. repair


def repair_selector(name: str, args) -> TargetSelector:
    return (TargetSelector(classes=("dead", "bos_sink")) if name == "sinks"
            else TargetSelector(select=args.low_output_select))


def run_repair(model, name: str, args, train_texts, eval_texts, diag_inputs, work: Path) -> RepairReport | str:
    """One target rule: its report, or why nothing was repaired (no heads selected). Reuses
    OUT/work/repair_<name>/report.json when it holds the same run."""
    selector = repair_selector(name, args)
    train = TrainConfig(lr=args.lr, grad_accum=args.grad_accum, max_steps=args.steps, seed=args.seed)
    config = RepairConfig(passes=args.passes, gqa_policy=args.gqa_policy, chunk_len=args.chunk_len,
                          eval_len=args.eval_len, seed=args.seed, train=train)
    folder = work / f"repair_{name}"
    done = folder / "report.json"
    if done.is_file():  # a finished run of the same model, targets and settings: reuse it
        try:
            report = RepairReport.load(done)
        except LensHeadsError:  # not a complete report: run again
            report = None
        want = json.loads(json.dumps(asdict(config), default=str))
        if report is not None and (report.selector, report.model, report.config) == (selector.describe(), model.name,
                                                                                      want):
            return report
    try:
        return repair(model, selector, train_texts, eval_texts, diag_inputs, folder, config, resume=True)
    except LensHeadsError as exc:
        if "no heads selected" not in str(exc):
            raise
        return str(exc)


def repair_row(name: str, selector: str, outcome: RepairReport | str) -> dict:
    """One row of repair.csv: ``outcome`` is ``run_repair``'s report or its note."""
    note = outcome if isinstance(outcome, str) else ""
    row = {"repair": name, "targets": selector, "note": note}
    passes = () if isinstance(outcome, str) else outcome.trained_passes
    if not passes:
        return row
    report, last = outcome, passes[-1]
    row.update({"n_targets_pass1": passes[0].n_targets, "healthy_before": report.healthy_before,
                "healthy_after": last.healthy_after, "ppl_before": report.ppl_before,
                "ppl_after_reinit": passes[0].ppl_after_reinit, "ppl_final": last.ppl_final,
                "steps": sum(p.steps for p in passes), "passes": len(passes),
                "train_wall_s": sum(p.train_wall_s for p in passes),
                "n_eval_tokens": report.n_eval_tokens, "n_train_chunks": report.n_train_chunks,
                "classes_before": json.dumps(report.classes_before),
                "classes_after": json.dumps(last.classes_after)})
    return row


# -----------------------------------------------------------------------------
# 3. BLOOM from scratch


def bloom_settings(args) -> dict:
    return {k: getattr(args, k) for k in ("bloom_layers", "bloom_heads", "bloom_d", "bloom_vocab",
                                          "bloom_train_docs", "bloom_seq", "bloom_batch", "bloom_steps",
                                          "bloom_lr", "seed", "train_data")}


def train_tokenizer(texts, vocab: int, folder: Path):
    """A byte-level BPE tokenizer trained on ``texts``, saved and re-loaded (as TransformerLens needs)."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import AutoTokenizer, PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE(unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab, special_tokens=["<unk>", "<s>", "</s>", "<pad>"],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    tok.train_from_iterator(texts, trainer)
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<s>", eos_token="</s>", unk_token="<unk>",
                                   pad_token="<pad>")
    folder.mkdir(parents=True, exist_ok=True)
    fast.save_pretrained(folder)
    return AutoTokenizer.from_pretrained(folder)


def train_bloom(args, work: Path) -> tuple[Path, list[dict]]:
    """Train (or reuse) the from-scratch BLOOM model; returns its folder and the loss log."""
    from transformers import BloomConfig, BloomForCausalLM

    folder, marker = work / "bloom", work / "bloom" / "training.json"
    settings = bloom_settings(args)
    if marker.is_file():
        saved = json.loads(marker.read_text())
        if saved["settings"] == settings:
            return folder, saved["log"]
    texts = load_texts(args.train_data, n=args.bloom_train_docs)
    tok = train_tokenizer(texts, args.bloom_vocab, work / "bloom_tokenizer")
    chunks = tokenize_texts(tok, texts, args.bloom_seq, mode="chunks")
    if len(chunks) < args.bloom_batch:
        raise LensHeadsError(f"only {len(chunks)} training chunks of {args.bloom_seq} tokens; give more documents")
    data = torch.stack(chunks)
    torch.manual_seed(args.seed)
    config = BloomConfig(vocab_size=len(tok), hidden_size=args.bloom_d, n_layer=args.bloom_layers,
                         n_head=args.bloom_heads, bos_token_id=tok.bos_token_id, eos_token_id=tok.eos_token_id,
                         pad_token_id=tok.pad_token_id)
    model = BloomForCausalLM(config).to(args.device)
    opt = torch.optim.AdamW(model.parameters(), lr=args.bloom_lr, weight_decay=0.01)
    warmup = max(1, args.bloom_steps // 10)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: min((s + 1) / warmup, 0.5 * (1 + math.cos(
        math.pi * min(1.0, max(0, s - warmup) / max(1, args.bloom_steps - warmup))))))
    gen = torch.Generator().manual_seed(args.seed)
    log, t0 = [], time.perf_counter()
    model.train()
    for step in range(1, args.bloom_steps + 1):
        ids = data[torch.randint(0, len(data), (args.bloom_batch,), generator=gen)].to(args.device)
        loss = model(input_ids=ids, labels=ids).loss
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)
        sched.step()
        if step == 1 or step % max(1, args.bloom_steps // 20) == 0 or step == args.bloom_steps:
            log.append({"step": step, "loss": float(loss.detach()), "tokens": step * args.bloom_batch * args.bloom_seq,
                        "wall_s": round(time.perf_counter() - t0, 1)})
            print(f"  bloom step {step}/{args.bloom_steps} loss {log[-1]['loss']:.3f} ({log[-1]['wall_s']:.0f} s)",
                  flush=True)
    model.eval()
    export_model(model.cpu(), tok, folder)
    atomic_write_text(marker, json.dumps({"settings": settings, "log": log, "n_chunks": len(chunks)}, indent=1))
    return folder, log


def slope_table(diag) -> pd.DataFrame:
    """Per head index: ALiBi slope, how many layers it is sick in, mean BOS mass over layers."""
    frame = diag.to_frame()
    rows = []
    for h, grp in frame.groupby("head"):
        rows.append({"head": h, "alibi_slope": float(grp["alibi_slope"].iloc[0]),
                     "layers_sick": int((grp["class"] != "healthy").sum()), "n_layers": len(grp),
                     "mean_bos_mass": float(grp["bos_mass"].mean()), "max_bos_mass": float(grp["bos_mass"].max()),
                     "mean_entropy": float(grp["entropy"].mean())})
    return pd.DataFrame(rows)


# -----------------------------------------------------------------------------
# main


def main(argv=None) -> int:
    args = parse_args(argv)
    # diagnosis documents first, the held-out perplexity documents after them (disjoint)
    val_texts = load_texts(args.diag_data, n=args.diag_n + args.n_eval)
    if len(val_texts) < args.diag_n + args.n_eval:
        raise LensHeadsError(f"{args.diag_data} has {len(val_texts)} documents; need --diag-n + --n-eval = "
                             f"{args.diag_n + args.n_eval}")
    diag_texts, eval_texts = val_texts[:args.diag_n], val_texts[args.diag_n:]
    out = out_folder(args.out)
    work = out / "work"
    run = Run.start(out, args.device, __file__, argv)

    if "diagnose" in args.parts:
        rows = []
        for spec in args.models:
            label = model_label(spec)
            model = load_model(spec, dtype=args.dtype, device=args.device)
            diag = diagnose(model, tokenize_texts(model.tokenizer, diag_texts, args.diag_len), batch_size=args.batch_size)
            diag.save(out / "diagnosis" / f"{label}.csv")
            rows.append(diagnosis_row(label, diag))
            print(f"{label}: {diag.summary()} ({run.elapsed():.0f} s)", flush=True)
            write_csv(pd.DataFrame(rows), out / "diagnosis_counts.csv")
            del model
            gc.collect()
        run.keep_section("diagnose", "1. Diagnosis", (
            f"{args.diag_n} {args.diag_data} documents, <= {args.diag_len} tokens each. Classes in order: dead (BOS mass "
            "> 0.95), bos_sink (> 0.5), low_entropy (< 0.5 nats), local (> 0.6 of the mass on the last 3 positions), "
            "healthy; band = head indices sick in > 30 % of layers.\n\n"
            + markdown_table(pd.DataFrame(rows), 3, ["model", "n_layers", "n_heads", *CLASSES, "sick_pct",
                                                     "max_bos_mass", "band"])))

    if "repair" in args.parts:
        model = load_model(args.repair_model, dtype=args.dtype, device=args.device)
        train_texts = load_texts(args.train_data, n=args.n_train_docs)
        diag_inputs = tokenize_texts(model.tokenizer, diag_texts, args.diag_len)
        rows = []
        for name in args.repairs:
            print(f"repair {name} on {model_label(args.repair_model)} ({run.elapsed():.0f} s)", flush=True)
            outcome = run_repair(model, name, args, train_texts, eval_texts, diag_inputs, work)
            rows.append(repair_row(name, repair_selector(name, args).describe(), outcome))
            write_csv(pd.DataFrame(rows), out / "repair.csv")
        del model
        gc.collect()
        frame = pd.DataFrame(rows)
        cols = [c for c in ["repair", "targets", "n_targets_pass1", "healthy_before", "healthy_after", "ppl_before",
                            "ppl_after_reinit", "ppl_final", "steps", "train_wall_s", "note"] if c in frame.columns]
        run.keep_section("repair", f"2. Repair of {model_label(args.repair_model)}", (
            f"Training: {args.n_train_docs} {args.train_data} documents in {args.chunk_len}-token chunks, "
            f"{args.steps} steps x {args.grad_accum} chunks per pass, {args.passes} pass(es), lr {args.lr:g}, "
            f"GQA policy {args.gqa_policy}. Perplexity: {args.n_eval} held-out {args.diag_data} documents "
            f"(<= {args.eval_len} tokens) used neither for training nor for diagnosis. Healthy counts are "
            f"diagnosed on the {args.diag_n} diagnosis documents.\n\n" + markdown_table(frame, 3, cols)))

    if "bloom" in args.parts:
        print(f"training BLOOM from scratch ({run.elapsed():.0f} s)", flush=True)
        folder, log = train_bloom(args, work)
        write_csv(pd.DataFrame(log), out / "bloom_training.csv")
        model = load_model(str(folder), dtype="float32", device=args.device)
        diag = diagnose(model, tokenize_texts(model.tokenizer, diag_texts, args.diag_len), batch_size=args.batch_size)
        heads = diag.to_frame()
        write_csv(heads, out / "bloom_heads.csv")
        slopes = slope_table(diag)
        write_csv(slopes, out / "bloom_slopes.csv")
        run.keep_section("bloom", "3. BLOOM (ALiBi) trained from scratch", bloom_text(args, diag, slopes, log))
        del model
        gc.collect()

    # every part's latest section, whichever run measured it (a run of some parts keeps the others)
    run.write_summary("Collapsed heads: diagnosis, repair, and a from-scratch ALiBi model",
                      run.kept_sections(["diagnose", "repair", "bloom"]))
    print(f"wrote {out} in {run.elapsed():.0f} s", flush=True)
    return 0


def bloom_text(args, diag, slopes: pd.DataFrame, log: list[dict]) -> str:
    counts = diag.counts()
    n = diag.n_layers * diag.n_heads
    sinks = counts["dead"] + counts["bos_sink"]
    tokens = log[-1]["tokens"] if log else 0
    text = (f"{args.bloom_layers} layers x {args.bloom_heads} heads, d_model {args.bloom_d}, vocab {args.bloom_vocab}; "
            f"{args.bloom_steps} steps x {args.bloom_batch} x {args.bloom_seq} tokens = {tokens:,} tokens "
            f"({log[-1]['wall_s'] if log else 0:.0f} s), final training loss {log[-1]['loss'] if log else float('nan'):.3f}. "
            f"Diagnosed on {diag.n_inputs} {args.diag_data} documents.\n\n"
            f"Classes: {', '.join(f'{c} {k}' for c, k in counts.items())} (of {n}); largest BOS mass of any head "
            f"{float(diag.bos_mass.max()):.3f}; band: {format_band(diag.band())}.\n\n")
    sick = slopes[slopes.layers_sick > 0]
    if sinks == 0:
        text += (f"**No attention sink formed at this scale**: no head puts more than 0.5 of its attention on the "
                 f"first token (the largest is {float(diag.bos_mass.max()):.3f}), so the slope-vs-sink question "
                 "cannot be answered here. "
                 + (("Head indices of another class in some layer: " + ", ".join(
                     f"H{r.head} (slope {r.alibi_slope:g}, {r.layers_sick}/{r.n_layers} layers)" for r in sick.itertuples())
                     + f"; correlation of slope with mean entropy over layers "
                     f"{float(np.corrcoef(slopes['alibi_slope'], slopes['mean_entropy'])[0, 1]):.3f}. ")
                    if len(sick) and len(slopes) > 2 else "")
                 + "Per-head statistics as measured:\n\n")
    else:
        healthy = slopes[slopes.layers_sick == 0]
        corr = float(np.corrcoef(slopes["alibi_slope"], slopes["mean_bos_mass"])[0, 1]) if len(slopes) > 2 else math.nan
        text += (f"{sinks} DEAD/BOS-sink heads. Mean slope of head indices sick in some layer "
                 f"{sick['alibi_slope'].mean():.4f} vs never sick {healthy['alibi_slope'].mean():.4f}; correlation of "
                 f"slope with mean BOS mass over layers {corr:.3f} (negative: the sinks sit at the weakest "
                 "distance penalty).\n\n")
    return text + markdown_table(slopes, 4)


if __name__ == "__main__":
    script_main(main)
