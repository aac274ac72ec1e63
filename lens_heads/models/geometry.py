"""Head geometry: one declarative entry per architecture.

Everything lens_heads needs to know about where an attention head lives in a model's
parameters is written here as data (pyvene style), so no other module branches on the
architecture. Names are Hugging Face parameter names *relative to one attention module*.

Scoring, ablation, evaluation and diagnosis need only the head counts (layers, query heads,
KV heads, d_head), read from the config for *any* architecture the TransformerLens bridge
boots, and checked against the bridge's hook shapes when the model loads. The table below is
needed only where parameters are sliced (surgery, export): an architecture without an entry
gets a generic ``ArchSpec`` (``in_table=False``) and fails only there, saying which entry to add.

Layouts of the Q/K/V output features (rows of a Linear weight, columns of a Conv1D):
- ``separate``:   one projection per part; head g owns features [g*d, (g+1)*d).
- ``interleaved``: one fused projection viewed as [head, part, d] (BLOOM ``query_key_value``).
- ``blocked``:    one fused projection viewed as [part, head, d] (GPT-2 ``c_attn``).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Literal

import torch
from torch import Tensor

from lens_heads.errors import LensHeadsError
from lens_heads.registry import Registry

Part = Literal["q", "k", "v"]
PARTS: tuple[Part, ...] = ("q", "k", "v")


@dataclass(frozen=True)
class ArchSpec:
    """How one architecture lays out its attention heads (declarative)."""

    name: str
    model_types: tuple[str, ...]  # HF ``config.model_type`` values served by this entry
    layers: str  # path of the block list, e.g. "model.layers"
    attn: str  # attention module inside a block, e.g. "self_attn"
    qkv: dict[str, str]  # part -> projection module (the same name for all parts when fused)
    out: str  # output projection module
    layout: Literal["separate", "interleaved", "blocked"] = "separate"
    conv1d: bool = False  # GPT-2 Conv1D: weight is [in, out], so output features are dim 1
    qkv_bias: bool = False
    out_bias: bool = False
    alibi: bool = False
    qk_norm: Literal[None, "per_head", "full"] = None  # "full": norm over all heads (OLMo-2)
    qk_norm_modules: dict[str, str] | None = None  # part -> its norm module inside the attention ("full" norms)
    prepends_bos: bool = False  # the usual tokenizer behaviour (the loaded tokenizer decides)
    in_table: bool = True  # False: a generic entry (head counts only; no parameter paths)
    # config attribute names (first one present wins)
    n_layers_keys: tuple[str, ...] = ("num_hidden_layers", "n_layer", "num_layers", "n_layers")
    n_heads_keys: tuple[str, ...] = ("num_attention_heads", "n_head", "num_heads", "n_heads")
    n_kv_keys: tuple[str, ...] = ("num_key_value_heads", "num_kv_heads", "n_kv_heads")
    d_model_keys: tuple[str, ...] = ("hidden_size", "n_embd", "d_model")
    head_dim_keys: tuple[str, ...] = ("head_dim", "kv_channels")

    @classmethod
    def generic(cls, model_type: str) -> "ArchSpec":
        """An architecture outside the table: head counts from the config, no parameter paths."""
        return cls(model_type, (model_type,), "", "", {}, "", in_table=False)

    def require_table(self, what: str) -> None:
        """One clear error where parameter paths are needed and this architecture has none."""
        if not self.in_table:
            raise LensHeadsError(
                f"{what} needs the parameter layout of {self.name!r}, which lens_heads' architecture table does "
                f"not have: add an ArchSpec entry for model_type {self.name!r} to ARCHITECTURES in "
                f"lens_heads/models/geometry.py (block list path, attention module, q/k/v and output projection "
                f"names, their layout); scoring, ablation, evaluation and diagnosis work without one")


_SEPARATE = dict(q="q_proj", k="k_proj", v="v_proj")

ARCHITECTURES: Registry[ArchSpec] = Registry("architecture", {
    spec.name: spec
    for spec in [
        ArchSpec("llama", ("llama", "mistral"), "model.layers", "self_attn", _SEPARATE, "o_proj",
                 prepends_bos=True),
        ArchSpec("qwen2", ("qwen2",), "model.layers", "self_attn", _SEPARATE, "o_proj",
                 qkv_bias=True),
        ArchSpec("olmo2", ("olmo2",), "model.layers", "self_attn", _SEPARATE, "o_proj",
                 qk_norm="full", qk_norm_modules=dict(q="q_norm", k="k_norm")),
        ArchSpec("gemma3", ("gemma3", "gemma3_text"), "model.layers", "self_attn", _SEPARATE,
                 "o_proj", qk_norm="per_head", prepends_bos=True),
        ArchSpec("bloom", ("bloom",), "transformer.h", "self_attention",
                 dict(q="query_key_value", k="query_key_value", v="query_key_value"), "dense",
                 layout="interleaved", qkv_bias=True, out_bias=True, alibi=True),
        ArchSpec("gpt2", ("gpt2",), "transformer.h", "attn",
                 dict(q="c_attn", k="c_attn", v="c_attn"), "c_proj",
                 layout="blocked", conv1d=True, qkv_bias=True, out_bias=True),
    ]
})
"""Every architecture lens_heads knows, by Hugging Face ``model_type``: one declarative ``ArchSpec``
(where the blocks, attention module and q/k/v/output projections are, and their layout) instead of
per-architecture branches; ``load_model`` resolves it against a model's config into a
``HeadGeometry`` (docs/methods.md §8)."""


def arch_for_model_type(model_type: str) -> ArchSpec:
    """The table's entry for ``model_type``, else a generic one (``ArchSpec.generic``)."""
    for spec in ARCHITECTURES.values():
        if model_type in spec.model_types:
            return spec
    return ArchSpec.generic(model_type)


def alibi_slopes(n_heads: int) -> Tensor:
    """ALiBi slopes m_h as BLOOM builds them (closest power of two, then interleaved extras)."""
    closest = 2 ** math.floor(math.log2(n_heads))
    base = 2 ** (-(2 ** -(math.log2(closest) - 3)))
    slopes = [base ** (i + 1) for i in range(closest)]
    if closest != n_heads:
        extra_base = 2 ** (-(2 ** -(math.log2(2 * closest) - 3)))
        n_extra = min(closest, n_heads - closest)
        slopes += [extra_base ** (i + 1) for i in range(0, 2 * n_extra, 2)]
    return torch.tensor(slopes, dtype=torch.float64)


@dataclass(frozen=True)
class ParamSlice:
    """Features ``index`` along ``dim`` of parameter ``name`` (full HF name)."""

    name: str
    dim: int
    index: Tensor


def _first(config, keys: tuple[str, ...], default=None):
    for key in keys:
        value = getattr(config, key, None)
        if value is not None:
            return value
    return default


@dataclass(frozen=True)
class HeadGeometry:
    """An architecture entry resolved against one model config."""

    arch: ArchSpec
    n_layers: int
    n_heads: int  # query heads per layer (a pruned model: the most any layer has)
    n_kv_heads: int
    d_head: int
    d_model: int
    # a pruned model (lens_heads.surgery.prune): query / KV heads of each layer; None: n_heads / n_kv_heads everywhere.
    # Head h of layer L exists when h < heads_in(L); scores of the others are NaN and nothing ablates them.
    heads_per_layer: tuple[int, ...] | None = None
    kv_per_layer: tuple[int, ...] | None = None
    kept: tuple[tuple[int, ...], ...] | None = None  # a pruned model: each layer's original query heads, in order
    n_heads_before: int | None = None  # a pruned model: query heads per layer before pruning

    @classmethod
    def from_config(cls, config) -> "HeadGeometry":
        model_type = getattr(config, "model_type", None) or "?"
        arch = arch_for_model_type(model_type)
        n_layers, n_heads = _first(config, arch.n_layers_keys), _first(config, arch.n_heads_keys)
        d_model = _first(config, arch.d_model_keys)
        if not all(isinstance(v, int) and v > 0 for v in (n_layers, n_heads, d_model)):
            raise LensHeadsError(f"cannot read the head geometry of model_type {model_type!r} from its config "
                                 f"(layers {n_layers}, heads {n_heads}, hidden size {d_model}): give its config "
                                 f"attribute names in lens_heads/models/geometry.py")
        d_head = _first(config, arch.head_dim_keys) or d_model // n_heads
        n_kv = _first(config, arch.n_kv_keys)
        if n_kv is None:
            n_kv = 1 if getattr(config, "multi_query", False) else n_heads
        pruned = getattr(config, "lens_heads_pruned", None)
        if pruned:  # per-layer head counts of a pruned model
            heads = tuple(len(k) for k in pruned["keep_q"])
            kv = tuple(len(k) for k in pruned["keep_kv"])
            return cls(arch, n_layers, max(heads), max(kv), d_head, d_model, heads, kv,
                       tuple(tuple(k) for k in pruned["keep_q"]), n_heads)
        return cls(arch, n_layers, n_heads, n_kv, d_head, d_model)

    # --- head bookkeeping -------------------------------------------------------------
    @property
    def group_size(self) -> int:
        """Query heads per KV head (1 without grouped-query attention)."""
        return self.n_heads // self.n_kv_heads

    @property
    def pruned(self) -> bool:
        return self.heads_per_layer is not None

    def heads_in(self, layer: int) -> int:
        """Query heads of ``layer``."""
        return self.n_heads if self.heads_per_layer is None else self.heads_per_layer[layer]

    def kv_in(self, layer: int) -> int:
        return self.n_kv_heads if self.kv_per_layer is None else self.kv_per_layer[layer]

    def group_size_of(self, layer: int) -> int:
        return self.heads_in(layer) // self.kv_in(layer)

    @property
    def n_units(self) -> int:
        """Heads in the whole model (layers x heads, or the per-layer counts' sum)."""
        return self.n_layers * self.n_heads if self.heads_per_layer is None else sum(self.heads_per_layer)

    def present(self) -> Tensor:
        """[layer, head] True where the head exists (all of them but in a pruned model)."""
        mask = torch.zeros(self.n_layers, self.n_heads, dtype=torch.bool)
        for L in range(self.n_layers):
            mask[L, :self.heads_in(L)] = True
        return mask

    def kv_head(self, head: int) -> int:
        return head // self.group_size

    def check_head(self, layer: int, head: int) -> None:
        if not (0 <= layer < self.n_layers and 0 <= head < self.heads_in(layer)):
            per = f"; layer {layer} has {self.heads_in(layer)} (pruned)" \
                if self.pruned and 0 <= layer < self.n_layers else ""
            raise LensHeadsError(
                f"head {layer}.{head} out of range: the model has {self.n_layers} layers "
                f"x {self.n_heads} heads (layer 0..{self.n_layers - 1}, head 0..{self.n_heads - 1}){per}"
            )

    def alibi_slopes(self, layer: int | None = None) -> Tensor | None:
        """ALiBi slope of each head (None without ALiBi). A pruned model's heads are renumbered
        per layer and keep their original slopes, so there ``layer`` is needed (None without it)."""
        if not self.arch.alibi:
            return None
        if not self.pruned:
            return alibi_slopes(self.n_heads)
        return None if layer is None else alibi_slopes(self.n_heads_before)[list(self.kept[layer])]

    # --- where head features live -----------------------------------------------------
    def _module(self, layer: int, module: str) -> str:
        self.arch.require_table("slicing head parameters")
        return f"{self.arch.layers}.{layer}.{self.arch.attn}.{module}"

    def _features(self, layer: int, part: Part, head: int) -> Tensor:
        """Output-feature indices of ``head`` (a KV head for k/v) in ``layer``'s Q/K/V projection."""
        d, p = self.d_head, PARTS.index(part)
        layout = self.arch.layout
        if layout == "separate":
            start = head * d
        elif layout == "interleaved":  # [head, part, d]
            start = (head * 3 + p) * d
        else:  # blocked: [part, head, d]
            start = (p * self.heads_in(layer) + head) * d
        return torch.arange(start, start + d)

    def qkv_slices(self, layer: int, head: int, part: Part, bias: bool = False) -> ParamSlice:
        """Weight (or bias) features that compute ``part`` for query head ``head``.

        For k/v under grouped-query attention this is the shared KV head's slice.
        """
        self.check_head(layer, head)
        unit = head if part == "q" else self.kv_head(head)
        suffix = "bias" if bias else "weight"
        dim = 0 if bias else (1 if self.arch.conv1d else 0)
        name = self._module(layer, self.arch.qkv[part]) + "." + suffix
        return ParamSlice(name, dim, self._features(layer, part, unit))

    def out_slice(self, layer: int, head: int) -> ParamSlice:
        """Input features of the output projection that read ``head`` (its W_O^h)."""
        self.check_head(layer, head)
        dim = 0 if self.arch.conv1d else 1
        index = torch.arange(head * self.d_head, (head + 1) * self.d_head)
        return ParamSlice(self._module(layer, self.arch.out) + ".weight", dim, index)

    def check_shapes(self, pattern: tuple, v: tuple, z: tuple) -> None:
        """The bridge's hook shapes (one layer, batch 1, T tokens) against this geometry."""
        T = z[1] if len(z) > 1 else 0
        h, kv = self.heads_in(0), self.kv_in(0)
        want = {"hook_pattern": (1, h, T, T), "hook_v": (1, T, kv, self.d_head), "hook_z": (1, T, h, self.d_head)}
        for (name, expected), got in zip(want.items(), (pattern, v, z)):
            if tuple(got) != expected:
                raise LensHeadsError(
                    f"{self.arch.name}: the bridge's {name} has shape {tuple(got)}, but the config says {expected} "
                    f"({self.n_heads} heads, {self.n_kv_heads} KV heads, d_head {self.d_head}); lens_heads cannot "
                    f"score this architecture's heads yet")

    def out_bias_name(self, layer: int) -> str | None:
        return self._module(layer, self.arch.out) + ".bias" if self.arch.out_bias else None

    def w_o(self, params: dict[str, Tensor], layer: int) -> Tensor:
        """W_O of one layer as [head, d_head, d_model] from HF parameters."""
        sl = self.out_slice(layer, 0)
        w = params[sl.name]
        w = w if self.arch.conv1d else w.T  # -> [n_heads*d_head, d_model]
        return w.reshape(self.heads_in(layer), self.d_head, self.d_model)
