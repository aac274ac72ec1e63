"""Which heads to operate on: diagnosis classes, an explicit list, a band, or a head score.

A ``TargetSelector`` holds one rule and resolves it against a model (and its diagnosis).
Re-applied after a pass it gives the heads "still or newly" selected (see ``reselect``).
A ``HealthyPick`` adds healthy heads to the first pass (extended surgery, docs/methods.md §7).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import math
import re
from dataclasses import dataclass

import torch

from lens_heads.surgery.diagnose import Diagnosis, check_classes, diagnose
from lens_heads.errors import LensHeadsError
from lens_heads.interventions.specs import Head
from lens_heads.interventions.specs import parse_heads as _parse_heads
from lens_heads.scores import resolve_score_ids
from lens_heads import scores as scoring

if TYPE_CHECKING:
    from lens_heads.models.load import LoadedModel


_SELECT = re.compile(r"^\s*([A-Za-z0-9_]+)\s*(<=|>=|<|>)\s*([-+0-9.eE]+)\s*$")


def parse_heads(spec: str, geometry) -> list[Head]:
    """``"3.1,4.2"`` -> [(3, 1), (4, 2)] sorted and unique, range-checked against ``geometry``
    (None: syntax only); the grammar is ``interventions.parse_heads``."""
    return sorted(set(_parse_heads(spec, geometry)))


def parse_select(spec: str) -> tuple[str, str, float]:
    """``"ahon_ln<0.6"`` -> ("ahon_ln", "<", 0.6)."""
    m = _SELECT.match(str(spec))
    if not m:
        raise LensHeadsError(f"bad --select {spec!r}: write SCORE<THRESHOLD or SCORE>THRESHOLD, e.g. ahon_ln<0.6")
    try:
        value = float(m.group(3))
    except ValueError:
        raise LensHeadsError(f"bad threshold in --select {spec!r}") from None
    resolve_score_ids(m.group(1))  # an unknown score fails here, before any model or diagnosis
    return m.group(1), m.group(2), value


def score_values(model: LoadedModel, inputs, score_id: str):
    """Dataset-level value (mean over inputs) of one registered score: [layer, head]."""
    ids = resolve_score_ids(score_id)
    hs = scoring.score_heads(model, inputs, scores=ids, keep_per_input=True)
    return hs.per_input[ids[0]].double().mean(0)


@dataclass(frozen=True)
class TargetSelector:
    """Exactly one of classes / heads / band / select."""

    classes: tuple[str, ...] | None = None
    heads: tuple[Head, ...] | None = None
    band: bool = False
    select: str | None = None

    def __post_init__(self) -> None:
        given = sum(x is not None and x is not False for x in (self.classes, self.heads, self.select)) + self.band
        if given != 1:
            raise LensHeadsError("choose targets with exactly one of: classes, heads, band, select")
        if self.classes is not None:
            object.__setattr__(self, "classes", tuple(sorted(check_classes(self.classes))))
        if self.select is not None:
            parse_select(self.select)
        if self.heads is not None and not self.heads:
            raise LensHeadsError("empty head list")

    def describe(self) -> str:
        if self.classes is not None:
            return "classes " + ",".join(self.classes)
        if self.heads is not None:
            return "heads " + ",".join(f"{L}.{h}" for L, h in self.heads)
        if self.band:
            return "band"
        return f"score {self.select}"

    def resolve(self, model: LoadedModel, diagnosis: Diagnosis | None = None, inputs=None) -> list[Head]:
        """Heads selected on ``model`` (a LoadedModel); ``diagnosis`` or ``inputs`` as needed."""
        g = model.geometry
        if self.heads is not None:
            for L, h in self.heads:
                g.check_head(L, h)
            return sorted(set(self.heads))
        if self.select is not None:
            if inputs is None:
                raise LensHeadsError("selecting heads by score needs inputs")
            score_id, op, tau = parse_select(self.select)
            values = score_values(model, inputs, score_id)
            keep = {"<": values < tau, "<=": values <= tau, ">": values > tau, ">=": values >= tau}[op]
            return [(L, h) for L in range(g.n_layers) for h in range(g.n_heads) if bool(keep[L, h])]
        if diagnosis is None:
            if inputs is None:
                raise LensHeadsError("selecting heads by class needs a diagnosis or inputs")
            diagnosis = diagnose(model, inputs)
        if self.classes is not None:
            return diagnosis.heads(self.classes)
        return [(L, h) for L in range(g.n_layers) for h in diagnosis.band()]

    def reselect(self, model: LoadedModel, previous: list[Head], diagnosis: Diagnosis, inputs=None) -> list[Head]:
        """Targets of the next pass: the rule re-applied to the repaired model.

        classes / select: heads the rule selects now (still or newly selected).
        heads / band (fixed sets): the previous targets that are still sick (any class but healthy).
        """
        if self.classes is not None or self.select is not None:
            return self.resolve(model, diagnosis, inputs)
        sick = set(diagnosis.heads())
        return [hd for hd in previous if hd in sick]


_EXTEND = re.compile(r"^\s*(index|fraction)\s*:\s*([-+0-9.eE]+)\s*(?:@\s*([0-9]+))?\s*$")


@dataclass(frozen=True)
class HealthyPick:
    """Healthy heads re-initialised beside the targets ("extended surgery", docs/methods.md §7).

    ``index:H``         head index H in every layer where it is healthy (the paper's choice);
    ``fraction:P@SEED`` a seeded random share P (0 < P <= 1) of all healthy heads, rounded up.

    ``parse`` is its one parser and ``str`` its one printer (``parse(str(x)) == x``). Heads the
    target rule already picked are never picked twice.
    """

    kind: str  # "index" | "fraction"
    value: float
    seed: int = 0

    def __post_init__(self) -> None:
        if self.kind == "index":
            if float(self.value) != int(self.value) or self.value < 0:
                raise LensHeadsError(f"extended surgery index:{self.value}: a head index is a whole number >= 0")
            object.__setattr__(self, "value", int(self.value))
        elif self.kind == "fraction":
            if not (0.0 < float(self.value) <= 1.0):
                raise LensHeadsError(f"extended surgery fraction:{self.value}: the share must lie in (0, 1]")
            object.__setattr__(self, "value", float(self.value))
        else:
            raise LensHeadsError(f"unknown extended-surgery rule {self.kind!r}: write index:H or fraction:P@SEED")

    @classmethod
    def parse(cls, spec: str) -> "HealthyPick":
        """``"index:3"`` / ``"fraction:0.1@0"`` -> a HealthyPick (syntax and ranges checked)."""
        m = _EXTEND.match(str(spec))
        if not m:
            raise LensHeadsError(f"bad --reinit-healthy {spec!r}: write index:H (head H of every layer) or "
                                 "fraction:P@SEED (a seeded random share P of the healthy heads), e.g. fraction:0.1@0")
        try:
            value = float(m.group(2))
        except ValueError:
            raise LensHeadsError(f"bad number in --reinit-healthy {spec!r}") from None
        if m.group(1) == "index" and m.group(3) is not None:
            raise LensHeadsError(f"bad --reinit-healthy {spec!r}: index:H takes no seed")
        return cls(m.group(1), value, int(m.group(3) or 0))

    def __str__(self) -> str:
        return f"index:{self.value}" if self.kind == "index" else f"fraction:{self.value:g}@{self.seed}"

    def check(self, geometry) -> None:
        """The head index exists in ``geometry`` (a fraction fits any model)."""
        if self.kind == "index" and self.value >= geometry.n_heads:
            raise LensHeadsError(f"--reinit-healthy {self}: the model has {geometry.n_heads} heads per layer")

    def resolve(self, diagnosis: Diagnosis, exclude=()) -> list[Head]:
        """The healthy heads this rule picks on ``diagnosis``, leaving out ``exclude``, sorted."""
        taken = set(exclude)
        healthy = [hd for hd in diagnosis.heads(("healthy",)) if hd not in taken]
        if self.kind == "index":
            return sorted(hd for hd in healthy if hd[1] == self.value)
        k = math.ceil(self.value * len(healthy) - 1e-9)
        order = torch.randperm(len(healthy), generator=torch.Generator().manual_seed(self.seed)).tolist()
        return sorted(healthy[i] for i in order[:k])
