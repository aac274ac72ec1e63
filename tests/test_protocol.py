"""The paper's protocol, point by point: the authors' threshold rule (interpolated CDF, strict
zeroing) on pools with ties, lm-eval's ``add_bos_token`` on a Llama-style tokenizer that adds a
BOS, lm-eval's ``apply_chat_template`` / ``fewshot_as_multiturn`` prompts, the authors'
``thresholds.json``, the ``paper_protocol`` preset, and the CLI options that set them.

References are independent: hand-computed thresholds, a transcription of the authors'
``x_intercept_for_cdf`` in torch, and lm-evaluation-harness itself (``simple_evaluate`` with
``HFLM`` on the same weights and tokenizer, local task YAMLs).
"""

from __future__ import annotations

import json

import pytest
import torch

from conftest import tiny_config
from lens_heads import LensHeadsError, load_model
from lens_heads.interventions.ablation import ScoreAblation, parse_ablation
from lens_heads.cli import main as cli_main
from lens_heads.data import load_task
from lens_heads.forward.engine import encode_pair
from lens_heads.forward.task_requests import task_inputs
from lens_heads.evaluation.evaluate import evaluate_task
from lens_heads.evaluation.protocol import (Protocol, load_authors_thresholds, paper_protocol, parse_add_bos,
                                 resolve_protocol)
from lens_heads.sweep import SweepConfig, run_sweep
from lens_heads.interventions.thresholds import threshold_for

CHAT_TEMPLATE = ("{% for m in messages %}<|{{ m['role'] }}|>{{ m['content'] }}</s>{% endfor %}"
                 "{% if add_generation_prompt %}<|assistant|>{% endif %}")


# -----------------------------------------------------------------------------
# 1. Threshold rule


def authors_x_intercept(scores: torch.Tensor, y: float) -> float:
    """The authors' create-CDF.py + x_intercept_for_cdf, restated: float32 CDF of sorted scores
    at heights i/N, searchsorted, clamped bracketing indices, linear interpolation."""
    s = torch.sort(scores.flatten().float()).values
    cdf = torch.stack((s, torch.arange(1, len(s) + 1) / len(s)), dim=1)
    y = torch.clamp(torch.as_tensor(y, dtype=cdf.dtype), min=cdf[0, 1], max=cdf[-1, 1])
    i = torch.clamp(torch.searchsorted(cdf[:, 1], y), min=1, max=len(s) - 1)
    x1, y1, x2, y2 = cdf[i - 1, 0], cdf[i - 1, 1], cdf[i, 0], cdf[i, 1]
    den = y2 - y1
    den = torch.where(den == 0, torch.ones_like(den), den)
    return float(x1 + (y - y1) / den * (x2 - x1))


def test_cdf_rule_hand_computed():
    v = torch.tensor([0.0, 1.0, 2.0, 3.0])
    # heights .25 .5 .75 1: p = 0.3 lies between 0.25 (x=0) and 0.5 (x=1): tau = 0.2
    assert threshold_for(v, 0.3, "low", "cdf") == pytest.approx(0.2, abs=1e-7)
    assert threshold_for(v, 0.3, "low", "quantile") == 1.0  # ceil(1.2) = 2nd smallest
    # inactive when high: height 1 - 0.25 = 0.75 -> x = 2, zeroed strictly above: only 3.0
    assert threshold_for(v, 0.25, "high", "cdf") == pytest.approx(2.0)
    assert threshold_for(v, 0.0, "low", "cdf") is None  # fraction 0: no ablation, as before
    with pytest.raises(LensHeadsError, match="unknown threshold rule 'median'"):
        threshold_for(v, 0.1, "low", "median")


def test_tied_pool_strict_and_inclusive_zero_different_fractions():
    """Grouped-query value scores repeat over a group's query heads: a tied block at tau."""
    pool = torch.tensor([1.0, 2.0, 2.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0, 8.0])
    tau_q = threshold_for(pool, 0.2, "low", "quantile")
    tau_c = threshold_for(pool, 0.2, "low", "cdf")
    assert tau_q == 2.0 and tau_c == pytest.approx(2.0)  # same tau by hand: x1 + (0.2-0.1)/0.1 * (2-1)
    g = type("G", (), {"n_layers": 1, "n_heads": 10})()
    inclusive = ScoreAblation("avvn", tau_q, g).crosses(pool)
    strict = ScoreAblation("avvn", tau_c, g, strict=True).crosses(pool)
    assert inclusive.float().mean().item() == pytest.approx(0.4)  # 1, 2, 2, 2
    assert strict.float().mean().item() == pytest.approx(0.1)  # the authors' rule: only 1.0
    # inactive when high, mirrored: the tie sits at the top
    hi = -pool
    assert ScoreAblation("awft", threshold_for(hi, 0.2, "high", "cdf"), g, strict=True).crosses(hi).sum() == 1


@pytest.mark.parametrize("seed", range(5))
def test_cdf_rule_equals_authors_transcription_with_ties(seed):
    g = torch.Generator().manual_seed(seed)
    base = torch.randn(60, generator=g)
    pool = torch.cat([base.repeat_interleave(3), torch.round(torch.rand(40, generator=g) * 4) / 4])  # GQA + bf16-like ties
    for p in (0.05, 0.1, 0.15, 0.2, 0.25, 0.3):
        assert threshold_for(pool, p, "low", "cdf") == authors_x_intercept(pool, round(p, 2))
        assert threshold_for(pool, p, "high", "cdf") == authors_x_intercept(pool, 1 - round(p, 2))
        tau = threshold_for(pool, p, "low", "cdf")
        realised = (pool < tau).float().mean().item()  # what their strict rule zeroes
        assert realised == ScoreAblation("avvn", tau, type("G", (), {})(), strict=True).crosses(pool).float().mean().item()


def test_strict_spec_round_trips(tiny_model):
    g = tiny_model("llama").geometry
    a = parse_ablation("score:ahon_ln@0.5:strict", g)
    assert a.strict and a.name == "score:ahon_ln@0.5:strict"
    assert not parse_ablation("score:ahon_ln@0.5", g).strict
    with pytest.raises(LensHeadsError, match="not a number"):
        parse_ablation("score:ahon_ln@0.5:strictly", g)


# -----------------------------------------------------------------------------
# 2-3. BOS and chat template: a tiny Llama whose tokenizer adds a BOS and has a chat template


@pytest.fixture(scope="module")
def bos_model_dir(tmp_path_factory, tiny_tokenizer_dir):
    from tokenizers import processors
    from transformers import AutoModelForCausalLM, AutoTokenizer, PreTrainedTokenizerFast

    base = AutoTokenizer.from_pretrained(tiny_tokenizer_dir)
    backend = base.backend_tokenizer
    bos = base.convert_tokens_to_ids("<s>")
    backend.post_processor = processors.Sequence([
        processors.ByteLevel(trim_offsets=False),
        processors.TemplateProcessing(single="<s> $A", pair="<s> $A <s> $B", special_tokens=[("<s>", bos)])])
    tok = PreTrainedTokenizerFast(tokenizer_object=backend, bos_token="<s>", eos_token="</s>",
                                  unk_token="<unk>", pad_token="<pad>")
    tok.chat_template = CHAT_TEMPLATE
    folder = tmp_path_factory.mktemp("tiny-llama-bos")
    torch.manual_seed(0)
    cfg = tiny_config("llama", len(tok))
    cfg.max_position_embeddings = 4096  # byte-level prompts of a 400-token vocabulary are long
    model = AutoModelForCausalLM.from_config(cfg, attn_implementation="eager")
    model.save_pretrained(folder)
    tok.save_pretrained(folder)
    return folder


@pytest.fixture(scope="module")
def bos_model(bos_model_dir):
    return load_model(str(bos_model_dir))


def test_add_bos_token_changes_the_first_token(bos_model, shared_data):
    tok = bos_model.tokenizer
    bos = tok.bos_token_id
    ctx, cont = "Question: boil an egg?\nAnswer:", " put it in water"
    auto = encode_pair(tok, ctx, cont)
    off = encode_pair(tok, ctx, cont, add_bos=False)
    on = encode_pair(tok, ctx, cont, add_bos=True)
    assert auto[0][0] == bos and on == auto  # the tokenizer's default adds it (lm-eval 0.4.13)
    assert off[0][0] != bos and off[0] == auto[0][1:] and off[1] == auto[1]  # lm-eval 0.4.5's default
    assert encode_pair(tok, "<s>" + ctx, cont, add_bos=True)[0].count(bos) == 1  # text with its BOS: none added
    piqa = load_task("piqa")
    first = {t[0].item() for t in task_inputs(bos_model, piqa, limit=6)}
    first_off = {t[0].item() for t in task_inputs(bos_model, piqa, limit=6, protocol=Protocol(add_bos_token=False))}
    assert first == {bos} and bos not in first_off  # the "first token" every score reads


def _lm_eval(model_dir, tok, folder, tasks, k, limit, **kwargs):
    from lm_eval import simple_evaluate
    from lm_eval.models.huggingface import HFLM
    from lm_eval.tasks import TaskManager
    from transformers import AutoModelForCausalLM

    hf = AutoModelForCausalLM.from_pretrained(model_dir, attn_implementation="eager", dtype=torch.float32).eval()
    add_bos = kwargs.pop("add_bos_token", None)
    lm = HFLM(pretrained=hf, tokenizer=tok, batch_size=4, **({} if add_bos is None else {"add_bos_token": add_bos}))
    out = simple_evaluate(model=lm, tasks=tasks, num_fewshot=k, limit=limit, task_manager=TaskManager(include_path=str(folder)),
                          log_samples=True, bootstrap_iters=0, fewshot_random_seed=1234, random_seed=0,
                          numpy_random_seed=0, torch_random_seed=0, **kwargs)
    return out["samples"]


def _arguments(sample) -> list[tuple[str, str]]:
    args = sample["arguments"]
    if isinstance(args, dict):  # lm-eval 0.4.13: {"gen_args_0": {"arg_0": ctx, "arg_1": cont}, ...}
        return [(a["arg_0"], a["arg_1"]) for a in args.values()]
    return [tuple(a) for a in args]


def _ll_gap(ours: float, theirs: float) -> float:
    """How far two log-likelihoods differ, in units of the tolerance 1e-4 + 1e-6·|ll|.

    A chat-templated continuation on the tiny random model sums to about -1,085 nats, where one
    float32 step is 1.2e-4: an absolute 1e-4 would ask for more than float32 can hold, and the two
    sides sum the same tokens in a different order on different CPUs. A different prompt or token
    moves a log-likelihood by whole nats, far past this."""
    return abs(ours - theirs) / (1e-4 + 1e-6 * abs(theirs))


def _same_as_lm_eval(task, ours, samples, k, chat=None):
    """Same (context, continuation) strings per choice, same log-likelihoods, same predictions."""
    samples = sorted(samples, key=lambda s: s["doc_id"])
    assert [s["doc_id"] for s in samples] == [q.doc_id for q in ours.questions]
    by_id = {r.doc_id: r for r in task.records}
    worst = 0.0
    for q, s in zip(ours.questions, samples):
        assert task.build(by_id[q.doc_id], k, 1234, chat) == _arguments(s)
        lls = [float(x[0]) for x in s["filtered_resps"]]
        worst = max(worst, max(_ll_gap(a, b) for a, b in zip(q.lls, lls)))
        assert float(s["acc"]) == float(q.correct)
    assert worst < 1.0, worst


@pytest.mark.parametrize("multiturn", [False, True])
def test_chat_template_prompts_and_lls_equal_lm_eval(bos_model, bos_model_dir, multiturn, shared_data, tmp_path):
    from test_evaluate import _lm_eval_configs

    from lens_heads.data.tasks import ChatFormat

    mmlu = load_task("mmlu")
    recs = [r for r in mmlu.records if r.subject in ("astronomy", "virology")][:6]
    _lm_eval_configs(tmp_path, shared_data, recs)
    protocol = Protocol(apply_chat_template=True, fewshot_as_multiturn=multiturn)
    chat = ChatFormat.for_tokenizer(bos_model.tokenizer, multiturn)
    kw = dict(apply_chat_template=True, fewshot_as_multiturn=multiturn)

    samples = _lm_eval(bos_model_dir, bos_model.tokenizer, tmp_path, ["lh_piqa"], 0, 8, **kw)["lh_piqa"]
    ours = evaluate_task(bos_model, "piqa", n_shot=0, doc_ids=range(8), progress=False, protocol=protocol)
    _same_as_lm_eval(load_task("piqa"), ours, samples, 0, chat)
    assert "<|user|>" in _arguments(samples[0])[0][0] and not _arguments(samples[0])[0][1].startswith(" ")

    names = sorted({f"lh_mmlu_{r.subject}" for r in recs})
    samples = _lm_eval(bos_model_dir, bos_model.tokenizer, tmp_path, names, 2, None, **kw)
    ordered = [x for n in names for x in sorted(samples[n], key=lambda x: x["doc_id"])]
    ours = evaluate_task(bos_model, mmlu, n_shot=2, doc_ids=[r.doc_id for r in sorted(recs, key=lambda r: (r.subject, r.doc_id))],
                         progress=False, protocol=protocol)
    wanted = {r.doc_id: r for r in recs}
    for q, s in zip(sorted(ours.questions, key=lambda q: (wanted[q.doc_id].subject, q.doc_id)), ordered):
        assert mmlu.build(wanted[q.doc_id], 2, 1234, chat) == _arguments(s)
        assert max(_ll_gap(a, float(b[0])) for a, b in zip(q.lls, s["filtered_resps"])) < 1.0

    samples = _lm_eval(bos_model_dir, bos_model.tokenizer, tmp_path, ["lh_winogrande"], 2, 6, **kw)["lh_winogrande"]
    ours = evaluate_task(bos_model, "winogrande", n_shot=2, doc_ids=range(6), progress=False, protocol=protocol)
    _same_as_lm_eval(load_task("winogrande"), ours, samples, 2, chat)


@pytest.mark.parametrize("add_bos", [False, True])
def test_add_bos_token_lls_equal_lm_eval(bos_model, bos_model_dir, add_bos, shared_data, tmp_path):
    from test_evaluate import _lm_eval_configs

    _lm_eval_configs(tmp_path, shared_data, [])
    samples = _lm_eval(bos_model_dir, bos_model.tokenizer, tmp_path, ["lh_piqa"], 0, 10, add_bos_token=add_bos)["lh_piqa"]
    ours = evaluate_task(bos_model, "piqa", n_shot=0, doc_ids=range(10), progress=False,
                         protocol=Protocol(add_bos_token=add_bos))
    _same_as_lm_eval(load_task("piqa"), ours, samples, 0)
    default = evaluate_task(bos_model, "piqa", n_shot=0, doc_ids=range(10), progress=False)
    assert (default.questions[0].lls == ours.questions[0].lls) == add_bos  # on == the tokenizer's default here


def test_chat_template_needs_one(tiny_model):
    with pytest.raises(LensHeadsError, match="no chat template"):
        evaluate_task(tiny_model("gpt2"), "piqa", limit=2, progress=False, protocol=Protocol(apply_chat_template=True))


# -----------------------------------------------------------------------------
# 4. Presets, keys, the authors' thresholds file


def test_paper_protocol_per_model(tiny_model, smollm2):
    p = paper_protocol(smollm2)  # SmolLM2-135M-Instruct: chat template, no BOS (lm-eval 0.4.5)
    assert p == Protocol(add_bos_token=False, apply_chat_template=True, fewshot_as_multiturn=True, threshold_rule="cdf")
    assert paper_protocol(tiny_model("gemma3")).add_bos_token is True  # lm-eval 0.4.5 forced it for Gemma
    assert paper_protocol(tiny_model("llama")).apply_chat_template is False  # a folder name without -Instruct
    assert Protocol().key() == {} and p.key()["threshold_rule"] == "cdf"
    q = resolve_protocol(smollm2, paper=True, apply_chat_template=False, add_bos_token="auto")
    assert q == Protocol(threshold_rule="cdf")
    assert parse_add_bos("TRUE") is True and parse_add_bos("auto") is None
    with pytest.raises(LensHeadsError, match="add_bos_token must be one of"):
        parse_add_bos("yes")
    with pytest.raises(LensHeadsError, match="fewshot_as_multiturn needs apply_chat_template"):
        Protocol(fewshot_as_multiturn=True)


AUTHORS_JSON = {"piqa": {"Qwen_Qwen2.5-0.5B": {
    "HONOR": [0.11, 0.39, 0.52, 0.59, 0.66, 0.73, 0.78],
    "Dormant": [1.0, 0.81, 0.73, 0.68, 0.63, 0.59, 0.55],
    "HeadOutputMagnitudeNormalizedLastToken": [0.09, 0.22, 0.32, 0.40, 0.47, 0.56, 0.63]}}}


def test_authors_thresholds_file(tmp_path, bos_model):
    path = tmp_path / "thresholds.json"
    path.write_text(json.dumps(AUTHORS_JSON))
    t = load_authors_thresholds(path, "piqa", "Qwen/Qwen2.5-0.5B")
    assert set(t) == {"ahon_ln", "awft", "lthon_ln"}
    assert t["ahon_ln"][0.1] == 0.52 and t["ahon_ln"][0.0] is None and t["lthon_ln"][0.3] == 0.63
    with pytest.raises(LensHeadsError, match="no model 'Qwen/Qwen2.5-7B'.*Qwen_Qwen2.5-0.5B"):
        load_authors_thresholds(path, "piqa", "Qwen/Qwen2.5-7B")
    with pytest.raises(LensHeadsError, match="no task 'mmlu'"):
        load_authors_thresholds(path, "mmlu", "Qwen/Qwen2.5-0.5B")
    # a sweep on the paper's own thresholds, zeroing strictly (the paper's rule)
    model = bos_model
    cfg = SweepConfig(task="piqa", score_ids=["ahon_ln", "awft"], fractions=[0, 0.1, 0.3], random_seeds=[], limit=6,
                      protocol=Protocol(threshold_rule="cdf"), thresholds_file=str(path),
                      thresholds_model="Qwen/Qwen2.5-0.5B", n_boot=20)
    res = run_sweep(model, cfg, tmp_path / "sweep", progress=False)
    specs = set(res.summary["spec"])
    assert {"score:ahon_ln@0.52:strict", "score:ahon_ln@0.78:strict", "score:awft@0.73:strict"} <= specs
    assert not (tmp_path / "sweep" / "thresholds").exists()  # no scoring pass
    bad = SweepConfig(task="piqa", score_ids=["ahon_ln"], fractions=[0, 0.12], random_seeds=[], limit=6,
                      thresholds_file=str(path), thresholds_model="Qwen/Qwen2.5-0.5B")
    with pytest.raises(LensHeadsError, match="not at 0.12"):
        run_sweep(model, bad, tmp_path / "sweep2", progress=False)


def test_default_protocol_keeps_store_keys_and_others_get_their_own(tiny_model, tmp_path):
    from lens_heads.data import load_task as lt
    model, task = tiny_model("llama"), lt("piqa")
    plain = SweepConfig(task="piqa", score_ids=[]).identity(model, task).config()
    assert "apply_chat_template" not in plain and "threshold_rule" not in plain
    chat = SweepConfig(task="piqa", score_ids=[], protocol=Protocol(threshold_rule="cdf")).identity(model, task).config()
    assert {k: v for k, v in chat.items() if k != "threshold_rule"} == plain and chat["threshold_rule"] == "cdf"


def test_lthon_ln_revision_keeps_old_thresholds_out(tiny_model, tmp_path):
    """A thresholds record stored under the old LTHON(LN) definition is never reused."""
    from lens_heads.results.store import ResultStore
    from lens_heads.results.keys import StoreKey
    from lens_heads.sweep import stored_thresholds, thresholds_key

    model, task = tiny_model("llama"), load_task("piqa")
    cfg = SweepConfig(task="piqa", score_ids=["lthon_ln", "ahon_ln"], random_seeds=[], limit=4)
    cfg.validate()
    store, base = ResultStore(tmp_path), cfg.identity(model, task)
    key = thresholds_key(base, cfg)
    old = StoreKey(key.kind, {k: v for k, v in key.config.items() if k != "score_revisions"})  # as stored before
    store.put(old, {"thresholds": {"lthon_ln": {}, "ahon_ln": {}}, "n_inputs": 4})
    assert stored_thresholds(store, base, cfg) is None
    only_ahon = SweepConfig(task="piqa", score_ids=["ahon_ln"], random_seeds=[], limit=4)
    only_ahon.validate()
    assert stored_thresholds(store, base, only_ahon) is not None  # other functions' thresholds still serve
    # LTHON(LN) re-scored alone under its new definition: the two records together serve the pair
    alone = SweepConfig(task="piqa", score_ids=["lthon_ln"], random_seeds=[], limit=4)
    alone.validate()
    new = {repr(p): 0.5 + p for p in alone.fractions}  # as put_thresholds stores them
    store.put(thresholds_key(base, alone), {"thresholds": {"lthon_ln": new}, "n_inputs": 4})
    both = stored_thresholds(store, base, cfg).to_json()
    assert both["thresholds"]["lthon_ln"] == new and set(both["thresholds"]) == {"lthon_ln", "ahon_ln"}


# -----------------------------------------------------------------------------
# CLI


def test_cli_paper_protocol_and_bad_combinations(tiny_model_dir, tmp_path, capsys, shared_data, monkeypatch):
    monkeypatch.setenv("LENS_HEADS_DATA", str(shared_data))
    d = str(tiny_model_dir("gemma3"))
    assert cli_main(["evaluate", d, "--task", "piqa", "--limit", "4", "--paper-protocol", "--quiet",
                     "--ablate", "score:ahon_ln@10%"]) == 0
    out = capsys.readouterr().out
    assert "protocol: add_bos_token=true, chat_template=off, threshold_rule=cdf" in out
    assert ":strict" in out
    for argv, msg in [(["--fewshot-as-multiturn"], "needs --apply-chat-template"),
                      (["--thresholds-file", str(tmp_path / "none.json"), "--thresholds-model", "x",
                        "--ablate", "score:ahon_ln@10%"], "no such file"),
                      (["--thresholds-file", "x.json"], "go together")]:
        assert cli_main(["evaluate", d, "--task", "piqa", "--limit", "4", *argv]) == 2
        err = capsys.readouterr().err
        assert msg in err and "Traceback" not in err and len(err.strip().splitlines()) == 1

