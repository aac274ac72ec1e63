"""The only module that knows TransformerLens hook names and shapes.

Hook points read and written by lens_heads (TransformerBridge, TL >= 4.3):

- ``blocks.{L}.attn.hook_pattern``  Float[Tensor, "batch head q k"]    attention probabilities
- ``blocks.{L}.attn.hook_v``        Float[Tensor, "batch pos kv_head d_head"]  values (KV heads)
- ``blocks.{L}.attn.hook_z``        Float[Tensor, "batch pos head d_head"]  head outputs before W_O
- ``blocks.{L}.attn.hook_rows``     ``attention.RowStats`` per query row (A[t, first], entropy,
  local mass): lens_heads' own point, not TransformerLens'. Its hook is an
  ``attention.RowRequest``; a fused layer's kernel serves it without a pattern, an eager layer
  from ``hook_pattern``. Scores read it, so they never need the pattern itself.
- ``blocks.{L}.attn.hook_values``   ``hook_v``'s values, read only (its hooks' return values are
  ignored): lens_heads' own point, for scores. Its hooks go on ``hook_v``, which fires in every
  layer but a fused one whose model projects q, k and v jointly; there the bridge's own v
  projection runs once more on the attention's input (``attention.value_projection``) so they
  fire, and the layer still runs fused.

Within one layer they fire in that order (pattern and v, then z), so a hook on ``hook_z``
can use statistics gathered at ``hook_pattern``/``hook_v`` of the same layer in the same
pass -- this is what per-input ablation relies on.
"""

from __future__ import annotations

import contextlib
from typing import TYPE_CHECKING, Any, Callable, Iterable, Iterator, Literal

import torch
import torch.nn.functional as F
from jaxtyping import Float, Int
from torch import Tensor

from lens_heads.models import attention
from lens_heads.errors import LensHeadsError

if TYPE_CHECKING:
    from lens_heads.models.load import LoadedModel

HookKind = Literal["pattern", "rows", "v", "values", "z", "attn_in", "resid_pre"]
HOOK_POINTS: dict[str, str] = {
    "pattern": "blocks.{layer}.attn.hook_pattern",
    "rows": "blocks.{layer}.attn.hook_rows",
    "v": "blocks.{layer}.attn.hook_v",
    "values": "blocks.{layer}.attn.hook_values",
    "z": "blocks.{layer}.attn.hook_z",
    "attn_in": "blocks.{layer}.attn.hook_in",
    "resid_pre": "blocks.{layer}.hook_resid_pre",  # the residual stream entering a block
}
_OWN_POINTS = ("rows", "values")  # lens_heads' points, served by ``run_with_hooks``
# TransformerLens hook signature: fn(activation, hook) -> activation | None
HookFn = Callable[[Tensor, object], Tensor | None]


def hook_name(kind: HookKind, layer: int) -> str:
    return HOOK_POINTS[kind].format(layer=layer)


def w_o(model: LoadedModel, layer: int) -> Tensor:
    """W_O of one layer as [head, d_head, d_model]: from the architecture table's parameter
    names where it has them (``HeadGeometry.w_o``), else the bridge's own ``W_O``."""
    g = model.geometry
    if g.arch.in_table:
        return g.w_o(model.params(), layer)
    return model.bridge.blocks[layer].attn.W_O


def bridge_made_parameters(bridge) -> set[int]:
    """ids of the parameters the bridge made itself rather than took from the model: the q, k, v
    Linears a fused-QKV attention (GPT-2, BLOOM, ...) splits from its fused projection. Counting
    a model's parameters leaves them out (the fused projection is the model's own)."""
    from transformer_lens.model_bridge.generalized_components.joint_qkv_attention import (
        JointQKVAttentionBridge as Joint)

    made: set[int] = set()
    for block in getattr(bridge, "blocks", []):
        attn = getattr(block, "attn", None)
        if isinstance(attn, Joint):
            made |= {id(p) for part in (attn.q, attn.k, attn.v) for p in part.parameters()}
    return made


def pin_rotary_dtype(bridge, dtype) -> None:
    """Keep rotated queries and keys in the model's dtype. TransformerLens' rebuilt attention
    applies Llama's rotary embedding with the model's cos/sin; OLMo-2's are float32, so in
    bf16 q and k come out float32 and the value product fails (HF's own OLMo-2 casts them back).
    A permanent hook on ``hook_rot_q`` / ``hook_rot_k`` casts them (a no-op where they match)."""
    if dtype == torch.float32:
        return

    def cast(x, hook=None):
        return x if x.dtype == dtype else x.to(dtype)

    for block in getattr(bridge, "blocks", []):
        for name in ("hook_rot_q", "hook_rot_k"):
            point = getattr(getattr(block, "attn", None), name, None)
            if point is not None:
                point.add_hook(cast, is_permanent=True, prepend=True)


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
    model: LoadedModel,
    input_ids: Int[Tensor, "batch pos"],
    attention_mask: Int[Tensor, "batch pos"] | None,
    fwd_hooks: Iterable[tuple[str, HookFn]],
    return_logits: bool = True,
    *,
    logits_to_keep: Int[Tensor, " keep"] | None = None,
    past_key_values: Any = None,
    return_cache: bool = False,
    grad: bool = False,
    logit_rows: Int[Tensor, "n 2"] | None = None,
    position_ids: Int[Tensor, "batch pos"] | None = None,
):
    """One forward pass of ``model`` (a LoadedModel) with hooks, padding-aware. Called by the
    engine only (``engine.forward``); attention backends plug in here.

    ``return_logits=False`` returns None after the last block (the unembedding of one position).
    ``logits_to_keep``: positions whose logits are computed; ``logit_rows``: of those, only the
    (batch row, index into ``logits_to_keep``) pairs, returned as [n, vocab] (the unembedding
    runs on those rows alone). ``past_key_values`` continues
    from a cached prefix; ``return_cache=True`` returns ``(logits, cache)``. ``grad``: autograd
    on (attribution patching's backward), else inference mode. ``position_ids`` with a boolean
    [batch, 1, pos, pos] ``attention_mask``: a packed batch (``lens_heads.forward.packing``; models with
    a ``packed_length_limit``).
    """
    bridge = model.bridge
    kwargs: dict[str, Any] = {}
    if attention_mask is not None:
        kwargs["attention_mask"] = attention_mask.to(model.device)
    if not return_logits:
        kwargs["stop_at_layer"] = model.geometry.n_layers
        if logits_to_keep is None:  # TransformerLens 4.3's bridge runs the unembedding all the same
            logits_to_keep = torch.tensor([input_ids.shape[-1] - 1])  # (measured): one position, not all
    if position_ids is not None:
        kwargs["position_ids"] = position_ids.to(model.device)
    if logits_to_keep is not None:
        kwargs["logits_to_keep"] = logits_to_keep.to(model.device)
    if past_key_values is not None:
        if return_logits and _takes_cache_kwarg(bridge.original_model):
            kwargs.update(cache=past_key_values, use_cache=True)  # straight to the HF forward
        else:
            kwargs["past_key_values"] = past_key_values
    if return_cache:
        kwargs["return_type"] = "logits_and_cache"
    elif past_key_values is None:
        kwargs["use_cache"] = False  # (measured) else HF fills a K/V cache nobody reads: a copy per layer
    fwd_hooks, own = _split_own(fwd_hooks)
    rows = {L: _one_request(rs) for L, rs in own["rows"].items()}
    with (torch.enable_grad() if grad else torch.inference_mode()), \
            attention.backend(model, [name for name, _ in fwd_hooks], rows, _n_keys(input_ids, past_key_values)) as fused, \
            _kv_cache_compat(bridge, past_key_values is not None or return_cache, fused), \
            lean_norms(bridge), _unembed(bridge, logit_rows if return_logits else None):
        fwd_hooks += [(hook_name("pattern", L), _rows_from_pattern(r)) for L, r in rows.items() if not fused[L]]
        fwd_hooks += _value_hooks(model, own["values"], fused)
        out = bridge.run_with_hooks(input_ids.to(model.device), fwd_hooks=fwd_hooks, **kwargs)
    if return_logits and logit_rows is not None:  # [1, n, vocab] -> [n, vocab]
        out = (out[0][0], *out[1:]) if isinstance(out, tuple) else out[0]
    return out if return_logits else None


@contextlib.contextmanager
def _unembed(bridge, rows: Tensor | None) -> Iterator[None]:
    """For one forward: the unembedding reads only ``rows`` ((batch row, kept position) pairs)
    of the final residual stream, as one [1, n, d_model] batch; and where the LM head's bias is
    all zeros (TransformerLens 4.3 gives a bias-free head a zero bias buffer, for folding) it
    runs without it. A bias makes the product an ``addmm``, which first copies the bias into
    every [n, vocab] row (measured, SmolLM2's head on 2,200 rows, 2 cores: ~70 vs ~54 ms in bf16,
    ~390 vs ~365 ms in fp32; PIQA 80 in bf16 1.80 vs 1.71 s); adding zeros changes no bit
    (tests/test_models.py). On the CPU only: a GPU's GEMM adds a bias in its epilogue, and the
    check would cost a device sync per forward."""
    handles, head = [], _zero_bias_head(bridge)
    if rows is not None:
        def pick(module, args):
            x = args[0]
            r = rows.to(x.device)
            return (x[r[:, 0], r[:, 1]][None], *args[1:])

        handles.append(bridge.unembed.register_forward_pre_hook(pick))

    def without_bias(x: Tensor) -> Tensor:
        return F.linear(x, head.weight)

    try:
        if head is not None:
            object.__setattr__(head, "forward", without_bias)
        yield
    finally:
        if head is not None and head.__dict__.get("forward") is without_bias:  # not one set meanwhile
            del head.__dict__["forward"]
        for h in handles:
            h.remove()


def _zero_bias_head(bridge) -> torch.nn.Linear | None:
    """The LM head (a plain ``nn.Linear`` on the CPU) when its bias exists and is all zeros, else None."""
    head = getattr(getattr(bridge, "unembed", None), "original_component", None)
    if (type(head) is not torch.nn.Linear or "forward" in head.__dict__  # accelerate's hooks set one
            or head.bias is None or head.bias.device.type != "cpu" or head.bias.any()):
        return None
    return head


def _n_keys(input_ids: Tensor, cache: Any) -> int:
    """The keys each query of this forward can see at most: the input, after a cached prefix."""
    cached = cache.get_seq_length() if hasattr(cache, "get_seq_length") else 0
    return int(input_ids.shape[-1]) + int(cached)


def _split_own(fwd_hooks: Iterable[tuple[str, Any]]) -> tuple[list[tuple[str, HookFn]], dict[str, dict[int, list]]]:
    """TransformerLens hooks, and the hooks on lens_heads' own points (``hook_rows``,
    ``hook_values``) by point and layer."""
    plain: list[tuple[str, HookFn]] = []
    own: dict[str, dict[int, list]] = {kind: {} for kind in _OWN_POINTS}
    suffixes = {HOOK_POINTS[kind].rsplit("}", 1)[1]: kind for kind in _OWN_POINTS}  # ".attn.hook_rows", ...
    for name, fn in fwd_hooks:
        kind = next((k for suffix, k in suffixes.items() if name.endswith(suffix)), None)
        if kind is None:
            plain.append((name, fn))
        else:
            own[kind].setdefault(int(name.split(".")[1]), []).append(fn)
    return plain, own


def _one_request(requests: list) -> attention.RowRequest:
    """One row-statistics request for a layer that several hooks of a forward ask: the statistics
    are the same for all (one batch, one first-token geometry), so each hook gets them."""
    if len(requests) == 1:
        return requests[0]
    first = requests[0].first
    if not all(torch.equal(r.first, first) for r in requests[1:]):
        raise LensHeadsError("row-statistics requests of one forward disagree on each row's first token")

    def serve(stats) -> None:
        for r in requests:
            r.fn(stats)
    return attention.RowRequest(first, serve)


def _value_hooks(model: LoadedModel, reads: dict[int, list[HookFn]], fused: list[bool]) -> list[tuple[str, HookFn]]:
    """The read-only value hooks (``hook_values``) on ``hook_v``, and where a fused layer never
    forms ``hook_v``, a hook on the attention's input that runs the bridge's v projection on it
    (its output unused: the projection's ``hook_v`` fires, with these hooks on it)."""
    out: list[tuple[str, HookFn]] = []
    for L, fns in reads.items():
        out += [(hook_name("v", L), _read_only(fn)) for fn in fns]
        project = attention.value_projection(model, L, fused[L])
        if project is not None:
            out.append((hook_name("attn_in", L), _read_only(lambda x, hook=None, project=project: project(x))))
    return out


def _read_only(fn: HookFn) -> HookFn:
    """``fn`` with its return value dropped: the activation goes on unchanged."""
    def hook(x: Tensor, hook=None) -> None:
        fn(x, hook)
    return hook


def _rows_from_pattern(request) -> HookFn:
    """An eager layer serves a row-statistics request from its pattern."""
    def hook(pattern: Tensor, hook=None) -> None:
        request.fn(attention.RowStats.from_pattern(pattern, request.first.to(pattern.device)))
    return hook


# Model types (HF ``config.model_type``) that read a packed batch (``lens_heads.forward.packing``) as they
# would read its inputs alone: positions only from ``position_ids``, and attention that applies a
# boolean [batch, 1, q, k] mask as such (tests/test_evaluate.py packs each against the plain path).
# Not BLOOM or Falcon (ALiBi positions from the 2-D padding mask), nor OPT or GPT-Neo (their own
# attention adds the mask to the scores, and a boolean one added masks nothing).
PACKED_MODEL_TYPES = frozenset({"llama", "mistral", "qwen2", "qwen3", "olmo2", "gemma3", "gemma3_text", "gpt2",
                                "phi3", "gpt_neox"})


def packed_length_limit(model: LoadedModel) -> int | None:
    """The longest packed row the model reads as its inputs would be read alone, or None where it
    is not one of ``PACKED_MODEL_TYPES``. A sliding window caps it (Gemma 3, Mistral): within the
    window the packed mask is the sliding one too, so one mask serves every layer."""
    config = model.hf_model.config
    config = getattr(config, "text_config", None) or config
    if getattr(config, "model_type", None) not in PACKED_MODEL_TYPES:
        return None
    window = attention_window(model)
    return window if window else 1 << 30


def attention_window(model: LoadedModel) -> int | None:
    """The sliding window of the model's windowed layers (Gemma 3, Mistral), None where there is
    none. A K/V cache of such a layer keeps only the window's keys: past it, a cached prefix's
    first key is no longer the input's first token."""
    config = model.hf_model.config
    config = getattr(config, "text_config", None) or config
    window = getattr(config, "sliding_window", None)
    return int(window) if window else None


def _takes_cache_kwarg(hf_model) -> bool:
    """Whether the HF model's forward takes its KV cache as ``cache`` (transformers >= 5.2x,
    which deprecates ``past_key_values`` with a FutureWarning per call). The bridge hands its
    extra keyword arguments to that forward unchanged, so the same cache object reaches HF
    under either name (same logits: tests/test_models.py)."""
    import inspect

    try:
        return "cache" in inspect.signature(hf_model.forward).parameters
    except (TypeError, ValueError):
        return False


@contextlib.contextmanager
def _kv_cache_compat(bridge, active: bool, fused: list[bool]) -> Iterator[None]:
    """TransformerLens 4.3's attention bridges look for ``past_key_values`` / ``layer_past``
    among the kwargs of the attention call; transformers >= 5.2x passes the cache as
    ``cache``, so the bridge silently skips the cache update (measured: logits off by 0.5 on
    Llama, exact on BLOOM). Copy it under the name the bridge reads, for this call only, in the
    layers that run eager (a fused layer is the model's own attention, which reads ``cache``)."""
    if not active:
        yield
        return

    def pre_hook(module, args, kwargs):
        if kwargs.get("past_key_values") is None and kwargs.get("cache") is not None:
            kwargs["past_key_values"] = kwargs["cache"]
            return args, kwargs
        return None

    handles = [blk.attn.register_forward_pre_hook(pre_hook, with_kwargs=True)
               for blk, is_fused in zip(getattr(bridge, "blocks", []), fused) if not is_fused]
    try:
        yield
    finally:
        for h in handles:
            h.remove()


def _silent(point: torch.nn.Module) -> bool:
    """No hook of any kind on this hook point (TransformerLens' or a plain torch one)."""
    from torch.nn.modules import module as nn_module

    return not (point._forward_hooks or point._forward_pre_hooks or point._backward_hooks
                or point._backward_pre_hooks or nn_module._global_forward_hooks
                or nn_module._global_forward_pre_hooks or nn_module._global_backward_hooks)


def _lean_norm_forward(norm):
    """A norm bridge's forward that skips what only its inner hooks read. TransformerLens 4.3's
    native-norm path computes the normalisation twice -- once for ``hook_scale`` /
    ``hook_normalized`` (in float32: a copy, a square and a product of the whole residual), then
    the model's own norm, whose output it returns when those hooks leave the values alone
    (measured: 2 of the 5 full-width passes of every norm). Where neither point has a hook at call
    time, this returns the model's own norm at once: the same tensor, bit for bit."""
    full = type(norm).forward.__get__(norm)

    def forward(hidden_states: Tensor, **kwargs: Any) -> Tensor:
        if kwargs or not (_silent(norm.hook_scale) and _silent(norm.hook_normalized)):
            return full(hidden_states, **kwargs)
        x = norm.hook_in(hidden_states)
        result = norm.original_component(x)
        return norm.hook_out(result if result.dtype == x.dtype else result.to(x.dtype))

    return forward


def _native_norms(bridge) -> list[torch.nn.Module]:
    """The bridge's norms whose output is the model's own norm (the native path), cached."""
    from transformer_lens.model_bridge.generalized_components.normalization import NormalizationBridge

    cached = bridge.__dict__.get("_lens_heads_native_norms")
    if cached is None:
        cached = [m for m in bridge.modules() if isinstance(m, NormalizationBridge)
                  and type(m).forward is NormalizationBridge.forward
                  and type(m)._hf_autograd_forward_with_hooks is NormalizationBridge._hf_autograd_forward_with_hooks
                  and (m.use_native_layernorm_autograd or getattr(m.config, "layer_norm_folding", False))
                  and isinstance(m.original_component, torch.nn.Module)
                  and not isinstance(m.original_component, torch.nn.Identity)
                  and all(isinstance(getattr(m, n, None), torch.nn.Module) for n in ("hook_scale", "hook_normalized"))]
        bridge.__dict__["_lens_heads_native_norms"] = cached
    return cached


@contextlib.contextmanager
def lean_norms(bridge) -> Iterator[None]:
    """For one forward: the bridge's native norms skip the values only their inner hooks read
    (``_lean_norm_forward``); restored afterwards, also on error."""
    norms = _native_norms(bridge)
    try:
        for n in norms:
            object.__setattr__(n, "forward", _lean_norm_forward(n))
        yield
    finally:
        for n in norms:
            n.__dict__.pop("forward", None)


# --- pruned fused-QKV models (GPT-2, BLOOM) -------------------------------------------------------
class _LayerConfig:
    """One attention layer's view of the bridge's shared config: its own head counts, every
    other attribute read from (and written to) the shared config, so model-wide switches the
    bridge sets later still reach this layer."""

    def __init__(self, shared, **own):
        object.__setattr__(self, "_shared", shared)
        object.__setattr__(self, "_own", own)

    def __getattr__(self, name):
        if name.startswith("__"):
            raise AttributeError(name)
        own = object.__getattribute__(self, "_own")
        return own[name] if name in own else getattr(object.__getattribute__(self, "_shared"), name)

    def __setattr__(self, name, value):
        if name in self._own:
            self._own[name] = value
        else:
            setattr(self._shared, name, value)


def _split_fused(fused: torch.nn.Module, layout: str, n_heads: int, d_head: int, conv1d: bool):
    """q, k, v as ``nn.Linear`` from a fused projection of ``n_heads`` heads: ``blocked``
    features [part, head, d] (GPT-2 ``c_attn``, a Conv1D), ``interleaved`` [head, part, d] (BLOOM).
    Blocked parts are contiguous, so they stay views of the fused weights (no second copy, as
    in TransformerLens' own split); interleaved parts are strided and copied (as TransformerLens
    copies them for BLOOM)."""
    w = fused.weight.T if conv1d else fused.weight  # [3 * n_heads * d_head, d_model]
    d_model, width = w.shape[1], n_heads * d_head
    shape = (3, n_heads, d_head) if layout == "blocked" else (n_heads, 3, d_head)
    w, b = w.reshape(*shape, d_model), None if fused.bias is None else fused.bias.reshape(shape)
    parts = []
    for p in range(3):
        pick = (lambda t: t[p]) if layout == "blocked" else (lambda t: t[:, p])  # noqa: B023 -- used at once
        lin = torch.nn.Linear(d_model, width, bias=b is not None, device="meta")
        lin.weight = torch.nn.Parameter(pick(w).reshape(width, d_model), requires_grad=fused.weight.requires_grad)
        if b is not None:
            lin.bias = torch.nn.Parameter(pick(b).reshape(width), requires_grad=fused.bias.requires_grad)
        parts.append(lin)
    return tuple(parts)


@contextlib.contextmanager
def booting_pruned(plan: dict | None, conv1d: bool) -> Iterator[None]:
    """While the bridge boots a pruned model with a fused QKV projection (``lens_heads.surgery.prune``):
    TransformerLens' joint-QKV attention splits the projection, shapes its hooks and rebuilds
    attention with the config's one head count. Give each attention layer, as it is set up, its
    own head count (``_LayerConfig``), the hook reshaping that goes with it, and a split of its
    own projection. Separate-projection layouts need nothing: their attention modules carry
    their counts and the bridge reads widths from them. Not covered: the bridge's
    ``enable_compatibility_mode`` weight processing, whose GPT-2 conversions fix the model-wide
    head count (lens_heads does not use it).

    TransformerLens offers no extension point for this, so the class method is replaced for the
    block only and restored afterwards, also on error (tested). It goes away once
    ``JointQKVAttentionBridge`` reads the head count of the component it wraps (its
    ``num_heads`` / ``split_size``) instead of the model-wide ``config.n_heads``."""
    if not plan or plan.get("layout") == "separate":
        yield
        return
    from transformer_lens.model_bridge.generalized_components.joint_qkv_attention import (
        JointQKVAttentionBridge as Joint)

    original = Joint.set_original_component
    d_head, fused_name = int(plan["d_head"]), plan["q"]

    def set_original_component(self, component):
        n = getattr(component, "num_heads", None)
        if isinstance(n, int) and self.config is not None:
            self.config = _LayerConfig(self.config, n_heads=n, n_key_value_heads=n)
            rule = self._create_qkv_conversion_rule()
            self.qkv_conversion_rule = rule
            for part in (self.q, self.k, self.v):
                part.hook_out.hook_conversion = rule
            self.split_qkv_matrix = lambda attn: _split_fused(getattr(attn, fused_name), plan["layout"], n, d_head,
                                                              conv1d)
        return original(self, component)

    Joint.set_original_component = set_original_component
    try:
        yield
    finally:
        Joint.set_original_component = original


def _block_list(model: LoadedModel) -> tuple[torch.nn.Module, str]:
    """(parent module, attribute) of the Hugging Face model's list of blocks: the
    ``torch.nn.ModuleList`` whose members are the bridge's ``blocks`` (every architecture the
    bridge serves, in or out of the ``ArchSpec`` table)."""
    first = model.bridge.blocks[0]
    for parent in model.hf_model.modules():
        for attr, child in parent.named_children():
            if isinstance(child, torch.nn.ModuleList) and len(child) and child[0] is first:
                return parent, attr
    raise LensHeadsError(f"{model.name}: no list of blocks found in the Hugging Face model (needed to resume a "
                         f"forward at a layer)")


@contextlib.contextmanager
def resumed_at(model: LoadedModel, layer: int,
               resid: Float[Tensor, "batch pos d_model"]) -> Iterator[list[tuple[str, HookFn]]]:
    """For the forwards inside: the model runs blocks ``layer``.. only, its residual stream
    entering block ``layer`` replaced by ``resid`` (docs/methods.md §2, "Prefixes kept across
    evaluations, and under a per-input ablation"). Yields the hook that puts ``resid`` in place,
    for ``run_with_hooks`` beside the forward's own hooks (those of blocks < ``layer`` never fire).

    The blocks before ``layer`` are taken out of the Hugging Face model's block list for the
    duration (and out of its config's ``layer_types``, which some models read by the block's
    place in the list; both restored afterwards, also on error), so nothing of them runs; the embedding still
    does (its output is discarded: an input's positions, masks, rotary and ALiBi terms are built
    from the input ids as in a whole forward). Given the residual stream the whole forward has
    there, the result is the whole forward's: each block reads only the residual stream, the
    masks and the positions (``tests/test_models.py``, every tiny architecture, bit for bit)."""
    n = len(model.bridge.blocks)
    if not 0 <= layer < n:
        raise LensHeadsError(f"cannot resume at layer {layer}: the model has layers 0..{n - 1}")
    parent, attr = _block_list(model)
    blocks = getattr(parent, attr)

    def put(x: Tensor, hook) -> Tensor:
        if x.shape != resid.shape:
            raise LensHeadsError(f"resuming at layer {layer}: residual stream of shape {tuple(resid.shape)} for a "
                                 f"forward of shape {tuple(x.shape)}")
        return resid.to(device=x.device, dtype=x.dtype)

    config = getattr(parent, "config", None)
    kinds = getattr(config, "layer_types", None)  # read by block index (Qwen2, Gemma 3): sliced alike
    sliced = isinstance(kinds, (list, tuple)) and len(kinds) == n
    setattr(parent, attr, torch.nn.ModuleList(list(blocks)[layer:]))
    if sliced:
        config.layer_types = list(kinds)[layer:]
    try:
        yield [(hook_name("resid_pre", layer), put)]
    finally:
        setattr(parent, attr, blocks)
        if sliced:
            config.layer_types = kinds
