"""Export a repaired model with ``save_pretrained`` (+ tokenizer), atomically per file.

The folder reloads with ``transformers.AutoModelForCausalLM.from_pretrained(dir)`` and with
``lens_heads.load_model(dir)``. Files are written to a temporary folder next to the target and
then moved in, so a failure leaves no half-written model.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path

from lens_heads.files.atomic import owner_tag, plain_permissions, temp_is_stale
from lens_heads.errors import LensHeadsError


def check_out_dir(out_dir: str | os.PathLike, source) -> Path:
    """Refuse to write into the folder the model was loaded from (its files must stay untouched)."""
    out = Path(out_dir).expanduser().resolve()
    src = Path(source.gguf_file).parent if source.gguf_file else Path(source.path)
    if src.exists() and src.expanduser().resolve() == out:
        raise LensHeadsError(f"--out {out_dir} is the folder the model was loaded from; choose another folder")
    if out.exists() and not out.is_dir():
        raise LensHeadsError(f"--out {out_dir} exists and is not a folder")
    return out


EXPORT_PREFIX = ".export."  # the staging folder of an export in progress, inside the output folder


def remove_stale_exports(out: Path) -> list[Path]:
    """Remove the staging folders a killed export left in ``out`` (``atomic.temp_is_stale``: a
    live export's stays); returns what was removed."""
    removed = []
    for stale in Path(out).glob(f"{EXPORT_PREFIX}*"):
        if stale.is_dir() and temp_is_stale(stale, EXPORT_PREFIX):
            shutil.rmtree(stale, ignore_errors=True)
            removed.append(stale)
    return removed


def export_model(hf_model, tokenizer, out_dir: str | os.PathLike, extra_files: dict[str, str] | None = None) -> Path:
    """``save_pretrained`` of the model and tokenizer (plus ``extra_files``: name -> text) into ``out_dir``."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    remove_stale_exports(out)
    tmp = Path(tempfile.mkdtemp(prefix=f"{EXPORT_PREFIX}{owner_tag()}", dir=out))
    try:
        for p in hf_model.parameters():
            p.requires_grad_(False)
        hf_model.save_pretrained(tmp)
        tokenizer.save_pretrained(tmp)
        for name, text in (extra_files or {}).items():
            (tmp / name).write_text(text, encoding="utf-8")
        for f in tmp.iterdir():
            plain_permissions(f)  # 0666 & ~umask, as every other file: others on a shared cluster read the weights
            os.replace(f, out / f.name)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return out
