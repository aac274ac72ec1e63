"""``LensHeadsLM`` (lens_heads as an lm-eval model) against lm-eval's own HF backend, plain HF
``generate``, and hand-written greedy loops with heads zeroed on the HF model; the
``lens-heads lm-eval`` CLI's checks."""

from __future__ import annotations

import json
import math

import pytest
import torch

pytest.importorskip("lm_eval")

from lens_heads.interventions.ablation import parse_ablation  # noqa: E402
from lens_heads.errors import LensHeadsError  # noqa: E402
from lens_heads.evaluation.evaluate import loglikelihoods, perplexity  # noqa: E402

ARCH = "llama"
STATIC = "static:0.1,1.2,1.3"
N_PIQA = 8


def _inst(kind, args, doc_id=None, idx=0):
    from lm_eval.api.instance import Instance

    return Instance(kind, {}, args, idx, metadata=("t", doc_id, 1))


@pytest.fixture(scope="module", autouse=True)
def one_thread():
    """The tiny models' matmuls gain nothing from threads, and on a busy machine OpenMP's
    spinning makes a forward 100x slower (measured: 0.28 s vs 3 ms); restored afterwards."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.fixture(scope="module")
def model(tiny_model):
    return tiny_model(ARCH)


@pytest.fixture(scope="module")
def hflm(tiny_model_dir):
    """lm-eval's own HF backend, loading the tiny model folder itself."""
    from lm_eval.models.huggingface import HFLM

    return HFLM(pretrained=str(tiny_model_dir(ARCH)), device="cpu", dtype="float32", batch_size=4)


@pytest.fixture(scope="module")
def plain_hf(tiny_model_dir):
    """A fresh HF copy of the weights (no bridge), eager attention."""
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(str(tiny_model_dir(ARCH)), attn_implementation="eager").eval()


@pytest.fixture(scope="module")
def piqa_rows(shared_data):
    rows = []
    labels = (shared_data / "piqa" / "valid-labels.lst").read_text().split()
    with open(shared_data / "piqa" / "valid.jsonl", encoding="utf-8") as f:
        for line, label in zip(f, labels):
            r = json.loads(line)
            if len(r["goal"]) + max(len(r["sol1"]), len(r["sol2"])) < 110:
                rows.append({**r, "label": int(label)})
            if len(rows) == N_PIQA:
                break
    return rows


def _lm(model, **kw):
    from lens_heads.evaluation.lm_eval_model import LensHeadsLM

    return LensHeadsLM(model, progress=False, batch_size=3, **kw)


def _greedy_next(hf, ids):
    with torch.no_grad():
        return int(hf(torch.tensor([ids])).logits[0, -1].argmax())


@pytest.fixture(scope="module")
def ll_requests(model, plain_hf, piqa_rows):
    """PIQA (context, continuation) pairs, an empty context, trailing whitespace, and
    continuations that are the model's own greedy tokens (so some is_greedy are True)."""
    tok = model.tokenizer
    reqs = []
    for d, r in enumerate(piqa_rows):
        for j, sol in enumerate((r["sol1"], r["sol2"])):
            reqs.append(((f"Question: {r['goal']}\nAnswer:", f" {sol}"), d, j))
    reqs.append((("", "The capital of France is Paris."), 100, 0))
    reqs.append((("Attention heads that do nothing are ", "called dormant heads."), 101, 0))
    for d, ctx in enumerate(["The capital of France is", "Question: How do I boil an egg? Answer:",
                             "A B C D Answer: the"]):
        ids = tok.encode(ctx)
        for n in (1, 3):
            gen = list(ids)
            for _ in range(n):
                gen.append(_greedy_next(plain_hf, gen))
            reqs.append(((ctx, tok.decode(gen[len(ids):])), 200 + d, n))
    return reqs


def test_loglikelihood_equals_hflm(model, hflm, ll_requests):
    inst = [_inst("loglikelihood", a, d, i) for a, d, i in ll_requests]
    ours = _lm(model).loglikelihood(inst)
    theirs = hflm.loglikelihood(inst, disable_tqdm=True)
    delta = max(abs(a[0] - b[0]) for a, b in zip(ours, theirs))
    print(f"max |d loglik| vs HFLM: {delta:.3g} over {len(inst)} requests")
    assert delta <= 1e-4
    assert [g for _, g in ours] == [g for _, g in theirs]
    greedy = [g for _, g in theirs]
    assert any(greedy) and not all(greedy)  # the comparison covers both outcomes


def test_loglikelihood_rolling_equals_hflm_and_perplexity(model, hflm):
    from conftest import SAMPLE_TEXTS

    long = " ".join(SAMPLE_TEXTS * 6)  # longer than the 256 positions: several windows
    texts = SAMPLE_TEXTS + [long, "x"]
    inst = [_inst("loglikelihood_rolling", (t,), d) for d, t in enumerate(texts)]
    lm = _lm(model)
    ours = lm.loglikelihood_rolling(inst)
    theirs = hflm.loglikelihood_rolling(inst, disable_tqdm=True)
    assert len(model.tokenizer.encode(long)) > lm.max_length
    delta = max(abs(a - b) for a, b in zip(ours, theirs))
    print(f"max |d rolling loglik| vs HFLM: {delta:.3g}")
    assert delta <= 1e-4
    # one window: exactly perplexity's per-token log-likelihood of [prefix] + tokens
    abl = parse_ablation(STATIC, model.geometry)
    ablated = _lm(model, ablation=STATIC).loglikelihood_rolling(inst[:len(SAMPLE_TEXTS)])
    for text, ll, ll_abl in zip(SAMPLE_TEXTS, ours, ablated):
        ids = torch.tensor([lm.prefix_token_id] + model.tokenizer.encode(text))
        nll = math.log(perplexity(model, [ids])) * (len(ids) - 1)
        assert ll == pytest.approx(-nll, abs=1e-4)
        nll_abl = math.log(perplexity(model, [ids], abl)) * (len(ids) - 1)
        assert ll_abl == pytest.approx(-nll_abl, abs=1e-4) and abs(ll_abl - ll) > 1e-2


HEADS = [(0, 1), (1, 2), (1, 3)]  # = STATIC


@pytest.fixture(scope="module")
def zeroed_hf(tiny_model_dir):
    """A plain HF llama whose heads HEADS are zeroed by hand: their slices of the o_proj input
    (the head outputs z before W_O) set to 0 by a forward pre-hook."""
    from transformers import AutoModelForCausalLM

    hf = AutoModelForCausalLM.from_pretrained(str(tiny_model_dir(ARCH)), attn_implementation="eager").eval()
    d_head = hf.config.hidden_size // hf.config.num_attention_heads
    for layer in {L for L, _ in HEADS}:
        cols = [c for L, h in HEADS if L == layer for c in range(h * d_head, (h + 1) * d_head)]

        def pre(module, args, cols=cols):
            x = args[0].clone()
            x[..., cols] = 0.0
            return (x,)

        hf.model.layers[layer].self_attn.o_proj.register_forward_pre_hook(pre)
    return hf


def test_static_ablation_loglikelihood_equals_engine_and_zeroed_hf(model, ll_requests, zeroed_hf):
    from lens_heads.forward.engine import encode_pair

    tok = model.tokenizer
    reqs = [a for a, _, _ in ll_requests[:6]]
    for ctx in ["The capital of France is", "A B C D Answer: the"]:  # greedy under the ablation
        ids = tok.encode(ctx)
        for n in (1, 3):
            gen = list(ids)
            for _ in range(n):
                gen.append(_greedy_next(zeroed_hf, gen))
            reqs.append((ctx, tok.decode(gen[len(ids):])))
    inst = [_inst("loglikelihood", a, d) for d, a in enumerate(reqs)]
    lm = _lm(model, ablation=STATIC)
    ours = lm.loglikelihood(inst)
    engine = loglikelihoods(model, reqs, parse_ablation(STATIC, model.geometry), progress=False)
    plain = _lm(model).loglikelihood(inst)
    assert [ll for ll, _ in ours] == pytest.approx(engine, abs=1e-5)
    assert max(abs(a[0] - b[0]) for a, b in zip(ours, plain)) > 1e-2  # the heads matter
    assert lm.zeroed_fraction == pytest.approx(3 / (2 * 4))
    # sums and is_greedy against the HF model with those heads zeroed by hand
    flags = []
    for args, (ll, greedy) in zip(reqs, ours):
        ctx, cont = encode_pair(tok, *args)
        with torch.no_grad():
            logp = torch.log_softmax(zeroed_hf(torch.tensor([ctx + cont[:-1]])).logits[0, -len(cont):], -1)
        assert ll == pytest.approx(float(logp.gather(1, torch.tensor(cont)[:, None]).sum()), abs=1e-4)
        flags.append(logp.argmax(-1).tolist() == cont)
    assert [g for _, g in ours] == flags
    assert any(flags) and not all(flags)


PROMPTS = ["The capital of France is", "Question: How do I boil an egg? Answer:",
           "Attention heads that do nothing"]


def _reference_text(tok, gen_ids, until):
    text = tok.decode(gen_ids, skip_special_tokens=True)
    for stop in until + [tok.eos_token]:
        text = text.split(stop)[0]
    return text


def hf_greedy(hf, tok, prompt: str, n: int) -> list[int]:
    """The ``n`` tokens HF's own ``generate`` appends to ``prompt``, greedily."""
    ids = tok.encode(prompt)
    with torch.no_grad():
        return hf.generate(torch.tensor([ids]), do_sample=False, max_new_tokens=n,
                           pad_token_id=tok.pad_token_id)[0, len(ids):].tolist()


def test_generate_until_equals_hf_generate(model, plain_hf, hflm):
    tok = model.tokenizer
    reqs, expected = [], []
    for d, prompt in enumerate(PROMPTS):
        full = hf_greedy(plain_hf, tok, prompt, 12)
        gen_text = tok.decode(full, skip_special_tokens=True)
        stop = gen_text[len(gen_text) // 2:][:3]  # a stop string the generation does contain
        for i, (until, n) in enumerate([([], 12), ([stop], 12), ([], 4)]):
            reqs.append(_inst("generate_until", (prompt, {"until": until, "max_gen_toks": n, "do_sample": False}), d, i))
            expected.append(_reference_text(tok, full[:n], until))
        assert len(expected[-3]) > len(expected[-2]) and len(expected[-3]) > len(expected[-1])  # both cut
    lm = _lm(model)
    ours = lm.generate_until(reqs)
    assert ours == expected
    assert ours == hflm.generate_until(reqs, disable_tqdm=True)
    assert _lm(model, kv_cache=False).generate_until(reqs) == ours


def test_generate_until_static_ablation_equals_zeroed_hf_loop(model, zeroed_hf):
    tok = model.tokenizer
    hf = zeroed_hf
    n = 12
    reqs = [_inst("generate_until", (p, {"until": [], "max_gen_toks": n}), d) for d, p in enumerate(PROMPTS)]
    expected = []
    for prompt in PROMPTS:
        ids = tok.encode(prompt)
        seq = list(ids)
        while len(seq) < len(ids) + n:  # greedy, no cache, no EOS on these prompts
            seq.append(_greedy_next(hf, seq))
        expected.append(tok.decode(seq[len(ids):], skip_special_tokens=True))
    ablated = _lm(model, ablation=STATIC).generate_until(reqs)
    assert ablated == expected
    assert ablated != _lm(model).generate_until(reqs)
    assert _lm(model, ablation=STATIC, kv_cache=False).generate_until(reqs) == ablated


def test_generate_until_score_ablation_decides_per_step_on_the_whole_sequence(model):
    """Step t's token is the argmax of one full forward of prompt + generated[:t], with the
    score ablation decided on that forward (the documented definition)."""
    from lens_heads.models.hooks import run_with_hooks
    from lens_heads.scores import ScoreCollector

    tok = model.tokenizer
    prompt = PROMPTS[0]
    ids = tok.encode(prompt)
    coll = ScoreCollector(model, ["ahon"])
    mask = torch.ones(1, len(ids), dtype=torch.long)
    run_with_hooks(model, torch.tensor([ids]), mask, coll.hooks(mask), return_logits=False)
    tau = float(coll.batch_scores()["ahon"].flatten().median())
    spec = f"score:ahon@{tau!r}"
    lm = _lm(model, ablation=spec)
    (text,) = lm.generate_until([_inst("generate_until", (prompt, {"until": [], "max_gen_toks": 8}), 0)])
    assert 0.0 < lm.zeroed_fraction < 1.0
    abl = parse_ablation(spec, model.geometry)
    seq, zeroed = list(ids), []
    for _ in range(8):
        m = torch.ones(1, len(seq), dtype=torch.long)
        logits = run_with_hooks(model, torch.tensor([seq]), m, abl.hooks(model, m, [0]))
        zeroed.append(abl.last_zeroed.clone())
        seq.append(int(logits[0, -1].argmax()))
    assert text == tok.decode(seq[len(ids):], skip_special_tokens=True)
    # the decision is taken again at each step: the zeroed set changes as the sequence grows
    assert any(not torch.equal(z, zeroed[0]) for z in zeroed[1:])


def test_model_args_route_and_registry(model, tiny_model_dir):
    from lm_eval.api.registry import get_model

    from lens_heads.evaluation.lm_eval_model import LensHeadsLM, request_keys

    assert get_model("lens_heads") is LensHeadsLM
    lm = LensHeadsLM.create_from_arg_string(f"pretrained={tiny_model_dir(ARCH)},ablation=static:1.3,0.1,dtype=float32,"
                                            f"progress=False", {"batch_size": "4", "device": None})
    assert lm.ablation_spec == "static:0.1,1.3" and lm.batch_size == 4 and not lm.progress
    assert LensHeadsLM.create_from_arg_string(f"pretrained={tiny_model_dir(ARCH)},ablation=none").ablation is None
    with pytest.raises(LensHeadsError, match="no argument 'ablate'"):  # a typo is not swallowed
        LensHeadsLM.create_from_arg_string(f"pretrained={tiny_model_dir(ARCH)},ablate=static:0.1")
    assert request_keys([_inst("loglikelihood", ("a", "b"), 7, 1), _inst("loglikelihood", ("a", "c"), 2, 0)]) == [7001, 2000]
    assert request_keys([_inst("loglikelihood", ("a", "b"), None, 1), _inst("loglikelihood", ("a", "c"), 2, 0)]) == [0, 1]


# -----------------------------------------------------------------------------
# simple_evaluate on a local YAML task


@pytest.fixture(scope="module")
def piqa_yaml(piqa_rows, tmp_path_factory):
    import yaml

    folder = tmp_path_factory.mktemp("lm_eval_model_tasks")
    data = folder / "rows.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in piqa_rows))
    cfg = {"task": "lh_piqa_tiny", "dataset_path": "json", "dataset_kwargs": {"data_files": {"test": str(data)}},
           "output_type": "multiple_choice", "test_split": "test",
           "doc_to_text": "Question: {{goal}}\nAnswer:", "doc_to_target": "{{label}}",
           "doc_to_choice": "{{[sol1, sol2]}}",
           "metric_list": [{"metric": "acc", "aggregation": "mean", "higher_is_better": True},
                           {"metric": "acc_norm", "aggregation": "mean", "higher_is_better": True}]}
    (folder / "lh_piqa_tiny.yaml").write_text(yaml.safe_dump(cfg))
    missing = {**cfg, "task": "lh_missing_data", "dataset_kwargs": {"data_files": {"test": str(folder / "nope.jsonl")}}}
    (folder / "lh_missing_data.yaml").write_text(yaml.safe_dump(missing))
    return folder


@pytest.fixture(scope="module")
def task_manager(piqa_yaml):
    """One lm-eval TaskManager over its tasks and ours (indexing them takes seconds)."""
    from lm_eval.tasks import TaskManager

    return TaskManager(include_path=str(piqa_yaml))


@pytest.fixture
def shared_manager(task_manager, piqa_yaml, monkeypatch):
    """The CLI builds its TaskManager through ``new_task_manager``: hand it the shared one."""
    import lens_heads.cli.lm_eval as cli

    def new(include_path):
        assert include_path == str(piqa_yaml)
        return task_manager

    monkeypatch.setattr(cli, "new_task_manager", new)


def _simple_evaluate(lm, manager, **kw):
    from lm_eval import simple_evaluate

    out = simple_evaluate(model=lm, tasks=["lh_piqa_tiny"], task_manager=manager,
                          log_samples=True, bootstrap_iters=0, **kw)
    samples = sorted(out["samples"]["lh_piqa_tiny"], key=lambda s: s["doc_id"])
    return out["results"]["lh_piqa_tiny"], [[r[0][0] for r in s["resps"]] for s in samples]


def test_simple_evaluate_same_acc_as_hflm(model, hflm, task_manager, piqa_rows, tiny_model_dir):
    ours, our_lls = _simple_evaluate(_lm(model), task_manager)
    theirs, their_lls = _simple_evaluate(hflm, task_manager)
    assert ours["acc,none"] == theirs["acc,none"] and ours["acc_norm,none"] == theirs["acc_norm,none"]
    assert sum(our_lls, []) == pytest.approx(sum(their_lls, []), abs=1e-4)
    # random ablation through lm-eval: keys doc_id * 1000 + choice, as the engine is given them
    spec = "random:0.4@3"
    _, rnd_lls = _simple_evaluate(_lm(model, ablation=spec), task_manager)
    # lm-eval's --model lens_heads --model_args route gives the same as the object
    _, by_name = _simple_evaluate("lens_heads", task_manager,
                                  model_args=f"pretrained={tiny_model_dir(ARCH)},ablation={spec},progress=False")
    # (to float rounding: the two routes may batch differently, and auto runs a batch padded to
    # under 64 tokens eager, one over it fused; docs/methods.md §10)
    assert sum(by_name, []) == pytest.approx(sum(rnd_lls, []), abs=1e-4)
    reqs = [(f"Question: {r['goal']}\nAnswer:", f" {s}") for r in piqa_rows for s in (r["sol1"], r["sol2"])]
    keys = [d * 1000 + j for d in range(len(piqa_rows)) for j in range(2)]
    engine = loglikelihoods(model, reqs, parse_ablation(spec, model.geometry), progress=False, keys=keys)
    assert sum(rnd_lls, []) == pytest.approx(engine, abs=1e-4)
    assert sum(rnd_lls, []) != pytest.approx(sum(our_lls, []), abs=1e-3)


# -----------------------------------------------------------------------------
# CLI


def _cli(argv, capsys):
    from lens_heads.cli import main

    capsys.readouterr()  # only this call's output
    code = main(argv)
    return code, capsys.readouterr()


@pytest.mark.parametrize("extra, message", [
    (["--ablate", "static:0.x"], "bad head"),
    (["--ablate", "score:nope@0.1"], "unknown score"),
    (["--ablate", "score:ahon@10%"], "percentage"),
    (["--include-path", "MISSING"], "no such folder"),
    (["--tasks", "lh_no_such_task"], "no task 'lh_no_such_task'"),
    (["--tasks", "lh_missing_data"], "could not be built"),  # its dataset, before the model loads
    (["--limit", "0"], "--limit"),
    (["--num-fewshot", "-1"], "--num-fewshot must be >= 0"),
    (["--out", "AFILE"], "exists and is not a folder"),
    (["--ablate", "static:7.0"], "layer"),  # head ranges: checked once the model is loaded
])
def test_cli_bad_input_exits_2_one_line_nothing_written(extra, message, piqa_yaml, shared_manager, tiny_model_dir,
                                                        tmp_path, capsys):
    out = tmp_path / "out"
    argv = ["lm-eval", str(tiny_model_dir(ARCH)), "--tasks", "lh_piqa_tiny", "--include-path", str(piqa_yaml),
            "--out", str(out), "--quiet"]
    for i in range(0, len(extra), 2):  # later options override the defaults above
        argv.extend(extra[i:i + 2])
    (tmp_path / "afile").write_text("kept")
    argv = [a.replace("MISSING", str(tmp_path / "missing")).replace("AFILE", str(tmp_path / "afile")) for a in argv]
    code, cap = _cli(argv, capsys)
    assert code == 2
    lines = cap.err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("lens-heads lm-eval: error:") and message in lines[0], cap.err
    assert not out.exists() and sorted(p.name for p in tmp_path.iterdir()) == ["afile"]
    assert (tmp_path / "afile").read_text() == "kept"


def test_cli_writes_results_and_samples(piqa_yaml, shared_manager, tiny_model_dir, tmp_path, capsys, model):
    out = tmp_path / "res"
    code, cap = _cli(["lm-eval", str(tiny_model_dir(ARCH)), "--tasks", "lh_piqa_tiny", "--include-path",
                      str(piqa_yaml), "--out", str(out), "--quiet", "--ablate", STATIC, "--limit", "5"], capsys)
    assert code == 0, cap.err
    res = json.loads((out / "results.json").read_text())
    assert res["config"]["lens_heads"]["ablation"] == STATIC and res["config"]["ablation"] == STATIC
    samples = [json.loads(line) for line in (out / "samples_lh_piqa_tiny.jsonl").read_text().splitlines()]
    assert len(samples) == 5
    lm = _lm(model, ablation=STATIC)
    acc = sum(float(s["acc"]) for s in samples) / 5
    assert res["results"]["lh_piqa_tiny"]["acc,none"] == pytest.approx(acc)
    ctx, cont = samples[0]["arguments"]["gen_args_0"]["arg_0"], samples[0]["arguments"]["gen_args_0"]["arg_1"]
    (ll, _), = lm.loglikelihood([_inst("loglikelihood", (ctx, cont), 0, 0)])
    assert float(samples[0]["resps"][0][0][0]) == pytest.approx(ll, abs=1e-4)  # packed with others / alone


def _task_yaml(folder, name: str, rows_file, **fields) -> str:
    """A task YAML over ``rows_file`` (piqa rows), its other fields given."""
    import yaml

    cfg = {"task": name, "dataset_path": "json", "dataset_kwargs": {"data_files": {"test": str(rows_file)}},
           "test_split": "test", "doc_to_text": "Question: {{goal}}\nAnswer:", **fields}
    (folder / f"{name}.yaml").write_text(yaml.safe_dump(cfg))
    return str(folder / f"{name}.yaml")


def test_cli_task_errors_are_found_before_the_model_loads(piqa_yaml, piqa_rows, shared_manager, tiny_model_dir,
                                                          tmp_path, capsys, monkeypatch):
    """A metric option the metric does not take failed after the whole generation run, with
    lm-eval's traceback; an answer outside its row's choices beyond row 0 was scored wrong,
    silently. Both: one line, exit 2, before the model loads, nothing written."""
    import lens_heads.models

    monkeypatch.setattr(lens_heads.models, "load_model", lambda *a, **k: pytest.fail("the model was loaded"))
    rows = piqa_yaml / "rows.jsonl"
    gen = _task_yaml(tmp_path, "lh_gen_bad_option", rows, output_type="generate_until", doc_to_target="{{sol1}}",
                     generation_kwargs={"until": ["\n"], "max_gen_toks": 4},
                     metric_list=[{"metric": "exact_match", "ignore_whitespace": True}])
    bad_rows = tmp_path / "bad_rows.jsonl"
    labels = [r["label"] if i not in (3, 5) else 2 + i for i, r in enumerate(piqa_rows)]
    bad_rows.write_text("".join(json.dumps({**r, "label": lab}) + "\n" for r, lab in zip(piqa_rows, labels)))
    mc = _task_yaml(tmp_path, "lh_later_rows", bad_rows, output_type="multiple_choice", doc_to_target="{{label}}",
                    doc_to_choice="{{[sol1, sol2]}}")
    # a metric or aggregation lm-eval does not know: an empty results table (exit 0), "could not be
    # built: None" after lm-eval's own error line, or a traceback after the whole run (hostile run)
    mc_fields = dict(output_type="multiple_choice", doc_to_target="{{label}}", doc_to_choice="{{[sol1, sol2]}}")
    no_metric = _task_yaml(tmp_path, "lh_no_metric", rows, metric_list=[{"metric": "nosuchmetric"}], **mc_fields)
    no_metric_agg = _task_yaml(tmp_path, "lh_no_metric_agg", rows, **mc_fields, metric_list=[
        {"metric": "nosuchmetric", "aggregation": "mean", "higher_is_better": True}])
    no_agg = _task_yaml(tmp_path, "lh_no_agg", rows, metric_list=[{"metric": "acc", "aggregation": "nosuchagg"}],
                        **mc_fields)
    for spec, limit, needles in [(gen, None, ["lh_gen_bad_option", "unexpected keyword argument 'ignore_whitespace'",
                                              "exact_match: ignore_whitespace"]),
                                 (mc, None, ["doc_to_target", "row 3: index 5, outside 0..1", "row 5: index 7"]),
                                 (mc, "4", ["in 1 row(s)", "row 3: index 5"]),  # only the rows evaluated
                                 (no_metric, None, ["metric_list: no metric 'nosuchmetric'"]),
                                 (no_metric_agg, None, ["lh_no_metric_agg", "no metric 'nosuchmetric'"]),
                                 (no_agg, None, ["metric 'acc' has aggregation 'nosuchagg'", "mean"])]:
        out = tmp_path / "out"
        argv = ["lm-eval", str(tiny_model_dir(ARCH)), "--tasks", spec, "--include-path", str(piqa_yaml),
                "--out", str(out), "--quiet"] + (["--limit", limit] if limit else [])
        code, cap = _cli(argv, capsys)
        lines = cap.err.strip().splitlines()
        assert code == 2 and len(lines) == 1 and "Traceback" not in cap.err, cap.err
        assert all(n in lines[0] for n in needles), lines[0]
        assert not out.exists()


def test_cli_prints_no_git_errors_outside_a_repository(piqa_yaml, shared_manager, tiny_model_dir, tmp_path, capfd,
                                                       monkeypatch):
    """lm-eval runs `git describe` for its provenance with git's stderr on the terminal: outside a
    repository that printed "fatal: not a git repository". Silenced; git_hash is what lm-eval records."""
    from lens_heads.cli import main

    monkeypatch.chdir(tmp_path)
    capfd.readouterr()
    assert main(["lm-eval", str(tiny_model_dir(ARCH)), "--tasks", "lh_piqa_tiny", "--include-path", str(piqa_yaml),
                 "--out", "res", "--quiet", "--limit", "2"]) == 0
    err = capfd.readouterr().err
    assert "fatal" not in err and "not a git repository" not in err, err
    assert json.loads((tmp_path / "res" / "results.json").read_text())["git_hash"] is None  # lm-eval's own value here


# -----------------------------------------------------------------------------
# Perplexity tasks (loglikelihood_rolling) through evaluate


@pytest.fixture(scope="module")
def ppl_yaml(tmp_path_factory):
    """An lm-eval perplexity task over local text: short documents and one longer than the
    model's window (several rolling windows)."""
    import yaml
    from conftest import SAMPLE_TEXTS

    folder = tmp_path_factory.mktemp("lm_eval_ppl")
    texts = SAMPLE_TEXTS + [" ".join(SAMPLE_TEXTS * 6)]
    (folder / "docs.jsonl").write_text("".join(json.dumps({"text": t}) + "\n" for t in texts))
    cfg = {"task": "lh_ppl_tiny", "dataset_path": "json",
           "dataset_kwargs": {"data_files": {"test": str(folder / "docs.jsonl")}},
           "output_type": "loglikelihood_rolling", "test_split": "test", "doc_to_text": "",
           "doc_to_target": "{{text}}",
           "metric_list": [{"metric": m} for m in ("word_perplexity", "byte_perplexity", "bits_per_byte")]}
    (folder / "lh_ppl_tiny.yaml").write_text(yaml.safe_dump(cfg))
    return folder / "lh_ppl_tiny.yaml"


def _ppl_metrics(lm, ppl_yaml):
    from lm_eval import simple_evaluate
    from lm_eval.tasks import TaskManager

    manager = TaskManager(include_path=str(ppl_yaml.parent), include_defaults=False)
    out = simple_evaluate(model=lm, tasks=["lh_ppl_tiny"], task_manager=manager, bootstrap_iters=0)
    res = out["results"]["lh_ppl_tiny"]
    return {m: res[f"{m},none"] for m in ("word_perplexity", "byte_perplexity", "bits_per_byte")}


def test_perplexity_task_equals_lm_eval_hf_and_zeroed_hf(model, hflm, zeroed_hf, ppl_yaml):
    """evaluate on an lm-eval perplexity task gives lm-eval's HF-backend metrics; with heads
    zeroed, the metrics of the log-likelihoods a zeroed plain-HF model gives (one window each)."""
    from lens_heads.data import load_task
    from lens_heads.data.lm_eval_tasks import RollingTask
    from lens_heads.evaluation.rolling import evaluate_rolling_task

    task = load_task(str(ppl_yaml), rolling=True)
    assert isinstance(task, RollingTask) and task.n_docs == 5
    ours = evaluate_rolling_task(model, task)
    theirs = _ppl_metrics(hflm, ppl_yaml)
    assert set(ours.metrics) == set(theirs)
    for m, v in theirs.items():
        assert ours.metrics[m] == pytest.approx(v, rel=1e-5), m
    ablated = evaluate_rolling_task(model, task, parse_ablation(STATIC, model.geometry), limit=4)
    assert [d.doc_id for d in ablated.docs] == [0, 1, 2, 3] and ablated.zeroed_fraction > 0
    lm = _lm(model)
    lls, n_bytes = [], []
    for d in ablated.docs:
        text = task.docs()[d.doc_id]["text"]
        ids = torch.tensor([[lm.prefix_token_id] + model.tokenizer.encode(text)])
        with torch.no_grad():
            logp = zeroed_hf(ids).logits[0, :-1].float().log_softmax(-1)
        lls.append(logp.gather(1, ids[0, 1:, None]).sum().item())
        n_bytes.append(len(text.encode("utf-8")))
    assert [d.loglikelihood for d in ablated.docs] == pytest.approx(lls, abs=1e-4)
    assert [d.bytes for d in ablated.docs] == n_bytes
    assert ablated.metrics["byte_perplexity"] == pytest.approx(math.exp(-sum(lls) / sum(n_bytes)), rel=1e-5)
    assert ablated.metrics["bits_per_byte"] == pytest.approx(-sum(lls) / sum(n_bytes) / math.log(2), rel=1e-5)
    unablated4 = evaluate_rolling_task(model, task, limit=4)
    assert ablated.metrics["byte_perplexity"] != pytest.approx(unablated4.metrics["byte_perplexity"], rel=1e-3)


def test_perplexity_task_cli(ppl_yaml, tiny_model_dir, tmp_path, capsys):
    out = tmp_path / "docs.jsonl"
    code, cap = _cli(["evaluate", str(tiny_model_dir(ARCH)), "--task", str(ppl_yaml), "--ablate", STATIC,
                      "--out", str(out), "--quiet"], capsys)
    assert code == 0, cap.err
    assert "lh_ppl_tiny  docs=5  word_perplexity" in cap.out and "zeroed" in cap.out
    rows = [json.loads(x) for x in out.read_text().splitlines()]
    assert [r["doc_id"] for r in rows] == list(range(5)) and all(r["loglikelihood"] < 0 for r in rows)


@pytest.mark.parametrize("argv, message", [
    (["evaluate", "MODEL", "--task", "PPL", "--ablate", "score:ahon_ln@10%"], "calibrates on multiple-choice"),
    (["evaluate", "MODEL", "--task", "PPL", "--n-shot", "2"], "no few-shot"),
    (["sweep", "MODEL", "--task", "PPL", "--out", "OUT"], "perplexity task"),
])
def test_perplexity_task_where_it_does_not_apply(argv, message, ppl_yaml, tiny_model_dir, tmp_path, capsys,
                                                 monkeypatch):
    import lens_heads.models as models

    monkeypatch.setattr(models, "load_model", lambda *a, **k: pytest.fail("the model was loaded"))
    argv = [{"MODEL": str(tiny_model_dir(ARCH)), "PPL": str(ppl_yaml), "OUT": str(tmp_path / "out")}.get(a, a)
            for a in argv]
    code, cap = _cli(argv, capsys)
    lines = cap.err.strip().splitlines()
    assert code == 2 and len(lines) == 1 and message in lines[0], cap.err
    assert not (tmp_path / "out").exists()
