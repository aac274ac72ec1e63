"""``lens-heads evaluate MODEL --task TASK``: accuracy as lm-evaluation-harness scores it,
optionally with heads ablated; per-question results to JSONL.

``--ablate score:ID@P%`` zeroes, per input, the heads whose score crosses the threshold that
takes P % of the pooled unablated scores on the evaluated inputs themselves: the same point a
sweep (``lens-heads sweep``, same ``--limit`` / ``--seed`` / ``--n-shot``) measures at P %.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from lens_heads.data.tasks import DEFAULT_SEED
from lens_heads.cli.common import (add_model_args, add_protocol_args, check_positive, check_protocol_args,
                                   config_geometry, meta_path, model_from_args, protocol_from_args, write_meta)
from lens_heads.interventions.ablation import parse_ablation
from lens_heads.files.atomic import check_output_file
from lens_heads.data import load_task
from lens_heads.data.lm_eval_tasks import RollingTask
from lens_heads.errors import LensHeadsError
from lens_heads.interventions.specs import ScoreFraction, parse_spec, with_replacement
from lens_heads.forward.replacement import parse_replacement
from lens_heads.evaluation.rolling import evaluate_rolling_task
from lens_heads.scores import resolve_score_ids
from lens_heads.evaluation.protocol import load_authors_thresholds, thresholds_for_sweep
from lens_heads.forward.task_requests import task_inputs
from lens_heads.interventions.thresholds import calibrated_spec, score_ablation_spec
from lens_heads.evaluation import evaluate as evaluation

if TYPE_CHECKING:
    from lens_heads.models.load import LoadedModel


def register(sub) -> None:
    p = sub.add_parser("evaluate", help="multiple-choice accuracy (lm-eval scoring), optionally with heads ablated")
    add_model_args(p)
    p.add_argument("--task", required=True,
                   help="mmlu, piqa, winogrande, a local file: 'file:PATH?question=..&choices=..&answer=..' "
                        "(fields may be dotted paths; per-row labels: labels_field=choices.label), "
                        "lm-eval:NAME or an lm-eval task YAML")
    p.add_argument("--include-path", default=None,
                   help="a folder of lm-eval task YAMLs, as lm_eval --include_path (for --task NAME or lm-eval:NAME)")
    p.add_argument("--n-shot", type=int, default=None, help="few-shot examples (default: the task's; MMLU 5)")
    p.add_argument("--limit", type=int, default=None,
                   help="evaluate a seeded sample of N items, stratified by subject (MMLU) or gold label")
    p.add_argument("--seed", type=int, default=DEFAULT_SEED,
                   help=f"seed for --limit and few-shot sampling (default {DEFAULT_SEED}, lm-eval's)")
    p.add_argument("--ablate", default=None,
                   help="static:L.H,L.H | score:ID@THRESHOLD | score:ID@P%% (threshold taking P%% of "
                        "the heads, set on these inputs unablated) | random:P@SEED | none")
    p.add_argument("--batch-size", default="auto",
                   help="rows per forward, or auto (default: the largest that fits, lens_heads.batching)")
    p.add_argument("--out", default=None, help="write per-question results here (JSONL, atomic)")
    p.add_argument("--quiet", action="store_true", help="no progress bar")
    p.add_argument("--ablate-with", default="zero",
                   help="what ablated heads become: zero (default), mean:CORPUS[@N] (their mean output over the "
                        "first N texts of CORPUS), resample:CORPUS@SEED[@N] (another input's output)")
    add_protocol_args(p)
    p.set_defaults(func=run)


def run(args) -> int:

    # everything that can be checked without the model, before it loads
    if args.out is not None:
        check_output_file(args.out, sidecars=[meta_path(args.out)])
    check_positive(args, "limit", "batch_size")
    check_positive(args, "n_shot", minimum=0)
    typed = parse_spec(args.ablate) if args.ablate is not None else None  # the one spec grammar
    percent = (typed.score_id, typed.fraction) if isinstance(typed, ScoreFraction) else None
    if percent is not None:
        resolve_score_ids([percent[0]])
    elif args.ablate is not None:
        parse_ablation(args.ablate, config_geometry(args))  # syntax, score names and head ranges, before loading
    check_protocol_args(args)

    replacement = parse_replacement(args.ablate_with)
    if args.ablate is None and str(replacement) != "zero":
        raise LensHeadsError("--ablate-with says what ablated heads become: give the heads with --ablate")
    replacement.check()  # the reference corpus exists and has texts
    if args.thresholds_file is not None and percent is None:
        raise LensHeadsError("--thresholds-file gives thresholds for --ablate score:ID@P% only")
    task = load_task(args.task, include_path=args.include_path, rolling=True)  # bad specs fail before the model

    if isinstance(task, RollingTask):
        return run_rolling(args, task, percent)
    task.check_fewshot(args.n_shot, args.seed)  # so does a few-shot pool too small for --n-shot
    if args.thresholds_file is not None:

        table = thresholds_for_sweep(load_authors_thresholds(args.thresholds_file, task.name, args.thresholds_model),
                                     [percent[0]], [percent[1]], args.thresholds_file)
    model = model_from_args(args)
    protocol = protocol_from_args(args, model)
    ablation, spec = None, args.ablate
    if percent is not None and args.thresholds_file is not None:

        tau = table[percent[0]][percent[1]]
        spec = score_ablation_spec(percent[0], tau, protocol.strict)
        print(f"{args.ablate.strip()}: threshold {tau!r} from {args.thresholds_file} ({args.thresholds_model})")
    elif percent is not None:

        inputs = task_inputs(model, task, args.n_shot, args.limit, args.seed, protocol)
        spec, tau = calibrated_spec(model, inputs, *percent, progress=not args.quiet,  # batched as a sweep's
                                    rule=protocol.threshold_rule)
        print(f"{args.ablate.strip()}: threshold {tau!r} from the unablated scores of the {len(inputs)} "
              f"evaluated inputs" if tau is not None else f"{args.ablate.strip()}: nothing to zero")
    if spec is not None:

        ablation = parse_ablation(str(with_replacement(parse_spec(spec), replacement)), model.geometry)
    res = evaluation.evaluate_task(model, task, n_shot=args.n_shot, limit=args.limit, seed=args.seed,
                        ablation=ablation, batch_size=args.batch_size, progress=not args.quiet,
                        protocol=protocol)
    if protocol.key():
        print(f"protocol: {protocol}")
    return show(args, model, res, f"{res.task} {res.n_shot}-shot  n={len(res.questions)}", len(res.questions),
                "questions")


def show(args, model: LoadedModel, res, head: str, n: int, what: str) -> int:
    """Print a result's metrics (and the zeroed fraction); write its per-item JSONL with --out."""
    line = f"{head}  " + "  ".join(f"{k} {v:.4f}" for k, v in res.metrics.items())
    if res.zeroed_fraction is not None and res.zeroed_fraction == res.zeroed_fraction:
        line += f"  zeroed {100 * res.zeroed_fraction:.2f}% of heads ({res.config['ablation']})"
    print(line)
    if args.out is not None:
        res.write_jsonl(args.out)
        write_meta(args.out, model, task=res.task, metrics=res.metrics, n=n, zeroed_fraction=res.zeroed_fraction,
                   config=res.config)
        print(f"wrote {n} {what} to {args.out}")
    return 0


def run_rolling(args, task, percent) -> int:
    """An lm-eval perplexity task: its lm-eval metrics under a fixed or per-window ablation."""

    if percent is not None:
        raise LensHeadsError(f"{task.name} is a perplexity task: --ablate score:ID@P% calibrates on multiple-choice "
                             "inputs; give a threshold (score:ID@TAU), static:L.H,... or random:P@SEED")
    if args.n_shot:
        raise LensHeadsError(f"{task.name} is a perplexity task: it takes no few-shot examples (--n-shot)")
    if args.thresholds_file is not None or args.apply_chat_template:
        raise LensHeadsError(f"{task.name} is a perplexity task: --thresholds-file and --apply-chat-template "
                             "do not apply")

    model = model_from_args(args)
    ablation = None if args.ablate is None else \
        parse_ablation(str(with_replacement(parse_spec(args.ablate), args.ablate_with)), model.geometry)
    res = evaluate_rolling_task(model, task, ablation, args.limit, args.batch_size, progress=not args.quiet)
    return show(args, model, res, f"{res.task}  docs={len(res.docs)}", len(res.docs), "documents")
