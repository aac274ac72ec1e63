"""Content-addressed result store with atomic writes (safe against SIGKILL).

A result is keyed by a hash of the configuration that produced it (a JSON-able dict:
model digest, task fingerprint, n_shot, limit, seed, dtype, ablation spec, package
version, ...). Each result is one small, compact JSON file::

    DIR/points/<hash>.json        one sweep point (per-question results)
    DIR/thresholds/<hash>.json    score thresholds for a model x task
    DIR/parts/<hash>.json         a point's questions in parts, until the point is complete

Files are written to a temporary file in the same folder, then ``os.replace``d: a reader
sees either no file or a complete one, so a run killed at any moment resumes by
recomputing only what is missing.
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path
from typing import Any, Iterator

from lens_heads.atomic import atomic_write_text
from lens_heads.errors import LensHeadsError


def config_key(config: dict[str, Any]) -> str:
    """Stable hash of a JSON-able configuration (sorted keys, compact separators)."""
    blob = json.dumps(config, sort_keys=True, separators=(",", ":"), default=str)
    return hashlib.sha256(blob.encode()).hexdigest()[:32]


class ResultStore:
    """JSON records under ``root/<kind>/<hash>.json``, keyed by their configuration."""

    def __init__(self, root: str | os.PathLike):
        self.root = Path(root)

    def path(self, kind: str, config: dict[str, Any]) -> Path:
        return self.root / kind / f"{config_key(config)}.json"

    def get(self, kind: str, config: dict[str, Any]) -> dict | None:
        """The stored record for ``config``, or None. A record whose config differs is an error."""
        path = self.path(kind, config)
        if not path.is_file():
            return None
        try:
            record = json.loads(path.read_text(encoding="utf-8"))
        except FileNotFoundError:  # removed meanwhile (another process merged a point's parts)
            return None
        except (OSError, json.JSONDecodeError) as exc:
            raise LensHeadsError(f"corrupt result file {path}: {exc}; delete it to recompute") from None
        stored = json.loads(json.dumps(record.get("config"), default=str))
        if stored != json.loads(json.dumps(config, default=str)):
            raise LensHeadsError(f"result file {path} holds a different configuration (hash collision?)")
        return record

    def put(self, kind: str, config: dict[str, Any], record: dict[str, Any]) -> Path:
        """Store ``record`` (the config is saved inside it) atomically; returns the file path."""
        path = self.path(kind, config)
        text = json.dumps({**record, "config": config}, separators=(",", ":"), default=str)  # compact: committed
        atomic_write_text(path, text, make_parents=True)
        return path

    def discard(self, kind: str, config: dict[str, Any]) -> None:
        """Remove the record for ``config`` if there is one (intermediate results once merged)."""
        self.path(kind, config).unlink(missing_ok=True)

    def records(self, kind: str) -> Iterator[dict]:
        """Every stored record of ``kind`` (each with its ``config``), in key order."""
        for key in self.keys(kind):
            path = self.root / kind / f"{key}.json"
            try:
                yield json.loads(path.read_text(encoding="utf-8"))
            except (OSError, json.JSONDecodeError) as exc:
                raise LensHeadsError(f"corrupt result file {path}: {exc}; delete it to recompute") from None

    def keys(self, kind: str) -> list[str]:
        folder = self.root / kind
        return sorted(p.stem for p in folder.glob("*.json")) if folder.is_dir() else []
