"""Attention backends: how an attention layer turns queries, keys and values into head outputs
(docs/methods.md §10). The one module that knows them; ``hooks.run_with_hooks`` enters
``backend(model, hook_names)`` around every forward.

- ``eager``: TransformerLens' rebuilt attention (the bridge's own forward). The pattern
  [batch, head, q, k] is materialised (softmax in float32, K/V repeated for grouped-query
  heads) and every hook point of the layer fires: ``hook_pattern``, ``hook_attn_scores``,
  ``hook_rot_q`` / ``hook_rot_k``, ...
- ``fused``: the model's own attention module runs, with a fused kernel registered in
  transformers' ``AttentionInterface`` (``FUSED``: torch's ``scaled_dot_product_attention``,
  grouped-query heads read in place, no [q, k] tensor kept). The module's projections are the
  bridge's, so ``hook_q`` / ``hook_k`` / ``hook_v`` and ``hook_z`` fire as in eager (ablation,
  replacement and every score that reads values or head outputs work unchanged); the points
  inside the attention computation do not.
- ``auto`` (the default): fused in every layer whose points inside the attention computation
  no hook of this forward (nor any hook left on the model) reads; eager in the others.

A layer runs fused only where its module allows it (``fused_blocker``): the model's attention
dispatches through transformers' ``AttentionInterface`` and its projections are the bridge's
modules (Llama, Qwen2/3, OLMo-2, Gemma 3, ...; GPT-2's ``c_proj``, which the bridge wraps out of
place, is put in place for the fused forward). Where the model projects q, k and v jointly
(GPT-2, GPT-NeoX / Pythia, Phi-3) the fused forward runs that one projection, so ``hook_q`` /
``hook_k`` / ``hook_v`` count as inside the attention computation there (``hook_z`` still
fires). BLOOM computes its ALiBi attention in its own module: for a fused forward that module
runs ``fused_alibi_attention`` (``OWN_FORWARDS``), the bias carried in one more head dimension.
Elsewhere (softcapping, attention sinks, GPT-2's ``reorder_and_upcast_attn``, BLOOM's
``slow_but_exact``) it runs eager, and asking for ``fused`` there is refused with the reason.

How the switch is made: the bridge's attention component delegates to the wrapped module
(``AttentionBridge.forward``, TransformerLens' own pass-through) and the model's config names
``FUSED`` as its attention implementation -- both for one forward, restored afterwards, also on
error. TransformerLens offers no per-call switch between its rebuilt attention and the native
one (``maintain_native_attention`` is stored, not read, in 4.3); with one, the instance-level
``forward`` set here would go.
"""

from __future__ import annotations

import contextlib
import inspect
import sys
from dataclasses import dataclass
from typing import TYPE_CHECKING, Callable, Iterable, Iterator

import torch
import torch.nn.functional as F
from jaxtyping import Bool, Float, Int
from torch import Tensor

from lens_heads.errors import LensHeadsError

if TYPE_CHECKING:
    from lens_heads.models.load import LoadedModel

CHOICES = ("auto", "fused", "eager")
DEFAULT = "auto"
# On a CPU, ``auto`` runs eager below this many keys. Measured with SmolLM2 on 2 cores
# (benchmarks/bench_attention_crossover.py, eager / fused time per forward of ~2,048 tokens): below
# 64 keys it is a wash (bf16 at 32 keys: 0.81x in one run, 1.06x in another); from 128 keys fused
# ties or wins in every run (bf16 1.05-1.16x at 128, 2.0-2.1x at 512, 3.2-4.5x at 1,024).
AUTO_MIN_KEYS = 64
FUSED = "lens_heads_fused"  # the name of the fused kernel in transformers' AttentionInterface
_BOUNDARY = ("hook_in", "hook_out")  # the attention component's own points that fire either way


def check_choice(choice: str) -> str:
    if choice not in CHOICES:
        raise LensHeadsError(f"attention {choice!r}: choose one of {', '.join(CHOICES)}")
    return choice


# -----------------------------------------------------------------------------
# What a score reads of a pattern, per query row: computed from the pattern (eager) or by the
# fused kernel from its log-sum-exp, without a [q, k] tensor (docs/methods.md §10)

LOCAL_WINDOW = 3  # keys t-2 .. t: the collapse diagnosis' local mass (docs/methods.md §6)


@dataclass
class RowStats:
    """Per query row t of every head (float32): A[t, first] (``first``: the row's first real
    token), the entropy -sum_j A[t, j] ln A[t, j], and the local mass sum_{j=t-2..t} A[t, j]."""

    first_weight: Float[Tensor, "batch head q"]
    entropy: Float[Tensor, "batch head q"]
    local_mass: Float[Tensor, "batch head q"]

    @property
    def device(self) -> torch.device:
        return self.first_weight.device

    @classmethod
    def from_pattern(cls, A: Float[Tensor, "batch head q k"], first: Int[Tensor, " batch"]) -> "RowStats":
        """The statistics of a materialised pattern (the eager path). With more keys than
        queries the queries are the last q positions (a cached prefix before them): query row i
        is position k - q + i."""
        b, h, q, k = A.shape
        offset = k - q
        first_weight = A.gather(-1, first.view(b, 1, 1, 1).expand(b, h, q, 1))[..., 0].float()
        entropy = torch.stack([torch.special.entr(row.float()).sum(-1) for row in A])
        local = A.diagonal(offset, -2, -1).float().clone()
        for d in range(1, LOCAL_WINDOW):  # key t - d of query row i: on the diagonal offset - d, from row d - offset
            local[..., max(0, d - offset):] += A.diagonal(offset - d, -2, -1).float()
        return cls(first_weight, entropy, local)


@dataclass
class RowRequest:
    """A request for ``RowStats`` of one layer in one forward (the row-statistics hook):
    ``first`` [batch] positions, ``fn`` called with the statistics before the layer's head
    outputs (``hook_z``) are formed."""

    first: Int[Tensor, " batch"]
    fn: Callable[[RowStats], None]


def _kernel_row_stats(query: Tensor, key: Tensor, mask: Tensor | None, causal: bool, scaling: float,
                      first: Tensor) -> RowStats:
    """``RowStats`` from queries [b, h, q, d] and keys [b, h, k, d] (K/V heads already repeated
    for the query heads) without the pattern: log-sum-exp from the fused kernel, then
    A[t, j] = exp(s_tj - lse_t) for the few keys needed (first, t-2..t), and the entropy
    lse_t - E_A[s_t], where E_A[s_t] = scaling * q_t . (sum_j A_tj k_j) is the same kernel with
    K as the values; in float64, returned as float32. ``mask``: boolean [b, 1, q, k] (True:
    attend), or None: causal (``causal``) or every key."""
    b, h, q, _ = query.shape
    k_len = key.shape[2]
    offset = k_len - q  # the queries are the last q positions (a cached prefix before them)
    # float64: the entropy is a difference of two numbers near lse_t, and a head that sinks all
    # its mass on one token has H_t near 0 (in float32 that difference lost ~3 % of SmolLM2's
    # smallest mean entropies; in float64 it is exact to float32 rounding)
    qf, kf = query.double(), key.double()
    rows = torch.arange(q, device=query.device) + offset
    if mask is None and causal and offset:  # causal after a cached prefix: the kernel's is_causal aligns top-left
        mask = _causal_after_prefix(q, k_len, query.device)
    lse, mean_key = _lse_and_mean(qf, kf, mask, causal and mask is None, scaling)  # [b, h, q], [b, h, q, d]
    expected = scaling * (qf * mean_key).sum(-1)

    def weight_at(pos: Tensor) -> Tensor:  # pos [b, q] key positions -> A[t, pos_t] [b, h, q]
        safe = pos.clamp(0, k_len - 1)
        k_at = kf.gather(2, safe[:, None, :, None].expand(b, h, q, kf.shape[-1]))
        if mask is not None:
            ok = mask.expand(b, 1, q, k_len).gather(-1, safe[:, None, :, None])[..., 0]
        else:
            ok = (safe <= rows[None, :])[:, None, :] if causal else torch.ones_like(safe, dtype=torch.bool)[:, None]
        ok = ok & (pos >= 0)[:, None, :]
        w = torch.exp(scaling * (qf * k_at).sum(-1) - lse)
        return torch.where(ok, w, torch.zeros_like(w))

    first_weight = weight_at(first[:, None].expand(b, q))
    local = sum(weight_at((rows - d)[None, :].expand(b, q)) for d in range(LOCAL_WINDOW))
    return RowStats(first_weight.float(), (lse - expected).float(), local.float())


def _causal_after_prefix(q_len: int, k_len: int, device) -> Bool[Tensor, "1 1 q k"]:
    """Causal attention for the last ``q_len`` of ``k_len`` positions (a cached prefix before
    them): query i sees keys 0 .. k_len - q_len + i."""
    return torch.ones(q_len, k_len, dtype=torch.bool, device=device).tril(k_len - q_len)[None, None]


def _lse_and_mean(q: Tensor, k: Tensor, mask: Tensor | None, is_causal: bool, scaling: float) -> tuple[Tensor, Tensor]:
    """The log-sum-exp of each query row's scores and sum_j A_tj k_j: from CPU's fused kernel
    (it returns the log-sum-exp), elsewhere in blocks of query rows (memory linear in length)."""
    bias = None if mask is None else torch.zeros(mask.shape, dtype=q.dtype, device=q.device).masked_fill_(
        ~mask, float("-inf"))
    if q.device.type == "cpu":
        op = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu
        mean_key, lse = op(q, k, k, 0.0, is_causal, attn_mask=bias, scale=scaling)
        return lse, mean_key
    lses, means = [], []
    for i in range(0, q.shape[2], 256):
        s = torch.matmul(q[:, :, i:i + 256], k.transpose(-1, -2)) * scaling
        if bias is not None:
            s = s + bias[:, :, i:i + 256]
        elif is_causal:
            s = s.masked_fill(torch.arange(i, i + s.shape[2], device=q.device)[:, None]
                              < torch.arange(k.shape[2], device=q.device), float("-inf"))
        lse = torch.logsumexp(s, -1)
        lses.append(lse)
        means.append(torch.matmul(torch.exp(s - lse[..., None]), k))
    return torch.cat(lses, 2), torch.cat(means, 2)


_requests: dict[int, RowRequest] = {}  # id(attention module) -> this forward's request (set by ``backend``)


# -----------------------------------------------------------------------------
# The fused kernel, registered in transformers' attention and mask registries


def fused_attention(module, query: Tensor, key: Tensor, value: Tensor, attention_mask: Tensor | None,
                    dropout: float = 0.0, scaling: float | None = None, is_causal: bool | None = None,
                    **kwargs) -> tuple[Tensor, None]:
    """transformers' attention-function signature: query [batch, head, q, d], key / value
    [batch, kv_head, k, d], a boolean mask [batch, 1, q, k] (True: attend) or None for plain
    causal attention. Returns the head outputs [batch, q, head, d] and no pattern."""
    if kwargs.get("softcap") is not None:
        raise LensHeadsError("softcapped attention cannot run fused (fused_blocker should have kept it eager)")
    groups = query.shape[1] // key.shape[1]
    causal = attention_mask is None and query.shape[2] > 1 and (
        is_causal if is_causal is not None else getattr(module, "is_causal", True))
    scaling = query.shape[-1] ** -0.5 if scaling is None else scaling
    if causal and query.shape[2] < key.shape[2]:  # after a cached prefix (the kernel's is_causal aligns top-left)
        attention_mask, causal = _causal_after_prefix(query.shape[2], key.shape[2], query.device), False
    request = _requests.get(id(module))
    if request is not None:  # row statistics for a score: the same scores, reduced per row
        k_rep = key.repeat_interleave(groups, dim=1) if groups > 1 else key  # [b, kv_head, k, d] -> per head
        request.fn(_kernel_row_stats(query, k_rep, attention_mask, causal, scaling, request.first.to(query.device)))
    out = F.scaled_dot_product_attention(query, key, value, attn_mask=attention_mask, dropout_p=dropout,
                                         scale=scaling, is_causal=causal, enable_gqa=groups > 1)  # [b, head, q, d]
    return out.transpose(1, 2).contiguous(), None


def fused_alibi_attention(module, hidden_states: Float[Tensor, "batch q d_model"], residual: Tensor,
                          alibi: Float[Tensor, "batch_head 1 k"], attention_mask: Tensor | None,
                          layer_past=None, use_cache: bool = False, output_attentions: bool = False,
                          **kwargs) -> tuple[Tensor, None]:
    """BLOOM's attention (``BloomAttention.forward``'s signature) with the fused kernel. Its
    scores are scale * q.k + alibi[h, j] (a bias per head and key, docs/methods.md §10). The bias
    rides in one more head dimension: q' = [scale * q, 1], k' = [k, alibi], v' = [v, 0]
    (the kernel wants one head size; off the CPU padded with zeros to a multiple of 8, which
    torch's memory-efficient kernel needs), so q'.k' is the score and the kernel runs at scale 1
    -- no [q, k] bias tensor. The mask is the model's: additive or boolean [batch, 1, q, k], or
    None (causal). Returns the layer's output (residual added, as BLOOM's module does) and no
    pattern."""
    from transformers.models.bloom.modeling_bloom import dropout_add

    b, q_len, _ = hidden_states.shape
    query, key, value = module._reshape(module.query_key_value(hidden_states))  # [b, head, pos, d] each
    if layer_past is not None:
        key, value = layer_past.update(key, value, module.layer_idx)
    h, k_len, d = query.shape[1], key.shape[2], query.shape[-1]
    extra = 1 if query.device.type == "cpu" else -(-(d + 1) // 8) * 8 - d  # columns added to each head
    bias = alibi.reshape(b, h, alibi.shape[-1], 1)[:, :, :k_len].to(key.dtype)  # [b*h, 1, k] -> [b, h, k, 1]
    q1 = F.pad(torch.cat([query * module.inv_norm_factor, query.new_ones(b, h, q_len, 1)], -1), (0, extra - 1))
    k1 = F.pad(torch.cat([key, bias], -1), (0, extra - 1))  # [b, h, k, d + extra]
    v1 = F.pad(value, (0, extra))  # [b, h, k, d + extra]
    mask = attention_mask
    if mask is None and 1 < q_len < k_len:  # after a cached prefix (the kernel's is_causal aligns top-left)
        mask = _causal_after_prefix(q_len, k_len, query.device)
    causal = mask is None and q_len > 1
    request = _requests.get(id(module))
    if request is not None:
        keep = mask if mask is None or mask.dtype == torch.bool else mask > torch.finfo(mask.dtype).min / 2
        request.fn(_kernel_row_stats(q1, k1, keep, causal, 1.0, request.first.to(query.device)))
    dropout = module.attention_dropout.p if module.training else 0.0
    out = F.scaled_dot_product_attention(q1, k1, v1, attn_mask=mask, dropout_p=dropout, scale=1.0, is_causal=causal)
    context = out[..., :d].transpose(1, 2).reshape(b, q_len, h * d)  # [b, head, q, d] -> [b, q, head * d]
    output = dropout_add(module.dense(context), residual, module.hidden_dropout, module.training)
    return output, None


# Attention modules that do not dispatch through transformers' AttentionInterface, by class
# (module and name), with the fused forward this module supplies for them (set on the instance for
# one forward, ``_own_forwards``).
OWN_FORWARDS: dict[str, Callable] = {"transformers.models.bloom.modeling_bloom.BloomAttention": fused_alibi_attention}


def _own_forward(module: torch.nn.Module) -> Callable | None:
    """The fused forward this module supplies for the model's attention module ``module``, if any
    (None also where it splits its output projection by tensor-parallel rank: ``fused_blocker``)."""
    fn = OWN_FORWARDS.get(f"{type(module).__module__}.{type(module).__qualname__}")
    return None if fn is None or _split_by_rank(module) else fn


def _split_by_rank(module: torch.nn.Module) -> bool:
    """Whether BLOOM's module splits its output projection by tensor-parallel rank (``slow_but_exact``)."""
    return getattr(module, "pretraining_tp", 1) > 1 and getattr(module, "slow_but_exact", False)


@contextlib.contextmanager
def _own_forwards(modules: Iterable[torch.nn.Module]) -> Iterator[None]:
    """The modules run their ``_own_forward`` inside (under accelerate's hooks: as the forward
    those hooks wrap); whatever was there before is put back afterwards, also on error."""
    replaced: list[tuple[torch.nn.Module, str, Callable | None]] = []  # (module, slot, what was there)
    try:
        for m in modules:
            slot = "_old_forward" if "_old_forward" in m.__dict__ else "forward"
            replaced.append((m, slot, m.__dict__.get(slot)))
            object.__setattr__(m, slot, _own_forward(m).__get__(m))
        yield
    finally:
        for m, slot, before in reversed(replaced):
            if before is None:
                m.__dict__.pop(slot, None)
            else:
                object.__setattr__(m, slot, before)


def fused_mask(*args, attention_mask: Tensor | None = None, **kwargs):
    """transformers' sdpa mask, told that a right-padded batch has no padding: under causal
    attention no real token sees a later pad, and a pad's own output is never read, so the
    kernel runs plain causal attention (no [q, k] mask tensor) where transformers would build one."""
    from transformers.masking_utils import sdpa_mask

    if attention_mask is not None and attention_mask.dim() == 2 and _right_padded(attention_mask):
        attention_mask = None
    return sdpa_mask(*args, attention_mask=attention_mask, **kwargs)


def _right_padded(mask: Tensor) -> bool:
    """Whether each row's real tokens come first (ones, then zeros)."""
    m = mask.to(torch.int8)
    return bool((m[:, 1:] <= m[:, :-1]).all())


_registered = False


def _register() -> None:
    global _registered
    if not _registered:
        from transformers import AttentionInterface
        from transformers.masking_utils import AttentionMaskInterface

        AttentionInterface.register(FUSED, fused_attention)
        AttentionMaskInterface.register(FUSED, fused_mask)
        _registered = True


# -----------------------------------------------------------------------------
# Which layers can run fused, and which this forward runs fused


def _attention_components(model: LoadedModel) -> list:
    return [getattr(b, "attn", None) for b in getattr(model.bridge, "blocks", [])]


def fused_blocker(attn) -> str | None:
    """Why the attention component ``attn`` cannot run fused (None: it can)."""
    from transformer_lens.model_bridge.generalized_components.attention import AttentionBridge

    if not isinstance(attn, AttentionBridge) or attn.original_component is None:
        return "its attention is not a TransformerLens attention component"
    hf = attn.original_component
    own = {id(c) for c in hf.children()}  # the model's projections, where the bridge wrapped them in place
    if id(getattr(attn, "o", None)) not in own and not _out_of_place(attn):
        return "its output projection is not a module the bridge hooks (hook_z would not fire)"
    if not (_joint(attn) or all(id(getattr(attn, p, None)) in own for p in ("q", "k", "v"))):
        return "its q / k / v projections are not modules the bridge hooks"
    config = getattr(hf, "config", None)
    if getattr(hf, "sinks", None) is not None or getattr(config, "attn_logit_softcapping", None) is not None:
        return "it uses attention sinks or softcapping, which the fused kernel does not compute"
    if getattr(config, "reorder_and_upcast_attn", False):
        return "it reorders and upcasts its attention products (reorder_and_upcast_attn), which the fused kernel does not"
    if _own_forward(hf) is not None:
        return None
    if _split_by_rank(hf):
        return "it splits its output projection by tensor-parallel rank (slow_but_exact), which the fused forward does not"
    source = inspect.getsource(sys.modules[type(hf).__module__])
    if "ALL_ATTENTION_FUNCTIONS" not in source:
        return "its attention does not dispatch through transformers' AttentionInterface"
    return None


def blockers(model: LoadedModel) -> list[str | None]:
    """``fused_blocker`` of every layer, computed once per model."""
    cached = model.__dict__.get("_fused_blockers")
    if cached is None:
        cached = [fused_blocker(a) for a in _attention_components(model)]
        model.__dict__["_fused_blockers"] = cached
    return cached


def _out_of_place(attn) -> list[str]:
    """Names of the model's attention children that the bridge wraps as its output projection
    ``o`` without putting the wrapper in the model's place (GPT-2's ``c_proj``, which the bridge's
    own eager pass calls): for a fused forward the wrapper is put there (``backend``), so
    ``hook_z`` fires."""
    o = getattr(attn, "o", None)
    inner = getattr(o, "original_component", None)
    if o is None or inner is None:
        return []
    return [n for n, c in attn.original_component.named_children() if c is inner and c is not o]


def _joint(attn) -> bool:
    """Whether the model computes q, k and v in one projection (GPT-NeoX, Phi-3) that the bridge
    hooks as a whole (``qkv``), splitting it into ``q`` / ``k`` / ``v`` only in its own eager pass."""
    qkv = getattr(attn, "qkv", None)
    return qkv is not None and any(c is qkv for c in attn.original_component.children())


def value_projection(model: LoadedModel, layer: int, fused: bool) -> torch.nn.Module | None:
    """Where ``layer``, running fused, never forms ``hook_v`` (the model projects q, k and v
    jointly, ``_joint``): the bridge's own v projection -- run on the attention's input it gives
    ``hook_v`` as the eager pass does, for read-only value hooks (``hooks.run_with_hooks``).
    None where ``hook_v`` fires anyway. (The bridge's per-head input fork, ``use_split_qkv_input``
    / ``use_attn_in``, which lens_heads never turns on, would make eager's values differ.)"""
    attn = _attention_components(model)[layer]
    return attn.v if fused and _joint(attn) else None


def _inner_points(attn) -> dict[int, str]:
    """ids of the hook points inside ``attn``'s attention computation (pattern, scores, rotated
    q / k, normed q / k, ...): the component's own points but its input and output. The
    projections' points (``hook_q`` / ``hook_k`` / ``hook_v``, ``hook_z``) live in their
    modules and fire either way -- but where the model's projection is joint (``_joint``): its
    fused forward runs that one projection, so ``hook_q`` / ``hook_k`` / ``hook_v`` are inside."""
    from transformer_lens.hook_points import HookPoint

    inner = {id(c): n for n, c in attn.named_children() if isinstance(c, HookPoint) and n not in _BOUNDARY}
    if _joint(attn):
        inner.update({id(c): f"{p}.{n}" for p in ("q", "k", "v") if getattr(attn, p, None) is not None
                      for n, c in getattr(attn, p).named_modules() if isinstance(c, HookPoint)})
    return inner


def _reads_inner(attn, hooked: set[int]) -> bool:
    """Whether this forward's hooks, or hooks left on the model (but permanent ones that only
    adjust eager attention's dtypes), read a point inside ``attn``."""
    for pid, name in _inner_points(attn).items():
        if pid in hooked:
            return True
        point = attn.get_submodule(name)
        if any(not getattr(h, "is_permanent", False) for h in getattr(point, "fwd_hooks", [])):
            return True
    return False


def fused_layers(model: LoadedModel, hook_names: Iterable[str], choice: str | None = None,
                 row_layers: Iterable[int] = (), n_keys: int | None = None) -> list[bool]:
    """Which layers this forward runs fused: ``choice`` (default: the model's ``attention``)
    applied layer by layer (``auto``: fused where the module allows it and nothing reads inside
    the attention computation, nor asks for row statistics (``row_layers``): ``auto`` keeps
    those eager, where they equal the authors' pattern-based numbers bitwise; ``fused`` serves
    them from the kernel, to float rounding; and on a CPU, eager for a forward of fewer than
    ``AUTO_MIN_KEYS`` keys, ``n_keys``). ``fused`` with a layer that cannot run fused, or with a
    hook inside the attention computation, is refused with the reason."""
    choice = check_choice(choice or getattr(model, "attention", DEFAULT))
    short = choice == "auto" and n_keys is not None and n_keys < AUTO_MIN_KEYS and str(model.device).startswith("cpu")
    if choice == "eager" or short:
        return [False] * len(_attention_components(model))
    points = getattr(model.bridge, "hook_dict", {})
    hooked = {id(points[n]) for n in hook_names if n in points}
    rows = set(row_layers) if choice == "auto" else set()
    out = []
    for layer, (attn, blocker) in enumerate(zip(_attention_components(model), blockers(model))):
        reads = blocker is None and _reads_inner(attn, hooked)
        if choice == "fused" and blocker is not None:
            raise LensHeadsError(f"attention 'fused' is not available for this model (layer {layer}: {blocker}); "
                                 f"use --attention auto or eager")
        if choice == "fused" and reads:
            raise LensHeadsError(f"this forward reads the attention pattern of layer {layer} (or a point "
                                 f"inside its attention), which attention 'fused' does not compute; use "
                                 f"--attention auto (eager where one is read) or eager")
        out.append(blocker is None and not reads and layer not in rows)
    return out


def check_model(model: LoadedModel, choice: str) -> None:
    """``choice`` for ``model``, checked before any forward (``fused`` on a model that cannot)."""
    if check_choice(choice) == "fused":
        fused_layers(model, [], "fused")


@contextlib.contextmanager
def plain_fused(hf_model) -> Iterator[bool]:
    """For the forwards inside: a plain (unbridged) transformers model -- surgery's copy -- runs the
    fused kernel where its class supports SDPA (``_supports_sdpa``) or this module supplies its
    attention's fused forward (``OWN_FORWARDS``: BLOOM); restored afterwards, also on error.
    Yields whether it runs fused."""
    own = [m for m in hf_model.modules() if _own_forward(m) is not None]
    if not (getattr(hf_model, "_supports_sdpa", False) or own):
        yield False
        return
    _register()
    configs = {id(m.config): m.config for m in hf_model.modules()
               if hasattr(getattr(m, "config", None), "_attn_implementation")}
    before = {k: c._attn_implementation for k, c in configs.items()}
    try:
        for c in configs.values():
            c._attn_implementation = FUSED
        with _own_forwards(own):
            yield True
    finally:
        for k, c in configs.items():
            c._attn_implementation = before[k]


@contextlib.contextmanager
def backend(model: LoadedModel, hook_names: Iterable[str], rows: dict[int, RowRequest] | None = None,
            n_keys: int | None = None) -> Iterator[list[bool]]:
    """For one forward: the layers ``fused_layers`` picks run the model's own attention with
    the fused kernel, the others TransformerLens' eager attention; ``rows`` (layer -> request)
    are served by the kernel in fused layers (the caller serves the others from their pattern).
    Yields which layers run fused; everything is restored afterwards, also on error."""
    layers = fused_layers(model, hook_names, row_layers=rows or (), n_keys=n_keys)
    if not any(layers):
        yield layers
        return
    from transformer_lens.model_bridge.generalized_components.attention import AttentionBridge

    _register()
    attns = [a for a, fused in zip(_attention_components(model), layers) if fused]
    own: list[torch.nn.Module] = []  # modules that compute attention themselves (BLOOM): our forward
    configs: dict = {}  # those dispatching through AttentionInterface: their configs name FUSED
    for a in attns:
        hf = a.original_component
        if _own_forward(hf) is not None:
            own.append(hf)
        else:
            configs[id(hf.config)] = hf.config
    hf_config = model.hf_model.config
    if configs or all(layers):  # the model builds its masks from its own config; where a module
        # has its own fused forward, only if no eager layer of this forward reads those masks
        configs.setdefault(id(hf_config), hf_config)
    before = {k: c._attn_implementation for k, c in configs.items()}
    comps = _attention_components(model)
    served = {id(comps[L].original_component): r for L, r in (rows or {}).items() if layers[L]}
    swapped: list[tuple[torch.nn.Module, str, torch.nn.Module]] = []  # (module, child name, the model's own)
    try:
        _requests.update(served)
        for c in configs.values():
            c._attn_implementation = FUSED
        for a in attns:  # the instance's forward is TransformerLens' own pass-through to the wrapped module
            object.__setattr__(a, "forward", AttentionBridge.forward.__get__(a))
            for name in _out_of_place(a):
                swapped.append((a.original_component, name, getattr(a.original_component, name)))
                setattr(a.original_component, name, a.o)
        with _own_forwards(own):  # the model's modules that compute attention themselves (BLOOM)
            yield layers
    finally:
        for k in served:
            _requests.pop(k, None)
        for a in attns:
            a.__dict__.pop("forward", None)
        for module, name, raw in swapped:
            setattr(module, name, raw)
        for k, c in configs.items():
            c._attn_implementation = before[k]
