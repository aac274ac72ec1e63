"""Scoring forwards that run a shared prefix once (docs/methods.md §1, "Prefix sharing").

Few-shot prompts repeat a long prefix: every MMLU question of a subject starts with the same
description and five solved examples (~80 % of its tokens). Per-input scores are reductions over
per-position quantities (head-output norms, first-token weights, row entropies: ``Acts``), and
under causal attention a prefix's positions are the same in every input that starts with it. So
a scoring pass runs each shared prefix once -- keeping its keys/values and its per-position
quantities (``PrefixStats``) -- and then only the suffixes, each reading the cached prefix; the
reductions run over the prefix's positions followed by the suffix's, the same numbers a forward
of the whole input reduces (equal up to float rounding of the split computation:
tests/test_scores.py).

The pass's order (``scoring_segments``) keeps each prefix's inputs together: runs of inputs that
share one prefix (longest prefix first, then its inputs longest first), then the inputs with none
(longest first); a pass's batches (``scoring_batches``: ``batching.batch_bounds`` on each run's
forward lengths) never mix two prefixes, so a batch is one prefix (kept while its run lasts) and
one forward of its suffixes -- a forward of few tokens costs nearly a forward's reading of the
weights, so suffixes of different prefixes are not run apart in one batch. The order is a sort by
a key of each input alone, so any run of a pass's batches, scored alone, forms the same batches
(sharded scoring passes rely on it).

``prefixes`` comes from ``pass_prefixes`` over the whole pass (``engine.shared_prefixes``; none
past the model's sliding window, whose cache drops the prefix's first keys). Only for forwards
that zero nothing: a per-input ablation makes a prefix's positions depend on the rest of the input.
"""

from __future__ import annotations

from collections import OrderedDict
from typing import TYPE_CHECKING, Any, Sequence

import torch
from jaxtyping import Float
from torch import Tensor

from lens_heads.batching import batch_bounds
from lens_heads.data import pad_batch
from lens_heads.forward.engine import cache_for_rows, forward, prefix_cache, shared_prefixes
from lens_heads.models.hooks import attention_window
from lens_heads.scores.collector import PrefixStats, ScoreCollector

if TYPE_CHECKING:
    from lens_heads.models.load import LoadedModel

KEEP_PREFIXES = 2  # cached prefixes kept at once (least recently used goes first; each is ~a forward's K/V)


# A shared prefix runs as a forward of its own and splits the pass's batches at its group's ends;
# it pays where the tokens it saves, (inputs - 1) x its length, outweigh that. A forward's fixed
# cost is ~100 tokens' worth (Qwen2.5-0.5B, fp32, 2 CPU cores: 53 tokens 2.7 s, 552 tokens 11.7 s,
# ~18 ms a token): so not PIQA's or WinoGrande's pairs of options, yes an MMLU subject's questions.
MIN_SAVED_TOKENS = 256


def pass_prefixes(model: LoadedModel, seqs: Sequence[Tensor]) -> list[int]:
    """Per input, the length of the prefix a scoring pass over ``seqs`` runs once for it (0: none):
    ``engine.shared_prefixes``, where the group saves ``MIN_SAVED_TOKENS`` or more, and not past
    the model's sliding window (whose cache drops the prefix's first keys)."""
    window = attention_window(model)
    lengths = [0 if window is not None and len(x) > window else n for x, n in zip(seqs, shared_prefixes(seqs))]
    groups: dict[tuple[int, ...], int] = {}
    for x, n in zip(seqs, lengths):
        if n:
            key = tuple(x[:n].tolist())
            groups[key] = groups.get(key, 0) + 1
    return [n if n and (groups[tuple(x[:n].tolist())] - 1) * n >= MIN_SAVED_TOKENS else 0
            for x, n in zip(seqs, lengths)]


def scoring_segments(seqs: Sequence[Tensor], prefixes: Sequence[int]) -> list[tuple[list[int], list[int]]]:
    """The pass's order as runs of inputs (positions in ``seqs``) that share one prefix, each with
    the lengths its forwards run (the suffixes'); without any prefix, one run longest first."""
    def key(i: int) -> tuple:
        p = prefixes[i]
        return (p == 0, -p, tuple(seqs[i][:p].tolist()), -len(seqs[i]))
    segments: list[tuple[list[int], list[int]]] = []
    last = None
    for i in sorted(range(len(seqs)), key=key):  # stable: a subset keeps the pass's relative order
        run = key(i)[:3]
        if run != last:
            segments.append(([], []))
            last = run
        segments[-1][0].append(i)
        segments[-1][1].append(len(seqs[i]) - prefixes[i])
    return segments


def scoring_batches(seqs: Sequence[Tensor], prefixes: Sequence[int], batch_size: int,
                    floor: int | None) -> list[list[int]]:
    """The batches (positions in ``seqs``) a scoring pass runs, in order."""
    out = []
    for items, lengths in scoring_segments(seqs, prefixes):
        bounds = batch_bounds(lengths, batch_size, floor)
        out += [items[a:b] for a, b in zip(bounds, bounds[1:])]
    return out


class PrefixedScoring:
    """The scoring forwards of a pass over ``seqs`` (1-D token tensors) where input ``i``
    shares its first ``prefixes[i]`` tokens with others (0: none). A batch of the pass's
    (``scoring_batches``) is one forward; any other batch, one per prefix it holds."""

    def __init__(self, model: LoadedModel, collector: ScoreCollector, seqs: Sequence[Tensor],
                 prefixes: Sequence[int]):
        self.model, self.collector, self.seqs, self.prefixes = model, collector, seqs, list(prefixes)
        self.pad = model.tokenizer.pad_token_id or 0
        self._cached: OrderedDict[tuple[int, ...], tuple[PrefixStats, Any]] = OrderedDict()
        self.prefix_forwards = 0  # prefixes run (a prefix evicted and needed again counts twice)

    def batch_scores(self, idx: Sequence[int]) -> dict[str, Float[Tensor, "batch layer head"]]:
        """The scores of inputs ``idx`` (on the CPU, in ``idx``'s order)."""
        parts: dict[tuple[int, ...], list[int]] = {}  # prefix tokens (() none) -> rows of idx
        for j, i in enumerate(idx):
            parts.setdefault(tuple(self.seqs[i][:self.prefixes[i]].tolist()), []).append(j)
        out: dict[str, Tensor] = {}
        for prefix, rows in parts.items():
            inputs = [self.seqs[idx[j]] for j in rows]
            scores = self._plain(inputs) if not prefix else self._after(prefix, inputs)
            for sid, v in scores.items():
                if sid not in out:
                    out[sid] = torch.empty((len(idx), *v.shape[1:]), dtype=v.dtype)
                out[sid][rows] = v.cpu()
        return out

    def _plain(self, inputs: list[Tensor]) -> dict[str, Tensor]:
        ids, mask = pad_batch(inputs, self.pad, "right")  # [b, T]
        forward(self.model, ids, mask, self.collector.hooks(mask), logits=False)
        return self.collector.batch_scores()

    def _after(self, prefix: tuple[int, ...], inputs: list[Tensor]) -> dict[str, Tensor]:
        stats, kv = self._prefix(prefix)
        ids, smask = pad_batch([x[stats.length:] for x in inputs], self.pad, "right")  # suffixes [b, S]
        mask = torch.cat([torch.ones(len(inputs), stats.length, dtype=smask.dtype), smask], dim=1)  # [b, P + S]
        forward(self.model, ids, mask, self.collector.hooks(smask, prefix=stats), torch.tensor([ids.shape[1] - 1]),
                cache=cache_for_rows(kv, len(inputs)), pick=torch.zeros(0, 2, dtype=torch.long))  # the LM head on no row
        return self.collector.batch_scores()

    def _prefix(self, prefix: tuple[int, ...]) -> tuple[PrefixStats, Any]:
        if prefix in self._cached:
            self._cached.move_to_end(prefix)
            return self._cached[prefix]
        stats = PrefixStats(len(prefix))
        kv = prefix_cache(self.model, prefix, self.collector.hooks(torch.ones(1, len(prefix), dtype=torch.long),
                                                                    record=stats))
        self.prefix_forwards += 1
        self._cached[prefix] = (stats, kv)
        while len(self._cached) > KEEP_PREFIXES:
            self._cached.popitem(last=False)
        return stats, kv
