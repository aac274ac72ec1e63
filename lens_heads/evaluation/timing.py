"""What an evaluation cost: its wall seconds and the CPU seconds of the process that ran it
(docs/methods.md §13, "Cost per curve").

Wall time counts whatever else shares the machine: a campaign batch that shares its core with
another job takes longer on the clock without costing more. So a record keeps both, and the
cost a campaign adds up (``compute_seconds``) is the process's CPU time (all its threads:
CPU-seconds) where the evaluation ran on a CPU, and the wall time where it ran on an
accelerator, whose work the host's CPU time does not see.

    watch = Stopwatch.start()
    ...  # evaluate
    config.update(watch.fields(device_type(model)))   # seconds, cpu_seconds, device
    compute_seconds(config)                            # what the evaluation cost

A record merged from parts (a sweep point stored in batches) keeps the sum of its parts' costs
as ``compute_seconds``, so merging never changes what a point cost, whatever clocks its parts
were timed on. CPU time is not immune to a neighbour: a job sharing the core leaves it nearly
unchanged where it doubles the wall clock, but contention for caches and memory still shows.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Mapping

if TYPE_CHECKING:
    from lens_heads.models.load import LoadedModel


@dataclass(frozen=True)
class Stopwatch:
    """Wall (``time.perf_counter``) and process CPU (``time.process_time``) clocks at a start."""

    wall0: float
    cpu0: float

    @classmethod
    def start(cls) -> "Stopwatch":
        return cls(time.perf_counter(), time.process_time())

    def fields(self, device: str) -> dict[str, Any]:
        """The record's timing fields: ``seconds`` (wall), ``cpu_seconds`` (this process's CPU
        time, every thread) and ``device`` (the type the model ran on: cpu, cuda, mps)."""
        return {"seconds": round(time.perf_counter() - self.wall0, 3),
                "cpu_seconds": round(time.process_time() - self.cpu0, 3),
                "device": device_kind(device)}


def device_kind(device) -> str:
    """A device's kind, without its index: ``cuda:1`` -> ``cuda``."""
    return str(device).split(":")[0]


def device_type(model: LoadedModel) -> str:
    """The kind of device a loaded model computes on: ``cuda`` (or ``mps``) when a device map puts
    any of its modules on an accelerator, even with the embedding on the CPU; else its device's."""
    placed = (getattr(getattr(model, "hf_model", None), "hf_device_map", None) or {}).values()
    kinds = {"cuda" if isinstance(d, int) else device_kind(d) for d in placed} - {"cpu", "disk", "meta"}
    return sorted(kinds)[0] if kinds else device_kind(model.device)


def compute_seconds(config: Mapping[str, Any]) -> float:
    """The seconds an evaluation record's ``config`` says it cost: a merged record's
    ``compute_seconds`` (its parts' costs, summed); else its CPU seconds where it ran on a CPU and
    recorded them, else its wall seconds (an accelerator's, or a record written before CPU time
    was recorded; 0 when it has neither)."""
    if config.get("compute_seconds") is not None:
        return float(config["compute_seconds"])
    cpu = config.get("cpu_seconds")
    if cpu is not None and config.get("device", "cpu") == "cpu":
        return float(cpu)
    return float(config.get("seconds") or 0.0)


__all__ = ["Stopwatch", "compute_seconds", "device_kind", "device_type"]
