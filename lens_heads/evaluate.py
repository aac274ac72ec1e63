"""Batched log-likelihood engine: multiple-choice accuracy and perplexity, scored as
lm-evaluation-harness 0.4.x (HFLM) scores them, with optional head ablations.

    model = load_model("smollm2-135m", dtype="bfloat16")
    res = evaluate_task(model, "mmlu", n_shot=5, limit=200)            # TaskResult
    res.metrics["acc"], res.questions[0].lls
    lls = loglikelihoods(model, [("Question: 2+2?\\nAnswer:", " 4")])
    ppl = perplexity(model, tokenize_texts(model.tokenizer, texts, 256, mode="chunks"))

Log-likelihood of a request ``(context, continuation)`` (lm-eval ``TemplateLM.loglikelihood``
+ ``HFLM._loglikelihood_tokens``, reproduced exactly):

1. trailing whitespace of the context moves to the front of the continuation;
2. ``ctx = encode(context)``, ``cont = encode(context + continuation)[len(ctx):]`` with the
   tokenizer's default special tokens, or ``add_special_tokens=add_bos_token`` when the
   protocol sets lm-eval's ``add_bos_token`` (none if the string already starts with the BOS
   text; ``protocol.Protocol``);
   an empty context becomes the prefix token (BOS, else EOS);
3. the model reads ``(ctx + cont)[-(max_length + 1):][:-1]`` (left truncation) and the score
   is the sum over the continuation tokens of log-softmax (float32) at the positions that
   predict them (lm-eval takes the log-softmax in the logits' dtype unless
   ``softmax_dtype`` is set; identical in float32, more accurate here in bfloat16).
   ``max_length`` = config ``n_positions`` / ``max_position_embeddings`` /
   ``n_ctx``, else the tokenizer's ``model_max_length``, else 2048.

Speed, without changing what is computed:

* Requests with the same model input are run once (lm-eval's "one-token continuation" cache:
  MMLU's four letters are read from one distribution, one forward per question).
* Only the logits at positions that score a continuation token are computed
  (HF ``logits_to_keep``); the unembedding over the whole prompt is skipped.
* Inputs are batched longest-first with right padding.
* When the ablation's zeroed set does not depend on the input (``reuses_prefix``: none /
  static), inputs sharing a long token prefix (an MMLU subject's description + shots, the
  two WinoGrande options' shots, a PIQA question) are grouped; the shared prefix is run once
  (with the ablation hooks) and its keys/values are reused for every suffix
  (``bridge(..., past_key_values=...)``). Groups come from the tokens alone: inputs are sorted
  lexicographically and adjacent inputs join a group while their common prefix stays at
  least ``MIN_PREFIX`` tokens and at least half of the group's current one.

Ablation hooks run on every forward (prefix and suffix). ``hooks(model, attention_mask,
row_keys)`` receives the mask of the tokens in *that* forward ([batch, pos], the suffix only
in a cached forward) and one stable key per row: ``evaluate_task`` uses ``doc_id * 1000 +
choice`` of the first request that produced the input, so a random ablation draws the same
heads for an item whatever ``limit``, batching or grouping is used.
"""

from __future__ import annotations

import contextlib
import copy
import json
import math
import os
import random
import time
from collections import defaultdict
from dataclasses import asdict, dataclass, field
from typing import Any, Callable, Hashable, Sequence

import torch
import torch.nn.functional as F
from jaxtyping import Int
from torch import Tensor

from lens_heads.data.corpora import iter_batches, pad_batch
from lens_heads.data.tasks import DEFAULT_SEED, ChatFormat, MCRecord, Task, load_task
from lens_heads.atomic import atomic_write_text
from lens_heads.batching import Batcher, parse_batch_size
from lens_heads.errors import LensHeadsError
from lens_heads.hooks import run_with_hooks
from lens_heads.progress import progress_bar
from lens_heads.protocol import Protocol

MIN_PREFIX = 32  # shortest shared prefix (tokens) worth a cached forward
_TOKENIZER_INFINITY = 1000000000000000019884624838656
_DEFAULT_MAX_LENGTH = 2048
_KEY_STRIDE = 1000  # row key = doc_id * _KEY_STRIDE + choice index


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


# -----------------------------------------------------------------------------
# Tokenisation, exactly as lm-eval's HFLM


def prefix_token_id(tokenizer) -> int:
    """lm-eval's conditioning token for an empty context: BOS, else EOS."""
    return tokenizer.bos_token_id if tokenizer.bos_token_id is not None else tokenizer.eos_token_id


def _tok_encode(tokenizer, text: str, add_special_tokens: bool | None = None,
                add_bos: bool | None = None) -> list[int]:
    """lm-eval HFLM ``tok_encode``: an explicit ``add_special_tokens`` wins, else the
    ``add_bos_token`` setting (None: the tokenizer's default); a text that already starts with
    the BOS text gets no special tokens."""
    flag = add_special_tokens if add_special_tokens is not None else add_bos
    kwargs = {} if flag is None else {"add_special_tokens": flag}
    if add_special_tokens is None and text.startswith(tokenizer.decode(prefix_token_id(tokenizer))):
        kwargs["add_special_tokens"] = False  # the text already carries its BOS
    return tokenizer.encode(text, **kwargs)


def encode_pair(tokenizer, context: str, continuation: str,
                memo: dict[str, list[int]] | None = None,
                add_bos: bool | None = None) -> tuple[list[int], list[int]]:
    """``(context_ids, continuation_ids)`` as lm-eval's ``loglikelihood`` builds them
    (``memo`` caches context encodings across the choices of a question; ``add_bos`` is
    lm-eval's ``add_bos_token``)."""
    if context == "":
        cont = _tok_encode(tokenizer, continuation, add_special_tokens=False)
        pre = prefix_token_id(tokenizer)
        return ([pre], cont) if pre != cont[0] else (cont[:1], cont[1:])
    n_spaces = len(context) - len(context.rstrip())
    if n_spaces > 0:
        continuation = context[-n_spaces:] + continuation
        context = context[:-n_spaces]
    whole = _tok_encode(tokenizer, context + continuation, add_bos=add_bos)
    if memo is None:
        ctx = _tok_encode(tokenizer, context, add_bos=add_bos)
    elif context in memo:
        ctx = memo[context]
    else:
        ctx = memo[context] = _tok_encode(tokenizer, context, add_bos=add_bos)
    return ctx, whole[len(ctx):]


def max_length(model) -> int:
    """lm-eval's ``resolve_max_length`` for the model's config and tokenizer."""
    config = model.hf_model.config
    cfg = getattr(config, "text_config", None) or config
    for attr in ("n_positions", "max_position_embeddings", "n_ctx"):
        value = getattr(cfg, attr, None)
        if value is not None:
            return int(value)
    mml = getattr(model.tokenizer, "model_max_length", None)
    if mml is not None and mml != _TOKENIZER_INFINITY:
        return int(mml)
    return _DEFAULT_MAX_LENGTH


# -----------------------------------------------------------------------------
# The engine: unique model inputs ("rows"), each read at a few trailing positions


@dataclass
class _Row:
    ids: list[int]  # model input
    key: int  # stable key for the ablation (min over its requests)
    reads: list[tuple[int, list[int]]] = field(default_factory=list)  # (request index, continuation ids)

    @property
    def n_read(self) -> int:  # how many trailing positions are scored
        return max(len(c) for _, c in self.reads)


def _build_rows(model, encoded: Sequence[tuple[list[int], list[int]]], keys: Sequence[int]) -> list[_Row]:
    limit = max_length(model)
    rows: dict[tuple[int, ...], _Row] = {}
    for i, ((ctx, cont), key) in enumerate(zip(encoded, keys)):
        if len(ctx) == 0 or len(cont) == 0:
            raise LensHeadsError(f"request {i}: empty context or continuation after tokenisation")
        if len(cont) > limit:
            raise LensHeadsError(f"request {i}: continuation of {len(cont)} tokens exceeds the model's "
                                 f"maximum length {limit}")
        inp = tuple((ctx + cont)[-(limit + 1):][:-1])
        row = rows.get(inp)
        if row is None:
            row = rows[inp] = _Row(list(inp), key)
        row.key = min(row.key, key)
        row.reads.append((i, cont))
    return list(rows.values())


def _lcp(a: Sequence[int], b: Sequence[int]) -> int:
    n = min(len(a), len(b))
    i = 0
    while i < n and a[i] == b[i]:
        i += 1
    return i


def _prefix_groups(rows: list[_Row], min_prefix: int) -> tuple[list[tuple[int, list[_Row]]], list[_Row]]:
    """Split rows into ``(prefix_len, rows)`` groups sharing a prefix, and the rest."""
    order = sorted(rows, key=lambda r: r.ids)
    groups: list[tuple[int, list[_Row]]] = []
    singles: list[_Row] = []
    cur: list[_Row] = []
    shared = 0

    def close():
        if len(cur) >= 2:
            groups.append((shared, list(cur)))
        else:
            singles.extend(cur)

    for row in order:
        if cur:
            # every suffix keeps at least the positions it is read at
            cand = min(shared, _lcp(cur[-1].ids, row.ids), len(row.ids) - row.n_read)
            if cand >= min_prefix and cand * 2 >= shared:
                cur.append(row)
                shared = cand
                continue
            close()
        cur, shared = [row], len(row.ids) - row.n_read
    if cur:
        close()
    return groups, singles


def _forward(model, ids: Tensor, mask: Tensor, hooks: list, keep: Tensor | None = None,
             cache: Any = None, want_cache: bool = False):
    """One bridge forward with hooks; returns logits (or (logits, cache))."""
    return run_with_hooks(model, ids, mask, hooks, logits_to_keep=keep, past_key_values=cache,
                          return_cache=want_cache)


def _score_rows(out: list[float], rows: list[_Row], logits: Tensor, positions: Tensor,
                ends: Sequence[int]) -> None:
    """Fill ``out`` from logits [batch, len(positions), vocab] kept at ``positions``;
    row b's input (or suffix) ends at ``ends[b]``."""
    index = {int(p): j for j, p in enumerate(positions.tolist())}
    for b, row in enumerate(rows):
        n = row.n_read
        cols = [index[p] for p in range(ends[b] - n, ends[b])]
        logp = F.log_softmax(logits[b, cols].float(), dim=-1)  # [n, vocab]
        for req, cont in row.reads:
            sel = logp[n - len(cont):]
            out[req] = float(sel.gather(1, torch.tensor(cont, device=sel.device)[:, None]).sum())


def _run_plain(model, rows: list[_Row], out: list[float], ablation, batcher: Batcher, pbar,
               last_only: bool = True) -> None:
    order = sorted(rows, key=lambda r: -len(r.ids))
    pad = model.tokenizer.pad_token_id or 0

    def run(batch: Sequence[_Row]) -> None:
        ids, mask = pad_batch([torch.tensor(r.ids) for r in batch], pad, "right")
        ends = [len(r.ids) for r in batch]
        keep = torch.tensor(sorted({p for r, e in zip(batch, ends) for p in range(e - r.n_read, e)}))
        hooks = ablation.hooks(model, mask, [r.key for r in batch]) if ablation is not None else []
        if last_only:
            logits = _forward(model, ids, mask, hooks, keep)
        else:  # full logits, as lm-eval computes them
            logits, keep = _forward(model, ids, mask, hooks), torch.arange(ids.shape[1])
        _score_rows(out, batch, logits, keep, ends)
        pbar.update(len(batch))

    batcher.run(order, run)


def _run_grouped(model, prefix_len: int, rows: list[_Row], out: list[float], ablation,
                 batcher: Batcher, pbar) -> None:
    pad = model.tokenizer.pad_token_id or 0
    prefix = torch.tensor(rows[0].ids[:prefix_len])[None]
    pmask = torch.ones_like(prefix)
    hooks = ablation.hooks(model, pmask, [rows[0].key]) if ablation is not None else []
    _, cache = _forward(model, prefix, pmask, hooks, keep=torch.tensor([prefix_len - 1]), want_cache=True)
    order = sorted(rows, key=lambda r: -len(r.ids))

    def run(batch: Sequence[_Row]) -> None:
        ids, smask = pad_batch([torch.tensor(r.ids[prefix_len:]) for r in batch], pad, "right")
        ends = [len(r.ids) - prefix_len for r in batch]
        keep = torch.tensor(sorted({p for r, e in zip(batch, ends) for p in range(e - r.n_read, e)}))
        mask = torch.cat([torch.ones(len(batch), prefix_len, dtype=smask.dtype), smask], dim=1)
        c = copy.deepcopy(cache)
        if len(batch) > 1:
            c.batch_repeat_interleave(len(batch))
        hooks = ablation.hooks(model, smask, [r.key for r in batch]) if ablation is not None else []
        logits = _forward(model, ids, mask, hooks, keep, cache=c)
        logits = logits[0] if isinstance(logits, tuple) else logits
        _score_rows(out, batch, logits, keep, ends)
        pbar.update(len(batch))

    batcher.run(order, run)


def loglikelihoods_tokens(
    model,
    encoded: Sequence[tuple[list[int], list[int]]],
    ablation=None,
    batch_size: int | str = 16,
    progress: bool = True,
    *,
    keys: Sequence[int] | None = None,
    reuse_prefix: bool = True,
    last_only: bool = True,
    min_prefix: int = MIN_PREFIX,
) -> list[float]:
    """Sum log p(continuation | context) for pre-tokenised ``(context_ids, continuation_ids)``.

    ``reuse_prefix`` / ``last_only`` switch the two speed-ups off (for tests and
    benchmarks); the prefix cache is used only when ``ablation`` is None or ``reuses_prefix``.
    ``batch_size``: rows per forward, or ``"auto"`` (``lens_heads.batching``).
    """
    batch_size = parse_batch_size(batch_size)
    keys = list(range(len(encoded))) if keys is None else list(keys)
    if len(keys) != len(encoded):
        raise LensHeadsError(f"got {len(keys)} keys for {len(encoded)} requests")
    rows = _build_rows(model, encoded, keys)
    out = [math.nan] * len(encoded)
    use_cache = reuse_prefix and (ablation is None or ablation.reuses_prefix)
    groups, singles = _prefix_groups(rows, min_prefix) if use_cache else ([], rows)
    batcher = Batcher.for_inputs(batch_size, model, max((len(r.ids) for r in rows), default=1))
    with progress_bar(len(rows), "log-likelihoods", enabled=progress) as pbar:
        for plen, grp in groups:
            _run_grouped(model, plen, grp, out, ablation, batcher, pbar)
        _run_plain(model, singles, out, ablation, batcher, pbar, last_only)
    return out


def loglikelihoods(model, requests: list[tuple[str, str]], ablation=None, batch_size: int = 16,
                   progress: bool = True, *, add_bos: bool | None = None, **kwargs) -> list[float]:
    """Sum log p(continuation | context) per ``(context, continuation)``, as lm-eval's HFLM
    (``add_bos``: its ``add_bos_token``; None = the tokenizer's default)."""
    memo: dict[str, list[int]] = {}  # choices repeat contexts (MMLU: 4x the same 5-shot prompt)
    encoded = [encode_pair(model.tokenizer, c, x, memo, add_bos) for c, x in requests]
    return loglikelihoods_tokens(model, encoded, ablation, batch_size, progress, **kwargs)


# -----------------------------------------------------------------------------
# Tasks


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


def _resolve_task(task: Task | str) -> Task:
    return task if isinstance(task, Task) else load_task(task)


def _chat(model, protocol: Protocol | None) -> ChatFormat | None:
    if protocol is None or not protocol.apply_chat_template:
        return None
    return ChatFormat.for_tokenizer(model.tokenizer, protocol.fewshot_as_multiturn)


def _task_requests(task: Task, records: Sequence[MCRecord], n_shot: int, seed: int,
                   chat: ChatFormat | None = None):
    """Flat ``(context, continuation)`` list, its row keys, and per-record spans."""
    reqs: list[tuple[str, str]] = []
    keys: list[int] = []
    spans: list[tuple[int, int]] = []
    for rec in records:
        built = task.build(rec, n_shot, seed, chat)
        if len(built) >= _KEY_STRIDE:
            raise LensHeadsError(f"{task.name} doc {rec.doc_id}: {len(built)} choices (at most {_KEY_STRIDE - 1})")
        spans.append((len(reqs), len(reqs) + len(built)))
        reqs.extend(built)
        keys.extend(rec.doc_id * _KEY_STRIDE + j for j in range(len(built)))
    return reqs, keys, spans


def task_inputs(model, task: Task | str, n_shot: int | None = None, limit: int | None = None,
                seed: int = DEFAULT_SEED, protocol: Protocol | None = None) -> list[Tensor]:
    """The distinct token sequences the model reads for these questions (for score thresholds)."""
    task = _resolve_task(task)
    k = task.spec.n_shot if n_shot is None else n_shot
    reqs, keys, _ = _task_requests(task, select_records(task, limit, seed), k, seed, _chat(model, protocol))
    add_bos = None if protocol is None else protocol.add_bos_token
    rows = _build_rows(model, [encode_pair(model.tokenizer, c, x, add_bos=add_bos) for c, x in reqs], keys)
    return [torch.tensor(r.ids, dtype=torch.long) for r in rows]


def evaluate_task(
    model,
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
    (``reuse_prefix``, ``last_only``, ``min_prefix``).
    """
    t0 = time.perf_counter()
    task = _resolve_task(task)
    k = task.spec.n_shot if n_shot is None else int(n_shot)
    records = select_records(task, limit, seed, doc_ids)
    if not records:
        raise LensHeadsError(f"task {task.name!r} has no records to evaluate")
    reqs, keys, spans = _task_requests(task, records, k, seed, _chat(model, protocol))
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
              **({"protocol": protocol.prompt_key()} if protocol is not None and protocol.prompt_key() else {}),
              "zeroed_units": counts, "batch_size": batch_size, "seconds": round(time.perf_counter() - t0, 3)}
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


LogitsFn = Callable[[Tensor, Tensor, list[int]], Tensor]  # (input_ids, attention_mask, rows) -> logits


@torch.no_grad()
def token_nll(logits: LogitsFn, inputs: Sequence[Tensor], batch_size: int, pad_id: int,
              on_batch: Callable[[int], object] | None = None) -> tuple[float, int]:
    """Summed negative log-likelihood and the number of tokens it scores: every position
    t >= 1 of every input, ``-log p(x_t | x_<t)`` (cross-entropy in float32, summed per batch),
    each input its own window. The one implementation behind both perplexities
    (docs/methods.md §4, §7).

    Inputs are batched longest-first and padded right with ``pad_id`` (``iter_batches``);
    ``logits(ids, mask, rows)`` gets each batch on the CPU with ``rows`` its positions in
    ``inputs`` and returns logits [batch, pos, vocab] on any device. Padding is never scored;
    an input shorter than 2 tokens scores nothing. ``on_batch(n)`` follows each batch of n inputs.
    """
    nll, count = 0.0, 0
    for rows, ids, mask in iter_batches(inputs, batch_size, pad_id=pad_id, side="right"):
        out = logits(ids, mask, rows)[:, :-1].float()
        target = ids[:, 1:].masked_fill(mask[:, 1:] == 0, -100).to(out.device)
        nll += F.cross_entropy(out.reshape(-1, out.shape[-1]), target.reshape(-1),
                               ignore_index=-100, reduction="sum").item()
        count += int((target != -100).sum())
        if on_batch is not None:
            on_batch(len(rows))
    return nll, count


def perplexity(model, inputs: list[Int[Tensor, "pos"]], ablation=None, batch_size: int = 8,
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
        return _forward(model, ids, mask, hooks)

    with progress_bar(len(inputs), "perplexity", enabled=progress) as pbar:
        nll, count = token_nll(logits, inputs, batch_size, pad, pbar.update)
    return math.exp(nll / count)
