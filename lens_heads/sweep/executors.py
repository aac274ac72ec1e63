"""Where a sweep's units run, and the launcher around them (docs/methods.md §8).

``launch(job, executor)`` plans the sweep with no model (the weights' digest and dtype identify
it), has the executor run the missing scoring shards, merges them into the thresholds, has it
run the missing part units, merges parts into points and writes the tables -- loading no
weights itself. The store is the only coordination: units are idempotent and claimed
(``lens_heads.files.claims``), so workers that die are replaced or their units taken over, and a
launch that stops resumes from what is stored.

Executors, by name (``EXECUTORS``; each a config dataclass and its class):

* ``local``: one worker in this process; ``shard=(I, N)`` starts with every N-th unit from I
  (launching by hand, e.g. one process per GPU), then helps with what no live process holds;
  ``processes=N`` (N > 1) runs N worker processes on this machine instead, one model load each,
  the I-th starting with every N-th unit from I.
* ``ray``: an actor pool on a Ray cluster (``address``; a local one when None): one model load
  per worker; a worker that dies is restarted and its unit retried (Ray's ``max_restarts`` /
  ``max_task_retries``).
* ``slurm``: a Slurm job array through submitit, one array task per worker, each running its
  share of the units; a preempted or timed-out task requeues itself (submitit's checkpointing),
  a failed one is resubmitted (``retries``). ``cluster="local"`` runs the same array as local
  subprocesses (submitit's local executor; tests).
"""

from __future__ import annotations

import os
import shutil
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Protocol, Sequence

from lens_heads.batching import device_floor
from lens_heads.errors import LensHeadsError
from lens_heads.registry import Registry
from lens_heads.sweep.units import UnitRef, Worker, SweepJob
from lens_heads.data import load_task
from lens_heads.models.load import dtype_name, model_digest, resolve_source, spec_digest
from lens_heads.progress import progress_bar
from lens_heads.scores.functions import SCORES
from lens_heads.results.store import ResultStore
from lens_heads.sweep import run
from lens_heads.sweep.plan import static_key, static_rankings, stored_static
from lens_heads.sweep.records import PointRecord
from lens_heads.sweep.result import SweepResult
from lens_heads.sweep.run import CLAIM_POLL_S, check_sweep
from lens_heads.sweep.stats import tables
from lens_heads.sweep.units import merge_score_shards, shard_key
from lens_heads.sweep.adaptive import curves_of, tabulate_search
from lens_heads.sweep.run import check_one_weights, merge_point, read_thresholds

if TYPE_CHECKING:
    from lens_heads.models.load import LoadedModel

POLL_S = 1.0  # how often the launcher's progress bar reads the store


class Session(Protocol):
    """Workers of one executor for one job: ``run`` returns once every unit given is stored."""

    def run(self, refs: Sequence[UnitRef]) -> None: ...

    def close(self) -> None: ...


# -----------------------------------------------------------------------------
# local (and --shard)


@dataclass
class LocalConfig:
    shard: tuple[int, int] | None = None  # (I, N): start with units I, I+N, ...
    processes: int = 1  # > 1: that many worker processes on this machine (not this process)
    threads: int = 1  # torch threads per worker process (with processes > 1)


def _mine_first(refs: Sequence[UnitRef], i: int, n: int) -> list[UnitRef]:
    """Every n-th unit from i, then the rest (those another process has not stored by then)."""
    mine = list(refs)[i::n]
    taken = set(mine)
    return mine + [r for r in refs if r not in taken]


class LocalSession:
    def __init__(self, job: SweepJob, config: LocalConfig):
        if config.processes > 1 and config.shard is not None:
            raise LensHeadsError("--shard launches one process by hand; --workers N launches N: give one of them")
        self.config, self.pool = config, None
        self.worker = Worker(job) if config.processes <= 1 else None
        self.by_pid: dict[int, int] = {}  # worker process -> units it computed (processes > 1)
        if config.processes > 1:
            import multiprocessing
            from concurrent.futures import ProcessPoolExecutor

            self.pool = ProcessPoolExecutor(config.processes, mp_context=multiprocessing.get_context("spawn"),
                                            initializer=_pool_init, initargs=(_with_threads(job, config.threads),))

    def run(self, refs: Sequence[UnitRef]) -> None:
        refs = list(refs)
        if self.pool is None:
            self.worker.run_all(_mine_first(refs, *self.config.shard) if self.config.shard is not None else refs)
            return
        from concurrent.futures.process import BrokenProcessPool

        n = self.config.processes
        futures = [self.pool.submit(_pool_run, [str(r) for r in _mine_first(refs, i, n)]) for i in range(n)]
        try:
            for f in futures:
                pid, computed = f.result()
                self.by_pid[pid] = self.by_pid.get(pid, 0) + computed
        except BrokenProcessPool:
            raise LensHeadsError("a local worker process died; run the same command again to resume "
                                 "(stored units are kept)") from None

    @property
    def computed(self) -> int | None:
        """Units this process computed (None with worker processes: see ``by_pid``)."""
        return self.worker.computed if self.worker is not None else None

    def close(self) -> None:
        if self.pool is not None:
            self.pool.shutdown(cancel_futures=True)


_POOL_WORKER: Worker | None = None  # the one Worker of a local worker process (one model load)


def _pool_init(job: SweepJob) -> None:
    global _POOL_WORKER
    _POOL_WORKER = Worker(job)


def _pool_run(refs: list[str]) -> tuple[int, int]:
    """In a local worker process: run ``refs`` (``Worker.run_all``); (pid, units computed)."""
    import os

    return os.getpid(), _POOL_WORKER.run_all([UnitRef.parse(r) for r in refs])


# -----------------------------------------------------------------------------
# ray


@dataclass
class RayConfig:
    address: str | None = None  # "auto", "ray://host:10001", ...; None: start a local cluster
    workers: int = 2
    cpus_per_worker: int = 1
    gpus_per_worker: float = 0.0


class _RayWorker:
    """A Ray actor around a ``Worker`` (the model loads once per actor process)."""

    def __init__(self, job: SweepJob):
        self.worker = Worker(job)
        self.worker._setup()

    def run(self, ref: str) -> tuple[str, str]:
        return ref, self.worker.run(UnitRef.parse(ref)).value

    def stats(self) -> tuple[int, int, int]:
        import os

        return os.getpid(), self.worker.computed, self.worker.loads


RAY_PROBE_S = 5.0  # how long a connection to the cluster's address may take before it counts as down


def given_ray_address(address: str | None) -> tuple[str | None, str]:
    """(the cluster to join, what named it): ``--ray-address``, else Ray's own ``RAY_ADDRESS``
    (which ``ray.init`` joins when given no address), else None: start a local cluster."""
    if address is not None:
        return address, "--ray-address"
    env = os.environ.get("RAY_ADDRESS", "").strip()
    return (env, "RAY_ADDRESS") if env else (None, "")


def check_ray_address(address: str | None) -> None:
    """An existing Ray cluster at ``address`` (or ``RAY_ADDRESS``: ``given_ray_address``) answers
    (before any work): ``auto`` must find one (``RAY_ADDRESS``, the cluster ``ray start``
    recorded, or a running GCS on this machine), and its host:port (``ray://`` too) must accept a
    TCP connection within ``RAY_PROBE_S``; ray.init itself would retry an address nobody listens
    on for ever."""
    address, what = given_ray_address(address)
    if address is None:
        return
    import socket

    from ray._private.services import get_ray_address_from_environment

    where = address.strip()
    if where == "local":  # ray.init starts a new local cluster
        return
    try:
        if where == "auto":
            where = get_ray_address_from_environment("auto", None)
        host, _, port = where.removeprefix("ray://").rpartition(":")
        target = (host.strip("[]"), int(port))
        if not target[0] or not 0 < target[1] < 65536:
            raise ValueError(where)
    except ConnectionError:
        raise LensHeadsError(f"{what} {address}: no running Ray cluster found (start one with 'ray start "
                             f"--head', set RAY_ADDRESS, or leave --ray-address out to start a local one)") from None
    except ValueError:
        raise LensHeadsError(f"{what} {address!r}: write auto, HOST:PORT or ray://HOST:PORT") from None
    try:
        socket.create_connection(target, timeout=RAY_PROBE_S).close()
    except OSError as exc:
        raise LensHeadsError(f"{what} {address}: no Ray cluster answers at {target[0]}:{target[1]} "
                             f"({exc.strerror or exc}); is it running, and is the address its head's?") from None


class RaySession:
    def __init__(self, job: SweepJob, config: RayConfig):
        try:
            import ray
            from ray.util import ActorPool
        except ImportError:
            raise LensHeadsError("--executor ray needs Ray: pip install 'lens_heads[ray]'") from None
        self.ray, self.started = ray, False
        if not ray.is_initialized():
            address, what = given_ray_address(config.address)
            if address is None:
                import torch

                gpus = torch.cuda.device_count()
                if config.gpus_per_worker * config.workers > gpus:
                    raise LensHeadsError(f"--gpus-per-worker {config.gpus_per_worker:g} x --workers {config.workers}: "
                                         f"this machine has {gpus} GPU(s) for the local Ray cluster")
                ray.init(num_cpus=config.workers * config.cpus_per_worker, num_gpus=gpus, include_dashboard=False,
                         log_to_driver=False, configure_logging=False)
                self.started = True
            else:
                check_ray_address(config.address)
                try:  # never num_cpus / num_gpus: ray.init refuses them for an existing cluster
                    ray.init(address=address, log_to_driver=False, configure_logging=False)
                except (ConnectionError, TimeoutError) as exc:
                    msg = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
                    raise LensHeadsError(f"{what} {address}: cannot join the Ray cluster: {msg}") from None
        actor = ray.remote(_RayWorker).options(num_cpus=config.cpus_per_worker, num_gpus=config.gpus_per_worker,
                                               max_restarts=-1, max_task_retries=-1)
        job = _with_threads(job, config.cpus_per_worker)
        self.actors = [actor.remote(job) for _ in range(config.workers)]
        self.pool = ActorPool(self.actors)

    def run(self, refs: Sequence[UnitRef]) -> None:

        pending = [str(r) for r in refs]
        while pending:
            try:
                done = list(self.pool.map_unordered(lambda a, r: a.run.remote(r), pending))
            except self.ray.exceptions.RayError as exc:  # a unit's own error (not a dead worker: those retry)
                cause = getattr(exc, "cause", None)
                if isinstance(cause, LensHeadsError):
                    raise LensHeadsError(str(cause)) from None
                raise LensHeadsError(f"--executor ray: a worker failed: {str(exc).strip().splitlines()[0]}") from None
            pending = [r for r, outcome in done if outcome == "held"]  # a live process outside the pool has it
            if pending:
                time.sleep(CLAIM_POLL_S)

    def stats(self) -> list[tuple[int, int, int]]:
        """(pid, units computed, model loads) of each live actor process (waits for the actors
        to have loaded the model)."""
        return self.ray.get([a.stats.remote() for a in self.actors])

    def close(self) -> None:
        for a in self.actors:
            self.ray.kill(a)
        if self.started:
            self.ray.shutdown()


# -----------------------------------------------------------------------------
# slurm (submitit)


@dataclass
class SlurmConfig:
    tasks: int = 2  # array tasks per phase (workers)
    partition: str | None = None
    time_min: int = 60
    cpus_per_task: int = 1
    gpus_per_task: int = 0
    array_parallelism: int = 256
    retries: int = 2  # resubmissions of a failed task's units
    cluster: str | None = None  # None: Slurm; "local": submitit's local subprocesses (tests)
    folder: str | None = None  # submitit's logs (default: OUT/.submitit)


class _ArrayTask:
    """One array task: a ``Worker`` over its share of the units. Checkpointable: submitit
    requeues it on preemption or timeout, and it resumes from the store."""

    def __init__(self, job: SweepJob):
        self.job = job

    def __call__(self, refs: list[str]) -> int:
        return Worker(self.job).run_all([UnitRef.parse(r) for r in refs])

    def checkpoint(self, refs: list[str]):
        import submitit

        return submitit.helpers.DelayedSubmission(_ArrayTask(self.job), refs)


class SlurmSession:
    def __init__(self, job: SweepJob, config: SlurmConfig):
        try:
            import submitit
        except ImportError:
            raise LensHeadsError("--executor slurm needs submitit: pip install 'lens_heads[slurm]'") from None
        if config.cluster is None and shutil.which("sbatch") is None:
            raise LensHeadsError("--executor slurm: no Slurm on this machine (sbatch not found); run the launch on "
                                 "a Slurm login node, or use --executor local / ray")
        folder = config.folder or str(Path(job.out_dir) / ".submitit")
        self.ex = submitit.AutoExecutor(folder=folder, cluster=config.cluster)
        params = {"timeout_min": config.time_min, "cpus_per_task": config.cpus_per_task,
                  "slurm_array_parallelism": config.array_parallelism}
        if config.partition:
            params["slurm_partition"] = config.partition
        if config.gpus_per_task:
            params["gpus_per_node"] = config.gpus_per_task
        if config.cluster is not None:
            params = {k: v for k, v in params.items() if not k.startswith("slurm_")}
        self.ex.update_parameters(**params)
        self.job, self.config = _with_threads(job, config.cpus_per_task), config
        self.jobs: list = []  # every submitit job submitted (for tests and logs)
        self.computed = 0

    def run(self, refs: Sequence[UnitRef]) -> None:
        chunks = [c for c in ([str(r) for r in refs[i::self.config.tasks]] for i in range(self.config.tasks)) if c]
        for attempt in range(self.config.retries + 1):
            if not chunks:
                return
            jobs = self.ex.map_array(_ArrayTask(self.job), chunks)
            self.jobs.extend(jobs)
            failed = []
            for j, chunk in zip(jobs, chunks):
                try:
                    self.computed += j.result()
                except Exception:  # noqa: BLE001 -- a task that died: its units go again
                    failed.append(chunk)
            chunks = failed
        raise LensHeadsError(f"--executor slurm: {len(chunks)} array task(s) failed {self.config.retries + 1} "
                             f"times; see the logs in {self.ex.folder}")

    def close(self) -> None:
        pass


def _with_threads(job: SweepJob, threads: int) -> SweepJob:
    from dataclasses import replace

    return job if job.threads else replace(job, threads=max(1, int(threads)))


# -----------------------------------------------------------------------------
# the registry


EXECUTORS: Registry[tuple[type, type]] = Registry("executor", {
    "local": (LocalConfig, LocalSession), "ray": (RayConfig, RaySession), "slurm": (SlurmConfig, SlurmSession)})


def start(name: str, job: SweepJob, config=None) -> Session:
    """A session of executor ``name`` (``EXECUTORS``) for ``job``, with its config (default: the
    config class's defaults)."""
    if name not in EXECUTORS:
        raise LensHeadsError(f"unknown executor {name!r}; choose one of {', '.join(EXECUTORS)}")
    config_cls, session_cls = EXECUTORS[name]
    config = config_cls() if config is None else config
    if not isinstance(config, config_cls):
        raise LensHeadsError(f"executor {name!r} takes a {config_cls.__name__}, got {type(config).__name__}")
    return session_cls(job, config)


# -----------------------------------------------------------------------------
# the launcher


@dataclass
class Launch:
    """What a launch did: the result (None when another process still holds units), the
    sweep's units and how many were already stored."""

    result: object | None
    n_units: int
    n_stored_before: int
    seconds: float = 0.0
    session: Session | None = field(default=None, repr=False)


def job_for(model: str, dtype: str, device: str, cfg, out_dir, include_path=None, n_shards: int = 1,
            revision: str | None = None, attention: str = "auto", search=None) -> SweepJob:
    """A ``SweepJob`` from a model spec, with the weights' digest, the concrete dtype (``auto``
    resolved here, so every worker loads the same) and a hub id's commit; no model loaded."""

    commit = resolve_source(model, revision).revision if revision is not None else None
    return SweepJob(str(model), dtype_name(dtype, device), device, cfg, str(out_dir), spec_digest(model, revision),
                    include_path, n_shards, revision=commit, attention=attention, search=search)


def in_process_only(cfg) -> list[str]:
    """The per-input score ids of ``cfg`` whose scoring pass the executors' shards cannot split
    (the registry's ``shardable``): only one process runs such a sweep."""

    return [s for s in cfg.score_ids if s in SCORES and not SCORES[s].shardable]


def in_process_message(ids: Sequence[str]) -> str:
    """The one message for a sweep ``in_process_only`` names."""
    sid = ids[0]
    return (f"per-input {sid} (--scores {sid}): the executors' scoring shards do not split its pass yet; "
            f"sweep it in one process (no --executor / --shard), or use it as a static curve (--static {sid}), "
            f"which the executors run")


class InProcessSession:
    """The executor of a model already loaded in this process -- what ``run_sweep`` is. Its
    scoring phase is the one unsharded pass (every score, unshardable ones included, and the
    static curves' scores with it), its part phase runs point by point, each point merged as
    soon as its parts are stored (``run.run_points``), with this process's own progress bars."""

    in_process = True

    def __init__(self, model: LoadedModel, task, job: SweepJob, progress: bool = True):
        self.model, self.task, self.job, self.progress = model, task, job, progress

    def run(self, refs: Sequence[UnitRef]) -> None:

        phases = {r.phase for r in refs}
        model, task, cfg, store = self.model, self.task, self.job.cfg, ResultStore(self.job.out_dir)
        identity = cfg.identity(model, task)
        if "score" in phases:
            run.ensure_thresholds(model, store, identity, cfg, task, self.progress)
        if "static" in phases:
            run.ensure_static(model, store, identity, cfg, task, self.progress)
        if "part" in phases:
            run.ensure_static(model, store, identity, cfg, task, self.progress)
            run.run_points(model, task, run.stored_plan(store, identity, cfg, task), store, self.progress)

    def close(self) -> None:
        pass


def run_sweep(model: LoadedModel, cfg, out_dir, task=None, progress: bool = True):
    """Run (or resume) a sweep of a loaded model in this process: ``launch`` with the
    in-process executor (one driver for every executor) -- its thresholds, every missing unit,
    the two tables (``summary.csv`` and ``within_1pt.csv`` in ``out_dir``). Returns the
    ``SweepResult``."""

    task = check_sweep(model, cfg, task)
    job = SweepJob(model.name, dtype_name(model.dtype), str(model.device), cfg, str(out_dir), model_digest(model))
    return launch(job, session=InProcessSession(model, task, job, progress), progress=progress, task=task).result


def launch(job: SweepJob, executor: str = "local", config=None, progress: bool = True,
           session: Session | None = None, task=None) -> Launch:
    """Run (or resume) the sweep ``job`` on ``executor``: the scoring shards, the thresholds,
    the part units, the points and the tables (``summary.csv``, ``within_1pt.csv``), loading no
    weights in this process (but for ``local``, whose worker is this process, and an
    ``InProcessSession``: ``run_sweep``). ``task``: the loaded task (default: ``job.cfg.task``)."""
    t0 = time.perf_counter()
    cfg = job.cfg
    cfg.validate()
    here = getattr(session, "in_process", False)  # this process's model: every score, its own bars
    if in_process_only(cfg) and not here:
        raise LensHeadsError(in_process_message(in_process_only(cfg)))
    watch = progress and not here
    if task is None:
        task = load_task(cfg.task, n_shot=cfg.n_shot, include_path=job.include_path)
    identity = cfg.identity_for(job.digest, job.dtype, task)
    store = ResultStore(job.out_dir)
    check_one_weights(store, identity)
    own = session is None
    session = start(executor, job, config) if own else session
    try:
        thresholds = read_thresholds(store, identity, cfg, task)
        if thresholds is None:
            floor = device_floor(job.device)  # the workers' (they load the model on job.device)
            refs = [UnitRef("score", j) for j in range(job.n_shards)
                    if not store.has(shard_key(identity, cfg, j, job.n_shards, floor))]
            with _watch(store, [shard_key(identity, cfg, j, job.n_shards, floor) for j in range(job.n_shards)], [],
                        "scoring shards", watch):
                session.run(refs)
            thresholds = read_thresholds(store, identity, cfg, task)  # an in-process pass stores them whole
            if thresholds is None:
                rec = merge_score_shards(store, identity, cfg, job.n_shards, floor)
                if rec is None:
                    raise LensHeadsError(f"{job.out_dir}: scoring shards are missing after the executor finished")
                thresholds = rec.thresholds
        static = None
        if cfg.static_ids:
            static = stored_static(store, identity, cfg)
            if static is None:
                with _watch(store, [static_key(identity, cfg, r) for r in static_rankings(cfg)], [],
                            "static scores", watch):
                    session.run([UnitRef("static", 0)])
                static = stored_static(store, identity, cfg)
            if static is None:
                raise LensHeadsError(f"{job.out_dir}: the static curves' scores are missing after the executor finished")
        if job.search is not None:  # an adaptive search: one unit per curve, then its tables from the store
            return _search_phase(job, session, store, identity, task, t0)
        plan = run.stored_plan(store, identity, cfg, task)  # the plan tabulate and --status read, from the store
        if plan is None:
            raise LensHeadsError(f"{job.out_dir}: the sweep's thresholds are missing after the executor finished")
        units = plan.all_units
        stored_before = sum(store.has(u.key) or store.has(u.point) for u in units)
        refs = [UnitRef("part", i) for i, u in enumerate(units) if not (store.has(u.key) or store.has(u.point))]
        with _watch(store, [u.key for u in units], [u.point for u in units], "sweep units", watch):
            session.run(refs)
        records: dict[str, PointRecord] = {}
        for spec in plan.order:
            rec = merge_point(plan, spec, store)
            if rec is None:
                raise LensHeadsError(f"{job.out_dir}: point {spec} is incomplete after the executor finished")
            records[spec] = rec
        summary, within = tables(plan.points, records, cfg)
        n = len(plan.order)
        result = SweepResult(summary, within, thresholds, records, n_points=n, n_stored=n,
                             model=job.model, model_digest=identity.model_digest)
        result.save(job.out_dir)
        return Launch(result, len(units), stored_before, time.perf_counter() - t0, session)
    finally:
        if own:
            session.close()


def _search_phase(job: SweepJob, session, store, identity, task, t0: float) -> Launch:
    """An adaptive search's curve units (``curve/I``), then its tables replayed from the store."""
    cfg = job.cfg
    plan = run.stored_plan(store, identity, cfg, task)
    if plan is None:
        raise LensHeadsError(f"{job.out_dir}: the search's thresholds are missing after the executor finished")
    grid = [float(p) for p in cfg.fractions]
    curves = curves_of(plan, grid)
    session.run([UnitRef("curve", i) for i in range(len(curves))])
    result = tabulate_search(job.out_dir, identity, cfg, plan, job.search, grid, curves)
    if result is None:
        raise LensHeadsError(f"{job.out_dir}: a curve's questions are missing after the executor finished")
    result.save(job.out_dir)
    result.seconds, result.new_items = time.perf_counter() - t0, None  # the workers evaluated (not counted here)
    return Launch(result, len(curves), 0, result.seconds, session)


class _watch:
    """A progress bar in the launcher over records any worker stores (``keys[i]`` done when it
    or ``also[i]`` is stored), read from the store every ``POLL_S``."""

    def __init__(self, store, keys, also, desc: str, enabled: bool):
        self.store, self.keys, self.also, self.desc, self.enabled = store, keys, also, desc, enabled
        self.stop = threading.Event()

    def _done(self) -> int:
        return sum(self.store.has(k) or (i < len(self.also) and self.store.has(self.also[i]))
                   for i, k in enumerate(self.keys))

    def _loop(self):

        bar = progress_bar(len(self.keys), self.desc, enabled=True, unit="unit", leave=True)
        try:
            while True:
                bar.n = self._done()
                bar.refresh()
                if self.stop.wait(POLL_S):
                    break
            bar.n = self._done()
            bar.refresh()
        finally:
            bar.close()

    def __enter__(self):
        if self.enabled:
            self.thread = threading.Thread(target=self._loop, daemon=True)
            self.thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self.stop.set()
        if self.enabled:
            self.thread.join()

