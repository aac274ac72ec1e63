"""Packing: short inputs share the rows of a batch (docs/methods.md §4).

A batch of right-padded inputs runs its padding through every linear of every block, and the
choices of one question (PIQA's two solutions, an ARC question's four answers, WinoGrande's
two options after the same shots) run their shared context once per choice. Packed, they
run it once and no padding but at the end of a row:

* a **unit** is one input, or a group of inputs sharing a prefix of tokens: the prefix once,
  then each input's remainder (``Unit``, a tree of depth one);
* units are laid end to end in rows of ``length`` tokens (first fit, longest first: ``bins``);
* a boolean mask [batch, 1, length, length] lets each token see only the earlier tokens of its
  own input -- its remainder's and the prefix's -- and position ids restart in each unit (a
  remainder continues from its prefix's length), so each input reads what it reads alone
  and its logits are the same, to float rounding (``pack``).

The attention kernel computes the whole [length, length] square of each row (the mask is not
causal alone), so packing is for short units (``engine.PACK_LIMIT``); the engine uses it where
the zeroed heads do not depend on the input (``reuses_prefix``) and the model reads a packed batch as
its inputs alone (``hooks.packed_length_limit``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Sequence

import torch
from jaxtyping import Bool, Int
from torch import Tensor

if TYPE_CHECKING:
    from lens_heads.forward.engine import Row


@dataclass(frozen=True)
class Unit:
    """Inputs packed together: ``rows`` share their first ``prefix_len`` tokens (0: one row)."""

    prefix_len: int
    rows: tuple["Row", ...]

    @property
    def size(self) -> int:
        """Tokens it takes in a packed row: the prefix once, then every remainder."""
        return self.prefix_len + sum(len(r.ids) - self.prefix_len for r in self.rows)

    def segments(self) -> list[tuple[list[int], int, "Row | None"]]:
        """Its token spans in order, each ``(ids, first position id, row)``: the prefix (if any,
        row None: it is read by every remainder), then each row's remainder."""
        head = [(list(self.rows[0].ids[:self.prefix_len]), 0, None)] if self.prefix_len else []
        return head + [(list(r.ids[self.prefix_len:]), self.prefix_len, r) for r in self.rows]


def units(groups: Sequence[tuple[int, list["Row"]]], singles: Sequence["Row"], limit: int) -> tuple[list[Unit], list["Row"]]:
    """Units of at most ``limit`` tokens from prefix groups (``engine.prefix_groups``) and the
    other rows: a group too large for one unit is split into consecutive units that each repeat
    the prefix; a unit of one row has no prefix. Rows longer than ``limit`` come back apart."""
    out: list[Unit] = []
    apart: list[Row] = []

    def close(plen: int, chunk: list[Row]) -> None:
        if len(chunk) >= 2:
            out.append(Unit(plen, tuple(chunk)))
        elif chunk:
            out.append(Unit(0, (chunk[0],)))

    for plen, rows in groups:
        chunk: list[Row] = []
        size = plen
        for row in rows:
            if len(row.ids) > limit:
                apart.append(row)
                continue
            rest = len(row.ids) - plen
            if chunk and size + rest > limit:
                close(plen, chunk)
                chunk, size = [], plen
            chunk.append(row)
            size += rest
        close(plen, chunk)
    for row in singles:
        if len(row.ids) <= limit:
            out.append(Unit(0, (row,)))
        else:
            apart.append(row)
    return out, apart


def bins(items: Sequence[Unit], length: int) -> list[list[Unit]]:
    """First fit, longest first: the units in rows of ``length`` tokens (each unit fits one)."""
    rows: list[list[Unit]] = []
    free: list[int] = []
    for unit in sorted(items, key=lambda u: -u.size):
        slot = next((i for i, f in enumerate(free) if f >= unit.size), None)
        if slot is None:
            rows.append([])
            free.append(length)
            slot = len(rows) - 1
        rows[slot].append(unit)
        free[slot] -= unit.size
    return rows


@dataclass
class Packed:
    """One packed batch: ``ids`` / ``positions`` [batch, length], ``mask`` [batch, 1, length,
    length] (True: attend), ``tokens`` [batch, length] (1: a real token, 0: padding at the end),
    and for each row of ``rows`` (in that order) its last ``n_read`` positions as
    (batch row, index into ``keep``) pairs in ``pick`` -- ``engine.scored_positions``' form."""

    ids: Int[Tensor, "batch length"]
    positions: Int[Tensor, "batch length"]
    mask: Bool[Tensor, "batch 1 length length"]
    tokens: Int[Tensor, "batch length"]
    rows: list["Row"]
    keep: Int[Tensor, " keep"]
    pick: Int[Tensor, "n 2"]


def pack(batch: Sequence[list[Unit]], length: int, pad_id: int) -> Packed:
    """The packed batch of ``batch`` (rows of units, ``bins``)."""
    b = len(batch)
    ids = torch.full((b, length), pad_id, dtype=torch.long)
    positions = torch.zeros(b, length, dtype=torch.long)
    # every padding position gets ids of its own (negative), so it sees itself only
    padding = -1 - torch.arange(length).repeat(b, 1)
    owner = padding.clone()  # the unit of each token
    segment = padding.clone()  # the span of each token: a prefix or a remainder
    shared = torch.zeros(b, length, dtype=torch.bool)  # a prefix token (seen by its unit's remainders)
    rows: list[Row] = []
    reads: list[tuple[int, int, int]] = []  # (batch row, end of the input in the packed row, n_read)
    for i, units_ in enumerate(batch):
        at, seg = 0, 0
        for u, unit in enumerate(units_):
            for span, first, row in unit.segments():
                n = len(span)
                ids[i, at:at + n] = torch.tensor(span, dtype=torch.long)
                positions[i, at:at + n] = torch.arange(first, first + n)
                owner[i, at:at + n] = u
                segment[i, at:at + n] = seg
                if row is None:
                    shared[i, at:at + n] = True
                else:
                    rows.append(row)
                    reads.append((i, at + n, row.n_read))
                at, seg = at + n, seg + 1
    causal = torch.ones(length, length, dtype=torch.bool).tril()
    same_unit = owner[:, :, None] == owner[:, None, :]
    sees = (segment[:, :, None] == segment[:, None, :]) | shared[:, None, :]
    mask = (same_unit & sees & causal) | torch.eye(length, dtype=torch.bool)  # padding sees itself (no empty row)
    keep, pick = read_positions(reads)
    return Packed(ids, positions, mask[:, None], (owner >= 0).long(), rows, keep, pick)


def read_positions(reads: Sequence[tuple[int, int, int]]) -> tuple[Int[Tensor, " keep"], Int[Tensor, "n 2"]]:
    """Where a batch is read: ``reads`` lists ``(batch row, end, n)`` per input (it is read at
    the ``n`` positions before ``end`` of that batch row), in order. Returns ``keep``, the sorted
    union of those positions, and ``pick``, the (batch row, index into ``keep``) pair of every
    position read, input after input."""
    spans = [range(end - n, end) for _, end, n in reads]
    keep = sorted({p for span in spans for p in span})
    index = {p: j for j, p in enumerate(keep)}
    pick = [(b, index[p]) for (b, _, _), span in zip(reads, spans) for p in span]
    return torch.tensor(keep), torch.tensor(pick, dtype=torch.long).reshape(-1, 2)
