"""Batch size ``auto``: larger batches for shorter inputs, a budget on the CPU, and a forward that
runs out of memory split and retried with the same results."""

from __future__ import annotations

import pytest
import torch

from lens_heads import LensHeadsError
from lens_heads.batching import CPU_TOKEN_BUDGET, MAX_AUTO, Batcher, auto_batch_size, parse_batch_size

TEXTS = ["The capital of France is Paris. The capital of Italy is Rome.", "Attention heads", "A B C D",
         "Question: How do I boil an egg? Answer: put it in boiling water.", "dormant heads do nothing"] * 3


def test_auto_picks_larger_batches_for_shorter_inputs(tiny_model, monkeypatch):
    model = tiny_model("llama")
    monkeypatch.delenv("LENS_HEADS_TOKEN_BUDGET", raising=False)
    sizes = [auto_batch_size(model, n) for n in (8, 64, 512, 10_000)]
    assert sizes == [min(MAX_AUTO, CPU_TOKEN_BUDGET // n) or 1 for n in (8, 64, 512, 10_000)]
    assert sizes[0] > sizes[1] > sizes[2] > sizes[3] == 1
    monkeypatch.setenv("LENS_HEADS_TOKEN_BUDGET", "1024")
    assert auto_batch_size(model, 64) == 16


def test_parse_batch_size():
    assert parse_batch_size("auto") == "auto" and parse_batch_size(" AUTO ") == "auto"
    assert parse_batch_size("12") == 12 and parse_batch_size(3) == 3
    for bad in ("0", "-2", "x", 1.5, None):
        with pytest.raises(LensHeadsError, match="positive integer or 'auto'"):
            parse_batch_size(bad)


def test_sizes_that_must_be_a_number_are_one_clear_error(tmp_path):
    """Where ``auto`` cannot apply (a Batcher, batch bounds, shard cuts, a sweep's scoring batch,
    perplexity batches), a size that is not a positive integer is one LensHeadsError, never a
    loop or a raw TypeError."""
    from lens_heads.batching import batch_bounds, even_batch
    from lens_heads.data.corpora import iter_batches
    from lens_heads.interventions.thresholds import scoring_shards

    calls = []
    for bad in (0, -1, 2.5, "x", None, "auto"):
        for make in (lambda b: Batcher(b), lambda b: batch_bounds([3, 2, 1], b, None),
                     lambda b: list(iter_batches([[1, 2], [3]], b))):
            with pytest.raises(LensHeadsError, match="positive integer"):
                make(bad)
    Batcher(2).run([], calls.append, [])
    assert calls == [] and even_batch([], 8) == 0 and batch_bounds([], 2, 8) == [0]
    seqs = [torch.ones(n, dtype=torch.long) for n in (3, 2, 1)]
    for bad in (0, 2.5, "2", None, True):
        with pytest.raises(LensHeadsError, match="n_shards must be a positive integer"):
            scoring_shards(seqs, 2, bad, None)


def test_a_sweep_checks_its_scoring_batch_size(tmp_path):
    from lens_heads.sweep.config import SweepConfig

    assert SweepConfig(task="piqa", score_ids=["ahon_ln"], threshold_batch_size="8").threshold_batch_size == 8
    for bad in (0, "auto", 2.5):
        with pytest.raises(LensHeadsError, match="positive integer"):
            SweepConfig(task="piqa", score_ids=["ahon_ln"], threshold_batch_size=bad)


def _oom_above(limit: int):
    def fn(chunk):
        if len(chunk) > limit:
            raise torch.cuda.OutOfMemoryError("CUDA out of memory (simulated)")
    return fn


def test_batcher_halves_a_batch_that_runs_out_of_memory_and_keeps_the_smaller_size():
    seen = []
    oom = _oom_above(3)

    def fn(chunk):
        oom(chunk)
        seen.append(list(chunk))

    b = Batcher(8)
    b.run(list(range(13)), fn)
    assert [x for c in seen for x in c] == list(range(13))  # every item once, in order
    assert b.size == 2 and all(len(c) <= 3 for c in seen)
    with pytest.raises(torch.cuda.OutOfMemoryError):  # one item that does not fit fails for real
        Batcher(4).run([1, 2], _oom_above(0))
    with pytest.raises(ValueError):  # other errors are not retried
        Batcher(4).run([1, 2], lambda c: (_ for _ in ()).throw(ValueError("no")))


def test_batches_of_long_inputs_close_before_padding_is_waste():
    """Longest first: once a batch holds MIN_BATCH_TOKENS real tokens it stops before an input
    that would be padded by more than MAX_PAD_SHARE of its length; short inputs fill a batch."""
    from lens_heads.batching import MAX_PAD_SHARE, MIN_BATCH_TOKENS

    assert (MIN_BATCH_TOKENS, MAX_PAD_SHARE) == (2048, 0.1)  # the cases below are written for these
    lengths = [1000, 990, 980, 700, 690, 680, 670, 300, 290]
    seen = []
    Batcher(16, None).run(list(range(len(lengths))), lambda c: seen.append(len(c)), lengths)
    assert seen == [9]  # no floor (a GPU): the batch size alone decides
    seen.clear()
    Batcher(16, 2048).run(list(range(len(lengths))), lambda c: seen.append(list(c)), lengths)
    assert seen == [[0, 1, 2], [3, 4, 5, 6], [7, 8]]
    padded = sum(len(c) * lengths[c[0]] for c in seen)
    assert padded == 6400 < len(lengths) * lengths[0]  # one batch would run 9,000 positions
    seen.clear()
    Batcher(16, 2048).run(list(range(40)), lambda c: seen.append(len(c)), [50] * 20 + [20] * 20)
    assert seen == [16, 16, 8]  # never 2,048 real tokens: the batch size decides
    seen.clear()
    Batcher(2, 2048).run(list(range(5)), lambda c: seen.append(len(c)), [3000, 1000, 1000, 900, 10])
    assert seen == [1, 2, 2]  # a single input past the token floor closes its batch too
    with pytest.raises(LensHeadsError, match="3 lengths for 5 items"):
        Batcher(2, 2048).run(list(range(5)), lambda c: None, [3, 2, 1])


def test_batches_close_early_on_a_cpu_only(tiny_model):
    from types import SimpleNamespace

    from lens_heads.batching import MIN_BATCH_TOKENS, batch_floor

    assert batch_floor(tiny_model("llama")) == MIN_BATCH_TOKENS == Batcher.for_inputs(4, tiny_model("llama"), 9).floor
    assert batch_floor(SimpleNamespace(device="cuda:0")) is None and batch_floor(SimpleNamespace(device="mps")) is None


def test_a_run_of_whole_batches_forms_the_same_batches_alone():
    """What sharded scoring passes rely on (``thresholds.scoring_shards``): any contiguous run of
    the batches a pass forms, run alone, forms the same batches -- early closes included."""
    from lens_heads.batching import batch_bounds
    from lens_heads.interventions.thresholds import scoring_shards

    g = torch.Generator().manual_seed(0)
    lengths = sorted(torch.randint(20, 1500, (80,), generator=g).tolist(), reverse=True)
    bounds = batch_bounds(lengths, 16, 2048)
    sizes = [b - a for a, b in zip(bounds, bounds[1:])]
    assert any(n < 16 for n in sizes[:-1]) and any(n == 16 for n in sizes)  # both rules at work
    seen = []
    Batcher(16, 2048).run(list(range(len(lengths))), lambda c: seen.append(len(c)), lengths)
    assert seen == sizes
    for i in range(len(bounds) - 1):
        for j in range(i + 1, len(bounds)):
            assert batch_bounds(lengths[bounds[i]:bounds[j]], 16, 2048) == [b - bounds[i] for b in bounds[i:j + 1]]
    inputs = [torch.zeros(n, dtype=torch.long) for n in lengths[::-1]]  # any order: shards sort them
    order = sorted(range(len(inputs)), key=lambda i: -len(inputs[i]))
    for n_shards in (2, 3, 5):
        for shard in filter(None, scoring_shards(inputs, 16, n_shards, 2048)):
            at = [order.index(i) for i in shard]  # places in the whole pass
            assert at == list(range(at[0], at[-1] + 1)) and at[0] in bounds and at[-1] + 1 in bounds
    with pytest.raises(LensHeadsError, match="positive integer"):
        scoring_shards(inputs, 0, 2, 2048)


def test_evaluation_and_scores_recover_from_a_simulated_oom(tiny_model, monkeypatch):
    import lens_heads.forward.engine as engine
    import lens_heads.evaluation.evaluate as ev
    import lens_heads.models.hooks as hooks
    import lens_heads.scores.dataset as ds
    from lens_heads.scores import score_heads

    model = tiny_model("llama")
    reqs = [(t, " and more") for t in TEXTS]
    ref = ev.loglikelihoods(model, reqs, batch_size=1, progress=False)
    ref_scores = score_heads(model, TEXTS, "all", batch_size=1, progress=False)
    real = hooks.run_with_hooks
    calls = []

    def tight(model_, ids, *a, **k):
        calls.append(ids.shape[0])
        if ids.shape[0] > 2:
            raise torch.cuda.OutOfMemoryError("CUDA out of memory (simulated)")
        return real(model_, ids, *a, **k)

    monkeypatch.setattr(engine, "run_with_hooks", tight)  # every forward goes through the engine
    got = ev.loglikelihoods(model, reqs, batch_size="auto", progress=False)
    assert max(calls) > 2 and got == pytest.approx(ref, abs=1e-4)
    calls.clear()
    scores = score_heads(model, TEXTS, "all", batch_size="auto", progress=False)
    assert max(calls) > 2
    for sid in ref_scores.score_ids:
        torch.testing.assert_close(scores.mean[sid], ref_scores.mean[sid], atol=1e-5, rtol=1e-5, equal_nan=True)
    assert scores.n == len(TEXTS) and all(int(c.max()) == len(TEXTS) for c in scores.count.values())


def test_cli_batch_size_auto_is_the_default_and_a_bad_one_is_a_usage_error(capsys):
    from lens_heads.cli import build_parser, main

    p = build_parser()
    for cmd in (["evaluate", "m", "--task", "piqa"], ["sweep", "m", "--task", "piqa", "--out", "o"],
                ["score", "m", "--data", "d", "--out", "o"]):
        assert p.parse_args(cmd).batch_size == "auto"
    assert main(["evaluate", "m", "--task", "piqa", "--batch-size", "lots"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "--batch-size must be >= 1 or auto, got 'lots'" in err[0]
