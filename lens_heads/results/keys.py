"""Store keys: the one place that says what identifies a stored result (docs/methods.md §8).

A result is stored under the hash of a JSON-able configuration. That configuration is built
here and nowhere else, from two typed values:

* ``RunIdentity``: what every result of one (model, task) run shares -- the weights digest, the
  task and its records' fingerprint, n-shot, question limit, few-shot seed, dtype, lens_heads
  version and the non-default settings of the ``Protocol``;
* a ``StoreKey`` of one ``Kind`` built from it: the thresholds of a scoring pass, one sweep
  point (its ablation spec), one part of a point (its doc ids), or the dataset-level
  scores a static ablation ranks heads by. A score function whose definition changed
  (``ScoreFn.revision`` > 1) adds its revision, so a record of the old definition is never reused.

Every key of the stores committed under ``analyses/results`` re-keys to its own file name with
this code (a test checks it): the field names, their order of insertion and the float encoding
(JSON's shortest round-trip ``repr``) are part of the format and never change silently.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from enum import Enum
from typing import TYPE_CHECKING, Any, Mapping, Sequence

from lens_heads.files.hashing import sha256_bytes
from lens_heads.models.load import model_digest
from lens_heads.evaluation.protocol import Protocol
from lens_heads.files.provenance import lens_heads_version
from lens_heads.scores.functions import SCORES, revision_key

if TYPE_CHECKING:
    from lens_heads.models.load import LoadedModel


def config_key(config: Mapping[str, Any]) -> str:
    """The stable hash of a JSON-able configuration: sha256 of its canonical JSON (sorted keys,
    compact separators, floats as Python's shortest round-trip repr), first 32 hex digits."""
    blob = json.dumps(config, sort_keys=True, separators=(",", ":"), default=str)
    return sha256_bytes([blob.encode()])[:32]


class Kind(str, Enum):
    """A kind of stored record: its folder in the store and its ``kind`` field in the key."""

    THRESHOLDS = "thresholds"
    POINT = "point"
    PART = "part"
    STATIC_SCORES = "static_scores"
    SCORE_SHARD = "score_shard"

    @property
    def folder(self) -> str:
        return {"point": "points", "part": "parts", "score_shard": "score_shards"}.get(self.value, self.value)

    @property
    def suffix(self) -> str:
        """The record file's suffix: JSON, but tensors (a scoring shard's per-input scores)."""
        return ".safetensors" if self is Kind.SCORE_SHARD else ".json"


@dataclass(frozen=True)
class StoreKey:
    """One record's identity: its kind and the configuration whose hash names its file."""

    kind: Kind
    config: Mapping[str, Any] = field(hash=False)

    @property
    def digest(self) -> str:
        return config_key(self.config)

    def part(self, doc_ids: Sequence[int]) -> "StoreKey":
        """The key of this point's part over ``doc_ids`` (a run of its questions)."""
        if self.kind is not Kind.POINT:
            raise ValueError("only a point has parts")
        return StoreKey(Kind.PART, {**self.config, "kind": Kind.PART.value, "doc_ids": list(doc_ids)})

    def shard(self, index: int, n_shards: int, batch_size: int, floor: int | None) -> "StoreKey":
        """The key of shard ``index`` of ``n_shards`` of this thresholds' scoring pass, whose
        batches of ``batch_size`` it splits (``thresholds.scoring_shards``). ``batches``: the rule
        that cut them (``batching.batch_bounds``' even batches with ``floor``, the device's: a CPU's
        2,048 tokens, none on a GPU, over the pass's order with the inputs of each shared prefix
        together, ``scores.scoring_batches``), so shards cut another way -- the earlier fixed cuts,
        the longest-first order before 7 Dec 2026, or by a worker on another kind of device -- are
        never merged with these."""
        if self.kind is not Kind.THRESHOLDS:
            raise ValueError("only a thresholds key has scoring shards")
        return StoreKey(Kind.SCORE_SHARD, {**self.config, "kind": Kind.SCORE_SHARD.value, "shard": int(index),
                                           "n_shards": int(n_shards), "batch_size": int(batch_size),
                                           "batches": f"prefix-even/{'none' if floor is None else int(floor)}"})


def task_fingerprint(task) -> str:
    """sha256 over the task's name, split, prompt settings (``Task.prompt_settings``) and records
    (question, choices, gold, subject): what is evaluated, not where it was read from, so a store
    stays valid when the data folder moves, or when the hub and a local copy hold the same rows."""
    settings = task.prompt_settings()
    return sha256_bytes([f"{task.name}|{task.split}{'|' + settings if settings else ''}".encode(),
                         *(json.dumps([r.doc_id, r.question, r.choices, r.gold, r.subject], default=str).encode()
                           for r in task.records)])


@dataclass(frozen=True)
class RunIdentity:
    """What every stored result of one run shares (the batch size is deliberately not in it:
    results do not depend on it)."""

    model_digest: str
    task: str  # the task spec as given ("piqa", "file:...")
    task_fingerprint: str
    n_shot: int
    limit: int | None
    seed: int  # few-shot sampling seed
    dtype: str  # "float32", "bfloat16", ...
    version: str  # lens_heads version
    protocol: Mapping[str, Any] = field(default_factory=dict, hash=False)  # Protocol.key(): non-default settings

    @classmethod
    def build(cls, model_digest: str, dtype: str, task, task_spec: str, n_shot: int | None, limit: int | None,
              seed: int, protocol=None, version: str | None = None) -> "RunIdentity":
        """From the weights' digest and dtype (no loaded model needed), a loaded ``Task`` and the
        run's settings; ``n_shot=None`` is the task's default."""

        return cls(model_digest, task_spec, task_fingerprint(task), task.spec.n_shot if n_shot is None else n_shot,
                   limit, seed, str(dtype).removeprefix("torch."),
                   lens_heads_version() if version is None else version,
                   dict(protocol.key()) if protocol is not None else {})

    @classmethod
    def of(cls, model: LoadedModel, task, task_spec: str, n_shot: int | None, limit: int | None, seed: int,
           protocol=None) -> "RunIdentity":
        """The identity of a run of a loaded model."""

        return cls.build(model_digest(model), str(model.dtype), task, task_spec, n_shot, limit, seed, protocol)

    def config(self) -> dict[str, Any]:
        """The fields every key starts with, in their stored order (the protocol last, and only
        its non-default settings, so default-protocol keys are as they always were)."""
        return {"model_digest": self.model_digest, "task": self.task, "task_fingerprint": self.task_fingerprint,
                "n_shot": self.n_shot, "limit": self.limit, "seed": self.seed, "dtype": self.dtype,
                "version": self.version, **self.protocol}

    # -- the keys built from it ------------------------------------------------------------

    def thresholds(self, score_ids: Sequence[str], fractions: Sequence[float],
                   replacement: str | None = None) -> StoreKey:
        """The thresholds of one scoring pass over the run's unablated inputs; ``replacement``:
        what ablated heads become (zero: None), in the key of each score whose values depend on
        it (``replacement_fields``)."""
        revisions = _revisions(score_ids)
        return StoreKey(Kind.THRESHOLDS, {**self.config(), "kind": Kind.THRESHOLDS.value,
                                          "score_ids": list(score_ids),
                                          "fractions": sorted(float(p) for p in fractions),
                                          **({"score_revisions": revisions} if revisions else {}),
                                          **replacement_fields(score_ids, replacement)})

    def point(self, spec: str, score_fn: str | None = None) -> StoreKey:
        """One sweep point: the ablation ``spec`` evaluated; ``score_fn`` the function whose
        thresholds made it (its revision joins the key; the baseline ``none`` is shared)."""
        revisions = _revisions([score_fn]) if spec != "none" and score_fn else {}
        return StoreKey(Kind.POINT, {**self.config(), "kind": Kind.POINT.value, "ablation": str(spec),
                                     **({"score_revision": revisions[score_fn]} if revisions else {})})

    def static_scores(self, score_id: str, replacement: str | None = None) -> StoreKey:
        """The dataset-level scores by ``score_id`` on the run's inputs (a static ablation's
        ranking; ``random@SEED``: seeded uniform values, a random order); ``replacement`` as in
        ``thresholds``."""
        revisions = _revisions([score_id])
        return StoreKey(Kind.STATIC_SCORES, {**self.config(), "kind": Kind.STATIC_SCORES.value, "score": score_id,
                                             **({"score_revision": revisions[score_id]} if revisions else {}),
                                             **replacement_fields([score_id], replacement)})

    def same_run(self, config: Mapping[str, Any]) -> bool:
        """Whether a stored key's configuration belongs to this run (whatever its kind)."""
        from dataclasses import fields


        run_fields = {*self.config(), *(f.name for f in fields(Protocol))}
        mine = json.loads(json.dumps(self.config(), default=str))
        return {k: v for k, v in config.items() if k in run_fields} == mine


def _revisions(score_ids: Sequence[str]) -> dict[str, int]:

    return revision_key(list(score_ids))


def replacement_field(score_id: str) -> str:
    """The key field holding what ablated heads became, for a score whose values depend on it."""
    return f"{score_id}_replacement"


def replacement_fields(score_ids: Sequence[str], replacement: str | None) -> dict[str, str]:
    """``{<id>_replacement: replacement}`` for each of ``score_ids`` whose registry entry says
    its values depend on the replacement (``replacement_dependent``); none for zero (None), so
    keys of zero-replacement runs are what they always were."""

    if not replacement:
        return {}
    return {replacement_field(s): replacement for s in score_ids if s in SCORES and SCORES[s].replacement_dependent}
