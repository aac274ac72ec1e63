"""Per-head inactivity scores, computed in one streaming forward pass.

A *score function* maps one layer's activations on a batch to one number per (input, head).
METHODS.md §A defines the paper's twelve (six base scores and their layer-normalised ``_ln``
versions); ``lthon_hn``, ``fhon`` and ``fhon_ln`` come from the authors' code:

    awft      mean_t A[t, first]                       pattern  inactive when high
    aeqd      mean_t -sum_j A[t, j] ln A[t, j]         pattern  low
    ftvvn     ||V_first||                              v        low
    avvn      mean_j ||V_j||                           v        low
    lthon     ||O_last||                               z        low
    ahon      mean_t ||O_t||                           z        low
    lthon_hn  ||O_last|| / mean_t ||O_t||              z        low
    fhon      mean_t ||O_t W_O^h||                     z        low
    <id>_ln   score / mean over the layer's heads      (same)   (same)

Means run over real tokens only (padding excluded); "first" is the first real token, "last"
the last real one; under grouped-query attention a value score is repeated over the query
heads that read that KV head.

``ScoreCollector`` turns a set of score ids into TransformerLens hooks for one forward of a
batch: each hook reduces its activation to ``[batch, head]`` numbers at once and keeps
nothing else (no activation cache). At ``hook_z`` of each layer the layer's scores are
final, and an optional ``z_transform`` may replace z (per-input ablation builds on this).
``score_heads`` runs the collector over a dataset and returns ``HeadScores``.

Adding a score function is one ``register_score(ScoreFn(...))`` call; see the definitions
at the bottom of the registry section.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Literal, Sequence

import torch
from jaxtyping import Float, Int
from torch import Tensor

from lens_heads.data import iter_batches, tokenize_texts
from lens_heads.atomic import atomic_path
from lens_heads.errors import LensHeadsError
from lens_heads.hooks import HookFn, HookKind, hook_name, run_with_hooks

# -----------------------------------------------------------------------------
# What a score function sees: one hook's activation plus memoised reductions of it


class Acts:
    """One layer's activation at one hook, with the batch's padding geometry.

    Derived quantities (norms, gathers) are computed on first use and shared by every
    score function reading the same hook, so each hook does the expensive work once.
    """

    def __init__(self, kind: HookKind, x: Tensor, batch: "BatchGeometry", layer: int,
                 gram: Callable[[int], Tensor], group_size: int):
        self.kind, self.x, self.batch, self.layer = kind, x, batch, layer
        self._gram, self._group = gram, group_size
        self._memo: dict[str, Tensor] = {}

    def _cached(self, key: str, make: Callable[[], Tensor]) -> Tensor:
        if key not in self._memo:
            self._memo[key] = make()
        return self._memo[key]

    # --- pattern [batch, head, q, k] ----------------------------------------------------
    def attn_on_first(self) -> Float[Tensor, "batch head q"]:
        """A[t, first] for every query row t (float32)."""
        b, h, q, _ = self.x.shape
        if self.batch.first_is_zero:
            return self._cached("first", lambda: self.x[..., 0].float())
        idx = self.batch.first.view(b, 1, 1, 1).expand(b, h, q, 1)
        return self._cached("first", lambda: self.x.gather(-1, idx)[..., 0].float())

    def row_entropy(self) -> Float[Tensor, "batch head q"]:
        """-sum_j A[t, j] ln A[t, j] per query row, in float32, one batch row at a time."""
        def make() -> Tensor:
            return torch.stack([torch.special.entr(row.float()).sum(-1) for row in self.x])
        return self._cached("entropy", make)

    # --- v [batch, pos, kv_head, d_head] and z [batch, pos, head, d_head] --------------
    def norms(self) -> Float[Tensor, "batch pos unit"]:
        """L2 norm over d_head of every position's vector (float32)."""
        return self._cached("norms", lambda: torch.linalg.vector_norm(self.x, dim=-1, dtype=torch.float32))

    def out_norms(self) -> Float[Tensor, "batch pos head"]:
        """||z_t W_O^h|| via the Gram trick: sqrt(z (W_O^h W_O^hT) z^T) (float32)."""
        def make() -> Tensor:
            z = self.x.float()
            zg = torch.einsum("bphd,hde->bphe", z, self._gram(self.layer))
            return (zg * z).sum(-1).clamp_min_(0).sqrt_()
        return self._cached("out_norms", make)

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


# -----------------------------------------------------------------------------
# Registry


@dataclass(frozen=True)
class ScoreFn:
    """One per-head score.

    Either a *base* score, ``compute(acts) -> [batch, head]`` at the single hook it reads, or a
    *derived* score, ``combine({dep_id: [batch, head]}) -> [batch, head]`` from other scores of
    the same layer (``needs``); a derived score's ``reads`` is the union of its dependencies'.
    """

    id: str
    reads: tuple[HookKind, ...]
    inactive_when: Literal["high", "low"]
    description: str
    compute: Callable[[Acts], Tensor] | None = None
    needs: tuple[str, ...] = ()
    combine: Callable[[dict[str, Tensor]], Tensor] | None = None

    def __post_init__(self):
        if self.inactive_when not in ("high", "low"):
            raise ValueError(f"inactive_when must be 'high' or 'low', got {self.inactive_when!r}")
        if (self.compute is None) == (self.combine is None):
            raise ValueError(f"score {self.id!r}: give exactly one of compute= or combine=")
        if self.compute is not None and len(self.reads) != 1:
            raise ValueError(f"base score {self.id!r} must read exactly one hook kind")


SCORES: dict[str, ScoreFn] = {}


def register_score(fn: ScoreFn) -> ScoreFn:
    if fn.id in SCORES:
        raise ValueError(f"score {fn.id!r} is already registered")
    for dep in fn.needs:
        if dep not in SCORES:
            raise ValueError(f"score {fn.id!r} needs unknown score {dep!r}")
    SCORES[fn.id] = fn
    return fn


def base(id: str, reads: HookKind, inactive_when: str, description: str,
         compute: Callable[[Acts], Tensor]) -> ScoreFn:
    return register_score(ScoreFn(id, (reads,), inactive_when, description, compute=compute))


def derived(id: str, needs: Sequence[str], combine: Callable[[dict[str, Tensor]], Tensor],
            description: str, inactive_when: str | None = None) -> ScoreFn:
    deps = [SCORES[d] for d in needs]
    reads = tuple(k for k in ("pattern", "v", "z") if any(k in d.reads for d in deps))
    return register_score(ScoreFn(id, reads, inactive_when or deps[0].inactive_when, description,
                                  needs=tuple(needs), combine=combine))


def layer_normalised(base_id: str) -> ScoreFn:
    """``<id>_ln``: the score divided by its mean over all heads of the layer (same input)."""
    return derived(f"{base_id}_ln", [base_id], lambda s: s[base_id] / s[base_id].mean(-1, keepdim=True),
                   f"{base_id} / mean of {base_id} over the layer's heads")


base("awft", "pattern", "high", "avg attention weight on the first token",
     lambda a: a.mean_over_queries(a.attn_on_first()))
base("aeqd", "pattern", "low", "avg entropy of the query distributions",
     lambda a: a.mean_over_queries(a.row_entropy()))
base("ftvvn", "v", "low", "first-token value vector norm",
     lambda a: a.to_query_heads(a.at_first(a.norms())))
base("avvn", "v", "low", "avg value vector norm",
     lambda a: a.to_query_heads(a.mean_over_positions(a.norms())))
base("lthon", "z", "low", "last-token head output norm (before W_O)",
     lambda a: a.at_last(a.norms()))
base("ahon", "z", "low", "avg head output norm (before W_O)",
     lambda a: a.mean_over_positions(a.norms()))
for _id in ("awft", "aeqd", "ftvvn", "avvn", "lthon", "ahon"):
    layer_normalised(_id)
derived("lthon_hn", ["lthon", "ahon"], lambda s: s["lthon"] / s["ahon"],
        "lthon / the head's own ahon (head-normalised)")
base("fhon", "z", "low", "avg head output norm after the head's W_O slice",
     lambda a: a.mean_over_positions(a.out_norms()))
layer_normalised("fhon")
del _id

PAPER_SCORES = ("awft", "aeqd", "ftvvn", "avvn", "lthon", "ahon",
                "awft_ln", "aeqd_ln", "ftvvn_ln", "avvn_ln", "lthon_ln", "ahon_ln")


def resolve_score_ids(spec: str | Sequence[str]) -> list[str]:
    """``"all"``, ``"paper"`` (the paper's 12), a comma list, or a list of ids -> list of ids."""
    if isinstance(spec, str):
        if spec.strip() == "all":
            return list(SCORES)
        if spec.strip() == "paper":
            return list(PAPER_SCORES)
        spec = [s for s in spec.split(",")]
    ids = [s.strip() for s in spec if s.strip()]
    unknown = [s for s in ids if s not in SCORES]
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


# -----------------------------------------------------------------------------
# The streaming collector

ZTransform = Callable[[int, Tensor, dict[str, Tensor]], Tensor]


class ScoreCollector:
    """Streaming per-head scores for one model; reusable across batches."""

    def __init__(self, model, score_ids: Sequence[str]):
        self.model = model
        self.score_ids = resolve_score_ids(score_ids)
        self.geometry = model.geometry
        plan = _closure(self.score_ids)
        self._base: dict[HookKind, list[ScoreFn]] = {
            k: [SCORES[s] for s in plan if SCORES[s].compute is not None and SCORES[s].reads == (k,)]
            for k in ("pattern", "v", "z")}
        self._derived = [SCORES[s] for s in plan if SCORES[s].combine is not None]
        self._grams: dict[int, Tensor] = {}
        self._batch: BatchGeometry | None = None
        self._layer: list[dict[str, Tensor]] = []
        self._scores: dict[str, Tensor] = {}

    def hooks(self, attention_mask: Int[Tensor, "batch pos"],
              z_transform: ZTransform | None = None) -> list[tuple[str, HookFn]]:
        """Hooks for ONE forward of a batch. At hook_z of layer L, once the layer's scores are
        computed from the unmodified z, calls z_transform(L, z, {id: Float[Tensor,'batch head']})
        and returns its result as the new z (this is how per-input ablation zeroes heads)."""
        g = self.geometry
        self._batch = batch = BatchGeometry.from_mask(attention_mask, self.model.device)
        b = attention_mask.shape[0]
        self._layer = [{} for _ in range(g.n_layers)]
        self._scores = {s: torch.full((b, g.n_layers, g.n_heads), float("nan"), device=self.model.device)
                        for s in self.score_ids}
        out: list[tuple[str, HookFn]] = []
        for L in range(g.n_layers):
            for kind in ("pattern", "v"):
                if self._base[kind]:
                    out.append((hook_name(kind, L), self._reduce_hook(kind, L, batch)))
            out.append((hook_name("z", L), self._z_hook(L, batch, z_transform)))
        return out

    def batch_scores(self) -> dict[str, Float[Tensor, "batch layer head"]]:
        """Scores of the last batch (after the forward)."""
        return self._scores

    def gram(self, layer: int) -> Float[Tensor, "head d_head d_head"]:
        """W_O^h W_O^hT per head (float32), built on first use: ||z W_O^h||^2 = z G_h z^T."""
        if layer not in self._grams:
            with torch.no_grad():
                w = self.geometry.w_o(self.model.params(), layer)  # [head, d_head, d_model]
                w = w.detach().to(self.model.device, torch.float32)
                self._grams[layer] = torch.einsum("hde,hfe->hdf", w, w).contiguous()
        return self._grams[layer]

    # --- hook bodies --------------------------------------------------------------------
    def _reduce(self, kind: HookKind, L: int, x: Tensor, batch: BatchGeometry) -> None:
        acts = Acts(kind, x, batch, L, self.gram, self.geometry.group_size)
        store = self._layer[L]
        for fn in self._base[kind]:
            store[fn.id] = fn.compute(acts)

    def _reduce_hook(self, kind: HookKind, L: int, batch: BatchGeometry) -> HookFn:
        def hook(x: Tensor, hook=None) -> None:
            self._reduce(kind, L, x, batch)
        return hook

    def _z_hook(self, L: int, batch: BatchGeometry, z_transform: ZTransform | None) -> HookFn:
        def hook(z: Float[Tensor, "batch pos head d_head"], hook=None) -> Tensor | None:
            if self._base["z"]:
                self._reduce("z", L, z, batch)
            store = self._layer[L]
            for fn in self._derived:
                store[fn.id] = fn.combine(store)
            layer_scores = {s: store[s] for s in self.score_ids}
            for s, v in layer_scores.items():
                self._scores[s][:, L] = v
            self._layer[L] = {}  # nothing of this layer is kept beyond the scores
            if z_transform is not None:
                return z_transform(L, z, layer_scores)
            return None
        return hook


# -----------------------------------------------------------------------------
# Dataset-level scores


class _Moments:
    """Running per-entry count / mean / M2 in float64 over the defined (non-NaN) values
    (Chan et al. batch merge). A score is NaN where it is undefined, e.g. ``aeqd_ln`` on a
    one-token input, where every head's entropy is 0 and the layer mean too."""

    def __init__(self, shape: tuple[int, ...]):
        self.n = torch.zeros(shape, dtype=torch.int64)
        self.mean = torch.zeros(shape, dtype=torch.float64)
        self.m2 = torch.zeros(shape, dtype=torch.float64)

    def add(self, x: Tensor) -> None:  # x: [batch, *shape]
        x = x.double().cpu()
        ok = ~torch.isnan(x)
        nb = ok.sum(0)
        mb = torch.where(ok, x, 0.0).sum(0) / nb.clamp_min(1)
        m2b = torch.where(ok, (x - mb) ** 2, 0.0).sum(0)
        n = self.n + nb
        delta = mb - self.mean
        frac = nb / n.clamp_min(1)
        self.mean = self.mean + delta * frac
        self.m2 = self.m2 + m2b + delta ** 2 * self.n * frac
        self.n = n

    def mean_or_nan(self) -> Tensor:
        return torch.where(self.n > 0, self.mean, float("nan"))

    def std(self) -> Tensor:
        """Sample standard deviation (ddof=1; NaN with fewer than two defined values)."""
        return torch.where(self.n > 1, (self.m2 / (self.n - 1).clamp_min(1)).sqrt(), float("nan"))


@dataclass
class HeadScores:
    """Dataset-level per-head scores: mean, std (ddof=1) and count over inputs, per function.

    ``mean[id]`` / ``std[id]``: Float64 ``[layer, head]``; ``count[id]``: Int64 ``[layer, head]``,
    the inputs on which the score is defined (NaN values, e.g. ``aeqd_ln`` on a one-token
    input, are left out of mean and std); ``n``: number of inputs; ``per_input[id]``:
    Float32 ``[n_inputs, layer, head]`` in input order (when kept); ``meta``: provenance.
    """

    score_ids: list[str]
    mean: dict[str, Tensor]
    std: dict[str, Tensor]
    count: dict[str, Tensor]
    n: int
    per_input: dict[str, Tensor] | None = None
    meta: dict = field(default_factory=dict)

    def __getitem__(self, score_id: str) -> Tensor:
        return self.mean[score_id]

    @property
    def n_layers(self) -> int:
        return next(iter(self.mean.values())).shape[0]

    @property
    def n_heads(self) -> int:
        return next(iter(self.mean.values())).shape[1]

    def inactive_when(self, score_id: str) -> str:
        return SCORES[score_id].inactive_when

    def to_frame(self):
        """Tidy frame: layer, head, score_fn, value (= dataset mean), std, n (= count)."""
        import numpy as np
        import pandas as pd

        L, H = self.n_layers, self.n_heads
        layer, head = np.meshgrid(np.arange(L), np.arange(H), indexing="ij")
        parts = [pd.DataFrame({"layer": layer.ravel(), "head": head.ravel(), "score_fn": s,
                               "value": self.mean[s].numpy().ravel(), "std": self.std[s].numpy().ravel(),
                               "n": self.count[s].numpy().ravel()}) for s in self.score_ids]
        return pd.concat(parts, ignore_index=True)

    # --- files --------------------------------------------------------------------------
    @staticmethod
    def sidecars(path: str | os.PathLike) -> tuple[Path, Path]:
        """(metadata JSON, per-input safetensors) written beside ``path``."""
        p = Path(path)
        return p.with_name(p.name + ".meta.json"), p.with_name(p.name + ".per_input.safetensors")

    def save(self, path: str | os.PathLike) -> Path:
        """Write ``path`` (.csv or .parquet) plus sidecars, each atomically."""
        path = Path(path)
        fmt = _table_format(path)
        meta_path, per_path = self.sidecars(path)
        if not path.parent.is_dir():
            raise LensHeadsError(f"output folder does not exist: {path.parent}")
        frame = self.to_frame()
        meta = dict(self.meta, score_ids=self.score_ids, n_inputs=self.n,
                    n_layers=self.n_layers, n_heads=self.n_heads,
                    inactive_when={s: SCORES[s].inactive_when for s in self.score_ids if s in SCORES},
                    per_input=per_path.name if self.per_input is not None else None)
        writes = [(path, lambda f: frame.to_csv(f, index=False) if fmt == "csv" else frame.to_parquet(f, index=False)),
                  (meta_path, lambda f: Path(f).write_text(json.dumps(meta, indent=2, default=str) + "\n"))]
        if self.per_input is not None:
            from safetensors.torch import save_file

            tensors = {s: self.per_input[s].float().contiguous() for s in self.score_ids}
            writes.append((per_path, lambda f: save_file(tensors, f)))
        _atomic_write_all(writes)
        if self.per_input is None and per_path.exists():
            per_path.unlink()  # a stale sidecar from an earlier save would not match
        return path

    @classmethod
    def load(cls, path: str | os.PathLike) -> "HeadScores":
        import pandas as pd

        path = Path(path)
        fmt = _table_format(path)
        if not path.is_file():
            raise LensHeadsError(f"scores file not found: {path}")
        frame = pd.read_csv(path) if fmt == "csv" else pd.read_parquet(path)
        missing = {"layer", "head", "score_fn", "value"} - set(frame.columns)
        if missing:
            raise LensHeadsError(f"{path}: not a scores table (missing columns {sorted(missing)})")
        meta_path, per_path = cls.sidecars(path)
        meta = json.loads(meta_path.read_text()) if meta_path.is_file() else {}
        L, H = int(frame["layer"].max()) + 1, int(frame["head"].max()) + 1
        ids = list(dict.fromkeys(frame["score_fn"]))
        n = int(meta.get("n_inputs", frame["n"].max() if "n" in frame else 0))
        mean, std, count = {}, {}, {}
        for s, grp in frame.groupby("score_fn", sort=False):
            m = torch.full((L, H), float("nan"), dtype=torch.float64)
            sd = torch.full((L, H), float("nan"), dtype=torch.float64)
            c = torch.full((L, H), n, dtype=torch.int64)
            li = torch.tensor(grp["layer"].to_numpy(dtype="int64"))
            hi = torch.tensor(grp["head"].to_numpy(dtype="int64"))
            m[li, hi] = torch.tensor(grp["value"].to_numpy(dtype="float64"))
            if "std" in grp:
                sd[li, hi] = torch.tensor(grp["std"].to_numpy(dtype="float64"))
            if "n" in grp:
                c[li, hi] = torch.tensor(grp["n"].to_numpy(dtype="int64"))
            mean[s], std[s], count[s] = m, sd, c
        per_input = None
        if per_path.is_file():
            from safetensors.torch import load_file

            per_input = load_file(per_path)
        for key in ("score_ids", "n_inputs", "n_layers", "n_heads", "inactive_when", "per_input"):
            meta.pop(key, None)
        return cls(ids, mean, std, count, n, per_input, meta)


def _table_format(path: Path) -> str:
    suffix = path.suffix.lower()
    if suffix not in (".csv", ".parquet"):
        raise LensHeadsError(f"scores file must end in .csv or .parquet, got {path.name!r}")
    return suffix[1:]


def _atomic_write_all(writes: list[tuple[Path, Callable[[str], object]]]) -> None:
    """Write every file to a temp file beside it; only when all succeeded, rename them into place."""
    with contextlib.ExitStack() as stack:
        for target, write in writes:
            write(str(stack.enter_context(atomic_path(target))))


# -----------------------------------------------------------------------------
# score_heads


def context_length(model) -> int | None:
    """The longest input the model's position scheme supports (None: no limit, e.g. ALiBi)."""
    if model.geometry.arch.alibi:
        return None
    return getattr(model.hf_model.config, "max_position_embeddings", None)


def prepare_inputs(model, inputs, max_len: int | None) -> list[Tensor]:
    """Strings or 1-D token tensors -> 1-D LongTensors, checked against max_len and the context."""
    if max_len is not None and max_len < 2:
        raise LensHeadsError(f"max_len must be >= 2, got {max_len}")
    if isinstance(inputs, (str, Tensor)):
        inputs = [inputs]
    inputs = list(inputs)
    if not inputs:
        raise LensHeadsError("no inputs to score (empty data)")
    ctx = context_length(model)
    if max_len is not None and ctx is not None and max_len > ctx:
        raise LensHeadsError(f"max_len={max_len} exceeds the model's context length ({ctx} tokens)")
    if all(isinstance(x, str) for x in inputs):
        limit = max_len if max_len is not None else (ctx + 1 if ctx is not None else 10**9)
        seqs = tokenize_texts(model.tokenizer, inputs, limit, mode="documents")
        if not seqs:
            raise LensHeadsError("no inputs to score (every text is empty)")
    elif all(isinstance(x, Tensor) for x in inputs):
        seqs = []
        for i, x in enumerate(inputs):
            if x.dim() != 1 or x.dtype.is_floating_point:
                raise LensHeadsError(f"input {i}: expected a 1-D tensor of token ids, got shape "
                                     f"{tuple(x.shape)} dtype {x.dtype}")
            seqs.append(x.long() if max_len is None else x[:max_len].long())
    else:
        raise LensHeadsError("inputs must be all strings or all 1-D token tensors")
    for i, s in enumerate(seqs):
        if len(s) == 0:
            raise LensHeadsError(f"input {i} is empty (no tokens)")
        if ctx is not None and len(s) > ctx:
            raise LensHeadsError(f"input {i} has {len(s)} tokens, longer than the model's context "
                                 f"({ctx} tokens); pass max_len to truncate")
    vocab = model.hf_model.config.vocab_size
    hi = max(int(s.max()) for s in seqs)
    if hi >= vocab or min(int(s.min()) for s in seqs) < 0:
        raise LensHeadsError(f"token ids must lie in [0, {vocab}); got max id {hi}")
    return seqs


def score_heads(
    model,
    inputs: Sequence[Tensor] | Sequence[str],
    scores: str | Sequence[str] = "all",
    batch_size: int = 8,
    max_len: int | None = None,
    keep_per_input: bool = False,
    progress: bool = True,
    *,
    data: str | None = None,
) -> HeadScores:
    """Score every head with every requested function, one forward per batch.

    ``inputs``: 1-D token tensors (used as given, truncated to ``max_len`` if set) or strings
    (tokenised as documents, truncated to ``max_len``). ``data`` names the data in the metadata.
    """
    from tqdm.auto import tqdm

    ids = resolve_score_ids(scores)
    if batch_size < 1:
        raise LensHeadsError(f"batch_size must be >= 1, got {batch_size}")
    seqs = prepare_inputs(model, inputs, max_len)
    g = model.geometry
    collector = ScoreCollector(model, ids)
    moments = {s: _Moments((g.n_layers, g.n_heads)) for s in ids}
    per_input = ({s: torch.empty(len(seqs), g.n_layers, g.n_heads) for s in ids} if keep_per_input else None)
    pad = model.tokenizer.pad_token_id or 0
    bar = tqdm(total=len(seqs), desc="scoring heads", unit="input", disable=not progress, leave=False)
    try:
        for idx, ids_b, mask in iter_batches(seqs, batch_size, pad_id=pad, side="right"):
            run_with_hooks(model, ids_b, mask, collector.hooks(mask), return_logits=False)
            for s, v in collector.batch_scores().items():
                v = v.cpu()
                moments[s].add(v)
                if per_input is not None:
                    per_input[s][torch.as_tensor(idx)] = v
            bar.update(len(idx))
    finally:
        bar.close()
    meta = score_metadata(model, seqs, max_len, data)
    return HeadScores(ids, {s: moments[s].mean_or_nan() for s in ids}, {s: moments[s].std() for s in ids},
                      {s: moments[s].n for s in ids}, len(seqs), per_input, meta)


def score_metadata(model, seqs: Sequence[Tensor], max_len: int | None, data: str | None) -> dict:
    from importlib.metadata import PackageNotFoundError, version

    versions = {}
    for pkg in ("lens_heads", "torch", "transformers", "transformer_lens"):
        try:
            versions[pkg] = version(pkg.replace("_", "-"))
        except PackageNotFoundError:
            versions[pkg] = None
    tokens = hashlib.sha256()
    for s in seqs:
        tokens.update(s.to(torch.int64).numpy().tobytes())
        tokens.update(b"|")
    return {
        "model": model.source.spec,
        "model_digest": model.source.digest or _folder_digest(model.source.path),
        "architecture": model.geometry.arch.name,
        "dtype": str(model.dtype).removeprefix("torch."),
        "data": data,
        "max_len": max_len,
        "tokens_sha256": tokens.hexdigest(),
        "n_tokens": int(sum(len(s) for s in seqs)),
        "versions": versions,
    }


def _folder_digest(path: str) -> str | None:
    """sha256 over a local HF folder's weight files (None for hub ids)."""
    folder = Path(path)
    if not folder.is_dir():
        return None
    files = sorted(p for p in folder.iterdir() if p.suffix in (".safetensors", ".bin"))
    if not files:
        return None
    h = hashlib.sha256()
    for p in files:
        h.update(p.name.encode())
        with open(p, "rb") as f:
            for chunk in iter(lambda: f.read(1 << 20), b""):
                h.update(chunk)
    return h.hexdigest()
