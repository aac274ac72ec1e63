"""lens_heads.models.allocator: large CPU blocks come from glibc's heap and stay there when freed."""

from __future__ import annotations

import json
import os
import platform
import subprocess
import sys

import pytest

pytestmark = pytest.mark.skipif(platform.system() != "Linux" or platform.libc_ver()[0] != "glibc",
                                reason="the tuning applies to glibc's malloc only")

PROBE = r"""
import ctypes, json
from lens_heads.models import allocator

class MallInfo2(ctypes.Structure):
    _fields_ = [(n, ctypes.c_size_t) for n in ("arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks",
                                                "fsmblks", "uordblks", "fordblks", "keepcost")]

libc = ctypes.CDLL("libc.so.6")
libc.mallinfo2.restype = MallInfo2
on = allocator.keep_freed_memory()
import torch
x = torch.empty(64 << 20, dtype=torch.uint8)
x.fill_(1)
mapped = libc.mallinfo2().hblkhd  # bytes in blocks mmap'd on their own
del x
print(json.dumps({"on": on, "mapped": mapped, "free_in_heap": libc.mallinfo2().fordblks}))
"""


def _probe(env_value: str | None) -> dict:
    env = {k: v for k, v in os.environ.items() if k != "LENS_HEADS_KEEP_FREED_MEMORY"}
    if env_value is not None:
        env["LENS_HEADS_KEEP_FREED_MEMORY"] = env_value
    out = subprocess.run([sys.executable, "-c", PROBE], env=env, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout.strip().splitlines()[-1])


def test_a_64_mb_block_comes_from_the_heap_and_stays_there_when_freed():
    tuned = _probe(None)
    assert tuned["on"] is True
    assert tuned["mapped"] < 64 << 20  # not a block of fresh pages of its own
    assert tuned["free_in_heap"] >= 64 << 20  # kept for the next forward


def test_turned_off_glibc_maps_it_on_its_own():
    plain = _probe("0")
    assert plain["on"] is False
    assert plain["mapped"] >= 64 << 20


def test_load_model_on_the_cpu_tunes_once(tiny_model_dir, monkeypatch):
    from lens_heads import load_model
    from lens_heads.models import allocator

    calls = []
    monkeypatch.setattr(allocator, "_done", None)
    monkeypatch.setattr(allocator, "_tune", lambda: calls.append(1) or True)
    load_model(str(tiny_model_dir("llama")))
    load_model(str(tiny_model_dir("llama")))
    assert calls == [1]
