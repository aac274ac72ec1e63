"""Perplexity tasks under head ablation: an lm-eval ``loglikelihood_rolling`` task scored as
lm-eval scores it (docs/methods.md §4).

Each document's string (lm-eval's ``doc_to_target``) is scored whole by
``LensHeadsLM.loglikelihood_rolling`` -- lm-eval's rolling windows through lens_heads' engine,
with the ablation applied -- and lm-eval's own ``process_results`` and aggregations turn the
log-likelihoods into its metrics (``word_perplexity``, ``byte_perplexity``, ``bits_per_byte``).
So the numbers are ``lm_eval --model hf``'s on the same documents, and under an ablation they are
``lm_eval --model lens_heads --model_args ablation=...``'s.

A ``score:`` ablation decides per forward window (``LensHeadsLM.loglikelihood_rolling``); a
percent spec (``score:ID@P%``) needs a scoring pass over multiple-choice inputs and is refused.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import json
import os
from dataclasses import asdict, dataclass, field

from lens_heads.files.atomic import atomic_write_text
from lens_heads.evaluation.timing import Stopwatch, device_type
from lens_heads.data.lm_eval_tasks import RollingTask

if TYPE_CHECKING:
    from lens_heads.models.load import LoadedModel

__all__ = ["DocResult", "RollingResult", "evaluate_rolling_task"]


@dataclass
class DocResult:
    """One document: its summed log-likelihood, and the words and bytes lm-eval counts in it."""

    doc_id: int
    loglikelihood: float
    words: int
    bytes: int


@dataclass
class RollingResult:
    task: str
    metrics: dict[str, float]  # lm-eval's aggregates: word_perplexity, byte_perplexity, bits_per_byte
    docs: list[DocResult]
    zeroed_fraction: float | None = None
    config: dict = field(default_factory=dict)

    def write_jsonl(self, path: str | os.PathLike) -> None:
        """Per-document results, one JSON object a line, written atomically."""
        atomic_write_text(path, "".join(json.dumps(asdict(d)) + "\n" for d in self.docs))


def evaluate_rolling_task(model: LoadedModel, task: RollingTask, ablation=None, limit: int | None = None,
                          batch_size: int = 16, progress: bool = False) -> RollingResult:
    """lm-eval's perplexity metrics of ``task``'s first ``limit`` documents with ``ablation``
    (an ``Ablation``, a spec string or None) applied."""
    from lens_heads.evaluation.lm_eval_model import LensHeadsLM  # lm-eval is optional: imported when used

    watch = Stopwatch.start()
    lm = LensHeadsLM(model, ablation=ablation, batch_size=batch_size, progress=progress)
    lt = task.lm_task
    lt.build_all_requests(limit=limit)
    requests = sorted(lt.instances, key=lambda i: (i.doc_id, i.idx))
    lls = lm.loglikelihood_rolling(requests)
    docs = task.docs(limit)
    per_metric: dict[str, list] = {}
    rows = []
    for req, ll in zip(requests, lls):
        doc = docs[req.doc_id]
        for metric, value in lt.process_results(doc, [ll]).items():
            per_metric.setdefault(metric, []).append(value)
        target = lt.doc_to_target(doc)
        rows.append(DocResult(req.doc_id, float(ll), lt.count_words(target), lt.count_bytes(target)))
    aggregation = lt.aggregation()
    metrics = {m: float(aggregation[m](items)) for m, items in per_metric.items()}
    zf = lm.zeroed_fraction if lm.ablation is not None else None
    revision = {"revision": model.source.revision} if model.source.revision else {}
    config = {"model": model.name, **revision, "dtype": str(model.dtype).removeprefix("torch."), "task": task.name,
              "source": task.source, "limit": limit, "n_docs": len(rows), "ablation": lm.ablation_spec,
              "batch_size": batch_size, **watch.fields(device_type(model))}
    return RollingResult(task.name, metrics, rows, zf, config)
