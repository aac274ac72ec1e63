"""Plain-text corpora -> list[str] -> token sequences -> padded batches.

Three steps, each usable alone:

    texts = load_texts("c4", n=200)                       # list[str]
    seqs  = tokenize_texts(tok, texts, max_len=256)       # list[1-D LongTensor], variable length
    for idx, ids, mask in iter_batches(seqs, 16, pad_id=tok.pad_token_id or 0):
        ...                                               # results[idx] = ... restores input order

``load_texts(spec)`` accepts

* a registered corpus name (see ``CORPORA``): ``c4`` (C4 en validation), ``c4-train``
  (C4 en train), ``wikitext2`` (WikiText-2 raw test, one input per article), ``wikitext2-train``
  (WikiText-2 raw train, articles; local as ``wikitext2/train_raw.txt`` under the data root),
  ``wikitext2-valid`` (WikiText-2 validation, see below). A local copy under the data root
  (``lens_heads.data.paths``) is used when present, else the same data from the hub.
  ``c4-sample``: the 48 C4 (en) validation texts shipped inside the package
  (``lens_heads/demo_data``), always local. ``default_corpus("c4")`` is what a command uses
  when its data is only a default: ``c4`` with a local copy, else ``c4-sample``.
* a local file: ``.txt`` (one input per non-empty line, stripped), ``.jsonl`` / ``.json``
  / ``.parquet`` / ``.csv`` (the ``text`` column; ``text_field=`` picks another);
* a Hugging Face dataset id, optionally ``"path:config"`` (e.g. ``"wikitext:wikitext-2-raw-v1"``);
  needs network access or the datasets cache. ``split`` defaults to ``"train"``.

Empty / whitespace-only texts are always dropped. ``n`` keeps the first ``n`` texts in
file order (no shuffling), so results are reproducible.

WikiText-2 choice: ``wikitext2`` yields whole *articles* (split at top-level headings
``" = Title = "``, each article's non-empty lines joined with ``"\\n"``), since a
paragraph-per-input split leaves many tiny inputs (headings of 3-6 tokens) whose
attention statistics are dominated by the first token. For one input per paragraph,
pass the file itself: ``load_texts(".../wikitext2/test_raw.txt")``.
``wikitext2-valid``: only the *tokenised* WikiText-2 (v1: ``<unk>``, ``@-@``) validation
split is available offline, so this name means wikitext-2-v1 validation both locally and
on the hub (articles, as above).
"""

from __future__ import annotations

import contextlib
import csv
import difflib
import json
import os
import re
from dataclasses import dataclass
from itertools import islice
from pathlib import Path
from typing import Iterable, Iterator, Sequence

import torch

from lens_heads.batching import positive_batch_size
from lens_heads.data.paths import DATA_ENV, hub_offline, load_hub_dataset, local_file
from lens_heads.data.paths import data_root as resolve_root
from lens_heads.errors import LensHeadsError
from lens_heads.registry import Registry

# -----------------------------------------------------------------------------
# Named corpora


@dataclass(frozen=True)
class CorpusSpec:
    """A named corpus: a local file under the data root, and the hub data it mirrors."""

    name: str
    local: str  # path relative to the data root
    hub_path: str
    hub_name: str | None
    hub_split: str
    unit: str = "document"  # "document": one row = one input; "article": WikiText article grouping
    text_field: str = "text"
    streaming: bool = False  # stream from the hub (C4 is far too big to download for a sample)
    about: str = ""
    shipped: bool = False  # ``local`` is a file of the package's demo_data, never the hub
    sample: str | None = None  # a shipped corpus that stands in offline (named in errors, and as a default)


CORPORA: Registry[CorpusSpec] = Registry("corpus", {
    c.name: c
    for c in [
        CorpusSpec("c4", "c4/c4_validation_2k.jsonl", "allenai/c4", "en", "validation", streaming=True,
                   about="C4 en validation (local: a 2,000-doc sample)", sample="c4-sample"),
        CorpusSpec("c4-train", "c4/c4_train_1k.jsonl", "allenai/c4", "en", "train", streaming=True,
                   about="C4 en train (local: the first 1,000 docs)"),
        CorpusSpec("c4-sample", "c4_validation_sample.jsonl", "allenai/c4", "en", "validation", shipped=True,
                   about="48 C4 en validation texts shipped with lens_heads, offline"),
        CorpusSpec("wikitext2", "wikitext2/test_raw.txt", "Salesforce/wikitext", "wikitext-2-raw-v1", "test",
                   unit="article", about="WikiText-2 raw test, one input per article"),
        CorpusSpec("wikitext2-train", "wikitext2/train_raw.txt", "Salesforce/wikitext", "wikitext-2-raw-v1", "train",
                   unit="article", about="WikiText-2 raw train, one input per article (a training corpus)"),
        CorpusSpec("wikitext2-valid", "wikitext2/valid.txt", "Salesforce/wikitext", "wikitext-2-v1", "validation",
                   unit="article", about="WikiText-2 (tokenised v1) validation, one input per article"),
    ]
})

# Split aliases so that e.g. load_texts("c4", split="train") means "c4-train".
_SPLIT_ALIASES = {
    ("c4", "train"): "c4-train",
    ("c4", "validation"): "c4",
    ("c4-train", "validation"): "c4",
    ("wikitext2", "validation"): "wikitext2-valid",
    ("wikitext2", "valid"): "wikitext2-valid",
    ("wikitext2-valid", "test"): "wikitext2",
    ("wikitext2", "train"): "wikitext2-train",
}

_FILE_SUFFIXES = {".txt", ".jsonl", ".json", ".parquet", ".csv"}


def load_texts(
    spec: str | os.PathLike,
    n: int | None = None,
    split: str | None = None,
    *,
    text_field: str = "text",
    data_root: str | os.PathLike | None = None,
) -> list[str]:
    """Load a corpus as a list of non-empty strings (see the module docstring for ``spec``)."""
    if n is not None and n < 0:
        raise LensHeadsError(f"n must be >= 0, got {n}")
    spec_s = os.fspath(spec)

    if spec_s in CORPORA:
        name = _SPLIT_ALIASES.get((spec_s, split), spec_s) if split else spec_s
        c = CORPORA[name]
        if split and (spec_s, split) not in _SPLIT_ALIASES and split != c.hub_split:
            raise LensHeadsError(f"Corpus {spec_s!r} has no split {split!r}; try one of: {_corpus_names()}")
        path = shipped_file(c.local) if c.shipped else local_file(c.local, data_root)
        if path is not None:
            texts = _read_file(path, c.text_field, n=None if c.unit == "article" else n)
        else:
            try:
                texts = _read_hub(c.hub_path, c.hub_name, c.hub_split, c.text_field,
                                  n=None if c.unit == "article" else n, streaming=c.streaming,
                                  what=f"corpus {name!r}")
            except LensHeadsError as exc:
                if hub_offline():
                    raise LensHeadsError(_offline_message(c, data_root)) from None
                if c.sample:
                    raise LensHeadsError(f"{exc} Or use {c.sample!r} ({CORPORA[c.sample].about}).") from None
                raise
        if c.unit == "article":
            texts = wikitext_articles(texts)
        return _clean(texts, n)

    path = Path(spec_s).expanduser()
    if path.exists():
        if path.is_dir():
            raise LensHeadsError(f"{path} is a folder; pass a file (.txt, .jsonl, .json, .parquet, .csv)")
        with readable(path):
            return _clean(_read_file(path, text_field, n), n)
    if path.suffix.lower() in _FILE_SUFFIXES or (os.sep in spec_s and not _looks_like_hub_id(spec_s)):
        raise LensHeadsError(
            f"Text file not found: {spec_s}. Named corpora: {_corpus_names()}; "
            f"or give an existing .txt/.jsonl/.json/.parquet/.csv file, or a hub dataset id."
        )
    near = difflib.get_close_matches(spec_s.lower(), list(CORPORA), n=1, cutoff=0.75)
    if not _looks_like_hub_id(spec_s) or (near and "/" not in spec_s):
        guess = f" Did you mean {near[0]!r}?" if near else ""
        raise LensHeadsError(f"Unknown corpus {spec_s!r}.{guess} Named corpora: {_corpus_names()}; "
                             f"or give a local file path or a hub dataset id like 'allenai/c4:en'.")
    hub_path, _, hub_name = spec_s.partition(":")
    return _clean(_read_hub(hub_path, hub_name or None, split or "train", text_field, n=n,
                            streaming=n is not None, what=f"dataset {spec_s!r}"), n)


@contextlib.contextmanager
def readable(path: Path):
    """Turn a file that cannot be decoded (not UTF-8, binary, a corrupt Parquet/CSV) into one
    message naming the file and what is wrong."""
    try:
        yield
    except UnicodeDecodeError as exc:
        raise LensHeadsError(f"{path}: not UTF-8 text (byte {exc.start}: {exc.reason}); convert it first, "
                             f"e.g. iconv -f latin1 -t utf-8 {path.name} > {path.stem}.utf8{path.suffix}") from None
    except LensHeadsError:
        raise
    except (OSError, ValueError, csv.Error) as exc:  # pyarrow's ArrowInvalid is a ValueError
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise LensHeadsError(f"{path}: cannot be read as a {path.suffix.lstrip('.') or 'text'} file ({first})") from None


def shipped_file(name: str) -> Path:
    """A data file shipped inside the package (``lens_heads/demo_data``)."""
    from importlib.resources import files

    return Path(str(files("lens_heads") / "demo_data" / name))


def _offline_message(c: CorpusSpec, explicit_root) -> str:
    """One line for a named corpus with no local copy while the hub is off: how to fix it."""
    root = resolve_root(explicit_root)
    where = (f"{DATA_ENV} is unset" if root is None and explicit_root is None
             else f"{root} has no {c.local}")
    fix = f"set {DATA_ENV} to a folder holding {c.local}"
    if c.sample:
        fix += f", or use {c.sample!r} ({CORPORA[c.sample].about})"
    return (f"corpus {c.name!r} ({c.hub_path}) has no local copy ({where}) and the hub is offline "
            f"(HF_HUB_OFFLINE / HF_DATASETS_OFFLINE): {fix}")


def default_corpus(name: str = "c4", data_root: str | os.PathLike | None = None) -> tuple[str, str | None]:
    """The corpus a command reads when its data is only a default (the user named none):
    ``name`` when its local copy exists under the data root, else its shipped sample
    (``c4`` -> ``c4-sample``), with a one-line note saying so (None when ``name`` stands)."""
    c = CORPORA[name]
    if c.sample is None or local_file(c.local, data_root) is not None:
        return name, None
    root = data_root if data_root is not None else os.environ.get(DATA_ENV)
    why = f"{DATA_ENV} is unset" if not root else f"{root} has no {c.local}"
    return c.sample, (f"no local copy of {name!r} ({why}): using {c.sample!r}, "
                      f"{CORPORA[c.sample].about}; pass --data to choose")


def _corpus_names() -> str:
    return ", ".join(f"{k} ({v.about})" for k, v in CORPORA.items())


def _looks_like_hub_id(s: str) -> bool:
    # "owner/name", "name" or either with ":config"; no spaces, not a relative/absolute path.
    if s.startswith((".", "/", "~")):
        return False
    return bool(re.fullmatch(r"[\w.\-]+(/[\w.\-]+)?(:[\w.\-]+)?", s))


def _clean(texts: Iterable[str], n: int | None) -> list[str]:
    out = [t for t in texts if isinstance(t, str) and t.strip()]
    return out if n is None else out[:n]


def _read_file(path: Path, text_field: str, n: int | None) -> list[str]:
    """Read texts from a local file; ``n`` (if given) lets us stop early on big files."""
    suffix = path.suffix.lower()
    if suffix == ".txt":
        with open(path, encoding="utf-8") as f:
            lines = (line.strip() for line in f)
            if n is not None:
                return list(islice((l for l in lines if l), n))
            # keep empty lines for article grouping (wikitext); _clean() drops them later
            return [line for line in lines]
    if suffix in (".jsonl", ".json", ".parquet", ".csv"):
        rows = iter_rows(path)
        out = []
        for i, row in enumerate(rows):
            if text_field not in row:
                raise LensHeadsError(
                    f"{path}: row {i} has no field {text_field!r} (fields: {', '.join(map(str, sorted(row)))}); "
                    f"name the text field {text_field!r}, or pass text_field=... to load_texts in Python"
                )
            t = row[text_field]
            if isinstance(t, str) and t.strip():
                out.append(t)
                if n is not None and len(out) >= n:
                    break
        return out
    raise LensHeadsError(f"Unsupported text file type {suffix!r} ({path}); use .txt, .jsonl, .json, .parquet or .csv")


def iter_rows(path: str | os.PathLike) -> Iterator[dict]:
    """Rows of a .jsonl / .json (list of objects) / .csv / .parquet file as dicts (an unreadable
    file: one message naming it)."""
    path = Path(path)
    with readable(path):
        yield from _iter_rows(path)


def _iter_rows(path: Path) -> Iterator[dict]:
    suffix = path.suffix.lower()
    if suffix == ".jsonl":
        with open(path, encoding="utf-8") as f:
            for lineno, line in enumerate(f, 1):
                if not line.strip():
                    continue
                try:
                    row = json.loads(line)
                except json.JSONDecodeError as e:
                    raise LensHeadsError(f"{path}:{lineno}: not valid JSON ({e.msg})") from None
                if not isinstance(row, dict):
                    raise LensHeadsError(f"{path}:{lineno}: expected a JSON object per line, got {type(row).__name__}")
                yield row
    elif suffix == ".json":
        with open(path, encoding="utf-8") as f:
            try:
                data = json.load(f)
            except json.JSONDecodeError as e:
                raise LensHeadsError(f"{path}: not valid JSON ({e.msg} at line {e.lineno})") from None
        if isinstance(data, dict):  # {"col": [...], ...} column form
            keys = list(data)
            data = [dict(zip(keys, vals)) for vals in zip(*(data[k] for k in keys))]
        if not isinstance(data, list):
            raise LensHeadsError(f"{path}: expected a list of objects")
        yield from data
    elif suffix == ".csv":
        with open(path, encoding="utf-8", newline="") as f:
            yield from csv.DictReader(f)
    elif suffix == ".parquet":
        import pyarrow.parquet as pq

        yield from pq.read_table(path).to_pylist()
    else:
        raise LensHeadsError(f"Unsupported file type {suffix!r} ({path}); use .jsonl, .json, .csv or .parquet")


def _read_hub(path: str, name: str | None, split: str, text_field: str, *, n: int | None,
              streaming: bool, what: str) -> list[str]:
    ds = load_hub_dataset(path, name, split, streaming=streaming, what=what)
    cols = getattr(ds, "column_names", None)
    if cols is not None and text_field not in cols:
        raise LensHeadsError(f"{what}: no column {text_field!r}; columns available: {cols}. Pass text_field=...")
    texts = (row[text_field] for row in ds) if streaming else iter(ds[text_field])
    if n is not None:
        out = []
        for t in texts:
            if isinstance(t, str) and t.strip():
                out.append(t)
                if len(out) >= n:
                    break
        return out
    return list(texts)


_TITLE = re.compile(r"^= [^=].* =$")  # top-level WikiText heading, after strip(): "= Robert Boulter ="


def wikitext_articles(lines: Sequence[str]) -> list[str]:
    """Group WikiText lines (file lines or hub rows) into articles.

    A new article starts at each top-level heading ``" = Title = "``; section headings
    (``" = = Career = = "``) stay inside. Each article = its non-empty stripped lines
    joined with ``"\\n"``.
    """
    articles: list[list[str]] = []
    for line in lines:
        s = line.strip()
        if not s:
            continue
        if _TITLE.match(s) or not articles:
            articles.append([])
        articles[-1].append(s)
    return ["\n".join(a) for a in articles]


# -----------------------------------------------------------------------------
# Tokenisation


def special_tokens_added(tokenizer) -> tuple[list[int], list[int]]:
    """The token ids the tokenizer adds by default before and after a text (e.g. ([BOS], []))."""
    probe = "hello world"
    with_sp = list(tokenizer(probe, add_special_tokens=True)["input_ids"])
    without = list(tokenizer(probe, add_special_tokens=False)["input_ids"])
    for i in range(len(with_sp) - len(without) + 1):
        if with_sp[i : i + len(without)] == without:
            return with_sp[:i], with_sp[i + len(without) :]
    return [], []  # unusual tokenizer: treat as adding nothing


def tokenize_texts(
    tokenizer,
    texts: Sequence[str],
    max_len: int,
    mode: str = "documents",
    n_inputs: int | None = None,
    add_bos: bool | None = None,
) -> list[torch.Tensor]:
    """Turn texts into model inputs: a list of 1-D LongTensors of at most ``max_len`` tokens.

    mode="documents": each text is one input, truncated to ``max_len`` tokens; empty texts
        are dropped.
    mode="chunks": all texts are tokenised (without special tokens), joined with the EOS
        token between documents (when the tokenizer has one), and cut into non-overlapping
        chunks; the incomplete tail is dropped, so every chunk has exactly ``max_len`` tokens.
        If a BOS is used (see below) each chunk starts with it and carries ``max_len - 1``
        text tokens, so position 0 means the same thing in every input.

    add_bos=None follows the tokenizer's own behaviour (``tokenizer(text)`` adds a BOS for
    Llama-style tokenizers, nothing for Qwen2.5 / GPT-2); True forces one BOS at the start of
    each input (error if the tokenizer has no BOS token); False never adds special tokens.

    ``n_inputs`` stops after that many inputs (tokenising no more text than needed).
    """
    if mode not in ("documents", "chunks"):
        raise LensHeadsError(f"mode must be 'documents' or 'chunks', got {mode!r}")
    if max_len < 1 or (mode == "chunks" and max_len < 2):
        raise LensHeadsError(f"max_len too small: {max_len}")
    if add_bos and getattr(tokenizer, "bos_token_id", None) is None:
        raise LensHeadsError("add_bos=True but this tokenizer has no BOS token; use add_bos=None or False")
    if isinstance(texts, str):
        texts = [texts]
    limit = float("inf") if n_inputs is None else n_inputs
    out: list[torch.Tensor] = []
    if limit <= 0:
        return out

    if mode == "documents":
        for text in texts:
            if not text or not text.strip():
                continue
            if add_bos is None:
                ids = tokenizer(text, add_special_tokens=True, truncation=True, max_length=max_len)["input_ids"]
            else:
                ids = tokenizer(text, add_special_tokens=False, truncation=True,
                                max_length=max_len - 1 if add_bos else max_len)["input_ids"]
                if add_bos:
                    ids = [tokenizer.bos_token_id] + list(ids)
            out.append(torch.tensor(ids, dtype=torch.long))
            if len(out) >= limit:
                break
        return out

    # chunks
    if add_bos is None:
        prefix, _ = special_tokens_added(tokenizer)
    else:
        prefix = [tokenizer.bos_token_id] if add_bos else []
    body = max_len - len(prefix)
    if body < 1:
        raise LensHeadsError(f"max_len={max_len} leaves no room after {len(prefix)} prefix token(s)")
    eos = getattr(tokenizer, "eos_token_id", None)
    buf: list[int] = []  # token stream not yet emitted
    first = True
    for text in texts:
        if not text or not text.strip():
            continue
        if not first and eos is not None:
            buf.append(eos)
        first = False
        # verbose=False: long documents are expected here, no "longer than max length" warning
        buf.extend(tokenizer(text, add_special_tokens=False, verbose=False)["input_ids"])
        start = 0
        while len(buf) - start >= body and len(out) < limit:
            out.append(torch.tensor(prefix + buf[start : start + body], dtype=torch.long))
            start += body
        buf = buf[start:]
        if len(out) >= limit:
            break
    return out


# -----------------------------------------------------------------------------
# Batching


def pad_batch(seqs: Sequence[torch.Tensor], pad_id: int, side: str = "right") -> tuple[torch.Tensor, torch.Tensor]:
    """Stack variable-length 1-D sequences into (input_ids [b, T], attention_mask [b, T]).

    Both are LongTensors; mask is 1 on real tokens, 0 on padding. side="left" puts the
    padding first (needed for generation / last-token-aligned batches).
    """
    if side not in ("right", "left"):
        raise LensHeadsError(f"side must be 'right' or 'left', got {side!r}")
    if len(seqs) == 0:
        raise LensHeadsError("pad_batch needs at least one sequence")
    seqs = [torch.as_tensor(s, dtype=torch.long).reshape(-1) for s in seqs]
    T = max(len(s) for s in seqs)
    ids = torch.full((len(seqs), T), int(pad_id), dtype=torch.long)
    mask = torch.zeros((len(seqs), T), dtype=torch.long)
    for i, s in enumerate(seqs):
        L = len(s)
        if L == 0:
            continue
        if side == "right":
            ids[i, :L], mask[i, :L] = s, 1
        else:
            ids[i, T - L :], mask[i, T - L :] = s, 1
    return ids, mask


def iter_batches(
    seqs: Sequence[torch.Tensor],
    batch_size: int,
    sort_by_length: bool = True,
    *,
    pad_id: int = 0,
    side: str = "right",
) -> Iterator[tuple[list[int], torch.Tensor, torch.Tensor]]:
    """Yield ``(indices, input_ids, attention_mask)`` batches over ``seqs``.

    With ``sort_by_length`` the inputs are grouped longest-first (stable), which keeps
    padding small; ``indices`` are the positions in ``seqs`` of each batch row, so
    ``results[indices[r]] = row_result`` puts everything back in input order.
    """
    batch_size = positive_batch_size(batch_size)
    order = list(range(len(seqs)))
    if sort_by_length:
        order.sort(key=lambda i: -len(seqs[i]))
    for start in range(0, len(order), batch_size):
        idx = order[start : start + batch_size]
        ids, mask = pad_batch([seqs[i] for i in idx], pad_id, side)
        yield idx, ids, mask
