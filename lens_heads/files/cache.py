"""The on-disk cache: ``$LENS_HEADS_CACHE`` (default ``~/.cache/lens_heads``).

It holds what is expensive to make and fully determined by its key: zoo weights
(``lens_heads.models.zoo``), per-head means of a corpus (``head_means/``) and the per-question
tables of question-level scores (a folder named for each score). Entries are written atomically, so processes sharing
the cache never read half a file; two that miss at once both compute, and the last rename wins
(the same bytes).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Callable

from torch import Tensor
from lens_heads.files.atomic import atomic_path


def cache_dir(sub: str | None = None) -> Path:
    root = Path(os.environ.get("LENS_HEADS_CACHE", Path.home() / ".cache" / "lens_heads"))
    return root / sub if sub else root


def cached_tensors(path: Path, make: Callable[[], dict[str, Tensor]]) -> dict[str, Tensor]:
    """The tensors stored at ``path`` (safetensors), else ``make()``'s, stored there first."""
    from safetensors.torch import load_file, save_file


    if path.is_file():
        return load_file(str(path))
    made = make()
    path.parent.mkdir(parents=True, exist_ok=True)
    with atomic_path(path) as tmp:
        save_file({k: v.contiguous() for k, v in made.items()}, str(tmp))
    return made
