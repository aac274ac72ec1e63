"""Sweeps: curve metrics on hand-made curves, thresholds vs numpy quantiles, the store, bootstrap
pairing, CLI resume after SIGKILL (tables equal an uninterrupted run), bad input."""

from __future__ import annotations

import json
import math
import os
import re
import signal
import subprocess
import sys
import time

import numpy as np
import pandas as pd
import pytest
import torch

from lens_heads.sweep.curves import bootstrap_indices, crossing_gap, max_within, normalised_auc
from lens_heads.errors import LensHeadsError
from lens_heads.files.atomic import atomic_write_text
from lens_heads.results.keys import Kind, StoreKey
from lens_heads.results.store import ResultStore, config_key
from lens_heads.sweep import plan_points, PointId, SweepConfig, SweepPoint, tables
from lens_heads.interventions.thresholds import parse_fractions, threshold_for, thresholds_from_scores

# --- within 1 point: last crossing on the interpolated curve ------------------------------


def test_max_within_interpolates_the_crossing():
    # 50 -> 49.5 at 5 % -> 47.5 at 10 %: level 49 is crossed a quarter of the way, at 6.25 %
    assert max_within([0, 5, 10], [50, 49.5, 47.5], base=50, tol=1) == pytest.approx(6.25)


def test_max_within_last_crossing_after_a_dip():
    # dips below 49 between 5 and 10 %, comes back at 15 %, leaves for good between 20 and 25 %
    x = [0, 5, 10, 15, 20, 25]
    y = [50, 49.5, 48, 49.6, 49.2, 47.2]
    # last point >= 49 is (20, 49.2); crossing at 20 + (49.2 - 49) / (49.2 - 47.2) * 5 = 20.5
    assert max_within(x, y, base=50, tol=1) == pytest.approx(20.5)


def test_max_within_edge_cases():
    assert max_within([0, 10, 20], [50, 49.8, 49.1], 50) == 20  # never below: the largest x measured
    assert max_within([0, 10], [50, 49.0], 50) == 10  # exactly on the level counts as within
    assert max_within([10, 0, 5], [40, 50, 49.5], 50) == pytest.approx(5 + 0.5 / 9.5 * 5)  # unsorted input
    assert math.isnan(max_within([0, 10], [48, 47], 50))  # the least ablated point is already below
    assert max_within([0, 0.05], [0.5, 0.48], base=0.5, tol=0.01) == pytest.approx(0.025)  # fractions, tol 0.01


def test_crossing_gap_is_the_width_of_the_bracketing_interval():
    assert crossing_gap([0, 5, 10], [50, 49.5, 47.5], base=50, tol=1) == pytest.approx(5)
    assert crossing_gap([0, 100], [50, 25], base=50, tol=1) == pytest.approx(100)  # a jump: pure interpolation
    assert crossing_gap([0, 10, 20], [50, 49.8, 49.1], 50) == 0  # lower bound: nothing interpolated
    assert math.isnan(crossing_gap([0, 10], [48, 47], 50))


def test_normalised_auc():
    assert normalised_auc([0, 10, 20], [50, 50, 50], 50, 20) == pytest.approx(1.0)
    assert normalised_auc([0, 20], [50, 0], 50, 20) == pytest.approx(0.5)
    # trapezoid by hand: [0,10]: (50+40)/2*10 = 450; [10,15]: (40+30)/2*5 = 175 -> 625 / (50*15)
    assert normalised_auc([0, 10, 20], [50, 40, 20], 50, 15) == pytest.approx(625 / 750)
    # beyond the last point the curve is flat at its last value
    assert normalised_auc([0, 10], [50, 40], 50, 20) == pytest.approx((450 + 400) / 1000)
    assert math.isnan(normalised_auc([0], [50], 50, 0))


# --- thresholds -------------------------------------------------------------------------


def test_threshold_low_and_high_against_sorted_values():
    v = torch.tensor([5.0, 1.0, 4.0, 2.0, 3.0, 8.0, 7.0, 6.0, 9.0, 10.0])
    assert threshold_for(v, 0.0, "low") is None and threshold_for(v, 0.0, "high") is None
    assert threshold_for(v, 0.2, "low") == 2.0  # 2 smallest <= tau
    assert threshold_for(v, 0.2, "high") == 9.0  # 2 largest >= tau
    assert threshold_for(v, 0.25, "low") == 3.0  # ceil(2.5) = 3 values
    assert threshold_for(v, 0.3, "low") == 3.0  # 0.3 * 10 is 3.0000000000000004 in floats: still 3
    assert threshold_for(v, 1.0, "low") == 10.0 and threshold_for(v, 1.0, "high") == 1.0
    assert threshold_for(torch.tensor([1.0, float("nan"), 2.0]), 0.5, "low") == 1.0  # NaNs dropped


def test_thresholds_pool_inputs_layers_heads():
    g = torch.Generator().manual_seed(0)
    per_input = {"a": torch.rand(30, 3, 4, generator=g), "b": torch.rand(30, 3, 4, generator=g)}
    th = thresholds_from_scores(per_input, {"a": "low", "b": "high"}, [0.0, 0.05, 0.3])
    pooled_a, pooled_b = per_input["a"].flatten().numpy(), per_input["b"].flatten().numpy()
    n = pooled_a.size
    for p in (0.05, 0.3):
        assert (pooled_a <= th["a"][p]).sum() == math.ceil(p * n)
        assert (pooled_b >= th["b"][p]).sum() == math.ceil(p * n)
        assert th["a"][p] == pytest.approx(np.quantile(pooled_a, p, method="inverted_cdf"))
    assert th["a"][0.0] is None


@pytest.mark.parametrize("bad", [-0.1, 1.5, float("nan")])
def test_threshold_fraction_outside_unit_interval(bad):
    with pytest.raises(LensHeadsError, match=r"in \[0, 1\]"):
        threshold_for(torch.rand(10), bad, "low")


def test_parse_fractions():
    assert parse_fractions("0, 0.05,0.1,0.05") == [0.0, 0.05, 0.1]
    for bad, msg in [("0,1.2", r"in \[0, 1\]"), ("x", "bad fraction"), ("", "no fractions")]:
        with pytest.raises(LensHeadsError, match=msg):
            parse_fractions(bad)


def stored(model, cfg, out, task, partial=False):
    """The sweep's tables from the store alone (no computing)."""
    from lens_heads.sweep import tabulate

    return tabulate(out, cfg.identity(model, task), cfg, task, partial=partial)


# --- store ------------------------------------------------------------------------------


def test_store_round_trip_and_atomicity(tmp_path):
    store = ResultStore(tmp_path)
    cfg = {"model_digest": "abc", "ablation": "random:0.1@0", "limit": None}
    key = StoreKey(Kind.POINT, cfg)
    assert store.get(key) is None
    path = store.put(key, {"metrics": {"acc": 0.5}})
    assert path.parent == tmp_path / "points" and path.stem == config_key(cfg)
    assert store.get(key)["metrics"] == {"acc": 0.5}
    assert config_key({"limit": None, "ablation": "random:0.1@0", "model_digest": "abc"}) == path.stem
    assert config_key({**cfg, "limit": 5}) != path.stem
    assert [p.name for p in (tmp_path / "points").iterdir()] == [path.name]  # no temp files left
    # a file that holds another configuration is refused, not silently used
    path.write_text(json.dumps({"config": {"other": 1}}))
    with pytest.raises(LensHeadsError, match="different configuration"):
        store.get(key)
    path.write_text("{trunc")
    with pytest.raises(LensHeadsError, match="corrupt"):
        store.get(key)


def test_atomic_write_failure_leaves_nothing(tmp_path):
    target = tmp_path / "x.csv"
    target.write_text("old")
    with pytest.raises(TypeError):
        atomic_write_text(target, 123)  # type: ignore[arg-type]  -- fails mid-write
    assert target.read_text() == "old" and sorted(os.listdir(tmp_path)) == ["x.csv"]


# --- tables: bootstrap pairing, random aggregation ----------------------------------------


def _record(correct, zf):
    from lens_heads.evaluation.evaluate import QuestionResult
    from lens_heads.sweep import PointRecord

    qs = [QuestionResult(i, int(not c), 0, bool(c), [0.0, 0.0]) for i, c in enumerate(correct)]
    return PointRecord("t", 0, {"acc": float(np.mean(correct))}, zf, qs, {})


def test_tables_bootstrap_is_paired_and_matches_a_naive_loop():
    rng = np.random.default_rng(3)
    n = 60
    base = rng.random(n) < 0.6
    worse = base & (rng.random(n) < 0.8)  # a subset of the baseline's correct answers
    records = {"none": _record(base, 0.0), "score:s@1.0": _record(worse, 0.1),
               "random:0.1@0": _record(base, 0.1), "random:0.1@1": _record(worse, 0.12)}
    pts = [SweepPoint("s", 0.0, "none"), SweepPoint("s", 0.1, "score:s@1.0", None, 1.0),
           SweepPoint("random", 0.0, "none", 0), SweepPoint("random", 0.1, "random:0.1@0", 0),
           SweepPoint("random", 0.0, "none", 1), SweepPoint("random", 0.1, "random:0.1@1", 1)]
    cfg = SweepConfig(task="t", score_ids=["s"], fractions=[0.0, 0.1], random_seeds=[0, 1], n_boot=300)
    summary, within = tables(pts, records, cfg)

    idx = bootstrap_indices(n, 300, 0)
    naive = np.array([worse[i].mean() - base[i].mean() for i in idx])
    row = summary[summary.spec == "score:s@1.0"].iloc[0]
    assert row.delta == pytest.approx(worse.mean() - base.mean())
    assert row.delta_ci_low == pytest.approx(np.quantile(naive, 0.025))
    assert row.delta_ci_high <= 0  # paired: a subset of correct answers can never score higher
    acc_boot = np.array([worse[i].mean() for i in idx])
    assert row.ci_low == pytest.approx(np.quantile(acc_boot, 0.025))
    assert row.pct_zeroed == pytest.approx(10.0)
    b = summary[summary.spec == "none"].iloc[0]
    assert b.delta == 0 and b.delta_ci_low == 0 and b.delta_ci_high == 0

    r = within.set_index("score_fn").loc["random"]
    x = [0.0, 11.0]
    y = [base.mean(), (base.mean() + worse.mean()) / 2]
    assert r.max_pct_zeroed_within_1pt == pytest.approx(max_within(x, y, base.mean(), 0.01))
    assert r.n_seeds == 2
    assert r.seed_max == pytest.approx(10.0)  # seed 0 never loses accuracy
    s = within.set_index("score_fn").loc["s"]
    assert s.auc_range_pct == pytest.approx(10.0)  # the common range: min over curves of max x
    assert s.auc == pytest.approx(normalised_auc([0, 10], [base.mean(), worse.mean()], base.mean(), 10.0))


def test_a_score_tied_across_heads_gives_no_curve():
    # "flat" ties everywhere: every fraction got the same threshold, whose one point zeroes 100 %;
    # interpolating (0, base) -> (100, chance) would invent a crossing near 2 %
    n = 40
    base = np.arange(n) % 4 != 0  # 75 %
    half = np.arange(n) % 2 == 0  # 50 %
    records = {"none": _record(base, 0.0), "score:flat@1.0": _record(half, 1.0),
               "score:s@0.5": _record(base, 0.1), "score:s@0.4": _record(half, 0.2)}
    pts = [SweepPoint("flat", 0.0, "none"), SweepPoint("flat", 0.1, "score:flat@1.0", None, 1.0),
           SweepPoint("flat", 0.2, "score:flat@1.0", None, 1.0),
           SweepPoint("s", 0.0, "none"), SweepPoint("s", 0.1, "score:s@0.5", None, 0.5),
           SweepPoint("s", 0.2, "score:s@0.4", None, 0.4)]
    cfg = SweepConfig(task="t", score_ids=["flat", "s"], fractions=[0.0, 0.1, 0.2], random_seeds=[], n_boot=50)
    _, within = tables(pts, records, cfg)
    w = within.set_index("score_fn")
    flat, s = w.loc["flat"], w.loc["s"]
    assert math.isnan(flat.max_pct_zeroed_within_1pt) and math.isnan(flat.auc) and math.isnan(flat.ci_low)
    assert "ties" in flat.note and flat.n_ablated_points == 1 and pd.isna(flat.rank_by_auc)
    assert s.note == "" and s.n_ablated_points == 2 and s.rank_by_auc == 1
    assert s.auc_range_pct == pytest.approx(20.0)  # the tied curve's 100 % does not set the common range
    assert s.max_pct_zeroed_within_1pt == pytest.approx(10 + 0.01 / 0.25 * 10)  # level 0.74 on 0.75 -> 0.50
    assert s.crossing_gap_pct == pytest.approx(10.0)


def test_extra_ablations_alone_still_get_a_baseline():
    cfg = SweepConfig(task="t", score_ids=[], random_seeds=[], extra_ablations=["static:0.1"], n_boot=50)
    cfg.validate()
    pts = plan_points(cfg, {})
    assert [p.spec for p in pts] == ["none", "static:0.1"]
    base, worse = np.array([1, 1, 0, 1]), np.array([1, 0, 0, 1])
    summary, within = tables(pts, {"none": _record(base, 0.0), "static:0.1": _record(worse, 0.25)}, cfg)
    row = summary.set_index("spec").loc["static:0.1"]
    assert row.delta == pytest.approx(-0.25) and row.pct_zeroed == pytest.approx(25.0)
    assert within.empty  # no curve to read a within-1-point value from


# --- CLI: resume after SIGKILL, bad input -------------------------------------------------

TASK_ROWS = [
    ("The capital of France is", ["Paris", "Rome", "egg"], 0),
    ("Dormant heads are heads that", ["do nothing", "boil", "Italy"], 0),
    ("To boil an egg, put it in", ["boiling water", "Paris", "heads"], 0),
    ("The capital of Italy is", ["Paris", "Rome", "water"], 1),
    ("Attention heads that do nothing are", ["dormant", "capital", "eggs"], 0),
    ("Question: How do I boil an egg? Answer:", ["put it in water", "Rome", "A B C D"], 0),
]


@pytest.fixture
def task_file(tmp_path):
    path = tmp_path / "mini.jsonl"
    path.write_text("".join(json.dumps({"question": q, "choices": c, "answer": a}) + "\n" for q, c, a in TASK_ROWS))
    return path


def _args(model_dir, task, out, *extra) -> list[str]:
    return ["sweep", str(model_dir), "--task", f"file:{task}", "--scores", "ahon_ln", "--fractions", "0,0.5",
            "--random-seeds", "3", "--batch-size", "4", "--n-boot", "200", "--no-progress", "--out", str(out),
            "--ablate", "static:0.1,1.2", *extra]


def _main(args) -> int:
    from lens_heads.cli import main

    return main(args)


def test_cli_resume_after_sigkill_equals_uninterrupted_run(tiny_model_dir, task_file, tmp_path):
    """Uninterrupted run (in-process) vs a subprocess killed with SIGKILL part-way, then resumed."""
    model_dir = tiny_model_dir("llama")
    full, killed = tmp_path / "full", tmp_path / "killed"
    assert _main(_args(model_dir, task_file, full)) == 0
    n_points = len(list((full / "points").glob("*.json")))
    assert n_points == 1 + 1 + 3 + 1  # baseline, 1 score point, 3 seeds x 1 random point, 1 static

    env = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1", "OMP_NUM_THREADS": "1"}
    code = "import sys; from lens_heads.cli import main; sys.exit(main(sys.argv[1:]))"
    proc = subprocess.Popen([sys.executable, "-c", code, *_args(model_dir, task_file, killed)], env=env,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.time() + 300
    while time.time() < deadline and proc.poll() is None and len(list((killed / "points").glob("*.json"))) < 2:
        time.sleep(0.02)
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    done = {p.name: p.stat().st_mtime_ns for p in (killed / "points").glob("*.json")}
    assert 2 <= len(done) < n_points, f"the run should be killed part-way through ({len(done)} points)"
    assert not (killed / "summary.csv").exists()

    assert _main(_args(model_dir, task_file, killed)) == 0
    for name, mtime in done.items():  # points computed before the kill were not recomputed
        assert (killed / "points" / name).stat().st_mtime_ns == mtime
    assert sorted(p.name for p in (killed / "points").glob("*.json")) == \
        sorted(p.name for p in (full / "points").glob("*.json"))
    for table in ("summary.csv", "within_1pt.csv"):
        assert (full / table).read_bytes() == (killed / table).read_bytes(), table

    summary = pd.read_csv(full / "summary.csv")
    assert {"score_fn", "fraction", "pct_zeroed", "accuracy", "ci_low", "ci_high", "seed", "threshold"} <= set(summary)
    within = pd.read_csv(full / "within_1pt.csv")
    assert set(within.score_fn) == {"ahon_ln", "random"}
    assert {"score_fn", "max_pct_zeroed_within_1pt", "auc", "ci_low", "ci_high"} <= set(within)
    rnd = summary[(summary.score_fn == "random") & (summary.fraction == 0.5)]
    assert sorted(rnd.seed) == [0, 1, 2] and rnd.pct_zeroed.between(20, 80).all()
    sc = summary[(summary.score_fn == "ahon_ln") & (summary.fraction == 0.5)].iloc[0]
    assert 30 < sc.pct_zeroed < 70  # threshold from pooled unablated scores; realised under ablation
    st = summary[summary.score_fn == "static:0.1,1.2"].iloc[0]
    assert st.pct_zeroed == pytest.approx(25.0) and st.spec == "static:0.1,1.2"


@pytest.mark.parametrize("case,msg", [
    ("unknown_task", "Unknown task"),
    ("bad_ablate", "LAYER.HEAD"),
    ("percent_ablate", "--fractions"),
    ("head_range", "out of range"),
    ("fraction", r"in \[0, 1\]"),
    ("empty_task", "empty"),
    ("status_nothing_stored", "holds no baseline"),
])
def test_cli_bad_input(tiny_model_dir, task_file, tmp_path, capsys, case, msg):
    out = tmp_path / "out"
    args = _args(tiny_model_dir("llama"), task_file, out)
    if case == "unknown_task":
        args[args.index("--task") + 1] = "no-such-task"
    elif case == "bad_ablate":
        args += ["--ablate", "static:1"]
    elif case == "percent_ablate":
        args += ["--ablate", "score:ahon_ln@10%"]
    elif case == "head_range":
        args += ["--ablate", "static:0.1,5.0"]
    elif case == "fraction":
        args[args.index("--fractions") + 1] = "0,0.1,1.5"
    elif case == "empty_task":
        empty = tmp_path / "empty.jsonl"
        empty.write_text("")
        args[args.index("--task") + 1] = f"file:{empty}"
    elif case == "status_nothing_stored":
        args += ["--status"]
    capsys.readouterr()
    assert _main(args) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("lens-heads sweep: error:"), err
    assert re.search(msg, err[0]), err[0]
    assert not out.exists(), "no partial output on bad input"


def test_cli_evaluate_at_a_percentage_measures_the_sweeps_point(tiny_model_dir, task_file, tmp_path, capsys):
    """evaluate --ablate score:ahon_ln@50% on the same questions = the sweep's 50 % point: same
    threshold, same per-question predictions, same fraction of heads zeroed."""
    model_dir, out = tiny_model_dir("llama"), tmp_path / "sweep"
    assert _main(["sweep", str(model_dir), "--task", f"file:{task_file}", "--scores", "ahon_ln",
                  "--fractions", "0,0.5", "--random-seeds", "0", "--batch-size", "4", "--n-boot", "50",
                  "--no-progress", "--out", str(out)]) == 0
    row = pd.read_csv(out / "summary.csv").query("score_fn == 'ahon_ln' and fraction == 0.5").iloc[0]
    point = json.loads(next(p for p in (out / "points").glob("*.json")
                            if json.loads(p.read_text())["config"]["ablation"] == row.spec).read_text())
    capsys.readouterr()
    res = tmp_path / "res.jsonl"
    assert _main(["evaluate", str(model_dir), "--task", f"file:{task_file}", "--ablate", "score:ahon_ln@50%",
                  "--batch-size", "4", "--quiet", "--out", str(res)]) == 0
    printed = capsys.readouterr().out
    assert f"threshold {row.spec.split('@')[1]} " in printed, printed  # spec = score:ahon_ln@<repr(tau)>
    assert f"zeroed {row.pct_zeroed:.2f}% of heads ({row.spec})" in printed, printed
    got = [json.loads(x) for x in res.read_text().splitlines()]
    assert [q["pred"] for q in got] == [q["pred"] for q in point["questions"]]


@pytest.mark.parametrize("spec,msg", [("score:ahon_ln@150%", r"\[0, 100\]"), ("score:ahon_ln@ten%", "percentage"),
                                      ("score:nope@10%", "unknown score")])
def test_cli_evaluate_bad_percentage(tiny_model_dir, task_file, tmp_path, capsys, spec, msg):
    out = tmp_path / "res.jsonl"
    assert _main(["evaluate", str(tiny_model_dir("llama")), "--task", f"file:{task_file}", "--ablate", spec,
                  "--quiet", "--out", str(out)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and re.search(msg, err[0]), err
    assert not out.exists()


# --- points stored in parts ---------------------------------------------------------------


def test_parts_merge_to_the_one_shot_point_and_resume(tiny_model, task_file, tmp_path, monkeypatch):
    """A point evaluated in parts of 2 questions equals the point evaluated at once; a run that
    dies after some parts recomputes only the missing ones, and merged parts are removed."""
    import lens_heads.evaluation.evaluate as ev
    from lens_heads.data import load_task
    from lens_heads.sweep import run_sweep

    model, task = tiny_model("llama"), load_task(f"file:{task_file}")
    kw = dict(task=f"file:{task_file}", score_ids=["ahon_ln"], fractions=[0.0, 0.5], random_seeds=[0],
              batch_size=4, n_boot=50, extra_ablations=["static:0.1,1.2"])
    whole = run_sweep(model, SweepConfig(**kw, chunk_questions=None), tmp_path / "whole", task=task, progress=False)

    calls, real = [], ev.evaluate_task

    def dying(*a, **k):
        calls.append(k["doc_ids"])
        if len(calls) == 4:
            raise KeyboardInterrupt("killed")
        return real(*a, **k)

    monkeypatch.setattr(ev, "evaluate_task", dying)
    cfg = SweepConfig(**kw, chunk_questions=2)
    with pytest.raises(KeyboardInterrupt):
        run_sweep(model, cfg, tmp_path / "parts", task=task, progress=False)
    assert calls[:3] == [[0, 1], [2, 3], [4, 5]]  # the baseline in 3 parts, then a part of the next point
    assert len(list((tmp_path / "parts" / "parts").glob("*.json"))) == 0  # baseline merged, its parts gone
    assert len(list((tmp_path / "parts" / "points").glob("*.json"))) == 1

    calls.clear()
    monkeypatch.setattr(ev, "evaluate_task", lambda *a, **k: calls.append(k["doc_ids"]) or real(*a, **k))
    parts = run_sweep(model, cfg, tmp_path / "parts", task=task, progress=False)
    assert len(calls) == 3 * 3  # three more points, three parts each: nothing done twice
    assert not list((tmp_path / "parts" / "parts").glob("*.json"))

    assert whole.records.keys() == parts.records.keys()
    for spec, a in whole.records.items():
        b = parts.records[spec]
        assert [q.pred for q in a.questions] == [q.pred for q in b.questions], spec
        assert np.allclose([q.lls for q in a.questions], [q.lls for q in b.questions], atol=1e-5)
        assert a.metrics == b.metrics
        assert a.zeroed_fraction == pytest.approx(b.zeroed_fraction), spec
        assert b.eval_config["n_questions"] == len(TASK_ROWS)
    assert parts.records["static:0.1,1.2"].zeroed_fraction == pytest.approx(2 / 8)
    pd.testing.assert_frame_equal(whole.summary, parts.summary)


# --- a sweep still running: compute order and partial tables ------------------------------


def test_compute_order_puts_the_reference_first_and_curves_whole():
    from lens_heads.sweep import compute_order

    cfg = SweepConfig(task="piqa", score_ids=["awft", "aeqd"], fractions=[0.0, 0.1, 0.2], random_seeds=[0, 1],
                      extra_ablations=["static:0.1"])
    th = {"awft": {0.0: None, 0.1: 0.3, 0.2: 0.4}, "aeqd": {0.0: None, 0.1: 0.5, 0.2: 0.6}}
    assert compute_order(plan_points(cfg, th)) == [
        "none", "random:0.1@0", "random:0.2@0", "random:0.1@1", "random:0.2@1",
        "score:awft@0.3", "score:awft@0.4", "score:aeqd@0.5", "score:aeqd@0.6", "static:0.1"]


def test_sweep_config_holds_typed_values_parsed_once():
    """Text in, typed values out (one parser each), checked at construction; the config is frozen."""
    import dataclasses

    from lens_heads.interventions.specs import AblationSpec
    from lens_heads.forward.replacement import Mean, Replacement

    cfg = SweepConfig(task="piqa", score_ids=["ahon_ln"], replacement="mean:c4-sample",
                      extra_ablations=["static:3.1,0.2", "random:0.1@0"], first=["ahon_ln@0.1"])
    assert isinstance(cfg.replacement, Mean) and str(cfg.replacement) == "mean:c4-sample"
    assert all(isinstance(e, AblationSpec) for e in cfg.extra_ablations)
    assert cfg.extra_labels == ["static:0.2,3.1", "random:0.1@0"]  # canonical: heads sorted
    assert cfg.first == (PointId("ahon_ln", 0.1),)
    assert SweepConfig(task="piqa", score_ids=[], replacement="zero").replacement is None
    again = SweepConfig(task="piqa", score_ids=["ahon_ln"], replacement=cfg.replacement, first=cfg.first)
    assert isinstance(again.replacement, Replacement) and again.first == cfg.first  # typed values pass through
    with pytest.raises(LensHeadsError, match="unknown ablation kind"):
        SweepConfig(task="piqa", score_ids=[], extra_ablations=["nonsense:1"])
    with pytest.raises(LensHeadsError, match="--scores awft --fractions 0.1"):  # its curves are its percentages
        SweepConfig(task="piqa", score_ids=[], extra_ablations=["score:awft@10%"])
    with pytest.raises(dataclasses.FrozenInstanceError):
        cfg.limit = 5  # type: ignore[misc]


def test_first_points_come_right_after_the_baseline():
    from lens_heads.sweep import compute_order

    cfg = SweepConfig(task="piqa", score_ids=["awft", "aeqd"], fractions=[0.0, 0.1, 0.2], random_seeds=[0, 1],
                      extra_ablations=["static:0.1"], first=["aeqd@0.20", "random@.1@1", "static:0.1", "aeqd@0.2"])
    cfg.validate()
    assert [str(p) for p in cfg.first] == ["aeqd@0.2", "random@0.1@1", "static:0.1"]  # canonical, no duplicates
    assert all(isinstance(p, PointId) for p in cfg.first)  # typed values, one parser
    th = {"awft": {0.0: None, 0.1: 0.3, 0.2: 0.4}, "aeqd": {0.0: None, 0.1: 0.5, 0.2: 0.6}}
    assert compute_order(plan_points(cfg, th), cfg.first) == [
        "none", "score:aeqd@0.6", "random:0.1@1", "static:0.1", "random:0.1@0", "random:0.2@0", "random:0.2@1",
        "score:awft@0.3", "score:awft@0.4", "score:aeqd@0.5"]
    with pytest.raises(LensHeadsError, match="no point of this sweep"):
        compute_order(plan_points(cfg, th), ["awft@0.3"])


@pytest.mark.parametrize("label,msg", [
    ("ahon_ln@0.07", "fractions > 0 are 0.5"), ("ahon_ln@0", "fractions > 0 are"), ("random@0.5", "write ID@FRACTION"),
    ("random@0.5@7", "random seeds are"), ("awft@0.5", "not among the sweep's score functions"),
    ("ahon_ln", "write ID@FRACTION"), ("ahon_ln@half", "write ID@FRACTION")])
def test_cli_bad_first_point_fails_before_anything_is_written(tiny_model_dir, task_file, tmp_path, capsys,
                                                               label, msg):
    out = tmp_path / "out"
    capsys.readouterr()
    assert _main(_args(tiny_model_dir("llama"), task_file, out, "--first", label)) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and re.search(msg, err[0]), err
    assert not out.exists()


def test_first_points_are_evaluated_first_and_a_stopped_run_shows_them(tiny_model, task_file, tmp_path,
                                                                       monkeypatch):
    """With first=[ahon_ln@0.5, random@0.5@1], a run killed after three points holds the baseline
    and exactly those two; the partial tables list both, with the values the finished sweep gives."""
    import lens_heads.sweep as sw
    import lens_heads.sweep.run as sw_run
    from lens_heads.data import load_task

    model, task = tiny_model("llama"), load_task(f"file:{task_file}")
    cfg = lambda: SweepConfig(task=f"file:{task_file}", score_ids=["awft", "ahon_ln"], fractions=[0.0, 0.5],  # noqa: E731
                              random_seeds=[0, 1], batch_size=4, n_boot=100, first=["ahon_ln@0.5", "random@0.5@1"])
    done, real = [], sw_run.run_unit

    def dying(model, task, plan, unit, store):  # each point is one unit here (chunk > questions)
        if len(done) == 3:
            raise KeyboardInterrupt("killed")
        done.append(unit.spec)
        return real(model, task, plan, unit, store)

    monkeypatch.setattr(sw_run, "run_unit", dying)
    with pytest.raises(KeyboardInterrupt):
        sw.run_sweep(model, cfg(), tmp_path / "s", task=task, progress=False)
    assert done[0] == "none" and done[1].startswith("score:ahon_ln@") and done[2] == "random:0.5@1"
    part = sw.sweep_status(model, cfg(), tmp_path / "s", task=task)
    assert set(part.summary.spec) == set(done)
    assert set(part.within.score_fn) == {"ahon_ln", "random"}  # ahon_ln whole, random: seed 1 alone
    monkeypatch.setattr(sw_run, "run_unit", real)
    full = sw.run_sweep(model, cfg(), tmp_path / "s", task=task, progress=False)
    cols = ["spec", "accuracy", "pct_zeroed", "delta", "delta_ci_low", "delta_ci_high"]
    pd.testing.assert_frame_equal(full.summary[full.summary.spec.isin(done)].drop_duplicates("spec")[cols]
                                  .reset_index(drop=True),
                                  part.summary.drop_duplicates("spec")[cols].reset_index(drop=True))
    w = ["max_pct_zeroed_within_1pt", "ci_low", "ci_high"]
    assert np.allclose(full.within.set_index("score_fn").loc["ahon_ln", w].astype(float),
                       part.within.set_index("score_fn").loc["ahon_ln", w].astype(float), equal_nan=True)


def test_a_narrower_sweep_reuses_a_wider_sweeps_thresholds(tiny_model, task_file, tmp_path, monkeypatch):
    """Thresholds stored by a sweep of (ahon_ln, awft) x (0, 0.25, 0.5) serve a sweep of (awft) x
    (0, 0.5), named in another order or not: no scoring pass, the same specs and records."""
    import lens_heads.interventions.thresholds as th
    from lens_heads.data import load_task
    from lens_heads.sweep import run_sweep

    model, task = tiny_model("llama"), load_task(f"file:{task_file}")
    kw = dict(task=f"file:{task_file}", random_seeds=[], batch_size=4, n_boot=50)
    wide = run_sweep(model, SweepConfig(score_ids=["ahon_ln", "awft"], fractions=[0.0, 0.25, 0.5], **kw),
                     tmp_path / "s", task=task, progress=False)
    monkeypatch.setattr(th, "compute_thresholds", lambda *a, **k: pytest.fail("thresholds recomputed"))
    for ids in (["awft"], ["awft", "ahon_ln"]):
        narrow = stored(model, SweepConfig(score_ids=ids, fractions=[0.0, 0.5], **kw), tmp_path / "s", task)
        assert narrow is not None and narrow.complete
        assert narrow.thresholds == {sid: {0.0: None, 0.5: wide.thresholds[sid][0.5]} for sid in ids}
        w = wide.summary[wide.summary.fraction.isin([0.0, 0.5]) & wide.summary.score_fn.isin(ids)]
        assert sorted(narrow.summary.spec) == sorted(w.spec)
    assert len(list((tmp_path / "s" / "thresholds").glob("*.json"))) == 1
    # another fraction is not in the stored record: that sweep has no thresholds yet
    assert stored(model, SweepConfig(score_ids=["awft"], fractions=[0.0, 0.3], **kw), tmp_path / "s", task) is None


def test_partial_tables_hold_the_complete_curves_with_their_final_values(tiny_model, task_file, tmp_path):
    """A store missing one point of a function and one of a random seed tabulates the other
    curves exactly as the finished sweep does, writes nothing, and says how much is stored."""
    from lens_heads.sweep.curves import max_within
    from lens_heads.data import load_task
    from lens_heads.results.store import ResultStore
    from lens_heads.sweep import run_sweep

    model, task = tiny_model("llama"), load_task(f"file:{task_file}")
    cfg = lambda: SweepConfig(task=f"file:{task_file}", score_ids=["ahon_ln", "awft"], fractions=[0.0, 0.25, 0.5],  # noqa: E731
                              random_seeds=[0, 1], batch_size=4, n_boot=100, extra_ablations=["static:0.1,1.2"])
    out = tmp_path / "sweep"
    full = run_sweep(model, cfg(), out, task=task, progress=False)
    assert full.complete and full.n_points == full.n_stored == 1 + 2 * 2 + 2 * 2 + 1

    store, identity = ResultStore(out), cfg().identity(model, task)
    awft_spec = full.summary.query("score_fn == 'awft' and fraction == 0.5").spec.iloc[0]
    for spec, fn in ((awft_spec, "awft"), ("random:0.25@1", "random")):
        store.path(identity.point(spec, fn)).unlink()
    before = {p: p.stat().st_mtime_ns for p in out.rglob("*") if p.is_file()}

    assert stored(model, cfg(), out, task) is None
    part = stored(model, cfg(), out, task, partial=True)
    assert {p: p.stat().st_mtime_ns for p in out.rglob("*") if p.is_file()} == before  # nothing written
    assert not part.complete and (part.n_points, part.n_stored) == (full.n_points, full.n_points - 2)
    assert set(part.within.score_fn) == {"ahon_ln", "random"}
    # the summary has every stored point, those of curves still incomplete too, with the finished values
    assert set(part.summary.spec) == set(full.summary.spec) - {awft_spec, "random:0.25@1"}
    cols_p = ["spec", "pct_zeroed", "accuracy", "ci_low", "ci_high", "delta", "delta_ci_low", "delta_ci_high"]
    kept = full.summary[full.summary.spec.isin(part.summary.spec)].drop_duplicates("spec")[cols_p]
    pd.testing.assert_frame_equal(kept.set_index("spec").sort_index(),
                                  part.summary.drop_duplicates("spec")[cols_p].set_index("spec").sort_index())

    cols = ["max_pct_zeroed_within_1pt", "ci_low", "ci_high", "crossing_gap_pct", "base_accuracy"]
    f, p = full.within.set_index("score_fn"), part.within.set_index("score_fn")
    assert np.allclose(f.loc["ahon_ln", cols].astype(float), p.loc["ahon_ln", cols].astype(float), equal_nan=True)
    seed0 = full.summary.query("score_fn == 'random' and seed == 0").sort_values("fraction")
    assert p.loc["random", "n_seeds"] == 1
    assert p.loc["random", "max_pct_zeroed_within_1pt"] == pytest.approx(
        max_within(seed0.pct_zeroed.to_numpy(), seed0.accuracy.to_numpy(), float(seed0.accuracy.iloc[0]), 0.01))
    shared = ["spec", "pct_zeroed", "accuracy", "delta", "delta_ci_low", "delta_ci_high"]
    pd.testing.assert_frame_equal(full.summary.query("score_fn == 'ahon_ln'")[shared].reset_index(drop=True),
                                  part.summary.query("score_fn == 'ahon_ln'")[shared].reset_index(drop=True))

    store.path(identity.point("none")).unlink()
    assert stored(model, cfg(), out, task, partial=True) is None


def test_cli_status_shows_a_stopped_sweeps_complete_curves(tiny_model_dir, task_file, tmp_path, capsys,
                                                           monkeypatch):
    """sweep --status on a store missing one random point: the counts, the function's final value
    as the finished run printed it, random left out, no AUC; it computes and writes nothing."""
    model_dir, out = tiny_model_dir("llama"), tmp_path / "out"
    assert _main(_args(model_dir, task_file, out)) == 0
    full = capsys.readouterr().out
    ahon_line = next(line for line in full.splitlines() if line.strip().startswith("ahon_ln"))
    rnd = [f for f in (out / "points").glob("*.json") if json.loads(f.read_text())["config"]["ablation"] == "random:0.5@2"]
    assert len(rnd) == 1
    rnd[0].unlink()
    before = {p: p.stat().st_mtime_ns for p in out.rglob("*") if p.is_file()}

    import lens_heads.models as models

    monkeypatch.setattr(models, "load_model", lambda *a, **k: pytest.fail("--status loaded the model"))
    assert _main(_args(model_dir, task_file, out, "--status")) == 0
    shown = capsys.readouterr().out.splitlines()
    assert shown[0] == "5 of 6 units and 5 of 6 points stored" and shown[1] == full.splitlines()[0]  # baseline
    ahon = next(line for line in shown if line.strip().startswith("ahon_ln"))
    assert ahon == ahon_line.split("  AUC")[0]
    # random: seed 2 is incomplete, so the curve is the mean of seeds 0 and 1
    from lens_heads.sweep.curves import max_within

    summ = pd.read_csv(out / "summary.csv")
    two = summ[(summ.score_fn == "random") & (summ.fraction == 0.5) & summ.seed.isin([0, 1])]
    base = float(summ.loc[summ.spec == "none", "accuracy"].iloc[0])
    w = max_within(np.array([0.0, two.pct_zeroed.mean()]), np.array([base, two.accuracy.mean()]), base, 0.01)
    rnd_line = next(line for line in shown if line.strip().startswith("random"))
    assert f"up to {w:6.2f} % zeroed" in rnd_line and "AUC" not in rnd_line
    assert {p: p.stat().st_mtime_ns for p in out.rglob("*") if p.is_file()} == before


def test_cli_status_lists_the_points_of_curves_not_complete(tiny_model_dir, task_file, tmp_path, capsys):
    """A random seed missing its 50 % point: --status lists its stored 25 % point on its own, with the
    change against the baseline the finished sweep's summary.csv gives it."""
    model_dir, out = tiny_model_dir("llama"), tmp_path / "out"
    args = ["sweep", str(model_dir), "--task", f"file:{task_file}", "--scores", "ahon_ln", "--fractions", "0,0.25,0.5",
            "--random-seeds", "1", "--batch-size", "4", "--n-boot", "200", "--no-progress", "--out", str(out)]
    assert _main(args) == 0
    capsys.readouterr()
    summ = pd.read_csv(out / "summary.csv").set_index("spec")
    [gone] = [f for f in (out / "points").glob("*.json") if json.loads(f.read_text())["config"]["ablation"] == "random:0.5@0"]
    gone.unlink()
    assert _main(args + ["--status"]) == 0
    shown = capsys.readouterr().out.splitlines()
    head = shown.index("points of curves not complete yet (change against the baseline, 95% paired CI, in points):")
    [line] = shown[head + 1:]
    r = summ.loc["random:0.25@0"]
    assert line.split()[0] == "random:0.25@0" and f"{r.pct_zeroed:6.2f} % zeroed" in line
    assert line.endswith(f"{100 * r.delta:+.1f} [{100 * r.delta_ci_low:+.1f}, {100 * r.delta_ci_high:+.1f}]")
    assert not any(ln.strip().startswith("random ") for ln in shown)  # no random curve: its one seed is incomplete


def test_sweep_result_saves_and_loads_back(tiny_model, task_file, tmp_path):
    """SweepResult.load gives back the tables run_sweep wrote, its thresholds, and (with_records)
    the stored point records by the summary's point_hash; the tables are byte-identical on re-save."""
    from lens_heads.data import load_task
    from lens_heads.sweep import SweepResult, run_sweep

    model, task = tiny_model("llama"), load_task(f"file:{task_file}")
    cfg = SweepConfig(task=f"file:{task_file}", score_ids=["ahon_ln"], fractions=[0.0, 0.5], random_seeds=[0],
                      batch_size=4, n_boot=50)
    out = tmp_path / "s"
    result = run_sweep(model, cfg, out, task=task, progress=False)
    back = SweepResult.load(out, with_records=True)
    pd.testing.assert_frame_equal(back.summary, result.summary, check_dtype=False)
    pd.testing.assert_frame_equal(back.within, result.within, check_dtype=False)
    assert back.thresholds == {"ahon_ln": {0.5: result.thresholds["ahon_ln"][0.5]}}  # none at 0: nothing zeroed
    assert back.records == result.records and back.complete and back.n_points == len(result.records)
    before = {p.name: p.read_bytes() for p in out.glob("*.csv")}
    back.save(tmp_path / "again")
    assert {p.name: p.read_bytes() for p in (tmp_path / "again").glob("*.csv")} == before


# --- static curves ------------------------------------------------------------------------


def test_static_curves_zero_the_least_active_heads_by_each_ranking(tiny_model, task_file, tmp_path, monkeypatch):
    """static:ID zeroes the ceil(p x heads) least active heads by the dataset-level score, on
    every input: the sets equal HeadScores.least_active of an independent scoring pass, each
    point's accuracy equals evaluate_task with that set, and the tables come back from the store."""
    from lens_heads.data import load_task
    from lens_heads.forward.task_requests import task_inputs
    from lens_heads.evaluation.evaluate import evaluate_task
    from lens_heads.interventions.ablation import bind
    from lens_heads.interventions.specs import StaticHeads, parse_spec
    from lens_heads.scores import score_heads
    from lens_heads.scores.attribution import atp_scores
    from lens_heads.sweep import run_sweep, tabulate

    monkeypatch.setenv("LENS_HEADS_CACHE", str(tmp_path / "cache"))
    model, task = tiny_model("llama"), load_task(f"file:{task_file}")
    cfg = SweepConfig(task=f"file:{task_file}", score_ids=["ahon_ln"], static_ids=["ahon_ln", "atp", "random"],
                      fractions=[0.0, 0.25, 0.5], random_seeds=[0, 1], batch_size=4, n_boot=100)
    res = run_sweep(model, cfg, tmp_path / "s", progress=False)
    n = model.geometry.n_layers * model.geometry.n_heads
    rankings = {"static:ahon_ln": score_heads(model, task_inputs(model, task), ["ahon_ln"]).least_active("ahon_ln"),
                "static:atp": atp_scores(model, task, progress=False).least_active("atp")}
    s = res.summary
    random_sets = {}
    for row in s[s["score_fn"].str.startswith("static:") & (s["fraction"] > 0)].itertuples():
        k = math.ceil(row.fraction * n)
        assert row.pct_zeroed == pytest.approx(100 * k / n)
        heads = parse_spec(row.spec)
        assert isinstance(heads, StaticHeads) and len(heads.heads) == k
        if row.score_fn in rankings:
            assert heads == StaticHeads(tuple(rankings[row.score_fn][:k]))
        else:
            random_sets[(row.seed, row.fraction)] = set(heads.heads)
        alone = evaluate_task(model, task, ablation=bind(heads, model.geometry), batch_size=4, progress=False)
        assert row.accuracy == pytest.approx(alone.metrics["acc"])
    assert random_sets[(0, 0.25)] <= random_sets[(0, 0.5)] and random_sets[(0, 0.5)] != random_sets[(1, 0.5)]
    w = res.within.set_index("score_fn")
    assert {"ahon_ln", "random", "static:ahon_ln", "static:atp", "static:random"} == set(w.index)
    assert w.loc["static:random", "n_seeds"] == 2 and w.loc["static:ahon_ln", "n_ablated_points"] == 2
    back = tabulate(tmp_path / "s", cfg.identity(model, task), cfg, task, model=model.name)
    pd.testing.assert_frame_equal(back.within, res.within)
    files = sorted(p.name for p in (tmp_path / "s").rglob("*.json"))
    run_sweep(model, cfg, tmp_path / "s", progress=False)  # everything stored: nothing new
    assert sorted(p.name for p in (tmp_path / "s").rglob("*.json")) == files


def test_static_point_ids_round_trip_and_first_checks_them():
    from lens_heads.sweep import PointId

    for text in ["static:ahon_ln@0.25", "static:random@0.5@1", "static:atp@0.1"]:
        assert str(PointId.parse(text)) == text
    with pytest.raises(LensHeadsError, match="static:random@FRACTION@SEED"):
        PointId.parse("static:random@0.5")
    ok = SweepConfig(task="piqa", score_ids=[], static_ids=["ahon_ln", "random"], fractions=[0, 0.5],
                     first=["static:random@0.5@1", "static:ahon_ln@0.5"])
    ok.validate()
    for first, msg in [("static:awft@0.5", "not among"), ("static:random@0.5@7", "random seeds")]:
        with pytest.raises(LensHeadsError, match=msg):
            SweepConfig(task="piqa", score_ids=[], static_ids=["ahon_ln", "random"], fractions=[0, 0.5],
                        first=[first]).validate()
    with pytest.raises(LensHeadsError, match="unknown score 'nope'"):
        SweepConfig(task="piqa", score_ids=[], static_ids=["nope"]).validate()
    with pytest.raises(LensHeadsError, match="need random seeds"):
        SweepConfig(task="piqa", score_ids=[], static_ids=["random"], random_seeds=[]).validate()


@pytest.mark.parametrize("extra, msg", [
    (["--static", "nope"], "unknown score 'nope'"),
    (["--static", "random", "--random-seeds", "0"], "need random seeds"),
    (["--scores", "atp", "--shard", "0/2"], "one process"),
])
def test_cli_bad_static_curves_fail_before_anything_is_written(tiny_model_dir, task_file, tmp_path, capsys,
                                                                extra, msg):
    from lens_heads.cli import main

    out = tmp_path / "s"
    assert main([*_args(tiny_model_dir("llama"), task_file, out), *extra]) == 2
    assert msg in capsys.readouterr().err and not out.exists()


def test_a_folder_swept_with_other_weights_is_refused_and_tables_name_their_model(tiny_model_dir, task_file,
                                                                                   tmp_path, capsys):
    """A sweep folder of one model is never overwritten by another's (a path whose target changed):
    the in-process driver refuses exactly as the launcher does, before any work, the same settings
    (the store's records) or others (the tables' model digest); both tables start with the model's
    name and weights digest."""
    from lens_heads.models.load import resolve_source, source_digest
    from lens_heads.sweep import SweepResult

    link, out = tmp_path / "model", tmp_path / "out"
    link.symlink_to(tiny_model_dir("llama"), target_is_directory=True)
    assert _main(_args(link, task_file, out)) == 0
    tables = {p.name: p.read_bytes() for p in out.glob("*.csv")}
    saved = SweepResult.load(out)
    digest = source_digest(resolve_source(str(link)))
    assert saved.model == str(link) and saved.model_digest == digest
    for name in ("summary.csv", "within_1pt.csv"):
        frame = pd.read_csv(out / name)
        assert list(frame.columns[:2]) == ["model", "model_digest"]
        assert set(frame["model_digest"]) == {digest} and set(frame["model"]) == {str(link)}

    link.unlink()
    link.symlink_to(tiny_model_dir("qwen2"), target_is_directory=True)  # same path, other weights
    for extra in ([], ["--fractions", "0,0.25"]):  # the same sweep; another sweep into the same tables
        capsys.readouterr()
        assert _main(_args(link, task_file, out, *extra)) == 2
        err = capsys.readouterr().err.strip()
        assert "from other weights" in err and len(err.splitlines()) == 1, err
        assert {p.name: p.read_bytes() for p in out.glob("*.csv")} == tables


def test_a_sweep_config_is_checked_at_construction_and_frozen():
    """Bad settings fail when the config is made, normalisation happens once, and a changed
    setting is a new config (dataclasses.replace), never an in-place edit."""
    import dataclasses

    with pytest.raises(LensHeadsError, match="limit must be >= 1"):
        SweepConfig(task="piqa", score_ids=["ahon_ln"], limit=0)
    with pytest.raises(LensHeadsError, match="random seeds must be >= 0"):
        SweepConfig(task="piqa", score_ids=[], random_seeds=[-1])
    cfg = SweepConfig(task="piqa", score_ids=["awft", "awft"], fractions=[0.3, 0.1, 0.1], replacement="zero")
    assert cfg.fractions == [0.0, 0.1, 0.3] and cfg.score_ids == ["awft"] and cfg.replacement is None
    with pytest.raises(dataclasses.FrozenInstanceError):
        cfg.limit = 5  # type: ignore[misc]
    smaller = dataclasses.replace(cfg, limit=5)
    assert smaller.limit == 5 and cfg.limit is None and smaller.fractions == cfg.fractions


def test_run_sweep_is_the_in_process_executor_of_the_one_launch(tiny_model, task_file, tmp_path, monkeypatch):
    """One driver: run_sweep is launch with the in-process session, and launch, tabulate and
    --status read their plan through one function (run.stored_plan)."""
    import lens_heads.sweep.executors as executors
    import lens_heads.sweep.run as sw_run
    from lens_heads.data import load_task
    from lens_heads.sweep import run_sweep, tabulate

    model, task = tiny_model("llama"), load_task(f"file:{task_file}")
    cfg = SweepConfig(task=f"file:{task_file}", score_ids=["ahon_ln"], fractions=[0.0, 0.5], random_seeds=[0],
                      batch_size=4, n_boot=50)
    sessions, plans = [], []
    real_launch, real_plan = executors.launch, sw_run.stored_plan
    monkeypatch.setattr(executors, "launch", lambda job, *a, **k: sessions.append(type(k["session"]).__name__)
                        or real_launch(job, *a, **k))
    monkeypatch.setattr(sw_run, "stored_plan", lambda *a, **k: plans.append(1) or real_plan(*a, **k))
    result = run_sweep(model, cfg, tmp_path / "s", task=task, progress=False)
    assert sessions == ["InProcessSession"] and len(plans) >= 2  # the session's part phase and the launch
    n = len(plans)
    back = tabulate(tmp_path / "s", cfg.identity(model, task), cfg, task, model=model.name)
    assert len(plans) == n + 1
    pd.testing.assert_frame_equal(back.summary, result.summary)
