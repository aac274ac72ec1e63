"""Atomic file writes: a temp file in the target's folder, then ``os.replace``.

A crash or a SIGKILL mid-write leaves the old file (or none), never a half-written one.
Every results file lens_heads writes goes through here.
"""

from __future__ import annotations

import contextlib
import os
import tempfile
from contextlib import contextmanager
from pathlib import Path
from typing import Callable, Iterator, Sequence

from lens_heads.errors import LensHeadsError


def _folder(path: Path, make_parents: bool) -> Path:
    if make_parents:
        path.parent.mkdir(parents=True, exist_ok=True)
    elif not path.parent.is_dir():
        raise LensHeadsError(f"cannot write {path}: folder {path.parent} does not exist")
    return path.parent


@contextmanager
def atomic_path(path: str | os.PathLike, make_parents: bool = False) -> Iterator[Path]:
    """Yield a temp path beside ``path``; on success it replaces ``path``, on error it is removed.

    For writers that want a file name (``DataFrame.to_parquet``, ``safetensors.save_file``).
    The file gets ordinary permissions (0666 & ~umask), not mkstemp's 0600.
    """
    path = Path(path)
    fd, tmp = tempfile.mkstemp(dir=_folder(path, make_parents), prefix=f".{path.name}.", suffix=".tmp")
    os.close(fd)
    try:
        yield Path(tmp)
        umask = os.umask(0)
        os.umask(umask)
        os.chmod(tmp, 0o666 & ~umask)
        os.replace(tmp, path)
    finally:
        Path(tmp).unlink(missing_ok=True)


def atomic_write_all(writes: Sequence[tuple[str | os.PathLike, Callable[[str], object]]]) -> None:
    """Several files that belong together: ``write(tmp_name)`` each to a temp file beside its
    target; only when every write succeeded are they renamed into place (an error leaves all
    the old files as they were)."""
    with contextlib.ExitStack() as stack:
        for target, write in writes:
            write(str(stack.enter_context(atomic_path(target))))


def atomic_write_text(path: str | os.PathLike, text: str, make_parents: bool = False) -> Path:
    """Write ``text`` (UTF-8, fsynced) to ``path`` atomically; returns the path."""
    with atomic_path(path, make_parents) as tmp:
        with open(tmp, "w", encoding="utf-8", newline="") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
    return Path(path)


def atomic_write_csv(frame, path: str | os.PathLike, make_parents: bool = False, **to_csv) -> Path:
    """Write a pandas DataFrame as CSV (no index column) atomically."""
    return atomic_write_text(path, frame.to_csv(index=False, lineterminator="\n", **to_csv), make_parents)
