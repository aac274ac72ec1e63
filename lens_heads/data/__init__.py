"""Data for lens_heads: text corpora for head scores, multiple-choice tasks for evaluation.

Corpora (``corpora.py``): ``load_texts`` -> ``tokenize_texts`` -> ``iter_batches`` / ``pad_batch``.
Tasks (``tasks.py``; ``task_routes.py`` loads them): ``load_task("mmlu" | "piqa" | "winogrande" | "file:...")`` gives a
``Task`` whose ``requests(record, fewshot)`` reproduce lm-evaluation-harness 0.4.x prompts;
``mc_files.py`` turns a local multiple-choice file (the ``file:...`` form) into such a Task.
Local copies are found under the data root (``paths.py``; env var ``LENS_HEADS_DATA``).

Floor 1 of docs/architecture.md. May import: the root modules only (not ``files``, on its
floor). Imported by: ``models`` and every wing above it.
"""

from lens_heads.data.corpora import (
    CORPORA,
    CorpusSpec,
    iter_batches,
    iter_rows,
    load_texts,
    pad_batch,
    special_tokens_added,
    tokenize_texts,
    wikitext_articles,
)
from lens_heads.data.paths import DATA_ENV, candidate_data_roots, data_root, local_file
from lens_heads.data.tasks import (
    DEFAULT_SEED,
    TASKS,
    MCRecord,
    Task,
    TaskSpec,
    mmlu_description,
    register_task,
)
from lens_heads.data.mc_files import load_mc_file, load_mc_spec, parse_mc_spec
from lens_heads.data.task_routes import load_task

__all__ = [
    "CORPORA", "CorpusSpec", "load_texts", "tokenize_texts", "pad_batch", "iter_batches", "iter_rows",
    "special_tokens_added", "wikitext_articles",
    "DATA_ENV", "data_root", "candidate_data_roots", "local_file",
    "DEFAULT_SEED", "TASKS", "MCRecord", "Task", "TaskSpec", "load_task", "register_task",
    "load_mc_file", "load_mc_spec", "parse_mc_spec", "mmlu_description",
]
