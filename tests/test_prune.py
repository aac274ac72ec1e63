"""Physical head pruning (``lens_heads.surgery.prune``): for every prunable architecture and random head
sets (a whole KV group, none of one, several layers), the pruned model's logits equal the original
model's under static zero-ablation of the same heads; the exported folder reloads, in lens_heads
and in transformers alone, with identical logits; scores, ablation and evaluation run on it."""

from __future__ import annotations

import random

import pytest
import torch

from lens_heads import LensHeadsError
from lens_heads.interventions.ablation import parse_ablation
from lens_heads.models.hooks import run_with_hooks

PRUNABLE = ["llama", "qwen2", "olmo2", "gemma3", "gpt2", "bloom"]  # the whole architecture table
TEXTS = ["The capital of France is Paris. The capital of Italy is Rome.", "Attention heads that do nothing",
         "A B C D Answer: the following"]


def _ids(model):
    from lens_heads.data import pad_batch

    seqs = model.to_tokens(TEXTS)
    return pad_batch(seqs, model.tokenizer.pad_token_id, side="right")


def _zeroed_logits(model, heads):
    ids, mask = _ids(model)
    ab = parse_ablation("static:" + ",".join(f"{L}.{h}" for L, h in heads), model.geometry)
    return run_with_hooks(model, ids, mask, ab.hooks(model, mask, list(range(len(TEXTS))))), mask.bool()


def head_sets(g, seed: int):
    """A whole KV group of layer 0, one head of layer 1 (no whole group), and random extras."""
    rng = random.Random(seed)
    group = g.group_size
    sets = [[(0, h) for h in range(group)],  # every query head of KV head 0
            [(1, group - 1)] if g.n_heads > 1 else [(1, 0)]]
    extra = rng.sample([(L, h) for L in range(g.n_layers) for h in range(g.n_heads)], k=g.n_heads // 2)
    sets.append(sorted(set(sets[0] + extra)))
    return [s for s in sets if len({h for L, h in s if L == 0}) < g.n_heads and
            len({h for L, h in s if L == 1}) < g.n_heads]


@pytest.mark.parametrize("arch", PRUNABLE)
def test_pruned_equals_zero_ablation_and_reloads(arch, tiny_model, tmp_path):
    from transformers import AutoModelForCausalLM

    from lens_heads import load_model
    from lens_heads.surgery.prune import prune, save_pruned

    model = tiny_model(arch)
    g = model.geometry
    plain = AutoModelForCausalLM.from_pretrained(model.source.path, attn_implementation="eager")
    assert model.parameter_count() == sum(p.numel() for p in plain.parameters())
    for i, heads in enumerate(head_sets(g, seed=hash(arch) % 1000)):
        pruned = prune(model, heads)
        ref, real = _zeroed_logits(model, heads)
        ids, mask = _ids(pruned)
        got = run_with_hooks(pruned, ids, mask, [])
        torch.testing.assert_close(got[real], ref[real], atol=1e-5, rtol=0, msg=f"{arch} {heads}")
        n_before, n_after = model.parameter_count(), pruned.parameter_count()
        assert n_after < n_before if i == 0 else n_after <= n_before  # one head of a GQA group may stay as padding
        removed_groups = [L for L in range(g.n_layers)
                          if any(all((L, h) in heads for h in range(k * g.group_size, (k + 1) * g.group_size))
                                 for k in range(g.n_kv_heads))]
        for L in removed_groups:  # a whole group removed: its KV head is gone
            assert pruned.geometry.kv_in(L) < g.n_kv_heads
        out = save_pruned(pruned, tmp_path / f"{arch}-{i}")
        again = load_model(str(out))
        assert again.geometry.heads_per_layer == pruned.geometry.heads_per_layer
        torch.testing.assert_close(run_with_hooks(again, ids, mask, [])[real], got[real], atol=1e-6, rtol=0)
        hf = AutoModelForCausalLM.from_pretrained(out, trust_remote_code=True, attn_implementation="eager").eval()
        assert n_after == sum(p.numel() for p in hf.parameters())  # the bridge's split q/k/v are not counted
        with torch.no_grad():
            plain = hf(ids, attention_mask=mask).logits
        torch.testing.assert_close(plain[real], got[real], atol=1e-5, rtol=0)


def test_gqa_padding_keeps_groups_uniform(tiny_model):
    """Llama's 4 query heads over 2 KV heads: removing one head of group 0 keeps the group as wide as
    group 1 with a zero-output padding head, and nothing else changes."""
    from lens_heads.surgery.prune import plan_prune

    model = tiny_model("llama")
    plan = plan_prune(model.geometry, [(0, 1)])
    assert plan[0].keep_q == (0, 1, 2, 3) and plan[0].pad_q == (1,) and plan[0].keep_kv == (0, 1)
    plan = plan_prune(model.geometry, [(0, 0), (0, 1), (0, 3)])  # one group left: no padding needed
    assert plan[0].keep_q == (2,) and plan[0].pad_q == () and plan[0].keep_kv == (1,)
    assert plan[1].keep_q == (0, 1, 2, 3) and not plan[1].pad_q


@pytest.mark.parametrize("arch", ["llama", "gpt2", "bloom"])
def test_scores_evaluation_and_ablation_run_on_a_pruned_model(arch, tiny_model, tmp_path):
    import json

    from test_sweep import TASK_ROWS

    from lens_heads.data import load_task
    from lens_heads.surgery.diagnose import diagnose
    from lens_heads.evaluation.evaluate import evaluate_task
    from lens_heads.surgery.prune import prune
    from lens_heads.scores import score_heads

    model = tiny_model(arch)
    pruned = prune(model, [(0, 0), (0, 1)])  # layer 0 keeps heads 2, 3 as its heads 0, 1 (BLOOM: with their slopes)
    full, small = score_heads(model, TEXTS, "all", progress=False), score_heads(pruned, TEXTS, "all", progress=False)
    for sid in ("ahon", "awft", "avvn"):  # layer 1 unchanged upstream? no: layer 0's output changed; shapes
        assert small.mean[sid].shape == full.mean[sid].shape
        assert torch.isnan(small.mean[sid][0, 2:]).all() and not torch.isnan(small.mean[sid][0, :2]).any()
    zeroed = score_heads(model, TEXTS, ["ahon"], progress=False)  # layer 0's kept heads read the same inputs
    torch.testing.assert_close(small.mean["ahon"][0, :2], zeroed.mean["ahon"][0, 2:], atol=1e-5, rtol=1e-5)
    rows = tmp_path / "mini.jsonl"
    rows.write_text("".join(json.dumps({"question": q, "choices": c, "answer": a}) + "\n" for q, c, a in TASK_ROWS))
    task = load_task(f"file:{rows}")
    a = evaluate_task(model, task, ablation=parse_ablation("static:0.0,0.1", model.geometry), progress=False)
    b = evaluate_task(pruned, task, progress=False)
    assert [q.pred for q in a.questions] == [q.pred for q in b.questions]
    rnd = evaluate_task(pruned, task, ablation=parse_ablation("random:0.5@0", pruned.geometry), progress=False)
    assert 0.2 < rnd.zeroed_fraction < 0.8
    whole = evaluate_task(model, task, ablation=parse_ablation("random:0.5@0", model.geometry), progress=False)
    rows_seen = whole.config["zeroed_units"][1] / model.geometry.n_units  # every present head counted once a row
    assert rnd.config["zeroed_units"][1] == rows_seen * pruned.geometry.n_units < whole.config["zeroed_units"][1]
    with pytest.raises(LensHeadsError, match="layer 0 has 2"):
        parse_ablation("static:0.3", pruned.geometry)
    d = diagnose(pruned, pruned.to_tokens(TEXTS))
    assert d.classes[0][2:] == ["absent", "absent"] and "absent" not in d.classes[1]  # no heads there
    assert sum(d.counts().values()) == pruned.geometry.n_units == len(d.to_frame())
    assert f"{pruned.geometry.n_units} heads" in d.summary()


@pytest.mark.parametrize("arch, heads, message", [
    ("llama", [(0, 9)], "out of range"),
    ("llama", [], "head set is empty"),
    ("llama", [(0, h) for h in range(4)], "every head of layer 0"),
    ("gpt2", [(0, 4)], "out of range"),
    ("bloom", [(1, h) for h in range(4)], "every head of layer 1"),
    ("phi3", [(0, 1)], "add an ArchSpec entry"),
])
def test_bad_prunes(arch, heads, message, tiny_model):
    from lens_heads.surgery.prune import prune

    with pytest.raises(LensHeadsError, match=message):
        prune(tiny_model(arch), heads)


def test_an_emptied_layer_with_the_flag_keeps_one_zero_head(tiny_model):
    from lens_heads.surgery.prune import prune

    model = tiny_model("llama")
    heads = [(0, h) for h in range(4)]
    pruned = prune(model, heads, allow_empty_layers=True)
    assert pruned.geometry.heads_per_layer[0] == 1
    ref, real = _zeroed_logits(model, heads)
    ids, mask = _ids(pruned)
    torch.testing.assert_close(run_with_hooks(pruned, ids, mask, [])[real], ref[real], atol=1e-5, rtol=0)


def test_cli_prune_select_eval_and_reload(tiny_model_dir, tiny_model, tmp_path, capsys):
    import json

    from lens_heads import load_model
    from lens_heads.cli import main

    data = tmp_path / "texts.jsonl"
    data.write_text("".join(json.dumps({"text": t}) + "\n" for t in TEXTS))
    rows = tmp_path / "mini.jsonl"
    from test_sweep import TASK_ROWS

    rows.write_text("".join(json.dumps({"question": q, "choices": c, "answer": a}) + "\n" for q, c, a in TASK_ROWS))
    out = tmp_path / "pruned"
    assert main(["prune", str(tiny_model_dir("llama")), "--select", "ahon_ln@25%", "--data", str(data),
                 "--out", str(out), "--eval", f"file:{rows}", "--n-boot", "200"]) == 0
    printed = capsys.readouterr().out
    report = json.loads((out / "prune_report.json").read_text())
    assert report["n_removed"] == 2 and report["heads_before"] == 8 and "change" in printed
    from lens_heads.scores import score_heads

    model = tiny_model("llama")
    hs = score_heads(model, model.to_tokens(TEXTS), ["ahon_ln"], progress=False)
    assert report["removed"] == [f"{L}.{h}" for L, h in sorted(hs.least_active("ahon_ln", 2))]
    again = load_model(str(out))
    assert sum(again.geometry.heads_per_layer) >= 6 and report["parameters_after"] <= report["parameters_before"]
    assert report["eval"]["n_questions"] == len(TASK_ROWS)
    # the HTML report's pruning section reads the same file
    from types import SimpleNamespace

    from lens_heads.surgery.prune import read_prune_report
    from lens_heads.viz.report import pruning_section

    sec = pruning_section(SimpleNamespace(pruning=read_prune_report(out)))
    assert sec.anchor == "pruning" and "2 of 8 (25.0 %), by ahon_ln@25%" in sec.body
    assert f"{report['parameters_before']:,}" in sec.body and "paired bootstrap" in sec.body
    for r in report["removed"]:
        assert r in sec.body
    with pytest.raises(LensHeadsError, match="holds no prune_report.json"):
        read_prune_report(tmp_path)


@pytest.mark.parametrize("extra, message", [
    (["--heads", "0.9"], "out of range"),
    (["--heads", "0.0,0.1,0.2,0.3"], "every head of layer 0"),
    (["--select", "ahon_ln@130%"], "0 < P < 100"),
    (["--select", "nope@10%"], "unknown score"),
    (["--heads", "0.1", "--eval", "nope"], "Unknown task"),
    (["--heads", "0.1", "--out", "FILE"], "not a folder"),
])
def test_cli_prune_bad_input(extra, message, tiny_model_dir, tmp_path, capsys):
    from lens_heads.cli import main

    (tmp_path / "file").write_text("x")
    out = tmp_path / "out"
    argv = ["prune", str(tiny_model_dir("llama")), "--out", str(out), *extra]
    argv = [str(tmp_path / "file") if a == "FILE" else a for a in argv]
    code = main(argv)
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1 and message in err[0], err
    assert not out.exists()


def test_whole_group_selection_removes_kv_heads(tiny_model):
    """ID@P%:groups: whole KV groups by their heads' mean score, so the KV heads (and their cache) go."""
    from lens_heads.surgery.prune import PruneSelection, prune, whole_groups
    from lens_heads.scores import score_heads

    model = tiny_model("llama")  # 2 layers x 4 heads over 2 KV heads
    sel = PruneSelection.parse("ahon_ln@50%:groups")
    assert str(sel) == "ahon_ln@50%:groups" and sel.groups
    heads = sel.resolve(model, model.to_tokens(TEXTS))
    assert len(heads) == 4 and all(((L, h ^ 1) in heads) for L, h in heads)  # pairs: whole groups
    hs = score_heads(model, model.to_tokens(TEXTS), ["ahon_ln"], progress=False)
    m = hs.mean["ahon_ln"]
    assert heads == whole_groups(model.geometry, m, "ahon_ln", 0.5)
    for L in range(2):  # no layer loses its last group, so each loses its less active one (AHON: low = inactive)
        k = min(range(2), key=lambda k: float(m[L, 2 * k:2 * k + 2].mean()))
        assert [h for L2, h in heads if L2 == L] == [2 * k, 2 * k + 1]
    pruned = prune(model, heads)
    assert pruned.geometry.kv_per_layer == (1, 1) and pruned.geometry.heads_per_layer == (2, 2)
    assert whole_groups(model.geometry, m, "ahon_ln", 1.0) == heads  # even asked for all: one group stays
    with pytest.raises(LensHeadsError, match="whole groups go with ID@P%"):
        PruneSelection.parse("ahon_ln<0.5:groups")


def test_cli_prune_refuses_an_unprunable_model_before_scoring_and_reports_padding(tiny_model_dir, tmp_path,
                                                                                  capsys, monkeypatch):
    import json

    import lens_heads.scores as scores
    from lens_heads.cli import main

    data = tmp_path / "texts.jsonl"
    data.write_text("".join(json.dumps({"text": t}) + "\n" for t in TEXTS))
    real = scores.score_heads
    monkeypatch.setattr(scores, "score_heads", lambda *a, **k: pytest.fail("scored before refusing"))
    assert main(["prune", str(tiny_model_dir("phi3")), "--select", "ahon_ln<0.99", "--data", str(data),
                 "--out", str(tmp_path / "g")]) == 2
    assert "add an ArchSpec entry" in capsys.readouterr().err and not (tmp_path / "g").exists()
    monkeypatch.setattr(scores, "score_heads", real)
    out = tmp_path / "p"
    assert main(["prune", str(tiny_model_dir("llama")), "--heads", "0.1,0.1,1.2", "--out", str(out)]) == 0
    printed = capsys.readouterr().out
    report = json.loads((out / "prune_report.json").read_text())
    assert report["removed"] == ["0.1", "1.2"] and report["padding_heads"] == 2 and "zero-output padding" in printed
    assert main(["info", str(out), "--data", str(data), "--n-inputs", "2", "--max-len", "16"]) == 0
    info = capsys.readouterr().out
    assert "pruned: [4, 4] per layer" in info and "nan" not in info.split("tokens:")[1]


def test_a_pruned_bloom_keeps_its_heads_alibi_slopes(tiny_model, tmp_path, capsys):
    """BLOOM's kept heads are renumbered per layer; each keeps the slope it had (geometry, info)."""
    import json

    from lens_heads.cli import main
    from lens_heads.models.geometry import alibi_slopes
    from lens_heads.surgery.prune import prune, save_pruned

    pruned = prune(tiny_model("bloom"), [(0, 1), (1, 0), (1, 3)])
    full = alibi_slopes(4)
    torch.testing.assert_close(pruned.geometry.alibi_slopes(0), full[[0, 2, 3]])
    torch.testing.assert_close(pruned.geometry.alibi_slopes(1), full[[1, 2]])
    assert pruned.geometry.alibi_slopes() is None  # one slope per head index does not exist any more
    out = save_pruned(pruned, tmp_path / "b")
    data = tmp_path / "texts.jsonl"
    data.write_text("".join(json.dumps({"text": t}) + "\n" for t in TEXTS))
    assert main(["info", str(out), "--data", str(data), "--n-inputs", "2", "--max-len", "16"]) == 0
    printed = capsys.readouterr().out
    assert "ALiBi slopes (layer 1) " + " ".join(f"{s:.4g}" for s in full[[1, 2]].tolist()) in printed
    assert main(["diagnose", str(out), "--data", str(data), "--n-inputs", "2", "--out", str(tmp_path / "d.csv")]) == 0


def test_bloom_with_tensor_parallel_emulation_is_refused(tiny_model, monkeypatch):
    from lens_heads.surgery.prune import prune

    model = tiny_model("bloom")
    monkeypatch.setattr(model.hf_model.config, "slow_but_exact", True)
    monkeypatch.setattr(model.hf_model.config, "pretraining_tp", 2)
    with pytest.raises(LensHeadsError, match="slow_but_exact"):
        prune(model, [(0, 1)])


def test_olmo2_runs_in_bf16_as_transformers_does(tiny_model_dir, tmp_path):
    """OLMo-2's float32 rotary tables would turn the bridge's q and k float32 in bf16; lens_heads
    keeps them in the model's dtype, as transformers' OLMo-2 does: the logits match it exactly,
    pruned or not."""
    from transformers import AutoModelForCausalLM

    from lens_heads import load_model
    from lens_heads.surgery.prune import prune, save_pruned

    model = load_model(str(tiny_model_dir("olmo2")), dtype="bfloat16", attention="eager")  # bitwise: TransformerLens' attention
    out = save_pruned(prune(model, [(0, 0), (0, 1), (1, 3)]), tmp_path / "p")
    for folder, kw in ((tiny_model_dir("olmo2"), {}), (out, {"trust_remote_code": True})):
        m = load_model(str(folder), dtype="bfloat16", attention="eager")
        ids, mask = _ids(m)
        got = run_with_hooks(m, ids, mask, [])
        hf = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.bfloat16, attn_implementation="eager", **kw).eval()
        with torch.no_grad():
            ref = hf(ids, attention_mask=mask).logits
        real = mask.bool()
        assert got.dtype == torch.bfloat16 and torch.equal(got[real], ref[real])


def test_booting_a_pruned_joint_qkv_model_restores_the_bridge_class_also_on_error():
    """hooks.booting_pruned replaces TransformerLens' JointQKVAttentionBridge.set_original_component
    for the block only: the class method is the original again afterwards, and after an error."""
    from transformer_lens.model_bridge.generalized_components.joint_qkv_attention import JointQKVAttentionBridge

    from lens_heads.models.hooks import booting_pruned

    original = JointQKVAttentionBridge.set_original_component
    plan = {"layout": "blocked", "d_head": 16, "q": "c_attn"}
    with booting_pruned(plan, conv1d=True):
        assert JointQKVAttentionBridge.set_original_component is not original  # the patch is in place
    assert JointQKVAttentionBridge.set_original_component is original
    with pytest.raises(RuntimeError, match="boot failed"):
        with booting_pruned(plan, conv1d=True):
            raise RuntimeError("boot failed")
    assert JointQKVAttentionBridge.set_original_component is original
    with booting_pruned({"layout": "separate"}, conv1d=False):  # separate projections: nothing replaced
        assert JointQKVAttentionBridge.set_original_component is original
