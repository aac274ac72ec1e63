"""Ablations: static = zeroing W_O columns in plain HF; per-input = a layer-by-layer reference
loop; random = Bernoulli(p) per (row, layer, head), independent of batching; parsing errors."""

from __future__ import annotations

import math

import pytest
import torch

from lens_heads.interventions.ablation import (NoAblation, RandomAblation, ScoreAblation, StaticAblation,
                                 parse_ablation, parse_heads)
from lens_heads.data import pad_batch
from lens_heads.errors import LensHeadsError
from lens_heads.models.hooks import run_with_hooks
from lens_heads.scores import ScoreCollector

from conftest import BRIDGE_ARCHS, TABLE_ARCHS, TINY_ARCHS

TEXTS = [
    "The capital of France is Paris. The capital of Italy is Rome.",
    "Attention heads that do nothing are called dormant heads.",
    "Question: How do I boil an egg?",
]


def _inputs(model, texts=TEXTS):
    return [torch.tensor(model.tokenizer(t)["input_ids"]) for t in texts]


def _forward(model, seqs, ablation, row_keys=None):
    ids, mask = pad_batch(seqs, model.tokenizer.pad_token_id, side="right")
    keys = list(range(len(seqs))) if row_keys is None else row_keys
    logits = run_with_hooks(model, ids, mask, ablation.hooks(model, mask, keys))
    return logits, mask


# --- static ---------------------------------------------------------------------------


@pytest.mark.parametrize("arch", TABLE_ARCHS)
def test_static_equals_zeroed_wo_columns_in_plain_hf(tiny_model, arch):
    model = tiny_model(arch)
    heads = [(0, 1), (1, 0), (1, 3)]
    seqs = _inputs(model)
    logits, mask = _forward(model, seqs, parse_ablation("static:0.1,1.0,1.3", model.geometry))

    hf = model.load_hf_model()  # an independent, unwrapped copy: edit its W_O
    params = dict(hf.named_parameters())
    with torch.no_grad():
        for L, h in heads:
            sl = model.geometry.out_slice(L, h)
            params[sl.name].index_fill_(sl.dim, sl.index, 0.0)
        ids, _ = pad_batch(seqs, model.tokenizer.pad_token_id, side="right")
        ref = hf(ids, attention_mask=mask).logits
    real = mask.bool()
    base, _ = _forward(model, seqs, NoAblation())
    assert (base[real] - ref[real]).abs().max() > 1e-3  # the ablation changes something
    torch.testing.assert_close(logits[real], ref[real], atol=1e-5, rtol=0)


@pytest.mark.parametrize("arch", BRIDGE_ARCHS)
def test_static_equals_zeroed_output_projection_input_in_plain_hf(tiny_model, arch):
    """Architectures outside the table: the heads' slices of the output projection's input set to 0
    by a hook on the plain HF model (module names written here, not taken from lens_heads)."""
    from test_scores import LAYOUT

    model = tiny_model(arch)
    heads = {0: [1], 1: [0, 3]}
    seqs = _inputs(model)
    logits, mask = _forward(model, seqs, parse_ablation("static:0.1,1.0,1.3", model.geometry))
    hf = model.load_hf_model()
    blocks_path, attn_attr, _, o_name, _ = LAYOUT[arch]
    blocks = hf
    for part in blocks_path.split("."):
        blocks = getattr(blocks, part)
    d = model.geometry.d_head
    for L, hs in heads.items():
        def pre(module, args, hs=hs):
            x = args[0].clone()
            for h in hs:
                x[..., h * d:(h + 1) * d] = 0.0
            return (x, *args[1:])
        getattr(getattr(blocks[L], attn_attr), o_name).register_forward_pre_hook(pre)
    ids, _ = pad_batch(seqs, model.tokenizer.pad_token_id, side="right")
    with torch.no_grad():
        ref = hf(ids, attention_mask=mask).logits
    real = mask.bool()
    base, _ = _forward(model, seqs, NoAblation())
    assert (base[real] - ref[real]).abs().max() > 1e-3
    torch.testing.assert_close(logits[real], ref[real], atol=1e-5, rtol=0)


def test_static_fraction_and_name(tiny_model):
    model = tiny_model("llama")
    abl = parse_ablation("static:1.3, 0.1,0.1", model.geometry)
    assert abl.name == "static:0.1,1.3" and abl.reuses_prefix
    assert math.isnan(abl.zeroed_fraction())
    _forward(model, _inputs(model), abl)
    assert abl.zeroed_fraction() == pytest.approx(2 / 8)
    assert abl.last_zeroed.sum().item() == 2 * 3
    with abl.counting() as counts:  # a fresh scope counts from nothing
        assert math.isnan(counts.fraction()) and math.isnan(abl.zeroed_fraction())


def test_static_same_with_and_without_prefix_cache(tiny_model):
    """Static ablations may reuse a cached K/V prefix: the zeroed set does not depend on the input."""
    from lens_heads.evaluation.evaluate import loglikelihoods

    model = tiny_model("llama")
    context = " ".join(TEXTS * 3) + " Question: which city?"
    reqs = [(context, " Paris"), (context, " Rome"), (context + " Answer:", " egg")]
    abl = parse_ablation("static:0.2,1.1", model.geometry)
    cached = loglikelihoods(model, reqs, abl, progress=False, reuse_prefix=True)
    plain = loglikelihoods(model, reqs, abl, progress=False, reuse_prefix=False)
    base = loglikelihoods(model, reqs, None, progress=False, reuse_prefix=False)
    assert cached == pytest.approx(plain, abs=1e-4)
    assert max(abs(a - b) for a, b in zip(plain, base)) > 1e-3
    assert abl.zeroed_fraction() == pytest.approx(2 / 8)


# --- per-input (score) ------------------------------------------------------------------


def _reference_per_input(model, seq, score_id, tau, inactive_when):
    """Layer by layer, one input: score layer L with layers < L statically ablated, then zero."""
    g = model.geometry
    chosen: list[tuple[int, int]] = []
    for L in range(g.n_layers):
        static = StaticAblation(chosen, g) if chosen else NoAblation()
        ids = seq[None]
        mask = torch.ones_like(ids)
        collector = ScoreCollector(model, [score_id])
        hooks = static.hooks(model, mask, [0]) + collector.hooks(mask)
        run_with_hooks(model, ids, mask, hooks, return_logits=False)
        s = collector.batch_scores()[score_id][0, L]
        cross = s >= tau if inactive_when == "high" else s <= tau
        chosen += [(L, h) for h in torch.nonzero(cross).flatten().tolist()]
    out = torch.zeros(g.n_layers, g.n_heads, dtype=torch.bool)
    for L, h in chosen:
        out[L, h] = True
    return out, chosen


@pytest.mark.parametrize("arch,score_id", [("llama", "ahon_ln"), ("llama", "awft"), ("bloom", "lthon"),
                                           ("gemma3", "lthon_ln"), ("qwen2", "avvn"), ("qwen3", "ahon_ln"),
                                           ("phi3", "fhon"), ("gpt_neox", "awft")])
def test_per_input_zeroes_exactly_same_pass_crossings(tiny_model, arch, score_id):
    model = tiny_model(arch)
    seqs = _inputs(model)
    # a threshold in the middle of the unablated scores, so some heads cross and some do not
    ids, mask = pad_batch(seqs, model.tokenizer.pad_token_id, side="right")
    collector = ScoreCollector(model, [score_id])
    run_with_hooks(model, ids, mask, collector.hooks(mask), return_logits=False)
    tau = float(collector.batch_scores()[score_id].median())

    abl = parse_ablation(f"score:{score_id}@{tau!r}", model.geometry)
    assert isinstance(abl, ScoreAblation) and not abl.reuses_prefix
    logits, mask = _forward(model, seqs, abl)
    got = abl.last_zeroed
    total = 0
    for i, seq in enumerate(seqs):
        want, chosen = _reference_per_input(model, seq, score_id, tau, abl.inactive_when)
        assert torch.equal(got[i], want), f"input {i}: {got[i].int().tolist()} vs {want.int().tolist()}"
        total += len(chosen)
        # and the forward itself equals the static ablation of that input's set
        n = len(seq)
        static = StaticAblation(chosen, model.geometry) if chosen else NoAblation()
        ref, _ = _forward(model, [seq], static)
        torch.testing.assert_close(logits[i, :n], ref[0, :n], atol=1e-5, rtol=0)
    g = model.geometry
    assert 0 < total < len(seqs) * g.n_layers * g.n_heads
    assert abl.zeroed_fraction() == pytest.approx(total / (len(seqs) * g.n_layers * g.n_heads))


def test_per_input_tie_rule_is_inclusive(tiny_model):
    """A threshold equal to a head's score zeroes it (>= for high, <= for low)."""
    model = tiny_model("llama")
    seq = _inputs(model)[:1]
    ids, mask = pad_batch(seq, model.tokenizer.pad_token_id)
    collector = ScoreCollector(model, ["awft", "ahon"])
    run_with_hooks(model, ids, mask, collector.hooks(mask), return_logits=False)
    s = collector.batch_scores()
    top = float(s["awft"][0, 0].max())  # layer-0 scores are unaffected by any ablation
    abl = parse_ablation(f"score:awft@{top!r}", model.geometry)
    _forward(model, seq, abl)
    assert abl.last_zeroed[0, 0].tolist() == (s["awft"][0, 0] >= top).tolist()
    assert abl.last_zeroed[0, 0].sum() >= 1
    low = float(s["ahon"][0, 0].min())
    abl = parse_ablation(f"score:ahon@{low!r}", model.geometry)
    _forward(model, seq, abl)
    assert abl.last_zeroed[0, 0].sum() >= 1 and abl.last_zeroed[0, 0].tolist() == (s["ahon"][0, 0] <= low).tolist()


# --- random -----------------------------------------------------------------------------


@pytest.mark.parametrize("p", [0.1, 0.3])
def test_random_fraction_close_to_p(tiny_model, p):
    g = tiny_model("llama").geometry
    abl = RandomAblation(p, seed=7, geometry=g)
    masks = abl.masks(range(3000))  # 3000 rows x 8 heads
    n = masks.numel()
    assert abs(masks.float().mean().item() - p) < 3 * math.sqrt(p * (1 - p) / n)


def test_random_deterministic_across_batch_sizes(tiny_model):
    model = tiny_model("gpt2")
    seqs = _inputs(model) + _inputs(model, ["Paris is the capital.", "Rome."])
    keys = [101, 7, 55, 3, 12]
    a = parse_ablation("random:0.4@3", model.geometry)
    full, mask = _forward(model, seqs, a, keys)
    zeroed_full = a.last_zeroed.clone()
    frac_full = a.zeroed_fraction()
    b = parse_ablation("random:0.4@3", model.geometry)
    for i in [3, 0, 4, 1, 2]:  # one at a time, shuffled
        one, _ = _forward(model, [seqs[i]], b, [keys[i]])
        n = len(seqs[i])
        torch.testing.assert_close(one[0, :n], full[i, :n], atol=1e-5, rtol=0)
        assert torch.equal(b.last_zeroed[0], zeroed_full[i])
    assert b.zeroed_fraction() == pytest.approx(frac_full)
    assert 0 < zeroed_full.sum() < zeroed_full.numel()
    # another seed draws other heads
    c = parse_ablation("random:0.4@4", model.geometry)
    _forward(model, seqs, c, keys)
    assert not torch.equal(c.last_zeroed, zeroed_full)


def test_random_extremes(tiny_model):
    model = tiny_model("llama")
    seqs = _inputs(model)
    base, mask = _forward(model, seqs, NoAblation())
    zero = parse_ablation("random:0@1", model.geometry)
    out, _ = _forward(model, seqs, zero)
    assert zero.zeroed_fraction() == 0.0 and torch.equal(out, base)
    one = parse_ablation("random:1@1", model.geometry)
    _forward(model, seqs, one)
    assert one.zeroed_fraction() == 1.0


# --- parsing ----------------------------------------------------------------------------


def test_parse_names(tiny_model):
    g = tiny_model("llama").geometry
    assert parse_ablation("none", g).name == "none"
    assert parse_ablation("random:0.1@0", g).name == "random:0.1@0"
    assert parse_ablation("score:ahon_ln@0.41", g).name == "score:ahon_ln@0.41"
    assert parse_heads("3.1, 4.2") == [(3, 1), (4, 2)]


@pytest.mark.parametrize("spec,msg", [
    ("", "empty ablation"),
    ("static", "bad ablation"),
    ("static:1", "LAYER.HEAD"),
    ("static:0.4", "out of range"),
    ("static:2.0", "out of range"),
    ("static:-1.0", "out of range"),
    ("random:1.5@0", "in [0, 1]"),
    ("random:-0.1@0", "in [0, 1]"),
    ("random:x@0", "not a number"),
    ("random:0.1@x", "not an integer"),
    ("score:nope@0.1", "unknown score"),
    ("score:ahon", "score:ID@THRESHOLD"),
    ("score:ahon@nan", "nan"),
    ("prune:1.2", "unknown ablation kind"),
])
def test_parse_errors(tiny_model, spec, msg):
    g = tiny_model("llama").geometry
    with pytest.raises(LensHeadsError, match=msg.replace("[", r"\[").replace("]", r"\]")):
        parse_ablation(spec, g)
