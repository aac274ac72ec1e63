"""Attribution patching (``atp``) against a hand-written autograd computation on the plain HF
model, and against the exact single-head ablation effects it approximates."""

from __future__ import annotations

import json

import pytest
import torch

from lens_heads.scores.attribution import atp_effects, atp_scores, atp_table

CTX = "The capital of France is Paris. The capital of Italy is"
CONT = " Rome"


pytestmark = pytest.mark.usefixtures("own_cache")


@pytest.fixture
def task_file(tmp_path):
    from test_sweep import TASK_ROWS

    path = tmp_path / "mini.jsonl"
    path.write_text("".join(json.dumps({"question": q, "choices": c, "answer": a}) + "\n" for q, c, a in TASK_ROWS))
    return path


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
    from lens_heads.forward.engine import encode_pair

    model = tiny_model("llama")
    hf = model.load_hf_model()
    c, x = encode_pair(model.tokenizer, CTX, CONT)
    got = atp_effects(model, c, x)
    want = _hand_atp(hf, torch.tensor([c + x]), len(c), x)
    torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-4)
    assert got.abs().max() > 0


def test_atp_agrees_in_sign_with_the_exact_effect_of_large_heads(tiny_model):
    from lens_heads.interventions.ablation import parse_ablation
    from lens_heads.forward.engine import encode_pair, loglikelihoods_tokens

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


# -----------------------------------------------------------------------------
# per-input ablation by atp: score:atp@TAU


def _pooled_median(table) -> float:
    return float(torch.stack(list(table.values())).abs().flatten().median())


@pytest.mark.parametrize("replacement", [None, "mean:{corpus}"])
def test_per_input_atp_ablation_equals_each_questions_static_set(tiny_model, task_file, tmp_path, replacement):
    """score:atp@TAU zeroes, on each question, exactly the heads whose |atp| on that question is
    <= TAU: the same log-likelihoods as evaluating each question alone with that static set."""
    from lens_heads.interventions.ablation import parse_ablation
    from lens_heads.data import load_task
    from lens_heads.forward.task_requests import select_records
    from lens_heads.evaluation.evaluate import evaluate_task
    from lens_heads.interventions.specs import StaticHeads, parse_spec, with_replacement

    if replacement:
        corpus = tmp_path / "corpus.jsonl"
        corpus.write_text("".join(json.dumps({"text": t}) + "\n" for t in [CTX + CONT, "Dormant heads do nothing."]))
        replacement = replacement.format(corpus=corpus)
    model, task = tiny_model("llama"), load_task(f"file:{task_file}")
    records = select_records(task, None)
    rep = None
    if replacement:
        from lens_heads.forward.replacement import parse_replacement

        rep = parse_replacement(replacement).runtime()
    table = atp_table(model, task, records, 0, 1234, rep)
    tau = _pooled_median(table)
    spec = lambda s: parse_ablation(str(with_replacement(parse_spec(s), replacement or "zero")), model.geometry)  # noqa: E731
    got = evaluate_task(model, task, ablation=spec(f"score:atp@{tau!r}"), progress=False)
    zeroed = units = 0
    for rec, q in zip(records, got.questions):
        heads = [(L, h) for L, h in torch.nonzero(table[rec.doc_id].abs() <= tau).tolist()]
        alone = evaluate_task(model, task, ablation=spec(str(StaticHeads(tuple(heads)))), doc_ids=[rec.doc_id],
                              progress=False)
        torch.testing.assert_close(torch.tensor(q.lls), torch.tensor(alone.questions[0].lls), atol=1e-5, rtol=0)
        zeroed, units = zeroed + alone.config["zeroed_units"][0], units + alone.config["zeroed_units"][1]
    assert got.config["zeroed_units"] == [zeroed, units]  # the same (row, layer, head) units zeroed
    assert 0.3 < got.zeroed_fraction < 0.7  # the median splits the pooled values


def test_atp_table_is_cached_per_question_and_keyed_by_replacement(tiny_model, task_file, tmp_path):
    from lens_heads.files.cache import cache_dir
    from lens_heads.data import load_task
    from lens_heads.forward.task_requests import select_records
    from lens_heads.forward.replacement import parse_replacement

    model, task = tiny_model("llama"), load_task(f"file:{task_file}")
    records = select_records(task, None)
    first = atp_table(model, task, records, 0, 1234)
    assert len(list(cache_dir("atp").glob("*.safetensors"))) == len(records)
    again = atp_table(model, task, records, 0, 1234)  # from the cache: the same values
    assert all(torch.equal(first[d], again[d]) for d in first)
    corpus = tmp_path / "c.jsonl"
    corpus.write_text(json.dumps({"text": CTX + CONT}) + "\n")
    mean = atp_table(model, task, records, 0, 1234, parse_replacement(f"mean:{corpus}").runtime())
    assert len(list(cache_dir("atp").glob("*.safetensors"))) == 2 * len(records)
    assert not all(torch.allclose(first[d], mean[d]) for d in first)


def test_atp_ablation_outside_evaluate_task_says_so(tiny_model, task_file):
    from lens_heads.interventions.ablation import parse_ablation
    from lens_heads.errors import LensHeadsError
    from lens_heads.forward.engine import encode_pair, loglikelihoods_tokens
    from lens_heads.evaluation.lm_eval_model import LensHeadsLM

    model = tiny_model("llama")
    c, x = encode_pair(model.tokenizer, CTX, CONT)
    with pytest.raises(LensHeadsError, match="no atp for question"):
        loglikelihoods_tokens(model, [(c, x)], parse_ablation("score:atp@0.1", model.geometry), progress=False)
    with pytest.raises(LensHeadsError, match="gold answer"):
        LensHeadsLM(model, ablation="score:atp@0.1")


def test_cli_refuses_atp_where_it_cannot_run(tiny_model_dir, task_file, tmp_path, capsys):
    from lens_heads.cli import main

    model = str(tiny_model_dir("llama"))
    assert main(["lm-eval", model, "--tasks", "piqa", "--ablate", "score:atp@0.1", "--out", str(tmp_path / "l")]) == 2
    assert "gold answer" in capsys.readouterr().err
    sweep = ["sweep", model, "--task", f"file:{task_file}", "--scores", "atp", "--fractions", "0,0.5",
             "--no-progress", "--out", str(tmp_path / "s")]
    assert main([*sweep, "--shard", "0/2"]) == 2
    assert "one process" in capsys.readouterr().err
    assert main([*sweep, "--ablate-with", "resample:self@0"]) == 2
    assert "zero or mean" in capsys.readouterr().err
    assert not (tmp_path / "s").exists() and not (tmp_path / "l").exists()


def test_sweep_thresholds_atp_per_question_and_zeroes_the_target_fraction(tiny_model, task_file, tmp_path):
    """A sweep with --scores atp: its thresholds are those of the pooled per-question |atp|
    (thresholds_of on atp_scores), the points zero about the target fraction, and a sweep under
    mean replacement gets its own atp thresholds (another score), not the zero sweep's."""
    from lens_heads.data import load_task
    from lens_heads.sweep import SweepConfig, run_sweep
    from lens_heads.interventions.thresholds import thresholds_of

    model, task = tiny_model("llama"), load_task(f"file:{task_file}")
    cfg = SweepConfig(task=f"file:{task_file}", score_ids=["atp", "ahon_ln"], fractions=[0.0, 0.25, 0.5],
                      random_seeds=[], batch_size=4, n_boot=50, chunk_questions=2)
    res = run_sweep(model, cfg, tmp_path / "zero", progress=False)
    want = thresholds_of(atp_scores(model, task, progress=False), ["atp"], [0.0, 0.25, 0.5])["atp"]
    assert res.thresholds["atp"] == want
    rows = res.summary[(res.summary["score_fn"] == "atp") & (res.summary["fraction"] > 0)]
    assert len(rows) == 2 and all(abs(r.pct_zeroed / 100 - r.fraction) < 0.1 for r in rows.itertuples())
    corpus = tmp_path / "c.jsonl"
    corpus.write_text(json.dumps({"text": CTX + CONT}) + "\n")
    mcfg = SweepConfig(task=f"file:{task_file}", score_ids=["atp"], fractions=[0.0, 0.5], random_seeds=[],
                       batch_size=4, n_boot=50, replacement=f"mean:{corpus}")
    mres = run_sweep(model, mcfg, tmp_path / "zero", progress=False)  # same store: must not reuse zero's atp
    mwant = thresholds_of(atp_scores(model, task, replacement=f"mean:{corpus}", progress=False),
                          ["atp"], [0.0, 0.5])["atp"]
    assert mres.thresholds["atp"] == mwant and mwant[0.5] != want[0.5]
