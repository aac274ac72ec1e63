"""Shared prefixes kept across evaluations; under a per-input score ablation, by speculation
(docs/methods.md §2, "Prefixes kept across evaluations, and under a per-input ablation").

A per-input score ablation (``ScoreAblation``) zeroes, at each layer L, the heads whose score on
the whole input crosses its threshold. The scores at L reduce over every position, the shared
prefix's too, and the prefix's positions at L depend on what was zeroed at layers < L. So the
prefix an input reads is the prefix computed under *that input's* mask: no one prefix serves
every input of a subject, as it does for a forward that zeroes nothing (``engine.prefix_cache``).
But the prefix dominates the scores (~80 % of an MMLU prompt's tokens), so inputs of one subject
often realise the same mask, and a prefix computed under a mask serves every input that realises
it.

``Speculation`` keeps, per shared prefix, the prefix as computed under each mask seen so far (an
``Entry``: its K/V cache and per-position score quantities, ``PrefixStats``). An input of that
prefix runs only its suffix after an entry (the most used one first). Its forward decides its own
mask layer by layer, exactly as a forward of the whole input does, reading the entry's prefix:

* if the mask it realises is the entry's at every layer, every prefix position it read is the one
  its own whole forward computes (by induction over layers: the decision at layer L reads only
  what layers < L did, and those agree), so its logits stand -- equal to a whole forward's up to
  the rounding of a split computation (tests/test_speculation.py);
* otherwise its mask is right up to the first layer k where the two part (the same induction),
  and so is everything its suffix forward computed below k: its residual stream entering block k
  is its whole forward's there. The input *resumes* at k (``hooks.resumed_at``): the whole input
  through blocks k.., entering with the entry's prefix residual stream (kept per block) and its
  suffix's -- its whole forward's result, counted with the entry's mask below k and its own from
  k. A suffix forward whose every row has parted stops there.

A whole forward of one input leaves its prefix behind as a new entry: its K/V cache cropped to the
prefix, its recorded per-position quantities cut (``PrefixStats.cut``), the residual stream
entering each block. A try costs the suffix's forward and the resumed blocks, and saves the blocks
below k of the prefix; it is made only where it pays on the prefix's record so far
(``Speculation._worth``: the mean share of layers its tries agreed on).

Entries live as long as the ``Speculation`` (one ablation: one threshold, one model): across
evaluations, so the questions of a subject that an adaptive search reads batch after batch share
them. They are bounded by ``max_bytes`` (least recently used first out).

An ablation that zeroes the same heads on every input (none, static) needs no speculation: one
entry per prefix serves every input (``_run_constant``), the cross-call form of the engine's
cached prefix -- what a sweep's unablated and static points use. Under a per-input ablation it is
opt-in (``ScoreAblation.speculation``); measured on MMLU in ``benchmarks/results/bench_speculation.md``
and ``bench_mask_divergence.md``.
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Iterator, Sequence

import torch
from jaxtyping import Bool, Float
from torch import Tensor

from lens_heads.forward.engine import Observer, Row, SuffixBatch, forward, prefix_cache, score_rows, scored_positions
from lens_heads.models.hooks import hook_name, layer_of, resumed_at
from lens_heads.scores.collector import PrefixStats
from lens_heads.scores.shared_prefix import pass_prefixes

if TYPE_CHECKING:
    from lens_heads.models.load import LoadedModel

# What a forward costs beyond its tokens, in tokens: the weights are read whatever the rows.
# Measured on Qwen2.5-0.5B models in fp32 on 2 CPU cores: 53 tokens 2.7 s against 552 tokens 11.7 s
# (~100 tokens' worth); one MMLU question a forward, its 66-token suffix after a kept prefix 4.0 CPU s
# against 10.7 s for the whole 445-token input (~160, on cores shared with other work).
FIXED_TOKENS = 150
MAX_BYTES = 2 << 30  # entries kept per ablation (K/V, quantities, residual streams); Qwen2.5-0.5B, a 500-token
# prefix: ~12 MB of K/V, ~43 MB of residual streams (a per-input ablation's entries only)


class _AllParted(Exception):
    """Raised inside a speculative forward once every row's mask has parted from its entry's:
    the rest of the forward would be discarded."""


def population_prefixes(model: LoadedModel, seqs: Sequence[Tensor]) -> dict[tuple[int, ...], int]:
    """Input -> the length of the prefix it shares, over ``seqs`` (every input an evaluation may
    run): ``scores.shared_prefix.pass_prefixes``, what a scoring pass over them shares."""
    return {tuple(x.tolist()): p for x, p in zip(seqs, pass_prefixes(model, seqs)) if p}


@dataclass
class Entry:
    """A shared prefix computed under one mask (``mask``: [layer, head], True = zeroed; None and no
    ``stats`` under an ablation that zeroes the same heads on every input)."""

    mask: Bool[Tensor, "layer head"] | None
    stats: PrefixStats | None
    kv: Any
    nbytes: int
    hits: float = 0.0  # inputs served, a resumed one by the share of layers it read from here
    resid: Float[Tensor, "layer pos d_model"] | None = None  # the residual stream entering each block


@dataclass
class _Pending:
    row: Row
    prefix: tuple[int, ...]


@dataclass
class SpeculationCounts:
    """What the speculation did: inputs accepted after a cached prefix, inputs whose mask parted
    from their entry's (each resumed at the layer where it did), inputs run whole, and the prefix
    tokens not run (a resumed input's prefix counted by the share of layers it read)."""

    accepted: int = 0
    rejected: int = 0
    whole: int = 0
    tokens_saved: float = 0.0


class Speculation:
    """The prefixes kept for one ablation: per mask under a per-input score ablation, one per
    prefix under an ablation that zeroes the same heads everywhere (see the module docstring)."""

    def __init__(self, max_bytes: int = MAX_BYTES, fixed_tokens: int = FIXED_TOKENS):
        self.max_bytes, self.fixed_tokens = int(max_bytes), int(fixed_tokens)
        self._entries: OrderedDict[int, tuple[tuple[int, ...], Entry]] = OrderedDict()  # id -> (prefix, entry), LRU
        self._by_prefix: dict[tuple[int, ...], list[int]] = {}
        self._next = 0
        self._bytes = 0
        self._model: int | None = None
        self._population: dict[tuple[int, ...], int] | None = None
        self._record: dict[tuple[int, ...], tuple[float, int]] = {}  # prefix -> (layers agreed / L, summed; tries)
        self.counts = SpeculationCounts()

    # --- which prefix an input shares -----------------------------------------------------------
    def set_population(self, prefixes: dict[tuple[int, ...], int]) -> None:
        """Take each input's shared prefix from ``prefixes`` (``population_prefixes``: over every
        input an evaluation may run) instead of from each evaluation's own inputs: a batch of an
        adaptive search holds ~one question of a subject, the population all of them."""
        self._population = prefixes

    def split(self, model: LoadedModel, rows: list[Row]) -> tuple[list[_Pending], list[Row]]:
        """``rows`` that share a prefix (to ``run``), and the rest."""
        if self._population is not None:
            lengths = [self._population.get(tuple(r.ids), 0) for r in rows]
        else:
            lengths = pass_prefixes(model, [torch.tensor(r.ids) for r in rows])
        shared, rest = [], []
        for r, p in zip(rows, lengths):
            if p and len(r.ids) - p >= r.n_read:
                shared.append(_Pending(r, tuple(r.ids[:p])))
            else:
                rest.append(r)
        return shared, rest

    # --- the forwards -----------------------------------------------------------------------------
    def run(self, model: LoadedModel, ablation, pending: list[_Pending], out: list[float], batch_size: int,
            pbar, observer: Observer | None = None) -> None:
        """Fill ``out`` for the requests of ``pending`` (from ``split``)."""
        if self._model != id(model):
            self.clear()
            self._model = id(model)
        if ablation is None or ablation.reuses_prefix:
            self._run_constant(model, ablation, pending, out, batch_size, pbar, observer)
            return
        ran: set[tuple[int, ...]] = set()  # prefixes one of these inputs ran whole
        while pending:
            # whole: inputs out of tries or without a fitting entry, and one input of each prefix
            # that has no entry yet (the others wait for the entry it leaves)
            whole, rest = [], []
            starting: set[tuple[int, ...]] = set()  # prefixes with no entry yet that one input runs whole now
            for p in pending:
                if self._candidate(p) is not None:
                    rest.append(p)
                elif p.prefix in ran or self._by_prefix.get(p.prefix) or p.prefix not in starting:
                    starting.add(p.prefix)
                    whole.append(p)
                else:
                    rest.append(p)
            for p in whole:
                self._whole(model, ablation, p, out, pbar, observer)
                ran.add(p.prefix)
            plan: dict[int, list[_Pending]] = {}
            for p in rest:
                e = self._candidate(p)
                if e is None:  # its prefix left no entry (a cache that cannot be cropped): whole
                    self._whole(model, ablation, p, out, pbar, observer)
                else:
                    plan.setdefault(e, []).append(p)
            pending = []
            for eid, items in plan.items():
                for i in range(0, len(items), batch_size):
                    pending += self._speculate(model, ablation, eid, items[i:i + batch_size], out, pbar, observer)

    def _run_constant(self, model: LoadedModel, ablation, pending: list[_Pending], out: list[float],
                      batch_size: int, pbar, observer: Observer | None) -> None:
        """An ablation whose zeroed set is the same on every input (none, static): one entry per
        prefix, computed alone, and every suffix kept (``engine.prefix_cache``'s reuse, across
        evaluations)."""
        groups: dict[tuple[int, ...], list[Row]] = {}
        for p in pending:
            groups.setdefault(p.prefix, []).append(p.row)
        for prefix, rows in groups.items():
            if not self._by_prefix.get(prefix):
                pmask = torch.ones(1, len(prefix), dtype=torch.long)
                kv = prefix_cache(model, prefix, ablation.hooks(model, pmask, []) if ablation is not None else [])
                _compact(kv)
                self._add(prefix, Entry(None, None, kv, 0))
            eid = self._by_prefix[prefix][0]
            self._entries.move_to_end(eid)
            e = self._entries[eid][1]
            P = len(prefix)
            for i in range(0, len(rows), batch_size):
                batch = rows[i:i + batch_size]
                sb = SuffixBatch.of(model, batch, P)
                hooks = ablation.hooks(model, sb.smask, [r.key for r in batch]) if ablation is not None else []
                score_rows(out, batch, sb.logits(model, hooks, e.kv), observer)
                pbar.update(len(batch))
            e.hits += len(rows)
            self.counts.accepted += len(rows)
            self.counts.tokens_saved += P * len(rows)

    def _candidate(self, p: _Pending) -> int | None:
        if not self._worth(p):
            return None
        ids = self._by_prefix.get(p.prefix, [])
        return max(ids, key=lambda i: self._entries[i][1].hits, default=None)

    def _worth(self, p: _Pending) -> bool:
        """Whether trying an entry pays, on this prefix's record. A forward costs its tokens plus
        a fixed ``fixed_tokens`` (F), spread over its blocks. A try runs the suffix after the entry
        (at most S + F) and, where the input's mask parts from the entry's at layer k of L, resumes
        there: the whole input through the blocks from k, (1 - k/L)(P + S + F). Against the whole
        forward's P + S + F it saves a(P + S + F) - (S + F), a = k/L (1 when kept): it pays when
        a > (S + F) / (P + S + F). a is the prefix's mean over its tries so far, (sum + 1) /
        (tries + 2): a prefix whose inputs part early soon runs them whole."""
        agreed, tries = self._record.get(p.prefix, (0.0, 0))
        P, S, F = len(p.prefix), len(p.row.ids) - len(p.prefix), self.fixed_tokens
        return (agreed + 1) / (tries + 2) > (S + F) / (P + S + F)

    def _speculate(self, model: LoadedModel, ablation, eid: int, items: list[_Pending], out: list[float], pbar,
                   observer: Observer | None) -> list[_Pending]:
        """The suffixes of ``items`` after entry ``eid``: each input whose mask is the entry's at
        every layer keeps its result; one whose mask parts at layer k resumes there (``_resume``),
        and the forward stops at the layer where the last of them parts. Returns the items to
        place again (their entry evicted since it was chosen)."""
        if eid not in self._entries:  # evicted by an entry made since it was chosen: choose again
            return items
        self._entries.move_to_end(eid)
        prefix, e = self._entries[eid]
        rows = [p.row for p in items]
        P, L = e.stats.length, e.mask.shape[0]
        sb = SuffixBatch.of(model, rows, P)
        parted: dict[int, tuple[int, Tensor]] = {}  # row -> (layer where its mask parts, its suffix's residual there)
        entering: dict[int, Tensor] = {}  # layer -> the suffixes' residual stream entering it (this forward)
        logits = None
        with ablation.counted_apart() as realised:

            def enter(x: Tensor, hook) -> Tensor:
                entering[layer_of(hook)] = x
                return x

            def check(z: Tensor, hook) -> Tensor:  # after the ablation's own hook: the layer's mask is decided
                layer = layer_of(hook)
                differs = (realised.last_zeroed[:, layer] != e.mask[layer]).any(-1)
                for b in differs.nonzero().flatten().tolist():
                    if b not in parted:
                        parted[b] = (layer, entering[layer][b, :len(rows[b].ids) - P].clone())
                if len(parted) == len(rows):
                    raise _AllParted
                return z

            hooks = ablation.hooks(model, sb.smask, [r.key for r in rows], prefix=e.stats)
            hooks += [(hook_name("resid_pre", k), enter) for k in range(L)]
            hooks += [(hook_name("z", k), check) for k in range(L)]
            try:
                logits = sb.logits(model, hooks, e.kv)  # [sum of n_read, vocab]
            except _AllParted:
                pass
        accepted = [b for b in range(len(rows)) if b not in parted]
        ablation.counts.take(realised, accepted)
        if accepted:
            starts = torch.tensor([0] + [r.n_read for r in rows]).cumsum(0)
            at = torch.cat([torch.arange(int(starts[b]), int(starts[b + 1])) for b in accepted])
            score_rows(out, [rows[b] for b in accepted], logits[at], observer)
            pbar.update(len(accepted))
        agreed = len(accepted) + sum(k / L for k, _ in parted.values())
        e.hits += agreed
        done, tries = self._record.get(prefix, (0.0, 0))
        self._record[prefix] = (done + agreed, tries + len(rows))
        self.counts.accepted += len(accepted)
        self.counts.rejected += len(parted)
        self.counts.tokens_saved += P * agreed
        for b, (k, resid) in sorted(parted.items()):
            self._resume(model, ablation, e, k, resid, items[b], out, pbar, observer)
        return []

    def _resume(self, model: LoadedModel, ablation, e: Entry, layer: int, suffix: Float[Tensor, "suffix d_model"],
                p: _Pending, out: list[float], pbar, observer: Observer | None) -> None:
        """One input whose mask parts from entry ``e``'s at ``layer``: its whole forward from that
        block on (``hooks.resumed_at``), entering it with the entry's prefix residual stream and
        ``suffix``'s. Below ``layer`` its mask is the entry's, and what it read there is what its
        own whole forward computes (the same induction): so is everything after. Counted with the
        entry's mask below ``layer`` and its own from there."""
        row = p.row
        ids = torch.tensor(row.ids)[None]
        mask = torch.ones_like(ids)
        keep, pick = scored_positions([row], [len(row.ids)])
        resid = torch.cat([e.resid[layer], suffix])[None]  # [1, P + S, d_model]
        with ablation.counted_apart() as own:
            hooks = ablation.hooks(model, mask, [row.key])
            with resumed_at(model, layer, resid) as put:
                out_ = forward(model, ids, mask, hooks + put, keep, pick=pick)
        logits = out_[0] if isinstance(out_, tuple) else out_
        ablation.counts.take_row(torch.cat([e.mask[:layer], own.last_zeroed[0, layer:]]), own._units_per_row)
        score_rows(out, [row], logits, observer)
        pbar.update(1)

    def _whole(self, model: LoadedModel, ablation, p: _Pending, out: list[float], pbar,
               observer: Observer | None) -> None:
        """One input's whole forward (counted as any forward of the ablation); its prefix, under
        the mask it realised, becomes an entry, with the residual stream entering each block."""
        row = p.row
        P = len(p.prefix)
        ids = torch.tensor(row.ids)[None]
        mask = torch.ones_like(ids)
        keep, pick = scored_positions([row], [len(row.ids)])
        stats = PrefixStats(len(row.ids))
        entering: dict[int, Tensor] = {}

        def enter(x: Tensor, hook) -> Tensor:
            entering[layer_of(hook)] = x[0, :P].clone()
            return x

        hooks = ablation.hooks(model, mask, [row.key], record=stats)
        hooks += [(hook_name("resid_pre", k), enter) for k in range(model.geometry.n_layers)]
        logits, kv = forward(model, ids, mask, hooks, keep, want_cache=True, pick=pick)
        score_rows(out, [row], logits, observer)
        pbar.update(1)
        self.counts.whole += 1
        if kv is None or not getattr(kv, "is_croppable", True):
            return
        kv.crop(P - len(row.ids))  # negative: tokens to remove (transformers' crop, old and new)
        _compact(kv)
        resid = torch.stack([entering[k] for k in range(model.geometry.n_layers)])
        self._add(p.prefix, Entry(ablation.counts.last_zeroed[0].clone(), stats.cut(P), kv, 0, resid=resid))

    # --- the entries ------------------------------------------------------------------------------
    def _add(self, prefix: tuple[int, ...], e: Entry) -> None:
        e.nbytes = _cache_nbytes(e.kv) + (e.stats.nbytes() if e.stats is not None else 0) + \
            (e.resid.nbytes if e.resid is not None else 0)
        eid, self._next = self._next, self._next + 1
        self._entries[eid] = (prefix, e)
        self._by_prefix.setdefault(prefix, []).append(eid)
        self._bytes += e.nbytes
        while self._bytes > self.max_bytes and len(self._entries) > 1:
            old, (pre, gone) = self._entries.popitem(last=False)
            self._by_prefix[pre].remove(old)
            self._bytes -= gone.nbytes

    def clear(self) -> None:
        self._entries.clear()
        self._by_prefix.clear()
        self._record.clear()
        self._bytes = 0

    @property
    def n_entries(self) -> int:
        return len(self._entries)


def _cache_tensors(kv: Any) -> Iterator[tuple[Any, str, Tensor]]:
    """(layer, "keys" / "values", tensor) of each layer of a K/V cache (transformers' ``layers``)."""
    for layer in getattr(kv, "layers", []):
        for name in ("keys", "values"):
            t = getattr(layer, name, None)
            if isinstance(t, Tensor):
                yield layer, name, t


def _compact(kv: Any) -> None:
    """A cropped cache's tensors as copies of their kept positions (a crop keeps views of the whole)."""
    for layer, name, t in list(_cache_tensors(kv)):
        setattr(layer, name, t.clone())


def _cache_nbytes(kv: Any) -> int:
    """Bytes of a K/V cache's tensors as kept (a cropped layer counts its kept positions)."""
    return sum(t.numel() * t.element_size() for _, _, t in _cache_tensors(kv))
