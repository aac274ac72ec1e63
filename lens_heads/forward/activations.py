"""Model -> activations: the attention patterns of chosen heads on one text.

``head_patterns(model, text, heads)`` runs ONE forward of ``text`` with hooks on
``hook_pattern`` of only the layers holding a requested head and returns the [head, q, k]
patterns with the text's tokens (``HeadPatterns``). Views (``viz.AttentionView``) only render
such a record; ``study.attention_heads`` is the notebook shortcut that does both.
``all_patterns(model, ids)`` is every head's pattern on given tokens, [layer, head, q, k], for
measures that compare whole patterns (the drift of surgery, ``surgery/drift.py``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Sequence

import numpy as np
import torch
from jaxtyping import Float, Int
from torch import Tensor

from lens_heads.errors import LensHeadsError
from lens_heads.forward.engine import forward
from lens_heads.models.hooks import hook_name, layer_of
from lens_heads.models.heads import Head

if TYPE_CHECKING:
    from lens_heads.models.load import LoadedModel


@dataclass
class HeadPatterns:
    """What one forward of ``text`` gives for ``heads``: tokens as strings and their patterns."""

    tokens: list[str]
    patterns: Float[np.ndarray, "head q k"]
    heads: list[Head]
    text: str = ""
    model_name: str = ""


def _token_strings(tokenizer, ids: Sequence[int]) -> list[str]:
    """One readable string per token (decoded one by one; spaces and newlines kept)."""
    return [tokenizer.decode([int(i)]) for i in ids]


def head_patterns(model: LoadedModel, text: str, heads: Sequence[Head] | None = None, max_tokens: int = 64) -> HeadPatterns:
    """Attention patterns of ``heads`` (default: every head) of ``model`` on ``text``, cut to
    its first ``max_tokens`` tokens."""
    g = model.geometry
    if heads is None:
        heads = [(L, h) for L in range(g.n_layers) for h in range(g.n_heads)]
    heads = [(int(L), int(h)) for L, h in heads]
    if not heads:
        raise LensHeadsError("no heads to show")
    for L, h in heads:
        g.check_head(L, h)
    ids = model.to_tokens(text)[0][:max_tokens]
    if ids.numel() == 0:
        raise LensHeadsError("text has no tokens")
    got: dict[int, torch.Tensor] = {}

    def grab(pattern, hook):
        got[layer_of(hook)] = pattern[0].float().cpu()  # [head, q, k]

    forward(model, ids[None], torch.ones(1, ids.numel(), dtype=torch.long),
            [(hook_name("pattern", L), grab) for L in sorted({L for L, _ in heads})], logits=False)
    patterns = torch.stack([got[L][h] for L, h in heads]).numpy()
    return HeadPatterns(_token_strings(model.tokenizer, ids.tolist()), patterns, heads, text, model.name)


def all_patterns(model: LoadedModel, ids: Int[Tensor, "pos"]) -> Float[Tensor, "layer head q k"]:
    """Every head's attention pattern (float32, on the CPU) of one forward of the 1-D token
    tensor ``ids`` (no padding): one hook on ``hook_pattern`` per layer."""
    g = model.geometry
    if ids.ndim != 1 or ids.numel() == 0:
        raise LensHeadsError("all_patterns takes one non-empty 1-D token tensor")
    got: dict[int, Tensor] = {}

    def grab(pattern, hook):
        got[layer_of(hook)] = pattern[0].float().cpu()  # [head, q, k]

    forward(model, ids[None], torch.ones(1, ids.numel(), dtype=torch.long),
            [(hook_name("pattern", L), grab) for L in range(g.n_layers)], logits=False)
    return torch.stack([got[L] for L in range(g.n_layers)])
