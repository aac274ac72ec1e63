"""Multiple-choice accuracy and perplexity, scored as lm-evaluation-harness 0.4.x (HFLM) scores
them, with optional head ablations: what the model reads and how each request is scored is the
engine's (``lens_heads.forward.engine``); the task's requests are ``lens_heads.forward.task_requests``'.

    model = load_model("smollm2-135m", dtype="bfloat16")
    res = evaluate_task(model, "mmlu", n_shot=5, limit=200)            # TaskResult
    res.metrics["acc"], res.questions[0].lls
    lls = loglikelihoods(model, [("Question: 2+2?\\nAnswer:", " 4")])
    ppl = perplexity(model, tokenize_texts(model.tokenizer, texts, 256, mode="chunks"))
"""

from __future__ import annotations

import contextlib
import json
import math
import os
from collections import defaultdict
from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING, Sequence

import torch
from jaxtyping import Int
from torch import Tensor

from lens_heads.files.atomic import atomic_write_text
from lens_heads.data.tasks import DEFAULT_SEED, Task
from lens_heads.forward.engine import encode_pair, forward, loglikelihoods_tokens, token_nll
from lens_heads.errors import LensHeadsError
from lens_heads.progress import progress_bar
from lens_heads.evaluation.timing import Stopwatch, device_type
from lens_heads.forward.task_requests import chat_format, resolve_task, select_records, task_requests

if TYPE_CHECKING:
    from lens_heads.models.load import LoadedModel
    from lens_heads.evaluation.protocol import Protocol


# -----------------------------------------------------------------------------
# Results


@dataclass
class QuestionResult:
    doc_id: int
    pred: int
    gold: int
    correct: bool
    lls: list[float]
    pred_norm: int | None = None
    subject: str | None = None


@dataclass
class TaskResult:
    task: str
    n_shot: int
    metrics: dict[str, float]  # "acc" (micro-average over questions), "acc_norm" where defined
    questions: list[QuestionResult]
    zeroed_fraction: float | None = None
    config: dict = field(default_factory=dict)

    def by_subject(self) -> dict[str, float]:
        """Accuracy per subject (MMLU); the overall ``acc`` is their size-weighted mean."""
        groups: dict[str, list[bool]] = defaultdict(list)
        for q in self.questions:
            groups[q.subject or ""].append(q.correct)
        return {s: sum(v) / len(v) for s, v in sorted(groups.items())}

    def write_jsonl(self, path: str | os.PathLike) -> None:
        """Per-question results, one JSON object a line, written atomically."""
        atomic_write_text(path, "".join(json.dumps(asdict(q)) + "\n" for q in self.questions))


def loglikelihoods(model: LoadedModel, requests: list[tuple[str, str]], ablation=None, batch_size: int = 16,
                   progress: bool = True, *, add_bos: bool | None = None, **kwargs) -> list[float]:
    """Sum log p(continuation | context) per ``(context, continuation)``, as lm-eval's HFLM
    (``add_bos``: its ``add_bos_token``; None = the tokenizer's default)."""
    memo: dict[str, list[int]] = {}  # choices repeat contexts (MMLU: 4x the same 5-shot prompt)
    encoded = [encode_pair(model.tokenizer, c, x, memo, add_bos) for c, x in requests]
    return loglikelihoods_tokens(model, encoded, ablation, batch_size, progress, **kwargs)


# -----------------------------------------------------------------------------
# Tasks


def evaluate_task(
    model: LoadedModel,
    task: Task | str,
    n_shot: int | None = None,
    limit: int | None = None,
    seed: int = DEFAULT_SEED,
    ablation=None,
    batch_size: int = 16,
    progress: bool = True,
    *,
    doc_ids: Sequence[int] | None = None,
    protocol: Protocol | None = None,
    **engine_kwargs,
) -> TaskResult:
    """Accuracy (and acc_norm where the task defines it) of ``model`` on ``task``.

    ``n_shot`` defaults to the task's (MMLU 5, WinoGrande 5, PIQA 0); ``seed`` seeds both the
    ``limit`` subsample (see ``select_records``) and lm-eval's few-shot sampler.
    ``acc`` is the mean over questions (for MMLU: subjects weighted by size, as lm-eval).
    ``doc_ids`` restricts the evaluation to those items; ``protocol`` sets lm-eval's
    ``add_bos_token`` / ``apply_chat_template`` / ``fewshot_as_multiturn`` (default: none of
    them, as lm-eval 0.4.13); ``engine_kwargs`` go to ``loglikelihoods_tokens``
    (``reuse_prefix``, ``last_only``, ``min_prefix``, ``pack``).
    """
    watch = Stopwatch.start()
    task = resolve_task(task)
    k = task.spec.n_shot if n_shot is None else int(n_shot)
    records = select_records(task, limit, seed, doc_ids)
    if not records:
        raise LensHeadsError(f"task {task.name!r} has no records to evaluate")
    reqs, keys, spans = task_requests(task, records, k, seed, chat_format(model, protocol))
    if ablation is not None:
        ablation.prepare_task(model, task, records, k, seed, protocol)
    with ablation.counting() if ablation is not None else contextlib.nullcontext() as counts:
        lls = loglikelihoods(model, reqs, ablation, batch_size, progress, keys=keys,
                             add_bos=None if protocol is None else protocol.add_bos_token, **engine_kwargs)
    questions = []
    for rec, (a, b) in zip(records, spans):
        item = lls[a:b]
        pred, pred_norm = task.predictions(rec, item)
        pred_norm = pred_norm if "acc_norm" in task.spec.metrics else None
        questions.append(QuestionResult(rec.doc_id, pred, rec.gold, pred == rec.gold, item, pred_norm, rec.subject))
    metrics = accuracy_metrics([asdict(q) for q in questions], "acc_norm" in task.spec.metrics)
    zf = counts.fraction() if counts is not None else None
    totals = counts.totals() if counts is not None else None
    counts = list(totals) if totals is not None else None
    revision = {"revision": model.source.revision} if model.source.revision else {}
    config = {"model": model.name, **revision, "dtype": str(model.dtype).replace("torch.", ""), "task": task.name,
              "split": task.split, "source": task.source, "n_shot": k, "limit": limit, "seed": seed,
              "doc_ids": None if doc_ids is None else "given",
              "n_questions": len(questions), "n_requests": len(reqs),
              "ablation": ablation.name if ablation is not None else "none",
              **({"calibrated": str(ablation.calibrated)} if getattr(ablation, "calibrated", None) else {}),
              **({"protocol": protocol.prompt_key()} if protocol is not None and protocol.prompt_key() else {}),
              "zeroed_units": counts, "batch_size": batch_size, **watch.fields(device_type(model))}
    return TaskResult(task.name, k, metrics, questions, zf, config)


def accuracy_metrics(questions: Sequence[dict], with_norm: bool) -> dict[str, float]:
    """lm-eval's multiple-choice metrics over per-question results (``QuestionResult`` as dicts,
    live or stored): ``acc`` = mean of ``correct``, ``acc_norm`` = mean of ``pred_norm == gold``."""
    metrics = {"acc": sum(bool(q["correct"]) for q in questions) / len(questions)}
    if with_norm:
        metrics["acc_norm"] = sum(q["pred_norm"] == q["gold"] for q in questions) / len(questions)
    return metrics


# -----------------------------------------------------------------------------
# Perplexity


def perplexity(model: LoadedModel, inputs: list[Int[Tensor, "pos"]], ablation=None, batch_size: int = 8,
               progress: bool = False) -> float:
    """Token-level perplexity: ``exp(-sum log p(x_t | x_<t) / n)`` over every input position
    t >= 1 of every input, each input an independent window (no context carried across;
    ``token_nll``, docs/methods.md §4).

    With non-overlapping chunks from ``tokenize_texts(..., mode="chunks")`` this is lm-eval's
    rolling log-likelihood with ``context_len=1`` except at chunk boundaries: lm-eval scores a
    document's first token after the prefix token (BOS/EOS) and gives each later window the
    previous window's last token as context, while here each chunk's first token (its BOS when
    the chunk starts with one) is context only and is not scored. Pad nothing in: inputs may
    have different lengths; padding is masked and never scored.
    """
    if not inputs:
        raise LensHeadsError("perplexity needs at least one input")
    if any(torch.as_tensor(x).numel() < 2 for x in inputs):
        raise LensHeadsError("perplexity inputs need at least 2 tokens each")
    pad = model.tokenizer.pad_token_id or 0

    def logits(ids: Tensor, mask: Tensor, rows: list[int]) -> Tensor:
        hooks = ablation.hooks(model, mask, rows) if ablation is not None else []
        return forward(model, ids, mask, hooks)

    with progress_bar(len(inputs), "perplexity", enabled=progress) as pbar:
        nll, count = token_nll(logits, inputs, batch_size, pad, pbar.update)
    return math.exp(nll / count)
