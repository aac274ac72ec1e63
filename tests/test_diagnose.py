"""Diagnosis: statistics on hand-built patterns, classes and their order, parity with HF
``output_attentions`` via naive loops, band, CSV round trip, and the CLI."""

from __future__ import annotations

import math

import pandas as pd
import pytest
import torch
from transformers import AutoModelForCausalLM

from conftest import SAMPLE_TEXTS
from lens_heads import LensHeadsError
from lens_heads.cli import main
from lens_heads.surgery.diagnose import Diagnosis, DiagnosisThresholds, classify, diagnose, pattern_stats

T = 16


def _row_norm(a: torch.Tensor) -> torch.Tensor:
    return a / a.sum(-1, keepdim=True)


def synthetic_patterns(T: int = T) -> torch.Tensor:
    """[head, q, k] causal patterns: dead, bos-sink, low-entropy, local, healthy (uniform)."""
    causal = torch.tril(torch.ones(T, T))
    dead = torch.zeros(T, T)
    dead[:, 0] = 1.0
    sink = causal.clone()
    sink[1:, 0] = 0
    sink = _row_norm(sink) * 0.3
    sink[1:, 0] = 0.7
    sink[0] = 0
    sink[0, 0] = 1
    low = torch.zeros(T, T)
    for t in range(T):
        low[t, max(1, t // 2) if t else 0] = 1.0  # one key per row, never the first token after t=0
    local = torch.zeros(T, T)
    for t in range(T):
        local[t, max(0, t - 2): t + 1] = 1.0
    local = _row_norm(local)
    uniform = _row_norm(causal)
    return torch.stack([dead, sink, low, local, uniform])


def naive_stats(A: torch.Tensor) -> tuple[float, float, float]:
    """Loops straight from the definitions, for one [q, k] pattern without padding."""
    n = A.shape[0]
    bos = sum(A[t, 0].item() for t in range(n)) / n
    ent = sum(-sum(A[t, j].item() * math.log(max(A[t, j].item(), 1e-10)) for j in range(n)) for t in range(n)) / n
    rows = [t for t in range(n) if t >= 3]
    loc = sum(A[t, t - 2].item() + A[t, t - 1].item() + A[t, t].item() for t in rows) / len(rows) if rows else math.nan
    return bos, ent, loc


def test_pattern_stats_and_classes_on_hand_built_patterns():
    P = synthetic_patterns()
    bos, ent, loc = pattern_stats(P[None], torch.ones(1, T, dtype=torch.long))
    for h in range(P.shape[0]):
        nb, ne, nl = naive_stats(P[h])
        assert bos[0, h].item() == pytest.approx(nb, abs=1e-6)
        assert ent[0, h].item() == pytest.approx(ne, abs=1e-5)
        assert loc[0, h].item() == pytest.approx(nl, abs=1e-6)
    assert classify(bos[0], ent[0], loc[0]) == ["dead", "bos_sink", "low_entropy", "local", "healthy"]
    # the local head's rows t >= 3 put all their mass on the last 3 positions
    assert loc[0, 3].item() == pytest.approx(1.0)
    assert bos[0, 1].item() == pytest.approx((1 + 0.7 * (T - 1)) / T)


def test_class_order_and_thresholds():
    # dead wins over low entropy; bos_sink wins over local; NaN local mass is never "local"
    bos = torch.tensor([0.96, 0.6, 0.2, 0.2, 0.2])
    ent = torch.tensor([0.1, 1.0, 0.4, 1.0, 1.0])
    loc = torch.tensor([0.9, 0.9, 0.9, math.nan, 0.61])
    assert classify(bos, ent, loc) == ["dead", "bos_sink", "low_entropy", "healthy", "local"]
    loose = DiagnosisThresholds(dead=0.99, bos_sink=0.95, low_entropy=0.05, local=0.95)
    assert classify(bos, ent, loc, loose) == ["bos_sink", "healthy", "healthy", "healthy", "healthy"]
    assert classify(bos.reshape(1, 5), ent.reshape(1, 5), loc.reshape(1, 5)) == [classify(bos, ent, loc)]


@pytest.mark.parametrize("side", ["right", "left"])
def test_padding_is_excluded(side):
    P = synthetic_patterns(10)  # a 10-token input padded to 16
    padded = torch.zeros(5, T, T)
    mask = torch.zeros(1, T, dtype=torch.long)
    sl = slice(0, 10) if side == "right" else slice(6, 16)
    padded[:, sl, sl] = P
    padded[:, [i for i in range(T) if not (sl.start <= i < sl.stop)], :] = 1.0 / T  # junk on pad rows
    mask[0, sl] = 1
    got = pattern_stats(padded[None], mask)
    want = pattern_stats(P[None], torch.ones(1, 10, dtype=torch.long))
    for g, w in zip(got, want):
        assert torch.allclose(g, w, atol=1e-6)


def test_short_inputs_have_no_local_mass():
    P = synthetic_patterns(3)
    _, _, loc = pattern_stats(P[None], torch.ones(1, 3, dtype=torch.long))
    assert torch.isnan(loc).all()


@pytest.mark.parametrize("arch", ["bloom", "llama"])
def test_diagnose_matches_hf_output_attentions(arch, tiny_model, tiny_model_dir):
    model = tiny_model(arch)
    texts = ["The capital of France is Paris. The capital of Italy is Rome.", "Attention heads", "A B C D"]
    diag = diagnose(model, texts, batch_size=2)
    hf = AutoModelForCausalLM.from_pretrained(tiny_model_dir(arch), attn_implementation="eager").eval()
    g = model.geometry
    sums = torch.zeros(3, g.n_layers, g.n_heads, dtype=torch.float64)
    n_loc = torch.zeros(g.n_layers, g.n_heads)
    for text in texts:
        ids = model.to_tokens(text)[0][None]
        with torch.no_grad():
            atts = hf(ids, output_attentions=True).attentions
        for L in range(g.n_layers):
            for h in range(g.n_heads):
                b, e, l = naive_stats(atts[L][0, h].double())
                sums[0, L, h] += b
                sums[1, L, h] += e
                if not math.isnan(l):
                    sums[2, L, h] += l
                    n_loc[L, h] += 1
    assert torch.allclose(diag.bos_mass.double(), sums[0] / 3, atol=1e-5)
    assert torch.allclose(diag.entropy.double(), sums[1] / 3, atol=1e-5)
    assert torch.allclose(diag.local_mass.double(), sums[2] / n_loc, atol=1e-5)
    assert diag.n_inputs == 3
    if g.arch.alibi:
        assert torch.equal(diag.alibi_slopes, g.alibi_slopes().float())
    else:
        assert diag.alibi_slopes is None


def _hook_loop_diagnosis(model, texts, batch_size):
    """The accumulator diagnose used before it ran on the score collector, kept as a frozen
    reference: its own hook on each layer's hook_pattern, pattern_stats inside the hook, sums
    over the batch per layer in float32, then float64 on the CPU."""
    from lens_heads.data import iter_batches
    from lens_heads.surgery.diagnose import as_token_inputs
    from lens_heads.models.hooks import hook_name, layer_of, run_with_hooks

    g = model.geometry
    seqs = as_token_inputs(model, texts)
    sums = torch.zeros(3, g.n_layers, g.n_heads, dtype=torch.float64)
    local_n = torch.zeros(g.n_layers, g.n_heads, dtype=torch.float64)
    for _, ids, mask in iter_batches(seqs, batch_size, pad_id=model.tokenizer.pad_token_id or 0, side="right"):
        def hook(pattern, hook, mask=mask):
            L = layer_of(hook)
            bos, ent, loc = pattern_stats(pattern, mask)
            sums[0, L] += bos.sum(0).double().cpu()
            sums[1, L] += ent.sum(0).double().cpu()
            sums[2, L] += loc.nan_to_num(0.0).sum(0).double().cpu()
            local_n[L] += (~loc.isnan()).sum(0).double().cpu()

        run_with_hooks(model, ids, mask, [(hook_name("pattern", L), hook) for L in range(g.n_layers)],
                       return_logits=False)
    n = len(seqs)
    return (sums[0] / n).float(), (sums[1] / n).float(), (sums[2] / local_n).float()


@pytest.mark.parametrize("arch", ["llama", "bloom", "gemma3"])
def test_diagnose_is_bitwise_the_hook_loop(arch, tiny_model):
    """Diagnosis through the score collector gives exactly (bitwise) the numbers of the old
    hand-written pattern hooks, whatever the batch size (padding, several batches)."""
    model = tiny_model(arch)
    texts = SAMPLE_TEXTS + ["A B C", "x", "Hello world, this is a much longer text " * 5, "ab"]
    for batch_size in (3, 8, 16):
        want = _hook_loop_diagnosis(model, texts, batch_size)
        model.attention = "eager"  # bitwise: the same pattern, reduced by the collector
        try:
            diag = diagnose(model, texts, batch_size=batch_size)
        finally:
            model.attention = "auto"
        fused = diagnose(model, texts, batch_size=batch_size)  # from the fused kernel's row statistics
        for name, got, w, f in zip(("bos_mass", "entropy", "local_mass"),
                                   (diag.bos_mass, diag.entropy, diag.local_mass), want,
                                   (fused.bos_mass, fused.entropy, fused.local_mass)):
            assert not got.isnan().any(), name
            assert torch.equal(got, w), f"{arch} batch {batch_size} {name}: max diff {(got - w).abs().max()}"
            assert torch.allclose(f, w, rtol=1e-4, atol=1e-6), f"{arch} fused {name}: {(f - w).abs().max()}"


def test_band_counts_and_csv_round_trip(tmp_path):
    # 4 layers x 3 heads: head 0 sick in 2 of 4 layers (50 % > 30 %), head 1 in 1 of 4 (25 %), head 2 never
    bos = torch.full((4, 3), 0.2)
    bos[0, 0], bos[1, 0], bos[2, 1] = 0.99, 0.7, 0.7
    ent = torch.full((4, 3), 1.5)
    loc = torch.full((4, 3), 0.3)
    d = Diagnosis(bos, ent, loc, torch.tensor([0.5, 0.25, 0.125]), n_inputs=7)
    assert d.band() == [0]
    assert d.counts() == {"dead": 1, "bos_sink": 2, "low_entropy": 0, "local": 0, "healthy": 9}
    assert d.healthy_count == 9
    assert d.heads(["bos_sink"]) == [(1, 0), (2, 1)]
    assert d.heads() == [(0, 0), (1, 0), (2, 1)]
    with pytest.raises(LensHeadsError, match="unknown head class"):
        d.heads(["zombie"])
    path = d.save(tmp_path / "sub" / "diag.csv")
    df = pd.read_csv(path)
    assert list(df.columns) == ["layer", "head", "bos_mass", "entropy", "local_mass", "class", "alibi_slope"]
    assert df["class"].tolist()[:3] == ["dead", "healthy", "healthy"]
    back = Diagnosis.load(path)
    assert back.classes == d.classes
    assert torch.allclose(back.bos_mass, bos) and torch.allclose(back.alibi_slopes, d.alibi_slopes)
    assert [p.name for p in path.parent.iterdir()] == ["diag.csv"]  # no temp files left


def test_cli_diagnose(tiny_model_dir, tmp_path, capsys):
    data = tmp_path / "texts.txt"
    data.write_text("The capital of France is Paris.\nAttention heads that do nothing are dormant.\n")
    out = tmp_path / "d.csv"
    rc = main(["diagnose", str(tiny_model_dir("bloom")), "--data", str(data), "--n-inputs", "2",
               "--max-len", "32", "--out", str(out)])
    assert rc == 0
    text = capsys.readouterr().out
    assert "healthy" in text and "band" in text and "ALiBi slope" in text
    df = pd.read_csv(out)
    assert {"layer", "head", "bos_mass", "entropy", "class"} <= set(df.columns) and len(df) == 8
    assert main(["diagnose", str(tiny_model_dir("bloom")), "--data", str(data), "--out", str(tmp_path / "x.txt")]) == 2
    assert main(["diagnose", str(tmp_path / "nope"), "--data", str(data), "--out", str(tmp_path / "y.csv")]) == 2
    assert "error" in capsys.readouterr().err
    assert not (tmp_path / "y.csv").exists()
