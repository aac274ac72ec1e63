"""``lens-heads prune MODEL (--heads L.H,... | --select ahon_ln@30%) --out DIR [--eval TASK]``:
remove heads physically, export the smaller model, and (``--eval``) measure what it costs."""

from __future__ import annotations

from lens_heads.cli.common import add_data_args, add_model_args, check_positive, config_geometry, model_from_args, \
    no_texts
from lens_heads.files.atomic import check_output_dir
from lens_heads.errors import LensHeadsError
from lens_heads.interventions.specs import parse_heads
from lens_heads.surgery.prune import PruneSelection, REPORT_FILE, check_prunable, prune, save_pruned
from lens_heads.sweep.curves import bootstrap_indices, paired_difference
from lens_heads.data import load_task, load_texts, tokenize_texts
from lens_heads.surgery.prune import plan_prune
from lens_heads.surgery.export import remove_stale_exports
from lens_heads.evaluation import evaluate as evaluation


def register(sub) -> None:
    p = sub.add_parser("prune", help="remove heads physically: a smaller, faster model, exported")
    add_model_args(p)
    add_data_args(p)
    g = p.add_mutually_exclusive_group(required=True)
    g.add_argument("--heads", default=None, help="heads to remove: L.H,L.H,...")
    g.add_argument("--select", default=None,
                   help="ID@P%% (the least active P%% of all heads by a dataset-level score on --data), "
                        "ID@P%%:groups (whole KV groups, least active first, rounded up to whole groups, every layer keeping "
                        "one: what saves compute and KV cache under grouped-query attention) or ID<TAU / ID>TAU (every head whose score crosses TAU)")
    p.add_argument("--allow-empty-layers", action="store_true",
                   help="a layer may lose every head (one zero-output head stays)")
    p.add_argument("--out", required=True, help="folder for the pruned model (new or empty)")
    p.add_argument("--eval", default=None, metavar="TASK", help="evaluate pruned vs unpruned on TASK (paired)")
    p.add_argument("--limit", type=int, default=None, help="with --eval: a seeded sample of N questions")
    p.add_argument("--n-boot", type=int, default=None,
                   help="with --eval: bootstrap resamples of the paired change (default 1000)")
    p.set_defaults(func=run)


def run(args) -> int:
    import json
    import time


    # every check that needs no model first; nothing is written until they pass
    check_output_dir(args.out)
    from pathlib import Path

    if Path(args.out).is_dir():

        remove_stale_exports(Path(args.out))  # a killed run's staging folder does not block its rerun
        if any(Path(args.out).iterdir()):
            raise LensHeadsError(f"--out {args.out} is not empty: give a new or empty folder")
    check_positive(args, "limit", "n_boot", "n_inputs")
    for name in ("limit", "n_boot"):  # they would be ignored
        if args.eval is None and getattr(args, name) is not None:
            raise LensHeadsError(f"--{name.replace('_', '-')} goes with --eval TASK (the evaluation of pruned vs "
                                 "unpruned)")
    check_positive(args, "max_len", minimum=2)
    heads = sorted(set(parse_heads(args.heads, None))) if args.heads is not None else None
    if heads is not None and not heads:
        raise LensHeadsError("--heads is empty: nothing to prune")
    geometry = config_geometry(args)
    if geometry is not None:

        check_prunable(geometry)
        if heads is not None:  # head ranges and emptied layers, from the config, before the weights load
            plan_prune(geometry, heads, allow_empty_layers=args.allow_empty_layers)
    selection = PruneSelection.parse(args.select) if args.select is not None else None
    texts = None
    if selection is not None:

        texts = load_texts(args.data, n=args.n_inputs)
        if not texts:
            raise no_texts(args.data)
    task = None
    if args.eval is not None:

        task = load_task(args.eval)
    if args.device_map is not None:
        raise LensHeadsError("pruning copies the model onto one device: give --device, not --device-map")
    model = model_from_args(args)
    check_prunable(model.geometry, model.hf_model.config)  # before any scoring
    if selection is not None:

        heads = selection.resolve(model, tokenize_texts(model.tokenizer, texts, args.max_len))
        if not heads:
            raise LensHeadsError(f"--select {selection} selects no head on {args.data}")
    t0 = time.perf_counter()
    pruned = prune(model, heads, allow_empty_layers=args.allow_empty_layers)
    before, after = model.parameter_count(), pruned.parameter_count()
    g = pruned.geometry
    record = {"model": model.name, "removed": [f"{L}.{h}" for L, h in heads], "n_removed": len(heads),
              "selection": str(selection) if selection is not None else "heads", "data": args.data if texts else None,
              "heads_per_layer": list(g.heads_per_layer), "kv_heads_per_layer": list(g.kv_per_layer),
              "heads_before": model.geometry.n_units, "heads_after": g.n_units,
              "parameters_before": before, "parameters_after": after}
    padding = g.n_units - (model.geometry.n_units - len(heads))
    record["padding_heads"] = padding
    print(f"removed {len(heads)} of {model.geometry.n_units} heads ({100 * len(heads) / model.geometry.n_units:.1f} %); "
          f"parameters {before:,} -> {after:,} ({100 * (1 - after / before):.2f} % fewer); "
          f"heads per layer {list(g.heads_per_layer)}"
          + (f"; {padding} of the removed heads stay as zero-output padding (their KV group keeps its width; "
             f"--select ...:groups removes whole groups)" if padding else ""))
    if task is not None:
        a = evaluation.evaluate_task(model, task, limit=args.limit, progress=False)
        b = evaluation.evaluate_task(pruned, task, limit=args.limit, progress=False)
        d = paired_difference([q.correct for q in b.questions], [q.correct for q in a.questions],
                              bootstrap_indices(len(a.questions), args.n_boot or 1000))
        record["eval"] = {"task": task.name, "n_questions": len(a.questions), "acc_before": a.metrics["acc"],
                          "acc_after": b.metrics["acc"], **{k: float(v) for k, v in d.items()}}
        print(f"{task.name} ({len(a.questions)} questions): acc {a.metrics['acc']:.4f} -> {b.metrics['acc']:.4f}, "
              f"change {100 * d['delta']:+.1f} [{100 * d['ci_low']:+.1f}, {100 * d['ci_high']:+.1f}] points")
    record["seconds"] = round(time.perf_counter() - t0, 1)
    out = save_pruned(pruned, args.out, extra_files={REPORT_FILE: json.dumps(record, indent=1) + "\n"})
    print(f"wrote the pruned model to {out} (reload: lens_heads.load_model, or transformers with "
          f"trust_remote_code=True) and {out / REPORT_FILE}")
    return 0
