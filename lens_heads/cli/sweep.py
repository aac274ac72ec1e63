"""``lens-heads sweep MODEL --task TASK --scores IDS --out DIR``: accuracy vs % heads zeroed.

Writes ``DIR/summary.csv`` (one row per point), ``DIR/within_1pt.csv`` (per function: largest
% zeroed within 1 point of the unablated accuracy, normalised AUC, intervals) and the
per-point results under ``DIR/points`` / ``DIR/thresholds``. Rerunning the same command
resumes: only missing points are computed. Every argument is checked (task loaded, model
loaded, ablation specs parsed) before anything is written.
"""

from __future__ import annotations

import dataclasses

from lens_heads.data.tasks import DEFAULT_SEED
from lens_heads.cli.common import (add_model_args, add_protocol_args, check_positive, check_protocol_args,
                                   config_geometry, model_from_args, protocol_from_args)
from lens_heads.interventions.ablation import parse_ablation
from lens_heads.data import load_task
from lens_heads.errors import LensHeadsError
from lens_heads.scores import resolve_score_ids
from lens_heads.results.store import ResultStore
from lens_heads.viz.study import ModelRef
from lens_heads.sweep import SweepConfig, run_sweep, tabulate
from lens_heads.sweep.executors import LocalConfig, RayConfig, SlurmConfig, in_process_message, in_process_only
from lens_heads.sweep.result import check_same_weights
from lens_heads.sweep.run import check_one_weights
from lens_heads.interventions.thresholds import parse_fractions
from lens_heads.files.atomic import check_output_dir
from lens_heads.evaluation.protocol import load_authors_thresholds, thresholds_for_sweep
from lens_heads.sweep.executors import check_ray_address
from lens_heads.sweep import run as sweep_run
from lens_heads.sweep import executors
from lens_heads.sweep.executors import job_for
from lens_heads.sweep.adaptive import CONSTANT, PENDING, SearchConfig, run_search, search_config, tabulate_search
from lens_heads.sweep.ledger import Ledger
from lens_heads.forward.task_requests import select_records


def register(sub) -> None:
    p = sub.add_parser("sweep", help="accuracy vs %% of heads zeroed, per score function and for random heads")
    add_model_args(p)
    p.add_argument("--task", required=True, help="mmlu, piqa, winogrande, file:PATH?... (a local MC file), "
                                                 "lm-eval:NAME or an lm-eval task YAML")
    p.add_argument("--include-path", default=None, help="a folder of lm-eval task YAMLs (lm_eval --include_path)")
    p.add_argument("--scores", default="paper",
                   help="score ids, comma-separated, or 'paper' (the paper's 12, default) / 'all'; "
                        "'' for random heads only")
    p.add_argument("--fractions", default="0,0.05,0.1,0.15,0.2,0.25,0.3",
                   help="target fractions of heads to zero, in [0, 1] (default 0,0.05,...,0.3)")
    p.add_argument("--random-seeds", type=int, default=3, help="random-head seeds 0..N-1 (default 3)")
    p.add_argument("--static", default="",
                   help="static curves too: comma list of score ids (question-level ones too) or random; at each fraction p the "
                        "ceil(p x heads) least active heads by the dataset-level score, zeroed on every input "
                        "(random: a seeded random order per --random-seeds seed)")
    p.add_argument("--ablate", action="append", default=[], metavar="SPEC",
                   help="an extra fixed ablation to evaluate: static:L.H,L.H | score:ID@TAU | random:P@SEED "
                        "(repeatable)")
    p.add_argument("--limit", type=int, default=None,
                   help="evaluate a seeded stratified sample of N questions (default all)")
    p.add_argument("--chunk-questions", type=int, default=250,
                   help="questions per stored part of a point: a killed run loses at most one part (default 250)")
    p.add_argument("--n-shot", type=int, default=None, help="few-shot examples (default: the task's)")
    p.add_argument("--seed", type=int, default=DEFAULT_SEED, help=f"few-shot sampling seed (default {DEFAULT_SEED}, lm-eval's)")
    p.add_argument("--batch-size", default="auto",
                   help="rows per forward, or auto (default: the largest that fits, lens_heads.batching)")
    p.add_argument("--n-boot", type=int, default=1000, help="bootstrap resamples (default 1000)")
    p.add_argument("--first", default="",
                   help="points to evaluate right after the baseline, comma-separated: ID@FRACTION or "
                        "random@FRACTION@SEED (e.g. ahon_ln@0.1,random@0.1@0); the rest follow in the usual order")
    p.add_argument("--out", required=True, help="output folder (created; reused to resume)")
    p.add_argument("--no-progress", action="store_true")
    p.add_argument("--status", action="store_true",
                   help="compute nothing: print what --out already holds for this sweep (while it runs "
                        "elsewhere, or after it stopped): points stored, the complete curves' values; with "
                        "--search crossing each curve's crossing, or the probe it is in")
    p.add_argument("--ablate-with", default="zero",
                   help="what ablated heads become: zero (default), mean:CORPUS[@N] (their mean output over the "
                        "first N texts of CORPUS), resample:CORPUS@SEED[@N] (another input's output)")
    a = p.add_argument_group("adaptive search (docs/methods.md §13): each curve's crossing by bisection, every probe "
                             "stopped as soon as a confidence sequence decides it")
    a.add_argument("--search", choices=("grid", "crossing"), default="grid",
                   help="grid (default): every --fractions point on every question; crossing: the largest %% of "
                        "heads within --margin of the unablated accuracy, searched on a grid of --resolution up "
                        "to the largest --fractions value, each probe on as few questions as decide it")
    # (no argparse defaults: SearchConfig holds them, and a setting given without --search crossing is an error)
    a.add_argument("--margin", type=float, help="crossing: accuracy points (default 1)")
    a.add_argument("--alpha", type=float, help="crossing: the chance a curve's reported crossing is wrong (default 0.05)")
    a.add_argument("--resolution", type=float, help="crossing: %% of heads between probes (default 1)")
    a.add_argument("--search-batch", type=int, help="crossing: questions per sequential step (default 64)")
    a.add_argument("--order-seed", type=int, help="crossing: seed of the questions' random order (default 0)")
    a.add_argument("--max-items", type=int,
                   help="crossing: at most this many questions per probe (default all: every probe decides); a "
                        "probe still undecided there is reported unresolved")
    a.add_argument("--time-limit", type=float, default=None, metavar="MINUTES",
                   help="crossing: evaluate no batch after this many minutes; the curves not finished are left "
                        "for a rerun, which resumes them (nothing evaluated is lost)")
    a.add_argument("--ledger", default=None, metavar="FILE",
                   help="crossing: a compact record of every item's result (docs/methods.md §13), read if it "
                        "exists and written back when the run ends or stops: small enough to commit, and a "
                        "search on a machine without the store resumes from it")
    g = p.add_argument_group("scale-out (docs/methods.md §8; the store in --out is the only coordination)")
    g.add_argument("--executor", choices=("local", "ray", "slurm"), default="local",
                   help="where the units run: this machine (default: this process, or --workers processes), "
                        "a Ray cluster, a Slurm job array")
    g.add_argument("--workers", type=int, default=None,
                   help="local (also without --executor): N worker processes on this machine, one model load "
                        "each (default: this process alone); ray: actors; slurm: array tasks per phase "
                        "(default 2)")
    g.add_argument("--cpus-per-worker", type=int, default=1, help="CPUs (and torch threads) per worker (default 1)")
    g.add_argument("--ray-address", default=None,
                   help="an existing Ray cluster (auto, ray://HOST:PORT); default: RAY_ADDRESS if set (as ray.init), else start a local one")
    g.add_argument("--gpus-per-worker", type=float, default=0.0, help="ray: GPUs per actor (default 0)")
    g.add_argument("--slurm-partition", default=None)
    g.add_argument("--slurm-time", type=int, default=60, help="minutes per array task (default 60)")
    g.add_argument("--gpus-per-task", type=int, default=0, help="slurm: GPUs per array task (default 0)")
    g.add_argument("--array-parallelism", type=int, default=256, help="slurm: array tasks running at once")
    g.add_argument("--slurm-retries", type=int, default=2, help="slurm: resubmissions of a failed task (default 2)")
    g.add_argument("--shard", default=None, metavar="I/N",
                   help="local: start with every N-th unit from I (one process per GPU, by hand); then help "
                        "with what no live process holds; the last to finish writes the tables")
    g.add_argument("--score-shards", type=int, default=None,
                   help="shards of the thresholds' scoring pass (default: the workers, N of --shard, else 1)")
    add_protocol_args(p)
    p.set_defaults(func=run)


def parse_shard(text: str) -> tuple[int, int]:
    """``I/N`` (0 <= I < N) -> (I, N)."""

    i, _, n = text.partition("/")
    if not (i.strip().isdigit() and n.strip().isdigit()) or not 0 <= int(i) < int(n):
        raise LensHeadsError(f"--shard {text!r}: write I/N with 0 <= I < N (e.g. 0/2 and 1/2)")
    return int(i), int(n)


DEFAULT_WORKERS = 2  # ray actors / slurm array tasks when --workers is not given


def _executor_config(args):
    """(name, config, n_shards) of the executor the arguments ask for; None for a plain local run
    (this process). ``--workers N`` (N > 1) without ``--executor`` is the local executor with N
    worker processes."""

    if args.executor == "local":
        if args.shard is not None:
            shard = parse_shard(args.shard)
            return "local", LocalConfig(shard), args.score_shards or shard[1]
        if (args.workers or 1) > 1:
            return "local", LocalConfig(processes=args.workers, threads=args.cpus_per_worker), \
                args.score_shards or args.workers
        return None
    workers = args.workers or DEFAULT_WORKERS
    if args.executor == "ray":
        return "ray", RayConfig(args.ray_address, workers, args.cpus_per_worker, args.gpus_per_worker), \
            args.score_shards or workers
    return "slurm", SlurmConfig(workers, args.slurm_partition, args.slurm_time, args.cpus_per_worker,
                                args.gpus_per_task, args.array_parallelism, args.slurm_retries), \
        args.score_shards or workers



def run(args) -> int:

    # cheap checks first, then the task, then the model; nothing is written until all pass
    fractions = parse_fractions(args.fractions)
    score_ids = resolve_score_ids(args.scores, task_level=True) if args.scores.strip() else []
    if args.random_seeds < 0:
        raise LensHeadsError(f"--random-seeds must be >= 0, got {args.random_seeds}")
    cfg = SweepConfig(task=args.task, score_ids=score_ids, fractions=fractions,
                      random_seeds=list(range(args.random_seeds)), n_shot=args.n_shot, limit=args.limit,
                      seed=args.seed, batch_size=args.batch_size, extra_ablations=list(args.ablate),
                      n_boot=args.n_boot, chunk_questions=args.chunk_questions,
                      first=[f.strip() for f in args.first.split(",") if f.strip()], replacement=args.ablate_with,
                      static_ids=[s.strip() for s in args.static.split(",") if s.strip()])
    cfg.validate()
    if cfg.replacement is not None:
        cfg.replacement.check()  # the reference corpus exists and has texts
    check_protocol_args(args)
    if args.n_boot < 1:
        raise LensHeadsError(f"--n-boot must be >= 1, got {args.n_boot}")
    if not score_ids and not cfg.random_seeds and not cfg.extra_ablations and not cfg.static_ids:
        raise LensHeadsError("nothing to sweep: give --scores, --static, --random-seeds > 0 or --ablate")
    geometry = config_geometry(args) if cfg.extra_ablations else None
    for spec in cfg.extra_labels:
        parse_ablation(spec, geometry)  # syntax, score names and head ranges (from the config), before loading
    check_positive(args, "workers", "cpus_per_worker", "slurm_time", "array_parallelism", "score_shards")
    check_positive(args, "slurm_retries", "gpus_per_task", minimum=0)
    if args.gpus_per_worker < 0:
        raise LensHeadsError(f"--gpus-per-worker must be >= 0, got {args.gpus_per_worker}")

    if args.shard is not None and args.executor != "local":
        raise LensHeadsError("--shard is for launching local processes by hand; ray and slurm split the units "
                             "themselves (--workers)")
    if args.shard is not None and args.workers is not None:
        raise LensHeadsError("--shard launches one process by hand, --workers N launches N local processes: "
                             "give one of them")
    if args.status and (args.executor != "local" or args.shard is not None or args.workers is not None):
        raise LensHeadsError("--status reads the store: give it without --executor / --shard / --workers")
    if args.ray_address is not None and args.executor != "ray":
        raise LensHeadsError("--ray-address goes with --executor ray")
    search = search_from_args(args)
    if search is not None and args.ablate:
        raise LensHeadsError("--search crossing searches curves; --ablate points have none (run them as a grid sweep)")
    if search is not None:
        search.grid(max(cfg.fractions))  # a range that holds a step: checked before anything loads
    for name in ("time_limit", "ledger"):
        if getattr(args, name) is not None and search is None:
            raise LensHeadsError(f"--{name.replace('_', '-')} goes with --search crossing")
    if args.time_limit is not None and not args.time_limit > 0:
        raise LensHeadsError(f"--time-limit must be > 0 minutes, got {args.time_limit:g}")
    scale = _executor_config(args) if search is None or args.shard is None else None  # a shard searches here
    if scale is not None and search is not None and (args.time_limit is not None or args.ledger is not None):
        raise LensHeadsError("--time-limit and --ledger run in this process (or one --shard); the executors' "
                             "workers take neither")
    if in_process_only(cfg) and scale is not None:
        raise LensHeadsError(in_process_message(in_process_only(cfg)))
    if scale is not None and (args.thresholds_file is not None or args.paper_protocol):
        raise LensHeadsError("--thresholds-file and --paper-protocol run with the local executor only, for now")
    if scale is not None and scale[0] == "slurm":
        import shutil

        if shutil.which("sbatch") is None:
            raise LensHeadsError("--executor slurm: no Slurm on this machine (sbatch not found); launch on a Slurm "
                                 "login node, or use --executor local / ray")
    if scale is not None and scale[0] == "ray":
        try:
            import ray  # noqa: F401
        except ImportError:
            raise LensHeadsError("--executor ray needs Ray: pip install 'lens_heads[ray]'") from None

        check_ray_address(args.ray_address)  # an address nobody answers at: now, not after planning
    from pathlib import Path

    if args.status:
        if not Path(args.out).is_dir():
            raise LensHeadsError(f"{args.out} holds no baseline (or no thresholds) of this sweep: it is "
                                 f"{'not a folder' if Path(args.out).exists() else 'no folder'} (give the --out "
                                 f"of the sweep to look at)")
    else:

        check_output_dir(args.out)
        if Path(args.model).is_dir() and Path(args.out).resolve() == Path(args.model).resolve():
            raise LensHeadsError(f"--out {args.out} is the model's own folder; give another folder")
    task = load_task(args.task, n_shot=args.n_shot, include_path=args.include_path)
    task.check_fewshot(args.n_shot, args.seed)
    if args.thresholds_file is not None and score_ids:

        thresholds_for_sweep(load_authors_thresholds(args.thresholds_file, task.name, args.thresholds_model),
                             score_ids, fractions, args.thresholds_file)  # fail before the model loads
    if scale is not None:
        return run_scaled(args, cfg, scale, search)
    if args.status:
        return show_status(args, cfg, task) if search is None else show_search_status(args, cfg, task, search)
    check_weights_before_load(args, cfg, task)
    model = model_from_args(args)
    for spec in cfg.extra_labels:
        parse_ablation(spec, model.geometry)
    cfg = dataclasses.replace(cfg, protocol=protocol_from_args(args, model), thresholds_file=args.thresholds_file,
                              thresholds_model=args.thresholds_model)
    if cfg.protocol.key():
        print(f"protocol: {cfg.protocol}")

    if search is not None:
        shard = parse_shard(args.shard) if args.shard is not None else None
        found = run_search(model, cfg, search, args.out, task=task, progress=not args.no_progress, shard=shard,
                           ledger=args.ledger,
                           time_limit=None if args.time_limit is None else 60.0 * args.time_limit)
        return report_search(args, found)
    result = run_sweep(model, cfg, args.out, task=task, progress=not args.no_progress)
    return report(args, result)


SEARCH_OPTIONS = (("margin", "margin"), ("alpha", "alpha"), ("resolution", "resolution"), ("search_batch", "batch"),
                  ("order_seed", "order_seed"), ("max_items", "max_items"))  # (argument, SearchConfig field)


def search_from_args(args) -> SearchConfig | None:
    """The ``--search crossing`` settings (checked before anything loads); None for a grid sweep."""
    given = {(name, field): getattr(args, name) for name, field in SEARCH_OPTIONS if getattr(args, name) is not None}
    if args.search == "grid":
        if given:
            raise LensHeadsError(f"--{next(iter(given))[0].replace('_', '-')} goes with --search crossing")
        return None
    percent = ("margin", "resolution")  # points and % on the command line, fractions in the config
    return SearchConfig(**{field: v / 100 if field in percent else v for (_, field), v in given.items()})


def report_search(args, found, status: bool = False) -> int:
    """Print an adaptive search's crossings (``status``: read from the store by ``--status``, with
    the curves still running as far as they have got)."""
    for _, row in found.within.iterrows():
        if row["crossing_status"] == PENDING:  # a replay of a search still running (or stopped)
            if not row["item_evaluations"]:
                print(f"  {row['score_fn']:<12} not started")
                continue
            last = found.probes[found.probes.score_fn == row["score_fn"]].iloc[-1]  # the probe it is in
            print(f"  {row['score_fn']:<12} running: the probe at {last.pct:g} % has read {last.n_items} of "
                  f"{row['n_population']} questions, Δ in [{100 * last.delta_lo:+.2f}, {100 * last.delta_hi:+.2f}] pt "
                  f"({row['n_probes']} probes so far: {row['probes']})")
            continue
        if row["crossing_status"] == CONSTANT:
            probe = found.probes[found.probes.score_fn == row["score_fn"]].iloc[-1]  # its one probe
            print(f"  {row['score_fn']:<12} no crossing: every fraction of the range is the same ablation (its "
                  f"scores tie there; it zeroes {probe.pct_zeroed:.2f} % of the units; Δ in "
                  f"[{100 * probe.delta_lo:+.2f}, {100 * probe.delta_hi:+.2f}] pt, {probe.decision} after "
                  f"{probe.n_items} items)")
            continue
        where = ("unresolved between {:g} and {:g} %".format(row["bracket_low_pct"], row["bracket_high_pct"])
                 if row["crossing_status"] == "unresolved" else
                 f"{row['crossing_pct']:g} %" + (" or more (the range's end)" if row["crossing_status"] == "lower bound"
                                                  else ""))
        flag = f"  NOT MONOTONE: {row['monotone_violation']}" if isinstance(row["monotone_violation"], str) and \
            row["monotone_violation"] else ""
        print(f"  {row['score_fn']:<12} within {row['margin_pts']:g} point up to {where}  "
              f"({row['n_probes']} probes: {row['probes']}){flag}")
    if status:
        decided = int((found.within.crossing_status != PENDING).sum())
        print(f"{decided} of {len(found.within)} curves decided (read from {args.out}; nothing computed)")
        if found.complete:
            print("every curve is decided: run without --status to write the search's tables")
        return 0
    print((f"{found.new_items} question evaluations in this process, " if found.new_items is not None else "")
          + f"{found.seconds:.1f} s")
    if getattr(args, "ledger", None) is not None:
        print(f"ledger: {args.ledger}")
    if getattr(found, "stopped", False):
        print(f"stopped at the time limit with {len(found.outcomes)} curve(s) done: rerun the same command to "
              f"resume (nothing evaluated is lost)")
    elif found.complete:
        print(f"wrote {args.out}/within_1pt.csv and {args.out}/probes.csv")
    else:
        print("other shards' curves are still running: the last shard to finish writes the tables")
    return 0


def check_weights_before_load(args, cfg, task) -> None:
    """A folder holding this sweep from other weights is refused from the weights' digest, before
    they load (the launcher does the same; ``run_sweep`` checks again with the loaded model)."""
    from pathlib import Path


    out = Path(args.out)
    if not out.is_dir() or not any(out.iterdir()):
        return  # nothing to compare with (and no weights hashed twice)
    ref = ModelRef(args.model, args.dtype, args.device, revision=args.revision)
    if args.paper_protocol:  # the protocol depends on the model: the tables' digest alone
        check_same_weights(out, ref.digest)
        return
    check_one_weights(ResultStore(out), ref.identity(dataclasses.replace(cfg, protocol=protocol_from_args(args, None)),
                                                     task))


def show_status(args, cfg, task) -> int:
    """What ``--out`` holds of this sweep, read from the store alone (whatever executor or
    processes fill it): units and points stored, the complete curves. No weights are loaded
    (but for ``--paper-protocol``, whose settings depend on the model)."""
    ref = ModelRef(args.model, args.dtype, args.device, revision=args.revision)
    cfg = dataclasses.replace(cfg, protocol=protocol_from_args(args, ref.model if args.paper_protocol else None),
                              thresholds_file=args.thresholds_file, thresholds_model=args.thresholds_model)
    identity = ref.identity(cfg, task)
    result = tabulate(args.out, identity, cfg, task, partial=True, model=args.model)
    if result is None:
        raise LensHeadsError(f"{args.out} holds no baseline (or no thresholds) of this sweep yet: "
                             "nothing to show (same model, task and settings as the run?)")
    plan = sweep_run.stored_plan(ResultStore(args.out), identity, cfg, task)  # the plan the launch built its units from
    store = ResultStore(args.out)
    done = [store.has(u.key) or store.has(u.point) for u in plan.all_units]
    print(f"{sum(done)} of {len(done)} units and {result.n_stored} of {result.n_points} points stored")
    for spec in plan.order:
        parts = [store.has(u.key) for u in plan.parts(spec)]
        if any(parts) and not store.has(plan.point_key(spec)):
            print(f"  running: {spec}: {sum(parts)} of {len(parts)} parts stored")
    return report(args, result)


def show_search_status(args, cfg, task, search: SearchConfig) -> int:
    """What ``--out`` (and ``--ledger``) hold of this adaptive search, replayed from the store
    alone (whatever processes fill it): each curve decided, running (its probes so far, the one it
    is in with its interval) or not started. No weights are loaded (but for ``--paper-protocol``)."""
    from pathlib import Path

    ref = ModelRef(args.model, args.dtype, args.device, revision=args.revision)
    cfg = dataclasses.replace(cfg, protocol=protocol_from_args(args, ref.model if args.paper_protocol else None),
                              thresholds_file=args.thresholds_file, thresholds_model=args.thresholds_model)
    gcfg, grid = search_config(cfg, search)
    ledger = None
    if args.ledger is not None and Path(args.ledger).is_file():
        ledger = Ledger.load(args.ledger, [r.doc_id for r in select_records(task, cfg.limit, cfg.seed)])
    found = tabulate_search(args.out, ref.identity(gcfg, task), gcfg, None, search, grid, task=task, ledger=ledger,
                            pending=True, costs=True)
    if found is None:
        raise LensHeadsError(f"{args.out} holds no thresholds of this search yet: nothing to show (same model, task "
                             f"and settings as the run, --resolution and the largest --fractions included?)")
    return report_search(args, found, status=True)


def run_scaled(args, cfg, scale, search: SearchConfig | None = None) -> int:
    """The sweep on an executor (or as one --shard): planned, merged and tabulated here with no
    weights loaded; the workers load the model. ``search``: an adaptive search, one unit per curve."""
    name, config, n_shards = scale
    cfg = dataclasses.replace(cfg, protocol=protocol_from_args(args, None))
    if args.device_map is not None:
        raise LensHeadsError("--device-map with --executor / --shard: give each worker its devices instead "
                             "(--gpus-per-worker, CUDA_VISIBLE_DEVICES)")
    if search is not None:
        cfg = search_config(cfg, search)[0]
    job = job_for(args.model, args.dtype, args.device, cfg, args.out, args.include_path, n_shards, args.revision,
                  args.attention, search)
    out = executors.launch(job, name, config, progress=not args.no_progress)
    if search is not None:
        return report_search(args, out.result)
    computed = getattr(out.session, "computed", None)
    by_pid = getattr(out.session, "by_pid", None)
    print(f"{out.n_units} part units ({out.n_stored_before} stored before this launch)"
          + (f"; this process computed {computed} units" if computed is not None else "")
          + (f"; {len(by_pid)} worker processes computed {sum(by_pid.values())} units" if by_pid else "")
          + f", {out.seconds:.1f} s")
    return report(args, out.result)


def report(args, result) -> int:
    """Print a sweep's result (complete, or what a store holds so far)."""
    base = result.summary.loc[result.summary["spec"] == "none", "accuracy"].iloc[0]
    print(f"baseline accuracy {base:.4f} on {result.summary['n_questions'].iloc[0]} questions")
    if not result.complete:
        print("complete curves so far (within-1-point values are final; AUCs wait for every curve):")
    for _, row in result.within.iterrows():
        if row["note"]:
            print(f"  {row['score_fn']:<12} {row['note']}")
            continue
        auc = f"  AUC {row['auc']:.4f}" if result.complete else ""
        print(f"  {row['score_fn']:<12} within 1 point up to {row['max_pct_zeroed_within_1pt']:6.2f} % zeroed "
              f"[{row['ci_low']:.2f}, {row['ci_high']:.2f}]{auc}")
    if not result.complete:
        single = result.summary[~result.summary["in_curve"]]
        if len(single):
            print("points of curves not complete yet (change against the baseline, 95% paired CI, in points):")
        for _, row in single.drop_duplicates("spec").iterrows():
            print(f"  {row['spec']:<32} {row['pct_zeroed']:6.2f} % zeroed  accuracy {row['accuracy']:.4f}  "
                  f"{100 * row['delta']:+.1f} [{100 * row['delta_ci_low']:+.1f}, {100 * row['delta_ci_high']:+.1f}]")
    if result.complete and not args.status:
        print(f"wrote {args.out}/summary.csv and {args.out}/within_1pt.csv")
    elif result.complete:
        print("every point is stored: the sweep is complete (run without --status to write its tables)")
    return 0
