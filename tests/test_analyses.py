"""The analysis scripts at toy size (tiny random models, a handful of questions / documents):
each writes its tables, and the numbers in them equal independent computations."""

from __future__ import annotations

import importlib.util
import json
import math
import shutil
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import torch

ANALYSES = Path(__file__).resolve().parents[1] / "analyses"


def script(name: str):
    """Import analyses/<name>.py as a module (its folder goes on sys.path for ``common``)."""
    if str(ANALYSES) not in sys.path:
        sys.path.insert(0, str(ANALYSES))
    spec = importlib.util.spec_from_file_location(f"analyses_{name}", ANALYSES / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def mc_task_file(tmp_path: Path, n: int = 6) -> str:
    rows = [{"goal": f"How do I fix thing number {i}?", "sol1": "Use water and soap." if i % 3 else "Ask a friend.",
             "sol2": "Hit it with a big hammer.", "label": i % 2} for i in range(n)]
    path = tmp_path / "mc.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return f"file:{path}?question=goal&choices=sol1,sol2&answer=label&prompt=Question: {{goal}}\\nAnswer:"


def naive_perplexity(hf, tokenizer, texts, max_len: int) -> float:
    """Token-weighted perplexity of ``texts`` (each cut to ``max_len`` tokens), one plain HF
    forward per text, in float64: the independent reference for the scripts' perplexities."""
    from lens_heads.data import tokenize_texts

    nll, n = 0.0, 0
    with torch.no_grad():
        for ids in tokenize_texts(tokenizer, texts, max_len):
            logp = torch.log_softmax(hf(input_ids=ids[None]).logits[0, :-1].double(), -1)
            nll -= float(logp.gather(1, ids[1:, None]).sum())
            n += len(ids) - 1
    return math.exp(nll / n)

def test_inactive_heads_tables(tmp_path, tiny_model_dir, tiny_model):
    from lens_heads.interventions.ablation import StaticAblation
    from lens_heads.data import load_task
    from lens_heads.forward.task_requests import task_inputs
    from lens_heads.evaluation.evaluate import evaluate_task
    from lens_heads.scores import score_heads

    mod = script("inactive_heads")
    folder, spec, out = tiny_model_dir("llama"), mc_task_file(tmp_path), tmp_path / "out"
    label = mod.model_label(str(folder))
    argv = ["--models", str(folder), "--tasks", spec, "--limit", "6", "--scores", "ahon_ln,awft",
            "--fractions", "0,0.25", "--seeds", "1", "--sweep-all", "--n-boot", "50", "--dtype", "float32",
            "--paper-model", str(folder), "--paper-task", "mc", "--out", str(out)]
    assert mod.main(argv) == 0

    # (a) baseline = evaluate_task on the same items; the signal decision follows the written rule
    base = pd.read_csv(out / "baseline.csv")
    assert {"model", "task", "accuracy", "boot_se", "chance", "signal", "n_questions"} <= set(base.columns)
    model, task = tiny_model("llama"), load_task(spec)
    ref = evaluate_task(model, task, limit=6, progress=False)
    row = base.iloc[0]
    assert row.model == label and row.n_questions == 6
    assert row.accuracy == pytest.approx(ref.metrics["acc"]) and row.chance == 0.5
    assert bool(row.signal) == (row.accuracy - row.chance > 2 * row.boot_se)
    correct = np.array([q.correct for q in ref.questions], dtype=float)
    assert 0 < row.boot_se < 2 * correct.std() / math.sqrt(6) + 1e-9  # a bootstrap SE near the analytic one

    # (c) the within-1-point table and the AUC ranking
    t2 = pd.read_csv(out / "table2.csv")
    assert {"model", "task", "score_fn", "max_pct_zeroed_within_1pt", "ci_low", "ci_high", "seed_min",
            "seed_max", "base_accuracy", "lower_bound"} <= set(t2.columns)
    assert set(t2.score_fn) == {"ahon_ln", "awft", "random"}
    assert (t2.base_accuracy == row.accuracy).all()
    assert (t2.ci_low <= t2.max_pct_zeroed_within_1pt + 1e-9).all() and (t2.max_pct_zeroed_within_1pt <= t2.ci_high + 1e-9).all()
    auc = pd.read_csv(out / "auc_ranking.csv")
    assert {"score_fn", "auc", "auc_ci_low", "auc_ci_high", "rank_by_auc"} <= set(auc.columns)
    assert sorted(auc.rank_by_auc)[0] == 1 and ((auc.auc > 0) & (auc.auc <= 1.5)).all()

    # (e) static: the ceil(0.25 * 8) = 2 heads with the lowest dataset-level ahon_ln, and their accuracy
    static = pd.read_csv(out / "static_ahon_ln.csv")
    assert list(static.k_heads) == [2] and static.pct_zeroed.iloc[0] == pytest.approx(25.0)
    hs = score_heads(model, task_inputs(model, task, None, 6), ["ahon_ln"], progress=False)
    mean = hs.mean["ahon_ln"]
    lowest = sorted(sorted(((float(mean[L, h]), (L, h)) for L in range(2) for h in range(4)))[i][1] for i in range(2))
    assert static.heads.iloc[0] == ",".join(f"{L}.{h}" for L, h in lowest)
    zeroed = evaluate_task(model, task, limit=6, ablation=StaticAblation(lowest, model.geometry), progress=False)
    assert static.accuracy.iloc[0] == pytest.approx(zeroed.metrics["acc"])
    assert (pd.read_csv(out / "static_within_1pt.csv").static_max_pct_within_1pt >= 0).all()
    assert (out / "figures" / f"curves_{label}__mc.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    # the static ranking's scoring pass also stored the sweep's thresholds: those of compute_thresholds
    from lens_heads.interventions.thresholds import compute_thresholds
    [stored] = [json.loads(f.read_text()) for f in (out / "store").rglob("thresholds/*.json")]
    ref_tau = compute_thresholds(model, task_inputs(model, task, None, 6), ["ahon_ln", "awft"], [0.0, 0.25],
                                 progress=False)
    assert stored["thresholds"] == {s: {repr(p): t for p, t in d.items()} for s, d in ref_tau.items()}

    # (d) the paper row: verdicts follow from the interval
    cmp = pd.read_csv(out / "paper_comparison.csv")
    first = cmp.iloc[0]
    assert first.quantity.startswith("base accuracy") and float(first.paper) == 47.49
    assert first.verdict.startswith("agrees") == (first.ours_ci_low <= 47.49 <= first.ours_ci_high)
    claims = pd.read_csv(out / "paper_claims.csv").iloc[0]
    t2i = t2.set_index("score_fn")
    assert claims.best_non_awft == "ahon_ln" and claims.best == pytest.approx(t2i.loc["ahon_ln", "max_pct_zeroed_within_1pt"])
    assert claims.awft == pytest.approx(t2i.loc["awft", "max_pct_zeroed_within_1pt"])
    assert claims.best_beats_awft.startswith("yes") == (claims.best > claims.awft)
    assert claims.random_seed_min == pytest.approx(t2i.loc["random", "seed_min"])
    summary = (out / "summary.md").read_text()
    assert "inactive_heads.py" in summary and "wall time" in summary and "lens_heads | 0." in summary

    # (g) points.csv: every ablated point against the baseline and random heads at the same fraction,
    # paired over questions, equal to a plain loop over the stored per-question results
    pts = pd.read_csv(out / "points.csv")
    assert sorted(pts.score_fn) == ["ahon_ln", "awft", "random"] and (pts.sweep == "done").all()
    recs = {json.loads(f.read_text())["config"]["ablation"]: json.loads(f.read_text())
            for f in (out / "store").rglob("points/*.json")}
    right = lambda spec: np.array([float(q["correct"]) for q in sorted(recs[spec]["questions"], key=lambda q: q["doc_id"])])  # noqa: E731
    c0, cr = right("none"), right("random:0.25@0")
    rng = np.random.default_rng(0).integers(0, 6, size=(50, 6))
    for r in pts.itertuples():
        spec = "random:0.25@0" if r.score_fn == "random" else next(k for k in recs if k.startswith(f"score:{r.score_fn}@"))
        c = right(spec)
        assert r.delta_pt == pytest.approx(100 * (c.mean() - c0.mean()))
        boot = np.array([(c[i] - c0[i]).mean() for i in rng])
        assert r.delta_ci_low == pytest.approx(100 * np.quantile(boot, 0.025))
        assert r.questions_for_se_half_point == math.ceil(6 * (boot.std(ddof=1) / 0.005) ** 2)
        assert r.verdict.startswith("within") == (r.delta_ci_low >= -1)
        if r.score_fn != "random":
            vs = np.array([(c[i] - cr[i]).mean() for i in rng])
            assert r.vs_random_pt == pytest.approx(100 * (c.mean() - cr.mean()))
            assert (r.vs_random_ci_low, r.vs_random_ci_high) == pytest.approx(
                (100 * np.quantile(vs, 0.025), 100 * np.quantile(vs, 0.975)))
            assert r.random_seeds_here == 1
        assert r.pct_zeroed == pytest.approx(100 * recs[spec]["zeroed_fraction"])

    # resume: a rerun computes nothing new and writes the same tables
    before = {p.name: p.read_text() for p in out.glob("*.csv")}
    n_points = len(list((out / "store").rglob("*.json")))
    assert mod.main(argv) == 0
    assert len(list((out / "store").rglob("*.json"))) == n_points
    assert {p.name: p.read_text() for p in out.glob("*.csv")} == before

    # --from-store: the same tables from the store alone; a model it lacks is listed, not computed
    other = tiny_model_dir("qwen2")
    assert mod.main(["--models", f"{folder},{other}", *argv[2:], "--from-store"]) == 0
    assert len(list((out / "store").rglob("*.json"))) == n_points
    assert {p.name: p.read_text() for p in out.glob("*.csv")} == before
    text = (out / "summary.md").read_text()
    assert f"Not measured yet: {mod.model_label(str(other))} / mc: baseline." in text and "--from-store" in text

    # --from-store on a sweep still running (one awft point missing): the complete curves, in a section
    # of their own, with the finished sweep's values; the pair is in no table and is listed as partial
    part_out = tmp_path / "partial"
    shutil.copytree(out / "store", part_out / "store")
    n_points_sweep = len(list((part_out / "store").rglob("points/*.json")))
    awft = [f for f in (part_out / "store").rglob("points/*.json")
            if json.loads(f.read_text())["config"]["ablation"].startswith("score:awft@")]
    assert len(awft) == 1
    awft[0].unlink()
    assert mod.main([*argv[:-1], str(part_out), "--from-store"]) == 0
    text = (part_out / "summary.md").read_text()
    assert f"{label} / mc: sweep ({n_points_sweep - 1} of {n_points_sweep} points stored)" in text
    running = text.split("(f) Sweeps still running")[1].split("\n## ")[0]
    rows = {r.split("|")[5].strip(): r for r in running.splitlines() if r.startswith(f"| {label} ")}
    assert set(rows) == {"ahon_ln", "random"}
    assert f"| {t2i.loc['ahon_ln', 'max_pct_zeroed_within_1pt']:.1f} |" in rows["ahon_ln"]
    sweep_sig = bool(pd.read_csv(part_out / "sweep_baseline.csv").signal.iloc[0])
    assert all(r.split("|")[-3].strip() == str(sweep_sig) for r in rows.values())  # the sweep_signal column
    assert not (part_out / "table2.csv").exists() and (part_out / "baseline.csv").exists()
    assert pd.read_csv(part_out / "sweep_baseline.csv").sweep.tolist() == ["running"]
    # the paper row takes the running sweep's complete curves (ahon_ln, random), each verdict saying so
    pc = pd.read_csv(part_out / "paper_comparison.csv").set_index("quantity")
    assert "awft % zeroed within 1 pt" not in pc.index
    assert float(pc.loc["ahon_ln % zeroed within 1 pt", "ours"]) == pytest.approx(t2i.loc["ahon_ln", "max_pct_zeroed_within_1pt"])
    assert pc.loc["ahon_ln % zeroed within 1 pt", "verdict"].endswith(
        f"(sweep running: {n_points_sweep - 1} of {n_points_sweep} points)")
    assert "best function (ahon_ln) % within 1 pt, of those measured" in pc.index
    # (g) lists every point stored so far, the ones of the incomplete awft curve included (none left here)
    live = text.split("(g) Sweeps still running")[1].split("\n## ")[0]
    assert sorted(r.split("|")[3].strip() for r in live.splitlines() if r.startswith(f"| {label} ")) == ["ahon_ln", "random"]
    assert pd.read_csv(part_out / "points.csv").sweep.tolist() == ["running", "running"]
    assert (part_out / "figures" / f"points_{label}__mc.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert not (out / "figures" / f"points_{label}__mc.png").exists()  # a finished sweep has its curves

    # --sweep-limit: the signal decision on 6 questions, the sweep on a stratified 4 with its own baseline
    out3 = tmp_path / "out3"
    assert mod.main(argv[:-1] + [str(out3), "--sweep-limit", "4"]) == 0
    t3 = pd.read_csv(out3 / "table2.csv")
    assert (t3.n_questions == 4).all() and pd.read_csv(out3 / "baseline.csv").n_questions.iloc[0] == 6
    assert t3.base_accuracy.iloc[0] == pytest.approx(evaluate_task(model, task, limit=4, progress=False).metrics["acc"])
    # (b) the rule of (a) on the sweep's own 4 questions: its own accuracy, SE and decision, and a
    # column marked as noise in (c) exactly when those questions carry no signal
    sb = pd.read_csv(out3 / "sweep_baseline.csv").iloc[0]
    assert sb.n_questions == 4 and sb.sweep == "done" and sb.accuracy == pytest.approx(t3.base_accuracy.iloc[0])
    correct4 = np.array([q.correct for q in evaluate_task(model, task, limit=4, progress=False).questions], float)
    assert 0 <= sb.boot_se <= 2 * correct4.std() / math.sqrt(4) + 1e-9
    assert bool(sb.signal) == (sb.accuracy - sb.chance > 2 * sb.boot_se) and (t3.sweep_signal == sb.signal).all()
    header = [ln for ln in (out3 / "summary.md").read_text().split("(c) % of heads")[1].splitlines()
              if ln.startswith("| score_fn")][0]
    assert ("‡" in header) == (not sb.signal)
    full = pd.read_csv(out / "sweep_baseline.csv").iloc[0]  # a sweep on all 6: the same numbers as (a)
    assert (full.accuracy, full.boot_se, bool(full.signal)) == (row.accuracy, row.boot_se, bool(row.signal))

    # without --sweep-all a pair without signal gets its baseline and decision only
    if not row.signal:
        out2 = tmp_path / "out2"
        argv2 = [x for x in argv if x != "--sweep-all"][:-1] + [str(out2)]
        assert mod.main(argv2) == 0
        assert not (out2 / "table2.csv").exists() and (out2 / "paper_comparison.csv").exists()
        assert pd.read_csv(out2 / "baseline.csv").accuracy.iloc[0] == row.accuracy

    # a fresh checkout holds the tables but not the git-ignored store: --from-store keeps every pair's
    # rows (named as carried over, not as unmeasured), and a run of another pair keeps them beside its own
    fresh = tmp_path / "fresh"
    shutil.copytree(out, fresh, ignore=shutil.ignore_patterns("store"))
    assert mod.main([*argv[:-1], str(fresh), "--from-store"]) == 0
    assert {p.name: p.read_text() for p in fresh.glob("*.csv")} == {p.name: p.read_text() for p in out.glob("*.csv")}
    text = (fresh / "summary.md").read_text()
    assert "Carried over from the tables of earlier runs" in text and "Not measured yet" not in text
    assert f"{label} / mc: baseline (6 questions); {label} / mc: sweep (6 questions)" in text
    assert "| ahon_ln |" in text.split("(c) % of heads")[1]  # the carried sweep is in Table 2
    assert mod.main([*argv[:-1], str(fresh)]) == 0  # computing: what the tables hold at this size is not redone
    assert not list(fresh.rglob("*.json"))
    assert {p.name: p.read_text() for p in fresh.glob("*.csv")} == {p.name: p.read_text() for p in out.glob("*.csv")}
    assert mod.main([*argv[:-1], str(fresh), "--sweep-limit", "4"]) == 0  # other sizes are measured, not carried
    assert (pd.read_csv(fresh / "table2.csv").n_questions == 4).all() and list(fresh.rglob("points/*.json"))
    assert pd.read_csv(fresh / "baseline.csv").n_questions.tolist() == [6]
    shutil.rmtree(fresh)
    shutil.copytree(out, fresh, ignore=shutil.ignore_patterns("store"))
    other_label = mod.model_label(str(other))
    argv_other = ["--models", str(other), *argv[2:-1], str(fresh), "--paper-model", str(other)]
    assert mod.main(argv_other) == 0
    merged = pd.read_csv(fresh / "table2.csv")
    assert set(merged.model) == {label, other_label}
    pd.testing.assert_frame_equal(merged[merged.model == label].reset_index(drop=True), t2)
    assert pd.read_csv(fresh / "baseline.csv").model.tolist() == [label, other_label]
    assert f"{label} / mc: not in this run" in (fresh / "summary.md").read_text()
    assert mod.main([*argv[:-1], str(fresh)]) == 0  # a pair's rows are replaced where they stood
    assert pd.read_csv(fresh / "baseline.csv").model.tolist() == [label, other_label]


def test_distributions_wasserstein(tmp_path, tiny_model_dir, tiny_model):
    from scipy.stats import wasserstein_distance

    from lens_heads.data import tokenize_texts
    from lens_heads.scores import score_heads

    mod = script("distributions")
    texts = ["The capital of France is Paris. The capital of Italy is Rome. " * 2,
             "Attention heads that do nothing are called dormant heads.",
             "Question: How do I boil an egg? Answer: put it in boiling water.",
             "A B C D Answer: the following are multiple choice questions"]
    corpus = tmp_path / "corpus.jsonl"
    corpus.write_text("".join(json.dumps({"text": t}) + "\n" for t in texts))
    a, b, out = tiny_model_dir("llama"), tiny_model_dir("qwen2"), tmp_path / "out"
    argv = ["--models", f"{a},{b}", "--corpus", str(corpus), "--n-inputs", "4", "--max-len", "24",
            "--task", mc_task_file(tmp_path), "--task-limit", "6", "--scores", "awft,ahon_ln", "--n-boot", "10",
            "--dtype", "float32", "--out", str(out)]
    assert mod.main(argv) == 0

    wass = pd.read_csv(out / "wasserstein.csv")
    assert list(wass.columns) == ["score_fn", "comparison", "dataset", "model", "a", "b", "w_raw", "w_scaled"]
    assert set(wass.comparison) == {"models", "datasets"} and (wass.w_raw >= 0).all()
    # between models, raw: equals scipy on independently computed per-input awft values
    pooled = {}
    for arch in ("llama", "qwen2"):
        m = tiny_model(arch)
        hs = score_heads(m, tokenize_texts(m.tokenizer, texts, 24), ["awft"], keep_per_input=True, progress=False)
        pooled[arch] = hs.per_input["awft"].flatten().double().numpy()
    row = wass[(wass.score_fn == "awft") & (wass.comparison == "models")].iloc[0]
    assert row.w_raw == pytest.approx(wasserstein_distance(pooled["llama"], pooled["qwen2"]), rel=1e-5)
    # scaled = raw values divided by each model's mean: recompute
    scaled = wasserstein_distance(pooled["llama"] / pooled["llama"].mean(), pooled["qwen2"] / pooled["qwen2"].mean())
    assert row.w_scaled == pytest.approx(scaled, rel=1e-5)
    # a distribution against itself: distance 0 (the library function the script uses)
    from lens_heads.scores import wasserstein_distances

    assert wasserstein_distances({"x": pooled["llama"], "y": pooled["llama"]}).loc["x", "y"] == 0.0

    # stability ratio = W(datasets) / mean W(models), scaled; only the first model compared across datasets
    st = pd.read_csv(out / "stability.csv")
    assert set(st.model) == {mod.model_label(str(a))}
    for r in st.itertuples():
        sel = wass[wass.score_fn == r.score_fn]
        w_d = sel[sel.comparison == "datasets"].w_scaled.iloc[0]
        w_m = sel[sel.comparison == "models"].w_scaled.mean()
        assert r.ratio == pytest.approx(w_d / w_m)
        assert r.ratio_ci_low <= r.ratio_ci_high
    for f in ("distributions_corpus.png", f"datasets_{mod.model_label(str(a))}.png", "wasserstein_models_awft.png"):
        assert (out / "figures" / f).stat().st_size > 1000
    assert "more stable" in (out / "summary.md").read_text()


def test_collapse_repair_tables(tmp_path, tiny_model_dir, tiny_model, shared_data):
    from lens_heads.data import load_texts, tokenize_texts
    from lens_heads.surgery.diagnose import CLASSES, diagnose
    from lens_heads.scores import score_heads

    mod = script("collapse_repair")
    folder, out = tiny_model_dir("llama"), tmp_path / "out"
    argv = ["--models", str(folder), "--repair-model", str(folder), "--low-output-select", "ahon_ln<1.0",
            "--diag-n", "4", "--diag-len", "32", "--n-eval", "3", "--eval-len", "32", "--n-train-docs", "5",
            "--chunk-len", "16", "--steps", "2", "--grad-accum", "2", "--dtype", "float32",
            "--bloom-layers", "2", "--bloom-heads", "4", "--bloom-d", "32", "--bloom-vocab", "300",
            "--bloom-train-docs", "20", "--bloom-seq", "16", "--bloom-batch", "4", "--bloom-steps", "3",
            "--out", str(out)]
    assert mod.main(argv) == 0

    # diagnosis: counts sum to layers x heads and equal an independent diagnosis of the same documents
    model = tiny_model("llama")
    docs = load_texts("c4", n=7)
    diag_inputs = tokenize_texts(model.tokenizer, docs[:4], 32)
    ref = diagnose(model, diag_inputs)
    counts = pd.read_csv(out / "diagnosis_counts.csv").iloc[0]
    assert sum(int(counts[c]) for c in CLASSES) == 2 * 4 == counts.heads_total
    assert {c: int(counts[c]) for c in CLASSES} == ref.counts()
    assert counts.max_bos_mass == pytest.approx(float(ref.bos_mass.max()), abs=1e-6)

    # repair: the sinks rule finds nothing on a random model; low_output targets = heads with mean ahon_ln < 1
    rep = pd.read_csv(out / "repair.csv").set_index("repair")
    assert "no heads selected" in rep.loc["sinks", "note"]
    mean = score_heads(model, diag_inputs, ["ahon_ln"], progress=False).mean["ahon_ln"]
    assert rep.loc["low_output", "n_targets_pass1"] == int((mean < 1.0).sum())
    # perplexity before = a naive loop over the held-out documents (not the diagnosis ones)
    assert rep.loc["low_output", "ppl_before"] == pytest.approx(
        naive_perplexity(model.load_hf_model(), model.tokenizer, docs[4:7], 32), rel=1e-4)
    assert rep.loc["low_output", "steps"] == 2 and rep.loc["low_output", "healthy_after"] <= 8

    # BLOOM: one row per head, ALiBi slopes 2^(-8(h+1)/H), classes follow the BOS-mass rule
    heads = pd.read_csv(out / "bloom_heads.csv")
    assert len(heads) == 2 * 4
    assert np.allclose(heads.alibi_slope, [2 ** (-8 * (h + 1) / 4) for h in heads["head"]])
    assert ((heads.bos_mass > 0.95) == (heads["class"] == "dead")).all()
    assert (pd.read_csv(out / "bloom_training.csv").step.max() == 3)
    summary = (out / "summary.md").read_text()
    assert "collapse_repair.py" in summary and ("No attention sink formed" in summary or "DEAD/BOS-sink" in summary)

    # a later run of one part keeps the other parts' sections, each stamped with its own command
    before = {k: (out / "sections" / f"{k}.md").read_text() for k in ("diagnose", "repair")}
    assert mod.main([*argv[:argv.index("--out")], "--parts", "bloom", "--out", str(out)]) == 0
    summary = (out / "summary.md").read_text()
    assert summary.index("## 1. Diagnosis") < summary.index("## 2. Repair") < summary.index("## 3. BLOOM")
    assert all((out / "sections" / f"{k}.md").read_text() == v for k, v in before.items())
    assert summary.count("--parts bloom") == 2  # the header's command and the BLOOM section's stamp


@pytest.mark.filterwarnings("ignore:bfloat16 on cpu without native bf16")  # emulated here; the check still holds
def test_inactive_heads_dtype_check(tmp_path, tiny_model_dir):
    """--check-dtype: bf16 vs fp32 on a subset, each dtype's numbers equal its own evaluation
    (bf16 with its own AHON(LN) thresholds), stored, and tabulated again by --from-store."""
    from lens_heads import load_model
    from lens_heads.interventions.ablation import parse_ablation
    from lens_heads.data import load_task
    from lens_heads.forward.task_requests import task_inputs
    from lens_heads.evaluation.evaluate import evaluate_task
    from lens_heads.interventions.thresholds import compute_thresholds

    mod = script("inactive_heads")
    folder, spec, out = tiny_model_dir("llama"), mc_task_file(tmp_path), tmp_path / "out"
    argv = ["--models", str(folder), "--tasks", spec, "--limit", "6", "--baseline-only", "--check-dtype",
            "--check-dtype-limit", "4", "--n-boot", "20", "--dtype", "float32", "--out", str(out)]
    assert mod.main(argv) == 0
    check = pd.read_csv(out / "dtype_check.csv")
    assert list(check.ablation) == ["none", "ahon_ln@0.1"] and (check.n_questions == 4).all()
    task = load_task(spec)
    for d in ("float32", "bfloat16"):
        m = load_model(str(folder), dtype=d)
        base = evaluate_task(m, task, limit=4, progress=False)
        tau = compute_thresholds(m, task_inputs(m, task, None, 4), ["ahon_ln"], [0.1], 8)["ahon_ln"][0.1]
        abl = evaluate_task(m, task, limit=4, ablation=parse_ablation(f"score:ahon_ln@{tau!r}", m.geometry),
                            progress=False)
        assert check[f"acc_{d}"].tolist() == pytest.approx([base.metrics["acc"], abl.metrics["acc"]])
        if d == "float32":
            ref = (base, abl)
    agree = [np.mean([a.pred == b.pred for a, b in zip(r.questions, s.questions)]) for r, s in zip(ref, (base, abl))]
    assert check.prediction_agreement.tolist() == pytest.approx(agree)
    assert (check.max_abs_dll > 0).all()  # bf16 does change the log-likelihoods
    before = (out / "dtype_check.csv").read_text()
    n_files = len(list((out / "store").rglob("*.json")))
    assert mod.main(argv + ["--from-store"]) == 0
    assert (out / "dtype_check.csv").read_text() == before and len(list((out / "store").rglob("*.json"))) == n_files
    assert "bfloat16 vs float32 check" in (out / "summary.md").read_text()


def test_inactive_heads_sweep_limits():
    """--sweep-limit caps every task's sweep; --sweep-limit-TASK replaces it for that task; the
    --limit-TASK of the baseline caps both."""
    mod = script("inactive_heads")
    args = mod.parse_args(["--limit-mmlu", "2000", "--limit-piqa", "100", "--sweep-limit", "200",
                           "--sweep-limit-mmlu", "500"])
    assert [mod.sweep_limit(args, t) for t in ("mmlu", "piqa", "winogrande")] == [500, 100, 200]
    assert mod.sweep_limit(mod.parse_args(["--sweep-limit-winogrande", "300"]), "winogrande") == 300
    with pytest.raises(Exception, match="--sweep-limit-mmlu must be >= 1"):
        mod.parse_args(["--sweep-limit-mmlu", "0"])


def test_inactive_heads_first_points_are_checked_when_parsed(tmp_path):
    """--first labels become canonical and a bad one fails in parse_args, before any folder or model."""
    mod = script("inactive_heads")
    args = mod.parse_args(["--scores", "ahon_ln,awft", "--first", "ahon_ln@0.10, random@.1@2,awft@0.3"])
    assert args.first == ["ahon_ln@0.1", "random@0.1@2", "awft@0.3"]
    for bad, msg in [("ahon_ln@0.12", "fractions > 0 are"), ("random@0.1@3", "random seeds are"),
                     ("lthon_ln@0.1", "not among")]:
        with pytest.raises(Exception, match=msg):
            mod.parse_args(["--scores", "ahon_ln,awft", "--first", bad, "--out", str(tmp_path / "o")])
    assert not (tmp_path / "o").exists()


def test_paper_row_judges_single_points_against_what_it_implies():
    """Stored points of curves not complete yet stand beside the paper's Qwen row: 'within' below its
    within-1-point value, 'beyond' above it; the verdict follows our paired interval against -1 point."""
    from argparse import Namespace

    mod = script("inactive_heads")
    assert [mod.paper_within("ahon_ln", x) for x in (7.4, 7.5)] == ["within", "beyond"]
    assert [mod.paper_within("lthon_ln", x) for x in (14.4, 14.5)] == ["within", "beyond"]
    assert [mod.paper_within("random", x) for x in (0.4, 1.0, 2.0)] == ["within", "", "beyond"]
    assert mod.paper_within("aeqd", 5.0) == ""  # the paper's row gives no value for it
    label = mod.model_label("qwen2.5-coder-0.5b")
    rows = [("ahon_ln", None, 9.8, -0.4, -0.8, 0.2), ("lthon_ln", None, 9.9, -0.5, -3.0, 2.0),
            ("random", 0, 4.9, -2.4, -5.4, -1.2), ("awft", None, 5.0, -3.0, -4.0, -2.0)]
    points = pd.DataFrame([{"model": label, "task": "mmlu", "score_fn": f, "seed": s, "pct_zeroed": x,
                            "delta_pt": d, "delta_ci_low": lo, "delta_ci_high": hi, "n_questions": 500,
                            "paper": mod.paper_within(f, x)} for f, s, x, d, lo, hi in rows]).astype({"seed": "Int64"})
    empty = pd.DataFrame(columns=["model", "task"])
    args = Namespace(paper_model="qwen2.5-coder-0.5b", paper_task="mmlu")
    cmp = mod.paper_comparison(empty, empty, empty, args, None, points).set_index("quantity")
    assert cmp.loc["ahon_ln at 9.8 % zeroed: accuracy change (pt)", "verdict"].startswith("disagrees (ours: within")
    assert cmp.loc["lthon_ln at 9.9 % zeroed: accuracy change (pt)", "verdict"].startswith("undecided")
    assert cmp.loc["random heads (seed 0) at 4.9 % zeroed: accuracy change (pt)", "verdict"].startswith("agrees (beyond")
    assert cmp.loc["awft at 5.0 % zeroed: accuracy change (pt)", "verdict"].startswith("disagrees (ours: beyond")
    assert cmp.loc["ahon_ln at 9.8 % zeroed: accuracy change (pt)", "paper"] == "beyond 1 pt"


def test_rows_of_an_old_definition_move_to_superseded():
    """inactive_heads.py: a Table 2 row measured before lthon_ln's definition changed (no
    score_revision column: revision 1) is split off; a re-measured row takes its place."""
    import pandas as pd

    ih = script("inactive_heads")
    split_superseded, with_overrides = ih.split_superseded, ih.with_overrides

    old = pd.DataFrame([{"model": "m", "task": "piqa", "score_fn": "awft", "max_pct_zeroed_within_1pt": 1.0},
                        {"model": "m", "task": "piqa", "score_fn": "lthon_ln", "max_pct_zeroed_within_1pt": 2.0},
                        {"model": "m", "task": "piqa", "score_fn": "random", "max_pct_zeroed_within_1pt": 3.0}])
    current, gone = split_superseded(old)
    assert list(current["score_fn"]) == ["awft", "random"] and list(gone["score_fn"]) == ["lthon_ln"]
    assert list(current["score_revision"]) == [1, 1]
    new = with_overrides(old, [{"model": "m", "task": "piqa", "score_fn": "lthon_ln",
                                "max_pct_zeroed_within_1pt": 5.0, "score_revision": 2}])
    current, gone = split_superseded(new)
    assert list(current["score_fn"]) == ["awft", "lthon_ln", "random"] and not len(gone)
    assert current.loc[1, "max_pct_zeroed_within_1pt"] == 5.0 and current.loc[1, "score_revision"] == 2


def test_committed_store_records_rekey_to_their_file_names():
    """Every committed store record's key, rebuilt by the key code (``keys.RunIdentity`` and its
    kind's builder) from the fields it holds, equals its configuration and hashes to its file
    name: no stored result is orphaned by a change to how keys are built. A record of a score
    function's older definition rebuilds to another key (it is never reused)."""
    from dataclasses import fields

    from lens_heads.interventions.specs import parse_spec
    from lens_heads.results.keys import Kind, RunIdentity, config_key
    from lens_heads.evaluation.protocol import Protocol
    from lens_heads.scores import SCORES

    store = ANALYSES / "results" / "inactive_heads" / "store"
    files = sorted(store.rglob("*.json"))
    assert len(files) >= 10
    protocol_fields = {f.name for f in fields(Protocol)}
    superseded = 0
    for f in files:
        config = json.loads(f.read_text())["config"]
        assert config_key(config) == f.stem, f
        ident = RunIdentity(*(config[k] for k in ("model_digest", "task", "task_fingerprint", "n_shot", "limit",
                                                  "seed", "dtype", "version")),
                            protocol={k: v for k, v in config.items() if k in protocol_fields})
        kind = Kind(config["kind"])
        if kind is Kind.THRESHOLDS:
            key, fns = ident.thresholds(config["score_ids"], config["fractions"]), config["score_ids"]
        elif kind is Kind.STATIC_SCORES:
            key, fns = ident.static_scores(config["score"]), [config["score"]]
        else:
            spec = parse_spec(config["ablation"])
            fn = getattr(spec, "score_id", None)
            key, fns = ident.point(config["ablation"], fn), [fn]
            if kind is Kind.PART:
                key = key.part(config["doc_ids"])
        recorded = {*config.get("score_revisions", {}), *([fns[0]] if "score_revision" in config else [])}
        old = [fn for fn in fns if fn in SCORES and SCORES[fn].revision > 1 and fn not in recorded]
        if old:  # measured under an older definition: today's key differs by the revision alone
            superseded += 1
            assert key.digest != f.stem and {k: v for k, v in key.config.items()
                                             if k not in ("score_revision", "score_revisions")} == config, f
            continue
        assert json.loads(json.dumps(key.config)) == config and key.digest == f.stem, f
    assert 0 < superseded < len(files) / 2  # the old LTHON(LN) thresholds and points


def test_committed_stores_match_the_tasks_as_loaded_from_any_data_folder(tmp_path, shared_data, monkeypatch):
    """The task fingerprint in every committed store key is that of the task loaded here, and it
    does not depend on where the data folder lies (a copy elsewhere gives the same one): a clone
    at another path, or a user whose data moved, finds the stored results."""
    from lens_heads.data import load_task
    from lens_heads.results.keys import task_fingerprint

    stored = {}
    for f in sorted((ANALYSES / "results" / "inactive_heads" / "store").rglob("*.json")):
        config = json.loads(f.read_text())["config"]
        stored.setdefault(config["task"], set()).add(config["task_fingerprint"])
    assert set(stored) == {"piqa", "mmlu"}
    here = {name: task_fingerprint(load_task(name)) for name in stored}
    assert {name: {fp} for name, fp in here.items()} == stored
    moved = tmp_path / "elsewhere" / "data"
    shutil.copytree(shared_data / "piqa", moved / "piqa")
    monkeypatch.setenv("LENS_HEADS_DATA", str(moved))
    task = load_task("piqa")
    assert str(moved) in task.source  # read from the copy...
    assert task_fingerprint(task) == here["piqa"]  # ...and the same task
    task.records[0].choices[0] += " "  # a changed row is another task
    assert task_fingerprint(task) != here["piqa"]


def test_from_store_rewrites_the_committed_tables_byte_for_byte(tmp_path, monkeypatch):
    """inactive_heads.py --from-store, with the command the committed tables record, writes every
    committed table again byte for byte (summary.md too, but for the run's own command, wall time
    and date), without loading or even fetching a model."""
    import lens_heads.models as models

    committed = ANALYSES / "results" / "inactive_heads"
    out = tmp_path / "inactive_heads"
    shutil.copytree(committed, out)
    mod = script("inactive_heads")
    argv = ["--models", "smollm2-135m,qwen2.5-coder-0.5b,gemma-3-270m", "--tasks", "piqa,winogrande,mmlu",
            "--limit-mmlu", "2000", "--sweep-limit", "200", "--sweep-limit-mmlu", "500", "--check-dtype",
            "--check-dtype-limit", "100", "--from-store", "--dtype", "float32", "--out", str(out)]
    assert f"`HF_HUB_OFFLINE=1 HF_DATASETS_OFFLINE=1 python analyses/inactive_heads.py {' '.join(argv[:-1])} " \
           f"analyses/results/inactive_heads`" in (committed / "summary.md").read_text()
    for owner, attr in ((models, "load_model"), (models.load, "load_model"), (models.zoo, "fetch")):
        monkeypatch.setattr(owner, attr, lambda *a, **k: pytest.fail("a model was loaded"))
    assert mod.main(argv) == 0
    tables = sorted(committed.glob("*.csv"))
    assert len(tables) >= 10
    for f in tables:
        assert (out / f.name).read_bytes() == f.read_bytes(), f.name
    # provenance (command, package versions, machine, times) differs on a fresh install or another
    # machine; everything the run measured must not
    run_lines = tuple(f"| {row} |" for row in importlib.import_module("common").Run.PROVENANCE_ROWS)
    keep = lambda p: [x for x in p.read_text().splitlines() if not x.startswith(run_lines)]  # noqa: E731
    assert keep(out / "summary.md") == keep(committed / "summary.md")
    assert len(keep(committed / "summary.md")) < len((committed / "summary.md").read_text().splitlines()) - 5


def test_surgery_dynamics_resumes_and_rebuilds_its_tables_from_the_stores(tmp_path, tiny_model_dir, tiny_model,
                                                                          monkeypatch):
    """A run stopped by --max-wall-s at its first checkpoint (exit 3) resumes to the tables of an
    uninterrupted run, byte for byte; --from-store writes them again without a model; the probe
    perplexity before surgery equals a naive loop over the probe documents (disjoint from the
    diagnosis and perplexity documents)."""
    import lens_heads.models as models
    from lens_heads.errors import LensHeadsError

    mod = script("surgery_dynamics")
    folder = tiny_model_dir("llama")
    val = [f"Document {i}: the capital of France is Paris and the capital of Italy is Rome; question {i}."
           for i in range(9)]
    (tmp_path / "val.txt").write_text("\n".join(val) + "\n")
    (tmp_path / "train.txt").write_text("\n".join(f"Train {i}: A B C D Answer: heads, Paris and Rome." for i in
                                                  range(30)) + "\n")
    argv = ["--models", str(folder), "--heads", "1.2", "--reinit-healthy", "index:0", "--train-data",
            str(tmp_path / "train.txt"), "--n-train-docs", "30", "--val-data", str(tmp_path / "val.txt"),
            "--diag-n", "3", "--diag-len", "32", "--n-eval", "3", "--eval-len", "32", "--n-probes", "3",
            "--probe-len", "32", "--max-new-tokens", "3", "--steps", "3", "--checkpoint-every", "1",
            "--chunk-len", "16", "--grad-accum", "1", "--lr", "1e-2", "--dtype", "float32",
            "--measure-on", f"train,{tmp_path / 'other.txt'}"]
    (tmp_path / "other.txt").write_text("\n".join(f"Elsewhere {i}: rivers, hills and a town by the sea." for i in
                                                  range(3)) + "\n")
    whole, stopped = tmp_path / "whole", tmp_path / "stopped"
    assert mod.main([*argv, "--out", str(whole)]) == 0
    assert mod.main([*argv, "--max-wall-s", "0.001", "--out", str(stopped)]) == mod.STOPPED
    assert [p.name for p in sorted((stopped / "work/repair/checkpoints/pass1").glob("step-*"))] == ["step-000001"]
    assert not (stopped / "work/repair/report.json").exists()
    assert mod.main([*argv, "--out", str(stopped)]) == 0
    names = tuple(f"{d}{t}.csv" for d in ("", "on-train/", "on-other/") for t in ("heads", "curves", "generations",
                                                                                  "epochs"))
    for name in names:
        assert (whole / name).read_bytes() == (stopped / name).read_bytes(), name

    curves = pd.read_csv(whole / "curves.csv")
    assert list(curves["point"]) == ["before", "p1-reinit", "p1-step000001", "p1-step000002", "p1-step000003"]
    heads = pd.read_csv(whole / "heads.csv")
    assert set(heads.loc[heads["point"] == "before", "group"]) == {"target", "target_healthy", "frozen_target_layer"}
    model = tiny_model("llama")
    hf = model.load_hf_model().eval()

    def naive_ppl(texts):
        return naive_perplexity(hf, model.tokenizer, texts, 32)

    assert curves.loc[0, "ppl"] == pytest.approx(naive_ppl(val[6:9]), rel=1e-5)

    train_texts = (tmp_path / "train.txt").read_text().splitlines()[:3]  # the first --n-probes training documents
    other_texts = (tmp_path / "other.txt").read_text().splitlines()
    on_train, on_other = (pd.read_csv(whole / f"on-{d}/curves.csv") for d in ("train", "other"))
    assert list(on_train["point"]) == list(curves["point"]) == list(on_other["point"])
    assert on_train.loc[0, "ppl"] == pytest.approx(naive_ppl(train_texts), rel=1e-5)
    assert on_other.loc[0, "ppl"] == pytest.approx(naive_ppl(other_texts), rel=1e-5)
    assert on_train["ppl"].iloc[-1] < on_train["ppl"].iloc[1]  # trained on: lower than right after re-init
    assert "On " in (whole / "summary.md").read_text()
    with pytest.raises(LensHeadsError, match="say 'train'"):
        mod.parse_args([*argv[:-2], "--measure-on", str(tmp_path / "train.txt"), "--out", str(tmp_path / "x")])

    saved = {name: (whole / name).read_bytes() for name in names}
    for name in names:
        (whole / name).unlink()
    for owner, attr in ((models, "load_model"), (models.load, "load_model")):
        monkeypatch.setattr(owner, attr, lambda *a, **k: pytest.fail("a model was loaded"))
    assert mod.main([*argv, "--from-store", "--out", str(whole)]) == 0
    for name in names:
        assert (whole / name).read_bytes() == saved[name], name
    assert "Drift per state" in (whole / "summary.md").read_text() and (whole / "report.html").is_file()


    # the findings across runs: a view of the runs' committed tables
    find = script("surgery_findings")
    runs = f"a={whole},b={stopped}"
    assert find.main(["--runs", runs, "--out", str(tmp_path / "findings")]) == 0
    table = pd.read_csv(tmp_path / "findings" / "findings.csv")
    assert len(table) == 6 and set(table["probe_set"]) == {".", "on-train", "on-other"}
    row = table[(table["run"] == "a") & (table["probe_set"] == "on-train")].iloc[0]
    assert row["ppl_before"] == pytest.approx(on_train.loc[0, "ppl"]) and row["ppl_end"] == pytest.approx(
        on_train["ppl"].iloc[-1])
    assert row["ppl_best"] == pytest.approx(on_train["ppl"].iloc[2:].min()) and row["steps"] == 3
    main_row = table[(table["run"] == "a") & (table["probe_set"] == ".")].iloc[0]
    assert main_row["moved_frozen_reinit"] == curves.loc[1, "moved_frozen"]
    assert main_row["moved_frozen_end"] == curves["moved_frozen"].iloc[-1]
    since = curves["moved_frozen_since_reinit"]
    assert main_row["late_moved_pct"] == pytest.approx(
        100 * (since.iloc[-1] - since.loc[2]) / curves.loc[0, "n_frozen"])  # step 1 <= 1.5
    assert main_row["since_reinit_end"] == since.iloc[-1] and main_row["since_reinit_first"] == since.loc[2]
    assert main_row["tv_reinit_end"] == pytest.approx(curves["mean_tv_reinit_frozen"].iloc[-1])
    assert main_row["tv_reinit_end"] > 0 and curves.loc[1, "mean_tv_reinit_frozen"] == 0  # re-init: 0 from itself
    woken = (curves["mean_tv_reinit_target"] + curves["mean_tv_reinit_target_healthy"] * curves["n_target_healthy"]
             ) / (1 + curves["n_target_healthy"])  # one target (1.2) and the healthy heads of index 0
    assert main_row["tv_reinit_reinitialised_end"] == pytest.approx(woken.iloc[-1])
    settled = curves[(curves["kind"] == "step") & (woken >= 0.9 * woken.iloc[-1])].iloc[0]
    assert main_row["settled_step"] == settled["step"]
    assert main_row["since_reinit_settled"] == settled["moved_frozen_since_reinit"]
    # the run's own held-out perplexity: before surgery on its --n-eval documents (a naive loop), then per epoch
    epochs = pd.read_csv(whole / "epochs.csv")
    assert list(epochs["pass"]) == [0, 1, 1] and list(epochs["step"]) == [0, 0, 3]
    assert main_row["heldout_ppl_before"] == pytest.approx(naive_ppl(val[3:6]), rel=1e-5)
    assert main_row["heldout_ppl_end"] == pytest.approx(epochs["ppl"].iloc[-1])
    assert (table[table["run"] == "a"].drop(columns="run").to_numpy() ==
            table[table["run"] == "b"].drop(columns="run").to_numpy()).all()  # the same run, stopped and resumed
    first = {n: (tmp_path / "findings" / n).read_bytes() for n in ("findings.csv", "findings.md")}
    assert find.main(["--runs", runs, "--out", str(tmp_path / "findings")]) == 0
    assert first == {n: (tmp_path / "findings" / n).read_bytes() for n in ("findings.csv", "findings.md")}
    assert "Re-optimisation" in first["findings.md"].decode() and (tmp_path / "findings" / "findings.png").is_file()
    for bad, msg in ((f"a={tmp_path}", "holds no surgery_dynamics"), (f"a={whole},a={stopped}", "given twice"),
                     (str(whole), "LABEL=FOLDER")):
        with pytest.raises(LensHeadsError, match=msg):
            find.parse_args(["--runs", bad, "--out", str(tmp_path / "f2")])
