"""Batch sizes: a fixed number, or ``auto`` (docs/methods.md §4).

``auto`` is the largest batch of the longest inputs that fits a budget of padded positions per
forward: on a CPU a fixed token budget (``CPU_TOKEN_BUDGET``, or ``$LENS_HEADS_TOKEN_BUDGET``),
on a GPU the free memory over an estimate of what one position costs in activations. It is
found once per call, from the longest input; a forward that still runs out of memory is split
in halves and retried, and the smaller size is kept for the rest of the call. Results do not
depend on the batch size (every row is scored on its own; only float rounding differs).

Inputs come longest first, and on a CPU a batch of long ones closes early rather than pad
(``even_batch``): once it holds ``MIN_BATCH_TOKENS`` real tokens, its matmuls run no faster for
more rows, so an input much shorter than the batch's longest starts the next batch. Measured on
SmolLM2, MMLU 5-shot (40 questions, 2 CPU cores): 22.7 s -> 16.5 s in fp32, 8.3 s -> 6.4 s in
bf16; the floor (1,024 - 4,096 tokens) and the share (5 - 20 %) made no difference beyond noise.
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
MIN_BATCH_TOKENS = 2048  # real tokens from which a batch closes early rather than pad (even_batch)
MAX_PAD_SHARE = 0.1  # the padding an input may bring to such a batch, of the batch's length

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


def positive_batch_size(value) -> int:
    """A positive integer batch size (``parse_batch_size`` without ``auto``, which needs a model
    and its inputs); one clear error otherwise."""
    n = parse_batch_size(value)
    if n == AUTO:
        raise LensHeadsError("batch size must be a positive integer here ('auto' needs a model: Batcher.for_inputs)")
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


def batch_floor(model: LoadedModel) -> int | None:
    """The real tokens from which a batch of the model's inputs closes early rather than pad
    (``even_batch``): ``device_floor`` of the model's device."""
    return device_floor(model.device)


def device_floor(device: str | torch.device) -> int | None:
    """``MIN_BATCH_TOKENS`` on a CPU, where it was measured; None (never close early) elsewhere --
    a GPU runs larger matmuls faster well past it."""
    return MIN_BATCH_TOKENS if torch.device(device).type == "cpu" else None


def even_batch(lengths: Sequence[int], floor: int | None) -> int:
    """How many of these inputs (their lengths, longest first; at least one) one right-padded batch
    takes: all, but with a ``floor`` it closes before an input that would be padded by more than
    ``MAX_PAD_SHARE`` of the batch's length once the batch holds ``floor`` real tokens -- past that
    a larger batch runs its matmuls no faster, and padding is work thrown away (few-shot prompts)."""
    if not lengths:
        return 0
    longest, real = lengths[0], 0
    for i, n in enumerate(lengths):
        if i and floor is not None and real >= floor and longest - n > MAX_PAD_SHARE * longest:
            return i
        real += n
    return len(lengths)


def batch_bounds(lengths: Sequence[int], size: int, floor: int | None) -> list[int]:
    """Where the batches ``Batcher(size, floor).run(items, fn, lengths)`` forms start, and the end:
    a batch's extent depends only on the inputs from its start, so a contiguous run of these
    batches, run on its own, forms the same batches (sharded scoring passes rely on it; a forward
    that runs out of memory and is split breaks it, as it always did)."""
    size = positive_batch_size(size)
    bounds = [0]
    while bounds[-1] < len(lengths):
        start = bounds[-1]
        bounds.append(start + even_batch(lengths[start:start + size], floor))
    return bounds


def is_oom(exc: BaseException) -> bool:
    """Whether ``exc`` is an out-of-memory error of torch (CUDA, MPS or the CPU allocator)."""
    if isinstance(exc, torch.cuda.OutOfMemoryError):
        return True
    return isinstance(exc, RuntimeError) and "out of memory" in str(exc).lower()


class Batcher:
    """Runs a function over consecutive batches of a list; halves a batch that runs out of
    memory (down to one item, which then fails for real) and keeps the smaller size."""

    def __init__(self, size: int, floor: int | None = None):
        self.size = positive_batch_size(size)
        self.floor = floor  # even_batch's: None, batches of ``size``

    @classmethod
    def for_inputs(cls, batch_size: int | str, model: LoadedModel, longest: int) -> "Batcher":
        batch_size = parse_batch_size(batch_size)
        return cls(auto_batch_size(model, longest) if batch_size == AUTO else batch_size, batch_floor(model))

    def run(self, items: Sequence[T], fn: Callable[[Sequence[T]], None], lengths: Sequence[int] | None = None) -> None:
        """``fn`` on consecutive batches of ``items``, ``size`` at most. With ``lengths`` (the
        items' padded lengths, longest first) a batch also closes early where padding would be
        waste (``even_batch`` with ``floor``)."""
        if lengths is not None and len(lengths) != len(items):
            raise LensHeadsError(f"{len(lengths)} lengths for {len(items)} items")
        start = 0
        while start < len(items):
            end = min(start + self.size, len(items))
            if lengths is not None:
                end = start + even_batch(lengths[start:end], self.floor)
            chunk = items[start:end]
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
