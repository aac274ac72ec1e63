"""Surgery on tiny BLOOM (fused interleaved QKV, ALiBi) and tiny grouped-query Llama:
re-init == zero-ablation, masks keep every other value bit-identical, resume == uninterrupted,
export reloads exactly, and bad input fails cleanly."""

from __future__ import annotations

import hashlib
import math

import pytest
import torch
from transformers import AutoModelForCausalLM

from lens_heads import LensHeadsError, load_model
from lens_heads.cli import main
from lens_heads.models.hooks import hook_name, run_with_hooks
from lens_heads.surgery import (RepairConfig, RepairReport, TargetSelector, TrainConfig, parse_heads, parse_select,
                                plan_surgery, reinitialise, train_surgery)
from lens_heads.surgery.repair import prepare_data

TEXT = "The capital of France is Paris. The capital of Italy is Rome. Attention heads that do nothing."
TARGETS = {"bloom": [(0, 1), (1, 2), (1, 3)], "llama": [(0, 0), (0, 1), (1, 3)]}


def _ids(model):
    return model.to_tokens(TEXT)[0][None]


def _zero_ablated_logits(model, targets):
    hooks = []
    for L in range(model.geometry.n_layers):
        heads = [h for (l, h) in targets if l == L]
        if heads:
            def zero(z, hook, heads=heads):
                z = z.clone()
                z[:, :, heads] = 0
                return z
            hooks.append((hook_name("z", L), zero))
    return run_with_hooks(model, _ids(model), None, hooks)


def _chunks(n=12, T=12, seed=0):
    g = torch.Generator().manual_seed(seed)
    return [torch.randint(4, 300, (T,), generator=g) for _ in range(n)]


@pytest.mark.parametrize("arch,policy", [("bloom", "q_only"), ("llama", "q_only"), ("llama", "group")])
@pytest.mark.parametrize("init", ["xavier_uniform", "xavier_normal"])
def test_reinit_equals_zero_ablation(arch, policy, init, tiny_model):
    model = tiny_model(arch)
    g = model.geometry
    targets = TARGETS[arch]
    expected = _zero_ablated_logits(model, targets)
    hf = model.load_hf_model()
    before = {n: p.detach().clone() for n, p in hf.named_parameters()}
    plan = plan_surgery(g, targets, policy)
    reinitialise(hf, plan, init, seed=3)
    with torch.no_grad():
        got = hf(_ids(model)).logits
    assert (got - expected).abs().max().item() < 1e-5
    after = dict(hf.named_parameters())
    bound = math.sqrt(6 / (g.d_model + g.d_head))
    for e in plan.edits:
        new = after[e.slice.name].index_select(e.slice.dim, e.slice.index)
        if e.action == "zero":
            assert (new == 0).all()
        else:  # Xavier with fan_in = d_model, fan_out = d_head
            assert not torch.equal(new, before[e.slice.name].index_select(e.slice.dim, e.slice.index))
            if init == "xavier_uniform":
                assert new.abs().max() <= bound and new.abs().max() > 0.8 * bound
            else:
                assert new.std().item() == pytest.approx(math.sqrt(2 / (g.d_model + g.d_head)), rel=0.25)
    for name, p in after.items():  # nothing outside the plan moved
        m = plan.mask(name, p) if name in plan.trainable_names else torch.zeros_like(p)
        assert torch.equal(p[m == 0], before[name][m == 0]), name


def test_gqa_policies_choose_kv_explicitly(tiny_model):
    g = tiny_model("llama").geometry  # 4 query heads, 2 KV heads: groups {0,1}, {2,3}
    names = lambda plan: " ".join(e.what for e in plan.edits if e.action == "reinit")
    q_only = plan_surgery(g, [(0, 0), (0, 1)], "q_only")
    assert not any(".k_proj" in n or ".v_proj" in n for n in q_only.trainable_names)
    group = plan_surgery(g, [(0, 0), (0, 1), (0, 2)], "group")  # group {0,1} complete, {2,3} not
    assert "0.kv0 k weight" in names(group) and "0.kv0 v weight" in names(group) and "kv1" not in names(group)
    assert "model.layers.0.self_attn.k_proj.weight" in group.trainable_names
    kmask = group.mask("model.layers.0.self_attn.k_proj.weight", torch.zeros(g.n_kv_heads * g.d_head, g.d_model))
    assert kmask[: g.d_head].eq(1).all() and kmask[g.d_head:].eq(0).all()
    with pytest.raises(LensHeadsError, match="GQA policy"):
        plan_surgery(g, [(0, 0)], "everything")


@pytest.mark.parametrize("arch,dtype,ckpt", [("bloom", "float32", False), ("llama", "float32", True),
                                             ("llama", "bfloat16", False)])
def test_training_changes_only_target_slices(arch, dtype, ckpt, tiny_model, tiny_model_dir):
    model = tiny_model(arch) if dtype == "float32" else load_model(str(tiny_model_dir(arch)), dtype=dtype)
    hf = model.load_hf_model()
    plan = plan_surgery(model.geometry, TARGETS[arch], "q_only")
    reinitialise(hf, plan, seed=0)
    before = {n: p.detach().clone() for n, p in hf.named_parameters()}
    cfg = TrainConfig(max_steps=3, grad_accum=2, micro_batch=2, lr=1e-3, gradient_checkpointing=ckpt)
    res = train_surgery(hf, plan, _chunks(), _chunks(3, seed=1), cfg)
    assert res.steps == 3 and len(res.history) == 2 and math.isfinite(res.history[-1]["ppl"])
    after = dict(hf.named_parameters())
    for name, p in after.items():
        if name not in plan.trainable_names:
            assert torch.equal(p, before[name]), name
            continue
        m = plan.mask(name, p) == 1
        assert torch.equal(p[~m], before[name][~m]), f"untouched slice of {name} moved"
    for e in plan.edits:  # every target slice (weights and biases) was trained
        moved = after[e.slice.name].index_select(e.slice.dim, e.slice.index) \
            != before[e.slice.name].index_select(e.slice.dim, e.slice.index)
        assert moved.any(), e.what
    assert not any(p.requires_grad for p in hf.parameters())


def test_one_perplexity_for_hf_and_bridge(tiny_model):
    """surgery.train.perplexity (plain HF) and evaluate.perplexity (bridge) are one computation:
    each equals an unbatched float64 loop; the HF one skips 1-token documents, the bridge one refuses them."""
    from lens_heads.evaluation.evaluate import perplexity as bridge_perplexity
    from lens_heads.forward.engine import token_nll
    from lens_heads.surgery.train import perplexity as hf_perplexity

    model = tiny_model("llama")
    hf = model.load_hf_model()
    docs = [torch.tensor(model.tokenizer(t)["input_ids"]) for t in
            [TEXT, "Dormant heads attend to the first token.", "A B C D", "Question: why? Answer: sinks."]]
    nll, n = 0.0, 0
    with torch.no_grad():
        for x in docs:
            logp = torch.log_softmax(hf(input_ids=x[None]).logits[0, :-1].double(), -1)
            nll -= float(logp.gather(1, x[1:, None]).sum())
            n += len(x) - 1
    naive = math.exp(nll / n)
    pad = model.tokenizer.pad_token_id
    for bs in (1, 3):
        assert hf_perplexity(hf, docs + [docs[0][:1]], bs, pad) == pytest.approx(naive, rel=1e-6)
        assert bridge_perplexity(model, docs, batch_size=bs) == pytest.approx(naive, rel=1e-6)
    with pytest.raises(LensHeadsError, match="at least 2 tokens"):
        bridge_perplexity(model, docs + [docs[0][:1]])
    with pytest.raises(LensHeadsError, match="fewer than 2 tokens"):
        hf_perplexity(hf, [docs[0][:1]])
    # the shared core: uniform logits over V tokens score log V per token, padding excluded
    seen, vocab = [], len(model.tokenizer)
    total, count = token_nll(lambda ids, mask, rows: torch.zeros(*ids.shape, vocab), docs, 2, pad, seen.append)
    assert count == n and seen == [2, 2] and total == pytest.approx(n * math.log(vocab), rel=1e-6)


def test_resume_equals_uninterrupted(tiny_model, tmp_path):
    model = tiny_model("bloom")
    plan = plan_surgery(model.geometry, TARGETS["bloom"], "q_only")
    cfg = TrainConfig(max_steps=5, grad_accum=2, lr=1e-3, checkpoint_every=1, epochs=1)
    chunks, held = _chunks(6), _chunks(2, seed=1)  # 3 steps per epoch -> 2 epochs, an eval in between

    def fresh():
        hf = model.load_hf_model()
        reinitialise(hf, plan, seed=0)
        return hf

    ref = fresh()
    ref_res = train_surgery(ref, plan, chunks, held, cfg, tmp_path / "a")

    class Stop(Exception):
        pass

    def stop_at_2(step, loss):
        if step == 2:
            raise Stop

    hf = fresh()
    with pytest.raises(Stop):
        train_surgery(hf, plan, chunks, held, cfg, tmp_path / "b", on_step=stop_at_2)
    assert (tmp_path / "b" / "LATEST").read_text() == "step-000002"
    hf = fresh()
    res = train_surgery(hf, plan, chunks, held, cfg, tmp_path / "b")
    assert res.steps == 5
    ref_params = dict(ref.named_parameters())
    for name, p in hf.named_parameters():
        assert torch.equal(p, ref_params[name]), name
    assert [h["ppl"] for h in res.history] == [h["ppl"] for h in ref_res.history]
    # a checkpoint from another plan is refused
    other = plan_surgery(model.geometry, [(0, 0)], "q_only")
    with pytest.raises(LensHeadsError, match="another run"):
        train_surgery(fresh(), other, chunks, held, cfg, tmp_path / "b")


def _digest(folder):
    h = hashlib.sha256()
    for f in sorted(folder.rglob("*")):
        if f.is_file():
            h.update(f.name.encode() + f.read_bytes())
    return h.hexdigest()


def test_cli_repair_two_passes_exports_reloadable_model(tiny_model_dir, tmp_path, capsys):
    src = tiny_model_dir("bloom")
    digest = _digest(src)
    data = tmp_path / "train.txt"
    data.write_text("\n".join([TEXT, "Dormant heads attend to the first token.", "Question: why? Answer: sinks."] * 30))
    out = tmp_path / "repaired"
    # tiny random BLOOM has "local" heads (the steepest ALiBi slope): repair that class over 2 passes
    rc = main(["repair", str(src), "--classes", "local", "--data", str(data), "--n-eval", "4", "--eval-len", "32",
               "--diag-n", "4", "--diag-len", "32", "--chunk-len", "32", "--steps", "2", "--grad-accum", "2",
               "--lr", "1e-3", "--passes", "2", "--out", str(out), "--quiet"])
    assert rc == 0, capsys.readouterr().err
    report = RepairReport.load(out / "report.json")
    assert report.passes[0].targets and report.passes[0].steps == 2
    assert len(report.passes) == 2 and report.passes[0].healthy_after is not None
    assert report.healthy_before + report.classes_before["local"] <= 8
    assert report.to_json() == (out / "report.json").read_text()
    assert _digest(src) == digest  # original model files untouched

    hf = AutoModelForCausalLM.from_pretrained(out, attn_implementation="eager").eval()
    loaded = load_model(str(out))
    ids = _ids(loaded)
    with torch.no_grad():
        via_hf = hf(ids).logits
    via_bridge = run_with_hooks(loaded, ids, None, [])
    assert (via_hf - via_bridge).abs().max().item() < 1e-5
    # the export is not the original model
    orig = AutoModelForCausalLM.from_pretrained(src, attn_implementation="eager").eval()
    with torch.no_grad():
        assert not torch.allclose(orig(ids).logits, via_hf)


def test_export_reproduces_trained_weights(tiny_model, tmp_path):
    from lens_heads.surgery import export_model

    model = tiny_model("llama")
    hf = model.load_hf_model()
    plan = plan_surgery(model.geometry, TARGETS["llama"], "q_only")
    reinitialise(hf, plan, seed=0)
    train_surgery(hf, plan, _chunks(), _chunks(2, seed=1), TrainConfig(max_steps=2, lr=1e-3, grad_accum=1))
    export_model(hf, model.tokenizer, tmp_path / "m")
    back = AutoModelForCausalLM.from_pretrained(tmp_path / "m", attn_implementation="eager")
    ids = _ids(model)
    with torch.no_grad():
        assert torch.equal(hf(ids).logits, back(ids).logits)
    assert torch.equal(run_with_hooks(load_model(str(tmp_path / "m"), attention="eager"), ids, None, []), back(ids).logits)


def test_bad_input(tiny_model, tiny_model_dir, tmp_path, capsys):
    model = tiny_model("llama")
    g = model.geometry
    with pytest.raises(LensHeadsError, match="out of range"):
        parse_heads("0.1,2.0", g)
    with pytest.raises(LensHeadsError, match="LAYER.HEAD"):
        parse_heads("0-1", g)
    with pytest.raises(LensHeadsError, match="no target heads"):
        plan_surgery(g, [], "q_only")
    with pytest.raises(LensHeadsError, match="unknown head class"):
        TargetSelector(classes=("zombie",))
    with pytest.raises(LensHeadsError, match="exactly one"):
        TargetSelector(classes=("dead",), band=True)
    with pytest.raises(LensHeadsError, match="bad --select"):
        parse_select("ahon_ln~0.6")
    with pytest.raises(LensHeadsError, match="shorter than one chunk"):
        prepare_data(model.tokenizer, ["too short"], ["held out text"], RepairConfig(chunk_len=512))
    with pytest.raises(LensHeadsError, match="unknown init"):
        reinitialise(model.load_hf_model(), plan_surgery(g, [(0, 0)]), "kaiming")

    src = tiny_model_dir("llama")
    digest = _digest(src)
    data = tmp_path / "t.txt"
    data.write_text("\n".join(["a short document about heads"] * 40))
    common = ["--data", str(data), "--n-eval", "2", "--chunk-len", "16", "--steps", "1", "--quiet"]
    cases = [
        (["--heads", "7.0"], "out of range"),
        (["--classes", "zombie"], "unknown head class"),
        (["--classes", "dead"], "no heads selected"),  # the tiny model has no dead head
        (["--heads", "0.0", "--chunk-len", "100000"], "shorter than one chunk"),
    ]
    for i, (extra, msg) in enumerate(cases):
        out = tmp_path / f"out{i}"
        rc = main(["repair", str(src), *common, *extra, "--out", str(out)])
        err = capsys.readouterr().err
        assert rc == 2 and msg in err, (extra, err)
        assert not (out / "report.json").exists() and not (out / "config.json").exists()
    rc = main(["repair", str(src), *common, "--heads", "0.0", "--out", str(src)])
    assert rc == 2 and "loaded from" in capsys.readouterr().err
    assert _digest(src) == digest


def test_select_by_score(tiny_model):
    pytest.importorskip("lens_heads.scores")
    from lens_heads.scores import score_heads

    model = tiny_model("llama")
    inputs = [model.to_tokens(TEXT)[0], model.to_tokens("Attention heads")[0]]
    hs = score_heads(model, inputs, scores=["ahon_ln"], keep_per_input=True)
    values = hs.per_input["ahon_ln"].double().mean(0)
    tau = float(values.median())
    got = TargetSelector(select=f"ahon_ln<{tau}").resolve(model, inputs=inputs)
    want = [(L, h) for L in range(values.shape[0]) for h in range(values.shape[1]) if values[L, h] < tau]
    assert got == want and 0 < len(got) < values.numel()


def test_cli_extended_surgery_keeps_every_checkpoint_and_names_its_corpus(tiny_model_dir, tiny_model, tmp_path,
                                                                          capsys, monkeypatch):
    """--reinit-healthy index:0 re-initialises head 0 of every layer where the diagnosis calls it
    healthy (beside the --heads target), trains it with the same masks, and says so in report.json;
    --keep-checkpoints keeps every step's trainable tensors (the resume state only in the newest);
    report.json names the corpora. A bad rule exits 2 before the model loads."""
    from safetensors.torch import load_file

    from lens_heads.data import tokenize_texts
    from lens_heads.surgery.diagnose import diagnose

    src = tiny_model_dir("llama")
    data = tmp_path / "train.txt"
    docs = [TEXT, "Dormant heads attend to the first token.", "Question: why? Answer: sinks."] * 12
    data.write_text("\n".join(docs))
    out = tmp_path / "repaired"
    common = ["--data", str(data), "--n-eval", "3", "--eval-len", "32", "--diag-n", "3", "--diag-len", "32",
              "--chunk-len", "16", "--grad-accum", "1", "--lr", "1e-2", "--passes", "1", "--quiet"]
    rc = main(["repair", str(src), "--heads", "1.2", "--reinit-healthy", "index:0", "--keep-checkpoints",
               "--checkpoint-every", "1", "--steps", "3", *common, "--out", str(out)])
    assert rc == 0, capsys.readouterr().err
    report = RepairReport.load(out)
    model = tiny_model("llama")
    diag = diagnose(model, tokenize_texts(model.tokenizer, docs[-3:], 32))
    healthy0 = [f"{L}.0" for L in range(model.geometry.n_layers) if diag.classes[L][0] == "healthy"]
    assert healthy0 and list(report.passes[0].healthy_targets) == healthy0
    assert list(report.passes[0].targets) == sorted(set(healthy0) | {"1.2"})
    assert report.reinit_healthy == "index:0" and report.train_data == str(data)
    assert report.eval_data == f"the last 3 documents of {data}"
    assert RepairReport.load(out).to_json() == (out / "report.json").read_text()

    steps = sorted((out / "checkpoints/pass1").glob("step-*"))
    assert [p.name for p in steps] == ["step-000001", "step-000002", "step-000003"]
    assert [sorted(f.name for f in p.iterdir()) for p in steps] == [
        ["trainable.safetensors"], ["trainable.safetensors"], ["best.safetensors", "state.pt", "trainable.safetensors"]]
    # each step's tensors differ from the last (training moved), only inside the plan's slices
    orig = dict(AutoModelForCausalLM.from_pretrained(src).named_parameters())
    plan = plan_surgery(model.geometry, [tuple(map(int, t.split("."))) for t in report.passes[0].targets], "q_only")
    first, last = load_file(steps[0] / "trainable.safetensors"), load_file(steps[-1] / "trainable.safetensors")
    for name, t in last.items():
        mask = plan.mask(name, t)
        assert torch.equal(t[mask == 0], orig[name].detach()[mask == 0]), name
        assert not torch.equal(t, first[name]) or (mask == 0).all()
    q0 = model.geometry.qkv_slices(0, 0, "q")
    assert not torch.equal(last[q0.name].index_select(q0.dim, q0.index),
                           orig[q0.name].detach().index_select(q0.dim, q0.index))  # head 0.0 re-initialised

    import lens_heads.models as models

    monkeypatch.setattr(models, "load_model", lambda *a, **k: pytest.fail("a model was loaded"))
    for rule, msg in (("index:9", "4 heads per layer"), ("fraction:2", r"(0, 1]"), ("half", "bad --reinit-healthy")):
        rc = main(["repair", str(src), "--heads", "1.2", "--reinit-healthy", rule, "--steps", "1", *common,
                   "--out", str(tmp_path / "bad")])
        err = capsys.readouterr().err
        assert rc == 2 and msg in err, (rule, err)
    assert not (tmp_path / "bad").exists()
