"""``lens-heads score`` against a transcription of the authors' score code (psandovalsegura/
inactive-heads, ``monkey_patch_llama.py``), run inside plain HF eager attention on SmolLM2.

The transcription below restates, step by step, what their patched ``eager_attention_forward``
records per head (``module.head_scores``) for one unpadded input: attention weights with a NaN
causal mask and ``nanmean`` over query rows, entropy via ``nansum``, value norms after
``repeat_kv``, output norms before ``o_proj``, ``layer_context`` = mean over the layer's heads,
and LTHON(LN)'s denominator = the layer mean of the *token-averaged* output norm. It is written
independently of lens_heads (no import from it besides the CLI under test) and runs one input
per forward, so their padded-row averaging (a known bug, not copied) does not arise.
"""

from __future__ import annotations

import json

import pytest
import torch
from safetensors.torch import load_file

from lens_heads.cli import main as cli_main

# their HeadType name -> our score id (the 12 of the paper, then their extras)
THEIRS = {
    "Dormant": "awft", "NormalizedDormant": "awft_ln", "Entropy": "aeqd", "NormalizedEntropy": "aeqd_ln",
    "ValueVectorMagnitudeFirstToken": "ftvvn", "ValueVectorMagnitudeNormalizedFirstToken": "ftvvn_ln",
    "ValueVectorAvgMagnitude": "avvn", "ValueVectorAvgNormalizedMagnitude": "avvn_ln",
    "HeadOutputMagnitudeLastToken": "lthon", "HeadOutputMagnitudeNormalizedLastToken": "lthon_ln",
    "UnnormalizedHONOR": "ahon", "HONOR": "ahon_ln",
    "HeadOutputMagnitudeNormalizedHeadLastToken": "lthon_hn",
    "FullHeadOutput": "fhon", "FullHeadOutputNormalized": "fhon_ln",
}


def _repeat_kv(x, n_rep):
    b, h, s, d = x.shape
    return x if n_rep == 1 else x[:, :, None].expand(b, h, n_rep, s, d).reshape(b, h * n_rep, s, d)


def authors_attention(record):
    """An eager attention function that computes the output as HF does and appends the authors'
    per-head scores of this forward to ``record[layer]`` ({their name: [batch, head]})."""

    def forward(module, query, key, value, attention_mask, scaling, dropout=0.0, **kwargs):
        key_states = _repeat_kv(key, module.num_key_value_groups)
        value_states = _repeat_kv(value, module.num_key_value_groups)
        w = torch.matmul(query, key_states.transpose(2, 3)) * scaling
        if attention_mask is not None:
            w = w + attention_mask
        w = torch.nn.functional.softmax(w, dim=-1, dtype=torch.float32).to(query.dtype)
        out = torch.matmul(w, value_states)  # [B, H, S, D]
        s = {}
        # Dormant / NormalizedDormant: NaN above the diagonal, nanmean over query rows, column 0
        wc = w.detach().clone()
        wc[~torch.tril(torch.ones_like(wc)).bool()] = torch.nan
        first = wc.nanmean(dim=-2)[:, :, 0]
        s["Dormant"], s["NormalizedDormant"] = first, first / first.mean(dim=1)[:, None]
        # Entropy / NormalizedEntropy: -(w log w) nansum over keys, nanmean over queries
        ent = (-(wc * torch.log(wc)).nansum(dim=-1)).nanmean(dim=-1)
        s["Entropy"], s["NormalizedEntropy"] = ent, ent / ent.mean(dim=1)[:, None]
        # value vector norms (after repeat_kv): first token, and the mean over positions
        vn = value_states.norm(dim=-1)
        s["ValueVectorMagnitudeFirstToken"] = vn[:, :, 0]
        s["ValueVectorMagnitudeNormalizedFirstToken"] = vn[:, :, 0] / vn[:, :, 0].mean(dim=1)[:, None]
        avg_v = vn.nanmean(dim=-1)
        s["ValueVectorAvgMagnitude"], s["ValueVectorAvgNormalizedMagnitude"] = avg_v, avg_v / avg_v.mean(dim=1)[:, None]
        # head output norms before o_proj
        on = out.norm(dim=-1)  # [B, H, S]
        avg_o = on.nanmean(dim=-1)
        s["UnnormalizedHONOR"], s["HONOR"] = avg_o, avg_o / avg_o.mean(dim=1)[:, None]
        last = on[:, :, -1]
        s["HeadOutputMagnitudeLastToken"] = last
        s["HeadOutputMagnitudeNormalizedHeadLastToken"] = last / avg_o
        s["HeadOutputMagnitudeNormalizedLastToken"] = last / on.nanmean(dim=-1).mean(dim=1)[:, None]
        # FullHeadOutput(Normalized): ||z_h W_O^h|| averaged over positions
        hidden = module.o_proj.weight.shape[0]
        n_heads, d_head = out.shape[1], out.shape[-1]
        wo = module.o_proj.weight.view(hidden, n_heads, d_head).permute(1, 2, 0)  # [H, D, d_model]
        full = torch.einsum("bsnh,nhd->bsnd", out.transpose(1, 2), wo).norm(dim=-1).transpose(1, 2).nanmean(dim=-1)
        s["FullHeadOutput"], s["FullHeadOutputNormalized"] = full, full / full.mean(dim=1)[:, None]
        record.setdefault(module.layer_idx, []).append({k: v.detach().double() for k, v in s.items()})
        return out.transpose(1, 2).contiguous(), w

    return forward


@pytest.fixture(scope="module")
def c4_texts(shared_data):
    from lens_heads.data import load_texts

    return load_texts("c4", n=16)


def test_score_cli_matches_authors_code_on_smollm2(smollm2, c4_texts, shared_data, tmp_path, monkeypatch):
    """All 12 functions (and their extras) per input, <= 1e-5 relative, on 16 C4 texts x 128 tokens."""
    import transformers.models.llama.modeling_llama as llama

    from lens_heads.data import tokenize_texts

    monkeypatch.setenv("LENS_HEADS_DATA", str(shared_data))
    out = tmp_path / "scores.csv"
    assert cli_main(["score", "smollm2-135m", "--data", "c4", "--n-inputs", "16", "--max-len", "128",
                     "--scores", "all", "--per-input", "--out", str(out), "--quiet"]) == 0
    ours = load_file(str(out) + ".per_input.safetensors")

    seqs = tokenize_texts(smollm2.tokenizer, c4_texts, 128, mode="documents")  # what the CLI reads
    hf = smollm2.load_hf_model().float().eval()
    record: dict[int, list[dict]] = {}
    monkeypatch.setattr(llama, "eager_attention_forward", authors_attention(record))
    with torch.no_grad():
        for ids in seqs:
            hf(ids[None])
    n_layers = hf.config.num_hidden_layers
    worst = 0.0
    for name, sid in THEIRS.items():
        theirs = torch.stack([torch.cat([record[L][i][name] for L in range(n_layers)]) for i in range(len(seqs))])
        got = ours[sid].double()  # [input, layer, head]
        assert got.shape == theirs.shape, sid
        rel = ((got - theirs).abs() / theirs.abs().clamp_min(1e-12)).max().item()
        worst = max(worst, rel)
        assert rel <= 1e-5, f"{sid} ({name}): max relative difference {rel:.2e}"
    print(f"authors' code vs lens-heads score: {len(THEIRS)} functions x {len(seqs)} inputs, max rel {worst:.1e}")
    meta = json.loads((tmp_path / "scores.csv.meta.json").read_text())
    assert meta["n_inputs"] == len(seqs)
