"""Where local copies of the named corpora and tasks live (the "data root").

The data root is a folder laid out like the project's ``shared/data``::

    mmlu/{dev,test}/<subject>_{dev,test}.csv
    piqa/valid.jsonl, piqa/valid-labels.lst
    winogrande/dev.jsonl
    c4/c4_validation_2k.jsonl, c4/c4_train_1k.jsonl
    wikitext2/test_raw.txt, wikitext2/valid.txt

Resolution order (first hit wins):

1. an explicit ``data_root=`` argument;
2. the environment variable ``LENS_HEADS_DATA`` (used as given, even if missing, so a
   typo shows up as "not found locally" rather than silently using another copy).

There is no other default: without either, loaders use the Hugging Face hub (and its local
datasets cache). Tests and CI point ``LENS_HEADS_DATA`` at their copy. ``c4-sample`` needs
neither: it is shipped inside the package (``lens_heads/demo_data``), and a command whose data
is only its default ``c4`` reads it when no local copy exists (``corpora.default_corpus``).
"""

from __future__ import annotations

import os
from pathlib import Path
from lens_heads.errors import LensHeadsError

DATA_ENV = "LENS_HEADS_DATA"

def candidate_data_roots() -> list[Path]:
    """Where local copies are looked for: ``$LENS_HEADS_DATA`` when set, else nowhere."""
    env = os.environ.get(DATA_ENV)
    return [Path(env).expanduser()] if env else []


def data_root(explicit: str | os.PathLike | None = None) -> Path | None:
    """The data root folder (explicit, else ``$LENS_HEADS_DATA``), or None: use the hub."""
    if explicit is not None:
        return Path(explicit).expanduser()
    roots = candidate_data_roots()
    return roots[0] if roots else None


def local_file(relpath: str, explicit_root: str | os.PathLike | None = None) -> Path | None:
    """``<data root>/<relpath>`` if that file (or folder) exists, else None."""
    root = data_root(explicit_root)
    if root is None:
        return None
    p = root / relpath
    return p if p.exists() else None


def hub_offline() -> bool:
    """True when the environment asks the HF libraries not to touch the network."""
    truthy = {"1", "true", "yes", "on"}
    return any(os.environ.get(k, "").strip().lower() in truthy for k in ("HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE"))


def load_hub_dataset(path: str, name: str | None, split: str, *, streaming: bool = False, what: str = ""):
    """``datasets.load_dataset`` with one clear LensHeadsError on failure (offline, typo...)."""

    label = f"{path}" + (f" ({name})" if name else "") + f" split={split!r}"
    try:
        from datasets import load_dataset  # imported here: heavy, and not needed for local data

        return load_dataset(path, name, split=split, streaming=streaming)
    except Exception as e:  # datasets raises many types (ConnectionError, FileNotFoundError, ValueError...)
        env = os.environ.get(DATA_ENV)
        where = f"{DATA_ENV}={env} is set and has no copy" if env else f"set {DATA_ENV} to a folder holding one"
        hint = (
            " The hub is unreachable in offline mode (HF_HUB_OFFLINE / HF_DATASETS_OFFLINE is set) and the"
            " dataset is not in the local datasets cache."
            if hub_offline()
            else ""
        )
        raise LensHeadsError(
            f"Could not load {what or 'dataset'} from the Hugging Face hub: {label}: "
            f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}.{hint} "
            f"For offline use put a local copy under a data root ({where}; see lens_heads.data.paths) "
            f"or pass a local file path."
        ) from None
