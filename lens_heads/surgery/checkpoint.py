"""Training checkpoints: trainable tensors as safetensors, everything else in one .pt file.

Layout of a checkpoint folder::

    step-000012/trainable.safetensors   every trainable tensor (whole tensors, HF names)
    step-000012/best.safetensors        the best-so-far trainable tensors (early stopping)
    step-000012/state.pt                optimizer, scheduler, step, epoch, history, RNG states
    LATEST                              name of the newest complete step folder

Only trainable tensors are stored: every other parameter is, by construction, identical to the
re-initialised base model, which is rebuilt deterministically before a resume. A step folder is
written under a temporary name and renamed; LATEST is replaced atomically after that, so a
crash leaves the previous checkpoint usable.

Older step folders are removed once a newer one is complete, unless ``keep_history``: then each
keeps its ``trainable.safetensors`` (what the model was at that step; its optimizer state and
best tensors go), so the drift of the heads can be measured at every checkpoint afterwards
(``surgery/drift.py``, docs/methods.md §7). ``list_checkpoints`` names them in step order.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file

from lens_heads.files.atomic import atomic_write_text


def save_checkpoint(folder: Path, step: int, trainable: dict[str, torch.Tensor],
                    best: dict[str, torch.Tensor] | None, state: dict, keep_history: bool = False) -> Path:
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    name = f"step-{step:06d}"
    for stale in folder.glob(".step-*"):  # half-written step folders of a killed run
        shutil.rmtree(stale, ignore_errors=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{name}.", dir=folder))
    try:
        save_file({k: v.detach().contiguous().cpu() for k, v in trainable.items()}, tmp / "trainable.safetensors")
        if best is not None:
            save_file({k: v.detach().contiguous().cpu() for k, v in best.items()}, tmp / "best.safetensors")
        torch.save(state, tmp / "state.pt")
        final = folder / name
        if final.exists():
            shutil.rmtree(final)
        os.replace(tmp, final)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    atomic_write_text(folder / "LATEST", name)
    for old in folder.glob("step-*"):
        if old.name == name:
            continue
        if not keep_history:
            shutil.rmtree(old, ignore_errors=True)
            continue
        for heavy in ("state.pt", "best.safetensors"):  # what only a resume reads
            (old / heavy).unlink(missing_ok=True)
    return final


STEP_PREFIX = "step-"


def list_checkpoints(folder: Path) -> list[tuple[int, Path]]:
    """(step, its trainable.safetensors) of every complete step folder in ``folder``, in step order:
    the newest always, earlier ones when they were kept (``keep_history``)."""
    out = []
    for d in Path(folder).glob(f"{STEP_PREFIX}*"):
        f = d / "trainable.safetensors"
        digits = d.name[len(STEP_PREFIX):]
        if digits.isdigit() and f.is_file():
            out.append((int(digits), f))
    return sorted(out)


def load_checkpoint(folder: Path) -> tuple[dict, dict | None, dict] | None:
    """(trainable, best or None, state) of the newest complete checkpoint, or None."""
    latest = Path(folder) / "LATEST"
    if not latest.is_file():
        return None
    step_dir = Path(folder) / latest.read_text().strip()
    trainable = load_file(step_dir / "trainable.safetensors")
    best = load_file(step_dir / "best.safetensors") if (step_dir / "best.safetensors").is_file() else None
    state = torch.load(step_dir / "state.pt", weights_only=False)
    return trainable, best, state
