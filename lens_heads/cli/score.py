"""``lens-heads score MODEL --data DATA --out FILE``: per-head scores to a .csv / .parquet table.

The table's first four columns are ``layer,head,score_fn,value`` (value = mean over inputs),
then ``std`` and ``n``; a ``FILE.meta.json`` sidecar records model, data and versions, and
``--per-input`` adds ``FILE.per_input.safetensors`` ([n_inputs, layer, head] per function).
"""

from __future__ import annotations

from pathlib import Path

from lens_heads.cli.common import add_data_args, add_model_args, check_positive, model_from_args, no_texts
from lens_heads.scores.functions import question_level
from lens_heads.files.atomic import check_output_file
from lens_heads.data import load_task, load_texts, tokenize_texts
from lens_heads.errors import LensHeadsError
from lens_heads.scores import HeadScores, SCORES
from lens_heads import scores as scoring
from lens_heads.scores import resolve_score_ids


def register(sub) -> None:
    p = sub.add_parser("score", help="score every attention head with the inactivity functions")
    add_model_args(p)
    add_data_args(p, default=None, required=False)
    p.add_argument("--task", default=None, help="with a question-level score (e.g. attribution patching): the task "
                                                "whose gold answers it is computed on; --limit N of its questions")
    p.add_argument("--limit", type=int, default=None, help="with --task: a seeded sample of N questions")
    p.add_argument("--scores", default="all",
                   help="'all' (default), 'paper' (the paper's 12) or a comma list of score ids")
    p.add_argument("--out", required=True, help="output table, .csv or .parquet")
    p.add_argument("--per-input", action="store_true", help="also save per-input scores (safetensors)")
    p.add_argument("--quiet", action="store_true", help="no progress bar")
    p.set_defaults(func=run, batch_size="auto")  # score: the largest batch that fits (lens_heads.batching)


def run(args) -> int:

    # everything that can be checked without the model, before it loads
    out = Path(args.out)
    if out.suffix.lower() not in (".csv", ".parquet"):
        raise LensHeadsError(f"--out must end in .csv or .parquet, got {args.out!r}")
    check_output_file(out, sidecars=HeadScores.sidecars(out))
    check_positive(args, "max_len", minimum=2)
    check_positive(args, "n_inputs", "batch_size")
    on_task = question_level([s.strip() for s in args.scores.split(",")])
    if on_task:
        return run_on_task(args, out, resolve_score_ids(args.scores, task_level=True))
    if args.task is not None:
        raise LensHeadsError("--task goes with a question-level score alone (input-level scores are read on --data)")
    if args.data is None:
        raise LensHeadsError("give --data (a corpus the scores are read on)")
    ids = resolve_score_ids(args.scores)
    texts = load_texts(args.data, n=args.n_inputs)
    if not texts:
        raise no_texts(args.data)
    model = model_from_args(args)
    seqs = tokenize_texts(model.tokenizer, texts, args.max_len, mode="documents")
    scores = scoring.score_heads(model, seqs, scores=ids, batch_size=args.batch_size, max_len=args.max_len,
                         keep_per_input=args.per_input, progress=not args.quiet, data=args.data)
    scores.save(out)
    print(f"wrote {out} ({len(ids)} score functions x {scores.n_layers * scores.n_heads} heads, "
          f"{scores.n} inputs)")
    return 0


def run_on_task(args, out, ids: list[str]) -> int:
    """A question-level score on a task's questions (its registry entry's ``on_task``)."""

    if len(ids) != 1:
        raise LensHeadsError(f"--scores {args.scores}: a question-level score ({', '.join(question_level(ids))}) "
                             f"is scored on a task on its own; give it alone")
    sid = ids[0]
    if args.task is None:
        raise LensHeadsError(f"--scores {sid} needs --task (the gold answers it is computed on)")
    check_positive(args, "limit")
    task = load_task(args.task)
    model = model_from_args(args)
    scores = SCORES[sid].on_task(model, task, None, args.limit, progress=not args.quiet)
    scores.save(out)
    print(f"wrote {out} ({sid} x {scores.n_layers * scores.n_heads} heads, {scores.n} questions of {task.name})")
    return 0
