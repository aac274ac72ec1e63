"""``lens-heads lm-eval MODEL --tasks arc_easy,hellaswag --out DIR``: lm-evaluation-harness itself
runs the tasks, on lens_heads' model (``LensHeadsLM``), optionally with heads ablated.

Writes ``DIR/results.json`` (what ``lm_eval.simple_evaluate`` returns, less the samples, as
lm-eval's own ``--output_path`` writes it) and ``DIR/samples_TASK.jsonl`` per task (lm-eval's
``--log_samples`` format), all or nothing (``atomic_write_all``). Every argument -- the
ablation spec, the output folder, ``--include-path``, the task names and their datasets -- is
checked before the model loads; nothing is written unless the whole run succeeds.
"""

from __future__ import annotations

from lens_heads.cli.common import add_model_args, check_positive, config_geometry, model_from_args
from lens_heads.interventions.ablation import parse_ablation
from lens_heads.files.atomic import atomic_write_all, check_output_dir
from lens_heads.data.lm_eval_tasks import build_error, check_answers, check_metric_names, check_metrics, lm_eval_silenced, quiet_lm_eval, unknown_task, yaml_relative_files
from lens_heads.errors import LensHeadsError
from lens_heads.interventions.specs import parse_spec


def register(sub) -> None:
    p = sub.add_parser("lm-eval", help="run lm-evaluation-harness tasks on the model, optionally with heads ablated")
    add_model_args(p)
    p.add_argument("--tasks", required=True,
                   help="lm-eval task, group or tag names (or task YAML paths), comma-separated, "
                        "e.g. arc_easy,hellaswag; glob patterns as lm-eval's")
    p.add_argument("--ablate", default=None,
                   help="static:L.H,L.H | score:ID@THRESHOLD[:strict] | random:P@SEED | none (default none)")
    p.add_argument("--num-fewshot", type=int, default=None, help="few-shot examples (default: each task's)")
    p.add_argument("--limit", type=int, default=None, help="the first N documents of each task (lm-eval --limit)")
    p.add_argument("--include-path", default=None, help="a folder of extra task YAMLs (lm-eval --include_path)")
    p.add_argument("--batch-size", type=int, default=16)
    p.add_argument("--out", required=True, help="output folder for results.json and samples_TASK.jsonl (created; "
                                                "one holding an earlier run's is refused)")
    p.add_argument("--quiet", action="store_true", help="no progress bars")
    p.set_defaults(func=run)


def _task_manager(include_path):
    from pathlib import Path


    if include_path is not None and not Path(include_path).is_dir():
        raise LensHeadsError(f"--include-path {include_path}: no such folder")
    quiet_lm_eval()
    return yaml_relative_files(new_task_manager(str(include_path) if include_path is not None else None))


def new_task_manager(include_path: str | None):
    """lm-eval's ``TaskManager`` over its own tasks and ``include_path`` (indexing every task
    YAML takes seconds: tests substitute a shared one here)."""
    from lm_eval.tasks import TaskManager

    return TaskManager(include_path=include_path)


def resolve_tasks(manager, spec: str) -> list[str]:
    """The names in ``--tasks``, glob patterns expanded; one error for the first unknown one."""
    from pathlib import Path


    names = [n.strip() for n in spec.split(",") if n.strip()]
    if not names:
        raise LensHeadsError("--tasks is empty: give lm-eval task names, e.g. arc_easy,hellaswag")
    out: list[str] = []
    for name in names:
        if name in manager.all_tasks or (Path(name).suffix in (".yaml", ".yml") and Path(name).is_file()):
            found = [name]
        elif any(c in name for c in "*?["):
            found = manager.match_tasks([name])
        else:
            found = []
        if not found:
            raise unknown_task(manager, name)
        out.extend(n for n in sorted(found) if n not in out)
    return out


def build_tasks(manager, names: list[str], limit: int | None = None) -> list:
    """lm-eval's task / group objects for ``names`` (their datasets loaded): what
    ``simple_evaluate`` would build, built before the model so that a missing dataset, an answer
    outside its row's choices (in the first ``limit`` rows) or a metric option the metric does not
    take fails early."""
    import datasets


    built = []
    bars = datasets.is_progress_bar_enabled()
    datasets.disable_progress_bars()  # a check: the run's own output starts with the evaluation
    try:
        for name in names:
            try:
                with lm_eval_silenced():
                    loaded = manager.load([name])
            except Exception as exc:  # lm-eval raises many kinds for a dataset it cannot load offline
                raise build_error(name, exc) from None
            for task_name, task in loaded["tasks"].items():
                check_metric_names(task, task_name)
                check_answers(task, task_name, limit)
                check_metrics(task, task_name)
            if name in loaded["groups"]:
                built.append(loaded["groups"][name])
            else:
                built.extend(loaded["tasks"].values())  # a task (or a YAML path), or a tag's tasks
    finally:
        if bars:
            datasets.enable_progress_bars()
    return built


def git_commit_hash() -> str | None:
    """lm-eval's ``get_git_commit_hash`` (the current folder's ``git describe --always``, else
    the commit its .git names), with git's stderr silenced: lm-eval leaves it on the terminal,
    which prints "fatal: not a git repository" outside one."""
    import os
    import subprocess

    from lm_eval.loggers.utils import get_commit_from_path

    try:
        return subprocess.check_output(["git", "describe", "--always"], stderr=subprocess.DEVNULL).strip().decode()
    except (subprocess.CalledProcessError, FileNotFoundError):
        return get_commit_from_path(os.getcwd())


def _sample_lines(samples: list[dict]) -> str:
    """lm-eval's ``--log_samples`` lines (``EvaluationTracker.save_results_samples``)."""
    import json

    from lm_eval.utils import handle_non_serializable, sanitize_list

    lines = []
    for sample in samples:
        sample = dict(sample)
        sample["arguments"] = {f"gen_args_{i}": {f"arg_{j}": a for j, a in enumerate(arg)}
                               for i, arg in enumerate(sample["arguments"])}
        sample["resps"] = sanitize_list(sample["resps"])
        sample["filtered_resps"] = sanitize_list(sample["filtered_resps"])
        sample["target"] = str(sample["target"])
        lines.append(json.dumps(sample, default=handle_non_serializable, ensure_ascii=False) + "\n")
    return "".join(lines)


def run(args) -> int:
    import contextlib
    import json
    import os
    from pathlib import Path


    # everything that can be checked without the model, before it loads
    check_positive(args, "limit", "batch_size")
    check_positive(args, "num_fewshot", minimum=0)
    if args.ablate is not None:
        typed = parse_spec(args.ablate)  # the one spec grammar
        if typed.needs_calibration:
            raise LensHeadsError(f"--ablate {args.ablate.strip()}: a percentage needs a threshold calibrated on "
                                 f"inputs; give score:ID@THRESHOLD (lens-heads evaluate --ablate "
                                 f"{args.ablate.strip()} prints the threshold it takes)")
        if parse_ablation(args.ablate, config_geometry(args)).needs_task:  # syntax, names, head ranges
            from lens_heads.evaluation.lm_eval_model import NEEDS_TASK  # lm-eval is optional: imported when used

            raise LensHeadsError(f"--ablate {args.ablate.strip()}: {NEEDS_TASK}")
    out = Path(args.out)
    check_output_dir(out)
    earlier = sorted(p.name for p in out.glob("*") if p.name == "results.json" or p.name.startswith("samples_")) \
        if out.is_dir() else []
    if earlier:
        raise LensHeadsError(f"--out {out} already holds an earlier run ({', '.join(earlier[:2])}"
                             f"{', ...' if len(earlier) > 2 else ''}): give a new or empty folder")
    try:
        import lm_eval  # noqa: F401
    except ImportError:
        raise LensHeadsError("lens-heads lm-eval needs lm-evaluation-harness: pip install 'lens_heads[lm-eval]'") from None
    manager = _task_manager(args.include_path)
    names = resolve_tasks(manager, args.tasks)
    tasks = build_tasks(manager, names, args.limit)

    from unittest import mock

    import lm_eval.evaluator
    from lm_eval import simple_evaluate
    from lm_eval.utils import handle_non_serializable, make_table

    from lens_heads.evaluation.lm_eval_model import LensHeadsLM  # lm-eval is optional: imported when used

    model = model_from_args(args)
    lm = LensHeadsLM(model, ablation=args.ablate, batch_size=args.batch_size, progress=not args.quiet)
    # lm-eval has no option to skip or quiet its provenance call: its function is swapped for this
    # call only (restored on exit, also on error); it goes once lm-eval's get_git_commit_hash
    # passes stderr=DEVNULL to its git subprocess.
    with mock.patch.object(lm_eval.evaluator, "get_git_commit_hash", git_commit_hash):
        res = simple_evaluate(model=lm, tasks=tasks, num_fewshot=args.num_fewshot, limit=args.limit,
                              task_manager=manager, log_samples=True)
    if res is None:  # not rank 0: nothing to write
        return 0
    samples = res.pop("samples", {}) or {}
    res.setdefault("config", {})["lens_heads"] = {"model": args.model, "ablation": lm.ablation_spec,
                                                  "zeroed_fraction": lm.zeroed_fraction, "tasks": names}
    text = json.dumps(res, indent=2, default=handle_non_serializable, ensure_ascii=False)
    files = {out / "results.json": text}
    for task, rows in samples.items():
        files[out / f"samples_{str(task).replace('/', '__')}.jsonl"] = _sample_lines(rows)

    def writer(content: str):
        def write(tmp: str) -> None:
            with open(tmp, "w", encoding="utf-8", newline="") as f:
                f.write(content)
                f.flush()
                os.fsync(f.fileno())
        return write

    created = not out.exists()
    out.mkdir(parents=True, exist_ok=True)
    try:
        atomic_write_all([(path, writer(content)) for path, content in files.items()])
    except BaseException:
        if created:
            with contextlib.suppress(OSError):
                out.rmdir()  # only if still empty
        raise
    print(make_table(res))
    if lm.ablation is not None:
        print(f"ablation {lm.ablation_spec}: zeroed {100 * lm.zeroed_fraction:.2f}% of (input, layer, head)")
    print(f"wrote {out / 'results.json'} and {len(files) - 1} samples file(s) to {out}")
    return 0
