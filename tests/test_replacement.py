"""Mean and resample ablation (``lens_heads.forward.replacement``) against hand-written patching of the
plain HF model's head outputs (the output projection's input), and their specs."""

from __future__ import annotations

import json

import pytest
import torch

from lens_heads.interventions.ablation import bind, parse_ablation
from lens_heads.models.hooks import run_with_hooks
from lens_heads.interventions.specs import StaticHeads, parse_spec

HEADS = {0: [1], 1: [2, 3]}
STATIC = "static:0.1,1.2,1.3"
SOURCE = "Attention heads that do nothing are called dormant heads, and they sink onto the first token."
TARGETS = ["The capital of France is Paris. The capital of Italy is Rome, and of Spain Madrid.", "A B C D"]


pytestmark = pytest.mark.usefixtures("own_cache")


@pytest.fixture
def one_text(tmp_path):
    path = tmp_path / "one.jsonl"
    path.write_text(json.dumps({"text": SOURCE}) + "\n")
    return path


def _hf_z(hf, ids):
    """Every layer's o_proj input (the heads' outputs z) of a plain HF llama: [T, H*d]."""
    out, hs = {}, []
    for L, block in enumerate(hf.model.layers):
        hs.append(block.self_attn.o_proj.register_forward_pre_hook(
            lambda m, a, L=L: out.__setitem__(L, a[0][0].detach().clone())))
    with torch.no_grad():
        hf(ids)
    for h in hs:
        h.remove()
    return out


def _hf_patched(hf, ids, values):
    """Logits of the plain HF model with heads HEADS of each layer replaced by ``values[L]``
    ([T or 1, H*d], broadcast over positions)."""
    d = hf.config.hidden_size // hf.config.num_attention_heads
    hs = []
    for L, heads in HEADS.items():
        def pre(m, a, L=L, heads=heads):
            x = a[0].clone()
            v = values[L].expand(x.shape[1], -1)
            for h in heads:
                x[0, :, h * d:(h + 1) * d] = v[:, h * d:(h + 1) * d]
            return (x,)
        hs.append(hf.model.layers[L].self_attn.o_proj.register_forward_pre_hook(pre))
    with torch.no_grad():
        logits = hf(ids).logits
    for h in hs:
        h.remove()
    return logits


def _ours(model, ids, spec):
    ab = parse_ablation(spec, model.geometry)
    mask = torch.ones_like(ids)
    return run_with_hooks(model, ids, mask, ab.hooks(model, mask, [7]))


def test_mean_over_a_corpus_of_one_input_is_its_own_mean_by_hand(tiny_model, one_text):
    model = tiny_model("llama")
    hf = model.load_hf_model()
    src = torch.tensor([model.tokenizer(SOURCE)["input_ids"]])
    means = {L: z.mean(0, keepdim=True) for L, z in _hf_z(hf, src).items()}  # position-agnostic, per feature
    for text in TARGETS:
        ids = torch.tensor([model.tokenizer(text)["input_ids"]])
        want = _hf_patched(hf, ids, means)
        got = _ours(model, ids, f"{STATIC}|mean:{one_text}@1")
        torch.testing.assert_close(got, want, atol=1e-5, rtol=0)
        assert (got - _ours(model, ids, STATIC)).abs().max() > 1e-3  # not the zero ablation
    assert len(list((one_text.parent / "cache" / "head_means").glob("*.safetensors"))) == 1  # cached once


def test_resample_from_self_changes_nothing_and_from_a_source_patches_it_in(tiny_model, one_text):
    model = tiny_model("llama")
    hf = model.load_hf_model()
    ids = torch.tensor([model.tokenizer(TARGETS[0])["input_ids"]])
    plain = run_with_hooks(model, ids, None, [])
    torch.testing.assert_close(_ours(model, ids, f"{STATIC}|resample:self@3"), plain, atol=1e-6, rtol=0)
    src = _hf_z(hf, torch.tensor([model.tokenizer(SOURCE)["input_ids"]]))
    T = ids.shape[1]
    pos = torch.clamp(torch.arange(T), max=next(iter(src.values())).shape[0] - 1)  # short source: last repeats
    want = _hf_patched(hf, ids, {L: z[pos] for L, z in src.items()})
    torch.testing.assert_close(_ours(model, ids, f"{STATIC}|resample:{one_text}@0@1"), want, atol=1e-5, rtol=0)


def test_specs_round_trip_and_zero_is_the_plain_spec(one_text):
    for text in (f"static:0.1,1.2|mean:{one_text}", f"random:0.25@1|resample:c4@5@16",
                 "score:ahon_ln@0.5|mean:c4@8"):
        assert str(parse_spec(text)) == text and str(parse_spec(str(parse_spec(text)))) == text
    assert parse_spec("static:1.2,0.1|zero") == StaticHeads(((0, 1), (1, 2)))
    assert str(parse_spec("none|mean:c4")) == "none"
    assert bind(parse_spec(f"static:0.1|resample:{one_text}@2"), None).reuses_prefix is False


@pytest.mark.parametrize("with_, message", [
    ("median:c4", "bad replacement"), ("mean:", "bad replacement"), ("resample:c4", "bad replacement"),
    ("mean:EMPTY", "no texts"), ("mean:/no/such/file.txt", "not found"),
])
def test_bad_replacements_fail_before_the_model_loads(with_, message, tiny_model_dir, tmp_path, capsys,
                                                       monkeypatch):
    import lens_heads.models as models
    from lens_heads.cli import main

    (tmp_path / "empty.jsonl").write_text("")
    monkeypatch.setattr(models, "load_model", lambda *a, **k: pytest.fail("the model was loaded"))
    for cmd in (["evaluate", str(tiny_model_dir("llama")), "--task", "piqa", "--ablate", STATIC],
                ["sweep", str(tiny_model_dir("llama")), "--task", "piqa", "--scores", "ahon_ln", "--out",
                 str(tmp_path / "o")]):
        code = main([*cmd, "--ablate-with", with_.replace("EMPTY", str(tmp_path / "empty.jsonl"))])
        err = capsys.readouterr().err.strip().splitlines()
        assert code == 2 and len(err) == 1 and message in err[0], err
    assert not (tmp_path / "o").exists()


def test_a_sweep_under_mean_ablation_has_its_own_points(tiny_model, tmp_path, one_text):
    from test_sweep import TASK_ROWS

    from lens_heads.sweep import SweepConfig, run_sweep

    rows = tmp_path / "mini.jsonl"
    rows.write_text("".join(json.dumps({"question": q, "choices": c, "answer": a}) + "\n" for q, c, a in TASK_ROWS))
    kw = dict(task=f"file:{rows}", score_ids=["ahon_ln"], fractions=[0.0, 0.5], random_seeds=[0], n_boot=100)
    model = tiny_model("llama")
    zero = run_sweep(model, SweepConfig(**kw), tmp_path / "s", progress=False)
    mean = run_sweep(model, SweepConfig(**kw, replacement=f"mean:{one_text}@1"), tmp_path / "s", progress=False)
    specs = set(mean.summary["spec"])
    assert all(s == "none" or s.endswith(f"|mean:{one_text}@1") for s in specs)
    assert len(list((tmp_path / "s" / "points").glob("*.json"))) == 1 + 2 * 2  # the baseline is shared
    base = lambda r: float(r.summary.loc[r.summary.spec == "none", "accuracy"].iloc[0])  # noqa: E731
    assert base(zero) == base(mean)


def test_ablate_with_needs_ablate_and_a_sweep_never_writes_into_the_model_folder(tiny_model_dir, capsys, tmp_path):
    import shutil

    from lens_heads.cli import main

    assert main(["evaluate", str(tiny_model_dir("llama")), "--task", "piqa", "--ablate-with", "mean:c4"]) == 2
    assert "give the heads with --ablate" in capsys.readouterr().err
    model = tmp_path / "model"
    shutil.copytree(tiny_model_dir("llama"), model)
    before = sorted(p.name for p in model.iterdir())
    assert main(["sweep", str(model), "--task", "piqa", "--scores", "ahon_ln", "--out", str(model)]) == 2
    assert "the model's own folder" in capsys.readouterr().err and sorted(p.name for p in model.iterdir()) == before
