"""What a repair run reports (``report.json``): :class:`RepairReport`, one :class:`RepairPass` per pass.

The file is ``json.dumps(report, indent=2, default=str)`` of the keys below, in this order::

    model, selector, config, n_train_chunks, n_eval_docs, n_eval_tokens, n_diag_inputs,
    healthy_before, classes_before, band_before, ppl_before, passes, wall_s
    [, train_data, eval_data, reinit_healthy]   (when known: the corpora named, extended surgery)

and per pass either ``pass, targets, n_targets, edits, ppl_after_reinit, history, ppl_final,
steps, epochs, stopped_early, healthy_after, classes_after, band_after, train_wall_s``
[``, healthy_targets``] (a trained pass) or ``pass, targets, note`` (nothing left to repair).
``load`` then ``save`` gives back the same bytes: keys this version does not know are kept in
``extra`` and every key keeps its place in the file. The method is docs/methods.md §7.
"""

from __future__ import annotations

import json
import os
from dataclasses import MISSING, dataclass, field, fields
from pathlib import Path
from typing import Any

from lens_heads.files.atomic import atomic_write_text
from lens_heads.errors import LensHeadsError

REPORT_NAME = "report.json"


def _report_path(path: str | os.PathLike) -> Path:
    """``path`` itself, or ``path/report.json`` when ``path`` is a folder."""
    path = Path(path)
    return path / REPORT_NAME if path.is_dir() else path


def _tuple(value: Any) -> Any:
    return tuple(value) if isinstance(value, list) else value


def _to_json_dict(obj: Any, renamed: dict[str, str]) -> dict[str, Any]:
    """The JSON object of a report dataclass: its fields (``renamed`` to their file keys; an
    optional field left None is absent unless the loaded file had it) and ``extra``, in the
    loaded file's key order, new keys after it in field order."""
    order = obj._key_order
    out: dict[str, Any] = {}
    for f in fields(obj):
        if f.name in ("extra", "_key_order"):
            continue
        key, value = renamed.get(f.name, f.name), getattr(obj, f.name)
        if value is not None or key in order or f.default is not None:
            out[key] = value
    clash = sorted(out.keys() & obj.extra.keys())
    if clash:
        raise LensHeadsError(f"extra keys {', '.join(clash)} would overwrite report fields")
    out.update(obj.extra)
    keys = [k for k in order if k in out] + [k for k in out if k not in order]
    return {k: out[k] for k in keys}


def _from_json_dict(cls, data: Any, renamed: dict[str, str], what: str) -> dict[str, Any]:
    """Constructor arguments of ``cls`` from its JSON object ``data`` (unknown keys -> ``extra``)."""
    if not isinstance(data, dict):
        raise LensHeadsError(f"{what}: expected a JSON object, got {type(data).__name__}")
    by_key = {renamed.get(f.name, f.name): f for f in fields(cls) if f.name not in ("extra", "_key_order")}
    missing = [k for k, f in by_key.items()
               if f.default is MISSING and f.default_factory is MISSING and k not in data]
    if missing:
        raise LensHeadsError(f"{what}: missing keys {', '.join(missing)}")
    args = {by_key[k].name: v for k, v in data.items() if k in by_key}
    args["extra"] = {k: v for k, v in data.items() if k not in by_key}
    args["_key_order"] = tuple(data)
    return args


@dataclass(frozen=True)
class RepairPass:
    """One pass: the heads re-initialised and what training and re-diagnosis gave. A pass
    with nothing left to repair has only ``index``, ``targets`` (empty) and ``note``."""

    index: int  # "pass" in the file: 1, 2, ...
    targets: tuple[str, ...]  # "LAYER.HEAD"
    n_targets: int | None = None
    edits: tuple[str, ...] | None = None  # SurgeryPlan.describe()["edits"]
    ppl_after_reinit: float | None = None  # held-out perplexity right after re-initialisation
    history: tuple[dict, ...] | None = None  # per epoch: {"epoch", "step", "train_loss", "ppl"}
    ppl_final: float | None = None
    steps: int | None = None
    epochs: int | None = None
    stopped_early: bool | None = None
    healthy_after: int | None = None
    classes_after: dict[str, int] | None = None
    band_after: tuple[int, ...] | None = None
    train_wall_s: float | None = None
    note: str | None = None
    healthy_targets: tuple[str, ...] | None = None  # the healthy heads among targets (extended surgery)
    extra: dict[str, Any] = field(default_factory=dict)  # keys of the file this version does not know
    _key_order: tuple[str, ...] = field(default=(), repr=False, compare=False)

    _RENAMED = {"index": "pass"}

    def __post_init__(self) -> None:
        for name in ("targets", "edits", "history", "band_after", "healthy_targets"):
            object.__setattr__(self, name, _tuple(getattr(self, name)))

    @property
    def trained(self) -> bool:
        """Whether this pass trained (it has a final perplexity)."""
        return self.ppl_final is not None

    def to_dict(self) -> dict[str, Any]:
        return _to_json_dict(self, self._RENAMED)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> RepairPass:
        return cls(**_from_json_dict(cls, data, cls._RENAMED, "repair pass"))


@dataclass(frozen=True)
class RepairReport:
    """The outcome of ``repair``: the run, the model before, and every pass."""

    model: str
    selector: str  # TargetSelector.describe()
    config: dict[str, Any]  # asdict(RepairConfig), as JSON keeps it
    n_train_chunks: int
    n_eval_docs: int
    n_eval_tokens: int  # tokens the held-out perplexity scores
    n_diag_inputs: int
    healthy_before: int
    classes_before: dict[str, int]
    band_before: tuple[int, ...]
    ppl_before: float
    passes: tuple[RepairPass, ...]
    wall_s: float
    train_data: str | None = None  # the training corpus as given (c4-train, wikitext2-train, a file, ...)
    eval_data: str | None = None  # the held-out corpus as given, or "last N documents of <train_data>"
    reinit_healthy: str | None = None  # HealthyPick printed: healthy heads re-initialised too
    extra: dict[str, Any] = field(default_factory=dict)  # keys of the file this version does not know
    _key_order: tuple[str, ...] = field(default=(), repr=False, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "band_before", _tuple(self.band_before))
        object.__setattr__(self, "passes", tuple(self.passes))

    @property
    def trained_passes(self) -> tuple[RepairPass, ...]:
        return tuple(p for p in self.passes if p.trained)

    def to_dict(self) -> dict[str, Any]:
        out = _to_json_dict(self, {})
        out["passes"] = [p.to_dict() for p in self.passes]
        return out

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), indent=2, default=str)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> RepairReport:
        args = _from_json_dict(cls, data, {}, "repair report")
        if not isinstance(args["passes"], list):
            raise LensHeadsError("repair report: 'passes' must be a list")
        args["passes"] = tuple(RepairPass.from_dict(p) for p in args["passes"])
        return cls(**args)

    def save(self, path: str | os.PathLike) -> Path:
        """Write (atomically) to ``path``, or to ``path/report.json`` when it is a folder."""
        return atomic_write_text(_report_path(path), self.to_json())

    @classmethod
    def load(cls, path: str | os.PathLike) -> RepairReport:
        """Read ``path``, or ``path/report.json`` when it is a folder."""
        path = _report_path(path)
        try:
            data = json.loads(path.read_text(encoding="utf-8"))
        except (OSError, ValueError) as exc:
            raise LensHeadsError(f"cannot read the repair report {path}: {exc}") from None
        return cls.from_dict(data)
