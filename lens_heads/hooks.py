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

import contextlib
from typing import Any, Callable, Iterable, Iterator, Literal

import torch
from jaxtyping import Int
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


def w_o(model, layer: int) -> Tensor:
    """W_O of one layer as [head, d_head, d_model]: from the architecture table's parameter
    names where it has them (``HeadGeometry.w_o``), else the bridge's own ``W_O``."""
    g = model.geometry
    if g.arch.in_table:
        return g.w_o(model.params(), layer)
    return model.bridge.blocks[layer].attn.W_O


def probe_shapes(bridge, input_ids: Int[Tensor, "1 pos"], layer: int = 0) -> tuple[tuple, tuple, tuple]:
    """The shapes of ``hook_pattern``, ``hook_v`` and ``hook_z`` of ``layer`` on one input."""
    shapes: dict[str, tuple] = {}

    def grab(kind):
        def fn(x, hook=None):
            shapes[kind] = tuple(x.shape)
        return fn

    with torch.inference_mode():
        bridge.run_with_hooks(input_ids, fwd_hooks=[(hook_name(k, layer), grab(k)) for k in ("pattern", "v", "z")],
                              stop_at_layer=layer + 1)
    return shapes.get("pattern", ()), shapes.get("v", ()), shapes.get("z", ())


def layer_of(hook) -> int:
    """Layer index of a TransformerLens hook object (``blocks.{L}.attn...``)."""
    return int(hook.name.split(".")[1])  # canonical names differ from aliases, the layer does not


def run_with_hooks(
    model,
    input_ids: Int[Tensor, "batch pos"],
    attention_mask: Int[Tensor, "batch pos"] | None,
    fwd_hooks: Iterable[tuple[str, HookFn]],
    return_logits: bool = True,
    *,
    logits_to_keep: Int[Tensor, " keep"] | None = None,
    past_key_values: Any = None,
    return_cache: bool = False,
):
    """One forward pass of ``model`` (a LoadedModel) with hooks, padding-aware.

    ``return_logits=False`` stops after the last block (no unembedding) and returns None.
    ``logits_to_keep``: positions whose logits are computed. ``past_key_values`` continues
    from a cached prefix; ``return_cache=True`` returns ``(logits, cache)``.
    """
    bridge = model.bridge
    kwargs: dict[str, Any] = {}
    if attention_mask is not None:
        kwargs["attention_mask"] = attention_mask.to(model.device)
    if not return_logits:
        kwargs["stop_at_layer"] = model.geometry.n_layers
    if logits_to_keep is not None:
        kwargs["logits_to_keep"] = logits_to_keep.to(model.device)
    if past_key_values is not None:
        kwargs["past_key_values"] = past_key_values
    if return_cache:
        kwargs["return_type"] = "logits_and_cache"
    with torch.inference_mode(), _kv_cache_compat(bridge, past_key_values is not None or return_cache):
        out = bridge.run_with_hooks(input_ids.to(model.device), fwd_hooks=list(fwd_hooks), **kwargs)
    return out if return_logits else None


@contextlib.contextmanager
def _kv_cache_compat(bridge, active: bool) -> Iterator[None]:
    """TransformerLens 4.3's attention bridges look for ``past_key_values`` / ``layer_past``
    among the kwargs of the attention call; transformers >= 5.2x passes the cache as
    ``cache``, so the bridge silently skips the cache update (measured: logits off by 0.5 on
    Llama, exact on BLOOM). Copy it under the name the bridge reads, for this call only."""
    if not active:
        yield
        return

    def pre_hook(module, args, kwargs):
        if kwargs.get("past_key_values") is None and kwargs.get("cache") is not None:
            kwargs["past_key_values"] = kwargs["cache"]
            return args, kwargs
        return None

    handles = [blk.attn.register_forward_pre_hook(pre_hook, with_kwargs=True)
               for blk in getattr(bridge, "blocks", [])]
    try:
        yield
    finally:
        for h in handles:
            h.remove()
