"""Shrinking a Hugging Face model's attention layers to the heads a pruning plan keeps.

Self-contained on purpose (torch and transformers only, no lens_heads imports): an exported
pruned model carries a copy of this file as its remote code, so
``AutoModelForCausalLM.from_pretrained(folder, trust_remote_code=True)`` rebuilds it without
lens_heads installed. lens_heads' own loader runs the same ``shrink``.

The plan lives in the config as ``lens_heads_pruned``::

    {"layout": "separate" | "blocked" | "interleaved", "layers": "model.layers", "attn": "self_attn",
     "q": "q_proj", "k": "k_proj", "v": "v_proj", "out": "o_proj", "d_head": 64,
     "keep_q": [[...], ...],   # per layer: the original query heads kept, in order
     "keep_kv": [[...], ...],  # per layer: the original KV heads kept
     "pad_q": [[...], ...]}    # per layer: kept query heads whose output columns are zero

``separate``: one Linear per projection, head g owning rows [g*d, (g+1)*d) (Llama, Qwen2,
Gemma 3, Mistral). With ``"full_norms": {"q": "q_norm", "k": "k_norm"}`` (OLMo-2, whose query
and key norms span all heads' features) the query and key projections stay whole, because the
kept heads' normalisation reads every head, and the norms' outputs are narrowed to the kept
heads (a forward hook); values and the output projection shrink as usual.
``blocked``: GPT-2's fused ``c_attn`` Conv1D, output features [q | k | v], each head-major.
``interleaved``: BLOOM's fused ``query_key_value`` Linear, output features [head, q | k | v, d];
the model builds its ALiBi bias for all heads once, so each pruned block narrows it to its kept
heads' slopes (a forward pre-hook).

The output projection keeps the kept heads' input features; a padding head (kept so that every
KV group keeps the same number of query heads) has them set to zero.
"""

from __future__ import annotations

import torch
from torch import nn


def _row_list(d: int, heads) -> list[int]:
    """Feature indices of ``heads`` (each ``d`` wide, head-major)."""
    return [h * d + i for h in heads for i in range(d)]


def _rows(d: int, heads) -> torch.Tensor:
    return torch.tensor(_row_list(d, heads), dtype=torch.long)


def _zero_padding(out: nn.Module, keep_q, pad: set, d: int, in_dim: int) -> None:
    """Zero the output projection's input features (along ``in_dim`` of its weight) that read
    the padding heads among ``keep_q``."""
    for j, h in enumerate(keep_q):
        if h in pad:
            out.weight.data.narrow(in_dim, j * d, d).zero_()


def _linear(old: nn.Linear, out_idx=None, in_idx=None) -> nn.Linear:
    w = old.weight.data
    w = w if out_idx is None else w[out_idx]
    w = w if in_idx is None else w[:, in_idx]
    new = nn.Linear(w.shape[1], w.shape[0], bias=old.bias is not None, device=w.device, dtype=w.dtype)
    new.weight.data.copy_(w)
    if old.bias is not None:
        new.bias.data.copy_(old.bias.data if out_idx is None else old.bias.data[out_idx])
    return new


def _conv1d(old, out_idx=None, in_idx=None):
    """A transformers ``Conv1D`` (weight [in, out]) keeping output features ``out_idx`` / input rows ``in_idx``."""
    from transformers.pytorch_utils import Conv1D

    w = old.weight.data
    w = w if out_idx is None else w[:, out_idx]
    w = w if in_idx is None else w[in_idx]
    new = Conv1D(w.shape[1], w.shape[0]).to(device=w.device, dtype=w.dtype)
    new.weight.data.copy_(w)
    new.bias.data.copy_(old.bias.data if out_idx is None else old.bias.data[out_idx])
    return new


def _keep_features(index: list[int]):
    """A forward hook keeping the output features ``index`` of a norm over all heads' features,
    after it has normalised over all of them (a list, not a tensor: see ``_alibi_of``)."""

    def hook(module, args, output):
        return output[..., index]

    return hook


def _alibi_of(n: int, keep):
    """A block pre-hook narrowing the model-wide ALiBi bias [batch * n, 1, kv] to the heads ``keep``."""
    index = list(keep)  # a list, not a tensor: from_pretrained may run __init__ on the meta device

    def narrow(alibi: torch.Tensor) -> torch.Tensor:
        rest = alibi.shape[1:]
        return alibi.reshape(-1, n, *rest)[:, index].reshape(-1, *rest)

    def hook(module, args, kwargs):
        if kwargs.get("alibi") is not None:
            kwargs["alibi"] = narrow(kwargs["alibi"])
        elif len(args) > 1:  # BloomBlock.forward(hidden_states, alibi, ...)
            args = (args[0], narrow(args[1]), *args[2:])
        return args, kwargs

    return hook


def _get(obj, path: str):
    for part in path.split("."):
        obj = getattr(obj, part)
    return obj


def shrink(model: nn.Module, plan: dict) -> nn.Module:
    """Replace every layer's attention projections by the kept heads' slices (in place); set the
    per-layer head counts the attention modules read. Returns ``model``."""
    d = int(plan["d_head"])
    blocks = _get(model, plan["layers"])
    for L, block in enumerate(blocks):
        attn = _get(block, plan["attn"])
        keep_q, keep_kv, pad = plan["keep_q"][L], plan["keep_kv"][L], set(plan["pad_q"][L])
        q_idx, kv_idx = _rows(d, keep_q), _rows(d, keep_kv)
        out_mod = _get(attn, plan["out"])
        if plan["layout"] == "separate":
            norms = plan.get("full_norms") or {}  # OLMo-2: q/k norms over all heads' features
            for part, heads, idx in (("q", keep_q, q_idx), ("k", keep_kv, kv_idx)):
                if part in norms:  # the projection stays whole (the norm needs every head); keep after it
                    _get(attn, norms[part]).register_forward_hook(_keep_features(_row_list(d, heads)))
                else:
                    setattr(attn, plan[part], _linear(_get(attn, plan[part]), out_idx=idx))
            setattr(attn, plan["v"], _linear(_get(attn, plan["v"]), out_idx=kv_idx))
            new_out = _linear(out_mod, in_idx=q_idx)
            _zero_padding(new_out, keep_q, pad, d, in_dim=1)
            attn.num_key_value_groups = len(keep_q) // len(keep_kv)
        elif plan["layout"] == "blocked":  # GPT-2: one head per KV head, [q | k | v] blocks of n_heads*d
            n = out_mod.weight.shape[0] // d  # the layer's heads before pruning (c_proj rows)
            fused = torch.cat([q_idx, q_idx + n * d, q_idx + 2 * n * d])
            setattr(attn, plan["q"], _conv1d(_get(attn, plan["q"]), out_idx=fused))
            new_out = _conv1d(out_mod, in_idx=q_idx)  # Conv1D weight: [in, out]
            _zero_padding(new_out, keep_q, pad, d, in_dim=0)
            attn.num_heads, attn.split_size = len(keep_q), len(keep_q) * d
        elif plan["layout"] == "interleaved":  # BLOOM: one head per KV head, features [head, q|k|v, d]
            n = out_mod.weight.shape[1] // d  # the layer's heads before pruning (dense inputs)
            fused = _rows(3 * d, keep_q)
            setattr(attn, plan["q"], _linear(_get(attn, plan["q"]), out_idx=fused))
            new_out = _linear(out_mod, in_idx=q_idx)
            _zero_padding(new_out, keep_q, pad, d, in_dim=1)
            attn.num_heads = len(keep_q)
            # the model builds ALiBi for all n heads once; this layer keeps its heads' slopes
            block.register_forward_pre_hook(_alibi_of(n, keep_q), with_kwargs=True)
        else:
            raise ValueError(f"unknown pruning layout {plan['layout']!r}")
        setattr(attn, plan["out"], new_out)
        for name in ("num_heads", "num_attention_heads"):
            if plan["layout"] == "separate" and isinstance(getattr(attn, name, None), int):
                setattr(attn, name, len(keep_q))
        if isinstance(getattr(attn, "num_key_value_heads", None), int):
            attn.num_key_value_heads = len(keep_kv)
    return model


def pruned_class(base):
    """A subclass of the transformers class ``base`` whose ``__init__`` shrinks itself to the
    config's ``lens_heads_pruned`` plan (the class an exported folder's remote code defines)."""

    class LensHeadsPruned(base):
        def __init__(self, config, *args, **kwargs):
            super().__init__(config, *args, **kwargs)
            shrink(self, config.lens_heads_pruned)

    LensHeadsPruned.__name__ = LensHeadsPruned.__qualname__ = f"LensHeadsPruned{base.__name__}"
    return LensHeadsPruned
