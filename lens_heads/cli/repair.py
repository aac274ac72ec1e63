"""``lens-heads repair MODEL (--classes ... | --heads ... | --band | --select ...) --data DATA --out DIR``."""

from __future__ import annotations

from lens_heads.cli.common import add_model_args, check_positive, config_geometry, model_from_args, no_texts
from lens_heads.files.atomic import check_output_dir
from lens_heads.data import load_texts, tokenize_texts
from lens_heads.surgery.diagnose import check_classes
from lens_heads.errors import LensHeadsError
from lens_heads.surgery import RepairConfig, TargetSelector, TrainConfig, parse_heads, parse_select, repair
from lens_heads.surgery.export import check_out_dir
from lens_heads.surgery.targets import HealthyPick


def register(sub) -> None:
    p = sub.add_parser("repair", help="surgically re-initialise and retrain collapsed heads")
    add_model_args(p)
    which = p.add_mutually_exclusive_group(required=True)
    which.add_argument("--classes", help="diagnosis classes to repair, e.g. dead,bos_sink")
    which.add_argument("--heads", help="explicit heads LAYER.HEAD,LAYER.HEAD")
    which.add_argument("--band", action="store_true", help="every head index of the diagnosed band, all layers")
    which.add_argument("--select", help="score threshold on dataset-level scores, e.g. 'ahon_ln<0.6'")
    p.add_argument("--reinit-healthy", default=None, metavar="RULE",
                   help="extended surgery: re-initialise healthy heads too, with the same masked training: "
                        "index:H (head H of every layer where it is healthy) or fraction:P@SEED (a seeded "
                        "random share P of the healthy heads)")
    p.add_argument("--data", required=True,
                   help="training corpus: c4-train, wikitext2-train (WikiText-2 train, from LENS_HEADS_DATA or "
                        "the hub), c4, wikitext2, a local .txt/.jsonl/.csv/.parquet file or a hub dataset id; "
                        "report.json names it")
    p.add_argument("--n-train-docs", type=int, default=None, help="training documents to read (default all)")
    p.add_argument("--eval-data", default=None,
                   help="held-out corpus for perplexity (default: the last --n-eval documents of --data, "
                        "which are then not trained on)")
    p.add_argument("--n-eval", type=int, default=32, help="held-out documents (default 32)")
    p.add_argument("--eval-len", type=int, default=512, help="tokens per held-out document (default 512)")
    p.add_argument("--diag-data", default=None, help="corpus for diagnosis/selection (default: --eval-data or c4)")
    p.add_argument("--diag-n", type=int, default=16, help="diagnosis inputs (default 16)")
    p.add_argument("--diag-len", type=int, default=128, help="tokens per diagnosis input (default 128)")
    length = p.add_mutually_exclusive_group()
    length.add_argument("--steps", type=int, default=None, help="optimisation steps per pass")
    length.add_argument("--epochs", type=int, default=15, help="epochs per pass (default 15)")
    p.add_argument("--passes", type=int, default=2)
    p.add_argument("--init", default="xavier_uniform", choices=["xavier_uniform", "xavier_normal"])
    p.add_argument("--gqa-policy", default="q_only", choices=["q_only", "group"])
    p.add_argument("--chunk-len", type=int, default=512)
    p.add_argument("--micro-batch", type=int, default=1)
    p.add_argument("--grad-accum", type=int, default=8)
    p.add_argument("--lr", type=float, default=5e-5)
    p.add_argument("--patience", type=int, default=6)
    p.add_argument("--warmup", type=int, default=None, help="warm-up steps (default min(100, total/4))")
    p.add_argument("--grad-checkpointing", action="store_true")
    p.add_argument("--autocast-bf16", action="store_true", help="float32 weights, bf16 forward/backward")
    p.add_argument("--checkpoint-every", type=int, default=0, help="steps between checkpoints (0: each epoch)")
    p.add_argument("--keep-checkpoints", action="store_true",
                   help="keep every checkpoint's trained tensors (not only the newest), so that "
                        "'lens-heads drift OUT' measures the heads at each of them")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--no-resume", action="store_true", help="ignore checkpoints already in --out")
    p.add_argument("--out", required=True, help="folder for the repaired model, checkpoints and report.json")
    p.add_argument("--quiet", action="store_true")
    p.set_defaults(func=run)


def run(args) -> int:
    import math


    # cheap checks first: no model load for a malformed request
    if args.classes is not None:
        check_classes(args.classes)
    if args.select is not None:
        parse_select(args.select)
    extend = None if args.reinit_healthy is None else HealthyPick.parse(args.reinit_healthy)
    check_positive(args, "n_eval", "diag_n", "passes", "micro_batch", "grad_accum", "epochs", "steps", "patience")
    check_positive(args, "chunk_len", "eval_len", "diag_len", minimum=2)
    check_positive(args, "checkpoint_every", "warmup", "n_train_docs", minimum=0)
    if not (math.isfinite(args.lr) and args.lr > 0):
        raise LensHeadsError(f"--lr must be a positive number, got {args.lr}")
    if args.heads is not None:
        parse_heads(args.heads, config_geometry(args))  # syntax and ranges (from the config), before loading
    if extend is not None and (geometry := config_geometry(args)) is not None:
        extend.check(geometry)  # else repair checks it once the model is loaded
    check_output_dir(args.out)
    texts = load_texts(args.data, n=args.n_train_docs)  # data files are read before the model loads
    if args.eval_data is None and len(texts) <= args.n_eval:
        raise LensHeadsError(f"{args.data} has {len(texts)} documents: too few to hold out {args.n_eval} "
                             "for perplexity; lower --n-eval or give --eval-data")
    eval_texts = None if args.eval_data is None else load_texts(args.eval_data, n=args.n_eval)
    diag_spec = args.diag_data or args.eval_data
    diag_texts = None if diag_spec is None else load_texts(diag_spec, n=args.diag_n)
    for given, got in ((args.data, texts), (args.eval_data, eval_texts), (diag_spec, diag_texts)):
        if given is not None and got is not None and not got:
            raise no_texts(given)
    model = model_from_args(args)
    check_out_dir(args.out, model.source)
    if args.heads is not None:
        selector = TargetSelector(heads=tuple(parse_heads(args.heads, model.geometry)))
    elif args.classes is not None:
        selector = TargetSelector(classes=tuple(check_classes(args.classes)))
    elif args.band:
        selector = TargetSelector(band=True)
    else:
        selector = TargetSelector(select=args.select)

    if args.eval_data is None:
        train_texts, eval_texts = texts[:-args.n_eval], texts[-args.n_eval:]
    else:
        train_texts = texts
    if diag_texts is None:
        diag_texts = eval_texts[:args.diag_n]
    diag_inputs = tokenize_texts(model.tokenizer, diag_texts, args.diag_len)
    if not diag_inputs:
        raise LensHeadsError("no diagnosis inputs")
    train = TrainConfig(lr=args.lr, micro_batch=args.micro_batch, grad_accum=args.grad_accum, epochs=args.epochs,
                        max_steps=args.steps, patience=args.patience, warmup=args.warmup,
                        gradient_checkpointing=args.grad_checkpointing, autocast_bf16=args.autocast_bf16,
                        checkpoint_every=args.checkpoint_every, keep_checkpoints=args.keep_checkpoints,
                        seed=args.seed)
    config = RepairConfig(passes=args.passes, init=args.init, gqa_policy=args.gqa_policy, chunk_len=args.chunk_len,
                          eval_len=args.eval_len, seed=args.seed, train=train)
    report = repair(model, selector, train_texts, eval_texts, diag_inputs, args.out, config,
                    resume=not args.no_resume, progress=not args.quiet, train_data=args.data,
                    eval_data=args.eval_data or f"the last {args.n_eval} documents of {args.data}",
                    reinit_healthy=extend)
    print(f"healthy heads: {report.healthy_before}"
          + "".join(f" -> {'-' if p.healthy_after is None else p.healthy_after} (pass {p.index})"
                    for p in report.passes))
    print(f"held-out perplexity: {report.ppl_before:.3f} (original)"
          + "".join(f" -> {p.ppl_after_reinit:.3f} (pass {p.index} re-init) -> {p.ppl_final:.3f}"
                    for p in report.trained_passes))
    print(f"wrote {args.out} (model, tokenizer, report.json)")
    return 0
