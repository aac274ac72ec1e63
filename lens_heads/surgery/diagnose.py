"""Collapse diagnosis of attention heads (docs/methods.md §6).

Per head, from attention patterns on a fixed prompt or a corpus:

- ``bos_mass``   mean over real query rows t of A[t, f], f = the input's first real token
                 (position 0 with right padding); t = f is included (its value is 1).
- ``entropy``    mean over real query rows of -sum_j A[t, j] ln A[t, j] (0 ln 0 = 0, which is
                 what clamping A at 1e-10 inside the log gives); nats.
  These two are the head scores ``awft`` and ``aeqd``: their reductions are reused from
  ``lens_heads.scores``, not written twice.
- ``local_mass`` mean over real query rows t >= f + 3 of A[t, t-2] + A[t, t-1] + A[t, t]
                 (the mass on the last 3 positions <= t). Rows t < f + 3 are left out because
                 their 3-position window covers every key, so they would score 1 whatever the
                 head does; the window of every counted row excludes the first token, so local
                 mass never double-counts BOS mass. NaN when no input has 4 or more tokens.

Each statistic is averaged per input first, then over inputs (a dataset-level value is the
mean over inputs, as for the head scores). Classes, tested in this order::

    dead         bos_mass   > 0.95
    bos_sink     bos_mass   > 0.50
    low_entropy  entropy    < 0.5
    local        local_mass > 0.6
    healthy      otherwise

The "band" is the set of head indices that are sick (any class but healthy) in more than 30 %
of layers. For ALiBi models the slope of each head is reported beside its class.

Streaming: the statistics are computed by ``lens_heads.scores.ScoreCollector`` (the one place
that hooks attention patterns and reduces them over real positions): BOS mass and entropy as
its scores ``awft`` / ``aeqd``, local mass as the extra statistic ``LOCAL_MASS``. Its hook on
``hook_pattern`` reduces each layer's pattern to [batch, head] inside the hook, so no pattern
is kept.
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Iterable, Sequence

import torch
from jaxtyping import Float, Int
from torch import Tensor

from lens_heads.batching import Batcher
from lens_heads.data import pad_batch
from lens_heads.files.atomic import atomic_write_csv
from lens_heads.errors import LensHeadsError
from lens_heads.surgery.head_classes import ABSENT, CLASSES, SICK, canonical  # the one class list
from lens_heads.forward.engine import forward
from lens_heads.interventions.specs import Head
from lens_heads.scores import SCORES, Acts, BatchGeometry, ScoreCollector, ScoreFn

if TYPE_CHECKING:
    from lens_heads.models.load import LoadedModel

LOCAL_WINDOW = 3


@dataclass(frozen=True)
class DiagnosisThresholds:
    dead: float = 0.95  # bos_mass above -> dead
    bos_sink: float = 0.50  # bos_mass above -> bos_sink
    low_entropy: float = 0.5  # entropy below (nats) -> low_entropy
    local: float = 0.6  # local_mass above -> local
    band_fraction: float = 0.30  # a head index is in the band when sick in more than this share of layers

    def __post_init__(self):
        """Each threshold inside the range where its class can hold a head at all."""
        for name, value in (("dead", self.dead), ("bos_sink", self.bos_sink), ("local", self.local),
                            ("band_fraction", self.band_fraction)):
            if not (isinstance(value, (int, float)) and 0.0 <= value < 1.0):
                raise LensHeadsError(f"diagnosis threshold {name} = {value!r} must lie in [0, 1): a mass "
                                     f"(or share of layers) above it is never reached otherwise")
        if not (isinstance(self.low_entropy, (int, float)) and 0.0 < self.low_entropy < float("inf")):
            raise LensHeadsError(f"diagnosis threshold low_entropy = {self.low_entropy!r} must be a positive "
                                 f"number of nats (no entropy is below 0)")
        if self.bos_sink > self.dead:
            raise LensHeadsError(f"diagnosis thresholds: bos_sink ({self.bos_sink}) above dead ({self.dead}) "
                                 f"leaves no head BOS-sink (DEAD is tested first)")


# -----------------------------------------------------------------------------
# Reductions of one attention pattern


def _local_mass(acts: Acts) -> Float[Tensor, "batch head"]:
    """Mean over real rows t >= first + 3 of A[t, t-2] + A[t, t-1] + A[t, t] (float32; NaN when
    no row counts). The first real token of each row is where its mask first equals 1."""
    local = acts.local_mass()  # [b, h, T]: A[t,t] + A[t,t-1] + A[t,t-2]
    T = local.shape[-1]
    pos = torch.arange(T, device=local.device)
    rows = acts.batch.maskf * (pos[None, :] >= acts.batch.first[:, None] + LOCAL_WINDOW).float()  # [b, T]
    n_local = rows.sum(-1)[:, None]
    return (local * rows[:, None, :]).sum(-1) / n_local  # 0/0 = NaN when no row counts


# Not a registry score (it would join every ``score_heads(..., "all")``): the collector computes
# it as an ``extra`` statistic beside awft / aeqd.
LOCAL_MASS = ScoreFn("local_mass", ("rows",), "high",
                     "mass on the last 3 positions <= t, over rows t >= first + 3 (collapse diagnosis)",
                     compute=_local_mass)
# (bos_mass, entropy, local_mass): BOS mass and entropy are the head scores awft / aeqd (one
# definition each, in lens_heads.scores)
PATTERN_STATS: tuple[ScoreFn, ...] = (SCORES["awft"], SCORES["aeqd"], LOCAL_MASS)


def pattern_stats(
    pattern: Float[Tensor, "batch head q k"], mask: Int[Tensor, "batch pos"]
) -> tuple[Float[Tensor, "batch head"], Float[Tensor, "batch head"], Float[Tensor, "batch head"]]:
    """Per-input (bos_mass, entropy, local_mass) of every head, padding excluded.

    Works for left or right padding: the first real token of each row is where its mask
    first equals 1. local_mass is NaN for an input with fewer than 4 real tokens. The same
    ``PATTERN_STATS`` functions ``diagnose`` has the collector compute, on one given pattern.
    """
    acts = Acts("pattern", pattern, BatchGeometry.from_mask(mask, pattern.device), 0, None, 1)
    bos_mass, entropy, local_mass = (fn.compute(acts) for fn in PATTERN_STATS)
    return bos_mass, entropy, local_mass


def classify(
    bos_mass: Tensor, entropy: Tensor, local_mass: Tensor,
    thresholds: DiagnosisThresholds = DiagnosisThresholds(),
) -> list:
    """Class names with the shape of the inputs (nested lists), tested in the documented order."""
    t = thresholds
    out = []
    for bos, ent, loc in zip(bos_mass.reshape(-1).tolist(), entropy.reshape(-1).tolist(),
                             local_mass.reshape(-1).tolist()):
        if math.isnan(bos):  # no head there (a pruned layer)
            out.append(ABSENT)
        elif bos > t.dead:
            out.append("dead")
        elif bos > t.bos_sink:
            out.append("bos_sink")
        elif ent < t.low_entropy:
            out.append("low_entropy")
        elif not math.isnan(loc) and loc > t.local:
            out.append("local")
        else:
            out.append("healthy")
    shape = tuple(bos_mass.shape)
    for size in reversed(shape[1:]):
        out = [out[i:i + size] for i in range(0, len(out), size)]
    return out


# -----------------------------------------------------------------------------
# Result


@dataclass
class Diagnosis:
    bos_mass: Float[Tensor, "layer head"]
    entropy: Float[Tensor, "layer head"]
    local_mass: Float[Tensor, "layer head"]
    alibi_slopes: Float[Tensor, "head"] | None = None
    thresholds: DiagnosisThresholds = field(default_factory=DiagnosisThresholds)
    n_inputs: int = 0

    def __post_init__(self) -> None:
        self.classes: list[list[str]] = classify(self.bos_mass, self.entropy, self.local_mass,
                                                 self.thresholds)

    @property
    def n_layers(self) -> int:
        return self.bos_mass.shape[0]

    @property
    def n_heads(self) -> int:
        return self.bos_mass.shape[1]

    def counts(self) -> dict[str, int]:
        flat = [c for row in self.classes for c in row]
        return {c: flat.count(c) for c in CLASSES}

    @property
    def healthy_count(self) -> int:
        return self.counts()["healthy"]

    def heads(self, classes: Iterable[str] = SICK) -> list[Head]:
        """(layer, head) of every head in one of ``classes``, in layer-major order."""
        wanted = check_classes(classes)
        return [(L, h) for L in range(self.n_layers) for h in range(self.n_heads)
                if self.classes[L][h] in wanted]

    def band(self) -> list[int]:
        """Head indices sick (any class but healthy) in more than band_fraction of layers."""
        return [h for h in range(self.n_heads)
                if sum(self.classes[L][h] in SICK for L in range(self.n_layers))
                > self.thresholds.band_fraction * self.n_layers]

    def summary(self) -> str:
        counts = ", ".join(f"{c} {n}" for c, n in self.counts().items())
        band = self.band()
        n = sum(self.counts().values())
        shape = f"{self.n_layers} x {self.n_heads}" if n == self.n_layers * self.n_heads else \
            f"{self.n_layers} layers, pruned"
        return (f"{n} heads ({shape}) on "
                f"{self.n_inputs} inputs: {counts}; band: {format_band(band)}")

    def to_frame(self):
        import pandas as pd

        rows = []
        for L in range(self.n_layers):
            for h in range(self.n_heads):
                if self.classes[L][h] == ABSENT:  # a pruned layer's missing heads get no row
                    continue
                rows.append(dict(
                    layer=L, head=h, bos_mass=float(self.bos_mass[L, h]), entropy=float(self.entropy[L, h]),
                    local_mass=float(self.local_mass[L, h]), **{"class": self.classes[L][h]},
                    alibi_slope=float(self.alibi_slopes[h]) if self.alibi_slopes is not None else float("nan"),
                ))
        return pd.DataFrame(rows, columns=["layer", "head", "bos_mass", "entropy", "local_mass", "class",
                                           "alibi_slope"])

    def save(self, path: str | os.PathLike) -> Path:
        """Write the CSV atomically (temp file in the same folder, then os.replace)."""
        return atomic_write_csv(self.to_frame(), path, make_parents=True, float_format="%.6g")

    @classmethod
    def load(cls, path: str | os.PathLike, thresholds: DiagnosisThresholds | None = None) -> "Diagnosis":
        """Read a CSV written by ``save``. With ``thresholds`` the classes are recomputed with
        them; without, the file's own ``class`` column is kept (the diagnosis as it was saved,
        whatever thresholds made it), else they are recomputed with the defaults."""
        import pandas as pd

        try:
            df = pd.read_csv(path)
        except FileNotFoundError:
            raise LensHeadsError(f"diagnosis file not found: {path}") from None
        except (pd.errors.EmptyDataError, pd.errors.ParserError, UnicodeDecodeError, OSError) as exc:
            raise LensHeadsError(f"cannot read diagnosis file {path}: {str(exc).splitlines()[0]}") from None
        need = {"layer", "head", "bos_mass", "entropy"}  # local_mass: NaN when the file has none
        if not need <= set(df.columns) or df.empty:
            raise LensHeadsError(f"{path} is not a diagnosis table (needs rows with columns {sorted(need)})")
        try:
            df[["layer", "head"]] = df[["layer", "head"]].astype(int)
        except (ValueError, TypeError):
            raise LensHeadsError(f"{path}: columns 'layer' and 'head' must hold integers") from None
        L, H = int(df["layer"].max()) + 1, int(df["head"].max()) + 1
        layers, heads = torch.tensor(df["layer"].tolist()), torch.tensor(df["head"].tolist())
        grids = {}
        for col in ("bos_mass", "entropy", "local_mass"):
            grid = torch.full((L, H), float("nan"))
            if col in df.columns:
                values = pd.to_numeric(df[col], errors="coerce")
                if values.isna().sum() > df[col].isna().sum():
                    raise LensHeadsError(f"{path}: column {col!r} holds values that are not numbers")
                grid[layers, heads] = torch.tensor(values.tolist(), dtype=torch.float)
            grids[col] = grid
        slopes = None
        if "alibi_slope" in df.columns and df["alibi_slope"].notna().any():
            slopes = torch.full((H,), float("nan"))
            slopes[heads] = torch.tensor(df["alibi_slope"].tolist(), dtype=torch.float)
        diag = cls(grids["bos_mass"], grids["entropy"], grids["local_mass"], slopes,
                   thresholds or DiagnosisThresholds())
        if thresholds is None and "class" in df.columns:
            saved = [list(row) for row in diag.classes]
            for layer, head, name in zip(df["layer"], df["head"], df["class"].astype(str)):
                saved[int(layer)][int(head)] = canonical(name)
            unknown = {c for row in saved for c in row} - {*CLASSES, ABSENT}
            if unknown:
                raise LensHeadsError(f"{path}: unknown head class(es) {', '.join(sorted(unknown))}; "
                                     f"known: {', '.join(CLASSES)}")
            diag.classes = saved
        return diag


def check_classes(classes: Iterable[str] | str) -> set[str]:
    if isinstance(classes, str):
        classes = [c.strip() for c in classes.split(",") if c.strip()]
    classes = set(c.replace("-", "_").lower() for c in classes)
    unknown = classes - set(CLASSES)
    if unknown:
        raise LensHeadsError(f"unknown head class(es) {', '.join(sorted(unknown))}; "
                             f"choose from: {', '.join(CLASSES)}")
    if not classes:
        raise LensHeadsError(f"no head class given; choose from: {', '.join(CLASSES)}")
    return classes


def format_band(band: Sequence[int]) -> str:
    return "none" if not band else f"{len(band)} heads: " + ",".join(f"H{h}" for h in band)


# -----------------------------------------------------------------------------
# Running it


def as_token_inputs(model: LoadedModel, inputs) -> list[Tensor]:
    """A string, a list of strings or a list of 1-D token tensors -> list of token tensors."""
    if isinstance(inputs, (str, Tensor)):
        inputs = [inputs]
    inputs = list(inputs)
    if not inputs:
        raise LensHeadsError("no inputs to diagnose")
    out = []
    for x in inputs:
        t = model.to_tokens(x)[0] if isinstance(x, str) else torch.as_tensor(x, dtype=torch.long).reshape(-1)
        if len(t) == 0:
            raise LensHeadsError("an input has no tokens")
        out.append(t)
    return out


def _batch_sum(x: Float[Tensor, "batch layer head"]) -> Float[Tensor, "layer head"]:
    """Sum over the batch in float32, one layer's [batch, head] slice at a time, as float64 on
    the CPU. Per layer is the reduction order diagnoses have always used (one sum over the
    whole [batch, layer, head] tensor rounds differently), so stored values stay bit-identical."""
    return torch.stack([x[:, L].contiguous().sum(0) for L in range(x.shape[1])]).double().cpu()


def diagnose(
    model: LoadedModel, inputs, thresholds: DiagnosisThresholds = DiagnosisThresholds(), batch_size: int | str = 8
) -> Diagnosis:
    """Diagnose every head of ``model`` (a LoadedModel) on ``inputs`` (strings or token tensors);
    ``batch_size`` a number or ``"auto"`` (``lens_heads.batching``)."""
    g = model.geometry
    seqs = as_token_inputs(model, inputs)
    sums = torch.zeros(3, g.n_layers, g.n_heads, dtype=torch.float64)
    local_n = torch.zeros(g.n_layers, g.n_heads, dtype=torch.float64)
    pad = model.tokenizer.pad_token_id or 0
    bos_id, ent_id, loc_id = (fn.id for fn in PATTERN_STATS)
    collector = ScoreCollector(model, [bos_id, ent_id], extra=[LOCAL_MASS])
    order = sorted(range(len(seqs)), key=lambda i: -len(seqs[i]))  # longest first, stable (iter_batches')

    def run(idx) -> None:
        ids, mask = pad_batch([seqs[i] for i in idx], pad, "right")
        forward(model, ids, mask, collector.hooks(mask), logits=False)
        stats = collector.batch_scores()  # id -> [batch, layer, head]
        loc = stats[loc_id]
        sums[0] += _batch_sum(stats[bos_id])
        sums[1] += _batch_sum(stats[ent_id])
        sums[2] += _batch_sum(loc.nan_to_num(0.0))
        local_n.add_((~loc.isnan()).sum(0).double().cpu())

    Batcher.for_inputs(batch_size, model, max((len(x) for x in seqs), default=1)).run(
        order, run, [len(seqs[i]) for i in order])
    n = len(seqs)
    slopes = g.alibi_slopes()
    return Diagnosis((sums[0] / n).float(), (sums[1] / n).float(), (sums[2] / local_n).float(),
                     slopes.float() if slopes is not None else None, thresholds, n)
