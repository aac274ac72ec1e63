"""What a sweep measures (``SweepConfig``) and the typed name of one of its points (``PointId``)."""

from __future__ import annotations

from typing import TYPE_CHECKING

import math
from dataclasses import dataclass, field

from lens_heads.data.tasks import DEFAULT_SEED
from lens_heads.errors import LensHeadsError
from lens_heads.evaluation.protocol import Protocol
from lens_heads.scores.functions import SCORES
from lens_heads.interventions.thresholds import DEFAULT_FRACTIONS, SCORING_BATCH, check_fraction
from lens_heads.batching import parse_batch_size, positive_batch_size
from lens_heads.results.keys import RunIdentity
from lens_heads.interventions.specs import AblationSpec, parse_spec
from lens_heads.forward.replacement import Replacement, Zero, parse_replacement

if TYPE_CHECKING:
    from lens_heads.models.load import LoadedModel

RANDOM = "random"  # score_fn of the random-heads points
BASELINE = "baseline"  # score_fn of the unablated point when no curve supplies it
STATIC = "static:"  # score_fn prefix of a static curve: the k least active heads by a dataset-level score


def static_name(score_id: str) -> str:
    """The curve name of static ablation by ``score_id`` (``static:ahon_ln``, ``static:random``)."""
    return STATIC + score_id


STATIC_RANDOM = static_name(RANDOM)
SEEDED = (RANDOM, STATIC_RANDOM)  # curves with one set of points per seed, averaged over seeds


@dataclass(frozen=True)
class PointId:
    """One point of a sweep's plan by name: ``ID@FRACTION`` (a score function's per-input point),
    ``random@FRACTION@SEED``, ``static:ID@FRACTION`` / ``static:random@FRACTION@SEED`` (a static
    curve's), or an extra ablation's spec (``extra``). One parser, one printer."""

    score_fn: str
    fraction: float = math.nan
    seed: int | None = None
    extra: str | None = None  # the spec of an extra ablation (then score_fn == extra)

    GRAMMAR = "ID@FRACTION, random@FRACTION@SEED, static:ID@FRACTION or static:random@FRACTION@SEED"

    @classmethod
    def parse(cls, text: str, extras=()) -> "PointId":
        text = text.strip()
        if text in extras:
            return cls(text, math.nan, None, text)
        name, *rest = text.split("@")
        try:
            fraction = float(rest[0])
            seed = int(rest[1]) if len(rest) == 2 else None
        except (IndexError, ValueError):
            raise LensHeadsError(f"first: bad point {text!r}; write {cls.GRAMMAR}") from None
        if len(rest) != (2 if name in SEEDED else 1):
            raise LensHeadsError(f"first: bad point {text!r}; write {cls.GRAMMAR}")
        return cls(name, fraction, seed)

    def __str__(self) -> str:
        if self.extra is not None:
            return self.extra
        return f"{self.score_fn}@{self.fraction:g}" + (f"@{self.seed}" if self.score_fn in SEEDED else "")


@dataclass(frozen=True)
class SweepConfig:
    """What a sweep measures, checked and normalised at construction (frozen: a changed setting
    is a new config, ``dataclasses.replace``): fractions sorted, unique and with 0 (the
    baseline), ids and seeds without repeats; the typed fields take their text form too and hold
    the parsed value: ``replacement`` a ``Replacement`` (None for zero), ``extra_ablations``
    ``AblationSpec``s, ``first`` ``PointId``s checked against the plan."""

    task: str  # a task name ("mmlu", "piqa", "winogrande") or "file:..." spec
    score_ids: list[str]
    fractions: list[float] = field(default_factory=lambda: list(DEFAULT_FRACTIONS))
    random_seeds: list[int] = field(default_factory=lambda: [0, 1, 2])
    n_shot: int | None = None  # None: the task's default
    limit: int | None = None
    seed: int = DEFAULT_SEED  # few-shot sampling seed (lm-eval's default)
    batch_size: int | str = 16  # rows per forward, or "auto" (lens_heads.batching); not in the key
    extra_ablations: tuple[AblationSpec, ...] = ()  # (or their specs' text) fixed ablations beside the curves
    n_boot: int = 1000
    boot_seed: int = 0
    tol: float = 0.01  # one accuracy point
    threshold_batch_size: int = SCORING_BATCH
    chunk_questions: int | None = 250  # questions per stored part of a point (None: one part); not in the key
    first: tuple[PointId, ...] = ()  # (or their labels) points evaluated right after the baseline; not in the key
    protocol: Protocol = field(default_factory=Protocol)  # BOS, chat template, threshold rule
    thresholds_file: str | None = None  # the authors' thresholds.json instead of a scoring pass
    thresholds_model: str | None = None  # its model key (hub id), with thresholds_file
    replacement: Replacement | None = None  # what ablated heads become (or its text: "zero", "mean:c4", ...); None: zero
    static_ids: list[str] = field(default_factory=list)  # static curves: score ids or "random" (seeds: random_seeds)

    @property
    def static_curves(self) -> list[str]:
        """The names of the static curves (``static:ID``), in ``static_ids`` order."""
        return [static_name(s) for s in self.static_ids]

    def validate(self) -> "SweepConfig":
        """The config, checked (at construction already: kept for callers that check explicitly)."""
        return self

    def _set(self, name: str, value) -> None:
        object.__setattr__(self, name, value)  # normalising while constructing a frozen config

    def __post_init__(self) -> None:
        self._set("fractions", sorted({0.0, *(check_fraction(p) for p in self.fractions)}))
        self._set("random_seeds", list(dict.fromkeys(int(s) for s in self.random_seeds)))
        self._set("score_ids", list(dict.fromkeys(self.score_ids)))
        self._set("static_ids", list(dict.fromkeys(self.static_ids)))
        self._set("extra_ablations", tuple(dict.fromkeys(
            e if isinstance(e, AblationSpec) else parse_spec(e) for e in self.extra_ablations)))
        for e in self.extra_ablations:  # each part of a sweep would calibrate on its own questions
            if e.needs_calibration:
                inner = getattr(e, "spec", e)
                raise LensHeadsError(f"extra ablation {e}: a sweep's percentages are its curves: give --scores "
                                     f"{inner.score_id} --fractions {inner.fraction:g}")
        self._check_static_ids()
        if self.limit is not None and self.limit < 1:
            raise LensHeadsError(f"limit must be >= 1, got {self.limit}")
        if self.n_shot is not None and self.n_shot < 0:
            raise LensHeadsError(f"n_shot must be >= 0, got {self.n_shot}")
        if any(s < 0 for s in self.random_seeds):
            raise LensHeadsError("random seeds must be >= 0")

        self._set("batch_size", parse_batch_size(self.batch_size))
        self._set("threshold_batch_size", positive_batch_size(self.threshold_batch_size))  # shards cut its batches
        if self.chunk_questions is not None and self.chunk_questions < 1:
            raise LensHeadsError(f"chunk_questions must be >= 1, got {self.chunk_questions}")
        if not isinstance(self.protocol, Protocol):
            raise LensHeadsError(f"protocol must be a lens_heads.evaluation.protocol.Protocol, got {type(self.protocol).__name__}")
        if (self.thresholds_file is None) != (self.thresholds_model is None):
            raise LensHeadsError("thresholds_file and thresholds_model go together (the file's model key)")
        if self.replacement is not None:
            rep = self.replacement if isinstance(self.replacement, Replacement) else parse_replacement(self.replacement)
            for sid in (*self.score_ids, *self.static_ids):
                takes = SCORES[sid].replacements if sid in SCORES else None
                if takes is not None and rep.kind not in takes:
                    raise LensHeadsError(f"{sid} takes {' or '.join(takes)} replacements, not {rep} "
                                         f"({SCORES[sid].description})")
            self._set("replacement", None if isinstance(rep, Zero) else rep)
        extras = self.extra_labels
        self._set("first", tuple(dict.fromkeys(
            self._check_first(f if isinstance(f, PointId) else PointId.parse(f, extras)) for f in self.first)))

    @property
    def extra_labels(self) -> list[str]:
        """The extra ablations' specs as text (their point labels and plan specs)."""
        return [str(e) for e in self.extra_ablations]

    @property
    def replacement_text(self) -> str | None:
        """``replacement`` as the store keys write it (None: zero)."""
        return None if self.replacement is None else str(self.replacement)

    def _check_static_ids(self) -> None:
        bad = [s for s in self.static_ids if s not in SCORES and s != RANDOM]
        if bad:
            raise LensHeadsError(f"static curves: unknown score {bad[0]!r}; give score ids ({', '.join(SCORES)}) "
                                 f"or {RANDOM!r}")
        if RANDOM in self.static_ids and not self.random_seeds:
            raise LensHeadsError("static random heads need random seeds (random_seeds / --random-seeds N > 0)")

    def _check_first(self, pid: PointId) -> PointId:
        """``pid`` checked against this sweep's plan (before any threshold is computed)."""
        if pid.extra is not None:
            return pid
        if pid.fraction == 0 or pid.fraction not in self.fractions:
            raise LensHeadsError(f"first: {str(pid)!r}: the sweep's fractions > 0 are "
                                 f"{', '.join(f'{p:g}' for p in self.fractions if p > 0)}")
        if pid.score_fn in SEEDED and pid.seed not in self.random_seeds:
            raise LensHeadsError(f"first: {str(pid)!r}: the sweep's random seeds are {self.random_seeds}")
        if pid.score_fn in (STATIC_RANDOM, *self.static_curves):
            if pid.score_fn not in self.static_curves:
                raise LensHeadsError(f"first: {str(pid)!r}: the sweep has no static random curve")
        elif pid.score_fn != RANDOM and pid.score_fn not in self.score_ids:
            raise LensHeadsError(f"first: {str(pid)!r}: {pid.score_fn!r} is not among the sweep's score functions")
        return pid

    def identity(self, model: LoadedModel, task):
        """The ``keys.RunIdentity`` of this sweep on a loaded model."""

        return RunIdentity.of(model, task, self.task, self.n_shot, self.limit, self.seed, self.protocol)

    def identity_for(self, model_digest: str, dtype: str, task):
        """The same without a loaded model: from the weights' digest and the dtype."""

        return RunIdentity.build(model_digest, dtype, task, self.task, self.n_shot, self.limit, self.seed,
                                 self.protocol)
