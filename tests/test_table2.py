"""analyses/table2.py, the adaptive Table 2 campaign, end to end at toy size (the tiny llama as
all three models, 32 PIQA questions, a 25 % grid): a run stopped by its time limit and resumed
evaluates exactly what one uninterrupted run does, item for item; the tables come back byte for
byte from a rerun with nothing to compute, and from the committed files alone on a machine
without the per-item store; a commit takes the results folder's named files only."""

from __future__ import annotations

import math
import shutil
import subprocess
from pathlib import Path

import pandas as pd
import pytest

from test_analyses import ANALYSES


def script(name: str):
    """analyses/<name>.py as a module, registered in sys.modules (its dataclasses need that)."""
    import importlib.util
    import sys

    if str(ANALYSES) not in sys.path:
        sys.path.insert(0, str(ANALYSES))
    key = f"analyses_{name}"
    if key not in sys.modules:
        spec = importlib.util.spec_from_file_location(key, ANALYSES / f"{name}.py")
        module = importlib.util.module_from_spec(spec)
        sys.modules[key] = module
        spec.loader.exec_module(module)
    return sys.modules[key]

pytestmark = pytest.mark.usefixtures("one_torch_thread")


def argv(model: Path, out: Path, *extra: str) -> list[str]:
    m = str(model)
    return ["--out", str(out), "--models", f"smollm2-135m={m},gemma-3-270m={m},qwen2.5-coder-0.5b={m}",
            "--only", "smollm2-135m/piqa/zero", "--scores", "ahon_ln,awft", "--mean-scores", "ahon_ln", "--seeds", "2", "--static", "ahon_ln",
            "--limit", "32", "--range", "0.5", "--resolution", "25", "--margin", "5", "--alpha", "0.2",
            "--search-batch", "8", "--batch-size", "8", "--dtype", "float32", "--no-progress", *extra]


def outputs(out: Path) -> dict[str, bytes]:
    names = [p for p in out.rglob("*") if p.is_file() and (p.name.startswith("table2_") or p.suffix == ".png")]
    return {str(p.relative_to(out)): p.read_bytes() for p in sorted(names)}


def test_work_list_is_the_issues_order():
    t2 = script("table2")
    args = t2.parse_args([])
    units = t2.work_list(args)
    groups = list(dict.fromkeys((u.group.model, u.group.task, u.group.ablation) for u in units))
    assert groups[:5] == [("smollm2-135m", "piqa", "zero"), ("gemma-3-270m", "piqa", "zero"),
                          ("qwen2.5-coder-0.5b", "piqa", "zero"), ("qwen2.5-coder-0.5b", "mmlu", "zero"),
                          ("gemma-3-270m", "winogrande", "zero")]
    assert all(g[2] == "mean_c4" for g in groups[5:]) and len(groups) == 10
    piqa = [u.curve for u in units if u.group.name == "smollm2-135m__piqa__zero"]
    assert piqa[:4] == ["random", "awft", "ahon_ln", "lthon_ln"] and len(piqa) == 12 + 1 + 1
    assert piqa[-1] == "static:ahon_ln"
    mmlu = [u for u in units if u.group.name == "qwen2.5-coder-0.5b__mmlu__zero"]
    assert [u.curve for u in mmlu if u.stage == 4] == ["random", "awft", "ahon_ln", "lthon_ln"]
    assert len({u.curve for u in mmlu}) == 14 and {u.stage for u in mmlu} == {4, 6}
    cfg = t2.sweep_cfg(args, mmlu[0].group)
    assert cfg.limit == 2000 and cfg.fractions == [0.0, 0.6] and cfg.random_seeds == [0, 1, 2]
    grid = t2.search_settings(args).grid(0.6)
    assert len(grid) == 61 and grid[1] == 0.01
    mean = [u for u in units if u.group.ablation == "mean_c4"]
    assert {u.curve for u in mean} == {"random", "awft", "ahon_ln", "lthon_ln"}
    assert str(t2.sweep_cfg(args, mean[0].group).replacement) == "mean:c4"


def test_bad_arguments_get_one_line_and_exit_2_before_any_work(tmp_path):
    """The dtype check compares a bfloat16 search with float32: asked of the float32 campaign, it
    says so (one line, exit 2) and writes nothing."""
    import sys

    out = tmp_path / "out"
    for extra, says in ((["--check-dtype"], "add --dtype bfloat16"), (["--dtype", "float16"], "--dtype:"),
                        (["--time-limit", "0"], "--time-limit must be > 0"),
                        (["--workers", "999"], "CPU cores are usable here")):
        got = subprocess.run([sys.executable, str(ANALYSES / "table2.py"), "--out", str(out), *extra],
                             capture_output=True, text=True, timeout=120)
        assert got.returncode == 2, (extra, got.stderr)
        assert got.stderr.count("\n") == 1 and says in got.stderr and "Traceback" not in got.stderr
        assert not out.exists()


def test_the_campaign_stops_resumes_and_regenerates_byte_for_byte(tiny_llama_2k, shared_data, tmp_path, counted,
                                                                monkeypatch):
    from lens_heads.sweep import adaptive

    t2 = script("table2")
    ref_out, out = tmp_path / "ref", tmp_path / "run"
    assert t2.main(argv(tiny_llama_2k, ref_out)) == 0
    one_go = list(counted)
    assert one_go and len(set(one_go)) == len(one_go)
    cross = pd.read_csv(ref_out / "table2_crossings.csv")
    mine = cross[(cross.model == "smollm2-135m") & (cross.ablation == "zero")]
    assert list(mine.score_fn) == ["random", "awft", "ahon_ln", "static:ahon_ln"]
    assert set(mine.status) <= {"resolved", "lower bound"}
    assert (cross.drop(index=mine.index).status == "not started").all()
    assert (mine.grid7_items == 6 * 32 * pd.Series([2, 1, 1, 1], index=mine.index)).all()
    assert (mine.eval_items > 0).all() and (mine.eval_seconds > 0).all()
    assert mine.eval_hours.to_list() == pytest.approx((mine.eval_seconds / 3600).to_list(), abs=1e-6)
    # each row's items: what its probes' points hold, counted independently from the per-item store
    probes = pd.read_csv(ref_out / "table2_probes.csv")
    assert set(probes.score_fn) == set(mine.score_fn)

    # a run whose time is up after three batches: it stops between batches, and a rerun resumes
    counted.clear()
    real, calls = adaptive.StoreItems._evaluate, []

    def timed(self, spec, ids):
        calls.append(spec)
        if len(calls) == 3:
            self.deadline = -1.0  # the clock has passed the deadline: no further batch starts
        return real(self, spec, ids)

    monkeypatch.setattr(adaptive.StoreItems, "_evaluate", timed)
    assert t2.main(argv(tiny_llama_2k, out, "--time-limit", "600")) == 0
    assert len(calls) == 3
    stopped = pd.read_csv(out / "table2_crossings.csv")
    assert (stopped.status == "pending").any() or (stopped.status == "not started").any()
    monkeypatch.setattr(adaptive.StoreItems, "_evaluate", real)
    assert t2.main(argv(tiny_llama_2k, out)) == 0
    assert sorted(counted) == sorted(one_go)  # stopped + resumed = one run, item for item
    timing = ["eval_seconds", "eval_hours", "grid7_est_hours"]
    a, b = (pd.read_csv(o / "table2_crossings.csv").drop(columns=timing) for o in (ref_out, out))
    pd.testing.assert_frame_equal(a, b)
    runs = pd.read_csv(out / "table2_runs.csv")
    assert list(runs.stopped_at_time_limit) == [True, False] and runs.items_evaluated.sum() == len(one_go)
    assert list(runs.batch_size) == [8, 8]

    # nothing left to compute: every file again, byte for byte, and nothing evaluated
    before = outputs(out)
    counted.clear()
    assert t2.main(argv(tiny_llama_2k, out)) == 0
    assert counted == [] and outputs(out) == before
    assert t2.main(argv(tiny_llama_2k, out, "--tabulate-only")) == 0
    assert outputs(out) == before

    # a fresh machine: only the files a commit takes (no per-item points or parts)
    fresh = tmp_path / "fresh"
    for p in t2.result_paths(out):
        dest = fresh / p.relative_to(out)
        dest.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(p, dest)
    assert not list(fresh.rglob("points")) and not list(fresh.rglob("parts"))
    committed = sum(p.stat().st_size for p in fresh.rglob("*") if p.is_file())
    assert committed < 200_000
    for p in list(fresh.glob("table2_*")) + list(fresh.rglob("*.png")):
        if p.name in t2.TABLES:  # the tables and figures go; the run log (table2_runs.csv) is a record, it stays
            p.unlink()
    for p in fresh.rglob("*.png"):
        p.unlink()
    assert t2.main(argv(tiny_llama_2k, fresh)) == 0
    assert counted == [] and outputs(fresh) == outputs(out)


def test_a_commit_takes_the_results_only(tiny_llama_2k, shared_data, tmp_path):
    t2 = script("table2")
    repo = tmp_path / "repo"
    out = repo / "analyses" / "results" / "inactive_heads"
    out.mkdir(parents=True)
    git = lambda *a: subprocess.run(["git", "-C", str(repo), *a], check=True, capture_output=True, text=True)  # noqa: E731
    git("init", "-q")
    git("config", "user.email", "t@example.com")
    git("config", "user.name", "t")
    (repo / "other.txt").write_text("not a result\n")
    git("add", "other.txt")  # staged, not the campaign's: it must stay out of the campaign's commit
    (repo / "untracked.txt").write_text("x\n")
    assert t2.main(argv(tiny_llama_2k, out, "--commit-every", "0.001", "--only", "smollm2-135m/piqa/zero/random")) == 0
    log = git("log", "--name-only", "--format=").stdout
    files = {line for line in log.splitlines() if line.strip()}
    assert files and all(f.startswith("analyses/results/inactive_heads/") for f in files)
    assert not any("/points/" in f or "/parts/" in f for f in files)
    assert any(f.endswith("ledger_zero.json") for f in files) and any("/thresholds/" in f for f in files)
    assert "other.txt" not in log and "untracked.txt" not in log
    subjects = git("log", "--format=%s").stdout
    assert "running" in subjects  # checkpoints between batches inside a curve, not only after it
    assert "other.txt" in git("diff", "--cached", "--name-only").stdout  # still staged, untouched


def test_a_scoring_pass_that_does_not_fit_the_time_left_waits(tiny_llama_2k, shared_data, tmp_path, counted,
                                                             monkeypatch, capsys):
    """With a time limit shorter than a shard of a group's scoring pass may take, the group is left
    for a longer run (nothing loaded, nothing evaluated) and the tables say it is not started."""
    from lens_heads import models

    t2 = script("table2")
    monkeypatch.setattr(models, "load_model", lambda *a, **k: pytest.fail("loaded a model"))
    assert t2.main(argv(tiny_llama_2k, tmp_path, "--time-limit", "5", "--pass-minutes", "piqa=24")) == 0
    assert "skipped for now" in capsys.readouterr().out and counted == []
    cross = pd.read_csv(tmp_path / "table2_crossings.csv")
    assert (cross.status == "not started").all()


def test_a_shard_measured_before_bounds_the_next_ones_start(tiny_llama_2k, shared_data, tmp_path, counted,
                                                             monkeypatch, capsys):
    """The shards run the longest inputs first, so the last one measured (passes.csv) bounds the
    next: a pass whose share is short on paper (--pass-minutes) but whose last shard took 30 min
    does not start another with 20 min left (it would be stopped part-way and lost)."""
    from lens_heads import models

    t2 = script("table2")
    store = tmp_path / "table2" / "store" / "smollm2-135m__piqa"
    store.mkdir(parents=True)
    pd.DataFrame([{"what": "scoring shard 1 of 4, longest-first order (superseded: shards are now cut with "
                           "prefixes shared)", "wall_seconds": 9000.0, "cpu_seconds": 9000.0},
                  {"what": "scoring shard 1 of 4", "wall_seconds": 1800.0, "cpu_seconds": 1700.0}]).assign(
        dtype="float32", cpu="x", date="2026-12-07").to_csv(store / "passes.csv", index=False)
    monkeypatch.setattr(models, "load_model", lambda *a, **k: pytest.fail("loaded a model"))
    assert t2.main(argv(tiny_llama_2k, tmp_path, "--time-limit", "20", "--pass-minutes", "piqa=4")) == 0
    out = capsys.readouterr().out
    assert "a shard of its scoring pass may take 30 min" in out and "skipped for now" in out and counted == []
    # the estimate: the 3 shards left at the measured one's CPU hours (the superseded shard counts for neither)
    groups = pd.read_csv(tmp_path / "table2_groups.csv").set_index("group")
    assert groups.loc["smollm2-135m__piqa__zero", "status"] == "scoring pass: 1 of 4 shards stored"
    assert groups.loc["smollm2-135m__piqa__zero", "scoring_shard_hours"] == round(1700 / 3600, 4)
    est = pd.read_csv(tmp_path / "table2_remaining.csv").set_index("group").loc["smollm2-135m__piqa__zero"]
    assert est["est_pass_hours"] == round(0.75 * 4 * round(1700 / 3600, 4), 2) and est["pass_basis"] == \
        "its measured shards"


def test_a_scoring_pass_killed_between_shards_resumes_at_the_next_shard(tiny_llama_2k, shared_data, tmp_path,
                                                                       monkeypatch):
    """The scoring pass runs in shards, each stored as it ends: a run killed in the pass keeps the
    shards it finished, and the next run scores only the others before searching."""
    from lens_heads.sweep import units

    t2 = script("table2")
    real, computed, kill = units.run_score_shard, [], [True]

    def dies(model, task, identity, cfg, store, index, n_shards):
        if kill[0] and len(computed) == 2:
            raise KeyboardInterrupt  # killed as the third shard starts
        out = real(model, task, identity, cfg, store, index, n_shards)
        if out is units.Outcome.COMPUTED:
            computed.append(index)
        return out

    monkeypatch.setattr(units, "run_score_shard", dies)
    only = ["--only", "smollm2-135m/piqa/zero/random"]
    with pytest.raises(KeyboardInterrupt):
        t2.main(argv(tiny_llama_2k, tmp_path, *only))
    store = tmp_path / "table2" / "store" / "smollm2-135m__piqa"
    assert list(pd.read_csv(store / "passes.csv").what) == ["scoring shard 1 of 4", "scoring shard 2 of 4"]
    assert t2.main(argv(tiny_llama_2k, tmp_path, *only, "--tabulate-only")) == 0  # the tables say how far it got
    groups = pd.read_csv(tmp_path / "table2_groups.csv").set_index("group")
    assert groups.loc["smollm2-135m__piqa__zero", "status"] == "scoring pass: 2 of 4 shards stored"
    cross = pd.read_csv(tmp_path / "table2_crossings.csv").set_index(["model", "ablation", "score_fn"])
    assert cross.loc[("smollm2-135m", "zero", "random"), "reason"] == "not run yet (scoring pass: 2 of 4 shards stored)"
    kill[0] = False
    assert t2.main(argv(tiny_llama_2k, tmp_path, *only)) == 0
    assert computed == [0, 1, 2, 3]  # the two stored shards are not scored again
    assert list(pd.read_csv(store / "passes.csv").what) == [f"scoring shard {j} of 4" for j in range(1, 5)]
    cross = pd.read_csv(tmp_path / "table2_crossings.csv").set_index(["model", "ablation", "score_fn"])
    assert cross.loc[("smollm2-135m", "zero", "random"), "status"] in ("resolved", "lower bound")
    assert not list(store.glob("score_shards/*"))  # merged: the shards are discarded


def test_the_dtype_check_runs_the_campaigns_probes_again_in_float32(tiny_llama_2k, shared_data, tmp_path):
    """--check-dtype: every probe of the chosen curves again in float32 on the same questions;
    the float32 side equals a search run in float32 on its own, capped at the same items."""
    import lens_heads as lh
    from lens_heads.sweep.adaptive import prepare_search, run_probe

    t2 = script("table2")
    base = [a for a in argv(tiny_llama_2k, tmp_path, "--only", "smollm2-135m/piqa/zero/ahon_ln") if a != "float32"]
    base[base.index("--dtype") + 1] = "bfloat16"
    base.append("--allow-emulated")  # a CPU without native bf16 runs it too, slowly
    assert t2.main(base) == 0
    assert (tmp_path / "table2" / "store" / "smollm2-135m__piqa__bfloat16").is_dir()  # beside the campaign's
    assert not (tmp_path / "table2" / "store" / "smollm2-135m__piqa").exists()
    # the tables stay the campaign dtype's (float32, not started yet); the bf16 search is read apart
    cross = pd.read_csv(tmp_path / "table2_crossings.csv")
    assert set(cross.status) == {"not started"} and set(cross.dtype) == {"float32"}
    args16 = t2.parse_args(base)
    units = t2.work_list(args16)
    bf16_rows, _, _ = t2.tabulate(args16, units, t2.group_states(args16, tmp_path, units, "bfloat16"))
    bf16_rows = bf16_rows.set_index(["model", "task", "ablation", "score_fn"])
    assert set(bf16_rows.dtype) == {"bfloat16"}
    key = ("smollm2-135m", "piqa", "zero", "ahon_ln")
    early = pd.read_csv(tmp_path / "table2_dtype_crossings.csv")  # float32 not started: bf16's side is there
    assert len(early) == 1 and early.same_crossing.isna().all() and early.status_float32.iloc[0] == "not started"
    for c in ("bracket_low_pct", "bracket_high_pct", "eval_items"):
        assert early[f"{c}_bfloat16"].iloc[0] == bf16_rows.loc[key, c], c
    assert "1 curve is decided in bfloat16 and not yet in float32: ahon_ln" in (tmp_path / "table2_summary.md").read_text()
    assert t2.main([*base, "--check-dtype", "--check-dtype-curves", "ahon_ln", "--check-dtype-items", "16"]) == 0
    check = pd.read_csv(tmp_path / "table2_dtype_check.csv")
    _, probes, _ = t2.tabulate(args16, units, t2.group_states(args16, tmp_path, units, "bfloat16"))
    ours = probes[(probes.score_fn == "ahon_ln") & (probes.ablation == "zero")]
    assert len(check) == len(ours) and (check.n_items <= 16).all() and set(check.dtype) == {"bfloat16"}
    assert set(check.decision_float32) <= {"within", "outside", "unresolved"}
    assert ((check.unablated_correct_agreement >= 0) & (check.unablated_correct_agreement <= 1)).all()
    # the summary says how many probes the check decided and whether it read fewer questions than the campaign
    summary = (tmp_path / "table2_summary.md").read_text()
    decided = int(((check.decision != "unresolved") | (check.decision_float32 != "unresolved")).sum())
    assert f"{int(check.same_decision.sum())} of {len(check)} probes reach the same decision" in summary
    assert f"{decided} of them are decided in either dtype" in summary
    assert ("caps the rest" in summary) == bool((check.n_items < check.campaign_probe_items).any())
    # the float32 side, independently: a float32 search of the same config, its probes capped alike
    args = t2.parse_args(base)
    g = t2.Group("smollm2-135m", "piqa", "zero")
    model32 = lh.load_model(str(tiny_llama_2k), dtype="float32")
    run, curves = prepare_search(model32, t2.sweep_cfg(args, g), t2.search_settings(args), tmp_path / "alone",
                                 progress=False)
    curve = next(c for c in curves if c.name == "ahon_ln")
    for r in check.itertuples():
        index = run.grid.index(round(r.pct / 100, 9))
        got = run_probe(run, curve, index, max_items=int(r.n_items))
        assert got.decision == r.decision_float32
        assert 100 * got.lo == pytest.approx(r.delta_lo_pts_float32) and 100 * got.hi == pytest.approx(
            r.delta_hi_pts_float32)

    # the campaign's dtype (float32) searches the same curve in its own store, which already holds the
    # check's probes; table2_dtype_crossings.csv sets its row beside the bfloat16 search's
    fp32 = argv(tiny_llama_2k, tmp_path, "--only", "smollm2-135m/piqa/zero/ahon_ln")
    assert t2.main(fp32) == 0
    cross = pd.read_csv(tmp_path / "table2_crossings.csv").set_index(["model", "task", "ablation", "score_fn"])
    both = pd.read_csv(tmp_path / "table2_dtype_crossings.csv")
    assert len(both) == 1 and set(cross.dtype.dropna()) == {"float32"}
    r = both.iloc[0]
    for c in ("status", "bracket_low_pct", "bracket_high_pct", "eval_items", "eval_hours"):
        assert r[f"{c}_float32"] == cross.loc[key, c] and r[f"{c}_bfloat16"] == bf16_rows.loc[key, c], c
    assert cross.loc[key, "status"] in ("resolved", "lower bound")
    same = (cross.loc[key, "bracket_low_pct"], cross.loc[key, "bracket_high_pct"]) == (
        bf16_rows.loc[key, "bracket_low_pct"], bf16_rows.loc[key, "bracket_high_pct"])
    assert bool(r.same_crossing) == same
    assert r.hours_ratio == pytest.approx(cross.loc[key, "eval_hours"] / bf16_rows.loc[key, "eval_hours"], abs=1e-3)
    summary = (tmp_path / "table2_summary.md").read_text()
    assert "searched in float32. 1 curve is decided in both float32 and bfloat16" in summary
    assert f"{int(same)} have the same bracket" in summary
    # nothing left: every table again byte for byte, from a float32 or a bfloat16 run, and on a fresh
    # machine from the committed files alone (both dtypes' ledgers)
    before = outputs(tmp_path)
    assert t2.main([*fp32, "--tabulate-only"]) == 0 and outputs(tmp_path) == before
    assert t2.main([*base, "--tabulate-only"]) == 0 and outputs(tmp_path) == before
    fresh = tmp_path / "fresh"
    paths = t2.result_paths(tmp_path)
    assert any("__bfloat16" in str(p) and p.name == "ledger_zero.json" for p in paths)
    for p in paths:
        if p.name not in t2.TABLES and p.suffix != ".png":
            dest = fresh / p.relative_to(tmp_path)
            dest.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(p, dest)
    assert t2.main(argv(tiny_llama_2k, fresh, "--only", "smollm2-135m/piqa/zero/ahon_ln", "--tabulate-only")) == 0
    assert outputs(fresh) == before


def test_the_summary_keeps_curves_decided_in_one_dtype_apart_from_those_decided_in_both(tmp_path):
    t2 = script("table2")
    row = lambda fn, lo32, hi32, lo16, hi16, same: {  # noqa: E731
        "model": "m", "task": "piqa", "ablation": "zero", "score_fn": fn, "bracket_low_pct_float32": lo32,
        "bracket_high_pct_float32": hi32, "bracket_low_pct_bfloat16": lo16, "bracket_high_pct_bfloat16": hi16,
        "same_crossing": same, "hours_ratio": 2.5 if same is not pd.NA else float("nan")}
    frame = pd.DataFrame([row("awft", 15.0, 16.0, 14.0, 15.0, False), row("aeqd", 3.0, 4.0, 3.0, 4.0, True),
                          row("lthon", float("nan"), float("nan"), 10.0, 11.0, pd.NA)])
    frame["same_crossing"] = frame["same_crossing"].astype("boolean")
    text = "\n".join(t2.dtype_text(tmp_path, frame))
    assert "2 curves are decided in both float32 and bfloat16" in text and "1 have the same bracket" in text
    assert "took 2.50x the evaluation hours of bfloat16" in text
    bullet = next(line for line in text.splitlines() if line.startswith("- "))
    assert bullet == "- awft (m/piqa/zero) crosses in float32 [15, 16) %, in bfloat16 [14, 15) %"
    assert "\n\n1 curve is decided in bfloat16 and not yet in float32: lthon (m/piqa/zero) [10, 11) %." in text


def test_the_remaining_estimate_prices_each_undecided_row_at_the_median_decided_rows_items(monkeypatch):
    """Items: a decided row's median items per population member (random heads apart) times the
    row's population, less what it read; seconds per item: the group's own, else its pair's, else
    SmolLM2/PIQA's times the benchmarked ratio; a pass not whole once per pair, at that rate."""
    t2 = script("table2")
    monkeypatch.setitem(t2.RATE_VS_SMOLLM2_PIQA, ("qwen2.5-coder-0.5b", "mmlu"), 20.0)
    nan = float("nan")

    def row(m, t, a, fn, status, n, items=nan, secs=nan):
        return {"stage": {("piqa", "zero"): 1, ("mmlu", "zero"): 4, ("piqa", "mean_c4"): 7}.get((t, a), 10), "model": m, "task": t, "ablation": a, "score_fn": fn, "status": status, "n_population": n,
                "eval_items": items, "eval_seconds": secs}

    s, q = "smollm2-135m", "qwen2.5-coder-0.5b"
    cross = pd.DataFrame([
        row(s, "piqa", "zero", "random", "resolved", 100, 600, 60.0),  # 6 x N
        row(s, "piqa", "zero", "awft", "resolved", 100, 300, 30.0),  # 3 x N
        row(s, "piqa", "zero", "ahon", "pending", 100, 100, 10.0),  # needs 3 x 100 - 100
        row(s, "piqa", "zero", "lthon", "not started", 100),  # needs 300
        row(s, "piqa", "mean_c4", "awft", "not started", 100),  # 300, at the pair's rate
        row(q, "mmlu", "zero", "random", "not started", 200),  # 6 x 200
        row(q, "mmlu", "zero", "awft", "not started", 200),  # 3 x 200
        row(q, "mmlu", "mean_c4", "awft", "not started", 200)])  # 600; the pass counted once
    groups = pd.DataFrame({"group": [f"{s}__piqa__zero", f"{s}__piqa__mean_c4", f"{q}__mmlu__zero",
                                     f"{q}__mmlu__mean_c4"], "status": ["started", "started",
                                                                        "scoring pass: 1 of 4 shards stored",
                                                                        "scoring pass: 1 of 4 shards stored"],
                           "scoring_pass_left": [0.0, 0.0, 0.75, 0.75],
                           "scoring_shard_hours": [math.nan] * 4})
    est, basis = t2.remaining(cross, groups)
    assert basis == {"items_per_population": 3.0, "items_per_population_random": 6.0}
    got = est.set_index("group")
    assert got["rows_left"].tolist() == [2, 2, 1, 1]  # the work list's order: stages 1, 4, 7, 10
    assert got["est_items"].tolist() == [500, 1800, 300, 600]
    assert got["seconds_per_item"].tolist() == [0.1, 2.0, 0.1, 2.0]  # 100 s over 1,000 items; x 20
    assert got["rate_basis"].tolist() == ["measured", "SmolLM2/PIQA's x 20", "the pair's other group",
                                          "SmolLM2/PIQA's x 20"]
    assert got["est_pass_hours"].tolist() == [0.0, round(0.75 * 200 * 2.0 / 3600, 2), 0.0, 0.0]
    assert got.loc[f"{q}__mmlu__zero", "est_hours"] == round(1.0 + 0.75 * 200 * 2.0 / 3600, 2)
    assert est["stage"].tolist() == [1, 4, 7, 10]  # the hours summed along the work list
    assert est["through_here_hours"].iloc[-1] == round(est["est_hours"].sum(), 2)
    assert got["pass_basis"].tolist() == ["", "one census probe", "", ""]
    # once shards are measured, the shards left (a quarter of MMLU's) cost their mean, 0.01 h each
    measured, _ = t2.remaining(cross, groups.assign(scoring_shard_hours=[math.nan, math.nan, 0.01, 0.01]))
    m = measured.set_index("group")
    left = round(0.75 * t2.SCORE_SHARDS["mmlu"] * 0.01, 2)
    assert left > 0 and m["est_pass_hours"].tolist() == [0.0, left, 0.0, 0.0]
    assert m["pass_basis"].tolist() == ["", "its measured shards", "", ""]
    assert m.loc[f"{q}__mmlu__zero", "est_hours"] == round(1.0 + left, 2)


def test_mean_ablation_shares_the_pairs_baseline_and_thresholds(tiny_llama_2k, shared_data, tmp_path, counted):
    t2 = script("table2")
    assert t2.main(argv(tiny_llama_2k, tmp_path, "--only", "smollm2-135m/piqa/zero/random")) == 0
    zero = list(counted)
    counted.clear()
    assert t2.main(argv(tiny_llama_2k, tmp_path, "--only", "smollm2-135m/piqa/mean_c4/random")) == 0
    mean = list(counted)
    assert mean and all(a != "none" for a, _ in mean)  # the unablated answers: from the zero group's
    assert {d for _, d in mean} <= {d for _, d in zero}
    store = tmp_path / "table2" / "store" / "smollm2-135m__piqa"
    passes = pd.read_csv(store / "passes.csv")  # one scoring pass for the pair, in its shards
    assert list(passes.what) == [f"scoring shard {j} of {t2.SCORE_SHARDS['piqa']}" for j in range(1, 5)]
    assert (store / "ledger_zero.json").is_file() and (store / "ledger_mean_c4.json").is_file()
    cross = pd.read_csv(tmp_path / "table2_crossings.csv").set_index(["model", "ablation", "score_fn"])
    assert cross.loc[("smollm2-135m", "mean_c4", "random"), "status"] in ("resolved", "lower bound")


def test_a_killed_campaign_resumes_without_evaluating_an_item_twice(tiny_llama_2k, shared_data, tmp_path, counted,
                                                                   monkeypatch):
    from lens_heads.sweep import adaptive

    t2 = script("table2")
    only = ["--only", "smollm2-135m/piqa/zero/random,smollm2-135m/piqa/zero/awft"]
    assert t2.main(argv(tiny_llama_2k, tmp_path / "ref", *only)) == 0
    one_go = list(counted)
    counted.clear()
    real, calls = adaptive.StoreItems._evaluate, []

    def dies(self, spec, ids):
        if len(calls) == 5:
            raise KeyboardInterrupt  # killed in the middle of a curve, between two stored batches
        calls.append(spec)
        return real(self, spec, ids)

    monkeypatch.setattr(adaptive.StoreItems, "_evaluate", dies)
    with pytest.raises(KeyboardInterrupt):
        t2.main(argv(tiny_llama_2k, tmp_path / "run", *only))
    monkeypatch.setattr(adaptive.StoreItems, "_evaluate", real)
    assert t2.main(argv(tiny_llama_2k, tmp_path / "run", *only)) == 0
    assert sorted(counted) == sorted(one_go)
    drop = ["eval_seconds", "eval_hours", "grid7_est_hours"]
    a, b = (pd.read_csv(tmp_path / o / "table2_crossings.csv").drop(columns=drop) for o in ("ref", "run"))
    pd.testing.assert_frame_equal(a, b)


def test_this_repository_ignores_the_per_item_store_and_not_what_the_campaign_commits():
    root = Path(__file__).resolve().parents[1]
    if subprocess.run(["git", "-C", str(root), "rev-parse"], capture_output=True).returncode != 0:
        pytest.skip("not a git checkout")
    pair = "analyses/results/inactive_heads/table2/store/smollm2-135m__piqa"
    ignored = lambda p: subprocess.run(["git", "-C", str(root), "check-ignore", "-q", p]).returncode == 0  # noqa: E731
    for p in (f"{pair}/ledger_zero.json", f"{pair}/ledger_mean_c4.json", f"{pair}/passes.csv",
              f"{pair}__bfloat16/ledger_zero.json",
              f"{pair}/thresholds/x.json", f"{pair}/static_scores/x.json",
              "analyses/results/inactive_heads/table2_crossings.csv", "analyses/results/inactive_heads/figures/table2_x.png"):
        assert not ignored(p), p
    for p in (f"{pair}/points/x.json", f"{pair}/parts/x.json", f"{pair}/score_shards/x.safetensors",
              f"{pair}/parts/x.json.claim", f"{pair}__bfloat16/points/x.json", f"{pair}__bfloat16/parts/x.json"):
        assert ignored(p), p


def test_a_pairs_scoring_pass_hours_are_cpu_time_on_a_cpu_and_wall_time_on_a_gpu(tmp_path):
    """passes.csv logs both clocks and the device; the pass hours count the CPU time of CPU passes
    (rows logged before the device column ran on a CPU) and the wall time of accelerator passes."""
    t2 = script("table2")
    path = tmp_path / "passes.csv"
    pd.DataFrame([{"what": "old", "wall_seconds": 534.4, "cpu_seconds": 446.7, "dtype": "float32", "cpu": "x",
                   "date": "2026-12-06"}]).to_csv(path, index=False)
    assert t2.pass_seconds(pd.read_csv(path)) == pytest.approx(446.7)
    t2.log_pass(path, 100.0, 90.0, "float32", "cpu", "shard 1")
    t2.log_pass(path, 50.0, 49.0, "float32", "cuda:0", "shard 2")
    passes = pd.read_csv(path)
    assert list(passes.device.fillna("")) == ["", "cpu", "cuda"]
    assert t2.pass_seconds(passes) == pytest.approx(446.7 + 90.0 + 50.0)


def test_the_summary_names_the_rows_whose_next_step_zeroes_a_tied_block():
    """A decided row whose first point beyond the crossing zeroed more than a grid step past its
    target (tied scores zero in blocks) is listed with the share it zeroed; the others are not."""
    t2 = script("table2")
    done = pd.DataFrame([
        {"model": "g", "task": "piqa", "ablation": "zero", "score_fn": "ftvvn", "bracket_high_pct": 1.0,
         "outside_pct_zeroed": 5.5556, "outside_delta_hi_pts": -1.14},
        {"model": "g", "task": "piqa", "ablation": "zero", "score_fn": "avvn", "bracket_high_pct": 2.0,
         "outside_pct_zeroed": 2.0003, "outside_delta_hi_pts": -1.25},
        {"model": "g", "task": "piqa", "ablation": "zero", "score_fn": "ahon", "bracket_high_pct": float("inf"),
         "outside_pct_zeroed": float("nan"), "outside_delta_hi_pts": float("nan")}])
    text = "\n".join(t2.coarse_steps_text(done, 1.0))
    assert "g/piqa/zero ftvvn: the probe at 1 % zeroed 5.56 %" in text
    assert "avvn" not in text and "ahon" not in text
    assert t2.coarse_steps_text(done.iloc[1:], 1.0) == []


def test_workers_search_pairs_side_by_side_as_one_process_would(tiny_llama_2k, shared_data, tmp_path):
    """``--workers 2``: two worker processes, one pair each, pinned to a core; the parent's tables
    equal a single process's (timings aside), the workers evaluate what it did, no item twice,
    and each logs its own run."""
    t2 = script("table2")
    only = ("--only", "smollm2-135m/piqa/zero,gemma-3-270m/piqa/zero")
    assert t2.main(argv(tiny_llama_2k, tmp_path / "ref", *only)) == 0
    assert t2.main(argv(tiny_llama_2k, tmp_path / "run", *only, "--workers", "2")) == 0
    drop = ["eval_seconds", "eval_hours", "grid7_est_hours"]
    a, b = (pd.read_csv(tmp_path / o / "table2_crossings.csv").drop(columns=drop) for o in ("ref", "run"))
    pd.testing.assert_frame_equal(a, b)
    assert set(a.loc[a.model.isin(["smollm2-135m", "gemma-3-270m"]) & (a.task == "piqa") & (a.ablation == "zero"),
                     "status"]) <= {"resolved", "lower bound"}
    for name in ("table2_probes.csv", "table2_paper_claims.csv"):
        pd.testing.assert_frame_equal(*(pd.read_csv(tmp_path / o / name) for o in ("ref", "run")))
    ref, run = (pd.read_csv(tmp_path / o / "table2_runs.csv") for o in ("ref", "run"))
    assert len(run) == 2 and run.items_evaluated.sum() == ref.items_evaluated.sum() > 0
    pairs = [{n.split("/")[0] for n in only.split(",")} for only in run["only"]]
    assert sorted(map(sorted, pairs)) == [["gemma-3-270m"], ["smollm2-135m"]]  # one pair a worker
    # the per-item store: every question of every point stored once, in one of its parts
    from lens_heads.results.keys import Kind
    from lens_heads.results.store import ResultStore
    from lens_heads.sweep.records import PointRecord

    for pair in ("smollm2-135m__piqa", "gemma-3-270m__piqa"):
        seen: dict[str, list[int]] = {}
        for data in ResultStore(tmp_path / "run" / "table2" / "store" / pair).records(Kind.PART):
            rec = PointRecord.from_json(data)
            seen.setdefault(rec.point_hash, []).extend(q.doc_id for q in rec.questions)
        assert seen and all(len(ids) == len(set(ids)) for ids in seen.values())


def test_a_workers_command_line_keeps_the_options_and_takes_its_own_units():
    t2 = script("table2")
    got = t2.worker_argv(["--out", "o", "--workers", "2", "--only=smollm2", "--time-limit", "60", "--limit", "32",
                          "--commit-every", "30"], ["a/piqa/zero/awft", "a/piqa/zero/random"], 12.5, 30.0)
    assert got == ["--out", "o", "--limit", "32", "--commit-every", "30", "--units",
                   "a/piqa/zero/awft,a/piqa/zero/random", "--worker", "--time-limit", "12.500"]
    assert t2.worker_argv(["--workers=3"], ["u"], None, None) == ["--units", "u", "--worker"]


def test_the_workers_take_stages_in_order_never_two_on_one_pair(tiny_llama_2k, shared_data, tmp_path, monkeypatch):
    """The scheduler, with workers faked: stages start in the work list's order, a stage waits
    while another worker holds its pair (Qwen/MMLU's stage 6 after its stage 4, even with a core
    free), each worker gets its stage's units by exact name (stage 4's awft, not stage 6's
    awft_ln) on a core no live worker has."""
    t2 = script("table2")
    live, started = {}, []

    class Worker:
        def __init__(self, cmd, core):
            self.units = cmd[cmd.index("--units") + 1].split(",")
            self.pair, self.core, self.polls, self.returncode = tuple(self.units[0].split("/")[:2]), core, 0, None
            assert all(w.pair != self.pair and w.core != core for w in live.values())
            live[id(self)] = self
            started.append(self)

        def poll(self):
            self.polls += 1
            if self.polls >= (3 if self.pair == ("qwen2.5-coder-0.5b", "mmlu") else 1):  # MMLU's stage 4 runs long
                self.returncode = 0
                live.pop(id(self), None)
            return self.returncode

    monkeypatch.setattr(t2, "spawn_worker", Worker)
    monkeypatch.setattr(t2.time, "sleep", lambda s: None)
    only = "qwen2.5-coder-0.5b/piqa/zero,qwen2.5-coder-0.5b/mmlu/zero,gemma-3-270m/winogrande/zero"
    args = t2.parse_args(argv(tiny_llama_2k, tmp_path, "--only", only, "--scores", "ahon_ln,awft,awft_ln",
                              "--workers", "2", "--no-figures"))
    units, todo = t2.work_list(args, only=False), t2.work_list(args)
    assert t2.run_workers(args, ["--workers", "2"], tmp_path, units, todo, None) == 0
    order = [(w.pair, w.units) for w in started]
    mmlu = "qwen2.5-coder-0.5b/mmlu/zero/"
    assert [p for p, _ in order] == [("qwen2.5-coder-0.5b", "piqa"), ("qwen2.5-coder-0.5b", "mmlu"),
                                     ("gemma-3-270m", "winogrande"), ("qwen2.5-coder-0.5b", "mmlu")]
    assert order[1][1] == [mmlu + c for c in ("random", "awft", "ahon_ln")]
    assert order[3][1] == [mmlu + c for c in ("awft_ln", "static:ahon_ln")]
    assert (tmp_path / "table2_crossings.csv").is_file()  # the parent tabulates at the end


def test_a_function_with_constant_scores_is_settled_without_a_crossing(monkeypatch):
    """A row whose scores tie over the whole range (Gemma-3-270m's FTVVN(LN): one key/value head
    per layer) has no crossing: once its one probe is decided it costs nothing more in the
    estimate (before, one probe's items), and it neither blocks nor enters the claims, which are
    judged from the other functions alone."""
    t2 = script("table2")

    def row(fn, status, lo=math.nan, hi=math.nan, items=300, secs=30.0):
        return {"stage": 2, "model": "gemma-3-270m", "task": "piqa", "ablation": "zero", "score_fn": fn,
                "status": status, "n_population": 100, "eval_items": items, "eval_seconds": secs,
                "bracket_low_pct": lo, "bracket_high_pct": hi, "crossing_pct": lo}

    from lens_heads.scores import PAPER_SCORES

    fns = [f for f in PAPER_SCORES if f != "ftvvn_ln"]
    cross = pd.DataFrame([row("random", "resolved", 0.0, 1.0)]
                         + [row(fn, "resolved", 20.0 if fn == "ahon" else 2.0, 21.0 if fn == "ahon" else 3.0)
                            for fn in fns] + [row("ftvvn_ln", t2.CONSTANT, items=100, secs=10.0)])
    groups = pd.DataFrame({"group": ["gemma-3-270m__piqa__zero"], "status": ["started"], "scoring_pass_left": [0.0]})
    est, _ = t2.remaining(cross, groups)
    assert est["rows_left"].tolist() == [0] and est["est_items"].tolist() == [0]
    claims = t2.paper_claims(cross).set_index("claim")
    best = claims[claims.index.str.startswith("more than 12 %")].iloc[0]
    assert best["verdict"] == "confirmed" and "[20.00, 21.00)" in best["reason"]  # ahon, the constant row left out
    assert "ftvvn_ln" not in " ".join(claims["reason"])
    pending = t2.paper_claims(cross.assign(status=cross.status.replace({t2.CONSTANT: "pending"})))
    assert pending.iloc[-1]["verdict"] == "not resolved at this size"  # the same row still running holds it back
    # a pair not started whose FTVVN(LN) is constant too: that row is estimated at one probe (the
    # decided constant row's 1 x N), the other at a bisection's (the decided curves' median 3 x N)
    later = [{**row(fn, "not started", items=0, secs=0.0), "stage": 5, "task": "winogrande", "n_population": 200,
              "constant": fn == "ftvvn_ln"} for fn in ("ftvvn_ln", "awft")]
    both = pd.concat([cross.assign(constant=cross.status == t2.CONSTANT), pd.DataFrame(later)], ignore_index=True)
    groups2 = pd.concat([groups, pd.DataFrame({"group": ["gemma-3-270m__winogrande__zero"], "status": ["started"],
                                               "scoring_pass_left": [0.0]})], ignore_index=True)
    est, _ = t2.remaining(both, groups2)
    assert est["rows_left"].tolist() == [0, 2] and est["est_items"].tolist() == [0, 1 * 200 + 3 * 200]
