"""``lens-heads diagnose MODEL --data DATA --out FILE.csv``: head classes, band and slopes."""

from __future__ import annotations

import dataclasses

from lens_heads.cli.common import (add_data_args, add_model_args, check_positive, meta_path, model_from_args,
                                   no_texts, write_meta)
from lens_heads.files.atomic import check_output_file
from lens_heads.data import load_texts, tokenize_texts
from lens_heads.surgery.diagnose import CLASSES, DiagnosisThresholds, SICK, diagnose, format_band
from lens_heads.errors import LensHeadsError


def register(sub) -> None:
    p = sub.add_parser("diagnose", help="classify heads (dead / BOS-sink / low-entropy / local / healthy)")
    add_model_args(p)
    add_data_args(p)
    p.add_argument("--prompt", default=None, help="diagnose on this one text instead of --data")
    p.add_argument("--out", required=True, help="CSV file to write (layer,head,bos_mass,entropy,local_mass,class,alibi_slope)")
    p.add_argument("--dead", type=float, default=0.95, help="BOS mass above which a head is DEAD (0.95)")
    p.add_argument("--bos-sink", type=float, default=0.50, help="BOS mass above which a head is a BOS sink (0.50)")
    p.add_argument("--low-entropy", type=float, default=0.5, help="entropy (nats) below which a head is low-entropy (0.5)")
    p.add_argument("--local", type=float, default=0.6, help="mass on the last 3 positions above which a head is local (0.6)")
    p.add_argument("--band-fraction", type=float, default=0.30, help="band = heads sick in more than this share of layers")
    p.set_defaults(func=run)


def run(args) -> int:


    # everything that can be checked without the model, before it loads
    if not str(args.out).endswith(".csv"):
        raise LensHeadsError(f"--out must be a .csv file, got {args.out}")
    check_output_file(args.out, sidecars=[meta_path(args.out)])
    thresholds = DiagnosisThresholds(args.dead, args.bos_sink, args.low_entropy, args.local, args.band_fraction)
    check_positive(args, "max_len", minimum=2)
    check_positive(args, "n_inputs", "batch_size")
    if args.prompt is not None and not args.prompt.strip():
        raise LensHeadsError("--prompt is empty: give a text to diagnose on")
    texts = None if args.prompt is not None else load_texts(args.data, n=args.n_inputs)
    if texts is not None and not texts:
        raise no_texts(args.data)
    model = model_from_args(args)
    if args.prompt is not None:
        inputs, what = [args.prompt], "the given prompt"
    else:
        inputs = tokenize_texts(model.tokenizer, texts, args.max_len)
        what = f"{len(inputs)} {args.data} texts x <= {args.max_len} tokens"
    if not inputs:
        raise LensHeadsError(f"no inputs in {args.data}")
    diag = diagnose(model, inputs, thresholds, batch_size=args.batch_size)
    diag.save(args.out)
    write_meta(args.out, model, data=None if args.prompt is not None else str(args.data),
               prompt=args.prompt, n_inputs=len(inputs), max_len=args.max_len, thresholds=dataclasses.asdict(thresholds))
    counts = diag.counts()
    print(f"{model.name}: {diag.n_layers} layers x {diag.n_heads} heads, on {what}")
    for c in CLASSES:
        print(f"  {c:<12} {counts[c]:>5}")
    print(f"band (sick in > {thresholds.band_fraction:.0%} of layers): {format_band(diag.band())}")
    if diag.alibi_slopes is not None:
        sick = [sum(diag.classes[L][h] in SICK for L in range(diag.n_layers)) for h in range(diag.n_heads)]
        print("ALiBi slope and number of sick layers per head:")
        print("  " + "  ".join(f"H{h}:{s:.3g}({n})" for h, (s, n) in enumerate(zip(diag.alibi_slopes.tolist(), sick))))
    print(f"wrote {args.out}")
    return 0
