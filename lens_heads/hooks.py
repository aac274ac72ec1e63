"""The only module that knows TransformerLens hook names and shapes.

Hook points read and written by lens_heads (TransformerBridge, TL >= 4.3):

- ``blocks.{L}.attn.hook_pattern``  Float[Tensor, "batch head q k"]    attention probabilities
- ``blocks.{L}.attn.hook_v``        Float[Tensor, "batch pos kv_head d_head"]  values (KV heads)
- ``blocks.{L}.attn.hook_z``        Float[Tensor, "batch pos head d_head"]  head outputs before W_O

Within one layer they fire in that order (pattern and v, then z), so a hook on ``hook_z``
can use statistics gathered at ``hook_pattern``/``hook_v`` of the same layer in the same
pass -- this is what per-input ablation relies on.
"""

from __future__ import annotations

from typing import Callable, Iterable, Literal

import torch
from jaxtyping import Float, Int
from torch import Tensor

HookKind = Literal["pattern", "v", "z"]
HOOK_POINTS: dict[str, str] = {
    "pattern": "blocks.{layer}.attn.hook_pattern",
    "v": "blocks.{layer}.attn.hook_v",
    "z": "blocks.{layer}.attn.hook_z",
}
# TransformerLens hook signature: fn(activation, hook) -> activation | None
HookFn = Callable[[Tensor, object], Tensor | None]


def hook_name(kind: HookKind, layer: int) -> str:
    return HOOK_POINTS[kind].format(layer=layer)


def layer_of(hook) -> int:
    """Layer index of a TransformerLens hook object (``blocks.{L}.attn...``)."""
    return int(hook.name.split(".")[1])  # canonical names differ from aliases, the layer does not


def run_with_hooks(
    model,
    input_ids: Int[Tensor, "batch pos"],
    attention_mask: Int[Tensor, "batch pos"] | None,
    fwd_hooks: Iterable[tuple[str, HookFn]],
    return_logits: bool = True,
) -> Float[Tensor, "batch pos vocab"] | None:
    """One forward pass of ``model`` (a LoadedModel) with hooks, padding-aware.

    With ``return_logits=False`` the pass stops after the last block (no unembedding).
    """
    bridge = model.bridge
    device = model.device
    kwargs = {}
    if attention_mask is not None:
        kwargs["attention_mask"] = attention_mask.to(device)
    if not return_logits:
        kwargs["stop_at_layer"] = model.geometry.n_layers
    with torch.inference_mode():
        out = bridge.run_with_hooks(input_ids.to(device), fwd_hooks=list(fwd_hooks), **kwargs)
    return out if return_logits else None
