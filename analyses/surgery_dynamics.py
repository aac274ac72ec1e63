"""After surgery, what happens to the heads we did not touch (issue 56; arXiv 2603.09616):
a long surgical repair with every checkpoint kept, then the drift of every head, checkpoint by
checkpoint, on held-out probes -- early global redistribution vs late local degradation --
with greedy generation probes; optionally extended surgery (healthy heads re-initialised too)
and any training corpus.

    HF_HUB_OFFLINE=1 HF_DATASETS_OFFLINE=1 nohup python analyses/surgery_dynamics.py \\
        --models smollm2-135m --classes dead,bos_sink --train-data c4-train --n-train-docs 1000 \\
        --steps 600 --checkpoint-every 25 --max-wall-s 36000 \\
        --out analyses/results/surgery_dynamics > surgery_dynamics.log 2>&1 &

A background run: ``--max-wall-s`` stops it at the first checkpoint past the limit (training) or
between two states (drift) and exits with status 3; the same command resumes it (repair from
its checkpoints, drift from its store). ``--from-store`` loads no model and measures nothing:
it rebuilds the tables and the page from the stores (byte for byte the same tables).

Data: training on --train-data (c4-train, wikitext2-train, a local file, ...); --val-data
documents split in order, disjoint: the first --diag-n for diagnosis, the next --n-eval for the
per-epoch held-out perplexity, the next --n-probes for the drift probes (never trained on).

--measure-on measures every state again on other texts, each into its own store and tables
(OUT/on-NAME/): another held-out corpus (``wikitext2``: WikiText-2 raw test articles, never
trained on), or ``train``: the first --n-probes documents of the training corpus itself (the
training perplexity of every state, against the model before surgery).

Stores (OUT/work/, git-ignored): ``repair/`` (the 'lens-heads repair' folder: report.json,
every checkpoint, the exported model), ``repair/drift/`` (the drift store) and
``repair/drift-NAME/`` per --measure-on. Outputs (OUT): heads.csv, curves.csv, generations.csv,
epochs.csv (``lens_heads.surgery.drift``), the same under on-NAME/, report.html (the page),
summary.md. Method: docs/methods.md §7, "Drift of the heads".
"""

from __future__ import annotations

import json
import re
import sys
import time
from dataclasses import asdict
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from common import Run, base_parser, check_positive, markdown_table, model_label, out_folder, script_main, \
    split_list  # noqa: E402

from lens_heads import models  # noqa: E402
from lens_heads.data import load_texts, tokenize_texts  # noqa: E402
from lens_heads.errors import LensHeadsError  # noqa: E402
from lens_heads.files.atomic import atomic_write_text  # noqa: E402
from lens_heads.surgery import RepairConfig, RepairReport, TargetSelector, TrainConfig, parse_heads, repair  # noqa: E402
from lens_heads.surgery.checkpoint import list_checkpoints  # noqa: E402
from lens_heads.surgery.diagnose import check_classes  # noqa: E402
from lens_heads.surgery.drift import DEFAULT_PROMPTS, MOVED_TV, ProbeSet, drift_tables, measure_run, pass_folder, \
    run_points, write_tables  # noqa: E402
from lens_heads.surgery.targets import HealthyPick  # noqa: E402
from lens_heads.viz.surgery import write_drift_report  # noqa: E402

STOPPED = 3  # exit status of a run stopped by --max-wall-s (rerun to resume)


class WallClockStop(Exception):
    """Raised inside training at a checkpoint past --max-wall-s."""


def parse_args(argv):
    p = base_parser(__doc__, "analyses/results/surgery_dynamics")
    p.set_defaults(models="smollm2-135m", batch_size=4)
    which = p.add_mutually_exclusive_group()
    which.add_argument("--classes", default=None, help="diagnosis classes to repair (default dead,bos_sink)")
    which.add_argument("--heads", default=None, help="explicit target heads LAYER.HEAD,...")
    p.add_argument("--reinit-healthy", default=None, help="extended surgery: index:H or fraction:P@SEED")
    p.add_argument("--train-data", default="c4-train")
    p.add_argument("--n-train-docs", type=int, default=1000)
    p.add_argument("--val-data", default="c4", help="held-out documents: diagnosis, perplexity, probes (disjoint)")
    p.add_argument("--diag-n", type=int, default=32)
    p.add_argument("--diag-len", type=int, default=256)
    p.add_argument("--n-eval", type=int, default=32)
    p.add_argument("--eval-len", type=int, default=512)
    p.add_argument("--n-probes", type=int, default=8)
    p.add_argument("--measure-on", default=None,
                   help="more probe texts, each measured into its own store: held-out corpora, or 'train'")
    p.add_argument("--probe-len", type=int, default=128)
    p.add_argument("--max-new-tokens", type=int, default=24)
    p.add_argument("--steps", type=int, default=600, help="optimisation steps per pass")
    p.add_argument("--checkpoint-every", type=int, default=25)
    p.add_argument("--passes", type=int, default=1)
    p.add_argument("--chunk-len", type=int, default=512)
    p.add_argument("--grad-accum", type=int, default=8)
    p.add_argument("--lr", type=float, default=5e-5)
    p.add_argument("--gqa-policy", default="q_only", choices=["q_only", "group"])
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--max-wall-s", type=float, default=None,
                   help=f"stop (resumably, exit status {STOPPED}) at the first checkpoint or drift state past "
                        "this many seconds")
    p.add_argument("--from-store", action="store_true", help="no model, no measurement: tables from the stores")
    args = p.parse_args(argv)
    args.device = models.check_device(args.device)
    names = split_list(args.models, "models")
    if len(names) != 1:
        raise LensHeadsError(f"--models: this study repairs one model, got {len(names)} ({', '.join(names)})")
    args.model = names[0]
    check_positive(args, "n_train_docs", "diag_n", "diag_len", "n_eval", "eval_len", "n_probes", "probe_len",
                   "max_new_tokens", "steps", "checkpoint_every", "passes", "chunk_len", "grad_accum", "batch_size")
    if args.classes is None and args.heads is None:
        args.classes = "dead,bos_sink"
    if args.classes is not None:
        check_classes(args.classes)
    if args.heads is not None:
        parse_heads(args.heads, None)
    args.extend = None if args.reinit_healthy is None else HealthyPick.parse(args.reinit_healthy)
    if args.max_wall_s is not None and args.max_wall_s <= 0:
        raise LensHeadsError(f"--max-wall-s must be > 0, got {args.max_wall_s}")
    args.measure_on = [] if args.measure_on is None else split_list(args.measure_on, "--measure-on corpora")
    for name in args.measure_on:
        if name in (args.val_data, args.train_data):
            raise LensHeadsError(f"--measure-on {name}: " + ("the --val-data probes are measured anyway" if
                                 name == args.val_data else "that is the training corpus: say 'train'"))
    slugs = [on_name(n) for n in args.measure_on]
    if len(set(slugs)) < len(slugs):
        raise LensHeadsError(f"--measure-on {','.join(args.measure_on)}: two of them share a folder name")
    return args


def on_name(corpus: str) -> str:
    """The folder name of a --measure-on corpus (its name, or a local file's stem)."""
    return re.sub(r"[^A-Za-z0-9_.-]+", "_", Path(corpus).stem if Path(corpus).suffix else corpus)


def selector(args) -> TargetSelector:
    if args.heads is not None:
        return TargetSelector(heads=tuple(parse_heads(args.heads, None)))
    return TargetSelector(classes=tuple(check_classes(args.classes)))


def repair_config(args) -> RepairConfig:
    train = TrainConfig(lr=args.lr, grad_accum=args.grad_accum, max_steps=args.steps, seed=args.seed,
                        checkpoint_every=args.checkpoint_every, keep_checkpoints=True)
    return RepairConfig(passes=args.passes, gqa_policy=args.gqa_policy, chunk_len=args.chunk_len,
                        eval_len=args.eval_len, seed=args.seed, train=train)


def finished_report(folder: Path, args) -> RepairReport | None:
    """The run's report when it is finished with these settings (else None: run or resume it)."""
    try:
        report = RepairReport.load(folder)
    except LensHeadsError:
        return None
    want = json.loads(json.dumps(asdict(repair_config(args)), default=str))
    same = (report.selector, report.config, report.train_data, report.reinit_healthy) == (
        selector(args).describe(), want, args.train_data, None if args.extend is None else str(args.extend))
    if not same:
        raise LensHeadsError(f"{folder} holds a finished repair with other settings: give another --out")
    return report


def run_repair(model, args, folder: Path, val: list[str], deadline: float | None) -> RepairReport | None:
    """Repair (or resume) into ``folder``; None when stopped at the wall-clock limit."""
    train_texts = load_texts(args.train_data, n=args.n_train_docs)
    diag_inputs = tokenize_texts(model.tokenizer, val[:args.diag_n], args.diag_len)
    eval_texts = val[args.diag_n:args.diag_n + args.n_eval]

    def stop_at_checkpoint(k: int, step: int, _loss: float) -> None:
        if deadline is not None and time.time() > deadline:
            ckpts = list_checkpoints(pass_folder(folder, k))
            if ckpts and ckpts[-1][0] == step:  # this step was just checkpointed: nothing is lost
                raise WallClockStop(f"pass {k} step {step}")

    try:
        return repair(model, selector(args), train_texts, eval_texts, diag_inputs, folder, repair_config(args),
                      resume=True, train_data=args.train_data,
                      eval_data=f"{args.val_data} documents {args.diag_n}..{args.diag_n + args.n_eval - 1}",
                      reinit_healthy=args.extend, on_step=stop_at_checkpoint)
    except WallClockStop as stop:
        print(f"stopped at the wall-clock limit after {stop} (checkpointed): rerun the same command to resume",
              flush=True)
        return None


def main(argv=None) -> int:
    args = parse_args(argv)
    out = out_folder(args.out)
    run = Run.start(out, args.device, __file__, argv)
    deadline = None if args.max_wall_s is None else run.t0 + args.max_wall_s
    folder = out / "work" / "repair"
    store = folder / "drift"
    if not args.from_store:
        val = load_texts(args.val_data, n=args.diag_n + args.n_eval + args.n_probes)
        if len(val) < args.diag_n + args.n_eval + args.n_probes:
            raise LensHeadsError(f"{args.val_data} has {len(val)} documents; need --diag-n + --n-eval + --n-probes = "
                                 f"{args.diag_n + args.n_eval + args.n_probes}")
        model = models.load_model(args.model, dtype=args.dtype, device=args.device)
        report = finished_report(folder, args)
        if report is None:
            print(f"repair of {model_label(args.model)} ({run.elapsed():.0f} s)", flush=True)
            report = run_repair(model, args, folder, val, deadline)
            if report is None:
                return STOPPED
        probes = tuple(t for t in tokenize_texts(model.tokenizer, val[args.diag_n + args.n_eval:], args.probe_len)
                       if len(t) > 1)
        probe_set = ProbeSet(probes, DEFAULT_PROMPTS, tuple(model.to_tokens(list(DEFAULT_PROMPTS))),
                             args.max_new_tokens, f"{args.val_data} documents {args.diag_n + args.n_eval}.."
                             f"{args.diag_n + args.n_eval + args.n_probes - 1}", args.probe_len)
        sets = [(store, probe_set)]
        for name in args.measure_on:  # the same states, on other texts
            texts = load_texts(args.train_data if name == "train" else name, n=args.n_probes)
            what = (f"{args.train_data} documents 0..{len(texts) - 1} (trained on)" if name == "train" else
                    f"{name} documents 0..{len(texts) - 1}")
            sets.append((folder / f"drift-{on_name(name)}", ProbeSet(
                tuple(t for t in tokenize_texts(model.tokenizer, texts, args.probe_len) if len(t) > 1),
                probe_set.prompts, probe_set.prompt_ids, args.max_new_tokens, what, args.probe_len)))
        for where, probes_of in sets:
            if deadline is not None and time.time() > deadline:
                break
            print(f"drift of every head on {probes_of.probe_data} ({run.elapsed():.0f} s)", flush=True)
            measure_run(model, folder, probes_of, where, batch_size=args.batch_size,
                        should_stop=None if deadline is None else (lambda: time.time() > deadline))
    report = RepairReport.load(folder)
    tables = drift_tables(store, folder)
    write_tables(tables, out)
    others = {}  # every other store of the run (--measure-on now or earlier) that holds the state before surgery
    for other_store in sorted(folder.glob("drift-*")):
        try:
            others[other_store.name[len("drift-"):]] = drift_tables(other_store, folder)
        except LensHeadsError:  # stopped before its first state: measured when resumed
            continue
    for name, other in others.items():
        write_tables(other, out / f"on-{name}")
    curves = tables["curves"]
    points = run_points(folder, report)
    listed = [on_name(n) for n in args.measure_on]
    complete = set(listed) <= set(others) and all(
        len(t["curves"]) == len(points) for t in (tables, *(others[n] for n in listed)))
    meta = {"title": f"Drift of the heads after surgery: {model_label(args.model)}", "model": report.model,
            "targets": report.selector + (f" + healthy {report.reinit_healthy}" if report.reinit_healthy else ""),
            "training corpus": str(report.train_data), "probes": json.loads((store / "probe.json").read_text())[
                "probe_data"], "moved when": f"pattern distance > {MOVED_TV:g}",
            "states": f"{len(curves)} of {len(points)}"}
    write_drift_report(tables, meta, out / "report.html")
    cols = ["point", "step", "ppl", "moved_target", "moved_frozen", "moved_frozen_since_reinit",
            "mean_tv_reinit_frozen", "n_frozen"]
    cfg, train = report.config, report.config["train"]  # the run's own settings (--from-store takes no others)
    probe_len = json.loads((store / "probe.json").read_text())["probe_len"]
    text = (f"Targets: {meta['targets']}; training on {report.train_data} ({report.n_train_chunks} chunks of "
            f"{cfg['chunk_len']} tokens, {train['grad_accum']} a step, lr {train['lr']:g}), "
            f"{sum(p.steps or 0 for p in report.trained_passes)} steps in {len(report.trained_passes)} pass(es), "
            f"a checkpoint every {train['checkpoint_every']} steps. Probes: "
            f"{meta['probes']} (<= {probe_len} tokens), held out from training. A head is moved when its "
            f"pattern distance to the model before surgery exceeds {MOVED_TV:g}; moved since re-initialisation "
            "when its distance to the state its pass started training from does (docs/methods.md §7). "
            + ("" if complete else f"**Incomplete: {len(curves)} of {len(points)} states measured; rerun to "
                                   "resume.** ")
            + "Per-head values: heads.csv; the maps, curves and generation probes: report.html.\n\n"
            + markdown_table(curves, 4, cols))
    sections = [("Drift per state", text)]
    measured_on = {".": meta["probes"]}
    for name, other in others.items():
        probe_of = json.loads((folder / f"drift-{name}" / "probe.json").read_text())["probe_data"]
        measured_on[f"on-{name}"] = probe_of
        sections.append((f"On {probe_of}", f"The same states measured on {probe_of} (<= {probe_len} tokens); "
                         f"tables in on-{name}/.\n\n" + markdown_table(other["curves"], 4, cols)))
    atomic_write_text(out / "run.json", json.dumps({  # what analyses/surgery_findings.py reads beside the tables
        "model": report.model, "targets": report.selector, "reinit_healthy": report.reinit_healthy,
        "train_data": report.train_data, "n_train_chunks": report.n_train_chunks, "chunk_len": cfg["chunk_len"],
        "grad_accum": train["grad_accum"], "lr": train["lr"], "steps": sum(p.steps or 0 for p in report.trained_passes),
        "checkpoint_every": train["checkpoint_every"], "probe_len": probe_len, "measured_on": measured_on,
        "complete": complete}, indent=1) + "\n")
    run.write_summary("After surgery: what happens to the heads we did not touch", sections)
    print(f"wrote {out} in {run.elapsed():.0f} s", flush=True)
    return 0 if complete or args.from_store else STOPPED


if __name__ == "__main__":
    script_main(main)
