"""Digests: every function of lens_heads.files.hashing against plain hashlib over the byte layout it
documents, the call sites that moved onto it (zoo, score metadata, repair checkpoints), and
values pinned before the move (stored results and checkpoints carry them)."""

from __future__ import annotations

import hashlib

import pytest
import torch

from lens_heads.files import hashing
from lens_heads.files.hashing import (sha256_bytes, sha256_file, sha256_files, sha256_token_groups, sha256_tokens,
                                update_file, update_tokens)

SEQS = [torch.tensor([1, 2, 3]), torch.tensor([70000, 0], dtype=torch.int32), torch.tensor([5], dtype=torch.int16)]


def _ids_bytes(seq) -> bytes:
    """int64 little-endian bytes written out by hand (no numpy, no torch serialisation)."""
    return b"".join(int(i).to_bytes(8, "little", signed=True) for i in seq.tolist())


def test_sha256_bytes():
    assert sha256_bytes([b"ab", b"", b"c"]) == hashlib.sha256(b"abc").hexdigest()
    assert sha256_bytes([]) == hashlib.sha256().hexdigest()


def test_sha256_file_and_files(tmp_path):
    a, b = tmp_path / "a.bin", tmp_path / "sub" / "b.safetensors"
    b.parent.mkdir()
    a.write_bytes(bytes(range(256)) * 1000)
    b.write_bytes(b"weights")
    assert sha256_file(a) == hashlib.sha256(a.read_bytes()).hexdigest()
    assert sha256_file(a, chunk=7) == sha256_file(a)  # the block size does not enter the digest
    (tmp_path / "empty").write_bytes(b"")
    assert sha256_file(tmp_path / "empty") == hashlib.sha256(b"").hexdigest()
    want = hashlib.sha256(b"a.bin\0" + a.read_bytes() + b"b.safetensors\0" + b"weights").hexdigest()
    assert sha256_files([a, b]) == want
    assert sha256_files([str(a), str(b)], chunk=3) == want
    assert sha256_files([b, a]) != want  # order matters
    renamed = tmp_path / "c.bin"
    renamed.write_bytes(a.read_bytes())
    assert sha256_files([renamed, b]) != want  # so does each file's name
    h = hashlib.sha256(b"x")
    update_file(h, b)
    assert h.hexdigest() == hashlib.sha256(b"xweights").hexdigest()


def test_sha256_tokens_and_groups():
    layout = b"".join(_ids_bytes(s) + b"|" for s in SEQS)
    assert sha256_tokens(SEQS) == hashlib.sha256(layout).hexdigest()
    assert sha256_tokens(iter(SEQS)) == sha256_tokens([s.long() for s in SEQS])  # dtype and iterables
    assert sha256_tokens([torch.tensor([1, 2]), torch.tensor([3])]) != sha256_tokens([torch.tensor([1]),
                                                                                   torch.tensor([2, 3])])
    groups = (SEQS[:2], SEQS[2:], [])
    want = hashlib.sha256(b"".join(b"".join(_ids_bytes(s) + b"|" for s in g) + b"#" for g in groups)).hexdigest()
    assert sha256_token_groups(*groups) == want
    assert sha256_token_groups(SEQS[:1], SEQS[1:]) != sha256_token_groups(SEQS[:2], SEQS[2:])
    h = hashlib.sha256(b"prefix")
    update_tokens(h, SEQS)
    assert h.hexdigest() == hashlib.sha256(b"prefix" + layout).hexdigest()


def test_pinned_values(tmp_path):
    """Digests computed before the move to lens_heads.files.hashing, by the old inline loops of
    models/zoo.py, scores/dataset.py::score_metadata and surgery/repair.py::_tokens_digest."""
    seqs = [torch.arange(10), torch.tensor([3, 1, 4, 1, 5])]
    assert sha256_tokens(seqs) == "bda220836ec0efcde2db83f33c60f9e5e52920a682b482a2f6c4c5b3e0dea752"
    assert sha256_token_groups(seqs[:1], seqs[1:]) == \
        "4322b6495dbde8e47fdae2e0847b33ad2b69346e9b8a8b8a841d10d6fe12388c"
    (tmp_path / "a.bin").write_bytes(b"abc")
    (tmp_path / "b.safetensors").write_bytes(b"weights")
    assert sha256_file(tmp_path / "a.bin") == "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"
    assert sha256_files([tmp_path / "a.bin", tmp_path / "b.safetensors"]) == \
        "31961f0cc51f63f171afc678056fde585474c9482b8eca0d4300f999a80d2dd1"


def test_call_sites_use_it(tiny_model):
    """score metadata and repair checkpoints hash tokens through lens_heads.files.hashing, in the
    layouts above; zoo's file digests are hashing's."""
    from lens_heads.models import zoo
    from lens_heads.scores import score_metadata
    from lens_heads.surgery.repair import _tokens_digest

    assert zoo.sha256_file is hashing.sha256_file and zoo.sha256_files is hashing.sha256_files
    meta = score_metadata(tiny_model("gpt2"), SEQS, None, None)
    assert meta["tokens_sha256"] == hashlib.sha256(b"".join(_ids_bytes(s) + b"|" for s in SEQS)).hexdigest()
    chunks, held_out = SEQS[:2], SEQS[2:]
    want = hashlib.sha256(b"".join(_ids_bytes(s) + b"|" for s in chunks) + b"#"
                          + b"".join(_ids_bytes(s) + b"|" for s in held_out) + b"#").hexdigest()
    assert _tokens_digest(chunks, held_out) == want


@pytest.mark.parametrize("name", ["smollm2-135m"])
def test_zoo_file_matches_its_pin(name):
    """The cached zoo GGUF still verifies against its pinned sha256 (skipped when not cached)."""
    from lens_heads.models import zoo

    path = zoo.cache_dir() / zoo.ZOO[name].filename
    if not path.is_file():
        pytest.skip(f"{path} not cached")
    assert sha256_file(path) == zoo.ZOO[name].sha256
    assert zoo.fetch(name, progress=False) == path  # verify() passes
