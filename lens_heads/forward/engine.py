"""The engine: every forward lens_heads runs to score text, and the public surface the rest of
the package calls for it -- evaluate, perplexity, the lm-eval adapter, attribution patching
and the sweep (docs/methods.md §4, docs/architecture.md). Attention backends plug in below it
(``hooks.run_with_hooks``).

Log-likelihood of a request ``(context, continuation)`` (lm-eval ``TemplateLM.loglikelihood``
+ ``HFLM._loglikelihood_tokens``, reproduced exactly):

1. trailing whitespace of the context moves to the front of the continuation;
2. ``ctx = encode(context)``, ``cont = encode(context + continuation)[len(ctx):]`` with the
   tokenizer's default special tokens, or ``add_special_tokens=add_bos_token`` when the
   protocol sets lm-eval's ``add_bos_token`` (none if the string already starts with the BOS
   text); an empty context becomes the prefix token (BOS, else EOS);
3. the model reads ``(ctx + cont)[-(max_length + 1):][:-1]`` (left truncation) and the score
   is the sum over the continuation tokens of log-softmax (float32) at the positions that
   predict them (lm-eval takes the log-softmax in the logits' dtype unless
   ``softmax_dtype`` is set; identical in float32, more accurate here in bfloat16).
   ``max_length`` = config ``n_positions`` / ``max_position_embeddings`` /
   ``n_ctx``, else the tokenizer's ``model_max_length``, else 2048.

Speed, without changing what is computed:

* Requests with the same model input are run once (lm-eval's "one-token continuation" cache:
  MMLU's four letters are read from one distribution, one forward per question).
* Only the logits at positions that score a continuation token are computed, row by row
  (HF ``logits_to_keep`` for the union, then the unembedding on each row's own positions:
  ``scored_positions``); the unembedding over the whole prompt is skipped.
* Inputs are batched longest-first with right padding; on a CPU a batch that already holds
  2,048 real tokens closes before an input it would pad by more than a tenth
  (``batching.even_batch``: SmolLM2, MMLU 5-shot 40 questions, 1.37x faster in fp32, 1.3x in bf16).
* When the ablation's zeroed set does not depend on the input (``reuses_prefix``: none /
  static), inputs sharing a long token prefix (an MMLU subject's description + shots, the
  two WinoGrande options' shots, a PIQA question) are grouped; the shared prefix is run once
  (with the ablation hooks) and its keys/values are reused for every suffix
  (``bridge(..., past_key_values=...)``). Groups come from the tokens alone: inputs are sorted
  lexicographically and adjacent inputs join a group while their common prefix stays at
  least ``MIN_PREFIX`` tokens and at least half of the group's current one.
* With the same condition, where the model reads a packed batch as its inputs alone
  (``packed_length_limit``), the other inputs of at most ``PACK_LIMIT`` tokens are packed
  (``lens_heads.forward.packing``): several to a batch row, a question's inputs sharing a prefix of at
  least ``PACK_MIN_PREFIX`` tokens as one unit (the prefix once), each input seeing only its own
  tokens. SmolLM2, PIQA 80 questions: 4,840 positions instead of 6,767 in padded rows of 16.

Ablation hooks run on every forward (prefix, suffix, packed). ``hooks(model, attention_mask,
row_keys)`` receives the mask of the tokens in *that* forward ([batch, pos], the suffix only
in a cached forward) and the stable keys (``RowKey``) of the inputs it scores, one per row --
but where the zeroed heads do not depend on the input (``reuses_prefix``): a packed row scores
several inputs, a cached prefix's forward none. A task's request for choice ``c`` of document
``d`` is ``RowKey(d, c)``, so a random ablation draws the same heads for an item whatever
``limit``, batching or grouping is used, and "% zeroed" counts each input once. Whoever needs
more than the sums (the lm-eval adapter's ``is_greedy``) passes an ``observer``.
"""

from __future__ import annotations

import copy
import hashlib
import math
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Callable, ClassVar, Sequence

import torch
import torch.nn.functional as F
from jaxtyping import Float
from torch import Tensor

from lens_heads.batching import Batcher, parse_batch_size
from lens_heads.data.corpora import iter_batches, pad_batch
from lens_heads.errors import LensHeadsError
from lens_heads.forward import packing
from lens_heads.models.hooks import packed_length_limit, run_with_hooks
from lens_heads.progress import progress_bar

if TYPE_CHECKING:
    from lens_heads.models.load import LoadedModel

MIN_PREFIX = 32  # shortest shared prefix (tokens) worth a cached forward
PACK_LIMIT = 256  # longest packed unit (tokens); a packed row's attention is its whole square
PACK_MIN_PREFIX = 4  # shortest shared prefix (tokens) a packed unit holds once
_TOKENIZER_INFINITY = 1000000000000000019884624838656
_DEFAULT_MAX_LENGTH = 2048

#: ``observer(request, logprobs, continuation)``: a request's float32 log-softmax rows
#: [len(continuation), vocab] at the positions that predict its continuation tokens.
Observer = Callable[[int, Float[Tensor, "n vocab"], list[int]], object]


@dataclass(frozen=True, order=True)
class RowKey:
    """The stable key of a request: choice ``choice`` of document ``doc_id``, carried through
    the engine as one integer (``int(key)`` prints it, ``RowKey.parse`` reads it back). What a
    random ablation's draw and a per-question table depend on."""

    doc_id: int
    choice: int = 0
    STRIDE: ClassVar[int] = 1000  # choices per document

    def __post_init__(self) -> None:
        if self.doc_id < 0 or not 0 <= self.choice < self.STRIDE:
            raise LensHeadsError(f"row key ({self.doc_id}, {self.choice}): a document id >= 0 and a choice in "
                                 f"[0, {self.STRIDE}) (at most {self.STRIDE - 1} choices)")

    def __int__(self) -> int:
        return self.doc_id * self.STRIDE + self.choice

    @classmethod
    def parse(cls, key: int) -> "RowKey":
        return cls(*divmod(int(key), cls.STRIDE))

    @classmethod
    def fits(cls, doc_id: object, choice: object) -> bool:
        """Whether ``(doc_id, choice)`` makes a key (ints in range)."""
        return isinstance(doc_id, int) and doc_id >= 0 and isinstance(choice, int) and 0 <= choice < cls.STRIDE


def row_generator(seed: int, row_key: int) -> torch.Generator:
    """A CPU generator seeded from sha256(seed, row_key): a random draw per row (a random
    ablation's heads, a resample's source) independent of batching and order."""
    digest = hashlib.sha256(f"lens_heads.random:{int(seed)}:{int(row_key)}".encode()).digest()
    return torch.Generator().manual_seed(int.from_bytes(digest[:8], "little") & ((1 << 63) - 1))


# -----------------------------------------------------------------------------
# Tokenisation, exactly as lm-eval's HFLM


def prefix_token_id(tokenizer) -> int:
    """lm-eval's conditioning token for an empty context: BOS, else EOS."""
    return tokenizer.bos_token_id if tokenizer.bos_token_id is not None else tokenizer.eos_token_id


def tok_encode(tokenizer, text: str, add_special_tokens: bool | None = None,
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
        cont = tok_encode(tokenizer, continuation, add_special_tokens=False)
        pre = prefix_token_id(tokenizer)
        return ([pre], cont) if pre != cont[0] else (cont[:1], cont[1:])
    n_spaces = len(context) - len(context.rstrip())
    if n_spaces > 0:
        continuation = context[-n_spaces:] + continuation
        context = context[:-n_spaces]
    whole = tok_encode(tokenizer, context + continuation, add_bos=add_bos)
    if memo is None:
        ctx = tok_encode(tokenizer, context, add_bos=add_bos)
    elif context in memo:
        ctx = memo[context]
    else:
        ctx = memo[context] = tok_encode(tokenizer, context, add_bos=add_bos)
    return ctx, whole[len(ctx):]


def max_length(model: LoadedModel) -> int:
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
# Rows: unique model inputs, each read at a few trailing positions


@dataclass
class Row:
    """One distinct model input and the requests read from it."""

    ids: list[int]  # model input
    key: int  # stable RowKey integer for the ablation (min over its requests)
    reads: list[tuple[int, list[int]]] = field(default_factory=list)  # (request index, continuation ids)

    @property
    def n_read(self) -> int:  # how many trailing positions are scored
        return max(len(c) for _, c in self.reads)


def build_rows(model: LoadedModel, encoded: Sequence[tuple[list[int], list[int]]], keys: Sequence[int]) -> list[Row]:
    """The distinct model inputs of pre-tokenised requests, left-truncated to ``max_length``
    as lm-eval's HFLM (requests with the same input share one row)."""
    limit = max_length(model)
    rows: dict[tuple[int, ...], Row] = {}
    for i, ((ctx, cont), key) in enumerate(zip(encoded, keys)):
        if len(ctx) == 0 or len(cont) == 0:
            raise LensHeadsError(f"request {i}: empty context or continuation after tokenisation")
        if len(cont) > limit:
            raise LensHeadsError(f"request {i}: continuation of {len(cont)} tokens exceeds the model's "
                                 f"maximum length {limit}")
        inp = tuple((ctx + cont)[-(limit + 1):][:-1])
        row = rows.get(inp)
        if row is None:
            row = rows[inp] = Row(list(inp), key)
        row.key = min(row.key, key)
        row.reads.append((i, cont))
    return list(rows.values())


def _lcp(a: Sequence[int], b: Sequence[int]) -> int:
    n = min(len(a), len(b))
    i = 0
    while i < n and a[i] == b[i]:
        i += 1
    return i


def prefix_groups(rows: list[Row], min_prefix: int) -> tuple[list[tuple[int, list[Row]]], list[Row]]:
    """Split rows into ``(prefix_len, rows)`` groups sharing a prefix, and the rest."""
    order = sorted(rows, key=lambda r: r.ids)
    groups: list[tuple[int, list[Row]]] = []
    singles: list[Row] = []
    cur: list[Row] = []
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


def shared_prefixes(seqs: Sequence[Sequence[int] | Tensor], min_prefix: int = MIN_PREFIX) -> list[int]:
    """Per input, the length of the token prefix it shares with the other inputs of its group
    (``prefix_groups``, each input keeping at least its last token after it), 0 where it shares
    none: what a scoring pass runs once per group (``scores.score_heads``). A function of all
    of ``seqs``: a shard of the inputs scored with its part of this list runs the very forwards
    the whole pass runs for them."""
    rows = [Row([int(t) for t in s], i, [(i, [0])]) for i, s in enumerate(seqs)]
    out = [0] * len(rows)
    for length, group in prefix_groups(rows, min_prefix)[0]:
        for row in group:
            out[row.key] = length
    return out


def forward(model: LoadedModel, ids: Tensor, mask: Tensor | None, hooks: list, keep: Tensor | None = None,
            cache: Any = None, want_cache: bool = False, *, logits: bool = True, grad: bool = False,
            pick: Tensor | None = None, positions: Tensor | None = None):
    """The one forward every part of lens_heads runs: the bridge with ``hooks``; logits at
    ``keep`` (all: None), from a cached prefix ``cache``; returns logits (or (logits, cache)
    with ``want_cache``). ``pick`` ([n, 2] pairs (batch row, index into ``keep``)): logits at
    those pairs only, [n, vocab]. ``logits=False``: the blocks only (a pass that reads hooks:
    scores, diagnosis, patterns, head means), returns None. ``grad``: with autograd
    (attribution patching). ``positions`` with a [batch, 1, pos, pos] ``mask``: a packed batch
    (``lens_heads.forward.packing``)."""
    return run_with_hooks(model, ids, mask, hooks, logits, logits_to_keep=keep, past_key_values=cache,
                          return_cache=want_cache, grad=grad, logit_rows=pick, position_ids=positions)


def prefix_cache(model: LoadedModel, prefix: Sequence[int], hooks: list) -> Any:
    """The K/V cache of ``prefix`` run alone as one row [1, P] with ``hooks`` (the LM head on no
    row): what forwards of suffixes continue from (``cache_for_rows``)."""
    ids = torch.tensor(list(prefix))[None]
    _, cache = forward(model, ids, torch.ones_like(ids), hooks, keep=torch.tensor([ids.shape[1] - 1]),
                       want_cache=True, pick=torch.zeros(0, 2, dtype=torch.long))
    return cache


def cache_for_rows(cache: Any, rows: int) -> Any:
    """A copy of a prefix's cache for a forward of ``rows`` suffixes (which appends to it)."""
    c = copy.deepcopy(cache)
    if rows > 1:
        c.batch_repeat_interleave(rows)
    return c


def scored_positions(rows: Sequence[Row], ends: Sequence[int]) -> tuple[Tensor, Tensor]:
    """The positions a batch is read at: ``keep``, the sorted union over its rows (row b's
    input ends at ``ends[b]``; it is read at its last ``n_read`` positions), and ``pick``, the
    (batch row, index into ``keep``) pair of every position read, row by row in order -- the
    unembedding runs at those pairs only, not at the union in every row (PIQA, batch 16: 35 %
    fewer LM-head rows)."""
    return packing.read_positions([(b, e, r.n_read) for b, (r, e) in enumerate(zip(rows, ends))])


def score_rows(out: list[float], rows: list[Row], logits: Float[Tensor, "n vocab"],
               observer: Observer | None = None) -> None:
    """Fill ``out`` from the logits at the positions ``rows`` are read at (``scored_positions``'
    ``pick``: each row's last ``n_read`` positions in order, row after row).
    ``observer(request, logprobs, continuation)`` sees each request's float32 log-softmax rows
    [len(continuation), vocab], the very ones scored."""
    start = 0
    for row in rows:
        n = row.n_read
        logp = F.log_softmax(logits[start:start + n].float(), dim=-1)  # [n, vocab]
        start += n
        for req, cont in row.reads:
            sel = logp[n - len(cont):]
            out[req] = float(sel.gather(1, torch.tensor(cont, device=sel.device)[:, None]).sum())
            if observer is not None:
                observer(req, sel, cont)


def _run_plain(model: LoadedModel, rows: list[Row], out: list[float], ablation, batcher: Batcher, pbar,
               last_only: bool = True, observer: Observer | None = None) -> None:
    order = sorted(rows, key=lambda r: -len(r.ids))
    pad = model.tokenizer.pad_token_id or 0

    def run(batch: Sequence[Row]) -> None:
        ids, mask = pad_batch([torch.tensor(r.ids) for r in batch], pad, "right")
        keep, pick = scored_positions(batch, [len(r.ids) for r in batch])
        hooks = ablation.hooks(model, mask, [r.key for r in batch]) if ablation is not None else []
        if last_only:
            logits = forward(model, ids, mask, hooks, keep, pick=pick)
        else:  # full logits, as lm-eval computes them
            logits = forward(model, ids, mask, hooks)[pick[:, 0], keep[pick[:, 1]]]
        score_rows(out, batch, logits, observer)
        pbar.update(len(batch))

    batcher.run(order, run, [len(r.ids) for r in order])


@dataclass
class SuffixBatch:
    """Rows that share a cached prefix of ``prefix_len`` tokens, as one forward after it: their
    suffixes ``ids`` [b, S] (right-padded, ``smask``), the ``mask`` over prefix and suffix
    [b, P + S], and the positions read (``scored_positions``' ``keep`` / ``pick``)."""

    ids: Tensor
    smask: Tensor
    mask: Tensor
    keep: Tensor
    pick: Tensor

    @classmethod
    def of(cls, model: LoadedModel, rows: Sequence[Row], prefix_len: int) -> "SuffixBatch":
        pad = model.tokenizer.pad_token_id or 0
        ids, smask = pad_batch([torch.tensor(r.ids[prefix_len:]) for r in rows], pad, "right")
        keep, pick = scored_positions(rows, [len(r.ids) - prefix_len for r in rows])
        mask = torch.cat([torch.ones(len(rows), prefix_len, dtype=smask.dtype), smask], dim=1)
        return cls(ids, smask, mask, keep, pick)

    def logits(self, model: LoadedModel, hooks: list, cache: Any) -> Float[Tensor, "n vocab"]:
        """The logits at the positions read, after a copy of the prefix's ``cache``."""
        out = forward(model, self.ids, self.mask, hooks, self.keep, cache=cache_for_rows(cache, self.ids.shape[0]),
                      pick=self.pick)
        return out[0] if isinstance(out, tuple) else out


def _run_grouped(model: LoadedModel, prefix_len: int, rows: list[Row], out: list[float], ablation,
                 batcher: Batcher, pbar, observer: Observer | None = None) -> None:
    pmask = torch.ones(1, prefix_len, dtype=torch.long)
    hooks = ablation.hooks(model, pmask, []) if ablation is not None else []  # it scores no input
    cache = prefix_cache(model, rows[0].ids[:prefix_len], hooks)
    order = sorted(rows, key=lambda r: -len(r.ids))

    def run(batch: Sequence[Row]) -> None:
        sb = SuffixBatch.of(model, batch, prefix_len)
        hooks = ablation.hooks(model, sb.smask, [r.key for r in batch]) if ablation is not None else []
        score_rows(out, batch, sb.logits(model, hooks, cache), observer)
        pbar.update(len(batch))

    batcher.run(order, run, [len(r.ids) - prefix_len for r in order])


def _run_packed(model: LoadedModel, units: list[packing.Unit], out: list[float], ablation, batch_size: int | str,
                pbar, observer: Observer | None = None) -> None:
    """The units packed in rows as long as the longest (``lens_heads.forward.packing``), ``batch_size``
    such rows per forward."""
    pad = model.tokenizer.pad_token_id or 0
    length = max(u.size for u in units)
    batcher = Batcher.for_inputs(batch_size, model, length)

    def run(batch: Sequence[list[packing.Unit]]) -> None:
        p = packing.pack(batch, length, pad)
        hooks = ablation.hooks(model, p.tokens, [r.key for r in p.rows]) if ablation is not None else []
        logits = forward(model, p.ids, p.mask, hooks, p.keep, pick=p.pick, positions=p.positions)
        score_rows(out, p.rows, logits, observer)
        pbar.update(len(p.rows))

    batcher.run(packing.bins(units, length), run)


def loglikelihoods_tokens(
    model: LoadedModel,
    encoded: Sequence[tuple[list[int], list[int]]],
    ablation=None,
    batch_size: int | str = 16,
    progress: bool = True,
    *,
    keys: Sequence[int] | None = None,
    reuse_prefix: bool = True,
    last_only: bool = True,
    min_prefix: int = MIN_PREFIX,
    pack: bool = True,
    observer: Observer | None = None,
    speculation=None,
) -> list[float]:
    """Sum log p(continuation | context) for pre-tokenised ``(context_ids, continuation_ids)``.

    ``reuse_prefix`` / ``last_only`` / ``pack`` switch the speed-ups off (for tests and
    benchmarks); the prefix cache and packing are used only when ``ablation`` is None or
    ``reuses_prefix`` (packing also only with ``last_only``).
    ``batch_size``: rows per forward, or ``"auto"`` (``lens_heads.batching``); ``keys``: one
    ``RowKey`` integer per request (default: its position); ``observer``: see ``score_rows``.
    ``speculation`` (``interventions.speculation.Speculation``; default the ablation's own, if it
    has one): rows that share a prefix run after prefixes it keeps across calls (docs/methods.md
    §2, "Prefixes kept across evaluations, and under a per-input ablation").
    """
    batch_size = parse_batch_size(batch_size)
    keys = list(range(len(encoded))) if keys is None else list(keys)
    if len(keys) != len(encoded):
        raise LensHeadsError(f"got {len(keys)} keys for {len(encoded)} requests")
    rows = build_rows(model, encoded, keys)
    out = [math.nan] * len(encoded)
    use_cache = reuse_prefix and (ablation is None or ablation.reuses_prefix)
    if speculation is None:
        speculation = getattr(ablation, "speculation", None)
    if not (reuse_prefix and last_only):
        speculation = None
    speculative, rows = speculation.split(model, rows) if speculation is not None else ([], rows)
    groups, singles = prefix_groups(rows, min_prefix) if use_cache else ([], rows)
    units: list[packing.Unit] = []
    limit = packed_length_limit(model) if pack and use_cache and last_only else None
    if limit is not None:  # short inputs and small groups packed; large groups keep their cached prefix
        limit = min(limit, PACK_LIMIT, max_length(model))
        large = [(p, g) for p, g in groups if packing.Unit(p, tuple(g)).size > limit]
        cached = {id(r) for _, g in large for r in g}
        units, singles = packing.units(*prefix_groups([r for r in rows if id(r) not in cached], PACK_MIN_PREFIX),
                                       limit)
        groups = large
    batcher = Batcher.for_inputs(batch_size, model, max((len(r.ids) for r in rows), default=1))
    with progress_bar(len(rows) + len(speculative), "log-likelihoods", enabled=progress) as pbar:
        if speculative:  # rows after prefixes kept across calls (interventions.speculation)
            speculation.run(model, ablation, speculative, out, batcher.size, pbar, observer)
        for plen, grp in groups:
            _run_grouped(model, plen, grp, out, ablation, batcher, pbar, observer)
        if units:
            _run_packed(model, units, out, ablation, batch_size, pbar, observer)
        _run_plain(model, singles, out, ablation, batcher, pbar, last_only, observer)
    return out


# -----------------------------------------------------------------------------
# Token negative log-likelihood (perplexity)


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
