"""Attribution patching (``atp``) against a hand-written autograd computation on the plain HF
model, and against the exact single-head ablation effects it approximates."""

from __future__ import annotations

import json

import pytest
import torch

from lens_heads.scores.attribution import atp_effects, atp_scores

CTX = "The capital of France is Paris. The capital of Italy is"
CONT = " Rome"


def _hand_atp(hf, ids, n_ctx, cont_ids):
    """grad of the continuation's log-likelihood w.r.t. each o_proj input (the heads' z), dotted
    with -z per head, by autograd on a plain HF llama."""
    d = hf.config.hidden_size // hf.config.num_attention_heads
    H = hf.config.num_attention_heads
    xs, hs = {}, []
    for L, block in enumerate(hf.model.layers):
        def pre(m, a, L=L):
            x = a[0]
            x.retain_grad()
            xs[L] = x
        hs.append(block.self_attn.o_proj.register_forward_pre_hook(pre))
    logits = hf(ids).logits
    logp = torch.log_softmax(logits[0, n_ctx - 1:n_ctx - 1 + len(cont_ids)].float(), -1)
    logp.gather(1, torch.tensor(cont_ids)[:, None]).sum().backward()
    for h in hs:
        h.remove()
    return torch.tensor([[float((xs[L].grad[0, :, h * d:(h + 1) * d] * -xs[L][0, :, h * d:(h + 1) * d]).sum())
                          for h in range(H)] for L in range(len(xs))])


def test_atp_equals_hand_autograd(tiny_model):
    from lens_heads.evaluate import encode_pair

    model = tiny_model("llama")
    hf = model.load_hf_model()
    c, x = encode_pair(model.tokenizer, CTX, CONT)
    got = atp_effects(model, c, x)
    want = _hand_atp(hf, torch.tensor([c + x]), len(c), x)
    torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-4)
    assert got.abs().max() > 0


def test_atp_agrees_in_sign_with_the_exact_effect_of_large_heads(tiny_model):
    from lens_heads.ablation import parse_ablation
    from lens_heads.evaluate import encode_pair, loglikelihoods_tokens

    model = tiny_model("llama")
    g = model.geometry
    texts = [(CTX, CONT), ("Dormant heads are heads that", " do nothing"), ("To boil an egg, put it in", " water")]
    agree = total = 0
    for ctx, cont in texts:
        c, x = encode_pair(model.tokenizer, ctx, cont)
        est = atp_effects(model, c, x)
        base = loglikelihoods_tokens(model, [(c, x)], progress=False)[0]
        exact = torch.tensor([[loglikelihoods_tokens(model, [(c, x)], parse_ablation(f"static:{L}.{h}", g),
                                                     progress=False)[0] - base for h in range(g.n_heads)]
                              for L in range(g.n_layers)])
        big = exact.abs() >= exact.abs().flatten().quantile(0.5)
        agree += int((torch.sign(est[big]) == torch.sign(exact[big])).sum())
        total += int(big.sum())
    print(f"sign agreement on the larger half of exact effects: {agree}/{total}")
    assert agree / total >= 0.8


def test_atp_scores_rank_heads(tiny_model, tmp_path):
    from test_sweep import TASK_ROWS

    from lens_heads.data import load_task

    rows = tmp_path / "mini.jsonl"
    rows.write_text("".join(json.dumps({"question": q, "choices": c, "answer": a}) + "\n" for q, c, a in TASK_ROWS))
    model = tiny_model("llama")
    hs = atp_scores(model, load_task(f"file:{rows}"), progress=False)
    assert hs.score_ids == ["atp"] and hs.per_input["atp"].shape == (len(TASK_ROWS), 2, 4)
    assert (hs.per_input["atp"] >= 0).all() and hs.inactive_when("atp") == "low"
    order = hs.least_active("atp")
    assert float(hs.mean["atp"][order[0]]) <= float(hs.mean["atp"][order[-1]])
    with pytest.raises(Exception, match="resample"):
        atp_scores(model, load_task(f"file:{rows}"), replacement="resample:self@0", progress=False)


def test_cli_score_atp_writes_a_loadable_table(tiny_model_dir, tmp_path, capsys):
    from test_sweep import TASK_ROWS

    from lens_heads.cli import main
    from lens_heads.scores import HeadScores

    rows = tmp_path / "mini.jsonl"
    rows.write_text("".join(json.dumps({"question": q, "choices": c, "answer": a}) + "\n" for q, c, a in TASK_ROWS))
    out = tmp_path / "atp.csv"
    assert main(["score", str(tiny_model_dir("llama")), "--scores", "atp", "--task", f"file:{rows}",
                 "--out", str(out), "--quiet"]) == 0
    back = HeadScores.load(out)
    assert back.score_ids == ["atp"] and back.least_active("atp")
    assert main(["score", str(tiny_model_dir("llama")), "--scores", "atp", "--out", str(tmp_path / "x.csv")]) == 2
    assert "needs --task" in capsys.readouterr().err
