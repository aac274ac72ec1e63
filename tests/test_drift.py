"""Drift of the heads after surgery (lens_heads.surgery.drift, docs/methods.md §7): a head that
cannot change does not move (exactly), a synthetic edit moves that head and the heads after it
only, every measure equals a naive loop over heads, the replayed states are the run's weights,
and the tables come from the store alone, byte for byte."""

from __future__ import annotations

import copy
import json
import math
import shutil

import pandas as pd
import pytest
import torch
from transformers import AutoModelForCausalLM

from conftest import DRIFT_PROBES, DRIFT_TARGET, SAMPLE_TEXTS
from lens_heads.cli import main
from lens_heads.errors import LensHeadsError
from lens_heads.forward.activations import head_patterns
from lens_heads.forward.engine import forward
from lens_heads.models.hooks import hook_name, w_o
from lens_heads.models.load import boot
from lens_heads.surgery import drift
from lens_heads.surgery.diagnose import Diagnosis, DiagnosisThresholds
from lens_heads.surgery.drift import MOVED_TV, StatePoint, drift_tables, measure, measure_run, replay, write_tables
from lens_heads.surgery.reinit import named_params
from lens_heads.surgery.report import RepairReport
from lens_heads.surgery.targets import HealthyPick


# --- naive reference: one head at a time, one row at a time --------------------------------

def naive_measures(model, texts, max_tokens, base=None):
    """Per head (L, h): BOS mass, entropy, output norm after W_O, and the pattern distance to
    ``base`` (a dict of the same head's patterns), each averaged per text then over texts."""
    g = model.geometry
    out, pats = {}, {}
    zs = []
    for text in texts:
        ids = model.to_tokens(text)[0][:max_tokens]
        got = {}
        forward(model, ids[None], torch.ones(1, ids.numel(), dtype=torch.long),
                [(hook_name("z", L), lambda z, hook, L=L: got.__setitem__(L, z[0].detach().double()))
                 for L in range(g.n_layers)], logits=False)
        zs.append(got)
    for L in range(g.n_layers):
        W = w_o(model, L).detach().double()
        for h in range(g.n_heads):
            bos, ent, norm, tv = [], [], [], []
            for i, text in enumerate(texts):
                a = torch.tensor(head_patterns(model, text, [(L, h)], max_tokens).patterns[0], dtype=torch.float64)
                pats[(L, h, i)] = a
                T = a.shape[0]
                bos.append(sum(float(a[t, 0]) for t in range(T)) / T)
                ent.append(sum(-sum(float(x) * math.log(float(x)) for x in a[t] if x > 0) for t in range(T)) / T)
                norm.append(float((zs[i][L][:, h] @ W[h]).norm(dim=-1).mean()))
                if base is not None:
                    b = base[(L, h, i)]
                    tv.append(sum(0.5 * sum(abs(float(a[t, k] - b[t, k])) for k in range(T)) for t in range(1, T))
                              / (T - 1))
            out[(L, h)] = (sum(bos) / len(bos), sum(ent) / len(ent), sum(norm) / len(norm),
                           sum(tv) / len(tv) if tv else 0.0)
    return out, pats


def _measure(model, hf, probes, base):
    return measure(model, hf, probes.probes, base, probes.prompt_ids, probes.max_new_tokens,
                   model.tokenizer.pad_token_id or 0)


def test_a_synthetic_edit_moves_that_head_and_the_heads_after_it_only(drift_run):
    model, _run, _store, probes = drift_run
    g = model.geometry
    hf = model.load_hf_model().eval()
    edited = copy.deepcopy(hf)
    s = g.qkv_slices(0, 2, "q")  # head 0.2's query rows: only its pattern changes in layer 0
    p = named_params(edited)[s.name]
    noise = torch.randn(p.index_select(s.dim, s.index).shape, generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        p.index_copy_(s.dim, s.index, p.index_select(s.dim, s.index) + 0.5 * noise)
    base_model = boot(copy.deepcopy(hf), model.tokenizer, model.source, model.dtype, model.device)
    edit_model = boot(copy.deepcopy(edited), model.tokenizer, model.source, model.dtype, model.device)
    m0, pats0 = _measure(base_model, hf, probes, None)
    m1, _ = _measure(edit_model, edited, probes, pats0)

    for h in range(g.n_heads):  # layer 0, but the edited head: bit-identical inputs and weights
        if h != 2:
            assert m1.tv[0, h] == 0 and m1.bos_mass[0, h] == m0.bos_mass[0, h]
            assert m1.entropy[0, h] == m0.entropy[0, h] and m1.out_norm[0, h] == m0.out_norm[0, h]
    assert m1.tv[0, 2] > 1e-3 and m1.bos_mass[0, 2] != m0.bos_mass[0, 2]
    for h in range(g.n_heads):  # layer 1 reads the edited head's output
        assert m1.tv[1, h] > 0 and m1.out_norm[1, h] != m0.out_norm[1, h]
    assert (m0.tv == 0).all()

    # every measure against a naive loop over heads, rows and keys
    texts = DRIFT_PROBES
    ref0, base = naive_measures(base_model, texts, 32)
    ref1, _ = naive_measures(edit_model, texts, 32, base)
    for (L, h), (bos, ent, norm, tv) in ref1.items():
        assert float(m1.bos_mass[L, h]) == pytest.approx(bos, abs=1e-6)
        assert float(m1.entropy[L, h]) == pytest.approx(ent, abs=1e-5)
        assert float(m1.out_norm[L, h]) == pytest.approx(norm, rel=1e-5)
        assert float(m1.tv[L, h]) == pytest.approx(tv, abs=1e-6)
        assert float(m0.bos_mass[L, h]) == pytest.approx(ref0[(L, h)][0], abs=1e-6)


def test_frozen_heads_before_every_target_do_not_move_in_a_run(drift_run):
    model, run_dir, store, _probes = drift_run
    tables = drift_tables(store, run_dir)
    heads, curves = tables["heads"], tables["curves"]
    assert list(curves["point"]) == ["before", "p1-reinit", "p1-step000001", "p1-step000002", "p1-step000003"]
    assert list(curves["step"]) == [0, 0, 1, 2, 3]
    layer0 = heads[heads["layer"] == 0]
    assert len(layer0) == 5 * model.geometry.n_heads
    assert (layer0[["tv", "d_bos_mass", "d_entropy", "d_out_norm"]] == 0).all().all()
    assert (layer0["group"] == "frozen_elsewhere").all() and not layer0["moved"].any()
    L, h = DRIFT_TARGET
    target = heads[(heads["layer"] == L) & (heads["head"] == h)].set_index("point")
    assert (target["group"] == "target").all()
    assert target.loc["before", "tv"] == 0 and target.loc["p1-reinit", "tv"] > 0
    # the pattern distance bounds the BOS-mass change (docs/methods.md §7), and the moved flag and
    # the counts follow the threshold
    assert (heads["tv"] >= heads["d_bos_mass"].abs() - 1e-7).all() and (heads["tv"] > 0).any()
    assert (heads["moved"] == (heads["tv"] > MOVED_TV)).all()
    for row in curves.itertuples():
        sub = heads[heads["point"] == row.point]
        frozen = sub[sub["group"].str.startswith("frozen")]
        assert row.moved_frozen == int((frozen["tv"] > MOVED_TV).sum()) and row.n_frozen == 7
        assert row.n_frozen_target_layer == 3 and row.n_target == 1
    # the run's own held-out perplexity, as report.json has it: before surgery, then per epoch
    report = RepairReport.load(run_dir)
    history = report.passes[0].history
    assert tables["epochs"][["pass", "step", "ppl"]].values.tolist() == (
        [[0, 0, report.ppl_before]] + [[1, h["step"], h["ppl"]] for h in history])
    # signed changes are differences to the state before surgery
    before = heads[heads["point"] == "before"].set_index(["layer", "head"])
    last = heads[heads["point"] == "p1-step000003"].set_index(["layer", "head"])
    assert ((last["bos_mass"] - before["bos_mass"]) == last["d_bos_mass"]).all()


def test_distance_since_reinitialisation_is_exact_and_matches_a_naive_loop(drift_run):
    """tv_reinit: the distance of each state to the state its pass started training from. Layer 0
    (before every target) never moves by it; the re-initialised state is at 0 from itself; the
    last state's distances equal a naive loop over the replayed models' patterns."""
    model, run_dir, store, probes = drift_run
    tables = drift_tables(store, run_dir)
    heads, curves = tables["heads"], tables["curves"]
    assert heads.loc[heads["point"] == "before", "tv_reinit"].isna().all()
    assert not heads.loc[heads["point"] == "before", "moved_since_reinit"].any()
    assert (heads.loc[heads["point"] == "p1-reinit", "tv_reinit"] == 0).all()
    trained = heads[heads["point"] != "before"]
    assert (trained.loc[trained["layer"] == 0, "tv_reinit"] == 0).all()
    L, h = DRIFT_TARGET
    target = trained[(trained["layer"] == L) & (trained["head"] == h)].set_index("point")
    assert target.loc["p1-step000003", "tv_reinit"] > 1e-3  # training moved the target itself
    assert (trained["moved_since_reinit"] == (trained["tv_reinit"] > MOVED_TV)).all()
    for row in curves.itertuples():
        sub = heads[heads["point"] == row.point]
        frozen = sub[sub["group"].str.startswith("frozen")]
        assert row.moved_frozen_since_reinit == int((frozen["tv_reinit"] > MOVED_TV).sum())
    # against a naive loop: the patterns of the re-initialised and of the last state, head by head
    report = RepairReport.load(run_dir)
    pats = {}
    for point, hf in replay(model, run_dir, report):
        if str(point) in ("p1-reinit", "p1-step000003"):
            booted = boot(copy.deepcopy(hf), model.tokenizer, model.source, model.dtype, model.device)
            pats[str(point)] = naive_measures(booted, DRIFT_PROBES, 32)[1]
    last = trained[trained["point"] == "p1-step000003"].set_index(["layer", "head"])["tv_reinit"]
    for (Li, hi), got in last.items():
        want = []
        for i in range(len(DRIFT_PROBES)):
            a, b = pats["p1-step000003"][(Li, hi, i)], pats["p1-reinit"][(Li, hi, i)]
            T = a.shape[0]
            want.append(sum(0.5 * sum(abs(float(a[t, k] - b[t, k])) for k in range(T)) for t in range(1, T))
                        / (T - 1))
        assert got == pytest.approx(sum(want) / len(want), abs=1e-6)


def test_probe_perplexity_and_generations_match_naive_loops(drift_run):
    model, run_dir, store, probes = drift_run
    tables = drift_tables(store, run_dir)
    hf = model.load_hf_model().eval()
    nll, n = 0.0, 0
    with torch.no_grad():
        for ids in probes.probes:
            logp = torch.log_softmax(hf(input_ids=ids[None]).logits[0, :-1].double(), -1)
            nll -= float(logp.gather(1, ids[1:, None]).sum())
            n += len(ids) - 1
    assert tables["curves"].iloc[0]["ppl"] == pytest.approx(math.exp(nll / n), rel=1e-5)
    gens = tables["generations"]
    assert len(gens) == 5 * len(probes.prompts)
    for prompt, ids in zip(probes.prompts, probes.prompt_ids):
        with torch.no_grad():
            out = hf.generate(ids[None], max_new_tokens=probes.max_new_tokens, do_sample=False, use_cache=False,
                              pad_token_id=model.tokenizer.pad_token_id)[0, ids.numel():]
        got = gens[(gens["point"] == "before") & (gens["prompt"] == prompt)]["continuation"].iloc[0]
        assert got == model.tokenizer.decode(out.tolist())


def test_replayed_states_are_the_runs_weights(drift_run, tiny_model_dir):
    model, run_dir, _store, _probes = drift_run
    report = RepairReport.load(run_dir)
    original = {n: p.detach().clone() for n, p in model.load_hf_model().named_parameters()}
    seen, states = [], {}
    for point, hf in replay(model, run_dir, report):
        seen.append(str(point))
        params = dict(hf.named_parameters())
        if point.kind == "before":
            assert all(torch.equal(params[n], original[n]) for n in original)
        last = states[str(point)] = {n: p.detach().clone() for n, p in params.items()}
    assert seen[-1] == "p1-step000003"
    # the rebuilt re-initialisation is the one training started from: Adam's first step (lr 1e-2,
    # no warm-up at 3 steps, weight decay 0) moves no value by more than the learning rate, while
    # the re-initialised query rows lie far from the original ones
    reinit, step1 = states["p1-reinit"], states["p1-step000001"]
    assert max(float((step1[n] - reinit[n]).abs().max()) for n in reinit) <= 1e-2 * (1 + 1e-5)
    q = model.geometry.qkv_slices(*DRIFT_TARGET, "q")
    assert float((reinit[q.name] - original[q.name]).index_select(q.dim, q.index).abs().max()) > 0.05
    exported = dict(AutoModelForCausalLM.from_pretrained(run_dir).named_parameters())
    assert all(torch.equal(last[n], exported[n].detach()) for n in exported)  # the last state is the export


def test_tables_come_from_the_store_byte_for_byte_and_a_run_resumes(drift_run, tmp_path, monkeypatch):
    model, run_dir, store, probes = drift_run
    first = write_tables(drift_tables(store, run_dir), tmp_path / "a")
    copy_store = tmp_path / "store"
    shutil.copytree(store, copy_store)
    calls = []
    real = drift.measure

    def counting(*a, **k):
        calls.append(1)
        return real(*a, **k)

    monkeypatch.setattr(drift, "measure", counting)
    measure_run(model, run_dir, probes, copy_store, progress=False)  # everything stored: nothing measured
    assert calls == []
    second = write_tables(drift_tables(copy_store, run_dir), tmp_path / "b")
    assert [f.read_bytes() for f in first] == [f.read_bytes() for f in second]
    # a lost state is measured again (with the state before surgery, for its patterns), to the same bytes
    lost = copy_store / "points" / "p1-step000002.csv"
    before_bytes = lost.read_bytes()
    lost.unlink()
    measure_run(model, run_dir, probes, copy_store, progress=False)
    assert len(calls) == 2 and lost.read_bytes() == before_bytes
    # a store written before tv_reinit existed gets only that column, to the same bytes, measuring nothing
    stored = sorted((copy_store / "points").glob("*.csv"))
    whole = {f: f.read_bytes() for f in stored}
    for f in stored:
        pd.read_csv(f).drop(columns=["tv_reinit"]).to_csv(f, index=False)
    assert "tv_reinit" not in drift_tables(copy_store, run_dir)["heads"].dropna(axis=1, how="all").columns
    measure_run(model, run_dir, probes, copy_store, progress=False)
    assert len(calls) == 2 and {f: f.read_bytes() for f in stored} == whole
    # other probes do not mix into a store
    other = drift.ProbeSet(probes.probes, probes.prompts, probes.prompt_ids, probes.max_new_tokens + 1,
                           probes.probe_data, probes.probe_len)
    with pytest.raises(LensHeadsError, match="other probes"):
        measure_run(model, run_dir, other, copy_store, progress=False)


def test_another_model_is_refused(drift_run, tiny_model):
    _model, run_dir, _store, probes = drift_run
    with pytest.raises(LensHeadsError, match="another model"):
        measure_run(tiny_model("qwen2"), run_dir, probes, run_dir / "elsewhere", progress=False)


def test_state_points_round_trip_through_their_one_parser(drift_run):
    _model, run_dir, _store, _probes = drift_run
    points = [p for p, _ in drift.run_points(run_dir, RepairReport.load(run_dir))]
    points.append(StatePoint.final(2, 40))
    for p in points:
        assert StatePoint.parse(str(p), final_step=p.step) == p
    assert sorted(points) == points  # replay order
    for bad in ("p0-reinit", "p1-step12", "after", "p1-best"):
        with pytest.raises(LensHeadsError, match="bad state point"):
            StatePoint.parse(bad)


def test_healthy_pick_parses_prints_and_picks():
    for spec, want in (("index:3", "index:3"), (" fraction : 0.25 @ 7", "fraction:0.25@7"),
                       ("fraction:1", "fraction:1@0")):
        pick = HealthyPick.parse(spec)
        assert str(pick) == want and HealthyPick.parse(str(pick)) == pick
    for bad, msg in (("index:1.5", "whole number"), ("fraction:0", r"\(0, 1\]"), ("fraction:1.5", r"\(0, 1\]"),
                     ("index:2@1", "takes no seed"), ("heads:3", "bad --reinit-healthy")):
        with pytest.raises(LensHeadsError, match=msg):
            HealthyPick.parse(bad)
    gen = torch.Generator().manual_seed(3)
    bos = torch.rand(6, 5, generator=gen)  # about half the heads are BOS sinks (bos_mass > 0.5)
    diag = Diagnosis(bos, torch.full((6, 5), 2.0), torch.zeros(6, 5), None, DiagnosisThresholds(), 1)
    healthy = [(L, h) for L in range(6) for h in range(5) if float(bos[L, h]) <= 0.5]
    assert HealthyPick.parse("index:2").resolve(diag) == [(L, h) for L, h in healthy if h == 2]
    assert HealthyPick.parse("index:2").resolve(diag, exclude=[(0, 2), (1, 2)]) == \
        [(L, h) for L, h in healthy if h == 2 and L > 1]
    picked = HealthyPick.parse("fraction:0.3@1").resolve(diag)
    assert len(picked) == math.ceil(0.3 * len(healthy)) and set(picked) <= set(healthy) and picked == sorted(picked)
    assert picked == HealthyPick.parse("fraction:0.3@1").resolve(diag)
    assert picked != HealthyPick.parse("fraction:0.3@2").resolve(diag)
    assert HealthyPick.parse("fraction:1").resolve(diag) == healthy


# --- the command --------------------------------------------------------------------------

def test_cli_drift(drift_run, tiny_model_dir, tmp_path, capsys, monkeypatch):
    import lens_heads.models as models

    _model, run_dir, _store, _probes = drift_run
    src = str(tiny_model_dir("llama"))
    probes = tmp_path / "probes.txt"
    probes.write_text("\n".join(DRIFT_PROBES) + "\n")
    out = tmp_path / "drift"
    rc = main(["drift", str(run_dir), "--model", src, "--data", str(probes), "--n-probes", "2", "--probe-len", "16",
               "--max-new-tokens", "2", "--out", str(out), "--quiet"])
    assert rc == 0, capsys.readouterr().err
    printed = capsys.readouterr().out
    curves = pd.read_csv(out / "curves.csv")
    last = curves.iloc[-1]
    assert (f"{last['moved_frozen']} of {last['n_frozen']} frozen heads moved ({last['moved_frozen_since_reinit']} "
            "since re-initialisation)") in printed
    assert list(curves["point"]) == ["before", "p1-reinit", "p1-step000001", "p1-step000002", "p1-step000003"]
    page = (out / "report.html").read_text()
    assert "Generation probes" in page and "Signed BOS-mass change maps" in page and "sample texts x 8" in page
    assert json.loads((out / "probe.json").read_text())["n_probes"] == 2

    # bad input: one message, exit 2, before any model loads
    monkeypatch.setattr(models, "load_model", lambda *a, **k: pytest.fail("a model was loaded"))
    no_report = tmp_path / "empty"
    no_report.mkdir()
    a_file = tmp_path / "file"
    a_file.write_text("x")
    train = tmp_path / "train.txt"
    train.write_text("text\n")
    (tmp_path / "no_ckpt").mkdir()
    report = RepairReport.load(run_dir)
    import dataclasses

    dataclasses.replace(report, train_data=str(train)).save(tmp_path / "no_ckpt")
    trained_on_probes = tmp_path / "trained_on_probes"
    shutil.copytree(run_dir, trained_on_probes, ignore=shutil.ignore_patterns("drift"))
    dataclasses.replace(report, train_data=str(probes)).save(trained_on_probes)
    cases = [([str(tmp_path / "missing")], "no such folder"),
             ([str(no_report)], "cannot read the repair report"),
             ([str(tmp_path / "no_ckpt")], "holds no checkpoint"),
             ([str(trained_on_probes), "--data", str(probes)], "training corpus"),
             ([str(run_dir), "--n-probes", "0"], "--n-probes must be >= 1"),
             ([str(run_dir), "--probe-len", "1"], "--probe-len must be >= 2"),
             ([str(run_dir), "--out", str(a_file)], "not a folder"),
             ([str(run_dir), "--prompts", str(tmp_path / "nope.txt")], "cannot read"),
             ([str(run_dir), "--data", str(tmp_path / "nope.txt")], "nope.txt")]
    for extra, msg in cases:
        rc = main(["drift", *extra, "--model", src, "--quiet"])
        errors = [line for line in capsys.readouterr().err.splitlines() if ": error: " in line]
        assert rc == 2 and len(errors) == 1 and msg in errors[0], (extra, errors)


def test_a_two_pass_run_replays_to_its_export(tiny_model, tmp_path):
    """Pass 2 starts from pass 1's final weights (its best when early stopping restored them) and
    re-initialises its own targets: the replay's last state is the exported model, bit for bit,
    and the global steps run on across passes."""
    from lens_heads.surgery import RepairConfig, TargetSelector, TrainConfig, repair

    model = tiny_model("llama")
    config = RepairConfig(passes=2, chunk_len=16, eval_len=32,
                          train=TrainConfig(epochs=3, grad_accum=4, lr=5e-2, keep_checkpoints=True))
    # the heads of lowest output norm; re-initialised (W_O zeroed) and briefly trained, they stay low
    report = repair(model, TargetSelector(select="fhon_ln<1"), SAMPLE_TEXTS * 3, SAMPLE_TEXTS[:2],
                    model.to_tokens(SAMPLE_TEXTS), tmp_path / "run", config, progress=False)
    assert [p.trained for p in report.passes] == [True, True], report.passes
    points = []
    for point, hf in replay(model, tmp_path / "run", report):
        points.append(point)
        last = {n: p.detach().clone() for n, p in hf.named_parameters()}
    exported = dict(AutoModelForCausalLM.from_pretrained(tmp_path / "run").named_parameters())
    assert all(torch.equal(last[n], exported[n].detach()) for n in exported)
    assert [p.pass_index for p in points if p.kind == "reinit"] == [1, 2]
    per_epoch = report.passes[0].steps // report.passes[0].epochs
    assert [p.step for p in points if p.pass_index == 1 and p.kind == "step"] == \
        [per_epoch * (e + 1) for e in range(report.passes[0].epochs)]
    assert drift.global_steps(report) == {1: 0, 2: report.passes[0].steps}
    for k in (1, 2):  # a final state exactly when training restored the best weights
        restored = drift.best_restored(report.passes[k - 1], report.config)
        assert any(p.pass_index == k and p.kind == "final" for p in points) == restored


def test_restored_best_weights_are_a_state_of_their_own(tiny_model, tmp_path):
    """Training on one repeated word worsens held-out perplexity after the second epoch, so early
    stopping's keep_best restores epoch 2's weights: the replay adds a p1-final state after the
    last checkpoint, and that state (not the last checkpoint) is the exported model."""
    from lens_heads.surgery import RepairConfig, TargetSelector, TrainConfig, repair

    model = tiny_model("llama")
    config = RepairConfig(passes=1, chunk_len=16, eval_len=32,
                          train=TrainConfig(epochs=3, grad_accum=4, lr=0.05, warmup=0, keep_checkpoints=True))
    report = repair(model, TargetSelector(heads=((0, 1), (1, 2))), ["Paris Paris Paris Paris Paris Paris"] * 12,
                    SAMPLE_TEXTS[:2], model.to_tokens(SAMPLE_TEXTS), tmp_path / "run", config, progress=False)
    ppl = [h["ppl"] for h in report.passes[0].history[1:]]
    assert ppl[-1] > min(ppl) and drift.best_restored(report.passes[0], report.config), ppl
    states = []
    for point, hf in replay(model, tmp_path / "run", report):
        states.append((str(point), {n: p.detach().clone() for n, p in hf.named_parameters()}))
    last_step = f"p1-step{report.passes[0].steps:06d}"
    assert [name for name, _ in states][-2:] == [last_step, "p1-final"]
    exported = dict(AutoModelForCausalLM.from_pretrained(tmp_path / "run").named_parameters())
    assert all(torch.equal(states[-1][1][n], exported[n].detach()) for n in exported)
    assert not all(torch.equal(states[-2][1][n], exported[n].detach()) for n in exported)
