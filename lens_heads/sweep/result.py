"""``SweepResult``: a sweep's two tables and the records they were computed from, saved and loaded."""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path

import pandas as pd

from lens_heads.errors import LensHeadsError
from lens_heads.sweep.records import PointRecord, Thresholds
from lens_heads.files.atomic import atomic_write_all

SUMMARY, WITHIN = "summary.csv", "within_1pt.csv"
SUMMARY_REQUIRED = ("score_fn", "fraction", "pct_zeroed", "accuracy")
MODEL_COLUMNS = ("model", "model_digest")  # the first two columns of both tables: whose results these are


@dataclass
class SweepResult:
    """``summary``: one row per (score_fn, fraction[, seed]) point (``stats.point_summary``);
    ``within``: per function, max % zeroed within 1 point and normalised AUC with intervals
    (``stats.tables``); ``records``: spec -> stored point; ``n_stored`` of ``n_points`` planned
    points are stored (equal unless the result is partial)."""

    summary: pd.DataFrame
    within: pd.DataFrame | None
    thresholds: Thresholds = field(default_factory=dict)
    records: dict[str, PointRecord] = field(default_factory=dict)
    n_points: int = 0
    n_stored: int = 0
    model: str = ""  # the model's spec as given (zoo name, path, hub id); "" when unknown
    model_digest: str = ""  # the weights' digest (keys.RunIdentity.model_digest)

    def __post_init__(self) -> None:
        """Both tables start with the model's name and weights digest (``MODEL_COLUMNS``), so
        tables of two models can never be confused, in memory or on disk."""
        for frame in (self.summary, self.within):
            if frame is not None and self.model_digest:
                for i, (col, value) in enumerate(zip(MODEL_COLUMNS, (self.model, self.model_digest))):
                    if col in frame.columns:
                        frame.drop(columns=col, inplace=True)
                    frame.insert(i, col, value)

    @property
    def complete(self) -> bool:
        return self.n_stored == self.n_points

    @property
    def base_accuracy(self) -> float:
        """Accuracy with nothing zeroed (the ``none`` point; else the rows at fraction 0)."""
        s = self.summary
        rows = s[s["spec"] == "none"] if "spec" in s.columns else s.iloc[0:0]
        if rows.empty:
            rows = s[(s["fraction"] == 0) | (s["score_fn"] == "none")]
        return float(rows["accuracy"].mean()) if not rows.empty else float("nan")

    def save(self, folder: str | os.PathLike) -> Path:
        """Write ``summary.csv`` and ``within_1pt.csv`` into ``folder``, both or neither."""

        out = Path(folder)
        out.mkdir(parents=True, exist_ok=True)
        check_same_weights(out, self.model_digest)
        frames = [(SUMMARY, self.summary)] + ([(WITHIN, self.within)] if self.within is not None else [])
        atomic_write_all([(out / name, lambda tmp, f=frame: Path(tmp).write_text(
            f.to_csv(index=False, lineterminator="\n"), encoding="utf-8", newline="")) for name, frame in frames])
        return out

    @classmethod
    def load(cls, path: str | os.PathLike, with_records: bool = False) -> "SweepResult":
        """A saved sweep: a folder with ``summary.csv`` (and ``within_1pt.csv``), or the summary
        CSV itself. ``with_records``: also the point records its ``point_hash`` column names,
        from the folder's store. Thresholds come from the summary's ``threshold`` column."""
        path = Path(path)
        summary_path = path / SUMMARY if path.is_dir() else path
        if not summary_path.is_file():
            raise LensHeadsError(f"no sweep summary at {summary_path}" if path.exists()
                                 else f"sweep path not found: {path}")
        summary = _read_csv(summary_path, "sweep summary")
        missing = [c for c in SUMMARY_REQUIRED if c not in summary.columns]
        if missing:
            raise LensHeadsError(f"sweep summary {summary_path} lacks column(s) {', '.join(missing)} "
                                 f"(has: {', '.join(map(str, summary.columns))})")
        within_path = summary_path.parent / WITHIN
        within = _read_csv(within_path, "within-1-point table") if within_path.is_file() \
            and within_path.stat().st_size else None
        # the in-memory types the tables had when saved: blank seeds and notes, integer counts
        try:
            for frame, col in ((summary, "seed"), (within, "n_seeds")):
                if frame is not None and col in frame.columns:
                    frame[col] = pd.to_numeric(frame[col], errors="raise").astype("Int64")
            for col in ("fraction", "pct_zeroed", "accuracy", "threshold"):
                if col in summary.columns:
                    summary[col] = pd.to_numeric(summary[col], errors="raise")
        except (ValueError, TypeError) as exc:
            raise LensHeadsError(f"sweep tables in {summary_path.parent}: a column holds non-numbers "
                                 f"({str(exc).splitlines()[0]})") from None
        if within is not None and "note" in within.columns:
            within["note"] = within["note"].fillna("").astype(str)
        thresholds: Thresholds = {}
        if "threshold" in summary.columns:
            for r in summary.dropna(subset=["threshold"]).itertuples():
                thresholds.setdefault(str(r.score_fn), {})[float(r.fraction)] = float(r.threshold)
        records: dict[str, PointRecord] = {}
        if with_records and "point_hash" in summary.columns:
            import json

            for spec, h in summary[["spec", "point_hash"]].drop_duplicates().itertuples(index=False):
                f = summary_path.parent / "points" / f"{h}.json"
                if isinstance(h, str) and f.is_file():
                    records[spec] = PointRecord.from_json(json.loads(f.read_text(encoding="utf-8")))
        n = int(summary["spec"].nunique()) if "spec" in summary.columns else len(summary)
        model, digest = _model_of(summary)
        return cls(summary, within, thresholds, records, n_points=n, n_stored=n, model=model, model_digest=digest)


def _model_of(summary: pd.DataFrame) -> tuple[str, str]:
    """(model, model_digest) a saved summary names; ("", "") for tables saved before they carried them."""
    if summary.empty or "model_digest" not in summary.columns:
        return "", ""
    model = summary["model"].iloc[0] if "model" in summary.columns else ""
    return ("" if pd.isna(model) else str(model)), str(summary["model_digest"].iloc[0])


def check_same_weights(folder: Path, digest: str) -> None:
    """Refuse to overwrite a folder's tables that name other weights (a pruned copy, a path whose
    target changed): one message, before anything is written."""
    path = Path(folder) / SUMMARY
    if not digest or not path.is_file():
        return
    try:
        header = pd.read_csv(path, nrows=1)
    except (pd.errors.EmptyDataError, pd.errors.ParserError, UnicodeDecodeError, OSError):
        return  # unreadable tables are replaced (the store, checked first, is what matters)
    _, theirs = _model_of(header)
    if theirs and theirs != digest:
        raise LensHeadsError(f"{folder} holds results of this sweep from other weights ({theirs[:16]}... vs "
                             f"{digest[:16]}...): use another --out, or the same weights")


def _read_csv(path: Path, what: str) -> pd.DataFrame:
    try:
        return pd.read_csv(path)
    except pd.errors.EmptyDataError:
        raise LensHeadsError(f"{what} {path} is empty") from None
    except (pd.errors.ParserError, UnicodeDecodeError, OSError) as exc:
        raise LensHeadsError(f"cannot read {what} {path}: {str(exc).splitlines()[0]}") from None
