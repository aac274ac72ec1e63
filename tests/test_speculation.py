"""Speculative prefix sharing under a per-input score ablation (interventions/speculation.py,
docs/methods.md §2): inputs that share a prefix run only their suffix after a prefix computed
under a mask some input realised, and keep the result only where their own mask is that mask;
where it parts at layer k, the input's forward resumes there over the whole input.
Every check compares with the plain path, whole forwards of every input (``reuse_prefix=False``)."""

import math

import pytest
import torch

from conftest import TINY_ARCHS
from lens_heads.forward.engine import loglikelihoods_tokens
from lens_heads.interventions.ablation import ScoreAblation, StaticAblation
from lens_heads.forward.engine import Row
from lens_heads.interventions.speculation import Speculation, _Pending, population_prefixes
from lens_heads.models.hooks import attention_window
from lens_heads.scores import score_heads

SCORE = "ahon_ln"


def _requests(model, n_prefix: int = 90, per_group: int = 6) -> list[tuple[list[int], list[int]]]:
    """(context, continuation) token pairs as a few-shot task makes them: three groups, each a
    long shared prefix and short questions after it (1-token and 2-token continuations), plus
    one request that shares nothing."""
    g = torch.Generator().manual_seed(5)
    vocab = model.hf_model.config.vocab_size
    rnd = lambda n: torch.randint(5, vocab, (n,), generator=g).tolist()  # noqa: E731
    out = []
    for group in range(3):
        prefix = rnd(n_prefix + 5 * group)
        out += [(prefix + rnd(2 + k % 4), rnd(1 + k % 2)) for k in range(per_group)]
    return out + [(rnd(30), rnd(1))]


def _threshold(model, requests, fraction: float) -> float:
    """The unablated per-input scores' ``fraction`` quantile: zeroes about that share of heads."""
    hs = score_heads(model, [torch.tensor(c + x[:-1]) for c, x in requests], scores=[SCORE], batch_size=8,
                     keep_per_input=True, progress=False)
    s = hs.per_input[SCORE].flatten()
    return float(torch.quantile(s[torch.isfinite(s)].double(), fraction))


def _ablation(model, threshold: float) -> ScoreAblation:
    """The score ablation, its speculation costed for the tiny models: a forward of theirs costs
    its tokens, nothing fixed (the default's fixed cost would price a 90-token prefix out)."""
    abl = ScoreAblation(SCORE, threshold, model.geometry)
    abl.speculation = Speculation(fixed_tokens=0)  # off by default
    return abl


def _run(model, requests, ablation, **kw):
    with ablation.counting() as counts:
        lls = loglikelihoods_tokens(model, requests, ablation, batch_size=4, progress=False, **kw)
    return lls, counts.totals()


def _close(got, want):
    assert len(got) == len(want)
    for a, b in zip(got, want):
        assert math.isclose(a, b, rel_tol=1e-4, abs_tol=1e-4), (a, b)


@pytest.mark.parametrize("arch", TINY_ARCHS)
def test_inputs_after_a_shared_prefix_get_their_whole_forwards_results(arch, tiny_model):
    model = tiny_model(arch)
    requests = _requests(model)
    thr = _threshold(model, requests, 0.3)
    want, want_counts = _run(model, requests, ScoreAblation(SCORE, thr, model.geometry), reuse_prefix=False)
    abl = _ablation(model, thr)
    got, counts = _run(model, requests, abl)
    _close(got, want)
    assert counts == want_counts  # every input counted once, with the mask its whole forward zeroes
    c = abl.speculation.counts
    if attention_window(model) is not None:  # Gemma 3's 8-token window: a cache past it drops the prefix's keys
        assert c.whole == c.accepted == 0  # so nothing is shared
        return
    assert c.whole + c.accepted + c.rejected == 18  # every input that shares a prefix went one of these ways
    assert c.whole >= 3 and c.accepted > 0, c  # each prefix ran whole once at least; some inputs reused one
    # again with the entries of the first evaluation: those inputs now all run after a cached prefix
    whole = c.whole
    again, counts = _run(model, requests, abl)
    _close(again, want)
    assert counts == want_counts and c.whole == whole


@pytest.mark.parametrize("arch", ["llama", "gpt2"])
def test_a_prefix_computed_under_another_mask_is_never_kept(arch, tiny_model):
    """Entries from an ablation at another threshold: computed under masks these inputs do not
    realise. An input keeps its result only where its realised mask is its entry's, which makes
    that entry its own prefix; so the results are still the whole forwards'."""
    model = tiny_model(arch)
    requests = _requests(model)
    thr, other = _threshold(model, requests, 0.3), _threshold(model, requests, 0.5)
    want, want_counts = _run(model, requests, ScoreAblation(SCORE, thr, model.geometry), reuse_prefix=False)
    donor = _ablation(model, other)
    _run(model, requests, donor)
    abl = _ablation(model, thr)
    abl.speculation = donor.speculation
    before = donor.speculation.counts.rejected
    got, counts = _run(model, requests, abl)
    _close(got, want)
    assert counts == want_counts
    assert donor.speculation.counts.rejected > before  # the wrong prefixes were tried, refused, and resumed


def test_the_population_shares_prefixes_between_evaluations_of_one_input(tiny_model):
    """A search evaluates a batch of scattered questions at a time: with the population's
    prefixes, an input evaluated alone still finds its prefix's entries from earlier calls."""
    model = tiny_model("qwen2")
    requests = _requests(model)
    thr = _threshold(model, requests, 0.3)
    abl = _ablation(model, thr)
    abl.speculation.set_population(population_prefixes(model, [torch.tensor(c + x[:-1]) for c, x in requests]))
    got = []
    for r in requests:
        got += _run(model, [r], abl)[0]
    want, _ = _run(model, requests, ScoreAblation(SCORE, thr, model.geometry), reuse_prefix=False)
    _close(got, want)
    assert abl.speculation.counts.accepted > 0
    # without the population, one input alone shares nothing
    alone = _ablation(model, thr)
    for r in requests[:4]:
        _run(model, [r], alone)
    assert alone.speculation.counts.accepted == alone.speculation.counts.whole == 0


@pytest.mark.parametrize("arch", ["llama", "bloom"])
def test_an_ablation_that_zeroes_the_same_heads_everywhere_keeps_one_prefix_for_all_calls(arch, tiny_model):
    """The unablated point (and a static set) under kept prefixes: each prefix runs once in all
    the calls, every input after it; the results are still the whole forwards'."""
    model = tiny_model(arch)
    requests = _requests(model)
    population = population_prefixes(model, [torch.tensor(c + x[:-1]) for c, x in requests])
    for ablation in (None, StaticAblation([(0, 1), (1, 0)], model.geometry)):
        kept = Speculation(fixed_tokens=0)
        kept.set_population(population)
        got, counts = [], [0, 0]
        for r in requests:
            if ablation is None:
                got += loglikelihoods_tokens(model, [r], None, batch_size=4, progress=False, speculation=kept)
            else:
                lls, c = _run(model, [r], ablation, speculation=kept)
                got += lls
                counts = [a + b for a, b in zip(counts, c)]
        if ablation is None:
            want = loglikelihoods_tokens(model, requests, None, batch_size=4, progress=False, reuse_prefix=False)
        else:
            want, want_counts = _run(model, requests, ablation, reuse_prefix=False)
            assert tuple(counts) == tuple(want_counts)
        _close(got, want)
        assert kept.counts.accepted == 18 and kept.counts.whole == 0
        assert kept.n_entries == 3  # one per prefix, though every call held one input


def test_mmlu_questions_evaluated_one_call_each_find_their_subjects_prefixes(tiny_llama_2k, shared_data):
    """MMLU five-shot, as a search reads a point: one object for the ablation, the population's
    prefixes, one question per evaluation (two subjects, interleaved). Every question's
    log-likelihoods and the zeroed units are the whole forwards'."""
    from lens_heads.data import load_task
    from lens_heads.evaluation.evaluate import evaluate_task
    from lens_heads.forward.task_requests import record_inputs, select_records
    from lens_heads.models import load_model

    model = load_model(tiny_llama_2k)
    task = load_task("mmlu")
    population = select_records(task, 800, 1)
    subjects = sorted({r.subject for r in population})[:2]
    chosen = [r for s in subjects for r in population if r.subject == s][:12]
    chosen = chosen[::2] + chosen[1::2]
    seqs = record_inputs(model, task, chosen, 5, 1)
    thr = _threshold(model, [(s.tolist(), [0]) for s in seqs], 0.3)
    kw = dict(n_shot=5, seed=1, batch_size=4, progress=False)
    want = evaluate_task(model, task, ablation=ScoreAblation(SCORE, thr, model.geometry), reuse_prefix=False,
                         doc_ids=[r.doc_id for r in chosen], **kw)
    abl = _ablation(model, thr)
    abl.speculation.set_population(population_prefixes(model, record_inputs(model, task, population, 5, 1)))
    units = [0, 0]
    got = {}
    for r in chosen:
        res = evaluate_task(model, task, ablation=abl, doc_ids=[r.doc_id], **kw)
        got[r.doc_id] = res.questions[0].lls
        units = [a + b for a, b in zip(units, res.config["zeroed_units"])]
    for q in want.questions:
        _close(got[q.doc_id], q.lls)
    assert units == want.config["zeroed_units"]
    c = abl.speculation.counts
    assert c.accepted > c.whole >= 2, c  # each subject's first question ran whole; most later ones did not


def test_tries_stop_where_they_do_not_pay():
    """The cost rule: try an entry while the prefix's mean share of layers agreed (1 for a kept
    try, k/L for one resumed at layer k) beats (S + F) / (P + S + F)."""
    row = Row(list(range(100)), 0, [(0, [7])])  # a 90-token prefix, a 10-token suffix
    p = _Pending(row, tuple(range(90)))
    free = Speculation(fixed_tokens=0)  # a try pays where tries agree on more than 10 % of the layers
    assert free._worth(p)  # no record yet: (0 + 1) / (0 + 2)
    free._record[p.prefix] = (2.0, 30)  # 3/32
    assert not free._worth(p)
    free._record[p.prefix] = (4.0, 30)  # 5/32: e.g. four kept, or eight resumed half-way
    assert free._worth(p)
    costly = Speculation(fixed_tokens=150)  # (10 + 150) / 250: tries must agree on 64 % of the layers
    assert not costly._worth(p)
    costly._record[p.prefix] = (27.0, 30)
    assert costly._worth(p)
