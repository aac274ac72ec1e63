"""An adaptive search's per-item results in compact form: the ledger (docs/methods.md §13).

A search decides from one bit per item and point (answered correctly or not), plus the counts
of units its points zeroed and the seconds their evaluation took. The store keeps far more (each
choice's log-likelihood, the prediction, the whole evaluation config: ~138 bytes an item, ~250 kB
a full-PIQA point), which is too much to commit for a campaign that runs over many sessions on
machines that keep only what is committed. The ledger keeps what the decisions read:

* per point (by its store key's digest, with its spec for a reader): which of the population's
  items are known and which of them were answered correctly, each a bit mask over the
  population's items in plan order (hex), the units zeroed over the known items, the seconds
  their evaluation took, and the items counted in those seconds;
* the population itself, as the sha256 of its doc ids in plan order: a ledger of other items
  (another ``limit``, another task) is refused, never mixed in.

One JSON file, keys sorted, floats rounded to the millisecond: the same results write the same
bytes. ``StoreItems`` (``adaptive.py``) reads a ledger beside its store, so a search on a fresh
machine with the ledger alone evaluates only what the ledger lacks, and writes one back
(``StoreItems.ledger``).
"""

from __future__ import annotations

import hashlib
import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Mapping, Sequence

import numpy as np

from lens_heads.errors import LensHeadsError
from lens_heads.files.atomic import atomic_write_text

LEDGER_VERSION = 1


def population_digest(doc_ids: Sequence[int]) -> str:
    """The sha256 of the population's doc ids, in plan order."""
    return hashlib.sha256(json.dumps([int(d) for d in doc_ids], separators=(",", ":")).encode()).hexdigest()


def _mask(ids, position: Mapping[int, int], n: int) -> str:
    bits = np.zeros(n, dtype=np.uint8)
    for d in ids:
        bits[position[d]] = 1
    return np.packbits(bits).tobytes().hex()


def _unmask(text: str, doc_ids: Sequence[int]) -> frozenset[int]:
    try:
        raw = np.frombuffer(bytes.fromhex(text), dtype=np.uint8)
    except ValueError:
        raise LensHeadsError("a ledger's bit mask is not hex") from None
    bits = np.unpackbits(raw)
    if len(raw) != (len(doc_ids) + 7) // 8 or bits[len(doc_ids):].any():
        raise LensHeadsError(f"a ledger's bit mask does not fit the population of {len(doc_ids)} items")
    return frozenset(int(doc_ids[i]) for i in np.flatnonzero(bits[:len(doc_ids)]))


@dataclass(frozen=True)
class LedgerEntry:
    """One point: its spec, the doc ids known and those answered correctly (a subset), the
    units zeroed over the known items (zeroed, seen), the seconds their evaluation took and the
    items those seconds counted (what was evaluated, as opposed to read)."""

    spec: str
    known: frozenset[int]
    correct: frozenset[int]
    zeroed_units: tuple[float, float]
    seconds: float
    items: int

    def __post_init__(self) -> None:
        if not self.correct <= self.known:
            raise LensHeadsError(f"ledger entry {self.spec}: an item is correct but not known")


class Ledger:
    """Entries by point digest over one population (``doc_ids``, plan order)."""

    def __init__(self, doc_ids: Sequence[int], entries: Mapping[str, LedgerEntry] | None = None):
        self.doc_ids = [int(d) for d in doc_ids]
        if len(set(self.doc_ids)) != len(self.doc_ids):
            raise LensHeadsError("a ledger's population has repeated doc ids")
        self.population = population_digest(self.doc_ids)
        self.entries: dict[str, LedgerEntry] = dict(entries or {})
        ids = set(self.doc_ids)
        for digest, e in self.entries.items():
            if not e.known <= ids:
                raise LensHeadsError(f"ledger entry {e.spec}: items outside the population")

    def get(self, digest: str) -> LedgerEntry | None:
        return self.entries.get(digest)

    def __len__(self) -> int:
        return len(self.entries)

    def to_json(self) -> dict:
        position = {d: i for i, d in enumerate(self.doc_ids)}
        n = len(self.doc_ids)
        points = {}
        for digest in sorted(self.entries):
            e = self.entries[digest]
            points[digest] = {"spec": e.spec, "known": _mask(e.known, position, n),
                              "correct": _mask(e.correct, position, n), "n_known": len(e.known),
                              "zeroed_units": [_number(x) for x in e.zeroed_units],
                              "seconds": round(float(e.seconds), 3), "items": int(e.items)}
        return {"version": LEDGER_VERSION, "population": self.population, "n_population": n, "points": points}

    @classmethod
    def from_json(cls, data: Mapping, doc_ids: Sequence[int]) -> "Ledger":
        if data.get("version") != LEDGER_VERSION:
            raise LensHeadsError(f"ledger version {data.get('version')!r}; this lens_heads reads {LEDGER_VERSION}")
        ledger = cls(doc_ids)
        if data.get("population") != ledger.population:
            raise LensHeadsError("the ledger is of another population of items (another task, limit or few-shot "
                                 "seed): it is not mixed in")
        for digest, p in data.get("points", {}).items():
            known = _unmask(p["known"], ledger.doc_ids)
            ledger.entries[digest] = LedgerEntry(p["spec"], known, _unmask(p["correct"], ledger.doc_ids),
                                                 tuple(float(x) for x in p["zeroed_units"]), float(p["seconds"]),
                                                 int(p["items"]))
        return ledger

    def save(self, path) -> Path:
        """Written atomically; the same entries always give the same bytes."""
        text = json.dumps(self.to_json(), sort_keys=True, indent=1) + "\n"
        return atomic_write_text(path, text, make_parents=True)

    @classmethod
    def load(cls, path, doc_ids: Sequence[int]) -> "Ledger":
        """The ledger at ``path`` (an empty one when there is no file)."""
        path = Path(path)
        if not path.is_file():
            return cls(doc_ids)
        try:
            data = json.loads(path.read_text(encoding="utf-8"))
        except (OSError, ValueError) as exc:
            raise LensHeadsError(f"cannot read the ledger {path}: {exc}") from None
        return cls.from_json(data, doc_ids)


def _number(x: float) -> float | int:
    x = float(x)
    if not math.isfinite(x):
        raise LensHeadsError("a ledger count is not finite")
    return int(x) if x.is_integer() else round(x, 6)


__all__ = ["Ledger", "LedgerEntry", "population_digest", "LEDGER_VERSION"]
