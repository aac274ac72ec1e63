"""Content-addressed result store with atomic writes (safe against SIGKILL).

A record is stored under the hash of its ``keys.StoreKey`` (built only in ``lens_heads.results.keys``
from a run identity and a kind). Each record is one small, compact JSON file, its key's
configuration saved inside it::

    DIR/points/<hash>.json         one sweep point (per-question results)
    DIR/thresholds/<hash>.json     score thresholds for a model x task
    DIR/parts/<hash>.json          a point's questions in parts, until the point is complete
    DIR/static_scores/<hash>.json  dataset-level scores a static ablation ranks heads by
    DIR/score_shards/<hash>.safetensors  one shard of a thresholds' scoring pass (per-input
                                   scores, the key's configuration in the file's metadata), until merged

Files are written to a temporary file in the same folder, then ``os.replace``d: a reader
sees either no file or a complete one, so a run killed at any moment resumes by
recomputing only what is missing. Typed records (``sweep.records``) go in and out through
``save`` / ``load``; ``get`` / ``put`` take and give the plain JSON.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any, Iterator, Protocol, TypeVar

from lens_heads.files.atomic import atomic_write_text
from lens_heads.errors import LensHeadsError
from lens_heads.results.keys import Kind, StoreKey, config_key
from lens_heads.files.atomic import atomic_path

__all__ = ["ResultStore", "Record", "config_key"]


class Record(Protocol):
    """A typed record: its JSON form (without the key) and back."""

    def to_json(self) -> dict[str, Any]: ...

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> "Record": ...


R = TypeVar("R")


def _plain(config) -> Any:
    return json.loads(json.dumps(config, default=str))


class ResultStore:
    """JSON records under ``root/<kind folder>/<hash>.json``, keyed by their ``StoreKey``."""

    def __init__(self, root: str | os.PathLike):
        self.root = Path(root)

    def path(self, key: StoreKey) -> Path:
        return self.root / key.kind.folder / f"{key.digest}{key.kind.suffix}"

    def has(self, key: StoreKey) -> bool:
        return self.path(key).is_file()

    def get(self, key: StoreKey) -> dict | None:
        """The stored JSON for ``key``, or None. A record whose configuration differs is an error."""
        path = self.path(key)
        if not path.is_file():
            return None
        try:
            record = json.loads(path.read_text(encoding="utf-8"))
        except FileNotFoundError:  # removed meanwhile (another process merged a point's parts)
            return None
        except (OSError, json.JSONDecodeError) as exc:
            raise LensHeadsError(f"corrupt result file {path}: {exc}; delete it to recompute") from None
        if _plain(record.get("config")) != _plain(key.config):
            raise LensHeadsError(f"result file {path} holds a different configuration (hash collision?)")
        return record

    def put(self, key: StoreKey, record: dict[str, Any]) -> Path:
        """Store ``record`` (the key's configuration is saved inside it) atomically; its path."""
        text = json.dumps({**record, "config": key.config}, separators=(",", ":"), default=str)  # compact: committed
        return atomic_write_text(self.path(key), text, make_parents=True)

    def load(self, key: StoreKey, cls: type[R]) -> R | None:
        """The stored record for ``key`` as ``cls`` (a ``Record``), or None."""
        data = self.get(key)
        return None if data is None else cls.from_json(data)

    def save(self, key: StoreKey, record: Record) -> Path:
        return self.put(key, record.to_json())

    def put_tensors(self, key: StoreKey, tensors: dict[str, Any]) -> Path:
        """Store named tensors atomically (safetensors; the key's configuration in its metadata)."""
        from safetensors.torch import save_file


        with atomic_path(self.path(key), make_parents=True) as tmp:
            save_file({k: v.contiguous() for k, v in tensors.items()}, str(tmp),
                      metadata={"config": json.dumps(_plain(key.config), sort_keys=True)})
        return self.path(key)

    def get_tensors(self, key: StoreKey) -> dict[str, Any] | None:
        """The tensors stored under ``key``, or None; a file of another configuration is an error."""
        from safetensors import SafetensorError, safe_open

        path = self.path(key)
        try:
            with safe_open(path, framework="pt") as f:
                config = json.loads((f.metadata() or {}).get("config", "null"))
                tensors = {k: f.get_tensor(k) for k in f.keys()}
        except FileNotFoundError:
            return None
        except (OSError, SafetensorError, ValueError) as exc:
            raise LensHeadsError(f"corrupt result file {path}: {exc}; delete it to recompute") from None
        if config != _plain(key.config):
            raise LensHeadsError(f"result file {path} holds a different configuration (hash collision?)")
        return tensors

    def discard(self, key: StoreKey) -> None:
        """Remove the record for ``key`` if there is one (intermediate results once merged)."""
        self.path(key).unlink(missing_ok=True)

    def records(self, kind: Kind) -> Iterator[dict]:
        """Every stored record of ``kind`` (each with its ``config``), in key order."""
        for digest in self.keys(kind):
            path = self.root / kind.folder / f"{digest}{kind.suffix}"
            try:
                yield json.loads(path.read_text(encoding="utf-8"))
            except FileNotFoundError:
                continue
            except (OSError, json.JSONDecodeError) as exc:
                raise LensHeadsError(f"corrupt result file {path}: {exc}; delete it to recompute") from None

    def keys(self, kind: Kind) -> list[str]:
        folder = self.root / kind.folder
        return sorted(p.name.removesuffix(kind.suffix) for p in folder.glob(f"*{kind.suffix}")) if folder.is_dir() else []
