"""The typed records a sweep stores (``store.ResultStore``), each with its JSON form.

The JSON layouts are the stored format: field names and order are as the committed stores
under ``analyses/results`` hold them, so ``from_json`` reads every one of them and ``to_json``
writes them back unchanged.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field
from typing import Any, Sequence

from lens_heads.evaluation.timing import compute_seconds
from lens_heads.evaluation.evaluate import QuestionResult, accuracy_metrics


@dataclass
class PointRecord:
    """One evaluated ablation (a whole sweep point, or one part of its questions)."""

    task: str
    n_shot: int
    metrics: dict[str, float]  # acc, and acc_norm where the task defines it
    zeroed_fraction: float | None  # of (input, layer, head) units zeroed
    questions: list[QuestionResult]
    eval_config: dict[str, Any]  # evaluate_task's settings and counts (zeroed_units, seconds, ...)
    point_hash: str | None = None  # the point's store key digest, once stored as a point

    @classmethod
    def from_result(cls, result) -> "PointRecord":
        """From an ``evaluate.TaskResult``."""
        return cls(result.task, result.n_shot, dict(result.metrics), result.zeroed_fraction,
                   list(result.questions), dict(result.config))

    def to_json(self) -> dict[str, Any]:
        out = {"task": self.task, "n_shot": self.n_shot, "metrics": self.metrics,
               "zeroed_fraction": self.zeroed_fraction, "questions": [asdict(q) for q in self.questions],
               "eval_config": self.eval_config}
        if self.point_hash is not None:
            out["point_hash"] = self.point_hash
        return out

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> "PointRecord":
        return cls(data["task"], data["n_shot"], data["metrics"], data["zeroed_fraction"],
                   [QuestionResult(**q) for q in data["questions"]], data["eval_config"], data.get("point_hash"))

    @property
    def accuracy(self) -> float:
        return float(self.metrics["acc"])

    def correct_by_doc(self) -> dict[int, bool]:
        return {q.doc_id: q.correct for q in self.questions}

    @classmethod
    def merge(cls, parts: Sequence["PointRecord"], limit: int | None) -> "PointRecord":
        """The parts of one point (disjoint doc ids, in order) as one record: accuracy is the
        mean over all questions, the zeroed fraction adds up the parts' counts."""
        questions = [q for p in parts for q in p.questions]
        metrics = accuracy_metrics([asdict(q) for q in questions], "acc_norm" in parts[0].metrics)
        counts = [p.eval_config.get("zeroed_units") for p in parts]
        if all(c is not None for c in counts):
            zeroed, units = (sum(c[i] for c in counts) for i in (0, 1))
            zf = zeroed / units if units else math.nan
        else:
            zf, zeroed = parts[0].zeroed_fraction, None
        config = dict(parts[0].eval_config)
        for k in ("n_questions", "n_requests", "seconds"):
            config[k] = sum(p.eval_config[k] for p in parts)
        # what the parts cost, each on its own clock (docs/methods.md §13): merging changes no cost
        config["compute_seconds"] = sum(round(1000 * compute_seconds(p.eval_config)) for p in parts) / 1000  # ms: exact
        if all(p.eval_config.get("cpu_seconds") is not None for p in parts):
            config["cpu_seconds"] = round(sum(p.eval_config["cpu_seconds"] for p in parts), 3)
        else:
            config.pop("cpu_seconds", None)
        devices = {p.eval_config.get("device") for p in parts}
        if len(devices) > 1:
            config["device"] = "mixed"
        config.update(limit=limit, doc_ids=None, n_parts=len(parts),
                      zeroed_units=None if zeroed is None else [zeroed, units])
        return cls(parts[0].task, parts[0].n_shot, metrics, zf, questions, config, parts[0].point_hash)


Thresholds = dict[str, dict[float, "float | None"]]  # score id -> target fraction -> tau (None: nothing zeroed)


@dataclass
class ThresholdsRecord:
    """Per-function thresholds at each target fraction, from one scoring pass over n_inputs."""

    thresholds: Thresholds
    n_inputs: int | None = None
    extra: dict[str, Any] = field(default_factory=dict)  # any other stored field, kept as it was

    def to_json(self) -> dict[str, Any]:  # fractions as their repr: the stored form
        return {"thresholds": {sid: {repr(float(p)): t for p, t in d.items()} for sid, d in self.thresholds.items()},
                "n_inputs": self.n_inputs, **self.extra}

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> "ThresholdsRecord":
        extra = {k: v for k, v in data.items() if k not in ("thresholds", "n_inputs", "config")}
        return cls({sid: {float(p): t for p, t in d.items()} for sid, d in data["thresholds"].items()},
                   data.get("n_inputs"), extra)

    def only(self, score_ids: Sequence[str], fractions: Sequence[float]) -> "ThresholdsRecord":
        keep = {float(p) for p in fractions}
        return ThresholdsRecord({sid: {p: t for p, t in self.thresholds[sid].items() if p in keep}
                                 for sid in score_ids}, self.n_inputs, dict(self.extra))


@dataclass
class StaticScoresRecord:
    """Dataset-level mean score per head (flattened layer-major), the order a static ablation uses."""

    mean: list[float]
    n_inputs: int

    def to_json(self) -> dict[str, Any]:
        return {"mean": self.mean, "n_inputs": self.n_inputs}

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> "StaticScoresRecord":
        return cls(list(data["mean"]), int(data["n_inputs"]))
