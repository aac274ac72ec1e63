"""What an ablation zeroes, as typed values: one frozen dataclass per kind, one parser, one printer.

    spec = parse_spec("score:ahon_ln@0.41:strict")   # ScoreThreshold("ahon_ln", 0.41, strict=True)
    str(spec) == "score:ahon_ln@0.41:strict"         # the printer; parse_spec(str(s)) == s
    ablation = bind(spec, model.geometry)            # the runtime object (lens_heads.interventions.ablation.bind)

Kinds (``SPEC_KINDS``, keyed by the word before the first ``:``; docs/methods.md §2):

    none                      NoHeads           nothing is zeroed
    static:L.H,L.H            StaticHeads       a fixed head set on every input
    score:ID@TAU[:strict]     ScoreThreshold    per input, by a score's same-pass value
    score:ID@P%               ScoreFraction     the threshold that takes P % (set on inputs first)
    random:P@SEED             RandomHeads       each (input, layer, head) with probability P

The printed form is the store's key for a point (``str(spec)`` equals the spec strings stored
before these types existed: floats print with ``repr``), so it must never change for a kind
that exists. ``Head`` and ``parse_heads`` are the one head type and head-list parser.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import ClassVar

from lens_heads.errors import LensHeadsError
from lens_heads.models.heads import Head, format_heads, parse_heads  # noqa: F401  (the head type and parser live there)
from lens_heads.registry import Registry
from lens_heads.forward.replacement import Zero, parse_replacement
from lens_heads.scores.functions import SCORES

ABLATION_FORMS = "none | static:L.H,L.H | score:ID@THRESHOLD[:strict] | score:ID@P% | random:P@SEED"
STRICT_SUFFIX = ":strict"


def _number(text: str, what: str, spec: str, kind=float):
    try:
        value = kind(text.strip())
    except ValueError:
        article = "an integer" if kind is int else "a number"
        raise LensHeadsError(f"bad ablation {spec!r}: {what} {text.strip()!r} is not {article}; "
                             f"use one of: {ABLATION_FORMS}") from None
    if kind is float and math.isnan(value):
        raise LensHeadsError(f"bad ablation {spec!r}: {what} is nan")
    return value


def _score_id(text: str) -> str:
    """A score a per-input ablation can threshold: any registered one (input- or question-level)."""
    sid = text.strip()
    if sid not in SCORES:
        raise LensHeadsError(f"unknown score {sid!r}; choose one of: {', '.join(SCORES)}")
    return sid


@dataclass(frozen=True)
class AblationSpec:
    """What to zero. Subclasses set ``kind`` and implement ``body`` / ``from_body``; the runtime
    side (hooks and counters) is ``lens_heads.interventions.ablation.bind(spec, geometry)``."""

    kind: ClassVar[str] = ""
    needs_calibration: ClassVar[bool] = False  # a target fraction: a threshold must be set on inputs first

    def body(self) -> str:
        raise NotImplementedError

    @classmethod
    def from_body(cls, body: str, spec: str) -> "AblationSpec":
        raise NotImplementedError

    def __str__(self) -> str:
        body = self.body()
        return self.kind if not body else f"{self.kind}:{body}"


SPEC_KINDS: Registry[type[AblationSpec]] = Registry("ablation kind")


def register_kind(cls: type[AblationSpec]) -> type[AblationSpec]:
    SPEC_KINDS.register(cls.kind, cls)
    return cls


@register_kind
@dataclass(frozen=True)
class NoHeads(AblationSpec):
    kind: ClassVar[str] = "none"

    def body(self) -> str:
        return ""

    @classmethod
    def from_body(cls, body: str, spec: str) -> "NoHeads":
        if body:
            raise LensHeadsError(f"bad ablation {spec!r}: 'none' takes nothing after it")
        return cls()


@register_kind
@dataclass(frozen=True)
class StaticHeads(AblationSpec):
    heads: tuple[Head, ...]

    kind: ClassVar[str] = "static"

    def __post_init__(self):
        if not self.heads:
            raise LensHeadsError("static ablation needs at least one head (L.H)")
        object.__setattr__(self, "heads", tuple(sorted(set((int(L), int(h)) for L, h in self.heads))))
        # ranges are checked when bound to a model's geometry

    def body(self) -> str:
        return format_heads(self.heads)

    @classmethod
    def from_body(cls, body: str, spec: str) -> "StaticHeads":
        return cls(tuple(parse_heads(body)))


@dataclass(frozen=True)
class _ScoreSpec(AblationSpec):
    kind: ClassVar[str] = "score"

    @classmethod
    def from_body(cls, body: str, spec: str) -> AblationSpec:
        left, at, right = body.partition("@")
        if not at or not left.strip() or not right.strip():
            raise LensHeadsError(f"bad ablation {spec!r}: write score:ID@THRESHOLD or score:ID@P%, "
                                 f"e.g. score:ahon_ln@0.41")
        sid, right = _score_id(left), right.strip()
        if right.endswith("%"):
            pct = _number(right[:-1], "percentage", spec)
            if not 0.0 <= pct <= 100.0:
                raise LensHeadsError(f"bad ablation {spec!r}: the percentage must be in [0, 100]")
            return ScoreFraction(sid, pct / 100.0)
        strict = right.endswith(STRICT_SUFFIX)
        if strict:
            right = right[:-len(STRICT_SUFFIX)]
        return ScoreThreshold(sid, _number(right, "threshold", spec), strict)


@dataclass(frozen=True)
class ScoreThreshold(_ScoreSpec):
    score_id: str
    threshold: float
    strict: bool = False  # the authors' rule: zero only strictly beyond the threshold

    def __post_init__(self):
        if not math.isfinite(float(self.threshold)):
            raise LensHeadsError(f"score ablation threshold must be a finite number, got {self.threshold}")
        object.__setattr__(self, "threshold", float(self.threshold))

    def body(self) -> str:
        return f"{self.score_id}@{self.threshold!r}" + (STRICT_SUFFIX if self.strict else "")


@dataclass(frozen=True)
class ScoreFraction(_ScoreSpec):
    """A target fraction: ``thresholds.calibrated_spec`` turns it into a ScoreThreshold."""

    score_id: str
    fraction: float

    needs_calibration: ClassVar[bool] = True

    def body(self) -> str:
        return f"{self.score_id}@{100 * self.fraction:g}%"


SPEC_KINDS.register("score", _ScoreSpec)  # one kind word, two spec types (threshold, fraction)


@register_kind
@dataclass(frozen=True)
class RandomHeads(AblationSpec):
    p: float
    seed: int = 0

    kind: ClassVar[str] = "random"

    def __post_init__(self):
        p = float(self.p)
        if math.isnan(p) or not 0.0 <= p <= 1.0:
            raise LensHeadsError(f"random ablation probability must be in [0, 1], got {self.p}")
        object.__setattr__(self, "p", p)
        object.__setattr__(self, "seed", int(self.seed))

    def body(self) -> str:
        return f"{self.p!r}@{self.seed}"

    @classmethod
    def from_body(cls, body: str, spec: str) -> "RandomHeads":
        left, at, right = body.partition("@")
        return cls(_number(left, "probability", spec), _number(right, "seed", spec, int) if at else 0)


@dataclass(frozen=True)
class Replaced(AblationSpec):
    """An ablation whose heads are replaced, not zeroed: ``SPEC|REPLACEMENT``
    (``lens_heads.forward.replacement``: ``mean:CORPUS``, ``resample:CORPUS@SEED``)."""

    spec: AblationSpec
    replacement: object  # a lens_heads.forward.replacement.Replacement

    def __str__(self) -> str:
        return f"{self.spec}|{self.replacement}"

    @property
    def needs_calibration(self) -> bool:  # type: ignore[override]
        return self.spec.needs_calibration


def with_replacement(spec: AblationSpec, replacement) -> AblationSpec:
    """``spec`` with its heads replaced by ``replacement`` (zero, or nothing to replace: ``spec``)."""
    replacement = parse_replacement(replacement) if isinstance(replacement, str) else replacement
    if isinstance(replacement, Zero) or isinstance(spec, NoHeads):
        return spec
    if isinstance(spec, Replaced):
        spec = spec.spec
    return Replaced(spec, replacement)


def parse_spec(text: str) -> AblationSpec:
    """The one parser of ablation specs (``ABLATION_FORMS``, optionally ``|REPLACEMENT``); ``str()``
    of the result is its canonical form (heads sorted, floats in repr)."""
    if not isinstance(text, str) or not text.strip():
        raise LensHeadsError(f"empty ablation spec; use one of: {ABLATION_FORMS}")
    if "|" in text:
        left, _, right = text.partition("|")
        return with_replacement(parse_spec(left), right)
    s = text.strip()
    kind, sep, body = s.partition(":")
    cls = SPEC_KINDS.get(kind.strip())
    if cls is None:
        raise LensHeadsError(f"unknown ablation kind {kind.strip()!r} in {text!r}; use one of: {ABLATION_FORMS}")
    if cls is not NoHeads and (not sep or not body.strip()):
        raise LensHeadsError(f"bad ablation {text!r}; use one of: {ABLATION_FORMS}")
    return cls.from_body(body.strip(), text)
