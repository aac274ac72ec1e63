"""A sweep spread over workers (``sweep.units``, ``sweep.executors``): scoring shards merge into
the unsharded pass's thresholds bit for bit; the local, --shard, Ray and submitit executors give
a local run's tables byte for byte, also when a worker is SIGKILLed mid-unit; no unit is computed
twice; a store of other weights is refused."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np
import pytest
import torch

from test_sweep import TASK_ROWS

TABLES = ("summary.csv", "within_1pt.csv")


@pytest.fixture
def task_file(tmp_path):
    path = tmp_path / "mini.jsonl"
    path.write_text("".join(json.dumps({"question": q, "choices": c, "answer": a}) + "\n" for q, c, a in TASK_ROWS))
    return path


def _cfg(task_file, **kw):
    from lens_heads.sweep import SweepConfig

    return SweepConfig(**{**dict(task=f"file:{task_file}", score_ids=["ahon_ln", "awft"], fractions=[0.0, 0.5],
                                 random_seeds=[0, 1], batch_size=2, n_boot=200, chunk_questions=2,
                                 threshold_batch_size=2, extra_ablations=["static:0.1,1.2"]), **kw})


@pytest.fixture
def reference(tiny_model, task_file, tmp_path):
    """A plain local run_sweep's folder."""
    from lens_heads.sweep import run_sweep

    out = tmp_path / "local"
    run_sweep(tiny_model("llama"), _cfg(task_file), out, progress=False)
    return out


def _same_tables(a: Path, b: Path):
    for t in TABLES:
        assert (a / t).read_bytes() == (b / t).read_bytes(), t
    assert sorted(p.name for p in (a / "points").glob("*.json")) == sorted(p.name for p in (b / "points").glob("*.json"))
    assert not list(b.glob("parts/*.json")) and not list(b.glob("score_shards/*"))  # merged and discarded


def test_unit_refs_round_trip_and_bad_ones():
    from lens_heads.errors import LensHeadsError
    from lens_heads.sweep.units import UnitRef

    for ref in (UnitRef("score", 0), UnitRef("static", 0), UnitRef("part", 17)):
        assert UnitRef.parse(str(ref)) == ref
    for bad in ("part", "part/x", "points/1", "score/-1"):
        with pytest.raises(LensHeadsError, match="bad unit"):
            UnitRef.parse(bad)


@pytest.mark.parametrize("n_shards,shots", [(1, None), (2, None), (3, None), (7, None), (3, 3)])
def test_scoring_shards_merge_to_the_unsharded_thresholds_bit_for_bit(tiny_model, task_file, tmp_path, n_shards,
                                                                      shots, monkeypatch):
    """With ``shots``, each question's choices share a few-shot prefix that the pass runs once
    (``scores.shared_prefix``); the shards still merge to the unsharded pass bit for bit."""
    from lens_heads.data import load_task
    from lens_heads.forward.task_requests import task_inputs
    from lens_heads.scores import score_heads
    from lens_heads.results.store import ResultStore
    from lens_heads.sweep.plan import stored_thresholds
    from lens_heads.sweep.units import merge_score_shards, run_score_shard
    from lens_heads import batching
    from lens_heads.interventions.thresholds import compute_thresholds, scoring_shards
    from lens_heads.scores import pass_prefixes, scoring_batches as pass_batches, shared_prefix

    model, task = tiny_model("llama"), load_task(f"file:{task_file}")
    cfg = _cfg(task_file, threshold_batch_size=3, n_shot=shots)
    cfg.validate()
    inputs = task_inputs(model, task, shots)
    monkeypatch.setattr(batching, "MIN_BATCH_TOKENS", 8)  # batches close early here too (even_batch)
    monkeypatch.setattr(shared_prefix, "MIN_SAVED_TOKENS", 32)  # the tiny prompts' prefixes are shared too
    floor = batching.batch_floor(model)
    prefixes = pass_prefixes(model, inputs)
    assert (max(prefixes) >= 32) == (shots is not None)
    if shots is None:
        bounds = batching.batch_bounds(sorted(map(len, inputs), reverse=True), 3, floor)
        assert floor == 8 and any(b - a < 3 for a, b in zip(bounds, bounds[1:-1]))
    else:  # a batch holds one prefix's inputs
        batches = pass_batches(inputs, prefixes, 3, floor)
        assert any(len(b) > 1 for b in batches)
        assert all(len({tuple(inputs[i][:prefixes[i]].tolist()) for i in b}) == 1 for b in batches)
    shards = scoring_shards(inputs, 3, n_shards, floor, prefixes)
    assert sorted(i for s in shards for i in s) == list(range(len(inputs)))
    whole = score_heads(model, inputs, scores=cfg.score_ids, batch_size=3, keep_per_input=True, progress=False)
    for idx in shards:  # each shard scored alone (with its part of the pass's prefixes) reproduces its rows exactly
        if idx:
            part = score_heads(model, [inputs[i] for i in idx], scores=cfg.score_ids, batch_size=3,
                               keep_per_input=True, progress=False, shared_prefix=[prefixes[i] for i in idx])
            for sid in cfg.score_ids:
                assert torch.equal(part.per_input[sid], whole.per_input[sid][idx])
    store, identity = ResultStore(tmp_path / "s"), cfg.identity(model, task)
    for j in reversed(range(n_shards)):
        assert merge_score_shards(store, identity, cfg, n_shards, floor) is None  # not all shards yet
        run_score_shard(model, task, identity, cfg, store, j, n_shards)
    assert merge_score_shards(store, identity, cfg, n_shards, None) is None  # a GPU's cuts are other shards
    merged = merge_score_shards(store, identity, cfg, n_shards, floor)
    expected = compute_thresholds(model, inputs, cfg.score_ids, cfg.fractions, 3, progress=False)
    assert merged.thresholds == expected and stored_thresholds(store, identity, cfg).thresholds == expected
    assert merged.n_inputs == len(inputs) and not list((tmp_path / "s").glob("score_shards/*"))


@pytest.mark.parametrize("n_shards", [1, 3])
def test_scoring_shards_give_the_static_scores_of_the_unsharded_pass_bit_for_bit(tiny_model, task_file, tmp_path,
                                                                               n_shards, monkeypatch):
    """The static curves' dataset-level means come out of the thresholds' shards -- a ranking
    scored by the pass (ahon_ln) and one only the static curve needs (aeqd_ln) -- equal to the
    unsharded ``scoring_pass``'s bit for bit, with the random orders when the model is given;
    ``score_in_shards`` stops before a shard at ``start_by`` and resumes at the next one."""
    import time

    from lens_heads import batching
    from lens_heads.data import load_task
    from lens_heads.results.store import ResultStore
    from lens_heads.sweep.plan import static_key, static_rankings, stored_static, stored_thresholds
    from lens_heads.sweep.records import StaticScoresRecord
    from lens_heads.sweep.run import scoring_pass
    from lens_heads.sweep.units import merge_score_shards, run_score_shard, score_in_shards

    monkeypatch.setattr(batching, "MIN_BATCH_TOKENS", 8)  # batches close early: shards of uneven batches
    model, task = tiny_model("llama"), load_task(f"file:{task_file}")
    cfg = _cfg(task_file, threshold_batch_size=3, static_ids=["ahon_ln", "aeqd_ln", "random"])
    cfg.validate()
    identity = cfg.identity(model, task)
    thresholds, n_inputs, static = scoring_pass(model, task, cfg, False, static_rankings(cfg))
    assert set(static) == {"ahon_ln", "aeqd_ln", "random@0", "random@1"}

    store = ResultStore(tmp_path / "with_model")
    seen = []
    assert score_in_shards(model, task, identity, cfg, store, n_shards, start_by=time.monotonic() - 1) is None
    assert not list((tmp_path / "with_model").rglob("*.safetensors"))  # nothing started after start_by
    run_score_shard(model, task, identity, cfg, store, 0, n_shards)  # an earlier sitting's shard
    rec = score_in_shards(model, task, identity, cfg, store, n_shards, on_shard=lambda j, w, c: seen.append(j))
    assert seen == list(range(1, n_shards))  # resumed at the next missing shard
    assert rec.thresholds == thresholds and rec.n_inputs == n_inputs
    got = stored_static(store, identity, cfg)
    assert got.keys() == static.keys()
    assert all(np.array_equal(np.array(got[r]), np.array(static[r]), equal_nan=True) for r in static)
    assert store.load(static_key(identity, cfg, "aeqd_ln"), StaticScoresRecord).n_inputs == n_inputs

    bare = ResultStore(tmp_path / "no_model")  # a launcher merges without a model: no random orders
    for j in range(n_shards):
        run_score_shard(model, task, identity, cfg, bare, j, n_shards)
    merge_score_shards(bare, identity, cfg, n_shards, batching.batch_floor(model))
    assert stored_thresholds(bare, identity, cfg).thresholds == thresholds
    for r in static_rankings(cfg):
        got = bare.load(static_key(identity, cfg, r), StaticScoresRecord)
        assert (got is None) == r.startswith("random@")
        assert got is None or np.array_equal(np.array(got.mean), np.array(static[r]), equal_nan=True)


def test_a_static_mean_is_taken_from_the_shards_only_when_every_shard_scored_it(tiny_model, task_file, tmp_path,
                                                                             monkeypatch):
    """Static ids are not part of a shard's key: a pass begun without a static curve and resumed
    with it has shards without that ranking. Its mean is then left to the static pass (equal to
    the unsharded pass's), never pooled from the shards that have it; the random orders a static
    pass adds alone record the population's count, as a whole pass does."""
    from lens_heads import batching
    from lens_heads.data import load_task
    from lens_heads.results.store import ResultStore
    from lens_heads.sweep.plan import static_key, static_rankings, stored_static
    from lens_heads.sweep.records import StaticScoresRecord
    from lens_heads.sweep.run import run_static_unit, scoring_pass
    from lens_heads.sweep.units import merge_score_shards, run_score_shard, shard_key

    monkeypatch.setattr(batching, "MIN_BATCH_TOKENS", 8)
    model, task = tiny_model("llama"), load_task(f"file:{task_file}")
    without = _cfg(task_file, threshold_batch_size=3, extra_ablations=[])
    with_static = _cfg(task_file, threshold_batch_size=3, extra_ablations=[], static_ids=["aeqd_ln", "random"])
    identity, floor = with_static.identity(model, task), batching.batch_floor(model)
    assert shard_key(identity, with_static, 0, 3, floor) == shard_key(identity, without, 0, 3, floor)
    _, n_inputs, static = scoring_pass(model, task, with_static, False, static_rankings(with_static))
    store = ResultStore(tmp_path / "s")
    run_score_shard(model, task, identity, without, store, 0, 3)  # the first sitting, no static curve
    for j in (1, 2):
        run_score_shard(model, task, identity, with_static, store, j, 3)  # resumed with one
    merge_score_shards(store, identity, with_static, 3, floor)  # a launcher's merge: no model
    assert stored_static(store, identity, with_static) is None
    assert not store.has(static_key(identity, with_static, "aeqd_ln"))
    run_static_unit(model, task, identity, with_static, store)
    got = stored_static(store, identity, with_static)
    assert all(np.array_equal(np.array(got[r]), np.array(static[r]), equal_nan=True) for r in static)
    for r in static_rankings(with_static):
        assert store.load(static_key(identity, with_static, r), StaticScoresRecord).n_inputs == n_inputs


def test_local_launch_equals_run_sweep_and_resumes(tiny_model_dir, tiny_model, task_file, tmp_path, reference):
    from lens_heads.sweep.executors import LocalConfig, job_for, launch

    out = tmp_path / "launched"
    job = job_for(str(tiny_model_dir("llama")), "float32", "cpu", _cfg(task_file), out, n_shards=3)
    first = launch(job, "local", LocalConfig(), progress=False)
    _same_tables(reference, out)
    assert first.session.computed == 3 + first.n_units and first.n_stored_before == 0
    again = launch(job, "local", progress=False)  # all stored: nothing computed
    assert again.session.computed == 0
    _same_tables(reference, out)


@pytest.mark.usefixtures("own_cache")
def test_static_curves_run_as_a_unit_of_the_executors(tiny_model_dir, tiny_model, task_file, tmp_path):
    """Static curves (inactivity score, atp, random) through the executors: one ``static/0`` unit
    stores the dataset-level scores once, and the tables equal run_sweep's byte for byte."""
    from lens_heads.sweep import run_sweep
    from lens_heads.sweep.executors import LocalConfig, job_for, launch

    cfg = _cfg(task_file, static_ids=["ahon_ln", "atp", "random"])
    run_sweep(tiny_model("llama"), cfg, tmp_path / "local", progress=False)
    out = tmp_path / "launched"
    job = job_for(str(tiny_model_dir("llama")), "float32", "cpu", cfg, out, n_shards=2)
    first = launch(job, "local", LocalConfig(shard=(1, 2)), progress=False)
    _same_tables(tmp_path / "local", out)
    assert first.session.computed == 2 + 1 + first.n_units  # shards, the static unit, the parts
    assert "static:atp" in set(first.result.within["score_fn"])
    assert launch(job, "local", progress=False).session.computed == 0


def test_two_shard_processes_split_the_units_and_compute_none_twice(tiny_model_dir, task_file, tmp_path, capsys):
    from lens_heads.cli import main

    out, reference = tmp_path / "sharded", tmp_path / "one_process"
    env = {**os.environ, "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1"}
    argv = ["sweep", str(tiny_model_dir("llama")), "--task", f"file:{task_file}", "--scores", "ahon_ln,awft",
            "--fractions", "0,0.5", "--random-seeds", "2", "--batch-size", "2", "--n-boot", "200",
            "--chunk-questions", "2", "--ablate", "static:0.1,1.2", "--static", "awft,random", "--no-progress",
            "--out", str(out)]
    assert main([*argv[:-1], str(reference)]) == 0
    code = "import sys; from lens_heads.cli import main; sys.exit(main(sys.argv[1:]))"
    procs = [subprocess.Popen([sys.executable, "-c", code, *argv, "--shard", f"{i}/2"], env=env, text=True,
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE) for i in range(2)]
    outs = [p.communicate(timeout=600) for p in procs]
    assert [p.returncode for p in procs] == [0, 0], [e for _, e in outs]
    computed = [int(o.split("this process computed ")[1].split()[0]) for o, _ in outs]
    n_units = int(outs[0][0].split(" part units")[0].split()[-1])
    # 2 scoring shards + the static unit + every part, each exactly once. Which process computed how many depends
    # on start-up timing (one that starts late may find everything done: work is taken, not
    # assigned), so the split itself is checked below with a recording worker.
    assert sum(computed) == 2 + 1 + n_units, computed
    _same_tables(reference, out)
    capsys.readouterr()
    assert main([*argv, "--status"]) == 0  # static curves' scores read from the store
    assert capsys.readouterr().out.splitlines()[0].startswith(f"{n_units} of {n_units} units")


def test_local_shard_starts_with_its_own_units_then_takes_the_rest(monkeypatch):
    from lens_heads.sweep.executors import LocalConfig, LocalSession
    from lens_heads.sweep.units import UnitRef, Worker

    seen = []
    monkeypatch.setattr(Worker, "run_all", lambda self, refs: seen.append(list(refs)))
    refs = [UnitRef("part", j) for j in range(7)]
    for shard in [(1, 3), (0, 2), (2, 3)]:
        LocalSession(None, LocalConfig(shard)).run(refs)
    own = [[1, 4], [0, 2, 4, 6], [2, 5]]
    for order, first in zip(seen, own):
        assert [r.index for r in order[:len(first)]] == first  # its own share first
        assert sorted(r.index for r in order) == list(range(7))  # then every other unit, once


def test_workers_without_an_executor_run_that_many_local_processes(tiny_model_dir, task_file, tmp_path, reference):
    """--workers N (no --executor) is the local executor with N worker processes (it was ignored:
    one process ran); their tables equal run_sweep's, and this process computes none of the units."""
    from lens_heads.cli import build_parser
    from lens_heads.cli.sweep import _executor_config
    from lens_heads.sweep.executors import LocalConfig, job_for, launch

    def scale(*extra):
        return _executor_config(build_parser().parse_args(["sweep", "m", "--task", "t", "--out", "o", *extra]))

    assert scale() is None and scale("--workers", "1") is None  # this process
    assert scale("--workers", "2") == ("local", LocalConfig(processes=2, threads=1), 2)
    assert scale("--executor", "local", "--workers", "3", "--cpus-per-worker", "2") == \
        ("local", LocalConfig(processes=3, threads=2), 3)
    assert scale("--executor", "ray")[1].workers == 2  # ray's and slurm's default stays 2
    out = tmp_path / "processes"
    job = job_for(str(tiny_model_dir("llama")), "float32", "cpu", _cfg(task_file), out, n_shards=2)
    first = launch(job, "local", scale("--workers", "2")[1], progress=False)
    _same_tables(reference, out)
    by_pid = first.session.by_pid
    assert os.getpid() not in by_pid and first.session.computed is None
    assert sum(by_pid.values()) == 2 + first.n_units  # the scoring shards and every part, each once


@pytest.mark.parametrize("address, message", [("FREE_PORT", "no Ray cluster answers at 127.0.0.1:"),
                                              ("auto", "no running Ray cluster found"),
                                              ("env:FREE_PORT", "RAY_ADDRESS 127.0.0.1:")])
def test_a_ray_address_with_no_cluster_fails_at_once(address, message, tiny_model_dir, task_file, tmp_path):
    """ray.init retried an address nobody listens on for ever, and 'auto' with no cluster ended in
    a ConnectionError traceback: both are one line, exit 2, well within 30 s, nothing written.
    RAY_ADDRESS with no --ray-address (ray.init joins it) is checked the same way: it ended in
    ray.init's 'num_cpus and num_gpus must not be provided' traceback (hostile run)."""
    pytest.importorskip("ray")
    import socket

    from ray._private.services import find_bootstrap_address, find_gcs_addresses

    if address == "auto" and (find_gcs_addresses() or find_bootstrap_address(None)):
        pytest.skip("a Ray cluster runs on this machine: 'auto' would find it")
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # free once closed: nobody listens there
    out = tmp_path / "out"
    code = "import sys; from lens_heads.cli import main; sys.exit(main(sys.argv[1:]))"
    address = address.replace("FREE_PORT", f"127.0.0.1:{port}")
    argv = [sys.executable, "-c", code, "sweep", str(tiny_model_dir("llama")), "--task", f"file:{task_file}",
            "--scores", "ahon_ln", "--executor", "ray", "--out", str(out), "--no-progress"]
    env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}
    if address.startswith("env:"):
        env["RAY_ADDRESS"] = address.removeprefix("env:")
    else:
        argv += ["--ray-address", address]
    t0 = time.monotonic()
    try:
        proc = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=30)
    except subprocess.TimeoutExpired:
        pytest.fail(f"--ray-address {address}: still running after 30 s")
    err = proc.stderr.strip().splitlines()
    assert proc.returncode == 2 and len(err) == 1 and message in err[0], proc.stderr
    assert time.monotonic() - t0 < 30 and not out.exists()


def _kill_first_worker_mid_unit(out: Path, launcher_pid: int, killed: list, stop: threading.Event):
    """Watch the store for a part's claim held by a process other than the launcher; SIGKILL it."""
    while not stop.is_set() and not killed:
        for c in out.glob("parts/*.claim"):
            try:
                pid = json.loads(c.read_text())["pid"]
            except (OSError, ValueError, KeyError):
                continue
            if pid != launcher_pid:
                os.kill(pid, signal.SIGKILL)
                killed.append(pid)
                return
        time.sleep(0.002)


def _launch_with_a_kill(job, executor, config, out):
    from lens_heads.sweep.executors import launch

    killed, stop = [], threading.Event()
    watcher = threading.Thread(target=_kill_first_worker_mid_unit, args=(out, os.getpid(), killed, stop), daemon=True)
    watcher.start()
    try:
        result = launch(job, executor, config, progress=False)
    finally:
        stop.set()
        watcher.join()
    return result, killed


def test_ray_local_cluster_survives_a_killed_worker(tiny_model_dir, task_file, tmp_path, reference):
    pytest.importorskip("ray")
    import ray

    from lens_heads.sweep.executors import RayConfig, job_for

    out = tmp_path / "ray"
    job = job_for(str(tiny_model_dir("llama")), "float32", "cpu", _cfg(task_file, batch_size=1), out, n_shards=2)
    try:
        result, killed = _launch_with_a_kill(job, "ray", RayConfig(workers=2), out)
    finally:
        if ray.is_initialized():
            ray.shutdown()
    assert len(killed) == 1, "a worker should have been killed mid-unit"
    _same_tables(reference, out)
    assert result.n_units > 0


def test_submitit_array_requeues_a_killed_task(tiny_model_dir, task_file, tmp_path, reference):
    pytest.importorskip("submitit")
    from lens_heads.sweep.executors import SlurmConfig, job_for

    out = tmp_path / "array"
    job = job_for(str(tiny_model_dir("llama")), "float32", "cpu", _cfg(task_file, batch_size=1), out, n_shards=2)
    result, killed = _launch_with_a_kill(job, "slurm", SlurmConfig(tasks=2, cluster="local", time_min=10), out)
    assert len(killed) == 1, "an array task should have been killed mid-unit"
    session = result.session
    assert len(session.jobs) >= 2 + 2 + 1  # 2 scoring tasks, 2 part tasks, at least one resubmitted
    _same_tables(reference, out)


def test_a_store_of_other_weights_is_refused(tiny_model_dir, tiny_model, task_file, tmp_path, reference):
    import shutil

    from lens_heads.errors import LensHeadsError
    from lens_heads.sweep.executors import job_for, launch
    from lens_heads.sweep.units import Worker

    out = tmp_path / "other"
    shutil.copytree(reference, out)
    job = job_for(str(tiny_model_dir("llama")), "float32", "cpu", _cfg(task_file), out)
    from dataclasses import replace

    with pytest.raises(LensHeadsError, match="other weights"):
        launch(replace(job, digest="0" * 64), "local", progress=False)
    with pytest.raises(LensHeadsError, match="planned with"):  # a worker whose weights differ
        Worker(replace(job, digest="0" * 64))._setup()


@pytest.mark.parametrize("extra, message", [
    (["--executor", "slurm"], "no Slurm on this machine"),
    (["--shard", "2/2"], "--shard '2/2'"),
    (["--shard", "0/2", "--executor", "ray"], "--shard is for launching local processes"),
    (["--workers", "0", "--executor", "ray"], "--workers must be >= 1"),
    (["--executor", "ray", "--status"], "--status reads the store"),
])
def test_cli_scaleout_bad_input(extra, message, tiny_model_dir, task_file, tmp_path, capsys, monkeypatch):
    import shutil

    from lens_heads.cli import main

    if "slurm" in extra:
        monkeypatch.setattr(shutil, "which", lambda name: None)
    out = tmp_path / "out"
    code = main(["sweep", str(tiny_model_dir("llama")), "--task", f"file:{task_file}", "--scores", "ahon_ln",
                 "--out", str(out), "--no-progress", *extra])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1 and message in err[0], err
    assert not out.exists()


@pytest.mark.slurm
def test_real_single_node_slurm_runs_the_sweep_as_an_array(tiny_model_dir, task_file, tmp_path, reference,
                                                            monkeypatch):
    """slurmctld + slurmd (Debian's slurm-wlm) on loopback, started here: the sweep as 2-task
    arrays through submitit's Slurm executor, end to end, equals the local run."""
    pytest.importorskip("submitit")
    import slurm_cluster

    from lens_heads.sweep.executors import SlurmConfig, job_for, launch

    if slurm_cluster.missing():
        pytest.skip(f"Slurm's programs are missing: {', '.join(slurm_cluster.missing())} (apt install slurm-wlm)")
    out = tmp_path / "slurm"
    with slurm_cluster.single_node_slurm(tmp_path / "cluster") as env:
        monkeypatch.setenv("SLURM_CONF", env["SLURM_CONF"])
        job = job_for(str(tiny_model_dir("llama")), "float32", "cpu", _cfg(task_file), out, n_shards=2)
        result = launch(job, "slurm", SlurmConfig(tasks=2, time_min=10), progress=False)
        states = [j.state for j in result.session.jobs]
    print(f"slurm array jobs: {[j.job_id for j in result.session.jobs]}, states {states}")
    assert len(result.session.jobs) == 4 and all("_" in j.job_id for j in result.session.jobs)  # array tasks
    _same_tables(reference, out)


def test_status_counts_units_a_worker_stored(tiny_model_dir, task_file, tmp_path, capsys):
    """--status reads what workers stored: units, points, and a point whose parts are partly in."""
    from lens_heads.cli import main
    from lens_heads.results.store import ResultStore
    from lens_heads.sweep.units import UnitRef, Worker, merge_score_shards
    from lens_heads.sweep.executors import job_for
    from lens_heads.batching import device_floor

    out = tmp_path / "partial"
    cfg = _cfg(task_file, threshold_batch_size=16)  # the CLI's default scoring batch
    job = job_for(str(tiny_model_dir("llama")), "float32", "cpu", cfg, out)
    worker = Worker(job)
    worker.run(UnitRef("score", 0))
    merge_score_shards(ResultStore(out), worker.identity, cfg, 1, device_floor("cpu"))
    plan = worker.plan()
    n_base = len(plan.parts("none"))
    for i in range(n_base + 1):  # the baseline's parts, and one part of the next point
        worker.run(UnitRef("part", i))
    from lens_heads.sweep.run import merge_point

    merge_point(plan, "none", ResultStore(out))
    second = plan.order[1]
    capsys.readouterr()
    assert main(["sweep", str(tiny_model_dir("llama")), "--task", f"file:{task_file}", "--scores", "ahon_ln,awft",
                 "--fractions", "0,0.5", "--random-seeds", "2", "--batch-size", "2", "--n-boot", "200",
                 "--chunk-questions", "2", "--ablate", "static:0.1,1.2", "--out", str(out), "--status"]) == 0
    shown = capsys.readouterr().out.splitlines()
    assert shown[0] == f"{n_base + 1} of {len(plan.all_units)} units and 1 of {len(plan.order)} points stored"
    assert shown[1] == f"  running: {second}: 1 of {len(plan.parts(second))} parts stored"


def test_device_map_with_a_shard_is_refused_with_exit_2(tiny_model_dir, task_file, tmp_path, capsys):
    from lens_heads.cli import main

    out = tmp_path / "s"
    assert main(["sweep", str(tiny_model_dir("llama")), "--task", f"file:{task_file}", "--scores", "ahon_ln",
                 "--fractions", "0,0.5", "--no-progress", "--shard", "0/2", "--device-map", "auto",
                 "--out", str(out)]) == 2
    assert "--device-map with --executor / --shard" in capsys.readouterr().err and not out.exists()
