"""The streaming collector: score ids -> TransformerLens hooks for one forward of a batch.

Each hook reduces its activation to ``[batch, head]`` numbers at once and keeps nothing else
(no activation cache). At ``hook_z`` of each layer the layer's scores are final, and an
optional ``z_transform`` may replace z (per-input ablation builds on this).

This is the one place that hooks attention patterns (and values, head outputs) and reduces
them over a batch's real positions: besides registry scores, a collector computes any
unregistered base ``ScoreFn`` passed as ``extra`` (collapse diagnosis's local mass,
docs/methods.md §6, is one), with the same ``Acts`` and padding geometry.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Callable, Sequence

import torch
from jaxtyping import Float, Int
from torch import Tensor

from lens_heads.models.attention import RowRequest
from lens_heads.errors import LensHeadsError
from lens_heads.models.hooks import HookFn, HookKind, hook_name, w_o
from lens_heads.scores.functions import POSITION_AXIS, SCORES, Acts, BatchGeometry, ScoreFn, _closure, resolve_score_ids

if TYPE_CHECKING:
    from lens_heads.models.load import LoadedModel

# -----------------------------------------------------------------------------
# The streaming collector

ZTransform = Callable[[int, Tensor, dict[str, Tensor]], Tensor]


@dataclass
class PrefixStats:
    """A cached prefix as a scoring forward after it needs it (prefix sharing, docs/methods.md
    §1): its length, and per layer and hook kind the per-position quantities its own forward
    computed for the scores (``Acts``: norms, first-token weights, entropies; [1, ..., length]).
    Filled by the prefix's forward (``ScoreCollector.hooks(..., record=...)``), read by every
    forward of suffixes after it (``prefix=``)."""

    length: int
    layers: dict[int, dict[str, dict[str, Tensor]]] = field(default_factory=dict)  # layer -> kind -> quantity

    def at(self, layer: int, kind: str) -> dict[str, Tensor]:
        return self.layers.setdefault(layer, {}).setdefault(kind, {})

    def cut(self, length: int) -> "PrefixStats":
        """The stats of this input's first ``length`` positions (a one-row forward of a whole
        input, recorded, gives those of its prefix: under causal attention they are the
        prefix's own), as copies."""
        if not 0 < length <= self.length:
            raise LensHeadsError(f"cannot cut {length} positions from a prefix of {self.length}")
        out = PrefixStats(length)
        for L, kinds in self.layers.items():
            for kind, quantities in kinds.items():
                out.at(L, kind).update({key: x.narrow(POSITION_AXIS[key] % x.dim(), 0, length).clone()
                                        for key, x in quantities.items()})
        return out

    def nbytes(self) -> int:
        return sum(x.nbytes for kinds in self.layers.values() for q in kinds.values() for x in q.values())


class ScoreCollector:
    """Streaming per-head scores for one model; reusable across batches.

    ``score_ids``: registry scores (docs/methods.md §1). ``extra``: base statistics outside the
    registry (``ScoreFn`` with ``compute``), computed at their hook beside the scores and
    returned by ``batch_scores`` under their ids; ``z_transform`` sees only ``score_ids``.
    """

    def __init__(self, model: LoadedModel, score_ids: Sequence[str], extra: Sequence[ScoreFn] = ()):
        self.model = model
        self.score_ids = resolve_score_ids(score_ids)
        self.extra = _check_extra(extra, self.score_ids)
        self.geometry = model.geometry
        plan = [SCORES[s] for s in _closure(self.score_ids)] + self.extra
        self._base: dict[HookKind, list[ScoreFn]] = {
            k: [fn for fn in plan if fn.compute is not None and fn.reads == (k,)]
            for k in ("pattern", "rows", "v", "z")}
        self._derived = [fn for fn in plan if fn.combine is not None]
        self._out_ids = self.score_ids + [fn.id for fn in self.extra]
        self._grams: dict[int, Tensor] = {}
        self._batch: BatchGeometry | None = None
        self._layer: list[dict[str, Tensor]] = []
        self._scores: dict[str, Tensor] = {}
        self._prefix: PrefixStats | None = None
        self._record: PrefixStats | None = None

    def hooks(self, attention_mask: Int[Tensor, "batch pos"],
              z_transform: ZTransform | None = None, *, prefix: PrefixStats | None = None,
              record: PrefixStats | None = None) -> list[tuple[str, HookFn]]:
        """Hooks for ONE forward of a batch. At hook_z of layer L, once the layer's scores are
        computed from the unmodified z, calls z_transform(L, z, {id: Float[Tensor,'batch head']})
        and returns its result as the new z (this is how per-input ablation zeroes heads).

        ``record``: this forward is a shared prefix (one row); its per-position quantities are
        kept there. ``prefix``: this forward continues from that cached prefix
        (``attention_mask`` marks the suffixes' tokens only); each row's scores are those of
        the prefix followed by its suffix, the whole input, as one forward would give them."""
        g = self.geometry
        if prefix is not None:  # the reductions run over the whole input: the prefix's positions, then the suffix's
            attention_mask = torch.cat([attention_mask.new_ones(attention_mask.shape[0], prefix.length),
                                        attention_mask], dim=1)
        self._prefix, self._record = prefix, record
        self._batch = batch = BatchGeometry.from_mask(attention_mask, self.model.device)
        self._on = {}  # the batch geometry on other devices, made once per batch
        b = attention_mask.shape[0]
        self._layer = [{} for _ in range(g.n_layers)]
        self._scores = {s: torch.full((b, g.n_layers, g.n_heads), float("nan"), device=self.model.device)
                        for s in self._out_ids}
        out: list[tuple[str, HookFn]] = []
        for L in range(g.n_layers):
            if self._base["rows"]:  # what the scores read of the pattern, per query row (no pattern when fused)
                out.append((hook_name("rows", L), RowRequest(batch.first, self._reduce_hook("rows", L, batch))))
            if self._base["pattern"]:
                out.append((hook_name("pattern", L), self._reduce_hook("pattern", L, batch)))
            if self._base["v"]:  # values, read only: a fused layer forms them even where q, k, v are joint
                out.append((hook_name("values", L), self._reduce_hook("v", L, batch)))
            out.append((hook_name("z", L), self._z_hook(L, batch, z_transform)))
        return out

    def batch_scores(self) -> dict[str, Float[Tensor, "batch layer head"]]:
        """Scores (and ``extra`` statistics) of the last batch (after the forward)."""
        return self._scores

    def gram(self, layer: int, device=None) -> Float[Tensor, "head d_head d_head"]:
        """W_O^h W_O^hT per head (float32), built on first use on ``device`` (the layer's
        activations'; default the model's): ||z W_O^h||^2 = z G_h z^T."""
        device = torch.device(self.model.device if device is None else device)
        if (layer, device) not in self._grams:
            with torch.no_grad():
                w = w_o(self.model, layer)  # [head, d_head, d_model]
                w = w.detach().to(device, torch.float32)
                self._grams[(layer, device)] = torch.einsum("hde,hfe->hdf", w, w).contiguous()
        return self._grams[(layer, device)]

    # --- hook bodies --------------------------------------------------------------------
    def _reduce(self, kind: HookKind, L: int, x: Tensor, batch: BatchGeometry) -> None:
        if batch.maskf.device != x.device:  # a layer on another device (a sharded model)
            batch = self._on.setdefault(x.device, batch.to(x.device))
        acts = Acts(kind, x, batch, L, self.gram, self.geometry.group_size_of(L),
                    prefix=None if self._prefix is None else self._prefix.at(L, kind),
                    record=None if self._record is None else self._record.at(L, kind))
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
            for s in self._out_ids:  # a pruned layer fills its first heads_in(L) columns; the rest stay NaN
                self._scores[s][:, L, :store[s].shape[-1]] = store[s].to(self._scores[s].device)
            layer_scores = {s: store[s] for s in self.score_ids}
            self._layer[L] = {}  # nothing of this layer is kept beyond the scores
            if z_transform is not None:
                return z_transform(L, z, layer_scores)
            return None
        return hook


def _check_extra(extra: Sequence[ScoreFn], score_ids: Sequence[str]) -> list[ScoreFn]:
    """``extra`` as a list: base statistics (one hook each) whose ids clash with nothing."""
    extra = list(extra)
    seen = set(score_ids)
    for fn in extra:
        if not isinstance(fn, ScoreFn) or fn.compute is None:
            raise LensHeadsError(f"extra statistic {getattr(fn, 'id', fn)!r} must be a base ScoreFn "
                                 f"(with compute=, reading one hook)")
        if fn.id in seen or fn.id in SCORES:
            raise LensHeadsError(f"extra statistic {fn.id!r} clashes with a score id or another extra")
        seen.add(fn.id)
    return extra
