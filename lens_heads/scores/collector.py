"""The streaming collector: score ids -> TransformerLens hooks for one forward of a batch.

Each hook reduces its activation to ``[batch, head]`` numbers at once and keeps nothing else
(no activation cache). At ``hook_z`` of each layer the layer's scores are final, and an
optional ``z_transform`` may replace z (per-input ablation builds on this).
"""

from __future__ import annotations

from typing import Callable, Sequence

import torch
from jaxtyping import Float, Int
from torch import Tensor

from lens_heads.hooks import HookFn, HookKind, hook_name
from lens_heads.scores.functions import SCORES, Acts, BatchGeometry, ScoreFn, _closure, resolve_score_ids

# -----------------------------------------------------------------------------
# The streaming collector

ZTransform = Callable[[int, Tensor, dict[str, Tensor]], Tensor]


class ScoreCollector:
    """Streaming per-head scores for one model; reusable across batches."""

    def __init__(self, model, score_ids: Sequence[str]):
        self.model = model
        self.score_ids = resolve_score_ids(score_ids)
        self.geometry = model.geometry
        plan = _closure(self.score_ids)
        self._base: dict[HookKind, list[ScoreFn]] = {
            k: [SCORES[s] for s in plan if SCORES[s].compute is not None and SCORES[s].reads == (k,)]
            for k in ("pattern", "v", "z")}
        self._derived = [SCORES[s] for s in plan if SCORES[s].combine is not None]
        self._grams: dict[int, Tensor] = {}
        self._batch: BatchGeometry | None = None
        self._layer: list[dict[str, Tensor]] = []
        self._scores: dict[str, Tensor] = {}

    def hooks(self, attention_mask: Int[Tensor, "batch pos"],
              z_transform: ZTransform | None = None) -> list[tuple[str, HookFn]]:
        """Hooks for ONE forward of a batch. At hook_z of layer L, once the layer's scores are
        computed from the unmodified z, calls z_transform(L, z, {id: Float[Tensor,'batch head']})
        and returns its result as the new z (this is how per-input ablation zeroes heads)."""
        g = self.geometry
        self._batch = batch = BatchGeometry.from_mask(attention_mask, self.model.device)
        b = attention_mask.shape[0]
        self._layer = [{} for _ in range(g.n_layers)]
        self._scores = {s: torch.full((b, g.n_layers, g.n_heads), float("nan"), device=self.model.device)
                        for s in self.score_ids}
        out: list[tuple[str, HookFn]] = []
        for L in range(g.n_layers):
            for kind in ("pattern", "v"):
                if self._base[kind]:
                    out.append((hook_name(kind, L), self._reduce_hook(kind, L, batch)))
            out.append((hook_name("z", L), self._z_hook(L, batch, z_transform)))
        return out

    def batch_scores(self) -> dict[str, Float[Tensor, "batch layer head"]]:
        """Scores of the last batch (after the forward)."""
        return self._scores

    def gram(self, layer: int) -> Float[Tensor, "head d_head d_head"]:
        """W_O^h W_O^hT per head (float32), built on first use: ||z W_O^h||^2 = z G_h z^T."""
        if layer not in self._grams:
            with torch.no_grad():
                w = self.geometry.w_o(self.model.params(), layer)  # [head, d_head, d_model]
                w = w.detach().to(self.model.device, torch.float32)
                self._grams[layer] = torch.einsum("hde,hfe->hdf", w, w).contiguous()
        return self._grams[layer]

    # --- hook bodies --------------------------------------------------------------------
    def _reduce(self, kind: HookKind, L: int, x: Tensor, batch: BatchGeometry) -> None:
        acts = Acts(kind, x, batch, L, self.gram, self.geometry.group_size)
        store = self._layer[L]
        for fn in self._base[kind]:
            store[fn.id] = fn.compute(acts)

    def _reduce_hook(self, kind: HookKind, L: int, batch: BatchGeometry) -> HookFn:
        def hook(x: Tensor, hook=None) -> None:
            self._reduce(kind, L, x, batch)
        return hook

    def _z_hook(self, L: int, batch: BatchGeometry, z_transform: ZTransform | None) -> HookFn:
        def hook(z: Float[Tensor, "batch pos head d_head"], hook=None) -> Tensor | None:
            if self._base["z"]:
                self._reduce("z", L, z, batch)
            store = self._layer[L]
            for fn in self._derived:
                store[fn.id] = fn.combine(store)
            layer_scores = {s: store[s] for s in self.score_ids}
            for s, v in layer_scores.items():
                self._scores[s][:, L] = v
            self._layer[L] = {}  # nothing of this layer is kept beyond the scores
            if z_transform is not None:
                return z_transform(L, z, layer_scores)
            return None
        return hook
