"""Batch sizes: a fixed number, or ``auto`` (docs/methods.md §4).

``auto`` is the largest batch of the longest inputs that fits a budget of padded positions per
forward: on a CPU a fixed token budget (``CPU_TOKEN_BUDGET``, or ``$LENS_HEADS_TOKEN_BUDGET``),
on a GPU the free memory over an estimate of what one position costs in activations. It is
found once per call, from the longest input; a forward that still runs out of memory is split
in halves and retried, and the smaller size is kept for the rest of the call. Results do not
depend on the batch size (every row is scored on its own; only float rounding differs).
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING, Callable, Sequence, TypeVar

import torch

from lens_heads.errors import LensHeadsError

if TYPE_CHECKING:
    from lens_heads.models.load import LoadedModel

AUTO = "auto"
CPU_TOKEN_BUDGET = 4096  # padded positions per forward on a CPU (measured: beyond it no gain, more memory)
MAX_AUTO = 256  # the largest batch auto picks
GPU_MEMORY_SHARE = 0.6  # of the free memory, for activations

T = TypeVar("T")


def parse_batch_size(value) -> int | str:
    """``"auto"`` or a positive integer (from a CLI string or a number); one clear error otherwise."""
    if isinstance(value, str) and value.strip().lower() == AUTO:
        return AUTO
    try:
        n = int(value)
    except (TypeError, ValueError):
        raise LensHeadsError(f"batch size must be a positive integer or 'auto', got {value!r}") from None
    if n < 1 or (isinstance(value, float) and value != n):
        raise LensHeadsError(f"batch size must be a positive integer or 'auto', got {value!r}")
    return n


def _position_bytes(model: LoadedModel, longest: int) -> int:
    """Bytes one padded position costs in a forward's live activations (the attention pattern of
    one layer at a time, the residual stream and MLP width, and the hooks' copies), estimated."""
    g = model.geometry
    cfg = model.hf_model.config
    width = getattr(cfg, "intermediate_size", None) or 4 * g.d_model
    elem = torch.finfo(model.dtype).bits // 8
    return elem * (4 * g.n_heads * longest + 8 * g.d_model + 2 * width) + 4 * g.n_heads * longest


def auto_batch_size(model: LoadedModel, longest: int) -> int:
    """The batch size ``auto`` picks for inputs of at most ``longest`` positions."""
    longest = max(1, int(longest))
    device = torch.device(model.device)
    if device.type == "cuda":
        free, _ = torch.cuda.mem_get_info(device)
        budget = int(GPU_MEMORY_SHARE * free / _position_bytes(model, longest))
    else:
        budget = int(os.environ.get("LENS_HEADS_TOKEN_BUDGET", CPU_TOKEN_BUDGET)) // longest
    return max(1, min(MAX_AUTO, budget))


def is_oom(exc: BaseException) -> bool:
    """Whether ``exc`` is an out-of-memory error of torch (CUDA, MPS or the CPU allocator)."""
    if isinstance(exc, torch.cuda.OutOfMemoryError):
        return True
    return isinstance(exc, RuntimeError) and "out of memory" in str(exc).lower()


class Batcher:
    """Runs a function over consecutive batches of a list; halves a batch that runs out of
    memory (down to one item, which then fails for real) and keeps the smaller size."""

    def __init__(self, size: int):
        self.size = int(size)

    @classmethod
    def for_inputs(cls, batch_size: int | str, model: LoadedModel, longest: int) -> "Batcher":
        batch_size = parse_batch_size(batch_size)
        return cls(auto_batch_size(model, longest) if batch_size == AUTO else batch_size)

    def run(self, items: Sequence[T], fn: Callable[[Sequence[T]], None]) -> None:
        start = 0
        while start < len(items):
            chunk = items[start:start + self.size]
            self._run(chunk, fn)
            start += len(chunk)

    def _run(self, chunk: Sequence[T], fn: Callable[[Sequence[T]], None]) -> None:
        try:
            fn(chunk)
        except Exception as exc:  # noqa: BLE001 -- only out-of-memory is retried
            if not is_oom(exc) or len(chunk) == 1:
                raise
            if torch.cuda.is_available():
                torch.cuda.empty_cache()
            half = (len(chunk) + 1) // 2
            self.size = min(self.size, half)
            self._run(chunk[:half], fn)
            self._run(chunk[half:], fn)
