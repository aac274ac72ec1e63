"""Evaluation engine: log-likelihoods against a naive HF loop, speed paths against the plain
path, lm-eval parity (HFLM on the same model object), stratified limits, perplexity, CLI.

The slow test at the bottom compares per-question predictions with lm-evaluation-harness
0.4.x on SmolLM2 for >= 200 questions of MMLU (5-shot), PIQA and WinoGrande (5-shot)."""

from __future__ import annotations

import json
import math
import random
from collections import Counter

import pytest
import torch

from conftest import TINY_ARCHS
from lens_heads.data import load_task
from lens_heads.errors import LensHeadsError
from lens_heads.forward.engine import build_rows, encode_pair, loglikelihoods_tokens, prefix_groups
from lens_heads.evaluation.evaluate import evaluate_task, loglikelihoods, perplexity
from lens_heads.forward.task_requests import DEFAULT_SEED, select_records, task_inputs, task_requests

ARCHS = ["llama", "gemma3", "bloom", "gpt2", "qwen3", "phi3", "gpt_neox"]  # the last three: outside the table


pytestmark = pytest.mark.usefixtures("one_torch_thread")  # tiny models: one thread is faster (conftest)


# -----------------------------------------------------------------------------
# Independent reference: a plain HF forward per request


def naive_loglikelihood(hf_model, tokenizer, context: str, continuation: str) -> float:
    """lm-eval's rule written out once more: trailing spaces move to the continuation, the
    continuation's tokens are those of context+continuation after the context's tokens."""
    stripped = context.rstrip()
    continuation = context[len(stripped):] + continuation
    whole = tokenizer(stripped + continuation)["input_ids"]
    ctx = tokenizer(stripped)["input_ids"]
    cont = whole[len(ctx):]
    ids = torch.tensor([ctx + cont])
    cfg = hf_model.config
    limit = getattr(cfg, "max_position_embeddings", None) or getattr(cfg, "n_positions", None) or 2048
    ids = ids[:, -(limit + 1):]
    with torch.no_grad():
        logp = torch.log_softmax(hf_model(ids[:, :-1]).logits.float(), -1)[0]
    total = 0.0
    for i, tok in enumerate(cont):
        pos = ids.shape[1] - 1 - len(cont) + i  # input position predicting cont[i]
        total += logp[pos, tok].item()
    return total


def short_piqa_ids(n: int) -> list[int]:
    """PIQA items short enough for the tiny models' 256 positions (byte-level tokenizer)."""
    recs = [r for r in load_task("piqa").records if len(r.question) + max(map(len, r.choices)) < 120]
    return [r.doc_id for r in recs[:n]]


def small_tasks(shared_data, n_each: int = 10):
    """(task, records, n_shot) with short prompts: tiny models read at most 256 tokens."""
    mmlu, piqa, wino = load_task("mmlu"), load_task("piqa"), load_task("winogrande")
    return [
        (mmlu, select_records(mmlu, n_each, seed=3), 0),
        (piqa, [piqa.records[i] for i in short_piqa_ids(n_each)], 0),
        (wino, wino.records[:n_each], 1),
    ]


@pytest.fixture(scope="module")
def hf_copies(tiny_model):
    cache = {}

    def get(arch):
        if arch not in cache:
            cache[arch] = tiny_model(arch).load_hf_model()
        return cache[arch]

    return get


@pytest.mark.parametrize("arch", ["llama", "bloom", "phi3", "gpt_neox"])
def test_loglikelihoods_match_naive_hf_loop(arch, tiny_model, hf_copies, shared_data):
    model, hf = tiny_model(arch), hf_copies(arch)
    reqs = []
    for task, recs, k in small_tasks(shared_data):
        for rec in recs:
            reqs.extend(task.build(rec, k))
    reqs.append(("", "Paris is the capital"))  # empty context: prefix token
    reqs.append(("The answer is  ", "B"))  # trailing spaces move to the continuation
    ours = loglikelihoods(model, reqs, batch_size=7, progress=False)
    for (ctx, cont), ll in zip(reqs[:-2], ours[:-2]):
        assert ll == pytest.approx(naive_loglikelihood(hf, model.tokenizer, ctx, cont), abs=1e-4)
    # empty context: BOS (or EOS) conditions the continuation
    tok = model.tokenizer
    cont = tok("Paris is the capital", add_special_tokens=False)["input_ids"]
    ids = torch.tensor([[tok.bos_token_id] + cont])
    with torch.no_grad():
        logp = torch.log_softmax(hf(ids).logits.float(), -1)[0]
    ref = sum(logp[i, t].item() for i, t in enumerate(cont))
    assert ours[-2] == pytest.approx(ref, abs=1e-4)
    assert ours[-1] == pytest.approx(naive_loglikelihood(hf, tok, "The answer is  ", "B"), abs=1e-4)


@pytest.mark.parametrize("arch", ARCHS)
def test_speed_paths_equal_plain_path(arch, tiny_model, shared_data):
    """Prefix K/V reuse and last-position logits change nothing (to float rounding)."""
    model = tiny_model(arch)
    tok = model.tokenizer
    encoded = []
    for task, recs, k in small_tasks(shared_data, 6):
        for rec in recs:
            encoded.extend(encode_pair(tok, c, x) for c, x in task.build(rec, k))
    # groups must really form: a small min_prefix catches the shared question/shot text
    shared = "The capital of France is Paris. The capital of Italy is Rome. " * 2
    for q in ["Question: A B C D?", "Question: Paris?", "Question: Rome?", "Question: egg?"]:
        encoded.extend(encode_pair(tok, shared + q, x) for x in [" Answer: A", " Answer: the capital"])
    rows = build_rows(model, encoded, list(range(len(encoded))))
    groups, _ = prefix_groups(rows, 8)
    assert len(groups) >= 5 and any(len(g) >= 4 for _, g in groups)
    plain = loglikelihoods_tokens(model, encoded, progress=False, reuse_prefix=False, last_only=False, batch_size=5)
    last = loglikelihoods_tokens(model, encoded, progress=False, reuse_prefix=False, batch_size=5)
    cached = loglikelihoods_tokens(model, encoded, progress=False, min_prefix=8, batch_size=5)
    for a, b, c in zip(plain, last, cached):
        assert b == pytest.approx(a, abs=1e-4)
        assert c == pytest.approx(a, abs=1e-4)


def _packing_requests(tok, shared_data):
    """Task requests (MMLU 0-shot, PIQA, WinoGrande 1-shot), questions sharing a prefix, and
    inputs of a few tokens (Gemma 3's tiny sliding window packs only those)."""
    encoded = []
    for task, recs, k in small_tasks(shared_data, 6):
        for rec in recs:
            encoded.extend(encode_pair(tok, c, x) for c, x in task.build(rec, k))
    for q in ["Question: A B C D?", "Question: Paris?", "Question: Rome?"]:
        encoded.extend(encode_pair(tok, q, x) for x in [" Answer: A", " Answer: the capital", " B"])
    encoded.extend(encode_pair(tok, w, x) for w in ["The", "Paris is", "A B"] for x in [" the", " capital"])
    return encoded


def test_packed_rows_see_only_their_own_tokens():
    """Every input in a packed row sees exactly its own tokens at its own positions, nothing of
    another input (a mask built the other way round: which tokens the last read position sees)."""
    from lens_heads.forward import packing
    from lens_heads.forward.engine import Row

    g = torch.Generator().manual_seed(0)
    rows = []
    for q in range(12):  # questions of 1-4 choices sharing a context, and inputs alone
        ctx = torch.randint(5, 50, (int(torch.randint(1, 12, (1,), generator=g)),), generator=g).tolist()
        for c in range(int(torch.randint(1, 5, (1,), generator=g))):
            cont = torch.randint(5, 50, (int(torch.randint(1, 6, (1,), generator=g)),), generator=g).tolist()
            rows.append(Row(ctx + cont + [c], len(rows), [(len(rows), cont + [c])]))
    rows.append(Row(list(range(5, 45)), len(rows), [(len(rows), [44])]))  # longer than the limit below
    units, apart = packing.units(*prefix_groups(rows, 2), 30)
    assert [r.ids for r in apart] == [list(range(5, 45))]
    assert any(u.prefix_len > 0 for u in units) and all(u.size <= 30 for u in units)
    length = max(u.size for u in units)
    bins = packing.bins(units, length)
    assert len(bins) < len(units) and all(sum(u.size for u in b) <= length for b in bins)
    p = packing.pack(bins, length, pad_id=0)
    assert sorted(id(r) for r in p.rows) == sorted(id(r) for r in rows[:-1])
    assert sum(u.size for u in units) < sum(len(r.ids) for r in rows[:-1])  # shared prefixes counted once
    assert bool(p.mask[:, 0].any(-1).all())  # no position sees nothing (padding sees itself)
    start = 0
    for row in p.rows:
        picked = p.pick[start:start + row.n_read]
        start += row.n_read
        b, last = int(picked[-1, 0]), int(p.keep[picked[-1, 1]])
        seen = p.mask[b, 0, last].nonzero()[:, 0]
        assert p.ids[b, seen].tolist() == row.ids
        assert p.positions[b, seen].tolist() == list(range(len(row.ids)))
        assert [int(p.keep[j]) for j in picked[:, 1]] == list(range(last - row.n_read + 1, last + 1))
        assert bool((picked[:, 0] == b).all())
    assert start == len(p.pick)
    assert int(p.tokens.sum()) == sum(u.size for u in units)


NOT_PACKED = ["bloom", "falcon", "opt", "gpt_neo"]  # ALiBi from the padding mask; attention that adds the mask


@pytest.mark.parametrize("arch", TINY_ARCHS + ["mistral"] + NOT_PACKED[1:])
def test_packed_loglikelihoods_equal_plain_path(arch, tiny_model, shared_data, monkeypatch):
    """Packed inputs (several to a row, a question's shared prefix once) score as the plain
    path does (to float rounding), on every architecture that packs (``PACKED_MODEL_TYPES``),
    Gemma 3 and Mistral only within their sliding windows; the others run unpacked."""
    from lens_heads.forward import packing
    from lens_heads.models.hooks import packed_length_limit

    model = tiny_model(arch)
    encoded = _packing_requests(model.tokenizer, shared_data)
    packed_rows = []
    real_pack = packing.pack

    def counting_pack(batch, length, pad_id):
        out = real_pack(batch, length, pad_id)
        packed_rows.append((len(out.rows), len(batch), length))
        return out

    monkeypatch.setattr(packing, "pack", counting_pack)
    plain = loglikelihoods_tokens(model, encoded, progress=False, reuse_prefix=False, last_only=False, batch_size=5)
    packed = loglikelihoods_tokens(model, encoded, progress=False, batch_size=5)
    unpacked = loglikelihoods_tokens(model, encoded, progress=False, batch_size=5, pack=False)
    limit = packed_length_limit(model)
    if arch in NOT_PACKED:
        assert limit is None and not packed_rows
    else:
        assert limit == {"gemma3": 8, "mistral": 64}.get(arch, 1 << 30)
        n_inputs = sum(n for n, _, _ in packed_rows)
        assert n_inputs >= 6 and n_inputs > sum(b for _, b, _ in packed_rows)  # several inputs to a row
    assert packed == pytest.approx(plain, abs=1e-4)
    assert unpacked == pytest.approx(plain, abs=1e-4)
    if arch in NOT_PACKED[1:]:  # were they packed, each input would see the others (or Falcon would fail)
        from lens_heads.models.hooks import PACKED_MODEL_TYPES

        monkeypatch.setattr("lens_heads.models.hooks.PACKED_MODEL_TYPES", PACKED_MODEL_TYPES | {model.hf_model.config.model_type})
        monkeypatch.setattr(model, "attention", "eager")  # OPT's own eager attention adds the mask
        try:
            forced = loglikelihoods_tokens(model, encoded, progress=False, batch_size=5)
        except Exception:  # noqa: BLE001 -- Falcon's ALiBi cannot read a 4-D mask
            forced = None
        assert forced is None or forced != pytest.approx(plain, abs=1e-4)


@pytest.mark.parametrize("arch", ["llama", "gpt2"])
def test_ablations_on_packed_rows(arch, tiny_model, shared_data, monkeypatch):
    """A static ablation zeroes its heads in packed rows as in plain ones; a random one draws
    per input, so its inputs are never packed."""
    from lens_heads.forward import packing
    from lens_heads.interventions.ablation import parse_ablation

    model = tiny_model(arch)
    encoded = _packing_requests(model.tokenizer, shared_data)
    calls = []
    real_pack = packing.pack
    monkeypatch.setattr(packing, "pack", lambda *a: calls.append(1) or real_pack(*a))
    static = parse_ablation("static:0.1,1.2", model.geometry)
    totals = {}
    with static.counting() as counts:
        plain = loglikelihoods_tokens(model, encoded, static, progress=False, reuse_prefix=False, last_only=False)
    totals["plain"] = counts.totals()
    with static.counting() as counts:  # a cached prefix's forward scores no input
        loglikelihoods_tokens(model, encoded, static, progress=False, pack=False, min_prefix=8)
    totals["cached"] = counts.totals()
    base = loglikelihoods_tokens(model, encoded, None, progress=False, pack=False)
    assert not calls
    with static.counting() as counts:
        packed = loglikelihoods_tokens(model, encoded, static, progress=False)
    totals["packed"] = counts.totals()
    assert calls
    g = model.geometry
    n_inputs = len(build_rows(model, encoded, list(range(len(encoded)))))
    assert set(totals.values()) == {(2 * n_inputs, n_inputs * g.n_layers * g.n_heads)}  # each input counted once
    assert packed == pytest.approx(plain, abs=1e-4)
    assert packed != pytest.approx(base, abs=1e-3)  # the ablation did something
    calls.clear()
    rnd = parse_ablation("random:0.3@1", model.geometry)
    loglikelihoods_tokens(model, encoded, rnd, progress=False)
    assert not calls


def test_packing_on_smollm2(smollm2, shared_data, monkeypatch):
    """The real model: PIQA and WinoGrande 5-shot packed score as padded rows do (fp32, to 1e-4),
    with the same predictions, in fewer positions."""
    from lens_heads.forward import packing

    positions = []
    real_pack = packing.pack
    monkeypatch.setattr(packing, "pack", lambda b, n, pad: positions.append(len(b) * n) or real_pack(b, n, pad))
    piqa, wino = load_task("piqa"), load_task("winogrande")
    for task, k, n in [(piqa, 0, 16), (wino, 5, 8)]:
        ids = [r.doc_id for r in task.records[:n]]
        positions.clear()
        packed = evaluate_task(smollm2, task, n_shot=k, doc_ids=ids, progress=False)
        assert positions
        plain = evaluate_task(smollm2, task, n_shot=k, doc_ids=ids, progress=False, reuse_prefix=False)
        for a, b in zip(packed.questions, plain.questions):
            assert a.lls == pytest.approx(b.lls, abs=1e-4)
            assert a.pred == b.pred
        reqs, keys, _ = task_requests(task, task.records[:n], k, DEFAULT_SEED)
        rows = build_rows(smollm2, [encode_pair(smollm2.tokenizer, c, x) for c, x in reqs], keys)
        assert sum(positions) < sum(len(r.ids) for r in rows)  # fewer than the inputs' own tokens


def test_single_token_choices_read_from_one_forward(tiny_model, shared_data):
    """MMLU's four letter continuations share one input row; each choice's ll equals the
    ll of scoring that choice alone (lm-eval's per-choice request)."""
    model = tiny_model("llama")
    mmlu = load_task("mmlu")
    rec = mmlu.records[0]
    ctx = mmlu.build(rec, 0)[0][0]
    # the tiny tokenizer has no " A" token: use the single-token continuations it has
    words = [" the", " capital", " is", " of", " Paris", " A", " B", " C", " D", " Answer"]
    reqs = [(ctx, w) for w in words if len(encode_pair(model.tokenizer, ctx, w)[1]) == 1]
    assert len(reqs) >= 3
    encoded = [encode_pair(model.tokenizer, c, x) for c, x in reqs]
    assert len(build_rows(model, encoded, list(range(len(reqs))))) == 1
    together = loglikelihoods(model, reqs, progress=False)
    alone = [loglikelihoods(model, [r], progress=False, last_only=False)[0] for r in reqs]
    assert together == pytest.approx(alone, abs=1e-5)


@pytest.mark.parametrize("arch", ["llama", "gpt2"])
def test_static_ablation_with_prefix_cache_equals_plain(arch, tiny_model, shared_data):
    from lens_heads.interventions.ablation import parse_ablation

    model = tiny_model(arch)
    wino = load_task("winogrande")
    recs = wino.records[:6]
    abl = parse_ablation("static:0.1,1.2", model.geometry)
    cached = evaluate_task(model, wino, n_shot=1, doc_ids=[r.doc_id for r in recs], ablation=abl,
                           progress=False, min_prefix=8)
    plain = evaluate_task(model, wino, n_shot=1, doc_ids=[r.doc_id for r in recs], ablation=abl,
                          progress=False, reuse_prefix=False, last_only=False)
    base = evaluate_task(model, wino, n_shot=1, doc_ids=[r.doc_id for r in recs], progress=False)
    for q1, q2, q0 in zip(cached.questions, plain.questions, base.questions):
        assert q1.lls == pytest.approx(q2.lls, abs=1e-4)
        assert q1.lls != pytest.approx(q0.lls, abs=1e-3)  # the ablation did something
    assert cached.zeroed_fraction == pytest.approx(2 / (model.geometry.n_layers * model.geometry.n_heads))


def test_random_ablation_independent_of_batching(tiny_model, shared_data):
    from lens_heads.interventions.ablation import parse_ablation

    model = tiny_model("qwen2")
    piqa = load_task("piqa")
    ids = short_piqa_ids(8)
    a = evaluate_task(model, piqa, doc_ids=ids, ablation=parse_ablation("random:0.3@7", model.geometry),
                      batch_size=3, progress=False)
    b = evaluate_task(model, piqa, doc_ids=ids[::-1], ablation=parse_ablation("random:0.3@7", model.geometry),
                      batch_size=16, progress=False)
    flat = lambda r: [x for q in r.questions for x in q.lls]  # noqa: E731
    assert flat(a) == pytest.approx(flat(b), abs=1e-4)
    assert 0.1 < a.zeroed_fraction < 0.5


def test_matches_lm_eval_hflm_on_tiny_model(tiny_model, hf_copies, shared_data):
    """Same requests through lm-eval's own HFLM on the same weights: same lls."""
    pytest.importorskip("lm_eval")
    from lm_eval.api.instance import Instance
    from lm_eval.models.huggingface import HFLM

    model = tiny_model("gpt2")
    lm = HFLM(pretrained=hf_copies("gpt2"), tokenizer=model.tokenizer, batch_size=4)
    reqs = []
    for task, recs, k in small_tasks(shared_data, 5):
        for rec in recs:
            reqs.extend(task.build(rec, k))
    inst = [Instance("loglikelihood", {}, r, i) for i, r in enumerate(reqs)]
    theirs = [ll for ll, _ in lm.loglikelihood(inst, disable_tqdm=True)]
    ours = loglikelihoods(model, reqs, progress=False)
    assert ours == pytest.approx(theirs, abs=1e-4)


# -----------------------------------------------------------------------------
# Tasks, limits, results


def test_evaluate_task_metrics_and_records(tiny_model, shared_data):
    model = tiny_model("llama")
    piqa = load_task("piqa")
    res = evaluate_task(model, piqa, limit=10, seed=5, doc_ids=short_piqa_ids(30), progress=False)
    assert len(res.questions) == 10 and res.n_shot == 0
    for q in res.questions:
        rec = piqa.records[q.doc_id]
        assert q.gold == rec.gold and len(q.lls) == 2
        assert q.pred == max(range(2), key=lambda j: q.lls[j])
        norm = [ll / len(c) for ll, c in zip(q.lls, rec.choices)]
        assert q.pred_norm == max(range(2), key=lambda j: norm[j])
        assert piqa.score(rec, q.lls) == {"acc": float(q.correct), "acc_norm": float(q.pred_norm == q.gold)}
    assert res.metrics["acc"] == pytest.approx(sum(q.correct for q in res.questions) / 10)
    assert "acc_norm" in res.metrics


def test_stratified_limit(shared_data):
    mmlu = load_task("mmlu")
    a = select_records(mmlu, 300, seed=1)
    assert len(a) == 300 and [r.doc_id for r in a] == sorted(r.doc_id for r in a)
    assert select_records(mmlu, 300, seed=1) == a and select_records(mmlu, 300, seed=2) != a
    sizes = Counter(r.subject for r in mmlu.records)
    got = Counter(r.subject for r in a)
    for subject, n in sizes.items():  # proportional allocation, rounded
        assert abs(got[subject] - 300 * n / len(mmlu.records)) < 1
    piqa = load_task("piqa")
    b = select_records(piqa, 101, seed=0)
    golds = Counter(r.gold for r in b)
    full = Counter(r.gold for r in piqa.records)
    assert abs(golds[0] - 101 * full[0] / len(piqa.records)) < 1
    assert select_records(piqa, None) == piqa.records


def test_generic_file_task(tmp_path, tiny_model, hf_copies):
    rows = [{"q": f"Which is bigger, {a} or {b}?", "opts": [str(a), str(b)], "ans": int(b > a)}
            for a, b in [(3, 5), (9, 2), (7, 8), (1, 4), (6, 0)]]
    path = tmp_path / "mc.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    model = tiny_model("llama")
    res = evaluate_task(model, f"file:{path}?question=q&choices=opts&answer=ans&prompt=Q: {{q}}\\nA:",
                        progress=False)
    assert [q.gold for q in res.questions] == [r["ans"] for r in rows]
    hf = hf_copies("llama")
    for q, r in zip(res.questions, rows):
        ref = [naive_loglikelihood(hf, model.tokenizer, f"Q: {r['q']}\nA:", " " + o) for o in r["opts"]]
        assert q.lls == pytest.approx(ref, abs=1e-4)


def test_task_inputs_are_the_model_inputs(tiny_model, shared_data):
    model = tiny_model("llama")
    inputs = task_inputs(model, "mmlu", n_shot=0, limit=4, seed=1)
    mmlu = load_task("mmlu")
    expected = set()
    for rec in select_records(mmlu, 4, 1):
        for c, x in mmlu.build(rec, 0):
            ctx, cont = encode_pair(model.tokenizer, c, x)
            expected.add(tuple((ctx + cont)[-257:][:-1]))  # lm-eval's model input
    assert sorted(tuple(x.tolist()) for x in inputs) == sorted(expected)
    assert len(inputs) < 16  # choices sharing an input are run once


@pytest.mark.parametrize("protocol", [None, "paper"])
def test_a_percentage_ablation_calibrates_on_the_questions_it_evaluates(tiny_model, shared_data, protocol):
    """score:ID@P% through evaluate_task == the explicit threshold that zeroes P % of the pooled
    unablated scores of exactly those questions' inputs (calibrated here by hand, independently)."""
    from lens_heads.evaluation.protocol import paper_protocol
    from lens_heads.interventions.ablation import parse_ablation
    from lens_heads.interventions.specs import ScoreThreshold
    from lens_heads.scores import SCORES, score_heads

    model = tiny_model("gemma3")
    proto = paper_protocol(model) if protocol else None
    strict = proto is not None and proto.strict
    abl = parse_ablation("score:ahon_ln@30%", model.geometry)
    got = evaluate_task(model, "piqa", limit=6, seed=2, ablation=abl, progress=False, protocol=proto)

    pooled = score_heads(model, task_inputs(model, "piqa", limit=6, seed=2, protocol=proto), scores=["ahon_ln"],
                         batch_size=8, keep_per_input=True, progress=False).per_input["ahon_ln"].flatten()
    assert SCORES["ahon_ln"].inactive_when == "low"
    if strict:  # the authors' CDF rule: zero strictly below the threshold
        assert abl.calibrated == ScoreThreshold("ahon_ln", abl.threshold, True)
        assert 0.25 <= float((pooled < abl.threshold).float().mean()) <= 0.31
    else:  # the order statistic: the smallest 30 % of the pooled scores, the threshold inclusive
        k = math.ceil(0.3 * pooled.numel() - 1e-9)
        assert abl.threshold == pytest.approx(float(pooled.sort().values[k - 1]))
        assert abl.calibrated == ScoreThreshold("ahon_ln", abl.threshold, False)
    fixed = evaluate_task(model, "piqa", limit=6, seed=2, ablation=parse_ablation(str(abl.calibrated), model.geometry),
                          progress=False, protocol=proto)
    assert [q.lls for q in got.questions] == [q.lls for q in fixed.questions]
    assert got.zeroed_fraction == pytest.approx(fixed.zeroed_fraction) and got.zeroed_fraction > 0.05
    assert got.config["ablation"] == "score:ahon_ln@30%" and got.config["calibrated"] == str(abl.calibrated)

    other = evaluate_task(model, "piqa", limit=3, seed=5, ablation=abl, progress=False, protocol=proto)
    assert abl._calibrated_on[2] == tuple(q.doc_id for q in other.questions)  # calibrated again on the new ones
    none = parse_ablation("score:ahon_ln@0%", model.geometry)
    plain = evaluate_task(model, "piqa", limit=3, seed=5, progress=False, protocol=proto)
    at0 = evaluate_task(model, "piqa", limit=3, seed=5, ablation=none, progress=False, protocol=proto)
    assert none.threshold is None and at0.zeroed_fraction == 0.0
    assert [q.lls for q in at0.questions] == [q.lls for q in plain.questions]


def test_perplexity_matches_naive(tiny_model, hf_copies):
    model, hf = tiny_model("llama"), hf_copies("llama")
    texts = ["The capital of France is Paris.", "Dormant heads attend to the first token a lot.",
             "A B C D"]
    inputs = [torch.tensor(model.tokenizer(t)["input_ids"]) for t in texts]
    nll, n = 0.0, 0
    for x in inputs:
        with torch.no_grad():
            logp = torch.log_softmax(hf(x[None]).logits.float(), -1)[0]
        nll -= sum(logp[t - 1, x[t]].item() for t in range(1, len(x)))
        n += len(x) - 1
    assert perplexity(model, inputs, batch_size=2) == pytest.approx(math.exp(nll / n), rel=1e-5)


def test_bad_inputs(tiny_model, tmp_path):
    with pytest.raises(LensHeadsError, match="limit"):
        select_records(load_task("piqa"), 0)
    with pytest.raises(LensHeadsError, match="doc_id"):
        evaluate_task(tiny_model("llama"), "piqa", doc_ids=[10**7], progress=False)
    with pytest.raises(LensHeadsError):
        loglikelihoods(tiny_model("llama"), [("a", "b")], batch_size=0)


# -----------------------------------------------------------------------------
# CLI


def test_cli_writes_jsonl(tiny_model_dir, tmp_path, shared_data, capsys):
    from lens_heads.cli import main

    piqa = load_task("piqa")
    data = tmp_path / "data"
    data.mkdir()
    (data / "p.jsonl").write_text("".join(json.dumps(piqa.records[i].raw) + "\n" for i in short_piqa_ids(6)))
    out = tmp_path / "res.jsonl"
    task = f"file:{data / 'p.jsonl'}?question=goal&choices=sol1,sol2&answer=label&prompt=Question: {{goal}}\\nAnswer:"
    rc = main(["evaluate", str(tiny_model_dir("llama")), "--task", task, "--limit", "6",
               "--out", str(out), "--quiet", "--ablate", "static:0.1"])
    assert rc == 0
    printed = capsys.readouterr().out
    assert "acc" in printed and "acc_norm" in printed and "zeroed" in printed
    lines = [json.loads(x) for x in out.read_text().splitlines()]
    assert len(lines) == 6
    golds = [piqa.records[i].gold for i in short_piqa_ids(6)]
    for row in lines:
        assert {"doc_id", "pred", "gold", "correct", "lls", "subject"} <= set(row)
        assert row["gold"] == golds[row["doc_id"]]
        assert row["correct"] == (row["pred"] == row["gold"])
    # no temp files left; the sidecar names what computed the results
    assert sorted(p.name for p in tmp_path.iterdir()) == ["data", "res.jsonl", "res.jsonl.meta.json"]


@pytest.mark.parametrize("task, message", [
    ("no_such_task", "no_such_task"),
    ("file:{empty}", "empty"),
    ("file:{missing}", "not found"),
])
def test_cli_bad_task(task, message, tiny_model_dir, tmp_path, capsys):
    from lens_heads.cli import main

    empty = tmp_path / "empty.jsonl"
    empty.write_text("")
    task = task.format(empty=empty, missing=tmp_path / "missing.jsonl")
    out = tmp_path / "out.jsonl"
    rc = main(["evaluate", str(tiny_model_dir("llama")), "--task", task, "--out", str(out), "--quiet"])
    err = capsys.readouterr().err
    assert rc != 0
    assert message in err and len(err.strip().splitlines()) == 1
    assert not out.exists() and sorted(p.name for p in tmp_path.iterdir()) == ["empty.jsonl"]


def test_cli_bad_ablation(tiny_model_dir, tmp_path, capsys):
    from lens_heads.cli import main

    out = tmp_path / "out.jsonl"
    rc = main(["evaluate", str(tiny_model_dir("llama")), "--task", "mmlu", "--n-shot", "0", "--limit", "2",
               "--ablate", "static:9.9", "--out", str(out), "--quiet"])
    assert rc == 2 and not out.exists()
    assert len(capsys.readouterr().err.strip().splitlines()) == 1


# -----------------------------------------------------------------------------
# Exactness against lm-evaluation-harness (slow: SmolLM2, >= 200 questions per task)


def _lm_eval_configs(folder, shared_data, mmlu_records):
    """Task YAMLs for lm-eval over local files, mirroring lm-eval's own configs.

    MMLU: one task per subject, fields copied from lm-eval's ``mmlu/default`` YAMLs, only the
    dataset swapped for local JSON (the selected test items + the subject's dev file).
    PIQA: lm-eval's piqa.yaml with local validation rows (labels merged).
    WinoGrande: lm-eval's default.yaml + its preprocess_winogrande.py, its ``train`` split (the
    few-shot pool) pointed at the validation file itself, the offline pool lens_heads uses
    (the configuration tests/test_data.py checks prompt by prompt for all 1,267 items).
    """
    import csv
    import os
    import shutil

    import lm_eval
    import yaml

    tasks_dir = os.path.join(os.path.dirname(lm_eval.__file__), "tasks")
    with open(os.path.join(tasks_dir, "mmlu/default/_default_template_yaml")) as f:
        template = yaml.safe_load(f)
    names = []
    by_subject: dict[str, list] = {}
    for r in mmlu_records:
        by_subject.setdefault(r.subject, []).append(r)
    for subject, recs in by_subject.items():
        with open(os.path.join(tasks_dir, f"mmlu/default/mmlu_{subject}.yaml")) as f:
            sub = yaml.safe_load(f)
        test = folder / f"mmlu_{subject}_test.jsonl"
        test.write_text("".join(json.dumps(r.raw) + "\n" for r in recs))
        dev = folder / f"mmlu_{subject}_dev.jsonl"
        with open(shared_data / f"mmlu/dev/{subject}_dev.csv", newline="", encoding="utf-8") as f:
            rows = [{"question": r["question"], "subject": subject, "choices": [r[f"choice{i}"] for i in range(4)],
                     "answer": int(r["answer"])} for r in csv.DictReader(f)]
        dev.write_text("".join(json.dumps(r) + "\n" for r in rows))
        cfg = {k: v for k, v in template.items() if k not in ("dataset_path",)}
        cfg.update(task=f"lh_mmlu_{subject}", dataset_path="json", description=sub["description"],
                   dataset_kwargs={"data_files": {"test": str(test), "dev": str(dev)}})
        (folder / f"lh_mmlu_{subject}.yaml").write_text(yaml.safe_dump(cfg))
        names.append(f"lh_mmlu_{subject}")

    piqa = load_task("piqa")
    pfile = folder / "piqa_valid.jsonl"
    pfile.write_text("".join(json.dumps(r.raw) + "\n" for r in piqa.records))
    with open(os.path.join(tasks_dir, "piqa/piqa.yaml")) as f:
        cfg = yaml.safe_load(f)
    cfg.update(task="lh_piqa", dataset_path="json", dataset_name=None, training_split=None,
               dataset_kwargs={"data_files": {"validation": str(pfile)}})
    (folder / "lh_piqa.yaml").write_text(yaml.safe_dump(cfg))

    shutil.copy(os.path.join(tasks_dir, "winogrande/preprocess_winogrande.py"), folder)
    text = open(os.path.join(tasks_dir, "winogrande/default.yaml")).read()
    text = text.replace("task: winogrande", "task: lh_winogrande")
    text = text.replace("dataset_path: allenai/winogrande", "dataset_path: json")
    text = text.replace("dataset_name: winogrande_xl", "dataset_name: null")
    wg = shared_data / "winogrande/dev.jsonl"
    text += f"dataset_kwargs:\n  data_files:\n    train: {wg}\n    validation: {wg}\n"
    (folder / "lh_winogrande.yaml").write_text(text)
    return names


N_PARITY = 200


def _mmlu_parity_records(model):
    """A stratified sample of N_PARITY MMLU questions whose 5-shot prompt fits in 1,024 tokens:
    the long subjects (history, law: up to ~4k tokens) cost lm-eval's eager attention ~5 min per
    batch of 4 on this project's 2-core CPUs."""
    mmlu = load_task("mmlu")
    pool = select_records(mmlu, 3 * N_PARITY, seed=1234)
    short = [r for r in pool if len(model.tokenizer(mmlu.build(r, 5)[0][0])["input_ids"]) <= 1024]
    recs = sorted(random.Random(0).sample(short, N_PARITY), key=lambda r: r.doc_id)
    assert len({r.subject for r in recs}) >= 40
    return mmlu, recs


@pytest.fixture(scope="module")
def lm_eval_parity(smollm2, shared_data, tmp_path_factory):
    """lm-eval's HFLM on SmolLM2's weights, local task YAMLs, and a runner returning per-doc samples."""
    pytest.importorskip("lm_eval")
    from lm_eval import simple_evaluate
    from lm_eval.models.huggingface import HFLM
    from lm_eval.tasks import TaskManager

    folder = tmp_path_factory.mktemp("lm_eval_parity")
    mmlu, recs = _mmlu_parity_records(smollm2)
    _lm_eval_configs(folder, shared_data, recs)
    lm = HFLM(pretrained=smollm2.load_hf_model(), tokenizer=smollm2.tokenizer, batch_size=4)
    tm = TaskManager(include_path=str(folder))

    def theirs(tasks, k, limit=None):
        out = simple_evaluate(model=lm, tasks=tasks, num_fewshot=k, limit=limit, task_manager=tm,
                              log_samples=True, bootstrap_iters=0, fewshot_random_seed=1234,
                              random_seed=0, numpy_random_seed=0, torch_random_seed=0)
        return out["samples"]

    return theirs, mmlu, recs


def _compare_with_lm_eval(name, ours, samples_by_doc, acc_norm=False):
    """Per question: same prediction, same acc (and acc_norm); returns max |delta log-likelihood|."""
    assert len(samples_by_doc) == len(ours.questions)
    dll, same, same_norm = 0.0, 0, 0
    for q, s in zip(ours.questions, samples_by_doc):
        lls = [float(x[0]) for x in s["filtered_resps"]]
        dll = max(dll, max(abs(a - b) for a, b in zip(q.lls, lls)))
        same += lls.index(max(lls)) == q.pred  # first maximum, as numpy.argmax in lm-eval
        same_norm += acc_norm and float(s["acc_norm"]) == float(q.pred_norm == q.gold)
        assert float(s["acc"]) == float(q.correct), (name, q.doc_id, q.lls, lls)
    print(f"lm-eval parity {name}: {len(ours.questions)} questions, {same} same predictions"
          + (f", {same_norm} same acc_norm" if acc_norm else "") + f", max |dll| {dll:.2e}")
    assert same == len(ours.questions)
    if acc_norm:
        assert same_norm == len(ours.questions)
    return dll


@pytest.mark.slow
def test_mmlu_5shot_predictions_identical_to_lm_eval(smollm2, lm_eval_parity):
    theirs, mmlu, recs = lm_eval_parity
    samples = theirs([f"lh_mmlu_{s}" for s in sorted({r.subject for r in recs})], 5)  # one task per subject
    ordered = [x for s in sorted({r.subject for r in recs})
               for x in sorted(samples[f"lh_mmlu_{s}"], key=lambda x: x["doc_id"])]
    ours = evaluate_task(smollm2, mmlu, n_shot=5, doc_ids=[r.doc_id for r in recs], progress=False)
    assert _compare_with_lm_eval("mmlu", ours, ordered) < 1e-3


@pytest.mark.slow
def test_piqa_predictions_identical_to_lm_eval(smollm2, lm_eval_parity):
    # lm-eval's --limit is a prefix, so the first N items
    samples = lm_eval_parity[0](["lh_piqa"], 0, N_PARITY)
    ours = evaluate_task(smollm2, "piqa", n_shot=0, doc_ids=range(N_PARITY), progress=False)
    assert _compare_with_lm_eval("piqa", ours, sorted(samples["lh_piqa"], key=lambda x: x["doc_id"]), True) < 1e-3


@pytest.mark.slow
def test_winogrande_5shot_predictions_identical_to_lm_eval(smollm2, lm_eval_parity):
    samples = lm_eval_parity[0](["lh_winogrande"], 5, N_PARITY)
    ours = evaluate_task(smollm2, "winogrande", n_shot=5, doc_ids=range(N_PARITY), progress=False)
    assert _compare_with_lm_eval("winogrande", ours, sorted(samples["lh_winogrande"], key=lambda x: x["doc_id"])) < 1e-3
