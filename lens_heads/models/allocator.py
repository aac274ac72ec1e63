"""Large CPU tensors reuse freed memory instead of fresh pages (docs/methods.md §10, "Host memory").

glibc's ``malloc`` serves every block above its mmap threshold (at most 32 MiB by default) with
fresh pages from the kernel and hands them back on ``free``. A forward over a batch allocates
many such blocks -- one [16 x 600 x 1,536] float32 MLP activation is 59 MB -- so each of them is
page-faulted and zeroed by the kernel again on every forward. Measured (2-core Xeon, fp32): SiLU
times up-projection on that shape 47 ms with glibc's defaults, 17 ms with the blocks reused; a
10-question MMLU 5-shot evaluation of SmolLM2 30.6 s -> 21.9 s (``benchmarks/bench_allocator.py``).

``keep_freed_memory()`` raises the mmap threshold to 1 GiB and the trim threshold to 2 GiB, as
jemalloc or tcmalloc setups do: blocks up to 1 GiB come from the heap and freed ones stay
mapped for the next forward. The cost is that the process keeps its peak heap (up to 2 GiB
above what it uses) rather than returning it. ``load_model`` calls it for a model on the CPU;
``LENS_HEADS_KEEP_FREED_MEMORY=0`` turns it off. Results are identical either way (only where
memory comes from changes). Elsewhere than glibc it does nothing.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import os
import platform

M_TRIM_THRESHOLD = -1  # glibc's mallopt parameter numbers (malloc.h)
M_MMAP_THRESHOLD = -3
MMAP_THRESHOLD = 1 << 30  # blocks up to this size come from the heap
TRIM_THRESHOLD = (1 << 31) - 1  # freed heap kept up to this size (mallopt takes a C int)
ENV = "LENS_HEADS_KEEP_FREED_MEMORY"

_done: bool | None = None


def keep_freed_memory() -> bool:
    """Tune glibc's malloc once per process (see the module docstring). Returns whether it is on:
    False where the C library is not glibc, or ``LENS_HEADS_KEEP_FREED_MEMORY=0``."""
    global _done
    if _done is None:
        _done = _tune()
    return _done


def _tune() -> bool:
    if os.environ.get(ENV, "1").strip().lower() in ("0", "false", "no", "off"):
        return False
    if platform.system() != "Linux" or platform.libc_ver()[0] != "glibc":
        return False
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
    except OSError:
        return False
    # mallopt returns 1 on success; trim first, so the heap never shrinks below the new threshold
    return bool(libc.mallopt(M_TRIM_THRESHOLD, TRIM_THRESHOLD)) and bool(libc.mallopt(M_MMAP_THRESHOLD, MMAP_THRESHOLD))
