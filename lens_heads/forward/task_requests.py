"""A task's requests: which records are evaluated (``select_records``), and the
``(context, continuation)`` pairs, row keys and token inputs built from them, as lm-eval builds
them (docs/methods.md §4). Used by evaluation, attribution patching and the sweep's scoring
passes alike, below all of them."""

from __future__ import annotations

import random
from collections import defaultdict
from typing import TYPE_CHECKING, Hashable, Sequence

import torch
from torch import Tensor

from lens_heads.data.task_routes import load_task
from lens_heads.data.tasks import DEFAULT_SEED, ChatFormat, MCRecord, Task
from lens_heads.forward.engine import RowKey, build_rows, encode_pair
from lens_heads.errors import LensHeadsError

if TYPE_CHECKING:
    from lens_heads.models.load import LoadedModel
    from lens_heads.evaluation.protocol import Protocol


def select_records(task: Task, limit: int | None, seed: int = DEFAULT_SEED,
                   doc_ids: Sequence[int] | None = None) -> list[MCRecord]:
    """The records to evaluate: all of them, those with ``doc_ids``, or a seeded stratified
    sample of ``limit`` (of the ``doc_ids`` ones when both are given).

    Strata: the subject when records have one (MMLU), else the gold label. Each stratum gets
    ``limit * size / total`` items rounded by largest remainder (ties: stratum order), drawn
    with ``random.Random(seed)`` in stratum order; the sample is returned in task order.
    """
    records = task.records
    if doc_ids is not None:
        by_id = {r.doc_id: r for r in records}
        missing = [d for d in doc_ids if d not in by_id]
        if missing:
            raise LensHeadsError(f"task {task.name!r} has no doc_id {missing[0]} (ids run 0..{len(records) - 1})")
        records = sorted({by_id[d].doc_id: by_id[d] for d in doc_ids}.values(), key=lambda r: r.doc_id)
    if limit is None or limit >= len(records):
        return list(records)
    if limit < 1:
        raise LensHeadsError(f"limit must be >= 1, got {limit}")
    has_subject = any(r.subject is not None for r in records)
    strata: dict[Hashable, list[MCRecord]] = defaultdict(list)
    for r in records:
        strata[r.subject if has_subject else r.gold].append(r)
    names = sorted(strata, key=lambda s: (str(type(s)), s))
    quota = {s: limit * len(strata[s]) / len(records) for s in names}
    take = {s: int(quota[s]) for s in names}
    rest = limit - sum(take.values())
    for s in sorted(names, key=lambda s: -(quota[s] - take[s]))[:rest]:
        take[s] += 1
    rnd = random.Random(seed)
    chosen = [r for s in names for r in rnd.sample(strata[s], take[s])]
    return sorted(chosen, key=lambda r: r.doc_id)


def resolve_task(task: Task | str) -> Task:
    """A loaded ``Task`` as it is, a task spec loaded."""
    return task if isinstance(task, Task) else load_task(task)


def chat_format(model: LoadedModel, protocol: Protocol | None) -> ChatFormat | None:
    """The chat format the protocol asks for (lm-eval's ``apply_chat_template``), or None."""
    if protocol is None or not protocol.apply_chat_template:
        return None
    return ChatFormat.for_tokenizer(model.tokenizer, protocol.fewshot_as_multiturn)


def task_requests(task: Task, records: Sequence[MCRecord], n_shot: int, seed: int,
                  chat: ChatFormat | None = None) -> tuple[list[tuple[str, str]], list[int], list[tuple[int, int]]]:
    """Flat ``(context, continuation)`` list, its row keys (``RowKey(doc_id, choice)``) and
    per-record spans."""
    reqs: list[tuple[str, str]] = []
    keys: list[int] = []
    spans: list[tuple[int, int]] = []
    for rec in records:
        built = task.build(rec, n_shot, seed, chat)
        if len(built) >= RowKey.STRIDE:
            raise LensHeadsError(f"{task.name} doc {rec.doc_id}: {len(built)} choices (at most {RowKey.STRIDE - 1})")
        spans.append((len(reqs), len(reqs) + len(built)))
        reqs.extend(built)
        keys.extend(int(RowKey(rec.doc_id, j)) for j in range(len(built)))
    return reqs, keys, spans


def task_inputs(model: LoadedModel, task: Task | str, n_shot: int | None = None, limit: int | None = None,
                seed: int = DEFAULT_SEED, protocol: Protocol | None = None) -> list[Tensor]:
    """The distinct token sequences the model reads for these questions (for score thresholds)."""
    task = resolve_task(task)
    return record_inputs(model, task, select_records(task, limit, seed), n_shot, seed, protocol)


def record_inputs(model: LoadedModel, task: Task, records: Sequence[MCRecord], n_shot: int | None = None,
                  seed: int = DEFAULT_SEED, protocol: Protocol | None = None) -> list[Tensor]:
    """``task_inputs`` of the given ``records`` (as ``evaluate_task`` selected them)."""
    k = task.spec.n_shot if n_shot is None else n_shot
    reqs, keys, _ = task_requests(task, records, k, seed, chat_format(model, protocol))
    add_bos = None if protocol is None else protocol.add_bos_token
    rows = build_rows(model, [encode_pair(model.tokenizer, c, x, add_bos=add_bos) for c, x in reqs], keys)
    return [torch.tensor(r.ids, dtype=torch.long) for r in rows]
