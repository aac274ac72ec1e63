"""What surgery edits, and the re-initialisation itself (parameter edits on a plain HF model).

For each target head (layer L, query head h):

- its Q weight slice is re-initialised (Xavier, see below) and its Q bias slice zeroed;
- its K and V slices: without grouped-query attention (group size 1) they belong to the head
  alone and are re-initialised (bias zeroed) too. With GQA they are shared by a group and the
  policy decides: ``q_only`` (default) leaves the shared K/V untouched and frozen; ``group``
  re-initialises a group's K/V only when every query head of the group is a target;
- its slice of the output projection (W_O^h, the columns that read head h) is zeroed, so right
  after surgery the model equals the original with the target heads zero-ablated;
- the output bias stays frozen.

Every edited slice is trainable; nothing else is (see ``masks.py``).

Xavier fan convention: each slice is a [d_head, d_model] map (d_model inputs -> d_head outputs),
so fan_in = d_model and fan_out = d_head -- exactly what ``torch.nn.init.xavier_*_`` computes on
the slice viewed as a [d_head, d_model] weight. Uniform bound sqrt(6 / (fan_in + fan_out)),
normal std sqrt(2 / (fan_in + fan_out)), gain 1. Values are drawn in float32 from a seeded
generator, slice by slice in plan order, then cast to the parameter's dtype.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from typing import Literal

import torch
from torch import Tensor

from lens_heads.errors import LensHeadsError
from lens_heads.interventions.specs import Head
from lens_heads.models.geometry import PARTS, HeadGeometry, ParamSlice

INITS = ("xavier_uniform", "xavier_normal")
GQA_POLICIES = ("q_only", "group")


@dataclass(frozen=True)
class SliceEdit:
    slice: ParamSlice
    action: Literal["reinit", "zero"]
    what: str  # e.g. "3.1 q weight", for reports


@dataclass
class SurgeryPlan:
    targets: list[Head]
    gqa_policy: str
    edits: list[SliceEdit] = field(default_factory=list)

    @property
    def trainable_names(self) -> list[str]:
        return sorted({e.slice.name for e in self.edits})

    def mask(self, name: str, like: Tensor) -> Tensor:
        """0/1 mask (dtype of ``like``) over parameter ``name``: 1 on every edited slice."""
        m = torch.zeros_like(like, dtype=like.dtype)
        for e in self.edits:
            if e.slice.name == name:
                m.index_fill_(e.slice.dim, e.slice.index.to(m.device), 1)
        return m

    def describe(self) -> dict:
        return {"targets": [f"{L}.{h}" for L, h in self.targets], "gqa_policy": self.gqa_policy,
                "edits": [f"{e.what}: {e.action}" for e in self.edits],
                "trainable_tensors": self.trainable_names}


def plan_surgery(geometry: HeadGeometry, targets, gqa_policy: str = "q_only") -> SurgeryPlan:
    """The slice edits for ``targets`` (validated: in range, non-empty, known policy)."""
    if gqa_policy not in GQA_POLICIES:
        raise LensHeadsError(f"unknown GQA policy {gqa_policy!r}; choose one of: {', '.join(GQA_POLICIES)}")
    targets = sorted({(int(L), int(h)) for L, h in targets})
    if not targets:
        raise LensHeadsError("no target heads: nothing to repair")
    for L, h in targets:
        geometry.check_head(L, h)
    geometry.arch.require_table("surgery (re-initialising heads)")
    if geometry.arch.qk_norm == "full":
        raise LensHeadsError(
            f"surgery is not supported for {geometry.arch.name}: its query/key norm spans all heads, "
            "so re-initialising one head's Q or K would change every other head of the layer")
    g, bias = geometry, geometry.arch.qkv_bias
    chosen = set(targets)
    edits: list[SliceEdit] = []

    def add(L: int, h: int, part: str, label: str) -> None:
        edits.append(SliceEdit(g.qkv_slices(L, h, part), "reinit", f"{label} {part} weight"))
        if bias:
            edits.append(SliceEdit(g.qkv_slices(L, h, part, bias=True), "zero", f"{label} {part} bias"))

    done_kv: set[tuple[int, int]] = set()
    for L, h in targets:
        add(L, h, "q", f"{L}.{h}")
        kv = g.kv_head(h)
        group = [q for q in range(g.n_heads) if g.kv_head(q) == kv]
        owns_kv = g.group_size == 1 or (gqa_policy == "group" and all((L, q) in chosen for q in group))
        if owns_kv and (L, kv) not in done_kv:
            done_kv.add((L, kv))
            for part in PARTS[1:]:
                add(L, h, part, f"{L}.kv{kv}" if g.group_size > 1 else f"{L}.{h}")
        edits.append(SliceEdit(g.out_slice(L, h), "zero", f"{L}.{h} out weight"))
    return SurgeryPlan(targets, gqa_policy, edits)


def named_params(hf_model) -> dict[str, torch.nn.Parameter]:
    return dict(hf_model.named_parameters(remove_duplicate=False))


def _xavier(init: str, fan_in: int, fan_out: int, shape, gen: torch.Generator) -> Tensor:
    if init == "xavier_uniform":
        bound = math.sqrt(6.0 / (fan_in + fan_out))
        return (torch.rand(shape, generator=gen) * 2 - 1) * bound
    std = math.sqrt(2.0 / (fan_in + fan_out))
    return torch.randn(shape, generator=gen) * std


@torch.no_grad()
def reinitialise(hf_model, plan: SurgeryPlan, init: str = "xavier_uniform", seed: int = 0) -> None:
    """Apply ``plan`` to ``hf_model`` in place: Xavier re-init of Q/K/V slices, zeros elsewhere."""
    if init not in INITS:
        raise LensHeadsError(f"unknown init {init!r}; choose one of: {', '.join(INITS)}")
    params = named_params(hf_model)
    missing = [n for n in plan.trainable_names if n not in params]
    if missing:
        raise LensHeadsError(f"model has no parameter {missing[0]} (geometry map and model disagree)")
    gen = torch.Generator().manual_seed(seed)
    for e in plan.edits:
        p = params[e.slice.name]
        idx = e.slice.index.to(p.device)
        if e.action == "zero":
            p.index_fill_(e.slice.dim, idx, 0.0)
            continue
        d_in = p.shape[1 - e.slice.dim]
        w = _xavier(init, d_in, len(idx), (len(idx), d_in), gen)  # [d_head, d_model]
        if e.slice.dim == 1:
            w = w.T  # Conv1D layout: [d_model, d_head]
        p.index_copy_(e.slice.dim, idx, w.to(p.dtype).to(p.device).contiguous())


def plan_to_json(plan: SurgeryPlan) -> str:
    return json.dumps(plan.describe(), sort_keys=True)
