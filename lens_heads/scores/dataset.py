"""Dataset-level scores: ``score_heads`` runs the collector over a dataset and returns
``HeadScores`` (per-head mean, std and count over inputs, optionally every input's scores),
which saves to and loads from a CSV/Parquet table with provenance sidecars.
"""

from __future__ import annotations

import json
import math
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Iterable, Mapping, Sequence

import numpy as np
import pandas as pd

import torch
from torch import Tensor

from lens_heads.files.atomic import atomic_write_all
from lens_heads.batching import Batcher, parse_batch_size
from lens_heads.data import tokenize_texts
from lens_heads.errors import LensHeadsError
from lens_heads.files.hashing import sha256_tokens
from lens_heads.models.heads import Head
from lens_heads.models.load import model_provenance
from lens_heads.progress import progress_bar
from lens_heads.scores.collector import ScoreCollector
from lens_heads.scores.shared_prefix import PrefixedScoring, pass_prefixes, scoring_segments
from lens_heads.scores.functions import SCORES, resolve_score_ids, revision_key

if TYPE_CHECKING:
    from lens_heads.models.load import LoadedModel

# -----------------------------------------------------------------------------
# Dataset-level scores


def inactive_when(score_id: str) -> str:
    """Which end of ``score_id``'s values is inactive (the registry's ``inactive_when``)."""
    if score_id in SCORES:
        return SCORES[score_id].inactive_when
    raise LensHeadsError(f"unknown score {score_id!r}")


def least_active(mean, inactive_when: str) -> list[Head]:
    """Every head of a dataset-level score ``mean`` [layer, head], least active first:
    ascending values for ``inactive_when="low"``, descending for ``"high"``, ties broken by
    (layer, head), heads whose score is undefined (NaN) last. The order static pruning by a
    score uses: its first k heads are the k to zero."""
    if inactive_when not in ("low", "high"):
        raise LensHeadsError(f"inactive_when must be 'low' or 'high', got {inactive_when!r}")
    values = torch.as_tensor(mean, dtype=torch.float64)
    sign = 1.0 if inactive_when == "low" else -1.0
    heads = [(L, h) for L in range(values.shape[0]) for h in range(values.shape[1])]
    key = lambda lh: (sign * float(values[lh]) if math.isfinite(float(values[lh])) else math.inf, lh)  # noqa: E731
    return sorted(heads, key=key)


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


def pooled_mean(batches: Iterable[Tensor]) -> Tensor:
    """The dataset-level mean ``score_heads`` reports for one function, replayed from its per-input
    scores batch by batch (``[batch, layer, head]`` each, in the pass's order): the same running
    merge, so the same float64 values bit for bit (NaN where no input defines the score)."""
    moments = None
    for x in batches:
        moments = moments or _Moments(tuple(x.shape[1:]))
        moments.add(x)
    if moments is None:
        raise LensHeadsError("no batches to pool")
    return moments.mean_or_nan()


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
        return inactive_when(score_id)

    def least_active(self, score_id: str, k: int | None = None) -> list[Head]:
        """The ``k`` (default all) least active heads by this function's mean (see ``least_active``)."""
        if score_id not in self.mean:
            raise LensHeadsError(f"{score_id!r} was not scored; these scores hold: {', '.join(self.score_ids)}")
        if k is not None and k < 0:
            raise LensHeadsError(f"k must be >= 0, got {k}")
        return least_active(self.mean[score_id], self.inactive_when(score_id))[:k]

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
                    inactive_when={s: self.inactive_when(s) for s in self.score_ids},
                    per_input=per_path.name if self.per_input is not None else None)
        writes = [(path, lambda f: frame.to_csv(f, index=False) if fmt == "csv" else frame.to_parquet(f, index=False)),
                  (meta_path, lambda f: Path(f).write_text(json.dumps(meta, indent=2, default=str) + "\n"))]
        if self.per_input is not None:
            from safetensors.torch import save_file

            tensors = {s: self.per_input[s].float().contiguous() for s in self.score_ids}
            writes.append((per_path, lambda f: save_file(tensors, f)))
        atomic_write_all(writes)
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
        try:
            frame = pd.read_csv(path) if fmt == "csv" else pd.read_parquet(path)
        except (pd.errors.EmptyDataError, pd.errors.ParserError, UnicodeDecodeError, ValueError, OSError) as exc:
            raise LensHeadsError(f"cannot read scores file {path}: {str(exc).splitlines()[0]}") from None
        missing = {"layer", "head", "score_fn", "value"} - set(frame.columns)
        if missing or frame.empty:
            raise LensHeadsError(f"{path} is not a scores table (needs rows with columns layer, head, score_fn, "
                                 f"value; missing {sorted(missing)})")
        meta_path, per_path = cls.sidecars(path)
        try:
            meta = json.loads(meta_path.read_text()) if meta_path.is_file() else {}
        except (json.JSONDecodeError, UnicodeDecodeError) as exc:
            raise LensHeadsError(f"corrupt scores metadata {meta_path}: {exc}; delete it or save the scores again") from None
        unknown = [s for s in dict.fromkeys(frame["score_fn"].astype(str)) if s not in SCORES]
        if unknown:
            raise LensHeadsError(f"{path}: unknown score function(s) {', '.join(unknown)}; this version knows: "
                                 f"{', '.join(SCORES)}")
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


# -----------------------------------------------------------------------------
# score_heads


def context_length(model: LoadedModel) -> int | None:
    """The longest input the model's position scheme supports (None: no limit, e.g. ALiBi)."""
    if model.geometry.arch.alibi:
        return None
    return getattr(model.hf_model.config, "max_position_embeddings", None)


def prepare_inputs(model: LoadedModel, inputs, max_len: int | None) -> list[Tensor]:
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
    model: LoadedModel,
    inputs: Sequence[Tensor] | Sequence[str],
    scores: str | Sequence[str] = "all",
    batch_size: int = 8,
    max_len: int | None = None,
    keep_per_input: bool = False,
    progress: bool = True,
    *,
    data: str | None = None,
    shared_prefix: bool | Sequence[int] = True,
) -> HeadScores:
    """Score every head with every requested function, one forward per batch.

    ``inputs``: 1-D token tensors (used as given, truncated to ``max_len`` if set) or strings
    (tokenised as documents, truncated to ``max_len``). ``data`` names the data in the metadata.
    ``shared_prefix``: inputs that share a long token prefix (few-shot prompts) run it once
    (``scores.shared_prefix``, docs/methods.md §1); True finds the prefixes among ``inputs``,
    False runs every input whole, a list gives each input's prefix length (``pass_prefixes`` of a
    larger pass these inputs are part of). The inputs of one prefix are scored together
    (``scoring_segments``); without shared prefixes the order is longest first.
    """
    ids = resolve_score_ids(scores)
    batch_size = parse_batch_size(batch_size)
    seqs = prepare_inputs(model, inputs, max_len)
    g = model.geometry
    collector = ScoreCollector(model, ids)
    prefixes = _prefix_lengths(model, seqs, shared_prefix)
    runner = PrefixedScoring(model, collector, seqs, prefixes)
    moments = {s: _Moments((g.n_layers, g.n_heads)) for s in ids}
    per_input = ({s: torch.empty(len(seqs), g.n_layers, g.n_heads) for s in ids} if keep_per_input else None)
    bar = progress_bar(len(seqs), "scoring heads", enabled=progress, unit="input")

    def run(idx: Sequence[int]) -> None:
        for s, v in runner.batch_scores(idx).items():  # after the forwards: a retried batch adds nothing twice
            moments[s].add(v)
            if per_input is not None:
                per_input[s][torch.as_tensor(list(idx))] = v
        bar.update(len(idx))

    batcher = Batcher.for_inputs(batch_size, model, max((len(x) for x in seqs), default=1))
    try:
        for items, lengths in scoring_segments(seqs, prefixes):  # the batches of ``scoring_batches``
            batcher.run(items, run, lengths)
    finally:
        bar.close()
    meta = {**score_metadata(model, seqs, max_len, data), "score_revisions": revision_key(ids)}
    return HeadScores(ids, {s: moments[s].mean_or_nan() for s in ids}, {s: moments[s].std() for s in ids},
                      {s: moments[s].n for s in ids}, len(seqs), per_input, meta)


def _prefix_lengths(model: LoadedModel, seqs: Sequence[Tensor], shared_prefix: bool | Sequence[int]) -> list[int]:
    """``score_heads``' ``shared_prefix`` as one prefix length per input (checked)."""
    if isinstance(shared_prefix, bool):
        return pass_prefixes(model, seqs) if shared_prefix else [0] * len(seqs)
    lengths = list(shared_prefix)
    if len(lengths) != len(seqs) or any(isinstance(n, bool) or not isinstance(n, int) or not 0 <= n < len(s)
                                        for n, s in zip(lengths, seqs)):
        raise LensHeadsError(f"shared_prefix: one length per input ({len(seqs)}), each an integer from 0 to the "
                             f"input's length - 1")
    return lengths


def score_metadata(model: LoadedModel, seqs: Sequence[Tensor], max_len: int | None, data: str | None) -> dict:
    return {**model_provenance(model), "data": data, "max_len": max_len, "tokens_sha256": sha256_tokens(seqs),
            "n_tokens": int(sum(len(s) for s in seqs))}


def wasserstein_distances(samples: Mapping[str, Sequence[float] | np.ndarray]) -> pd.DataFrame:
    """Pairwise 1-Wasserstein distances between score samples (e.g. one score function's
    per-head values for base vs instruct models), as a labelled square matrix; non-finite
    values are left out of each sample."""
    from scipy.stats import wasserstein_distance

    if len(samples) < 2:
        raise LensHeadsError("need at least two samples to compare")
    arrays = {}
    for label, s in samples.items():
        a = np.asarray(s, dtype=float).ravel()
        a = a[np.isfinite(a)]
        if a.size == 0:
            raise LensHeadsError(f"sample {label!r} has no finite values")
        arrays[label] = a
    labels = list(arrays)
    d = np.zeros((len(labels), len(labels)))
    for i in range(len(labels)):
        for j in range(i + 1, len(labels)):
            d[i, j] = d[j, i] = wasserstein_distance(arrays[labels[i]], arrays[labels[j]])
    return pd.DataFrame(d, index=labels, columns=labels)
