"""What a score function is, and the registry of them (docs/methods.md §1).

``Acts`` is what a score function sees: one layer's activation at one hook plus memoised
reductions of it (norms, first-token gathers, masked means), shared by every function that
reads the same hook. ``ScoreFn`` + ``register_score`` form the name-keyed registry ``SCORES``;
the paper's twelve functions and the extras are defined at the end of the registry section.
Adding a score function is one ``base(...)`` or ``derived(...)`` call there.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Literal, Sequence

import torch
from jaxtyping import Float, Int
from torch import Tensor

from lens_heads.models.attention import RowStats
from lens_heads.errors import LensHeadsError
from lens_heads.models.hooks import HookKind
from lens_heads.registry import Registry

# -----------------------------------------------------------------------------
# What a score function sees: one hook's activation plus memoised reductions of it


# The per-position quantities ``Acts`` keeps for a cached prefix (``PrefixStats``), each with its
# position axis: [batch, head, query] for the pattern's rows, [batch, pos, unit] for norms.
POSITION_AXIS: dict[str, int] = {"first_weight": -1, "entropy": -1, "local_mass": -1, "norms": 1, "out_norms": 1}


class Acts:
    """One layer's activation at one hook, with the batch's padding geometry.

    Derived quantities (norms, gathers) are computed on first use and shared by every
    score function reading the same hook, so each hook does the expensive work once.
    """

    def __init__(self, kind: HookKind, x: Tensor, batch: "BatchGeometry", layer: int,
                 gram: Callable[[int, torch.device], Tensor], group_size: int,
                 prefix: dict[str, Tensor] | None = None, record: dict[str, Tensor] | None = None):
        self.kind, self.x, self.batch, self.layer = kind, x, batch, layer
        self._gram, self._group = gram, group_size
        self._memo: dict[str, object] = {}
        self._prefix, self._record = prefix, record

    def _cached(self, key: str, make: Callable[[], object]):
        if key not in self._memo:
            self._memo[key] = make()
        return self._memo[key]

    def _positional(self, key: str, make: Callable[[], Tensor]) -> Tensor:
        """A per-position quantity (``POSITION_AXIS[key]``: its position axis), memoised. After a cached
        prefix (``prefix``: the same quantities of the prefix's positions, [1, ...], recorded by
        its own forward into ``record``) it is the prefix's values followed by this forward's,
        so every reduction below runs over the whole input (``ScoreCollector``, prefix sharing)."""
        def full() -> Tensor:
            own = make()
            if self._record is not None:
                self._record[key] = own
            if self._prefix is None:
                return own
            before = self._prefix[key].to(own.device)
            return torch.cat([before.expand(own.shape[0], *before.shape[1:]), own], dim=POSITION_AXIS[key])
        return self._cached(key, full)

    # --- row statistics (``attention.RowStats``) or a pattern [batch, head, q, k] --------
    def _rows(self) -> RowStats:
        """The per-row statistics: given (``rows``), or reduced from the pattern once."""
        if self.kind == "rows":
            return self.x
        return self._cached("rows", lambda: RowStats.from_pattern(self.x, self.batch.first))

    def attn_on_first(self) -> Float[Tensor, "batch head q"]:
        """A[t, first] for every query row t (float32)."""
        return self._positional("first_weight", lambda: self._rows().first_weight)

    def row_entropy(self) -> Float[Tensor, "batch head q"]:
        """-sum_j A[t, j] ln A[t, j] per query row (float32)."""
        return self._positional("entropy", lambda: self._rows().entropy)

    def local_mass(self) -> Float[Tensor, "batch head q"]:
        """sum_{j=t-2..t} A[t, j] for every query row t (float32)."""
        return self._positional("local_mass", lambda: self._rows().local_mass)

    # --- v [batch, pos, kv_head, d_head] and z [batch, pos, head, d_head] --------------
    def norms(self) -> Float[Tensor, "batch pos unit"]:
        """L2 norm over d_head of every position's vector (float32)."""
        return self._positional("norms", lambda: torch.linalg.vector_norm(self.x, dim=-1, dtype=torch.float32))

    def out_norms(self) -> Float[Tensor, "batch pos head"]:
        """||z_t W_O^h|| via the Gram trick: sqrt(z (W_O^h W_O^hT) z^T) (float32)."""
        def make() -> Tensor:
            z = self.x.float()
            zg = torch.einsum("bphd,hde->bphe", z, self._gram(self.layer, z.device))
            return (zg * z).sum(-1).clamp_min_(0).sqrt_()
        return self._positional("out_norms", make)

    # --- reductions ---------------------------------------------------------------------
    def mean_over_queries(self, x: Float[Tensor, "batch head q"]) -> Float[Tensor, "batch head"]:
        return (x * self.batch.maskf[:, None, :]).sum(-1) / self.batch.n[:, None]

    def mean_over_positions(self, x: Float[Tensor, "batch pos unit"]) -> Float[Tensor, "batch unit"]:
        return (x * self.batch.maskf[:, :, None]).sum(1) / self.batch.n[:, None]

    def at_first(self, x: Float[Tensor, "batch pos unit"]) -> Float[Tensor, "batch unit"]:
        return x[self.batch.rows, self.batch.first]

    def at_last(self, x: Float[Tensor, "batch pos unit"]) -> Float[Tensor, "batch unit"]:
        return x[self.batch.rows, self.batch.last]

    def to_query_heads(self, x: Float[Tensor, "batch kv_head"]) -> Float[Tensor, "batch head"]:
        """Repeat KV-head values over the query heads of each group (GQA)."""
        return x if self._group == 1 else x.repeat_interleave(self._group, dim=-1)


@dataclass
class BatchGeometry:
    """Where the real tokens of each row are (contiguous runs; left or right padding)."""

    maskf: Float[Tensor, "batch pos"]
    n: Float[Tensor, " batch"]
    first: Int[Tensor, " batch"]
    last: Int[Tensor, " batch"]
    rows: Int[Tensor, " batch"]
    first_is_zero: bool

    @classmethod
    def from_mask(cls, mask: Int[Tensor, "batch pos"], device) -> "BatchGeometry":
        mask = mask.to(device)
        real = mask != 0
        n_real = real.sum(-1)
        if bool((n_real == 0).any()):
            raise LensHeadsError("a batch row has no real tokens (empty input)")
        T = mask.shape[1]
        first = real.int().argmax(-1)
        last = T - 1 - real.flip(-1).int().argmax(-1)
        if bool(((last - first + 1) != n_real).any()):
            raise LensHeadsError("attention_mask must mark one contiguous run of real tokens per row")
        return cls(real.float(), n_real.float(), first, last, torch.arange(mask.shape[0], device=device),
                   bool((first == 0).all()))

    def to(self, device) -> "BatchGeometry":
        """The same on ``device`` (the layers of a model sharded across devices)."""
        return BatchGeometry(self.maskf.to(device), self.n.to(device), self.first.to(device), self.last.to(device),
                             self.rows.to(device), self.first_is_zero)


# -----------------------------------------------------------------------------
# Registry


@dataclass(frozen=True)
class ScoreFn:
    """One per-head score, and what it needs.

    An *input-level* score is computed per input from one forward's hooks: either a *base*
    score, ``compute(acts) -> [batch, head]`` at the single hook it reads, or a *derived* score,
    ``combine({dep_id: [batch, head]}) -> [batch, head]`` from other scores of the same layer
    (``needs``); a derived score's ``reads`` is the union of its dependencies'. Such a score can
    zero heads in the very forward it is read in.

    A *question-level* score (``level="question"``) is computed per question of a task, in a
    pass of its own before the forwards it ablates: ``table(model, task, records, n_shot, seed,
    replacement, protocol, progress)`` gives ``{doc_id: [layer, head] signed values}`` (the
    score is their magnitude), ``on_task(model, task, n_shot, limit, seed, replacement,
    progress, protocol)`` its ``HeadScores``. The flags say what that pass needs; keys,
    executors, config checks and the CLI read them, never the score's name.
    """

    id: str
    reads: tuple[HookKind, ...]
    inactive_when: Literal["high", "low"]
    description: str
    compute: Callable[[Acts], Tensor] | None = None
    needs: tuple[str, ...] = ()
    combine: Callable[[dict[str, Tensor]], Tensor] | None = None
    # Bumped when a definition changes, so results stored under the old one are never reused
    # (``revision_key``); 1 for every function that kept its first definition.
    revision: int = 1
    # What the score needs (docs/methods.md §1):
    level: Literal["input", "question"] = "input"
    needs_task: bool = False  # a task with gold answers (not a corpus; not lm-eval's bare requests)
    gradient: bool = False  # a backward pass
    shardable: bool = True  # the executors' scoring shards can split its pass
    replacement_dependent: bool = False  # its values depend on what ablated heads become (part of its keys)
    replacements: tuple[str, ...] | None = None  # the replacement kinds it takes (None: any)
    table: Callable | None = None  # level "question": per-question signed values (class docstring)
    on_task: Callable | None = None  # level "question": its HeadScores on a task

    def __post_init__(self):
        if self.inactive_when not in ("high", "low"):
            raise ValueError(f"inactive_when must be 'high' or 'low', got {self.inactive_when!r}")
        if self.level == "question":
            if self.table is None or self.on_task is None or self.compute is not None or self.combine is not None:
                raise ValueError(f"question-level score {self.id!r}: give table= and on_task=, not compute/combine")
            return
        if (self.compute is None) == (self.combine is None):
            raise ValueError(f"score {self.id!r}: give exactly one of compute= or combine=")
        if self.compute is not None and len(self.reads) != 1:
            raise ValueError(f"base score {self.id!r} must read exactly one hook kind")


SCORES: Registry[ScoreFn] = Registry("score")
"""Every score function by id (``"ahon_ln"``, ``"awft"``, ...): the paper's twelve (``"paper"``)
and the extras, each a ``ScoreFn`` that says what it reads and whether low or high values mean
inactive (docs/methods.md §1). ``score_heads(model, inputs, scores=...)`` takes these ids."""


def input_level(ids: Sequence[str] | None = None) -> list[str]:
    """The registered ids (of ``ids``, in order) read from one forward's hooks, per input."""
    return [s for s in (SCORES if ids is None else ids) if s in SCORES and SCORES[s].level == "input"]


def question_level(ids: Sequence[str]) -> list[str]:
    """The ids of ``ids`` that are question-level scores (computed on a task, before the forwards)."""
    return [s for s in ids if s in SCORES and SCORES[s].level == "question"]


def register_score(fn: ScoreFn) -> ScoreFn:
    for dep in fn.needs:
        if dep not in SCORES:
            raise ValueError(f"score {fn.id!r} needs unknown score {dep!r}")
    SCORES.register(fn.id, fn)
    return fn


def base(id: str, reads: HookKind, inactive_when: str, description: str,
         compute: Callable[[Acts], Tensor]) -> ScoreFn:
    return register_score(ScoreFn(id, (reads,), inactive_when, description, compute=compute))


def derived(id: str, needs: Sequence[str], combine: Callable[[dict[str, Tensor]], Tensor],
            description: str, inactive_when: str | None = None, revision: int = 1) -> ScoreFn:
    deps = [SCORES[d] for d in needs]
    reads = tuple(k for k in ("pattern", "rows", "v", "z") if any(k in d.reads for d in deps))
    return register_score(ScoreFn(id, reads, inactive_when or deps[0].inactive_when, description,
                                  needs=tuple(needs), combine=combine, revision=revision))


def _layer_mean(x: Float[Tensor, "batch head"]) -> Float[Tensor, "batch 1"]:
    return x.mean(-1, keepdim=True)


def layer_normalised(base_id: str) -> ScoreFn:
    """``<id>_ln``: the score divided by its mean over all heads of the layer (same input)."""
    return derived(f"{base_id}_ln", [base_id], lambda s: s[base_id] / _layer_mean(s[base_id]),
                   f"{base_id} / mean of {base_id} over the layer's heads")


base("awft", "rows", "high", "avg attention weight on the first token",
     lambda a: a.mean_over_queries(a.attn_on_first()))
base("aeqd", "rows", "low", "avg entropy of the query distributions",
     lambda a: a.mean_over_queries(a.row_entropy()))
base("ftvvn", "v", "low", "first-token value vector norm",
     lambda a: a.to_query_heads(a.at_first(a.norms())))
base("avvn", "v", "low", "avg value vector norm",
     lambda a: a.to_query_heads(a.mean_over_positions(a.norms())))
base("lthon", "z", "low", "last-token head output norm (before W_O)",
     lambda a: a.at_last(a.norms()))
base("ahon", "z", "low", "avg head output norm (before W_O)",
     lambda a: a.mean_over_positions(a.norms()))
for _id in ("awft", "aeqd", "ftvvn", "avvn"):
    layer_normalised(_id)
# LTHON(LN) as the authors' code computes it (and so the paper's tables): the last-token norm
# over the layer's mean of the *token-averaged* output norm (AHON), not of LTHON itself.
# Revision 2: until 2 Dec 2026 ``lthon_ln`` was the text's reading, now ``lthon_ln_text``.
derived("lthon_ln", ["lthon", "ahon"], lambda s: s["lthon"] / _layer_mean(s["ahon"]),
        "lthon / mean of ahon over the layer's heads (the authors' code; the paper's tables)",
        revision=2)
layer_normalised("ahon")
derived("lthon_hn", ["lthon", "ahon"], lambda s: s["lthon"] / s["ahon"],
        "lthon / the head's own ahon (head-normalised)")
base("fhon", "z", "low", "avg head output norm after the head's W_O slice",
     lambda a: a.mean_over_positions(a.out_norms()))
layer_normalised("fhon")
derived("lthon_ln_text", ["lthon"], lambda s: s["lthon"] / _layer_mean(s["lthon"]),
        "lthon / mean of lthon over the layer's heads (the paper text's reading, not its tables)")
del _id

PAPER_SCORES = ("awft", "aeqd", "ftvvn", "avvn", "lthon", "ahon",
                "awft_ln", "aeqd_ln", "ftvvn_ln", "avvn_ln", "lthon_ln", "ahon_ln")


def revision_key(score_ids: Sequence[str]) -> dict[str, int]:
    """``{id: revision}`` of the ids whose definition has changed (empty for all others), the
    part of a store key that keeps results of an old definition from being reused."""
    return {s: SCORES[s].revision for s in score_ids if s in SCORES and SCORES[s].revision != 1}


def resolve_score_ids(spec: str | Sequence[str], task_level: bool = False) -> list[str]:
    """``"all"`` (every input-level score), ``"paper"`` (the paper's 12), a comma list, or a list
    of ids -> list of ids; ``task_level``: question-level scores are allowed too."""
    if isinstance(spec, str):
        if spec.strip() == "all":
            return input_level()
        if spec.strip() == "paper":
            return list(PAPER_SCORES)
        spec = [s for s in spec.split(",")]
    ids = [s.strip() for s in spec if s.strip()]
    unknown = [s for s in ids if s not in SCORES]
    on_task = [] if task_level else question_level(ids)
    if on_task:
        raise LensHeadsError(f"{on_task[0]!r} is scored on a task's questions, on its own: "
                             f"--scores {on_task[0]} --task TASK ({SCORES[on_task[0]].description})")
    if unknown:
        raise LensHeadsError(f"unknown score id(s) {', '.join(map(repr, unknown))}; valid ids: "
                             f"{', '.join(SCORES)} (or 'all', 'paper')")
    if not ids:
        raise LensHeadsError(f"no score ids given; valid ids: {', '.join(SCORES)} (or 'all', 'paper')")
    return list(dict.fromkeys(ids))


def _closure(ids: Sequence[str]) -> list[str]:
    """ids plus everything they need, dependencies first (registry order is topological)."""
    need: set[str] = set()
    stack = list(ids)
    while stack:
        s = stack.pop()
        if s not in need:
            need.add(s)
            stack.extend(SCORES[s].needs)
    return [s for s in SCORES if s in need]
