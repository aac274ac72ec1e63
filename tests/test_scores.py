"""Head scores: every function against an independent naive computation, padding, GQA,
layer normalisation, upstream ablation, bad input, files and the CLI.

The reference never touches lens_heads' scoring code or geometry: it runs a plain HF model
(eager attention, ``output_attentions=True``), hooks the value projection's output and the
output projection's input with HF's own module layout written out below, and computes each
score with explicit Python loops, one input at a time (no padding).
"""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
import torch

from conftest import TINY_ARCHS
from lens_heads import LensHeadsError
from lens_heads.data import pad_batch
from lens_heads.models.hooks import run_with_hooks
from lens_heads.scores.functions import input_level
from lens_heads.scores import (SCORES, HeadScores, ScoreCollector, register_score, resolve_score_ids,
                               score_heads)

ALL = input_level()  # every score read from one forward's hooks (question-level ones: test_attribution)
TEXTS = ["The capital of France is Paris.", "Attention heads that do nothing", "A",
         "Question: How do I boil an egg? Answer: put it in boiling water. The capital of Italy is Rome.",
         "dormant heads"]

# HF module layout per model family, written here independently of lens_heads.models.geometry:
# (blocks path, attention attr, value module, output module, how to read V from the module output)
LAYOUT = {
    "llama": ("model.layers", "self_attn", "v_proj", "o_proj", "separate"),
    "qwen2": ("model.layers", "self_attn", "v_proj", "o_proj", "separate"),
    "olmo2": ("model.layers", "self_attn", "v_proj", "o_proj", "separate"),
    "gemma3": ("model.layers", "self_attn", "v_proj", "o_proj", "separate"),
    "bloom": ("transformer.h", "self_attention", "query_key_value", "dense", "bloom_fused"),
    "gpt2": ("transformer.h", "attn", "c_attn", "c_proj", "gpt2_fused"),
    "qwen3": ("model.layers", "self_attn", "v_proj", "o_proj", "separate"),
    "phi3": ("model.layers", "self_attn", "qkv_proj", "o_proj", "phi3_fused"),
    "gpt_neox": ("gpt_neox.layers", "attention", "query_key_value", "dense", "bloom_fused"),  # [head, (q,k,v), d]
}


def _get(obj, path):
    for part in path.split("."):
        obj = getattr(obj, part)
    return obj


def naive_scores(hf, family: str, ids: list[int], zero_heads: dict[int, list[int]] | None = None) -> dict:
    """Every score of every head on one input, with explicit loops. Returns {id: [layer][head]}.

    ``zero_heads``: {layer: [head, ...]} zeroed at the output projection's input (ablation).
    """
    blocks_path, attn_attr, v_name, o_name, v_layout = LAYOUT[family]
    blocks = _get(hf, blocks_path)
    cfg = hf.config
    H = getattr(cfg, "num_attention_heads", None) or cfg.n_head
    values, z_in, handles = {}, {}, []
    for L, block in enumerate(blocks):
        attn = getattr(block, attn_attr)

        def save_v(mod, args, out, L=L):
            values[L] = out[0].detach().clone()  # [T, features]

        def save_z(mod, args, L=L):
            x = args[0]
            z_in[L] = x[0].detach().clone()  # [T, H*d], scores see the unmodified z
            if zero_heads and L in zero_heads:
                d = x.shape[-1] // H
                x = x.clone()
                for h in zero_heads[L]:
                    x[..., h * d:(h + 1) * d] = 0
            return (x,) + tuple(args[1:])

        handles.append(getattr(attn, v_name).register_forward_hook(save_v))
        handles.append(getattr(attn, o_name).register_forward_pre_hook(save_z))
    try:
        with torch.no_grad():
            out = hf(torch.tensor([ids]), output_attentions=True)
    finally:
        for h in handles:
            h.remove()
    T = len(ids)
    res = {s: [] for s in ALL}
    for L, block in enumerate(blocks):
        A = out.attentions[L][0]  # [H, T, T]
        zl = z_in[L]
        d = zl.shape[-1] // H
        v_raw = values[L]
        if v_layout == "separate":
            n_kv = v_raw.shape[-1] // d
            V = v_raw.view(T, n_kv, d)
        elif v_layout == "bloom_fused":  # HF BLOOM, GPT-NeoX: features viewed as [head, (q, k, v), d]
            n_kv = H
            V = v_raw.view(T, H, 3, d)[:, :, 2, :]
        elif v_layout == "phi3_fused":  # HF Phi-3: [q (H*d) | k (KV*d) | v (KV*d)]
            n_kv = cfg.num_key_value_heads
            V = v_raw[:, H * d + n_kv * d:].reshape(T, n_kv, d)
        else:  # HF GPT-2: [q | k | v] blocks of width H*d, each head-major
            n_kv = H
            V = v_raw[:, 2 * H * d:].reshape(T, H, d)
        Wo = getattr(getattr(block, attn_attr), o_name).weight
        row = {s: [] for s in ALL}
        for h in range(H):
            kv = h // (H // n_kv)  # HF repeat_kv: query head h reads KV head h // group
            awft = sum(A[h, t, 0].item() for t in range(T)) / T
            ent = 0.0
            for t in range(T):
                ent += -sum(a * math.log(a) for a in A[h, t, : t + 1].tolist() if a > 0)
            aeqd = ent / T
            ftvvn = torch.linalg.norm(V[0, kv]).item()
            avvn = sum(torch.linalg.norm(V[j, kv]).item() for j in range(T)) / T
            O = [zl[t, h * d:(h + 1) * d] for t in range(T)]
            lthon = torch.linalg.norm(O[T - 1]).item()
            ahon = sum(torch.linalg.norm(o).item() for o in O) / T
            if v_layout == "gpt2_fused":  # Conv1D weight [in, out]
                w_h = Wo[h * d:(h + 1) * d, :]
                fhon = sum(torch.linalg.norm(o @ w_h).item() for o in O) / T
            else:  # Linear weight [out, in]
                w_h = Wo[:, h * d:(h + 1) * d]
                fhon = sum(torch.linalg.norm(w_h @ o).item() for o in O) / T
            for k, v in dict(awft=awft, aeqd=aeqd, ftvvn=ftvvn, avvn=avvn, lthon=lthon, ahon=ahon,
                             fhon=fhon, lthon_hn=lthon / ahon if ahon else float("nan")).items():
                row[k].append(v)
        # <id>_ln: over the layer's mean of the same score; lthon_ln (the authors' code) over the
        # layer's mean of ahon; lthon_ln_text (the paper text's reading) over that of lthon
        for name, k, denom in [(f"{k}_ln", k, k) for k in ("awft", "aeqd", "ftvvn", "avvn", "ahon", "fhon")] + [
                ("lthon_ln", "lthon", "ahon"), ("lthon_ln_text", "lthon", "lthon")]:
            layer_mean = sum(row[denom]) / H  # 0 for aeqd on one token: undefined (NaN)
            row[name] = [x / layer_mean if layer_mean else float("nan") for x in row[k]]
        for k in ALL:
            res[k].append(row[k])
    return res


def _hf(model_dir):
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(model_dir, attn_implementation="eager",
                                                dtype=torch.float32).eval()


def _close(got, want, what=""):
    torch.testing.assert_close(torch.as_tensor(got, dtype=torch.float64),
                               torch.as_tensor(want, dtype=torch.float64),
                               rtol=1e-4, atol=1e-6, equal_nan=True, msg=lambda m: f"{what}: {m}")


@pytest.mark.parametrize("arch", TINY_ARCHS)
def test_every_score_matches_naive(arch, tiny_model, tiny_model_dir):
    model = tiny_model(arch)
    seqs = model.to_tokens(TEXTS) + [torch.tensor([5, 9]), torch.tensor([6])]  # lengths vary, 1 and 2 too
    hs = score_heads(model, seqs, scores="all", batch_size=3, keep_per_input=True, progress=False)
    hf = _hf(tiny_model_dir(arch))
    naive = [naive_scores(hf, arch, s.tolist()) for s in seqs]
    for s in ALL:
        want = torch.tensor([n[s] for n in naive], dtype=torch.float64)  # [input, layer, head]
        _close(hs.per_input[s], want, f"{arch} {s} per input")
        w = want.numpy()  # dataset level: over the inputs where the score is defined
        _close(hs.mean[s], np.nanmean(w, 0), f"{arch} {s} mean")
        _close(hs.std[s], np.nanstd(w, 0, ddof=1), f"{arch} {s} std")
        assert torch.equal(hs.count[s], torch.as_tensor((~np.isnan(w)).sum(0)))
        assert hs.per_input[s].dtype == torch.float32
    assert hs.n == len(seqs)


def _few_shot_like(model, n_prefix: int = 90) -> list[torch.Tensor]:
    """Inputs as a few-shot task makes them: two groups, each a long shared prefix and suffixes
    of 1..6 tokens, plus two inputs that share nothing (one shorter than the prefixes)."""
    g = torch.Generator().manual_seed(3)
    vocab = model.hf_model.config.vocab_size
    out = []
    for group in range(2):
        prefix = torch.randint(5, vocab, (n_prefix + 7 * group,), generator=g)
        out += [torch.cat([prefix, torch.randint(5, vocab, (k,), generator=g)]) for k in (1, 3, 6, 2)]
    return out + [torch.randint(5, vocab, (n_prefix + 3,), generator=g), torch.randint(5, vocab, (9,), generator=g)]


@pytest.mark.parametrize("arch", TINY_ARCHS)
def test_a_shared_prefix_runs_once_and_every_input_keeps_its_own_scores(arch, tiny_model, tiny_model_dir,
                                                                         monkeypatch):
    """A prefix shared by several inputs runs once, its keys/values and per-position quantities
    cached; each input's scores still equal the naive loop over that whole input alone, and the
    pass without sharing. The forwards read fewer positions than the inputs hold."""
    from lens_heads.forward import engine
    from lens_heads.scores import pass_prefixes, shared_prefix

    model = tiny_model(arch)
    seqs = _few_shot_like(model)
    assert engine.shared_prefixes(seqs) == [90] * 4 + [97] * 4 + [0, 0]
    assert pass_prefixes(model, seqs) == ([0] * 10 if arch == "gemma3" else [90] * 4 + [97] * 4 + [0, 0])
    pair = [seqs[0], seqs[1], seqs[4], seqs[5]]  # two inputs of a 90-token prefix save too little to share it
    assert engine.shared_prefixes(pair) == [90, 90, 97, 97] and pass_prefixes(model, pair) == [0] * 4
    positions = []
    real_forward = shared_prefix.forward

    def counting(model_, ids, mask, *args, **kwargs):
        positions.append(ids.shape[0] * ids.shape[1])
        return real_forward(model_, ids, mask, *args, **kwargs)

    monkeypatch.setattr(shared_prefix, "forward", counting)
    hs = score_heads(model, seqs, scores="all", batch_size=3, keep_per_input=True, progress=False)
    shared_positions, positions[:] = sum(positions), []
    whole = score_heads(model, seqs, scores="all", batch_size=3, keep_per_input=True, progress=False,
                        shared_prefix=False)
    if arch == "gemma3":  # a sliding window of 8 tokens: every input is longer and runs whole
        assert shared_positions == sum(positions)
    else:
        assert shared_positions < 0.6 * sum(positions)  # each prefix once (plus padding) instead of 4 times
    hf = _hf(tiny_model_dir(arch))
    naive = [naive_scores(hf, arch, s.tolist()) for s in seqs]
    for s in ALL:
        want = torch.tensor([n[s] for n in naive], dtype=torch.float64)
        _close(hs.per_input[s], want, f"{arch} {s} shared prefix vs naive")
        _close(hs.per_input[s], whole.per_input[s], f"{arch} {s} shared prefix vs whole inputs")
    # a scoring shard (whole batches of the pass) with its part of the pass's prefix lengths: the
    # pass's values bit for bit, so merged shards still equal the unsharded pass
    from lens_heads.interventions.thresholds import scoring_shards
    from lens_heads.sweep.units import batch_floor

    part = scoring_shards(seqs, 3, 2, batch_floor(model), pass_prefixes(model, seqs))[1]
    assert len(part) >= 3
    sub = score_heads(model, [seqs[i] for i in part], scores="all", batch_size=3, keep_per_input=True,
                      progress=False, shared_prefix=[pass_prefixes(model, seqs)[i] for i in part])
    for s in ALL:
        torch.testing.assert_close(sub.per_input[s], hs.per_input[s][part], rtol=0, atol=0, equal_nan=True,
                                   msg=lambda m, s=s: f"{arch} {s}: {m}")


def test_shared_prefix_lengths_are_checked(tiny_model):
    model = tiny_model("llama")
    seqs = [torch.tensor([5, 6, 7]), torch.tensor([5, 6])]
    for bad in ([1], [3, 0], [-1, 0], [1.0, 0], [True, 0]):
        with pytest.raises(LensHeadsError, match="shared_prefix: one length per input"):
            score_heads(model, seqs, progress=False, shared_prefix=bad)


def test_smollm2_matches_naive(smollm2):
    seqs = smollm2.to_tokens(["The capital of France is Paris, and", "Dormant heads"])
    hs = score_heads(smollm2, seqs, batch_size=2, keep_per_input=True, progress=False)
    hf = smollm2.load_hf_model().float().eval()  # plain, unwrapped HF model
    naive = [naive_scores(hf, "llama", s.tolist()) for s in seqs]
    for s in ALL:
        want = torch.tensor([n[s] for n in naive], dtype=torch.float64)
        _close(hs.per_input[s], want, f"smollm2 {s}")


@pytest.mark.parametrize("arch", ["llama", "bloom"])
def test_padding_left_right_equals_one_by_one(arch, tiny_model):
    model = tiny_model(arch)
    seqs = model.to_tokens(TEXTS)
    col = ScoreCollector(model, ALL)

    def run(batch, side):
        ids, mask = pad_batch(batch, 3, side)
        run_with_hooks(model, ids, mask, col.hooks(mask), return_logits=False)
        return {k: v.clone() for k, v in col.batch_scores().items()}

    singles = [run([s], "right") for s in seqs]
    for side in ("left", "right"):
        batched = run(seqs, side)
        for s in ALL:
            _close(batched[s], torch.cat([one[s] for one in singles]), f"{arch} {side} {s}")
            one_token = torch.tensor([len(x) == 1 for x in seqs])  # "A": aeqd_ln = 0 / 0
            expect_nan = one_token[:, None, None] & (s == "aeqd_ln")
            assert torch.equal(torch.isnan(batched[s]), expect_nan.expand_as(batched[s]))


def test_gqa_values_repeat_over_group(tiny_model):
    model = tiny_model("llama")  # 4 query heads, 2 KV heads
    hs = score_heads(model, model.to_tokens(TEXTS), scores="ftvvn,avvn,ahon", keep_per_input=True,
                     progress=False)
    for s in ("ftvvn", "avvn"):
        x = hs.per_input[s]
        assert torch.equal(x[..., 0], x[..., 1]) and torch.equal(x[..., 2], x[..., 3])
        assert not torch.allclose(x[..., 1], x[..., 2])  # different KV heads differ
    assert not torch.allclose(hs.per_input["ahon"][..., 0], hs.per_input["ahon"][..., 1])
    gemma = score_heads(tiny_model("gemma3"), TEXTS[:2], scores="ftvvn", keep_per_input=True,
                        progress=False).per_input["ftvvn"]  # one KV head for all 4
    assert torch.equal(gemma, gemma[..., :1].expand_as(gemma))


def test_layer_normalised_mean_is_one(tiny_model):
    """Every ``_ln`` but LTHON(LN) divides by its own layer mean (unchanged by the authors'-code
    fix); ``lthon_ln`` divides by the layer mean of ``ahon``, ``lthon_ln_text`` by that of lthon."""
    texts = [t for t in TEXTS if len(t) > 1]  # one token: aeqd_ln undefined (tested elsewhere)
    hs = score_heads(tiny_model("qwen2"), texts, keep_per_input=True, progress=False)
    own = [s for s in ALL if s.endswith("_ln") and s != "lthon_ln"]
    assert sorted(own) == ["aeqd_ln", "ahon_ln", "avvn_ln", "awft_ln", "fhon_ln", "ftvvn_ln"]
    for s in own + ["lthon_ln_text"]:
        base = hs.per_input[s.removesuffix("_text")[:-3]]
        _close(hs.per_input[s].double().mean(-1), torch.ones(len(texts), 2), s)
        _close(hs.per_input[s], base / base.mean(-1, keepdim=True), s)
    lthon, ahon = hs.per_input["lthon"], hs.per_input["ahon"]
    _close(hs.per_input["lthon_ln"], lthon / ahon.mean(-1, keepdim=True), "lthon_ln")
    assert not torch.allclose(hs.per_input["lthon_ln"], hs.per_input["lthon_ln_text"])  # the two readings differ


def test_short_inputs(tiny_model):
    model = tiny_model("gpt2")
    hs = score_heads(model, [torch.tensor([7]), torch.tensor([7, 8])], keep_per_input=True, progress=False)
    p = hs.per_input
    one = {s: p[s][0] for s in ALL}
    _close(one["awft"], torch.ones(2, 4))
    _close(one["aeqd"], torch.zeros(2, 4))
    _close(one["lthon"], one["ahon"])
    _close(one["ftvvn"], one["avvn"])
    _close(one["lthon_hn"], torch.ones(2, 4))
    assert (p["awft"][1] < 1).all() and (p["awft"][1] >= 0.0).all()  # 2 tokens: row 0 has A=1
    assert (p["aeqd"][1] > 0).all() and (p["aeqd"][1] <= math.log(2) / 2 + 1e-6).all()


def test_z_transform_sees_scores_and_ablates_downstream(tiny_model, tiny_model_dir):
    """Zeroing layer 0 head 1 in the transform: layer 0 scores unchanged, layer 1 scores equal
    a naive HF run with that head zeroed at o_proj's input."""
    model = tiny_model("llama")
    seqs = model.to_tokens(TEXTS[:3])
    col = ScoreCollector(model, ["ahon_ln", "awft"])
    seen = []

    def zero(layer, z, scores):
        seen.append((layer, {k: tuple(v.shape) for k, v in scores.items()}))
        if layer == 0:
            z = z.clone()
            z[:, :, 1] = 0
        return z

    ids, mask = pad_batch(seqs, 3, "right")
    run_with_hooks(model, ids, mask, col.hooks(mask, z_transform=zero), return_logits=False)
    got = col.batch_scores()
    assert seen == [(0, {"ahon_ln": (3, 4), "awft": (3, 4)}), (1, {"ahon_ln": (3, 4), "awft": (3, 4)})]
    hf = _hf(tiny_model_dir("llama"))
    for i, s in enumerate(seqs):
        ablated = naive_scores(hf, "llama", s.tolist(), zero_heads={0: [1]})
        _close(got["ahon_ln"][i], ablated["ahon_ln"], "ablated ahon_ln")
        _close(got["awft"][i], ablated["awft"], "ablated awft")
    plain = score_heads(model, seqs, scores="ahon_ln", keep_per_input=True, progress=False).per_input["ahon_ln"]
    _close(got["ahon_ln"][:, 0], plain[:, 0])  # scores of the ablated layer come from unmodified z
    assert not torch.allclose(got["ahon_ln"][:, 1], plain[:, 1])


def test_collector_extra_statistics(tiny_model, tiny_model_dir):
    """An unregistered base statistic rides along: computed at its hook from the same pattern
    (here the max attention over real keys, checked against HF output_attentions), returned by
    batch_scores, hidden from z_transform, leaving the registry scores and SCORES untouched."""
    from lens_heads.scores import Acts, ScoreFn

    def max_attn(a: Acts) -> torch.Tensor:  # mean over real query rows of max_j A[t, j]
        return a.mean_over_queries(a.x.float().amax(-1))

    extra = ScoreFn("max_attn", ("pattern",), "high", "mean row max", compute=max_attn)
    model = tiny_model("llama")
    seqs = model.to_tokens(TEXTS[:3])
    ids, mask = pad_batch(seqs, 3, "right")
    col = ScoreCollector(model, ["awft", "ahon"], extra=[extra])
    seen = []
    run_with_hooks(model, ids, mask, col.hooks(mask, z_transform=lambda L, z, sc: seen.append(sorted(sc)) or z),
                   return_logits=False)
    got = col.batch_scores()
    assert sorted(got) == ["ahon", "awft", "max_attn"] and seen == [["ahon", "awft"]] * 2
    assert "max_attn" not in SCORES
    plain = ScoreCollector(model, ["awft", "ahon"])
    run_with_hooks(model, ids, mask, plain.hooks(mask), return_logits=False)
    for s in ("awft", "ahon"):
        assert torch.equal(got[s], plain.batch_scores()[s])
    hf = _hf(tiny_model_dir("llama"))
    for i, x in enumerate(seqs):
        with torch.no_grad():
            atts = hf(x[None], output_attentions=True).attentions
        for L, A in enumerate(atts):
            n = len(x)
            want = [sum(max(A[0, h, t, j].item() for j in range(t + 1)) for t in range(n)) / n
                    for h in range(A.shape[1])]
            _close(got["max_attn"][i, L], torch.tensor(want, dtype=torch.float64), f"max_attn L{L}")
    with pytest.raises(LensHeadsError, match="clashes"):
        ScoreCollector(model, ["awft"], extra=[ScoreFn("awft", ("pattern",), "high", "dup", compute=max_attn)])
    with pytest.raises(LensHeadsError, match="clashes"):
        ScoreCollector(model, ["awft"], extra=[extra, extra])
    derived_fn = ScoreFn("d", ("pattern",), "high", "derived", needs=("awft",), combine=lambda d: d["awft"])
    with pytest.raises(LensHeadsError, match="base ScoreFn"):
        ScoreCollector(model, ["awft"], extra=[derived_fn])


def test_registry_and_resolution():
    assert len(ALL) == 16  # the paper's 12, lthon_hn, fhon, fhon_ln, lthon_ln_text
    assert [s for s in SCORES if s not in ALL] == ["atp"] and SCORES["atp"].needs_task  # the question-level one
    assert {SCORES[s].inactive_when for s in ("awft", "awft_ln")} == {"high"}
    assert all(SCORES[s].inactive_when == "low" for s in SCORES if not s.startswith("awft"))
    assert SCORES["fhon"].reads == ("z",) and SCORES["ftvvn_ln"].reads == ("v",)
    assert SCORES["awft"].reads == ("rows",)  # row statistics: from the pattern (eager) or the fused kernel
    assert resolve_score_ids("ahon_ln, awft") == ["ahon_ln", "awft"]
    assert resolve_score_ids("all") == ALL
    assert len(resolve_score_ids("paper")) == 12
    with pytest.raises(LensHeadsError, match=r"unknown score id.*'nope'.*valid ids: awft, aeqd"):
        resolve_score_ids("awft,nope")
    with pytest.raises(LensHeadsError, match="score 'awft' is already registered"):  # the one Registry idiom
        register_score(SCORES["awft"])


def test_bad_inputs(tiny_model):
    model = tiny_model("llama")
    with pytest.raises(LensHeadsError, match="unknown score id.*valid ids"):
        score_heads(model, TEXTS, scores="awft,bogus", progress=False)
    with pytest.raises(LensHeadsError, match="empty data"):
        score_heads(model, [], progress=False)
    with pytest.raises(LensHeadsError, match="max_len must be >= 2"):
        score_heads(model, TEXTS, max_len=1, progress=False)
    with pytest.raises(LensHeadsError, match="longer than the model's context.*256"):
        score_heads(model, [torch.randint(4, 300, (300,))], progress=False)
    with pytest.raises(LensHeadsError, match="exceeds the model's context"):
        score_heads(model, TEXTS, max_len=1000, progress=False)
    with pytest.raises(LensHeadsError, match="empty"):
        score_heads(model, [torch.tensor([], dtype=torch.long)], progress=False)
    with pytest.raises(LensHeadsError, match="token ids"):
        score_heads(model, [torch.tensor([1, 10**6])], progress=False)
    # truncation by max_len keeps long inputs usable
    long = torch.randint(4, 300, (300,), generator=torch.Generator().manual_seed(0))
    cut = score_heads(model, [long], max_len=8, progress=False)
    ref = score_heads(model, [long[:8]], progress=False)
    assert all(torch.equal(cut.mean[s], ref.mean[s]) for s in ALL)


@pytest.mark.parametrize("suffix", [".csv", ".parquet"])
def test_save_load_roundtrip(suffix, tiny_model, tmp_path):
    hs = score_heads(tiny_model("olmo2"), TEXTS, batch_size=2, keep_per_input=True, progress=False,
                     data="unit-test")
    path = hs.save(tmp_path / f"scores{suffix}")
    back = HeadScores.load(path)
    assert back.score_ids == hs.score_ids and back.n == hs.n
    for s in ALL:
        torch.testing.assert_close(back.mean[s], hs.mean[s], rtol=0, atol=0, equal_nan=True)
        torch.testing.assert_close(back.std[s], hs.std[s], rtol=0, atol=0, equal_nan=True)
        assert torch.equal(back.count[s], hs.count[s])
        torch.testing.assert_close(back.per_input[s], hs.per_input[s], rtol=0, atol=0, equal_nan=True)
    meta = json.loads((tmp_path / f"scores{suffix}.meta.json").read_text())
    assert meta["data"] == "unit-test" and meta["n_inputs"] == len(TEXTS) and meta["dtype"] == "float32"
    assert len(meta["model_digest"]) == 64 and meta["versions"]["torch"]
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(
        [f"scores{suffix}", f"scores{suffix}.meta.json", f"scores{suffix}.per_input.safetensors"])
    frame = hs.to_frame()
    assert list(frame.columns[:4]) == ["layer", "head", "score_fn", "value"]
    assert len(frame) == len(ALL) * 2 * 4
    with pytest.raises(LensHeadsError, match=r"\.csv or \.parquet"):
        hs.save(tmp_path / "scores.txt")
    assert not (tmp_path / "scores.txt").exists()


def _cli(capsys, *args) -> tuple[int, str]:
    """Run ``lens-heads ARGS`` in-process (the console script calls the same main)."""
    from lens_heads.cli import main

    capsys.readouterr()
    code = main(list(args))
    return code, capsys.readouterr().err


def test_cli_score_csv_matches_api(tiny_model_dir, tiny_model, tmp_path, capsys):
    import pandas as pd

    from lens_heads.data import load_texts, tokenize_texts

    data = tmp_path / "d.jsonl"
    data.write_text("".join(json.dumps({"text": t}) + "\n" for t in TEXTS))
    out = tmp_path / "s.csv"
    code, err = _cli(capsys, "score", str(tiny_model_dir("bloom")), "--data", str(data), "--max-len", "6",
                     "--n-inputs", "4", "--batch-size", "3", "--scores", "awft,ahon_ln,fhon", "--out", str(out))
    assert code == 0, err
    assert out.read_text().splitlines()[0].startswith("layer,head,score_fn,value")
    frame = pd.read_csv(out)
    model = tiny_model("bloom")
    seqs = tokenize_texts(model.tokenizer, load_texts(str(data), n=4), 6, mode="documents")
    assert max(len(s) for s in seqs) == 6 and len(seqs) == 4
    api = score_heads(model, seqs, scores="awft,ahon_ln,fhon", progress=False).to_frame()
    assert list(frame["score_fn"].unique()) == ["awft", "ahon_ln", "fhon"]
    np.testing.assert_allclose(frame["value"], api["value"], rtol=1e-6)
    assert (frame[["layer", "head"]].to_numpy() == api[["layer", "head"]].to_numpy()).all()

    bad = tmp_path / "s.txt"
    code, err = _cli(capsys, "score", str(tiny_model_dir("bloom")), "--data", str(data), "--out", str(bad))
    assert code == 2 and ".csv or .parquet" in err and len(err.strip().splitlines()) == 1
    assert not bad.exists()
    code, err = _cli(capsys, "score", str(tiny_model_dir("bloom")), "--data", str(data), "--scores", "nope",
                     "--out", str(tmp_path / "x.csv"))
    assert code == 2 and "valid ids" in err and not (tmp_path / "x.csv").exists()
    empty = tmp_path / "empty.jsonl"
    empty.write_text("")
    code, err = _cli(capsys, "score", str(tiny_model_dir("bloom")), "--data", str(empty), "--out",
                     str(tmp_path / "y.csv"))
    assert code == 2 and "empty data" in err and not (tmp_path / "y.csv").exists()
    code, err = _cli(capsys, "score", str(tiny_model_dir("llama")), "--data", str(data), "--max-len", "1000",
                     "--out", str(tmp_path / "z.csv"))  # tiny llama: 256 positions
    assert code == 2 and "context" in err and not (tmp_path / "z.csv").exists()


def test_least_active_orders_by_direction_with_ties_and_undefined_last():
    from lens_heads.scores import least_active

    mean = torch.tensor([[0.3, float("nan"), 0.1], [0.1, 0.7, 0.2]], dtype=torch.float64)
    assert least_active(mean, "low") == [(0, 2), (1, 0), (1, 2), (0, 0), (1, 1), (0, 1)]  # tie 0.1: layer 0 first
    assert least_active(mean, "high") == [(1, 1), (0, 0), (1, 2), (0, 2), (1, 0), (0, 1)]
    with pytest.raises(LensHeadsError, match="inactive_when"):
        least_active(mean, "quiet")
    hs = HeadScores(score_ids=["ahon_ln", "awft"], mean={"ahon_ln": mean, "awft": mean},
                    std={}, count={}, n=3)
    assert hs.least_active("ahon_ln", k=2) == [(0, 2), (1, 0)]  # AHON(LN): low is inactive
    assert hs.least_active("awft", k=2) == [(1, 1), (0, 0)]  # AWFT: high is inactive
