"""Claim files: one process computes a unit of work while others on the same folder skip it.

A claim is ``<record path>.claim``, created with ``O_CREAT | O_EXCL`` (so exactly one process
gets it) and holding the owner's host, pid and start time. While the owner works, a thread
touches the file every ``HEARTBEAT_S`` seconds. A claim is *stale* when its owner is gone: on
the same host, its pid no longer runs; on another host (a shared filesystem), it has not been
touched for ``STALE_S`` seconds. A stale claim is taken over by renaming it away first (only one
of several processes that saw it stale wins the rename), then claiming afresh.

    with claim(path) as mine:
        if mine:
            ... compute, store the record at ``path`` ...
        # else another live process has it: do other work, come back later

The record itself is written atomically by the store; the claim only avoids doing the work
twice. Removing a claim file by hand releases the unit.
"""

from __future__ import annotations

import contextlib
import json
import os
import socket
import threading
import time
from pathlib import Path
from typing import Iterator

HEARTBEAT_S = 30.0
STALE_S = 300.0  # another host's claim untouched this long: its owner is taken to be gone


def claim_path(record: Path) -> Path:
    return Path(str(record) + ".claim")


def pid_alive(pid: int) -> bool:
    """Whether process ``pid`` runs on this host."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # exists, owned by someone else
        return True
    return True


def owner(path: Path) -> dict | None:
    """The claim's owner ({"host", "pid", "since"}), None when there is no (readable) claim."""
    return _read(claim_path(path))


def _read(c: Path) -> dict | None:
    try:
        info = json.loads(c.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return info if isinstance(info, dict) and isinstance(info.get("pid"), int) else None


def is_stale(path: Path, stale_s: float = STALE_S) -> bool:
    """Whether the claim on ``path`` belongs to a process that is gone (see module docstring)."""
    c = claim_path(path)
    try:
        age = time.time() - c.stat().st_mtime
    except FileNotFoundError:
        return False
    if age > stale_s:  # a live owner touches its claim every HEARTBEAT_S seconds
        return True
    info = owner(path)
    if info is None:  # half-written or garbled: judged by its age alone
        return False
    if info.get("host") == socket.gethostname():  # a dead pid here needs no waiting
        return not pid_alive(info["pid"]) or (info["pid"] == os.getpid() and claim_path(path) not in _held)
    return False


def _create(c: Path) -> bool:
    try:
        fd = os.open(c, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
    except FileExistsError:
        return False
    with os.fdopen(fd, "w", encoding="utf-8") as f:
        json.dump({"host": socket.gethostname(), "pid": os.getpid(), "since": time.time()}, f)
    return True


def try_claim(path: Path, stale_s: float = STALE_S) -> bool:
    """Claim ``path``'s unit; True when this process now holds it."""
    c = claim_path(path)
    c.parent.mkdir(parents=True, exist_ok=True)
    if _create(c):
        return True
    judged = owner(path)
    if not is_stale(path, stale_s):
        return False
    taken = c.with_name(f"{c.name}.stale.{os.getpid()}")
    try:
        os.rename(c, taken)  # one taker wins; the others find the claim gone or fresh
    except FileNotFoundError:
        return _create(c)
    if _read(taken) != judged:  # another taker replaced it meanwhile: that fresh claim is theirs
        with contextlib.suppress(OSError):
            os.link(taken, c)  # put it back (fails if a newer claim is there already)
        taken.unlink(missing_ok=True)
        return False
    taken.unlink(missing_ok=True)
    return _create(c)


_held: set[Path] = set()  # claims this process holds now (a reused pid of ours is not an owner)


def release(path: Path) -> None:
    c = claim_path(path)
    _held.discard(c)
    info = owner(path)
    if info is not None and info.get("pid") == os.getpid() and info.get("host") == socket.gethostname():
        c.unlink(missing_ok=True)


@contextlib.contextmanager
def claim(path: str | os.PathLike, stale_s: float = STALE_S, heartbeat_s: float = HEARTBEAT_S) -> Iterator[bool]:
    """Hold the claim on ``path`` for the ``with`` block when it can be had (yields True), else
    yield False at once. The claim is released when the block ends, however it ends."""
    path = Path(path)
    if not try_claim(path, stale_s):
        yield False
        return
    done = threading.Event()

    def beat() -> None:
        while not done.wait(heartbeat_s):
            with contextlib.suppress(OSError):
                os.utime(claim_path(path))

    _held.add(claim_path(path))
    t = threading.Thread(target=beat, daemon=True)
    t.start()
    try:
        yield True
    finally:
        done.set()
        t.join()
        release(path)


def wait_for(path: Path, poll_s: float = 2.0, stale_s: float = STALE_S) -> bool:
    """Wait while another live process holds ``path``'s claim and its record is missing.
    True when the record appeared; False when the claim went away without it (the unit is
    free again)."""
    while not path.is_file():
        if not claim_path(path).exists() or is_stale(path, stale_s):
            return path.is_file()
        time.sleep(poll_s)
    return True
