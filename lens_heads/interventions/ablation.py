"""Head ablations: zero a head's output z (all positions, before W_O, no rescaling).

What to zero is a typed spec (``lens_heads.interventions.specs``: one parser, one printer); this
module holds the runtime side: every ablation is an ``Ablation`` applied through ``hook_z``
hooks, one set per forward pass of a batch, counting into the counts of a ``counting()`` block::

    abl = parse_ablation("score:ahon_ln@0.41", model.geometry)    # = bind(parse_spec(...), geometry)
    with abl.counting() as counts:
        engine.forward(model, ids, mask, abl.hooks(model, mask, row_keys=request_ids))
    counts.fraction()   # realised mean fraction of (input, layer, head) zeroed in the block

Kinds (spec strings):

* ``none``              nothing is zeroed.
* ``static:L.H,L.H``    a fixed head set, the same on every input (what physical pruning can use).
* ``score:ID@TAU``      per input: head (L, h) is zeroed on an input when its score ``ID`` on that
                        same input -- computed in the same forward, at layer L, from layer L's
                        unmodified z but *after* the ablations of layers < L -- crosses ``TAU``
                        in the score's inactive direction. Tie rule: the comparison is inclusive,
                        ``score >= TAU`` for ``inactive_when="high"``, ``score <= TAU`` for
                        ``"low"``; a NaN score never crosses.
* ``score:ID@TAU:strict``  the same with the authors' strict comparison (``>`` / ``<``), which
                        goes with their CDF thresholds (``thresholds``, rule ``"cdf"``).
* ``score:ID@P%``       the same, its threshold set by ``evaluate_task`` to zero P % of the pooled
                        unablated scores of the questions evaluated (``CalibratedAblation``).
* ``random:P@SEED``     each head on each input is zeroed independently with probability P. The
                        draw depends only on (SEED, row key, layer, head), so results do not depend
                        on batching or order (row keys are stable request ids).

The unit of "% zeroed" is (input, layer, head): one row of a forward counts n_layers x n_heads
units. ``last_zeroed`` holds the boolean [batch, layer, head] mask of the latest forward
(for inspection and tests).
"""

from __future__ import annotations

import contextlib
import math
from typing import TYPE_CHECKING, Callable, Iterator, Sequence

import torch
from jaxtyping import Bool, Float
from torch import Tensor

from lens_heads.forward.engine import RowKey, row_generator
from lens_heads.forward.task_requests import record_inputs
from lens_heads.errors import LensHeadsError
from lens_heads.models.hooks import HookFn, hook_name
from lens_heads.interventions.specs import (ABLATION_FORMS, AblationSpec, Head, NoHeads, RandomHeads,  # noqa: F401
                                      Replaced, ScoreFraction, ScoreThreshold, StaticHeads, parse_heads, parse_spec,
                                      with_replacement)
from lens_heads.interventions.speculation import Speculation
from lens_heads.interventions.thresholds import DEFAULT_RULE, calibrated_spec
from lens_heads.scores import SCORES, ScoreCollector

if TYPE_CHECKING:
    from lens_heads.models.load import LoadedModel

Hooks = list[tuple[str, HookFn]]


def _zero_heads(z: Float[Tensor, "batch pos head d_head"], drop: Bool[Tensor, "batch head"]) -> Tensor:
    """z with the heads in ``drop`` (per row) set to exactly 0 at every position."""
    return z.masked_fill(drop.to(z.device)[:, None, :, None], 0.0)


class Counts:
    """Units of (input, layer, head) zeroed and seen by the forwards of one counting scope,
    plus the latest forward's mask; the hooks of an ablation record into it."""

    def __init__(self):
        self.zeroed = 0
        self.units = 0
        self.last_zeroed: Bool[Tensor, "batch layer head"] | None = None

    def start(self, batch: int, geometry) -> None:
        self.last_zeroed = torch.zeros(batch, geometry.n_layers, geometry.n_heads, dtype=torch.bool)
        self._units_per_row = sum(geometry.heads_in(L) for L in range(geometry.n_layers))

    def take(self, other: "Counts", rows: Sequence[int]) -> None:
        """Count rows ``rows`` of ``other``'s latest forward here (a forward counted apart, whose
        other rows are run again: ``Ablation.counted_apart``)."""
        if not rows:
            return
        self.zeroed += int(other.last_zeroed[list(rows)].sum())
        self.units += len(rows) * other._units_per_row

    def take_row(self, mask: Bool[Tensor, "layer head"], units: int) -> None:
        """Count one input whose mask was realised over more than one forward (one resumed at a
        layer: ``interventions.speculation``): its whole [layer, head] mask, over ``units`` units."""
        self.zeroed += int(mask.sum())
        self.units += int(units)

    def record(self, layer: int, drop: Bool[Tensor, "batch head"]) -> None:
        """Count layer ``layer`` of the current forward (every layer of a forward is recorded once;
        ``drop`` covers the layer's own heads: fewer in a pruned layer)."""
        drop = drop.cpu()
        self.last_zeroed[:, layer, :drop.shape[-1]] = drop
        self.zeroed += int(drop.sum())
        self.units += drop.numel()

    def fraction(self) -> float:
        return self.zeroed / self.units if self.units else math.nan

    def totals(self) -> tuple[int, int] | None:
        """(units zeroed, units seen): what partial evaluations add up."""
        return self.zeroed, self.units


class _NothingCounts(Counts):
    """NoAblation's counts: nothing is ever zeroed (fraction 0.0, no unit totals kept)."""

    def fraction(self) -> float:
        return 0.0

    def totals(self) -> None:
        return None


class Ablation:
    """What every ablation is: a typed ``spec`` (its ``name`` is ``str(spec)``), ``hooks`` for one
    forward, and counts scoped to a ``counting()`` block::

        with ablation.counting() as counts:    # fresh counts for this evaluation
            ... forwards with ablation.hooks(model, mask, row_keys) ...
        counts.fraction()                      # realised fraction zeroed in the block

    ``reuses_prefix``: the zeroed set does not depend on the input (a K/V prefix is cacheable).
    Outside any block the ablation counts into the counts of its last block (or its first)."""

    spec = NoHeads()
    reuses_prefix: bool = True
    needs_task: bool = False  # decided by a task-level score: only evaluate_task can run it
    _counts_type = Counts
    replacement = None  # what ablated heads become (lens_heads.forward.replacement runtime); None: zero
    speculation: Speculation | None = None  # a per-input ablation's entries after shared prefixes (the engine runs them)

    def _prepare(self, model: LoadedModel, attention_mask, row_keys) -> None:
        if self.replacement is not None:
            self.replacement.prepare(model, attention_mask, row_keys)

    def _apply(self, layer: int, z: Tensor, drop: Tensor) -> Tensor:
        """z with the heads in ``drop`` (per row) replaced: by 0, or by the replacement's values."""
        if self.replacement is None:
            return _zero_heads(z, drop)
        return torch.where(drop.to(z.device)[:, None, :, None], self.replacement.values(layer, z), z)

    @property
    def name(self) -> str:
        return str(self.spec)

    @property
    def counts(self) -> Counts:
        if getattr(self, "_counts", None) is None:
            self._counts = self._counts_type()
        return self._counts

    @contextlib.contextmanager
    def counting(self) -> Iterator[Counts]:
        self._counts = self._counts_type()
        yield self._counts

    @contextlib.contextmanager
    def counted_apart(self) -> Iterator[Counts]:
        """Forwards in this block count into fresh counts, not the current block's (a forward
        some of whose rows are run again: ``Counts.take`` adds the others' afterwards)."""
        outer, self._counts = self.counts, self._counts_type()
        try:
            yield self._counts
        finally:
            self._counts = outer

    def hooks(self, model: LoadedModel, attention_mask: Tensor, row_keys: Sequence[int]) -> Hooks:
        raise NotImplementedError

    def prepare_task(self, model: LoadedModel, task, records, n_shot: int, seed: int, protocol=None) -> None:
        """Called by ``evaluate_task`` with the questions about to be evaluated, before any
        forward: an ablation decided by a question-level score computes it here."""

    def replaced_by(self, spec: Replaced) -> "Ablation":
        """This ablation, its heads replaced as ``spec`` says instead of zeroed (part of
        ``bind``, before first use); a replacement drawn per row shares no prefix."""
        self.spec, self.replacement = spec, spec.replacement.runtime()
        if spec.replacement.per_row:
            self.reuses_prefix = False
            self.speculation = None
        return self

    # the current counts, for interactive use
    @property
    def last_zeroed(self):
        return self.counts.last_zeroed

    def zeroed_fraction(self) -> float:
        return self.counts.fraction()

    def zeroed_counts(self) -> tuple[int, int] | None:
        return self.counts.totals()

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.name!r})"


class NoAblation(Ablation):
    """Zero nothing. ``zeroed_fraction`` is 0.0 (nothing is ever zeroed)."""

    _counts_type = _NothingCounts

    def hooks(self, model: LoadedModel, attention_mask, row_keys) -> Hooks:
        return []


class StaticAblation(Ablation):
    """Zero a fixed set of heads on every input."""

    reuses_prefix = True

    def __init__(self, heads: Sequence[Head], geometry):
        if not heads:
            raise LensHeadsError("static ablation needs at least one head (L.H)")
        if geometry is None:  # syntax only (parse_ablation(spec, None)): ranges wait for a model
            bad = [(L, h) for L, h in heads if L < 0 or h < 0]
            if bad:
                raise LensHeadsError(f"head {bad[0][0]}.{bad[0][1]}: layer and head indices are >= 0")
        else:
            for layer, head in heads:
                geometry.check_head(layer, head)
        self.geometry = geometry
        self.spec = StaticHeads(tuple(heads))
        self.heads: list[Head] = list(self.spec.heads)
        if geometry is None:
            return
        self._mask = torch.zeros(geometry.n_layers, geometry.n_heads, dtype=torch.bool)
        for L, h in self.heads:
            self._mask[L, h] = True

    def hooks(self, model: LoadedModel, attention_mask, row_keys) -> Hooks:
        g = self.geometry
        batch = attention_mask.shape[0]
        # The set is input-independent: count the inputs this forward scores once (``row_keys``:
        # several in a packed row, none in a cached prefix's forward), hook only layers that change.
        self.counts.start(len(row_keys), g)
        self._prepare(model, attention_mask, row_keys)
        for L in range(g.n_layers):
            self.counts.record(L, self._mask[L, :g.heads_in(L)].expand(len(row_keys), -1))

        def make(L: int) -> HookFn:
            drop = self._mask[L, :g.heads_in(L)].expand(batch, -1)
            return lambda z, hook: self._apply(L, z, drop)

        return [(hook_name("z", L), make(L)) for L in range(g.n_layers) if self._mask[L].any()]



class RandomAblation(Ablation):
    """Zero each (input, layer, head) independently with probability ``p``."""

    reuses_prefix = False

    def __init__(self, p: float, seed: int, geometry):
        if not (0.0 <= p <= 1.0) or math.isnan(p):
            raise LensHeadsError(f"random ablation probability must be in [0, 1], got {p}")
        self.p, self.seed, self.geometry = float(p), int(seed), geometry
        self.spec = RandomHeads(self.p, self.seed)

    def masks(self, row_keys: Sequence[int]) -> Bool[Tensor, "batch layer head"]:
        g = self.geometry
        draws = [torch.rand(g.n_layers, g.n_heads, generator=row_generator(self.seed, k)) for k in row_keys]
        return torch.stack(draws) < self.p

    def hooks(self, model: LoadedModel, attention_mask, row_keys) -> Hooks:
        g = self.geometry
        if len(row_keys) != attention_mask.shape[0]:
            raise LensHeadsError(f"random ablation: {len(row_keys)} row keys for a batch of {attention_mask.shape[0]}")
        masks = self.masks(row_keys)
        self.counts.start(len(row_keys), g)
        self._prepare(model, attention_mask, row_keys)

        def make(L: int) -> HookFn:
            drop = masks[:, L, :g.heads_in(L)]  # a pruned layer draws for all heads, uses its own

            def hook(z, hook):
                self.counts.record(L, drop)
                return self._apply(L, z, drop)
            return hook

        return [(hook_name("z", L), make(L)) for L in range(g.n_layers)]



class ScoreAblation(Ablation):
    """Per input: zero heads whose same-pass score crosses ``threshold`` (see module docstring)."""

    reuses_prefix = False

    def __init__(self, score_id: str, threshold: float, geometry, strict: bool = False):
        if score_id not in SCORES:
            raise LensHeadsError(f"unknown score {score_id!r}; choose one of: {', '.join(SCORES)}")
        if not math.isfinite(threshold):
            raise LensHeadsError(f"score ablation threshold must be a finite number, got {threshold}")
        self.score_id, self.threshold, self.geometry = score_id, float(threshold), geometry
        self.strict = bool(strict)
        self.inactive_when = SCORES[score_id].inactive_when
        self.spec = ScoreThreshold(score_id, self.threshold, self.strict)
        self._collector = None  # reused across forwards of the same model
        # speculation.Speculation() here shares prefixes computed under the masks inputs realised
        # (an input whose mask parts from its entry's resumes at that layer): exact, but off by
        # default -- on MMLU a subject's one entry parts early, no faster than whole forwards yet
        # (benchmarks/results/bench_speculation.md)
        self.speculation: Speculation | None = None

    def collector(self, model: LoadedModel):
        if self._collector is None or self._collector.model is not model:
            self._collector = ScoreCollector(model, [self.score_id])
        return self._collector

    def crosses(self, scores: Float[Tensor, "..."]) -> Bool[Tensor, "..."]:
        """Inclusive (strict when ``self.strict``) comparison in the inactive direction; NaN
        never crosses."""
        if self.inactive_when == "high":
            return scores > self.threshold if self.strict else scores >= self.threshold
        return scores < self.threshold if self.strict else scores <= self.threshold

    def hooks(self, model: LoadedModel, attention_mask, row_keys, *, prefix=None, record=None) -> Hooks:
        """``prefix`` / ``record``: ``ScoreCollector.hooks``' (a forward after a cached prefix,
        ``attention_mask`` marking the suffixes; a forward whose per-position quantities are kept):
        the speculative prefix sharing of ``interventions.speculation``."""
        g = self.geometry
        self.counts.start(attention_mask.shape[0], g)
        self._prepare(model, attention_mask, row_keys)
        collector = self.collector(model)
        counts = self.counts  # the block's counts when these hooks were made

        def z_transform(layer: int, z: Tensor, scores: dict[str, Tensor]) -> Tensor:
            drop = self.crosses(scores[self.score_id])
            counts.record(layer, drop)
            return self._apply(layer, z, drop)

        return collector.hooks(attention_mask, z_transform=z_transform, prefix=prefix, record=record)


class TaskScoreAblation(ScoreAblation):
    """Per question: zero the heads whose question-level score (a registry entry with
    ``level="question"``, e.g. attribution patching) on that question crosses ``threshold``, by
    magnitude, in the score's inactive direction.

    Such a score needs the question's gold answer, so it is read from a table computed before
    the forwards (``prepare_task``: the registry entry's ``table``, on the unablated model, with
    the same replacement as this ablation) rather than from the forward itself. Every choice row
    of a question gets the same heads (``RowKey(doc_id, choice)``). An oracle: it knows which
    answer is right, which an inactivity score never does (docs/methods.md §2)."""

    def __init__(self, score_id: str, threshold: float, geometry, strict: bool = False):
        if score_id not in SCORES or SCORES[score_id].level != "question":
            raise LensHeadsError(f"{score_id!r} is not a question-level score")
        if not math.isfinite(threshold):
            raise LensHeadsError(f"score ablation threshold must be a finite number, got {threshold}")
        self.score_id, self.threshold, self.geometry = score_id, float(threshold), geometry
        self.strict, self.inactive_when = bool(strict), SCORES[score_id].inactive_when
        self.spec = ScoreThreshold(score_id, self.threshold, self.strict)
        self._table: dict[int, Tensor] = {}

    needs_task = True

    def prepare_task(self, model: LoadedModel, task, records, n_shot: int, seed: int, protocol=None) -> None:
        todo = [r for r in records if r.doc_id not in self._table]
        if todo:
            self._table.update(SCORES[self.score_id].table(model, task, todo, n_shot, seed, self.replacement,
                                                           protocol))

    def hooks(self, model: LoadedModel, attention_mask, row_keys) -> Hooks:
        g = self.geometry
        docs = [RowKey.parse(k).doc_id for k in row_keys]
        missing = sorted({d for d in docs if d not in self._table})
        if missing:
            raise LensHeadsError(f"ablation {self.name}: no {self.score_id} for question(s) {missing[:3]}; a task-level "
                                 f"score needs the task: evaluate with evaluate_task, a sweep or "
                                 f"'lens-heads evaluate' (not the lm-eval route)")
        drop = self.crosses(torch.stack([self._table[d] for d in docs]).abs())  # [batch, layer, head]
        self.counts.start(len(row_keys), g)
        self._prepare(model, attention_mask, row_keys)

        def make(L: int) -> HookFn:
            d = drop[:, L, :g.heads_in(L)]

            def hook(z, hook):
                self.counts.record(L, d)
                return self._apply(L, z, d)
            return hook

        return [(hook_name("z", L), make(L)) for L in range(g.n_layers)]


class CalibratedAblation(Ablation):
    """``score:ID@P%``: the per-input score ablation whose threshold zeroes P % of the pooled
    unablated (input, layer, head) scores of ID on the questions it is evaluated on -- what
    ``lens-heads evaluate --ablate score:ID@P%`` does (docs/methods.md §3)::

        abl = parse_ablation("score:ahon_ln@30%", model.geometry)
        evaluate_task(model, "piqa", limit=100, ablation=abl)   # calibrates, then evaluates
        abl.threshold, abl.calibrated                           # 0.41..., ScoreThreshold(...)

    ``evaluate_task`` calibrates it (``prepare_task``: one unablated scoring pass over the
    questions' sequences, batched as a sweep's, under the protocol's threshold rule) and
    calibrates again when it is evaluated on other questions, another task or another model
    object (weights changed in place are not noticed: parse it again). Until then it has no
    threshold and runs nowhere else (``needs_task``: not on lm-eval's requests, not in a sweep,
    whose percentages are its curves). At 0 % it is ``none``, prefix cache and counts included."""

    needs_task = True

    @property
    def reuses_prefix(self) -> bool:  # read by the engine after prepare_task
        return self._inner is not None and self._inner.reuses_prefix

    @property
    def speculation(self) -> Speculation | None:  # read by the engine after prepare_task
        return None if self._inner is None else self._inner.speculation

    @property
    def _counts_type(self):  # counting() opens after prepare_task: the calibrated ablation's counts
        return Counts if self._inner is None else self._inner._counts_type

    def __init__(self, spec: ScoreFraction, geometry):
        if spec.score_id not in SCORES or SCORES[spec.score_id].level != "input":
            raise LensHeadsError(f"ablation {spec}: a percentage needs an input-level score, not {spec.score_id!r}")
        self.spec, self.geometry = spec, geometry
        self.score_id, self.fraction = spec.score_id, spec.fraction
        self.threshold: float | None = None  # set by prepare_task
        self.calibrated: AblationSpec | None = None  # the threshold spec it resolved to
        self._inner: Ablation | None = None
        self._calibrated_on: tuple | None = None  # (doc ids, n_shot, seed, protocol) of the calibration

    def replaced_by(self, spec: Replaced) -> "Ablation":
        self.spec = spec  # the calibrated ablation is bound with the same replacement
        return self

    def prepare_task(self, model: LoadedModel, task, records, n_shot: int, seed: int, protocol=None) -> None:
        on = (id(model), task.name, tuple(r.doc_id for r in records), n_shot, seed,
              None if protocol is None else protocol.key())
        if on == self._calibrated_on:
            return
        rule = DEFAULT_RULE if protocol is None else protocol.threshold_rule
        spec, self.threshold = calibrated_spec(model, record_inputs(model, task, records, n_shot, seed, protocol),
                                               self.score_id, self.fraction, progress=False, rule=rule)
        replaced = getattr(self.spec, "replacement", None)  # score:ID@P%|REPLACEMENT
        self.calibrated = with_replacement(parse_spec(spec), replaced) if replaced is not None else parse_spec(spec)
        self._inner = bind(self.calibrated, self.geometry)
        self._calibrated_on = on

    def hooks(self, model: LoadedModel, attention_mask, row_keys, **kwargs) -> Hooks:
        if self._inner is None:
            raise LensHeadsError(f"ablation {self.name}: not calibrated yet; evaluate it on multiple-choice "
                                 f"questions with evaluate_task (or 'lens-heads evaluate'), which sets its "
                                 f"threshold on them first, or give score:ID@THRESHOLD")
        self._inner._counts = self.counts  # the calibrated ablation counts into this block's counts
        return self._inner.hooks(model, attention_mask, row_keys, **kwargs)


# -----------------------------------------------------------------------------
# Parsing: the one grammar lives in lens_heads.interventions.specs


BINDERS: dict[type[AblationSpec], Callable[[AblationSpec, object], Ablation]] = {
    NoHeads: lambda s, g: NoAblation(),
    StaticHeads: lambda s, g: StaticAblation(s.heads, g),
    RandomHeads: lambda s, g: RandomAblation(s.p, s.seed, g),
    ScoreFraction: lambda s, g: CalibratedAblation(s, g),
    ScoreThreshold: lambda s, g: (ScoreAblation if SCORES[s.score_id].level == "input" else TaskScoreAblation)(
        s.score_id, s.threshold, g, s.strict),
}


def bind(spec: AblationSpec, geometry) -> Ablation:
    """The runtime ablation (hooks and counters) of a typed spec, for a model of ``geometry``
    (None: syntax and names only, before a model loads). A new kind of spec adds its entry to
    ``BINDERS``."""
    if isinstance(spec, Replaced):
        return bind(spec.spec, geometry).replaced_by(spec)
    binder = BINDERS.get(type(spec))
    if binder is None:
        raise LensHeadsError(f"ablation {spec}: no runtime for kind {type(spec).__name__} (add it to BINDERS)")
    return binder(spec, geometry)


def parse_ablation(spec: str, geometry) -> Ablation:
    """Build an ablation from its spec string (``ABLATION_FORMS``, parsed by
    ``interventions.parse_spec``), validated against ``geometry``; ``geometry=None`` checks the
    syntax and score names only (before a model is loaded)."""
    return bind(parse_spec(spec), geometry)
