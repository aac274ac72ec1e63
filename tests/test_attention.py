"""The attention backends (docs/methods.md §10): the fused path against TransformerLens' eager
attention on tiny models of every architecture, and the switch around them."""

from __future__ import annotations

import pytest
import torch

from lens_heads.models import attention
from lens_heads.interventions.ablation import parse_ablation
from lens_heads.data import load_task
from lens_heads.forward.engine import forward
from lens_heads.errors import LensHeadsError
from lens_heads.evaluation.evaluate import evaluate_task
from lens_heads.models.hooks import hook_name
from lens_heads.scores import score_heads
from lens_heads.forward.task_requests import select_records

JOINT = ["phi3", "gpt_neox", "gpt2", "bloom"]  # one qkv projection: its hook_q / k / v are inside the fused attention
FUSABLE = ["llama", "qwen2", "olmo2", "gemma3", "qwen3"] + JOINT  # all but BLOOM via transformers' AttentionInterface


pytestmark = pytest.mark.usefixtures("one_torch_thread")  # tiny models: one thread is faster (conftest)


@pytest.fixture
def as_set(tiny_model):
    """arch, choice -> the tiny model with that attention setting (set back afterwards)."""
    touched = []

    def get(arch, choice):
        model = tiny_model(arch)
        touched.append((model, model.attention))
        model.attention = choice
        return model

    yield get
    for model, before in reversed(touched):
        model.attention = before


def _batch(n_rows=3, T=20, left=False):
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(3, 200, (n_rows, T), generator=g)
    mask = torch.ones(n_rows, T, dtype=torch.long)
    if left:
        mask[1, :5] = 0
    else:
        mask[1, 15:] = 0
        mask[2, 8:] = 0
    return ids, mask


def _run(model, ids, mask, names=()):
    """Logits and the named hook points' activations of one forward."""
    seen = {}

    def grab(x, hook):
        seen[hook.name] = x.detach().clone()

    logits = forward(model, ids, mask, [(n, grab) for n in names])
    return logits, seen


@pytest.mark.parametrize("arch", FUSABLE)
def test_which_layers_can_run_fused(arch, tiny_model):
    blockers = attention.blockers(tiny_model(arch))
    assert len(blockers) == tiny_model(arch).geometry.n_layers
    assert blockers == [None] * len(blockers)


@pytest.mark.parametrize("left", [False, True], ids=["right-padded", "left-padded"])
@pytest.mark.parametrize("arch", FUSABLE)
def test_fused_forward_equals_eager(arch, left, as_set):
    """Logits, head outputs (hook_z) and values (hook_v) agree to float rounding; GQA (llama,
    qwen2, qwen3: 2 KV heads; gemma3: 1) and Gemma 3's sliding window (8 < 20 tokens) included."""
    ids, mask = _batch(left=left)
    names = [hook_name("z", 0), hook_name("v", 1), hook_name("z", 1)]
    e_logits, e_acts = _run(as_set(arch, "eager"), ids, mask, names)
    # a joint qkv's hook_v is inside the fused attention: auto runs that layer eager
    f_logits, f_acts = _run(as_set(arch, "auto" if arch in JOINT else "fused"), ids, mask, names)
    if arch in JOINT:
        assert attention.fused_layers(as_set(arch, "auto"), names) == [True, False]
        with pytest.raises(LensHeadsError, match="a point inside its attention"):
            attention.fused_layers(as_set(arch, "fused"), names)
        f_logits, f_acts_all = _run(as_set(arch, "fused"), ids, mask, [names[0], names[2]])
        assert len(f_acts_all) == 2 and set(f_acts_all) <= set(e_acts)  # named by their canonical point
        for n in f_acts_all:  # hook_z fires in every fused layer
            assert (f_acts_all[n] - e_acts[n])[mask.bool()].abs().max() <= 1e-5
    real = mask.bool()
    assert torch.isfinite(f_logits[real]).all()
    assert (f_logits - e_logits)[real].abs().max() <= 1e-4
    assert set(f_acts) == set(e_acts) and len(f_acts) == 3  # the projections' points fire fused too
    for n in f_acts:
        assert (f_acts[n] - e_acts[n])[real].abs().max() <= 1e-5


def test_the_eager_path_is_what_fused_replaces(tiny_model, as_set):
    """A guard on the comparison above: eager really is TransformerLens' attention (its pattern
    fires) and fused really is not (no [q, k] pattern; the kernel ran)."""
    ids, mask = _batch()
    calls = []
    model = as_set("llama", "eager")
    forward(model, ids, mask, [(hook_name("pattern", 0), lambda x, hook: calls.append(x.shape))])
    assert calls == [torch.Size([3, 4, 20, 20])]
    with attention.backend(as_set("llama", "fused"), []) as fused:
        assert fused == [True, True]
        attn = model.bridge.blocks[0].attn
        assert "forward" in attn.__dict__ and model.hf_model.config._attn_implementation == attention.FUSED
    assert "forward" not in attn.__dict__ and model.hf_model.config._attn_implementation != attention.FUSED


def test_auto_runs_eager_only_where_a_pattern_is_read(as_set):
    ids, mask = _batch()
    model = as_set("qwen2", "auto")
    names = [hook_name("pattern", 1)]
    assert attention.fused_layers(model, names) == [True, False]
    assert attention.fused_layers(model, []) == [True, True]
    seen = []
    logits = forward(model, ids, mask, [(names[0], lambda x, hook: seen.append(x.shape))])
    assert seen == [torch.Size([3, 4, 20, 20])]  # the pattern was computed where it was read
    eager = forward(as_set("qwen2", "eager"), ids, mask, [])
    assert (logits - eager)[mask.bool()].abs().max() <= 1e-4
    # a hook a user leaves on the model counts too
    point = model.bridge.hook_dict[hook_name("pattern", 0)]
    point.add_hook(lambda x, hook: None)
    try:
        assert attention.fused_layers(as_set("qwen2", "auto"), []) == [False, True]
    finally:
        point.remove_hooks()
    assert attention.fused_layers(model, []) == [True, True]


def test_fused_refuses_what_it_cannot_compute(as_set):
    with pytest.raises(LensHeadsError, match="reads the attention pattern of layer 0"):
        attention.fused_layers(as_set("llama", "fused"), [hook_name("pattern", 0)])
    model = as_set("bloom", "fused")  # BLOOM split by tensor-parallel rank: its own forward does not do that
    hf = model.bridge.blocks[1].attn.original_component
    hf.pretraining_tp, hf.slow_but_exact = 2, True
    model.__dict__.pop("_fused_blockers", None)
    try:
        with pytest.raises(LensHeadsError, match="not available for this model .layer 1: .*slow_but_exact"):
            attention.fused_layers(model, [])
        assert attention.fused_layers(as_set("bloom", "auto"), []) == [True, False]  # auto: eager there
    finally:
        hf.pretraining_tp, hf.slow_but_exact = 1, False
        model.__dict__.pop("_fused_blockers", None)
    with pytest.raises(LensHeadsError, match="choose one of auto, fused, eager"):
        attention.check_choice("flash")


def test_everything_is_restored_when_the_forward_fails(as_set):
    model = as_set("gemma3", "fused")
    before = model.hf_model.config._attn_implementation

    def boom(x, hook):
        raise RuntimeError("boom")

    ids, mask = _batch()
    with pytest.raises(RuntimeError, match="boom"):
        forward(model, ids, mask, [(hook_name("z", 1), boom)])
    assert model.hf_model.config._attn_implementation == before
    assert all("forward" not in b.attn.__dict__ for b in model.bridge.blocks)


def test_gpt2_hooks_its_output_projection_only_for_the_fused_forward(as_set):
    """GPT-2's c_proj is wrapped by the bridge out of place; a fused forward puts the wrapper in
    the model's place (so hook_z fires) and takes it out again, also when the forward fails."""
    model = as_set("gpt2", "fused")
    hf_attn = model.bridge.blocks[0].attn.original_component
    raw = hf_attn.c_proj
    assert raw is model.bridge.blocks[0].attn.o.original_component
    seen = []
    ids, mask = _batch()
    forward(model, ids, mask, [(hook_name("z", 0), lambda x, hook: seen.append(tuple(x.shape)))])
    assert seen == [(3, 20, 4, 16)] and hf_attn.c_proj is raw

    def boom(x, hook):
        assert hf_attn.c_proj is model.bridge.blocks[0].attn.o
        raise RuntimeError("boom")

    with pytest.raises(RuntimeError, match="boom"):
        forward(model, ids, mask, [(hook_name("z", 0), boom)])
    assert hf_attn.c_proj is raw


def _small_piqa(n):
    piqa = load_task("piqa")
    recs = [r for r in piqa.records if len(r.question) + max(map(len, r.choices)) < 120][:n]
    return piqa, [r.doc_id for r in recs]


SPECS = ["none", "static:0.1,1.2", "score:ahon_ln@1.0", "score:lthon_ln@0.9", "random:0.3@7",
         "static:0.1,1.2|mean:c4-sample"]


@pytest.mark.parametrize("arch,spec", [(a, s) for a in ("llama", "gemma3") for s in SPECS]
                         + [("bloom", "none"), ("bloom", "score:ahon_ln@1.0"), ("bloom", "score:avvn_ln@1.0"),
                            ("gpt2", "score:avvn_ln@1.0")])
def test_evaluation_fused_equals_eager_under_every_ablation(arch, spec, as_set, shared_data):
    """PIQA (0-shot) and MMLU (5-shot: prefix reuse where the ablation allows it) under no,
    static, per-input, random and mean-replaced ablation: log-likelihoods within 1e-4, the
    same predictions and the same realised share of heads zeroed (BLOOM: ALiBi, continuing
    from a cached prefix, and a per-input point; BLOOM and GPT-2 by a value score, which a fused
    layer of a joint q, k, v projection reads through the bridge's v projection run once more)."""
    piqa, ids = _small_piqa(6)
    mmlu = load_task("mmlu")
    mids = [r.doc_id for r in select_records(mmlu, 4, seed=3)]
    for task, doc_ids, k in ((piqa, ids, 0), (mmlu, mids, 5)):
        out = {}
        for choice in ("eager", "fused"):
            model = as_set(arch, choice)
            abl = None if spec == "none" else parse_ablation(spec, model.geometry)
            out[choice] = evaluate_task(model, task, n_shot=k, doc_ids=doc_ids, ablation=abl, progress=False,
                                        batch_size=4)
        e, f = out["eager"], out["fused"]
        for qe, qf in zip(e.questions, f.questions):
            assert qf.lls == pytest.approx(qe.lls, abs=1e-4)
            assert qf.pred == qe.pred
        assert f.zeroed_fraction == e.zeroed_fraction


@pytest.mark.parametrize("arch", ["qwen2", "olmo2"] + JOINT)
def test_value_and_output_scores_fused_equal_eager(arch, as_set):
    """Every score that reads values or head outputs, per input, within 1e-4 relative -- where
    q, k and v are projected jointly too (there a fused layer never forms hook_v; the scores'
    read-only values point runs the bridge's v projection once more), with every layer fused
    (``fused`` refuses rather than falling back)."""
    ids, mask = _batch(4, 24)
    inputs = [row[m.bool()] for row, m in zip(ids, mask)]
    ids_v = [s for s in ("ftvvn", "avvn", "lthon", "ahon", "fhon", "ahon_ln", "lthon_ln", "avvn_ln", "ftvvn_ln")]
    e = score_heads(as_set(arch, "eager"), inputs, ids_v, keep_per_input=True, progress=False)
    f = score_heads(as_set(arch, "fused"), inputs, ids_v, keep_per_input=True, progress=False)
    for s in ids_v:
        assert torch.allclose(f.per_input[s], e.per_input[s], rtol=1e-4, atol=1e-6), s


@pytest.mark.parametrize("left", [False, True], ids=["right-padded", "left-padded"])
@pytest.mark.parametrize("arch", FUSABLE)
def test_pattern_scores_fused_equal_eager_without_a_pattern(arch, left, as_set):
    """With --attention fused: awft, aeqd (and their layer-normalised forms) and the diagnosis' local mass, per input,
    from the fused kernel's per-row statistics (log-sum-exp; no [q, k] tensor), within 1e-4
    relative of the eager pattern's -- Gemma 3's sliding window and left padding included."""
    from lens_heads.surgery.diagnose import LOCAL_MASS
    from lens_heads.scores.collector import ScoreCollector

    ids, mask = _batch(4, 24, left=left)
    out = {}
    for choice in ("eager", "fused"):
        model = as_set(arch, choice)
        col = ScoreCollector(model, ["awft", "aeqd", "awft_ln", "aeqd_ln"], extra=[LOCAL_MASS])
        seen = []
        hooks = col.hooks(mask) + [(hook_name("pattern", 0), lambda x, hook: seen.append(1))] * (choice == "eager")
        forward(model, ids, mask, hooks, logits=False)
        assert len(seen) == (choice == "eager")  # fused: refused if a pattern were read, so none was
        out[choice] = col.batch_scores()
    for s, e in out["eager"].items():
        assert torch.allclose(out["fused"][s], e, rtol=1e-4, atol=1e-6, equal_nan=True), s
    assert torch.isfinite(out["fused"]["awft"]).all()


def test_per_input_pattern_ablation_runs_fused(as_set, shared_data):
    """A per-input sweep point by awft on MMLU 5-shot: fused (no pattern) equals eager."""
    mmlu = load_task("mmlu")
    ids = [r.doc_id for r in select_records(mmlu, 4, seed=3)]
    from lens_heads.forward.task_requests import task_inputs
    from lens_heads.interventions.thresholds import compute_thresholds

    model = as_set("qwen2", "eager")
    tau = compute_thresholds(model, task_inputs(model, mmlu, 5, limit=4, seed=3), ["awft"], [0.3],
                             progress=False)["awft"][0.3]
    res = {}
    for choice in ("eager", "fused"):
        model = as_set("qwen2", choice)
        res[choice] = evaluate_task(model, mmlu, n_shot=5, doc_ids=ids, progress=False, batch_size=4,
                                    ablation=parse_ablation(f"score:awft@{tau!r}", model.geometry))
    assert 0 < res["fused"].zeroed_fraction < 1
    assert res["fused"].zeroed_fraction == res["eager"].zeroed_fraction
    for qe, qf in zip(res["eager"].questions, res["fused"].questions):
        assert qf.lls == pytest.approx(qe.lls, abs=1e-4) and qf.pred == qe.pred


def test_auto_runs_short_inputs_eager_on_a_cpu(as_set):
    """Below AUTO_MIN_KEYS keys (input and cached prefix) fused loses on a CPU (measured:
    benchmarks/bench_attention_crossover.py), so auto runs eager there; fused stays fused."""
    n = attention.AUTO_MIN_KEYS
    model = as_set("llama", "auto")
    assert attention.fused_layers(model, [], n_keys=n - 1) == [False, False]
    assert attention.fused_layers(model, [], n_keys=n) == [True, True]
    assert attention.fused_layers(as_set("llama", "fused"), [], n_keys=1) == [True, True]
    calls = []
    with attention.backend(as_set("llama", "auto"), [], n_keys=n - 1) as fused:
        calls.append(fused)
    assert calls == [[False, False]]


@pytest.mark.parametrize("arch", ["llama", "gemma3", "bloom"])
def test_a_pruned_model_runs_fused(arch, tiny_model):
    """A physically pruned model (layers with different head counts, a GQA group gone; BLOOM's
    kept heads with their own ALiBi slopes) runs its own attention fused and agrees with eager."""
    from lens_heads.surgery.prune import prune

    model = tiny_model(arch)
    g = model.geometry
    heads = [(0, 0), (0, 1), (1, g.n_heads - 1)]
    pruned = prune(model, heads)
    assert attention.blockers(pruned) == [None, None]
    ids, mask = _batch(left=True)
    out = {}
    for choice in ("eager", "fused"):
        pruned.attention = choice
        out[choice] = forward(pruned, ids, mask, [])
    assert (out["fused"] - out["eager"])[mask.bool()].abs().max() <= 1e-4


@pytest.mark.parametrize("arch", ["llama", "gemma3", "bloom"])
def test_surgery_perplexity_runs_fused_where_the_model_supports_it(arch, tiny_model):
    """Surgery's held-out perplexity (a plain transformers copy) runs the fused kernel where the
    class supports SDPA (BLOOM: its attention's own fused forward), equal to the eager model's own
    perplexity; the config and the modules' forwards are restored."""
    import math

    from lens_heads.surgery.train import perplexity

    hf = tiny_model(arch).load_hf_model().eval()
    docs = [row[m.bool()] for row, m in zip(*_batch(3, 40, left=True))]
    with torch.no_grad():  # the reference: the eager model, one document at a time
        nll = [torch.nn.functional.cross_entropy(hf(d[None]).logits[0, :-1].float(), d[1:], reduction="sum")
               for d in docs]
    eager = math.exp(sum(float(x) for x in nll) / sum(len(d) - 1 for d in docs))
    seen, own = [], []
    with attention.plain_fused(hf) as fused:
        seen.append(fused)
        assert (hf.config._attn_implementation == attention.FUSED) == fused
        own += [m for m in hf.modules() if "forward" in m.__dict__]
    assert hf.config._attn_implementation == "eager"  # restored
    assert seen == [True] and len(own) == (2 if arch == "bloom" else 0)  # BLOOM: its two attention modules
    assert not any("forward" in m.__dict__ for m in hf.modules())
    patterns = []  # what each attention module returned as its pattern: None where it ran fused
    with torch.nn.modules.module.register_module_forward_hook(
            lambda m, i, o: patterns.append(o[1]) if type(m).__name__.endswith("Attention") else None):
        assert perplexity(hf, docs) == pytest.approx(eager, rel=1e-5)
    assert patterns and all(p is None for p in patterns)


def test_own_forwards_keep_accelerate_hooks_and_nest(tiny_model):
    """BLOOM's own fused forward goes under accelerate's hooks (they still fire), nested use
    keeps it until the outer block ends, and afterwards the module is as it was."""
    from accelerate.hooks import ModelHook, add_hook_to_module, remove_hook_from_module

    calls = []

    class Count(ModelHook):
        def pre_forward(self, module, *args, **kwargs):
            calls.append(1)
            return args, kwargs

    hf = tiny_model("bloom").load_hf_model().eval()
    ids, mask = _batch(2, 16, left=True)
    with torch.no_grad():
        eager = hf(ids, attention_mask=mask).logits
    attn = hf.transformer.h[0].self_attention
    add_hook_to_module(attn, Count())
    wrapper, inner = attn.__dict__["forward"], attn.__dict__["_old_forward"]
    patterns = []
    grab = attn.register_forward_hook(lambda m, i, o: patterns.append(o[1]))
    try:
        with torch.no_grad(), attention.plain_fused(hf):
            with attention.plain_fused(hf):
                inner_logits = hf(ids, attention_mask=mask).logits
            outer_logits = hf(ids, attention_mask=mask).logits
    finally:
        grab.remove()
    assert len(calls) == 2 and patterns == [None, None]  # the hook fired, and the fused forward ran, both times
    real = mask.bool()
    for logits in (inner_logits, outer_logits):
        assert (logits - eager)[real].abs().max() <= 1e-4
    assert attn.__dict__["forward"] is wrapper and attn.__dict__["_old_forward"] is inner
    remove_hook_from_module(attn)
    assert attn.forward.__func__ is type(attn).forward  # the class's own, once accelerate's hook is gone


def test_continuing_from_a_cache_without_a_mask_is_causal_from_the_end(tiny_model):
    """Given no mask after a cached prefix (q < k), both fused forwards attend causally aligned at
    the end (query i sees keys 0 .. k - q + i), as a naive softmax does -- not the kernel's
    top-left is_causal."""
    from transformers import DynamicCache

    g = torch.Generator().manual_seed(1)
    q, k, v = (torch.randn(2, 4, n, 8, generator=g) for n in (3, 7, 7))
    scores = q @ k.transpose(-1, -2) * 8 ** -0.5
    scores = scores.masked_fill(~torch.ones(3, 7, dtype=torch.bool).tril(4), float("-inf"))
    naive = (scores.softmax(-1) @ v).transpose(1, 2)
    out, _ = attention.fused_attention(torch.nn.Module(), q, k, v, None)
    assert (out - naive).abs().max() <= 1e-5

    hf = tiny_model("bloom").load_hf_model().eval()
    attn, n_head = hf.transformer.h[0].self_attention, hf.config.n_head
    x = torch.randn(2, 7, hf.config.hidden_size, generator=g)
    alibi = hf.transformer.build_alibi_tensor(torch.ones(2, 7), n_head, x.dtype)
    causal = torch.zeros(7, 7).masked_fill(~torch.ones(7, 7, dtype=torch.bool).tril(), torch.finfo(x.dtype).min)
    zero = torch.zeros_like(x)
    with torch.no_grad():
        full, _ = attn(x, zero, alibi, causal[None, None].expand(2, 1, 7, 7))  # HF's eager: all 7 at once
        cache = DynamicCache()
        attention.fused_alibi_attention(attn, x[:, :4], zero[:, :4], alibi[..., :4], None, layer_past=cache)
        rest, pattern = attention.fused_alibi_attention(attn, x[:, 4:], zero[:, 4:], alibi, None, layer_past=cache)
    assert pattern is None and (rest - full[:, 4:]).abs().max() <= 1e-5


def test_bloom_generates_fused_as_hf_generates(as_set, tiny_model_dir, monkeypatch):
    """Greedy generation through LensHeadsLM with BLOOM fused -- every step continues from the
    K/V cache -- gives HF's own generate on the eager model, token for token."""
    from lm_eval.api.instance import Instance
    from test_lm_eval_model import PROMPTS, _reference_text, hf_greedy
    from transformers import AutoModelForCausalLM

    from lens_heads.evaluation.lm_eval_model import LensHeadsLM

    model = as_set("bloom", "fused")
    hf = AutoModelForCausalLM.from_pretrained(str(tiny_model_dir("bloom")), attn_implementation="eager").eval()
    tok = model.tokenizer
    reqs, expected = [], []
    for i, prompt in enumerate(PROMPTS):
        expected.append(_reference_text(tok, hf_greedy(hf, tok, prompt, 10), []))
        reqs.append(Instance("generate_until", {}, (prompt, {"until": [], "max_gen_toks": 10, "do_sample": False}),
                             i, metadata=("t", i, 1)))
    key, fused = next(iter(attention.OWN_FORWARDS.items()))
    shapes = []

    def counted(module, hidden_states, *args, **kwargs):
        shapes.append(hidden_states.shape[1])
        return fused(module, hidden_states, *args, **kwargs)

    monkeypatch.setitem(attention.OWN_FORWARDS, key, counted)
    assert LensHeadsLM(model, progress=False, batch_size=2).generate_until(reqs) == expected
    assert 1 in shapes and max(shapes) > 1  # the prompt and the one-token steps after it ran fused


@pytest.mark.parametrize("choice", ["eager", "fused"])
def test_two_score_collectors_in_one_forward_both_get_their_statistics(as_set, choice):
    """Two hooks asking one layer's row statistics (two collectors in one forward) are both
    served, with the same numbers as each alone."""
    from lens_heads.scores.collector import ScoreCollector

    model = as_set("llama", choice)
    ids, mask = _batch(3, 20, left=True)
    alone = ScoreCollector(model, ["awft", "avvn"])
    forward(model, ids, mask, alone.hooks(mask), logits=False)
    a, b = ScoreCollector(model, ["awft", "avvn"]), ScoreCollector(model, ["aeqd", "awft"])
    forward(model, ids, mask, a.hooks(mask) + b.hooks(mask), logits=False)
    for s in ("awft", "avvn"):
        assert torch.equal(a.batch_scores()[s], alone.batch_scores()[s]), s
    assert torch.equal(b.batch_scores()["awft"], alone.batch_scores()["awft"])
    assert torch.isfinite(b.batch_scores()["aeqd"]).all()


def test_row_statistics_of_the_last_queries_are_those_rows_of_the_whole_pattern():
    """After a cached prefix the pattern holds the last q query rows of the whole one: each
    statistic of those rows (the local mass's keys t-2..t included) is the whole pattern's."""
    g = torch.Generator().manual_seed(0)
    k = 9
    scores = torch.randn(2, 3, k, k, generator=g).masked_fill(torch.ones(k, k, dtype=torch.bool).triu(1), float("-inf"))
    A = scores.softmax(-1)  # [b, h, k, k], causal
    first = torch.zeros(2, dtype=torch.long)
    whole = attention.RowStats.from_pattern(A, first)
    for q in (1, 2, 3, 5, k):
        part = attention.RowStats.from_pattern(A[:, :, k - q:], first)
        for name in ("first_weight", "entropy", "local_mass"):
            torch.testing.assert_close(getattr(part, name), getattr(whole, name)[..., k - q:], msg=f"{q} {name}")
    manual = sum(A[..., 6, 6 - d] for d in range(attention.LOCAL_WINDOW))
    torch.testing.assert_close(whole.local_mass[..., 6], manual)
