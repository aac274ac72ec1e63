"""The project's one home for content digests (sha256, as hex strings).

Every digest here is stored somewhere (zoo pins, score metadata, repair checkpoints, result
keys), so each function's byte layout is fixed; changing one would orphan what was stored
under it (tests/test_hashing.py pins each layout against plain ``hashlib``):

- ``sha256_bytes(parts)``         the concatenation of the byte strings, in order.
- ``sha256_file(path)``           the file's bytes.
- ``sha256_files(paths)``         per file, in order: its *name* (not its folder), a NUL byte, its bytes.
- ``sha256_tokens(seqs)``         per sequence, in order: its ids as int64 bytes (native order,
                                  little-endian on every supported machine), then ``b"|"``.
- ``sha256_token_groups(*groups)``  per group: the bytes ``sha256_tokens`` hashes, then ``b"#"``.

``update_file`` / ``update_tokens`` write the same layouts into a caller's running ``hashlib``
object, for a digest that mixes them with other fields.
"""

from __future__ import annotations

import hashlib
import os
from pathlib import Path
from typing import TYPE_CHECKING, Iterable

if TYPE_CHECKING:  # torch is imported on use: the file digests (the zoo) do not need it
    from torch import Tensor

CHUNK = 1 << 22  # bytes read per file block (4 MiB); it does not affect the digest


def sha256_bytes(parts: Iterable[bytes]) -> str:
    """sha256 of the byte strings ``parts`` concatenated in order."""
    digest = hashlib.sha256()
    for part in parts:
        digest.update(part)
    return digest.hexdigest()


def update_file(digest, path: str | os.PathLike, chunk: int = CHUNK) -> None:
    """Feed one file's bytes into ``digest``, block by block."""
    with open(path, "rb") as f:
        while block := f.read(chunk):
            digest.update(block)


def sha256_file(path: str | os.PathLike, chunk: int = CHUNK) -> str:
    """sha256 of one file's bytes."""
    digest = hashlib.sha256()
    update_file(digest, path, chunk)
    return digest.hexdigest()


def sha256_files(paths: Iterable[str | os.PathLike], chunk: int = CHUNK) -> str:
    """sha256 over several files, each as its name, a NUL byte, then its bytes (a folder's
    weights: renaming or changing any file changes it)."""
    digest = hashlib.sha256()
    for p in paths:
        digest.update(Path(p).name.encode() + b"\0")
        update_file(digest, p, chunk)
    return digest.hexdigest()


def update_tokens(digest, seqs: Iterable[Tensor]) -> None:
    """Feed token sequences into ``digest``: each as its ids' int64 bytes, then ``b"|"``."""
    import torch

    for s in seqs:
        digest.update(s.detach().cpu().to(torch.int64).numpy().tobytes())
        digest.update(b"|")


def sha256_tokens(seqs: Iterable[Tensor]) -> str:
    """sha256 over token sequences (1-D id tensors); sensitive to order and boundaries."""
    digest = hashlib.sha256()
    update_tokens(digest, seqs)
    return digest.hexdigest()


def sha256_token_groups(*groups: Iterable[Tensor]) -> str:
    """sha256 over groups of token sequences: each group as the bytes ``sha256_tokens`` hashes,
    then ``b"#"`` (so moving a sequence from one group to the next changes the digest)."""
    digest = hashlib.sha256()
    for group in groups:
        update_tokens(digest, group)
        digest.update(b"#")
    return digest.hexdigest()
