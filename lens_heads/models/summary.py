"""Quick model summaries that need only attention patterns (used by ``lens-heads info``)."""

from __future__ import annotations

import torch
from jaxtyping import Float
from torch import Tensor

from lens_heads.data import iter_batches
from lens_heads.hooks import hook_name, layer_of, run_with_hooks


def first_token_attention(model, inputs: list[Tensor], batch_size: int = 4) -> Float[Tensor, "layer head"]:
    """Mean over inputs and real query positions of attention on position 0 (per head)."""
    g = model.geometry
    total = torch.zeros(g.n_layers, g.n_heads, dtype=torch.float64)
    count = 0
    pad = model.tokenizer.pad_token_id or 0
    for _, ids, mask in iter_batches(inputs, batch_size, pad_id=pad, side="right"):
        def hook(pattern, hook, mask=mask):
            m = mask.to(pattern.device, pattern.dtype)  # [b, q]
            first = pattern[..., 0] * m[:, None, :]  # [b, head, q]
            total[layer_of(hook)] += (first.sum(-1) / m.sum(-1, keepdim=True)).sum(0).double().cpu()

        run_with_hooks(model, ids, mask, [(hook_name("pattern", L), hook) for L in range(g.n_layers)],
                       return_logits=False)
        count += ids.shape[0]
    return (total / count).float()
