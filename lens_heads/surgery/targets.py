"""Which heads to operate on: diagnosis classes, an explicit list, a band, or a head score.

A ``TargetSelector`` holds one rule and resolves it against a model (and its diagnosis).
Re-applied after a pass it gives the heads "still or newly" selected (see ``reselect``).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import re
from dataclasses import dataclass

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
