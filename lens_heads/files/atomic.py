"""Atomic file writes: a temp file in the target's folder, then ``os.replace``.

A crash or a SIGKILL mid-write leaves the old file (or none), never a half-written one.
Every results file lens_heads writes goes through here.
"""

from __future__ import annotations

import contextlib
import glob
import os
import re
import socket
import tempfile
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Callable, Iterator, Sequence

from lens_heads.files.claims import pid_alive
from lens_heads.errors import LensHeadsError


def _folder(path: Path, make_parents: bool) -> Path:
    if make_parents:
        path.parent.mkdir(parents=True, exist_ok=True)
    elif not path.parent.is_dir():
        raise LensHeadsError(f"cannot write {path}: folder {path.parent} does not exist")
    return path.parent


# Temp files are named for their target and their owner: .<target>.lh-<host>-<pid>-<random>.tmp
# (.old for an old file kept aside), so a later write of the same target can tell a killed
# writer's leftovers from a live writer's file.
OTHER_HOST_STALE_S = 3600.0  # another host's temp untouched this long: its writer is gone
UNOWNED_STALE_S = 60.0  # a temp without an owner in its name (older versions) this old: gone


def owner_tag() -> str:
    """This process's part of a temp name (``lh-<host>-<pid>-``): see ``temp_is_stale``."""
    return f"lh-{socket.gethostname()}-{os.getpid()}-"


def temp_is_stale(path: Path, prefix: str) -> bool:
    """Whether the temp file or folder ``path`` (named ``prefix`` + ``owner_tag()`` + random
    characters [+ suffix]) was left by a writer that is gone: one of this host whose pid no
    longer runs; another host's untouched for ``OTHER_HOST_STALE_S``; one naming no owner (older
    versions) untouched for ``UNOWNED_STALE_S``. A live writer's temp is never stale."""
    try:
        age = time.time() - path.stat().st_mtime
    except FileNotFoundError:
        return False
    m = re.match(r"^lh-(?P<host>.+)-(?P<pid>\d+)-[^-]*$", path.name[len(prefix):])
    if m is None:
        return age > UNOWNED_STALE_S
    if m["host"] == socket.gethostname():
        return int(m["pid"]) != os.getpid() and not pid_alive(int(m["pid"]))
    return age > OTHER_HOST_STALE_S


def _temp(target: Path, suffix: str) -> Path:
    """A new empty temp file beside ``target``, named for it and this process."""
    remove_stale_temps(target)
    fd, name = tempfile.mkstemp(dir=target.parent, prefix=f".{target.name}.{owner_tag()}", suffix=suffix)
    os.close(fd)
    return Path(name)


def remove_stale_temps(target: Path) -> list[Path]:
    """Remove the temp files a killed writer of ``target`` left beside it (``temp_is_stale``);
    returns what was removed."""
    removed = []
    prefix = f".{target.name}."
    for f in target.parent.glob(f"{glob.escape(prefix)}*"):
        if f.name.endswith((".tmp", ".old")) and f.is_file() and temp_is_stale(f, prefix):
            f.unlink(missing_ok=True)
            removed.append(f)
    return removed


@contextmanager
def atomic_path(path: str | os.PathLike, make_parents: bool = False) -> Iterator[Path]:
    """Yield a temp path beside ``path``; on success it replaces ``path``, on error it is removed
    (and a killed earlier writer's temps of ``path`` are removed first: ``remove_stale_temps``).

    For writers that want a file name (``DataFrame.to_parquet``, ``safetensors.save_file``).
    The file gets ordinary permissions (0666 & ~umask), not mkstemp's 0600.
    """
    path = Path(path)
    _folder(path, make_parents)
    tmp = _temp(path, ".tmp")
    try:
        yield Path(tmp)
        plain_permissions(Path(tmp))
        os.replace(tmp, path)
    finally:
        Path(tmp).unlink(missing_ok=True)


def atomic_write_all(writes: Sequence[tuple[str | os.PathLike, Callable[[str], object]]]) -> None:
    """Several files that belong together, all or nothing: ``write(tmp_name)`` each to a temp
    file beside its target; only when every write succeeded are they renamed into place, each
    old file kept aside until the last rename succeeded. A failure anywhere (a write, a rename)
    puts every old file back and removes every new one, so the targets are as they were."""
    targets = [Path(t) for t, _ in writes]
    for t in targets:
        if t.is_dir():
            raise LensHeadsError(f"cannot write {t}: it is a folder")
    staged: list[tuple[Path, Path]] = []  # (temp file, target)
    done: list[tuple[Path, Path | None]] = []  # (target, its old file kept aside, or None)
    try:
        for target, (_, write) in zip(targets, writes):
            _folder(target, False)
            tmp = _temp(target, ".tmp")
            staged.append((tmp, target))
            write(tmp)
            plain_permissions(Path(tmp))
        for tmp, target in staged:
            kept = _keep_aside(target)  # a second name for the old file; the target stays in place
            done.append((target, kept))
            os.replace(tmp, target)
    except BaseException:
        for target, kept in reversed(done):  # undo: the old file back, or no file
            with contextlib.suppress(OSError):
                if kept is not None:
                    os.replace(kept, target)
                elif target.exists() and not target.is_dir():
                    target.unlink()
        raise
    finally:
        for tmp, _ in staged:
            tmp.unlink(missing_ok=True)
    for _, kept in done:
        if kept is not None:
            kept.unlink(missing_ok=True)


def _keep_aside(target: Path) -> Path | None:
    """A hidden second name for ``target``'s current file (a hard link, else a copy), or None."""
    if not target.exists():
        return None
    kept = _temp(target, ".old")
    kept.unlink()
    try:
        os.link(target, kept)
    except OSError:  # no hard links here
        import shutil

        shutil.copy2(target, kept)
    return kept


def plain_permissions(path: Path) -> None:
    """Ordinary permissions (0666 & ~umask), not mkstemp's 0600."""
    umask = os.umask(0)
    os.umask(umask)
    os.chmod(path, 0o666 & ~umask)


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


def read_csv_exact(path: str | os.PathLike):
    """A CSV ``atomic_write_csv`` wrote, every float read back to the bits it was written from
    (pandas 3 parses round-trip by default and deprecates asking; pandas 2 must be asked)."""
    import pandas as pd

    exact = {} if int(pd.__version__.split(".")[0]) >= 3 else {"float_precision": "round_trip"}
    return pd.read_csv(path, **exact)


# -----------------------------------------------------------------------------
# Checks before the work: can the outputs be written at all?


def _probe(folder: Path, what: str, path: Path) -> None:
    """Create and remove a file in ``folder`` (permission bits, read-only mounts and immutable
    folders all show here, also for root, where ``os.access`` says yes)."""
    try:
        fd, name = tempfile.mkstemp(dir=folder, prefix=".lens_heads-probe.")
        os.close(fd)
        os.unlink(name)
    except OSError as exc:
        raise LensHeadsError(f"{what} {path}: cannot write in {folder} ({exc.strerror or exc})") from None


def check_output_file(path: str | os.PathLike, what: str = "--out", *, make_parents: bool = False,
                      sidecars: Sequence[str | os.PathLike] = ()) -> Path:
    """Raise one clear error unless ``path`` (and its ``sidecars``) can be written as files:
    none of them is a folder, and their folder exists (or, with ``make_parents``, can be made)
    and accepts new files. Call it before any expensive work."""
    path = Path(path)
    for p in (path, *map(Path, sidecars)):
        if p.is_dir():
            raise LensHeadsError(f"{what} {path}: {p} is a folder; give a file name")
        if p.is_file():  # it will be replaced: an immutable or read-only file shows here
            try:
                with open(p, "ab"):
                    pass
            except OSError as exc:
                raise LensHeadsError(f"{what} {path}: cannot replace {p} ({exc.strerror or exc})") from None
    folder = path.parent if str(path.parent) else Path(".")
    if folder.exists() and not folder.is_dir():
        raise LensHeadsError(f"{what} {path}: {folder} is a file, not a folder")
    if not folder.exists():
        if not make_parents:
            raise LensHeadsError(f"{what} {path}: folder {folder} does not exist")
        check_output_dir(folder, what)
        return path
    _probe(folder, what, path)
    return path


def check_output_dir(path: str | os.PathLike, what: str = "--out") -> Path:
    """Raise one clear error unless ``path`` is a folder that accepts new files, or can be made
    as one (its nearest existing parent is a folder that accepts new files)."""
    path = Path(path)
    if path.exists() and not path.is_dir():
        raise LensHeadsError(f"{what} {path} exists and is not a folder")
    probe = path
    while not probe.exists():
        if probe.parent == probe:
            break
        probe = probe.parent
    if probe.exists() and not probe.is_dir():
        raise LensHeadsError(f"{what} {path}: {probe} is a file, not a folder")
    _probe(probe, what, path)
    return path
