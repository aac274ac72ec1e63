"""``lens-heads drift RUN_DIR``: what a repair did to every head, checkpoint by checkpoint.

Reads a finished ``lens-heads repair`` folder (report.json, checkpoints/), measures each state
on held-out probe texts (``lens_heads.surgery.drift``) into RUN_DIR/drift/ (resumable), builds
its tables (heads.csv, curves.csv, generations.csv, epochs.csv) and the page report.html
(``lens_heads.viz.surgery``). Method: docs/methods.md §7, "Drift of the heads".
"""

from __future__ import annotations

import time
from pathlib import Path

from lens_heads import models
from lens_heads.cli.common import DATA_HELP, DefaultCorpus, add_attention_arg, check_positive, no_texts
from lens_heads.data import load_texts, tokenize_texts
from lens_heads.errors import LensHeadsError
from lens_heads.files.atomic import check_output_dir
from lens_heads.surgery.checkpoint import list_checkpoints
from lens_heads.surgery.drift import DEFAULT_PROMPTS, DRIFT_DIR, MOVED_TV, ProbeSet, drift_tables, measure_run, \
    pass_folder, write_tables
from lens_heads.surgery.report import RepairReport
from lens_heads.viz.surgery import write_drift_report


def register(sub) -> None:
    p = sub.add_parser("drift", help="measure how every head changed at each checkpoint of a repair run "
                                     "(frozen-head drift, perplexity, generation probes) and write its page")
    p.add_argument("run", metavar="RUN_DIR", help="a 'lens-heads repair --out' folder (report.json, checkpoints/); "
                                                  "repair with --keep-checkpoints (and --checkpoint-every N) for "
                                                  "more than the last checkpoint of each pass")
    p.add_argument("--model", default=None, help="the model the run repaired (default: the one report.json names)")
    p.add_argument("--dtype", default="float32", help="float32 (default), bfloat16 or auto")
    p.add_argument("--device", default="cpu", help="cpu (default) or cuda")
    add_attention_arg(p)
    p.add_argument("--data", default=DefaultCorpus("c4"),
                   help="probe texts, held out from training: " + DATA_HELP + " (default c4 validation, or "
                        "c4-sample without a local copy); refused when it is the run's training corpus")
    p.add_argument("--n-probes", type=int, default=8, help="probe texts (default 8)")
    p.add_argument("--probe-len", type=int, default=128, help="tokens per probe text (default 128)")
    p.add_argument("--prompts", default=None,
                   help="a .txt file, one prompt per line, for the greedy generation probes (default: four "
                        "fixed prompts)")
    p.add_argument("--max-new-tokens", type=int, default=24, help="tokens each generation probe adds (default 24)")
    p.add_argument("--batch-size", type=int, default=4, help="probe texts per forward (default 4)")
    p.add_argument("--out", default=None, help=f"folder for the store, tables and page (default RUN_DIR/{DRIFT_DIR})")
    p.add_argument("--quiet", action="store_true")
    p.set_defaults(func=run)


def read_prompts(path: str | None) -> tuple[str, ...]:
    if path is None:
        return DEFAULT_PROMPTS
    try:
        lines = Path(path).read_text(encoding="utf-8").splitlines()
    except (OSError, UnicodeDecodeError) as exc:
        raise LensHeadsError(f"--prompts {path}: cannot read it ({exc})") from None
    prompts = tuple(dict.fromkeys(line.strip() for line in lines if line.strip()))  # each prompt once
    if not prompts:
        raise LensHeadsError(f"--prompts {path} holds no prompt (one per non-empty line)")
    return prompts


def run(args) -> int:
    # everything that can be checked without the model, before it loads
    check_positive(args, "n_probes", "max_new_tokens", "batch_size")
    check_positive(args, "probe_len", minimum=2)
    run_dir = Path(args.run)
    if not run_dir.is_dir():
        raise LensHeadsError(f"{args.run}: no such folder (give a 'lens-heads repair --out' folder)")
    report = RepairReport.load(run_dir)
    if not report.trained_passes:
        raise LensHeadsError(f"{args.run}: the run trained no pass, so nothing drifted")
    for p in report.trained_passes:
        if not list_checkpoints(pass_folder(run_dir, p.index)):
            raise LensHeadsError(f"{pass_folder(run_dir, p.index)} holds no checkpoint: the drift of pass {p.index} "
                                 "cannot be replayed")
    out = Path(args.out) if args.out is not None else run_dir / DRIFT_DIR
    check_output_dir(str(out))
    if report.train_data is not None and str(args.data) == report.train_data:
        raise LensHeadsError(f"--data {args.data} is the run's training corpus: probe texts must be held out "
                             "(give another corpus or file)")
    prompts = read_prompts(args.prompts)
    texts = load_texts(args.data, n=args.n_probes)
    if not texts:
        raise no_texts(args.data)
    t0 = time.perf_counter()
    model = models.load_model(args.model or report.model, dtype=args.dtype, device=args.device,
                              attention=args.attention)
    probes = tuple(t for t in tokenize_texts(model.tokenizer, texts, args.probe_len) if len(t) > 1)
    if not probes:
        raise LensHeadsError(f"no probe text of {args.data} has 2 or more tokens")
    prompt_ids = tuple(model.to_tokens(list(prompts)))
    if any(t.numel() == 0 for t in prompt_ids):
        raise LensHeadsError("a generation prompt has no tokens")
    probe_set = ProbeSet(probes, prompts, prompt_ids, args.max_new_tokens, str(args.data), args.probe_len)
    store = measure_run(model, run_dir, probe_set, out, batch_size=args.batch_size, progress=not args.quiet)
    tables = drift_tables(store, run_dir)
    write_tables(tables, store)
    meta = {"title": f"Drift of the heads after surgery: {Path(report.model).name or report.model}",
            "generated": time.strftime("%Y-%m-%d %H:%M %Z"), "run": str(run_dir), "model": report.model,
            "targets": report.selector + (f" + healthy {report.reinit_healthy}" if report.reinit_healthy else ""),
            "training corpus": report.train_data or "not recorded (a run from before lens_heads named it)",
            "probes": f"{len(probes)} {args.data} texts x <= {args.probe_len} tokens",
            "moved when": f"pattern distance (mean total variation over query rows) > {MOVED_TV:g}",
            "states": str(len(tables["curves"]))}
    page = write_drift_report(tables, meta, store / "report.html")
    last = tables["curves"].iloc[-1]
    print(f"{len(tables['curves'])} states; at {last['point']}: {int(last['moved_frozen'])} of "
          f"{int(last['n_frozen'])} frozen heads moved ({int(last['moved_frozen_since_reinit'])} since "
          f"re-initialisation), probe perplexity {last['ppl']:.3f} "
          f"({time.perf_counter() - t0:.0f} s)")
    print(f"wrote {store} (heads.csv, curves.csv, generations.csv, epochs.csv) and {page}")
    return 0
