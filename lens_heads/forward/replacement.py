"""What an ablated head's output becomes: zero (the default), its mean, or another input's (docs/methods.md §2).

Typed values with one parser and one printer (``parse_replacement`` / ``str``), joined to any
ablation spec with ``|``: ``static:3.1,4.2|mean:c4``, ``score:ahon_ln@0.41|resample:c4@0``.

* ``zero``: ``hook_z`` of the head set to 0 (the paper's ablation; prints as nothing).
* ``mean:CORPUS[@N]``: the head's mean ``hook_z`` over every real token position of the first
  ``N`` (default 64) texts of CORPUS (a corpus name or a local file), at most ``MAX_LEN`` tokens
  each -- position-agnostic, so it fits any input length and keeps a head's typical output
  direction without any one input's content. Computed in one streaming pass per (model, corpus),
  cached on disk (``$LENS_HEADS_CACHE`` or ``~/.cache/lens_heads``, ``head_means/``).
* ``resample:CORPUS@SEED[@N]``: the head's ``hook_z`` on another input, drawn per evaluated row
  from the first ``N`` texts of CORPUS with a seeded generator keyed by the row (independent of
  batching). Position t takes the source's position t; a source shorter than the input repeats
  its last position. ``resample:self@SEED`` uses the row's own input (a check: nothing changes).
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import TYPE_CHECKING, ClassVar

import torch
from torch import Tensor

from lens_heads.files.cache import cache_dir, cached_tensors
from lens_heads.forward.engine import forward, row_generator
from lens_heads.errors import LensHeadsError
from lens_heads.data import load_texts, pad_batch, tokenize_texts
from lens_heads.models.hooks import hook_name
from lens_heads.files.hashing import sha256_bytes
from lens_heads.models.load import model_digest

if TYPE_CHECKING:
    from lens_heads.models.load import LoadedModel

SEPARATOR = "|"
DEFAULT_N = 64
MAX_LEN = 128
FORMS = "zero | mean:CORPUS[@N] | resample:CORPUS@SEED[@N] | resample:self@SEED"


@dataclass(frozen=True)
class Replacement:
    kind: ClassVar[str] = ""
    per_row: ClassVar[bool] = False  # each row draws its own values (no K/V prefix is shared)

    def body(self) -> str:
        raise NotImplementedError

    def __str__(self) -> str:
        return f"{self.kind}:{self.body()}" if self.body() else self.kind

    def check(self) -> None:
        """What can be checked before a model loads (the corpus exists and has texts)."""

    def runtime(self):
        """The object ablation hooks ask for replacement values."""
        raise NotImplementedError


@dataclass(frozen=True)
class Zero(Replacement):
    kind: ClassVar[str] = "zero"

    def body(self) -> str:
        return ""

    def runtime(self):
        return None


def _texts(corpus: str, n: int) -> list[str]:

    texts = load_texts(corpus, n=n)
    if not texts:
        raise LensHeadsError(f"reference corpus {corpus!r} has no texts")
    return texts


def _is_int(text: str) -> bool:
    """An integer written in ASCII digits (``str.isdigit`` takes '²', which ``int`` refuses)."""
    return re.fullmatch(r"-?[0-9]{1,18}", text.strip()) is not None


def _split_n(body: str, spec: str) -> tuple[str, int]:
    corpus, at, n = body.rpartition("@")
    if at and _is_int(n) and not n.strip().startswith("-"):
        if int(n) < 1:
            raise LensHeadsError(f"bad replacement {spec!r}: N must be >= 1")
        return corpus.strip(), int(n)
    return body.strip(), DEFAULT_N


@dataclass(frozen=True)
class Mean(Replacement):
    corpus: str
    n: int = DEFAULT_N

    kind: ClassVar[str] = "mean"

    def body(self) -> str:
        return self.corpus if self.n == DEFAULT_N else f"{self.corpus}@{self.n}"

    def check(self) -> None:
        _texts(self.corpus, self.n)

    def runtime(self):
        return MeanValues(self)


@dataclass(frozen=True)
class Resample(Replacement):
    corpus: str  # "self": the row's own input
    seed: int
    n: int = DEFAULT_N

    kind: ClassVar[str] = "resample"
    per_row: ClassVar[bool] = True

    def body(self) -> str:
        return f"{self.corpus}@{self.seed}" + ("" if self.n == DEFAULT_N else f"@{self.n}")

    def check(self) -> None:
        if self.corpus != "self":
            _texts(self.corpus, self.n)

    def runtime(self):
        return ResampleValues(self)


def parse_replacement(text: str) -> Replacement:
    """The one parser (``FORMS``); ``str`` of the result is its canonical form."""
    s = str(text).strip()
    kind, _, body = s.partition(":")
    kind = kind.strip()
    if kind == "zero" and not body.strip():
        return Zero()
    if kind == "mean" and body.strip():
        corpus, n = _split_n(body, s)
        if corpus:
            return Mean(corpus, n)
    if kind == "resample" and body.strip():
        parts = body.strip().split("@")
        digits = [_is_int(p) for p in parts]
        if len(parts) >= 3 and digits[-1] and digits[-2]:
            corpus, seed, n = "@".join(parts[:-2]), int(parts[-2]), int(parts[-1])
        elif len(parts) >= 2 and digits[-1]:
            corpus, seed, n = "@".join(parts[:-1]), int(parts[-1]), DEFAULT_N
        else:
            corpus, seed, n = "", 0, 0
        if corpus.strip() and n >= 1:
            return Resample(corpus.strip(), seed, n)
    raise LensHeadsError(f"bad replacement {s!r}; use one of: {FORMS}")


# -----------------------------------------------------------------------------
# The values, at run time


def _z_capture(model: LoadedModel, ids: Tensor, mask: Tensor) -> dict[int, Tensor]:
    """Every layer's ``hook_z`` on ``ids`` (no ablation), on the CPU in float32."""

    out: dict[int, Tensor] = {}

    def grab(L):
        def fn(z, hook=None):
            out[L] = z.detach().float().cpu()
        return fn

    forward(model, ids, mask, [(hook_name("z", L), grab(L)) for L in range(model.geometry.n_layers)], logits=False)
    return out


def head_means(model: LoadedModel, texts: list[str], max_len: int = MAX_LEN, batch_size: int = 8) -> Tensor:
    """[layer, head, d_head] mean ``hook_z`` over every real token position of ``texts``
    (float64 sums, one streaming pass; heads a pruned layer lacks stay NaN)."""

    g = model.geometry
    seqs = tokenize_texts(model.tokenizer, texts, max_len)
    sums = torch.zeros(g.n_layers, g.n_heads, g.d_head, dtype=torch.float64)
    n = 0
    pad = model.tokenizer.pad_token_id or 0
    for i in range(0, len(seqs), batch_size):
        ids, mask = pad_batch(seqs[i:i + batch_size], pad, "right")
        real = mask.bool()
        for L, z in _z_capture(model, ids, mask).items():
            sums[L, :z.shape[2]] += z[real].double().sum(0)
        n += int(real.sum())
    means = (sums / n).float()
    for L in range(g.n_layers):
        means[L, g.heads_in(L):] = float("nan")
    return means


class MeanValues:
    """A ``Mean`` replacement bound at run time: the means of the model it first sees."""

    def __init__(self, spec: Mean):
        self.spec, self._means, self._model = spec, None, None

    def means(self, model: LoadedModel) -> Tensor:
        if self._means is None or self._model is not model:

            texts = _texts(self.spec.corpus, self.spec.n)
            key = sha256_bytes([json.dumps([model_digest(model), str(model.dtype), texts, MAX_LEN]).encode()])[:32]
            path = cache_dir("head_means") / f"{key}.safetensors"
            self._means = cached_tensors(path, lambda: {"means": head_means(model, texts)})["means"]
            self._model = model
        return self._means

    def prepare(self, model: LoadedModel, mask: Tensor, row_keys) -> "MeanValues":
        self.means(model)
        return self

    def values(self, layer: int, z: Tensor) -> Tensor:
        m = self._means[layer, :z.shape[2]]  # [head, d_head]
        return m.to(z.device, z.dtype)[None, None].expand_as(z)


class ResampleValues:
    """A ``Resample`` replacement: per forward, the source inputs' ``hook_z`` (one extra forward;
    ``self``: the forward's own ``hook_z``, no extra forward)."""

    def __init__(self, spec: Resample):
        self.spec, self._source, self._pool = spec, None, None

    def prepare(self, model: LoadedModel, mask: Tensor, row_keys) -> "ResampleValues":

        if self.spec.corpus == "self":
            return self
        if self._pool is None:
            self._pool = tokenize_texts(model.tokenizer, _texts(self.spec.corpus, self.spec.n), MAX_LEN)
        pool = self._pool
        picks = [int(torch.randint(len(pool), (1,), generator=row_generator(self.spec.seed, k))) for k in row_keys]
        src_ids, src_mask = pad_batch([pool[j] for j in picks], model.tokenizer.pad_token_id or 0, "right")
        z = _z_capture(model, src_ids, src_mask)
        lengths = src_mask.sum(1)  # real source tokens per row (right-padded)
        T = mask.shape[1]
        pos = torch.minimum(torch.arange(T)[None, :], (lengths - 1)[:, None])  # [batch, T]
        self._source = {L: v.gather(1, pos[:, :, None, None].expand(-1, -1, v.shape[2], v.shape[3]))
                        for L, v in z.items()}
        return self

    def values(self, layer: int, z: Tensor) -> Tensor:
        if self.spec.corpus == "self":
            return z
        return self._source[layer].to(z.device, z.dtype)
