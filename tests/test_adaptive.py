"""Adaptive sweeps (docs/methods.md §13): the crossing search's error rate by simulation, its
exactness at exhaustion, and on a real store: the grid's points reused, resume without
re-evaluating an item, shards, the tables rebuilt from the store, the command line."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pytest

from lens_heads.errors import LensHeadsError
from lens_heads.sweep import SweepConfig, run_sweep
from lens_heads.sweep.adaptive import (OUTSIDE, WITHIN, SearchConfig, bisect_crossing, decide_probe, item_order,
                                       max_probes, run_search)


# --- synthetic curves --------------------------------------------------------------------------


def synthetic_curve(N: int, n_grid: int, crossing: int, rng, margin: float = 0.01):
    """(base [N], ablated [n_grid, N] 0/1, true Δ [n_grid]) with Δ non-increasing, Δ(crossing)
    >= -margin > Δ(crossing + 1): each item that is right unablated turns wrong from its own
    grid index on (nested sets), a few wrong items turn right, so no item is monotone alone but
    the curve is."""
    base = (rng.random(N) < 0.6).astype(float)
    # losses per step: just within at the crossing, just outside after it
    target = np.zeros(n_grid)
    allowed = int(math.floor(margin * N))
    for k in range(1, n_grid):
        if k <= crossing:
            target[k] = min(allowed, int(round(allowed * k / max(crossing, 1))))
        else:
            target[k] = allowed + 1 + 3 * (k - crossing - 1)
    right = rng.permutation(np.flatnonzero(base == 1))  # the order in which right items turn wrong
    wrong = np.flatnonzero(base == 0)
    ablated = np.tile(base, (n_grid, 1))
    gain = rng.permutation(wrong)[: max(1, N // 100)]  # wrong items that turn right from index 1 on
    for k in range(1, n_grid):
        ablated[k, right[:int(target[k]) + len(gain)]] = 0  # nested: each index loses the ones before too
        ablated[k, gain] = 1
    perm = rng.permutation(N)  # hide the nesting order from the item order
    base, ablated = base[perm], ablated[:, perm]
    delta = (ablated - base).mean(axis=1)
    return base, ablated, delta


def true_crossing(delta, margin):
    ok = np.flatnonzero(delta >= -margin - 1e-12)
    return int(ok.max())


def simulate(base, ablated, alpha, margin, batch, seed):
    N, n_grid = base.size, ablated.shape[0]
    order = item_order(list(range(N)), seed)

    def probe(index):
        got = decide_probe(N, order, lambda ids: ablated[index, ids] - base[ids], alpha / max_probes(n_grid),
                           margin, batch)
        got.index = index
        return got

    return bisect_crossing(n_grid, probe)


def test_bisection_on_exact_decisions_finds_the_last_within_index():
    """With each probe's exact decision, bisection finds the largest index with Δ >= -margin on
    every monotone curve of every length, in at most ceil(log2(n)) probes."""
    for n_grid in range(2, 40):
        for crossing in range(n_grid):
            calls = []

            def probe(i):
                calls.append(i)
                return type("P", (), {"decision": WITHIN if i <= crossing else OUTSIDE})()

            out = bisect_crossing(n_grid, probe)
            assert out.crossing == crossing, (n_grid, crossing)
            assert len(calls) <= max_probes(n_grid) and 0 not in calls
            assert out.status == ("lower bound" if crossing == n_grid - 1 else "resolved")


def test_run_to_exhaustion_the_crossing_is_exact():
    """A probe that reads all N items (one batch of N) has the exact Δ: the search then returns
    the true crossing, always."""
    rng = np.random.default_rng(1)
    for trial in range(30):
        N, n_grid = int(rng.integers(50, 300)), int(rng.integers(3, 20))
        crossing = int(rng.integers(0, n_grid))
        base, ablated, delta = synthetic_curve(N, n_grid, crossing, rng)
        assert true_crossing(delta, 0.01) == crossing
        out = simulate(base, ablated, 0.05, 0.01, N, seed=trial)
        assert out.crossing == crossing and all(p.n == N for p in out.probes)


def test_the_reported_crossing_is_wrong_in_at_most_alpha_of_runs():
    """1,000 seeded orders of synthetic benchmarks with a known crossing (α = 0.05, 1-point
    margin, 11-point grid): wrong by more than one grid step in <= α of them; and the search
    reads far fewer items than the grid would."""
    alpha, margin, n_runs = 0.05, 0.01, 1000
    rng = np.random.default_rng(0)
    curves = [synthetic_curve(600, 11, c, rng) for c in (2, 5, 8)]
    wrong = far = 0
    items = 0
    for run in range(n_runs):
        base, ablated, delta = curves[run % len(curves)]
        truth = true_crossing(delta, margin)
        out = simulate(base, ablated, alpha, margin, 40, seed=run)
        assert out.crossing is not None
        wrong += out.crossing != truth
        far += abs(out.crossing - truth) > 1
        items += sum(p.n for p in out.probes)
    assert far / n_runs <= alpha, far
    assert wrong / n_runs <= 2 * alpha, wrong  # even exact misses are rare
    assert items / n_runs < 0.8 * 10 * 600  # the 10 ablated grid points on every item: 6,000 per curve


def test_a_curve_that_rises_is_reported():
    from lens_heads.sweep.adaptive import CurveOutcome, ProbeOutcome

    out = CurveOutcome(3, "resolved", (3, 4), [ProbeOutcome(2, WITHIN, -0.05, -0.04, 100),
                                               ProbeOutcome(5, OUTSIDE, 0.01, 0.02, 100)])
    assert out.violations(0.01) == [(2, 5)]  # up by 5 points for certain
    assert out.violations(0.06) == []  # by less than a 6-point margin: noise at that scale
    # a point the store holds whole, within after the outside probe: the curve came back
    out.stored = [ProbeOutcome(7, WITHIN, -0.005, -0.005, 100), ProbeOutcome(4, OUTSIDE, -0.02, -0.02, 100)]
    assert out.violations(0.06) == [(4, 7), (5, 7)]


@pytest.mark.parametrize("kwargs", [{"alpha": 0}, {"alpha": 1.5}, {"margin": -0.01}, {"resolution": 0},
                                    {"resolution": float("nan")}, {"batch": 0}, {"max_items": 0}, {"alpha": True}])
def test_bad_search_settings_are_one_error(kwargs):
    with pytest.raises(LensHeadsError):
        SearchConfig(**kwargs)


def test_the_grid_rounds_as_fractions_are_written():
    assert SearchConfig(resolution=0.05).grid(0.3) == [0.0, 0.05, 0.1, 0.15, 0.2, 0.25, 0.3]
    assert len(SearchConfig(resolution=0.01).grid(0.6)) == 61
    with pytest.raises(LensHeadsError, match="holds no step"):
        SearchConfig(resolution=0.5).grid(0.3)


# --- on a real store -------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def model2k(tiny_llama_2k):
    import lens_heads as lh

    return lh.load_model(str(tiny_llama_2k))


CFG = dict(task="piqa", score_ids=["ahon_ln", "awft"], random_seeds=[0, 1], limit=48, fractions=[0, 0.25, 0.5, 0.75],
           chunk_questions=16, batch_size=16)


def test_on_a_grid_sweeps_store_nothing_is_evaluated_and_the_crossing_is_the_grids(model2k, shared_data, tmp_path, counted):
    """An adaptive search on the grid's own fractions, in the folder of that grid sweep, reads
    every probe from the stored points (0 questions evaluated) and, run to exhaustion, picks the
    last grid point within the margin wherever the grid's curve is monotone."""
    model = model2k
    cfg = SweepConfig(**CFG)
    grid = run_sweep(model, cfg, tmp_path, progress=False)
    counted.clear()
    search = SearchConfig(margin=0.02, resolution=0.25, batch=48)  # one batch of all 48: exhaustion
    found = run_search(model, cfg, search, tmp_path, progress=False)
    assert counted == [] and found.new_items == 0
    summary = grid.summary
    monotone = []
    for name in ("ahon_ln", "awft", "random"):
        rows = summary[summary.score_fn == name].groupby("fraction")["accuracy"].mean().sort_index()
        delta = (rows - rows.loc[0.0]).to_numpy()
        ok = np.flatnonzero(delta >= -0.02 - 1e-12)
        row = found.within.set_index("score_fn").loc[name]
        got = row["crossing_pct"]
        if (np.diff(delta) <= 1e-12).all():  # monotone: bisection and the grid's last point agree
            monotone.append(name)
            assert got == 100 * rows.index[ok.max()], name
        # at exhaustion every probe is exact: its decision is the grid's
        for probe in found.probes[found.probes.score_fn == name].itertuples():
            exact = delta[list(rows.index).index(probe.fraction)]
            assert probe.decision == ("within" if exact >= -0.02 - 1e-12 else "outside")
            assert probe.delta_lo == pytest.approx(exact) and probe.delta_hi == pytest.approx(exact)
        # and whatever the curve: the crossing is within, the next grid point (if any) is not
        i = list(rows.index).index(got / 100)
        assert delta[i] >= -0.02 - 1e-12 and (i + 1 == len(delta) or delta[i + 1] < -0.02 - 1e-12)
        # the grid points the bisection did not probe are read from the store, with their exact Δ ...
        probed = set(found.probes[found.probes.score_fn == name].fraction)
        within = delta >= -0.02 - 1e-12
        expect = [f"{100 * f:g}%:{'within' if within[k] else 'outside'}({100 * delta[k]:+.2f})"
                  for k, f in enumerate(rows.index) if k > 0 and f not in probed]
        text = lambda v: v if isinstance(v, str) else ""  # noqa: E731 (an empty cell: "" in memory, NaN from a csv)
        assert [p for p in text(row["stored_points"]).split("; ") if p] == expect
        # ... so a curve that comes back (a point within after one outside) is reported whatever was probed
        comes_back = any((not within[a] and within[b]) or delta[b] > delta[a] + 0.02 + 1e-12
                         for a in range(1, len(delta)) for b in range(a + 1, len(delta)))
        assert bool(text(row["monotone_violation"])) == comes_back, name
    # the grid's table is there with the search's columns beside it
    table = pd.read_csv(tmp_path / "within_1pt.csv")
    assert {"max_pct_zeroed_within_1pt", "crossing_pct", "probes", "alpha"} <= set(table.columns)


def test_a_killed_search_resumes_without_evaluating_an_item_twice(model2k, shared_data, tmp_path, monkeypatch,
                                                                  counted):
    from lens_heads.sweep import adaptive

    model = model2k
    cfg = SweepConfig(**{**CFG, "random_seeds": [0]})
    search = SearchConfig(margin=0.05, resolution=0.25, batch=8, alpha=0.2)
    ref = run_search(model, cfg, search, tmp_path / "ref", progress=False)
    one_go = list(counted)
    assert ref.new_items == len(one_go) > 0 and len(set(one_go)) == len(one_go)
    counted.clear()
    real, calls = adaptive.StoreItems._evaluate, []

    def dies(self, spec, ids):
        if len(calls) == 5:
            raise KeyboardInterrupt
        calls.append(spec)
        return real(self, spec, ids)

    monkeypatch.setattr(adaptive.StoreItems, "_evaluate", dies)
    with pytest.raises(KeyboardInterrupt):
        run_search(model, cfg, search, tmp_path / "run", progress=False)
    monkeypatch.setattr(adaptive.StoreItems, "_evaluate", real)
    again = run_search(model, cfg, search, tmp_path / "run", progress=False)
    assert sorted(counted) == sorted(one_go)  # killed + resumed = one uninterrupted run, item for item
    pd.testing.assert_frame_equal(again.within, ref.within)
    assert (tmp_path / "run" / "within_1pt.csv").read_bytes() == (tmp_path / "ref" / "within_1pt.csv").read_bytes()
    assert (tmp_path / "run" / "probes.csv").read_bytes() == (tmp_path / "ref" / "probes.csv").read_bytes()


def test_shards_split_the_curves_and_the_last_writes_the_tables(model2k, shared_data, tmp_path, counted):
    from lens_heads.sweep.adaptive import search_config, tabulate_search

    model = model2k
    cfg = SweepConfig(**CFG)
    search = SearchConfig(margin=0.05, resolution=0.25, batch=16, alpha=0.2)
    first = run_search(model, cfg, search, tmp_path, progress=False, shard=(0, 2))
    assert not first.complete and not (tmp_path / "within_1pt.csv").exists()
    assert list(first.within.score_fn) == ["ahon_ln", "random"]
    second = run_search(model, cfg, search, tmp_path, progress=False, shard=(1, 2))
    assert second.complete and list(second.within.score_fn) == ["ahon_ln", "awft", "random"]
    evaluated = list(counted)
    assert len(set(evaluated)) == len(evaluated)  # the shared baseline items: evaluated once
    whole = run_search(model, cfg, search, tmp_path / "whole", progress=False)
    pd.testing.assert_frame_equal(second.within, whole.within)
    # the tables again from the store alone, no model
    from lens_heads.data import load_task

    task = load_task("piqa")
    gcfg, grid = search_config(cfg, search)
    again = tabulate_search(tmp_path, gcfg.identity(model, task), gcfg, None, search, grid, task=task)
    pd.testing.assert_frame_equal(again.within, second.within)
    assert list(again.within.crossing_pct) == list(second.within.crossing_pct)
    assert list(again.probes.n_items) == list(second.probes.n_items)


def test_the_command_line(tiny_llama_2k, shared_data, tmp_path, capsys, monkeypatch):
    from lens_heads import models
    from lens_heads.cli import main

    model = str(tiny_llama_2k)
    out = tmp_path / "run"
    argv = ["sweep", model, "--task", "piqa", "--limit", "32", "--scores", "ahon_ln", "--random-seeds", "1",
            "--fractions", "0,0.5", "--search", "crossing", "--resolution", "25", "--margin", "5",
            "--search-batch", "16", "--out", str(out), "--no-progress"]
    assert main(argv) == 0, capsys.readouterr().err
    printed = capsys.readouterr().out
    assert "ahon_ln" in printed and "probes" in printed and "within_1pt.csv" in printed
    table = pd.read_csv(out / "within_1pt.csv")
    assert list(table.score_fn) == ["ahon_ln", "random"] and set(table.crossing_status) <= {
        "resolved", "lower bound", "unresolved"}
    assert (table.resolution_pct == 25).all() and (table.alpha == 0.05).all()
    probes = pd.read_csv(out / "probes.csv")
    assert set(probes.decision) <= {"within", "outside", "unresolved"} and (probes.n_items <= 32).all()
    # bad settings: one message, exit 2, before the model loads
    monkeypatch.setattr(models, "load_model", lambda *a, **k: pytest.fail("loaded the model"))
    for bad, message in ((["--alpha", "2"], "alpha"), (["--resolution", "0"], "resolution"),
                         (["--resolution", "80"], "holds no step"),
                         (["--ablate", "static:0.1"], "searches curves"),
                         (["--search-batch", "0"], "batch")):
        assert main([*argv, *bad]) == 2
        assert message in capsys.readouterr().err
    assert main(["sweep", model, "--task", "piqa", "--alpha", "0.1", "--out", str(tmp_path / "x")]) == 2
    assert "--alpha goes with --search crossing" in capsys.readouterr().err


@pytest.mark.parametrize("executor", ["local", pytest.param("ray", marks=pytest.mark.slow),  # ray: ~4 min here
                                      pytest.param("slurm", marks=pytest.mark.slurm)])
def test_executors_run_the_curves_as_units(executor, tiny_llama_2k, model2k, shared_data, tmp_path, monkeypatch):
    """Local worker processes, a local Ray cluster and a single-node Slurm (its array tasks) run
    one unit per curve (the model loaded in the workers, none here) and write the tables an
    in-process search writes."""
    import contextlib

    from lens_heads.sweep.adaptive import search_config
    from lens_heads.sweep.executors import LocalConfig, RayConfig, SlurmConfig, job_for, launch

    cluster = contextlib.nullcontext({})
    if executor == "ray":
        pytest.importorskip("ray")
    if executor == "slurm":
        pytest.importorskip("submitit")
        import slurm_cluster

        if slurm_cluster.missing():
            pytest.skip(f"Slurm's programs are missing: {', '.join(slurm_cluster.missing())} (apt install slurm-wlm)")
        cluster = slurm_cluster.single_node_slurm(tmp_path / "cluster")
    cfg = SweepConfig(**{**CFG, "limit": 32, "random_seeds": [0]})
    search = SearchConfig(margin=0.05, resolution=0.25, batch=16, alpha=0.2)
    run_search(model2k, cfg, search, tmp_path / "here", progress=False)
    job = job_for(str(tiny_llama_2k), "float32", "cpu", search_config(cfg, search)[0], tmp_path / executor,
                  n_shards=2, search=search)
    config = {"local": lambda: LocalConfig(processes=2), "ray": lambda: RayConfig(workers=2),
              "slurm": lambda: SlurmConfig(tasks=2, time_min=10)}[executor]()
    try:
        with cluster as env:
            if "SLURM_CONF" in env:
                monkeypatch.setenv("SLURM_CONF", env["SLURM_CONF"])
            out = launch(job, executor, config, progress=False)
    finally:
        if executor == "ray":
            import ray

            if ray.is_initialized():
                ray.shutdown()
    assert out.n_units == 3  # ahon_ln, awft, random
    if executor == "slurm":  # the curves ran as Slurm array tasks
        assert out.session.jobs and all("_" in j.job_id for j in out.session.jobs)
    for name in ("within_1pt.csv", "probes.csv"):
        pd.testing.assert_frame_equal(pd.read_csv(tmp_path / "here" / name), pd.read_csv(tmp_path / executor / name))


def test_the_report_shows_the_probes(model2k, shared_data, tmp_path):
    """A search folder (no grid summary) in the HTML report: the crossings at a glance, the probes
    figure, the crossings table."""
    import re

    from lens_heads.data import load_texts
    from lens_heads.viz.study import ReportConfig, build_report

    cfg = SweepConfig(**{**CFG, "limit": 32, "random_seeds": [0]})
    found = run_search(model2k, cfg, SearchConfig(margin=0.05, resolution=0.25, batch=16, alpha=0.2), tmp_path / "s",
                       progress=False)
    out = tmp_path / "report.html"
    build_report(ReportConfig(model="tiny", out=str(out), data="c4-sample", n_inputs=2, sweep=str(tmp_path / "s"),
                              progress=False), model=model2k, texts=load_texts("c4-sample", n=2))
    page = out.read_text()
    part = page.split('<section id="sweep">')[1].split("</section>")[0]
    assert "Crossing search" in part and len(re.findall(r'<img[^>]+src="data:image/png;base64,', part)) == 2
    for row in found.within.itertuples():
        assert f"<td>{row.score_fn}</td>" in part and row.probes in part


# --- the ledger, the time limit, a replay of a running search, mean ablation -------------------


def test_a_ledger_round_trips_bit_for_bit_and_refuses_another_population(tmp_path):
    from lens_heads.sweep.ledger import Ledger, LedgerEntry

    rng = np.random.default_rng(3)
    ids = [int(d) for d in rng.permutation(1838)[:1000] * 7]  # arbitrary doc ids, plan order
    entries = {}
    for k in range(5):
        known = frozenset(int(d) for d in rng.choice(ids, size=int(rng.integers(1, 1000)), replace=False))
        correct = frozenset(d for d in known if rng.random() < 0.6)
        entries[f"{k:032x}"] = LedgerEntry(f"spec{k}", known, correct, (float(rng.integers(0, 99)), 1e4), 1.25, 3)
    book = Ledger(ids, entries)
    book.save(tmp_path / "l.json")
    again = Ledger.load(tmp_path / "l.json", ids)
    for k, e in entries.items():
        got = again.get(k)
        assert got.known == e.known and got.correct == e.correct and got.spec == e.spec
        assert got.zeroed_units == e.zeroed_units and got.seconds == e.seconds and got.items == e.items
    again.save(tmp_path / "m.json")
    assert (tmp_path / "m.json").read_bytes() == (tmp_path / "l.json").read_bytes()
    # a point's masks are N/4 hex characters each: a 1,000-item population, ~250 bytes a mask
    assert len(book.to_json()["points"][f"{0:032x}"]["known"]) == 2 * 125
    with pytest.raises(LensHeadsError, match="another population"):
        Ledger.load(tmp_path / "l.json", ids[:-1])
    with pytest.raises(LensHeadsError, match="correct but not known"):
        LedgerEntry("x", frozenset({1}), frozenset({2}), (0.0, 0.0), 0.0, 0)


def test_a_fresh_store_with_the_ledger_alone_evaluates_only_what_it_lacks(model2k, shared_data, tmp_path,
                                                                          monkeypatch, counted):
    """A search killed part-way writes its ledger; a new folder holding only the thresholds and the
    ledger (no per-item points or parts) resumes it: together the two evaluate what one search
    does, item for item, and find the same crossings."""
    import shutil

    from lens_heads.sweep import adaptive

    cfg = SweepConfig(**{**CFG, "random_seeds": [0]})
    search = SearchConfig(margin=0.05, resolution=0.25, batch=8, alpha=0.2)
    ref = run_search(model2k, cfg, search, tmp_path / "ref", progress=False)
    one_go = list(counted)
    counted.clear()
    real, calls = adaptive.StoreItems._evaluate, []

    def timed(self, spec, ids):
        calls.append(spec)
        if len(calls) == 4:
            self.deadline = -1.0  # the time limit has passed: no later batch starts
        return real(self, spec, ids)

    monkeypatch.setattr(adaptive.StoreItems, "_evaluate", timed)
    first = run_search(model2k, cfg, search, tmp_path / "a", progress=False, ledger=tmp_path / "a" / "ledger.json",
                       time_limit=3600)
    monkeypatch.setattr(adaptive.StoreItems, "_evaluate", real)
    assert first.stopped and not first.complete and len(calls) == 4 and first.new_items == len(counted)
    # (every stored batch was followed by after_batch, the campaign's checkpoint: see test_the_batches_call_back)
    assert not (tmp_path / "a" / "within_1pt.csv").exists()  # no tables from a stopped run
    fresh = tmp_path / "b"
    for kind in ("thresholds", "static_scores"):
        if (tmp_path / "a" / kind).is_dir():
            shutil.copytree(tmp_path / "a" / kind, fresh / kind)
    shutil.copy(tmp_path / "a" / "ledger.json", fresh / "ledger.json")
    again = run_search(model2k, cfg, search, fresh, progress=False, ledger=fresh / "ledger.json")
    assert sorted(counted) == sorted(one_go)  # ledger + fresh store = one search, no item twice
    pd.testing.assert_frame_equal(again.within, ref.within)
    # the ledger then holds every item the search read, with the store's own correctness
    from lens_heads.sweep.ledger import Ledger

    book = Ledger.load(fresh / "ledger.json", [r.doc_id for r in _records(cfg)])
    run, _ = adaptive.prepare_search(model2k, cfg, search, tmp_path / "ref", progress=False)
    for digest, e in book.entries.items():
        spec = e.spec
        truth = run.items.correct(spec, sorted(e.known))
        assert [bool(x) for x in truth] == [d in e.correct for d in sorted(e.known)], spec


def _records(cfg):
    from lens_heads.data import load_task
    from lens_heads.forward.task_requests import select_records

    return select_records(load_task(cfg.task), cfg.limit, cfg.seed)


def test_a_replay_of_a_running_search_shows_its_curves_pending(model2k, shared_data, tmp_path, monkeypatch):
    from lens_heads.data import load_task
    from lens_heads.sweep import adaptive
    from lens_heads.sweep.adaptive import PENDING, search_config, tabulate_search

    cfg = SweepConfig(**{**CFG, "random_seeds": [0]})
    search = SearchConfig(margin=0.05, resolution=0.25, batch=8, alpha=0.2)
    real, calls = adaptive.StoreItems._evaluate, []

    def timed(self, spec, ids):
        calls.append(spec)
        if len(calls) == 3:
            self.deadline = -1.0
        return real(self, spec, ids)

    monkeypatch.setattr(adaptive.StoreItems, "_evaluate", timed)
    assert run_search(model2k, cfg, search, tmp_path, progress=False, time_limit=3600).stopped
    task = load_task("piqa")
    gcfg, grid = search_config(cfg, search)
    identity = gcfg.identity(model2k, task)
    assert tabulate_search(tmp_path, identity, gcfg, None, search, grid, task=task) is None
    found = tabulate_search(tmp_path, identity, gcfg, None, search, grid, task=task, pending=True, costs=True)
    assert not found.complete and PENDING in set(found.within.crossing_status)
    first = found.probes.iloc[0]
    assert first.decision == PENDING and 0 < first.n_items < 48 and first.n_items % 8 == 0
    # a pending curve's cost is what its stored parts took, read from their own timings
    row = found.within.iloc[0]
    assert row.eval_items == first.n_items and row.eval_seconds > 0
    # a replay beside a live search reads what is stored and never waits for a part another
    # process holds (it would follow that search batch by batch): every part claimed elsewhere
    import contextlib

    def taken(path, *args, **kwargs):
        return contextlib.nullcontext(False)

    def no_wait(*args, **kwargs):
        raise AssertionError("a replay waited for another process")

    monkeypatch.setattr(adaptive, "claim", taken)
    monkeypatch.setattr(adaptive, "wait_for", no_wait)
    again = tabulate_search(tmp_path, identity, gcfg, None, search, grid, task=task, pending=True, costs=True)
    pd.testing.assert_frame_equal(again.probes, found.probes)


def test_mean_ablation_runs_through_the_search(model2k, shared_data, tmp_path, counted):
    """Under ``replacement`` (``--ablate-with mean:...``) every probed point replaces its heads,
    and each stored item is what evaluating that replaced ablation directly gives."""
    from lens_heads.data import load_task
    from lens_heads.evaluation.evaluate import evaluate_task
    from lens_heads.forward.replacement import parse_replacement
    from lens_heads.interventions.ablation import parse_ablation
    from lens_heads.interventions.specs import parse_spec, with_replacement
    from lens_heads.sweep.adaptive import prepare_search

    cfg = SweepConfig(**{**CFG, "random_seeds": [0], "score_ids": ["ahon_ln"], "limit": 24},
                      replacement="mean:c4-sample@4")
    search = SearchConfig(margin=0.05, resolution=0.25, batch=8, alpha=0.2)
    found = run_search(model2k, cfg, search, tmp_path, progress=False)
    specs = {s for p in found.probes.specs for s in p.split(";")}
    assert specs and all(s.endswith("|mean:c4-sample@4") for s in specs)
    zero_cfg = SweepConfig(**{**CFG, "random_seeds": [0], "score_ids": ["ahon_ln"], "limit": 24})
    zrun, _ = prepare_search(model2k, zero_cfg, search, tmp_path / "zero", progress=False)
    run, _ = prepare_search(model2k, cfg, search, tmp_path, progress=False)
    task = load_task("piqa")
    rep = parse_replacement("mean:c4-sample@4")
    for p in found.probes.itertuples():
        for s in p.specs.split(";"):
            zero_spec = zrun.plan.points[[q.spec for q in run.plan.points].index(s)].spec  # same point, zeroed
            spec = str(with_replacement(parse_spec(zero_spec), rep))
            assert spec == s
            ids = run.order[:p.n_items]
            direct = evaluate_task(model2k, task, ablation=parse_ablation(spec, model2k.geometry), doc_ids=ids,
                                   batch_size=8, progress=False)
            by = {q.doc_id: q.correct for q in direct.questions}
            assert [bool(x) for x in run.items.correct(s, ids)] == [by[d] for d in ids]


def test_the_command_line_takes_a_time_limit_and_a_ledger(tiny_llama_2k, shared_data, tmp_path, capsys):
    from lens_heads.cli import main

    out = tmp_path / "run"
    argv = ["sweep", str(tiny_llama_2k), "--task", "piqa", "--limit", "24", "--scores", "ahon_ln", "--random-seeds",
            "1", "--fractions", "0,0.5", "--search", "crossing", "--resolution", "25", "--margin", "5",
            "--search-batch", "8", "--out", str(out), "--no-progress", "--ledger", str(tmp_path / "l.json"),
            "--time-limit", "60"]
    assert main(argv) == 0, capsys.readouterr().err
    printed = capsys.readouterr().out
    assert "ledger:" in printed and (tmp_path / "l.json").is_file() and (out / "within_1pt.csv").is_file()
    for bad, message in ((["--time-limit", "0"], "must be > 0"), (["--workers", "2"], "run in this process")):
        assert main([*argv, *bad]) == 2
        assert message in capsys.readouterr().err
    assert main(["sweep", str(tiny_llama_2k), "--task", "piqa", "--ledger", "x.json", "--out", str(tmp_path / "x")]) == 2
    assert "--ledger goes with --search crossing" in capsys.readouterr().err


def test_status_reads_a_stopped_search_and_then_matches_the_finished_one(tiny_llama_2k, shared_data, tmp_path,
                                                                         capsys, monkeypatch):
    """``--status`` on a search folder loads no weights and computes nothing: stopped mid-probe,
    it shows the curve running (the probe it is in, read as far as the store holds it) and the
    others not started; once the search has finished, each curve's line is the one the search
    printed itself."""
    from lens_heads import models
    from lens_heads.cli import main
    from lens_heads.sweep import adaptive

    out = tmp_path / "run"
    argv = ["sweep", str(tiny_llama_2k), "--task", "piqa", "--limit", "24", "--scores", "ahon_ln,awft",
            "--random-seeds", "1", "--fractions", "0,0.5", "--search", "crossing", "--resolution", "25", "--margin",
            "5", "--search-batch", "8", "--out", str(out), "--no-progress"]
    real, calls = adaptive.StoreItems._evaluate, []

    def stop_after_three(self, spec, ids):  # unablated, probe, unablated: the probe has read one batch
        calls.append(spec)
        if len(calls) == 3:
            self.deadline = -1.0
        return real(self, spec, ids)

    with monkeypatch.context() as m:
        m.setattr(adaptive.StoreItems, "_evaluate", stop_after_three)
        assert main([*argv, "--time-limit", "60"]) == 0, capsys.readouterr().err
    assert "stopped at the time limit" in capsys.readouterr().out
    with monkeypatch.context() as m:
        m.setattr(models, "load_model", lambda *a, **k: pytest.fail("loaded the model"))
        m.setattr(adaptive.StoreItems, "_evaluate", lambda *a, **k: pytest.fail("evaluated"))
        assert main([*argv, "--status"]) == 0, capsys.readouterr().err
        lines = capsys.readouterr().out.splitlines()
        first = next(x for x in lines if x.split()[0] == "ahon_ln")
        assert "running: the probe at 25 % has read 8 of 24 questions" in first and "25%:pending@8" in first
        assert [x.split(None, 1)[1] for x in lines if x.split()[0] in ("awft", "random")] == ["not started"] * 2
        assert "0 of 3 curves decided" in lines[-1]
    assert main(argv) == 0, capsys.readouterr().err
    finished = [x for x in capsys.readouterr().out.splitlines() if x.startswith("  ")]
    with monkeypatch.context() as m:
        m.setattr(models, "load_model", lambda *a, **k: pytest.fail("loaded the model"))
        assert main([*argv, "--status"]) == 0, capsys.readouterr().err
    shown = capsys.readouterr().out.splitlines()
    assert [x for x in shown if x.startswith("  ")] == finished and len(finished) == 3
    assert "3 of 3 curves decided" in shown[-2] and "run without --status" in shown[-1]
    # a folder that holds no thresholds of this search: one message, exit 2
    assert main([*argv[:-3], "--resolution", "10", "--out", str(out), "--no-progress", "--status"]) == 2
    assert "holds no thresholds of this search" in capsys.readouterr().err


def test_the_batches_call_back_between_them(model2k, shared_data, tmp_path, counted):
    """``StoreItems.after_batch`` runs once after each batch evaluated and stored, with no claim
    held, so a caller can write the ledger there: it then holds exactly the items stored so far."""
    from lens_heads.sweep import adaptive

    cfg = SweepConfig(**{**CFG, "random_seeds": [0], "score_ids": ["ahon_ln"], "limit": 24})
    search = SearchConfig(margin=0.05, resolution=0.25, batch=8, alpha=0.2)
    run, curves = adaptive.prepare_search(model2k, cfg, search, tmp_path, progress=False)
    seen = []

    def checkpoint():
        assert not list(tmp_path.rglob("*.claim"))
        book = run.items.to_ledger()
        seen.append(sum(len(e.known) for e in book.entries.values()))

    run.items.after_batch = checkpoint
    for c in curves:
        adaptive.search_curve(run, c)
    assert len(seen) == len(counted) // 8 and seen == sorted(seen) and seen[-1] == len(counted)


@pytest.mark.usefixtures("one_torch_thread")
def test_a_curves_cost_counts_cpu_time_not_waiting(model2k, shared_data, tmp_path, monkeypatch):
    """Each evaluation records its wall and CPU seconds and its device; a curve's cost and the
    ledger count the CPU seconds (docs/methods.md §13, "Cost per curve"), so time the process
    spends off the CPU -- here a sleep inside every evaluation, standing for another job on its
    core -- adds nothing, while the wall clock counts it."""
    import time

    from lens_heads.evaluation import evaluate as evaluation
    from lens_heads.evaluation.timing import compute_seconds
    from lens_heads.data import load_task
    from lens_heads.results.keys import Kind
    from lens_heads.results.store import ResultStore
    from lens_heads.sweep.adaptive import search_config, tabulate_search
    from lens_heads.sweep.ledger import Ledger
    from lens_heads.sweep.records import PointRecord

    real, nap = evaluation.loglikelihoods, 0.3

    def off_cpu(*args, **kwargs):
        time.sleep(nap)
        return real(*args, **kwargs)

    monkeypatch.setattr(evaluation, "loglikelihoods", off_cpu)
    cfg = SweepConfig(**{**CFG, "score_ids": ["awft"], "random_seeds": []})
    search = SearchConfig(margin=0.05, resolution=0.25, batch=8, alpha=0.2)
    run_search(model2k, cfg, search, tmp_path, progress=False, ledger=tmp_path / "ledger.json")
    parts = [PointRecord.from_json(d) for d in ResultStore(tmp_path).records(Kind.PART)]
    assert parts
    for p in parts:
        c = p.eval_config
        assert c["device"] == "cpu" and c["cpu_seconds"] > 0 and compute_seconds(c) == c["cpu_seconds"]
        assert c["seconds"] - c["cpu_seconds"] >= nap / 2  # the nap is wall time, not CPU time
    ablated = [p for p in parts if p.eval_config["ablation"] != "none"]
    cpu = sum(round(1000 * p.eval_config["cpu_seconds"]) for p in ablated) / 1000
    wall = sum(p.eval_config["seconds"] for p in ablated)
    task = load_task("piqa")
    gcfg, grid = search_config(cfg, search)
    found = tabulate_search(tmp_path, gcfg.identity(model2k, task), gcfg, None, search, grid, task=task, costs=True)
    row = found.within.iloc[0]
    assert row.eval_items == sum(len(p.questions) for p in ablated)
    assert row.eval_seconds == pytest.approx(cpu, abs=1e-6) and row.eval_seconds < wall - nap / 2 * len(ablated)
    book = Ledger.load(tmp_path / "ledger.json", [r.doc_id for r in _records(cfg)])
    assert sum(e.seconds for e in book.entries.values() if e.spec != "none") == pytest.approx(cpu, abs=1e-3)


def test_compute_seconds_reads_cpu_time_on_a_cpu_and_the_wall_elsewhere():
    from lens_heads.evaluation.timing import Stopwatch, compute_seconds
    from lens_heads.sweep.records import PointRecord

    assert compute_seconds({"seconds": 9.0, "cpu_seconds": 4.0, "device": "cpu"}) == 4.0
    assert compute_seconds({"seconds": 9.0, "cpu_seconds": 4.0, "device": "cuda"}) == 9.0  # the host's CPU misses the GPU
    assert compute_seconds({"seconds": 9.0}) == 9.0  # a record from before CPU time was recorded
    assert compute_seconds({}) == 0.0
    watch = Stopwatch.start()
    sum(i * i for i in range(300_000))  # on the CPU
    busy = watch.fields("cuda:1")
    assert busy["device"] == "cuda" and 0 < busy["cpu_seconds"] <= busy["seconds"] + 0.01
    # a point stored in parts: CPU time adds up only when every part recorded it
    question = {"doc_id": 0, "pred": 1, "gold": 1, "correct": True, "lls": [-2.0, -1.0], "pred_norm": None,
                "subject": None}
    part = {"task": "piqa", "n_shot": 0, "metrics": {"acc": 1.0}, "zeroed_fraction": None, "questions": [question],
            "point_hash": "x"}

    def cfg(**timing):
        return {"n_questions": 1, "n_requests": 2, "zeroed_units": None, **timing}

    both = [PointRecord.from_json({**part, "eval_config": cfg(seconds=2.0, cpu_seconds=1.5, device="cpu")}),
            PointRecord.from_json({**part, "eval_config": cfg(seconds=3.0, cpu_seconds=2.5, device="cpu")})]
    merged = PointRecord.merge(both, None).eval_config
    assert merged["seconds"] == 5.0 and merged["cpu_seconds"] == 4.0 and compute_seconds(merged) == 4.0
    # each part costs what its own clock says, before and after merging: CPU time where it has it,
    # the wall where it ran before CPU time was recorded or on an accelerator
    old = [both[0], PointRecord.from_json({**part, "eval_config": cfg(seconds=3.0)})]
    merged = PointRecord.merge(old, None).eval_config
    assert "cpu_seconds" not in merged and compute_seconds(merged) == 1.5 + 3.0
    gpu = PointRecord.from_json({**part, "eval_config": cfg(seconds=0.25, cpu_seconds=0.125, device="cuda")})
    merged = PointRecord.merge([both[0], gpu], None).eval_config
    assert merged["device"] == "mixed" and compute_seconds(merged) == 1.5 + 0.25
    assert compute_seconds(PointRecord.merge([PointRecord.from_json({**part, "eval_config": merged}), both[1]],
                                             None).eval_config) == 1.5 + 0.25 + 2.5  # merged again: the same sum


def test_a_model_placed_over_devices_is_timed_as_the_accelerator_it_runs_on():
    from types import SimpleNamespace

    from lens_heads.evaluation.timing import device_type

    def placed(device, device_map):
        return SimpleNamespace(device=device, hf_model=SimpleNamespace(hf_device_map=device_map))

    assert device_type(placed("cpu", None)) == "cpu"
    assert device_type(placed("cuda:1", None)) == "cuda"
    # the embedding on the CPU, the layers on GPU 0 (accelerate writes a GPU as its index)
    assert device_type(placed("cpu", {"model.embed_tokens": "cpu", "model.layers": 0})) == "cuda"
    assert device_type(placed("cpu", {"model.embed_tokens": "cpu", "model.layers": "disk"})) == "cpu"
    assert device_type(placed("cuda:0", {"model.embed_tokens": "cuda:0", "lm_head": "cpu"})) == "cuda"


@pytest.fixture(scope="module")
def gemma2k(tiny_model_dir, tmp_path_factory):
    """The tiny Gemma 3 (one key/value head per layer) with a 2,048-token window, for PIQA."""
    import json
    import shutil

    import lens_heads as lh

    folder = tmp_path_factory.mktemp("tiny-gemma3-2k")
    shutil.copytree(tiny_model_dir("gemma3"), folder, dirs_exist_ok=True)
    config = json.loads((folder / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps({**config, "max_position_embeddings": 2048}))
    return lh.load_model(str(folder))


def test_a_score_that_ties_over_the_range_is_one_probe_and_no_crossing(gemma2k, shared_data, tmp_path, counted,
                                                                       capsys):
    """One key/value head per layer makes FTVVN(LN) (a value norm ÷ its layer's mean) the same for
    every head, so every fraction of its curve is the same ablation. The search probes it once and
    reports ``constant scores`` with no crossing; that probe's Δ is what zeroing every head does,
    measured here by another route (a static set of every head); AHON(LN) beside it is bisected."""
    from types import SimpleNamespace

    from lens_heads.cli.sweep import report_search
    from lens_heads.data import load_task
    from lens_heads.evaluation.evaluate import evaluate_task
    from lens_heads.forward.task_requests import select_records
    from lens_heads.interventions.ablation import parse_ablation
    from lens_heads.interventions.specs import StaticHeads

    model = gemma2k
    cfg = SweepConfig(task="piqa", score_ids=["ftvvn_ln", "ahon_ln"], random_seeds=[], limit=32, fractions=[0, 0.5],
                      chunk_questions=16, batch_size=16)
    search = SearchConfig(margin=0.02, resolution=0.1, batch=32)  # one batch of all 32: every probe exact
    found = run_search(model, cfg, search, tmp_path, progress=False)
    rows = found.within.set_index("score_fn")
    tied = rows.loc["ftvvn_ln"]
    assert tied["crossing_status"] == "constant scores" and math.isnan(tied["crossing_pct"]) and tied["n_probes"] == 1
    assert math.isnan(tied["bracket_low_pct"]) and math.isnan(tied["bracket_high_pct"])  # not [0, inf): no lower bound
    assert rows.loc["ahon_ln", "crossing_status"] in ("resolved", "lower bound") and rows.loc["ahon_ln", "n_probes"] > 1
    # its one ablation was evaluated once, on each question once
    specs = {a for a, _ in counted if a.startswith("score:ftvvn_ln")}
    assert len(specs) == 1 and len([1 for a, _ in counted if a in specs]) == 32
    probe = found.probes[found.probes.score_fn == "ftvvn_ln"].iloc[0]
    assert probe.n_items == 32 and probe.pct_zeroed == 100.0 and probe.fraction == 0.3
    # the same Δ by another route: every head zeroed as a static set, against the unablated model
    task = load_task("piqa")
    ids = [r.doc_id for r in select_records(task, 32, cfg.seed)]  # the search's population
    geometry = model.geometry
    every = StaticHeads(tuple((layer, head) for layer in range(geometry.n_layers) for head in range(geometry.n_heads)))
    kw = dict(n_shot=cfg.n_shot, seed=cfg.seed, batch_size=16, progress=False, doc_ids=ids, protocol=cfg.protocol)
    zeroed = evaluate_task(model, task, ablation=parse_ablation(str(every), geometry), **kw)
    plain = evaluate_task(model, task, **kw)
    delta = np.mean([z.correct for z in zeroed.questions]) - np.mean([p.correct for p in plain.questions])
    assert probe.delta_lo == pytest.approx(delta) and probe.delta_hi == pytest.approx(delta)
    # the command line says so instead of a crossing
    capsys.readouterr()
    report_search(SimpleNamespace(out=tmp_path), found)
    printed = capsys.readouterr().out
    line = next(x for x in printed.splitlines() if "ftvvn_ln" in x)
    assert "no crossing" in line and "100.00 % of the units" in line and "within 2 point" not in line


@pytest.mark.slow  # ~2.5 min on 2 cores: the static ranking's scoring pass and 120 five-shot prompts, twice
def test_a_search_on_mmlu_keeps_each_subjects_prefix_across_its_batches(model2k, shared_data, tmp_path, counted):
    """MMLU five-shot: a batch of the search holds questions of many subjects, so the unablated
    and static points run each subject's shared prefix once and keep it for later batches
    (interventions.speculation). Read to the end, every probe's Δ is the one whole forwards give."""
    from lens_heads.data import load_task
    from lens_heads.evaluation.evaluate import evaluate_task
    from lens_heads.forward.task_requests import select_records
    from lens_heads.interventions.ablation import parse_ablation

    model = model2k
    cfg = SweepConfig(task="mmlu", score_ids=[], static_ids=["ahon_ln"], random_seeds=[], limit=120,
                      fractions=[0, 0.5], chunk_questions=40, batch_size=16)
    search = SearchConfig(margin=0.0, resolution=0.25, batch=40)  # three batches of scattered subjects
    found = run_search(model, cfg, search, tmp_path, progress=False)
    task = load_task("mmlu")
    ids = [r.doc_id for r in select_records(task, 120, cfg.seed)]
    kw = dict(n_shot=cfg.n_shot, seed=cfg.seed, batch_size=16, progress=False, reuse_prefix=False)
    read = {}  # ablation -> the questions the search evaluated under it
    for name, doc in counted:
        read.setdefault(name, []).append(doc)
    assert len(read["none"]) == len(set(read["none"])) and len(read) >= 2  # the unablated point and a static one
    truth = {name: {q.doc_id: q.correct for q in evaluate_task(
        model, task, ablation=None if name == "none" else parse_ablation(name, model.geometry),
        doc_ids=sorted(set(docs)), **kw).questions} for name, docs in read.items()}
    full = [p for p in found.probes.itertuples() if p.n_items == 120]
    assert full, "no probe read every question"
    deltas = {round(np.mean([truth[n][d] for d in ids]) - np.mean([truth["none"][d] for d in ids]), 9)
              for n in truth if n != "none" and set(read[n]) == set(ids)}
    for probe in full:
        assert probe.delta_lo == pytest.approx(probe.delta_hi)
        assert round(probe.delta_lo, 9) in deltas
