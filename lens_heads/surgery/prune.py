"""Physical head pruning: from "these heads can go" to a smaller model (docs/methods.md §7).

``prune(model, heads)`` returns a new ``LoadedModel`` whose attention layers have lost the
heads: each removed query head's rows of the query projection and its input columns of the
output projection go; a KV head's rows of the key and value projections go only when every
query head of its group goes. Grouped-query attention needs every KV group of a layer to keep
the same number of query heads, so a group that keeps fewer than the layer's largest also keeps
some of its removed heads as *padding*: their output columns are zero, so they change nothing
(the pruned model equals the original under zero-ablation of the removed heads exactly). A layer
that would lose every head is an error, unless ``allow_empty_layers``: it then keeps one padding
head (its output is the projection's bias alone, as under zero-ablation).

Supported: every layout of the architecture table -- ``separate`` projections (Llama / Mistral,
Qwen2, Gemma 3) and the fused QKV of GPT-2 (``blocked``) and BLOOM (``interleaved``), biases
included; a pruned BLOOM layer keeps its heads' own ALiBi slopes. OLMo-2's query / key norms span
all heads, so there the query and key projections stay whole and the norms' outputs are narrowed
to the kept heads (exact; it saves the values, the output projection and the removed heads'
attention, not the query / key projections).

``save_pruned(model, out_dir)`` writes a ``save_pretrained`` folder whose config carries the
plan (``lens_heads_pruned``) and whose remote code (``modeling_lens_heads_pruned.py``, a copy of
``lens_heads.models.pruned_model``) rebuilds it: ``load_model(folder)`` in lens_heads, or
``AutoModelForCausalLM.from_pretrained(folder, trust_remote_code=True)`` in transformers alone.
"""

from __future__ import annotations

import inspect
import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Sequence

from lens_heads.errors import LensHeadsError
from lens_heads.interventions.specs import Head
from lens_heads.files.hashing import sha256_bytes
from lens_heads.models.load import boot, model_digest
from lens_heads.models import pruned_model
from lens_heads.models.pruned_model import shrink
from lens_heads.scores import SCORES, resolve_score_ids
from lens_heads.surgery.export import export_model
from lens_heads.surgery.targets import TargetSelector, parse_select
from lens_heads import scores as scoring

if TYPE_CHECKING:
    from lens_heads.models.load import LoadedModel

REMOTE_CODE = "modeling_lens_heads_pruned.py"


@dataclass(frozen=True)
class LayerPlan:
    """One layer after pruning: the original query heads kept (padding included), those kept
    only as padding (zero output), and the original KV heads kept."""

    keep_q: tuple[int, ...]
    pad_q: tuple[int, ...]
    keep_kv: tuple[int, ...]


def plan_layer(geometry, layer: int, removed: set[int], allow_empty: bool) -> LayerPlan:
    n = geometry.heads_in(layer)
    group = geometry.group_size_of(layer)
    kept = {g: [h for h in range(g * group, (g + 1) * group) if h not in removed] for g in range(n // group)}
    live = {g: hs for g, hs in kept.items() if hs}
    if not live:
        if not allow_empty:
            raise LensHeadsError(f"pruning would remove every head of layer {layer}; keep at least one, or allow "
                                 f"empty layers (--allow-empty-layers: one zero-output head stays)")
        return LayerPlan((0,), (0,), (0 // group,))
    width = max(len(hs) for hs in live.values())  # every kept group keeps this many query heads
    keep_q, pad_q = [], []
    for g, hs in live.items():
        pads = [h for h in range(g * group, (g + 1) * group) if h in removed][:width - len(hs)]
        keep_q += sorted(hs + pads)
        pad_q += pads
    return LayerPlan(tuple(keep_q), tuple(sorted(pad_q)), tuple(live))


def check_prunable(geometry, config=None) -> None:
    """One clear error, before any work, when ``geometry``'s architecture (and the HF ``config``,
    where given) cannot be pruned exactly, or the model is pruned already (both known from the
    config alone: ``models.load.peek_geometry``)."""
    if geometry.pruned:
        raise LensHeadsError("the model is pruned already: prune the original with the union of the head sets")
    geometry.arch.require_table("pruning")
    if config is not None and getattr(config, "slow_but_exact", False) and getattr(config, "pretraining_tp", 1) > 1:
        raise LensHeadsError("pruning a BLOOM config with slow_but_exact and pretraining_tp > 1: transformers' "
                             "tensor-parallel emulation assumes every head is there; set slow_but_exact=false")


def plan_prune(geometry, heads: Sequence[Head], allow_empty_layers: bool = False) -> list[LayerPlan]:
    """The per-layer plan for removing ``heads`` (checked against ``geometry``)."""
    check_prunable(geometry)
    heads = sorted(set(heads))
    if not heads:
        raise LensHeadsError("nothing to prune: the head set is empty")
    for L, h in heads:
        geometry.check_head(L, h)
    by_layer: dict[int, set[int]] = {}
    for L, h in heads:
        by_layer.setdefault(L, set()).add(h)
    return [plan_layer(geometry, L, by_layer.get(L, set()), allow_empty_layers) for L in range(geometry.n_layers)]


def plan_config(geometry, layers: list[LayerPlan]) -> dict:
    """The plan as the config field ``lens_heads_pruned`` (what ``pruned_model.shrink`` reads)."""
    a = geometry.arch
    return {"layout": a.layout, "layers": a.layers, "attn": a.attn, "q": a.qkv["q"], "k": a.qkv["k"],
            "v": a.qkv["v"], "out": a.out, "d_head": geometry.d_head,
            **({"full_norms": dict(a.qk_norm_modules)} if a.qk_norm == "full" else {}),
            "keep_q": [list(p.keep_q) for p in layers], "keep_kv": [list(p.keep_kv) for p in layers],
            "pad_q": [list(p.pad_q) for p in layers]}


def prune(model: LoadedModel, heads: Sequence[Head], allow_empty_layers: bool = False):
    """A new ``LoadedModel``: ``model`` without ``heads`` (``model`` itself is unchanged)."""

    check_prunable(model.geometry)  # pruned already, or an architecture pruning does not know
    if model.sharded:
        raise LensHeadsError("pruning copies the model onto one device: load it without a device map")
    check_prunable(model.geometry, model.hf_model.config)
    layers = plan_prune(model.geometry, heads, allow_empty_layers)
    plan = plan_config(model.geometry, layers)
    hf = model.load_hf_model()
    shrink(hf, plan)
    hf.config.lens_heads_pruned = plan
    pruned = boot(hf, model.tokenizer, model.source, model.dtype, model.device)
    pruned.weights_digest = sha256_bytes([model_digest(model).encode(), json.dumps(plan, sort_keys=True).encode()])
    return pruned


def save_pruned(model: LoadedModel, out_dir: str | os.PathLike, extra_files: dict[str, str] | None = None) -> Path:
    """Export a pruned model: weights, config with the plan, tokenizer and the remote code (and
    ``extra_files``, name -> text, written with them)."""
    if not model.geometry.pruned:
        raise LensHeadsError("not a pruned model (lens_heads.surgery.prune.prune makes one)")
    hf = model.load_hf_model()  # a plain (unbridged) copy, pruned as the model is
    base = type(hf).__name__.removeprefix("LensHeadsPruned")
    hf.config.auto_map = {"AutoModelForCausalLM": f"{REMOTE_CODE[:-3]}.{'LensHeadsPruned' + base}"}
    code = inspect.getsource(pruned_model) + (
        f"\n\nimport transformers as _transformers\n\nLensHeadsPruned{base} = pruned_class(_transformers.{base})\n")
    out = export_model(hf, model.tokenizer, out_dir, extra_files={REMOTE_CODE: code, **(extra_files or {})})
    return out


# -----------------------------------------------------------------------------
# Selecting the heads to remove


@dataclass(frozen=True)
class PruneSelection:
    """Which heads go: the least active ``fraction`` of all heads by a score (``ID@P%``), or every
    head whose dataset-level score crosses a threshold (``ID<TAU``, ``ID>=TAU``, ...)."""

    score_id: str
    fraction: float | None = None  # ID@P%
    op: str | None = None  # ID<TAU
    threshold: float | None = None
    groups: bool = False  # ID@P%:groups -- whole KV groups, least active first (what GQA pruning saves)

    @classmethod
    def parse(cls, text: str) -> "PruneSelection":

        text = text.strip()
        groups = text.endswith(":groups")
        if groups:
            text = text.removesuffix(":groups")
            if "@" not in text:
                raise LensHeadsError(f"--select {text}:groups: whole groups go with ID@P% (e.g. ahon_ln@30%:groups)")
        if "@" in text:
            sid, _, pct = text.partition("@")
            try:
                p = float(pct.removesuffix("%")) / 100
            except ValueError:
                p = -1.0
            if not pct.endswith("%") or not 0 < p < 1:
                raise LensHeadsError(f"--select {text!r}: write ID@P% with 0 < P < 100 (e.g. ahon_ln@30%)")
            resolve_score_ids(sid)
            return cls(sid, fraction=p, groups=groups)
        sid, op, tau = parse_select(text)
        return cls(sid, op=op, threshold=tau)

    def __str__(self) -> str:
        if self.fraction is not None:
            return f"{self.score_id}@{100 * self.fraction:g}%" + (":groups" if self.groups else "")
        return f"{self.score_id}{self.op}{self.threshold!r}"

    def resolve(self, model: LoadedModel, inputs) -> list[Head]:
        """The heads this selection removes from ``model``, scored on ``inputs``."""
        hs = scoring.score_heads(model, inputs, [self.score_id], progress=False)
        if self.fraction is not None and self.groups:
            return whole_groups(model.geometry, hs.mean[self.score_id], self.score_id, self.fraction)
        if self.fraction is not None:
            return sorted(hs.least_active(self.score_id, round(self.fraction * model.geometry.n_units)))

        return TargetSelector(select=f"{self.score_id}{self.op}{self.threshold!r}").resolve(model, inputs=inputs)


def whole_groups(geometry, mean, score_id: str, fraction: float) -> list[Head]:
    """The query heads of whole KV groups, least active groups first by the mean of their heads'
    dataset-level scores (in the function's inactive direction), until ``fraction`` of all heads;
    no layer loses its last group."""
    import math


    sign = 1.0 if SCORES[score_id].inactive_when == "low" else -1.0
    g = geometry.group_size
    ranked = []
    for L in range(geometry.n_layers):
        for k in range(geometry.n_kv_heads):
            vals = [float(mean[L, h]) for h in range(k * g, (k + 1) * g)]
            vals = [v for v in vals if math.isfinite(v)]
            ranked.append((sign * sum(vals) / len(vals) if vals else math.inf, L, k))
    ranked.sort()
    target, heads, left = round(fraction * geometry.n_units), [], {L: geometry.n_kv_heads for L in range(geometry.n_layers)}
    for _, L, k in ranked:
        if len(heads) >= target:
            break
        if left[L] > 1:
            left[L] -= 1
            heads += [(L, h) for h in range(k * g, (k + 1) * g)]
    return sorted(heads)


REPORT_FILE = "prune_report.json"


def read_prune_report(folder: str | os.PathLike) -> dict:
    """The ``prune_report.json`` a ``lens-heads prune`` folder holds (one clear error otherwise)."""
    path = Path(folder) / REPORT_FILE
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise LensHeadsError(f"{folder} holds no {REPORT_FILE}: give the --out folder of 'lens-heads prune'") from None
    except (OSError, ValueError) as exc:
        raise LensHeadsError(f"{path} is unreadable: {exc}") from None
    need = {"removed", "heads_before", "heads_after", "parameters_before", "parameters_after", "heads_per_layer"}
    if not isinstance(data, dict) or not need <= set(data):
        raise LensHeadsError(f"{path} is not a prune report (it lacks {sorted(need - set(data or {}))})")
    return data
