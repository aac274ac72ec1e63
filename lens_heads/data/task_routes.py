"""``load_task``: the one entry point from a task name or spec to a loaded ``Task``, by route --
a registered task (``tasks.TASKS``: MMLU, PIQA, WinoGrande), a local multiple-choice file
(``file:PATH?...``, ``mc_files``) or an lm-eval task (``lm-eval:NAME`` or a task YAML,
``lm_eval_tasks``). The routes build on ``tasks``' types; this module sits above all three."""

from __future__ import annotations

import os
from dataclasses import replace
from pathlib import Path

from lens_heads.data.lm_eval_tasks import PREFIX, is_lm_eval_spec, load_lm_eval_task
from lens_heads.data.mc_files import MC_SUFFIXES, load_mc_spec
from lens_heads.data.tasks import TASKS, Task, TaskSpec
from lens_heads.errors import LensHeadsError


def load_task(
    name_or_spec: str | TaskSpec | os.PathLike,
    split: str | None = None,
    data_root: str | os.PathLike | None = None,
    *,
    fewshot_split: str | None = None,
    n_shot: int | None = None,
    include_path: str | os.PathLike | None = None,
    rolling: bool = False,
) -> Task:
    """Load a task by registered name, TaskSpec, or local-file spec.

    ``name_or_spec``: a name in ``TASKS`` ("mmlu", "piqa", "winogrande"), a TaskSpec, a
    ``"file:PATH?..."`` string (see ``load_mc_file``) or an existing .jsonl/.json/.csv/.parquet
    path (with the default fields ``question``/``choices``/``answer``).
    ``split`` defaults to the spec's ``default_split``; ``fewshot_split`` overrides where
    shots come from (e.g. ``"train"`` for WinoGrande, online); ``n_shot`` overrides the
    default number of shots (``task.spec.n_shot``). Any lm-eval multiple-choice task too:
    ``"lm-eval:NAME"`` or a task YAML path (``include_path``: a folder of task YAMLs), see
    ``lm_eval_tasks``; ``rolling``: an lm-eval perplexity task is welcome (a ``RollingTask``).
    """
    if isinstance(name_or_spec, TaskSpec):
        spec = name_or_spec
    else:
        s = os.fspath(name_or_spec)
        if is_lm_eval_spec(s) or (include_path is not None and s not in TASKS and not s.startswith("file:")):
            return load_lm_eval_task(s if is_lm_eval_spec(s) else PREFIX + s, include_path, n_shot, rolling)
        if s.startswith("file:") or (s not in TASKS and Path(s).suffix.lower() in MC_SUFFIXES):
            task = load_mc_spec(s)
            if n_shot is not None:
                task.spec = replace(task.spec, n_shot=n_shot)
            return task
        if s not in TASKS:
            raise LensHeadsError(
                f"Unknown task {s!r}. Valid names: {', '.join(sorted(TASKS))}; "
                f"or a local file: 'file:PATH.jsonl?question=...&choices=a,b&answer=...'; "
                f"or an lm-eval task: 'lm-eval:NAME' or a task YAML"
            )
        spec = TASKS[s]
    if n_shot is not None:
        spec = replace(spec, n_shot=n_shot)
    split = split or spec.default_split
    records, source = spec.loader(split, data_root)
    if not records:
        raise LensHeadsError(f"{spec.name}: split {split!r} ({source}) has no records")
    fs_split = fewshot_split or spec.fewshot_split
    pool_loader = None
    if fs_split is not None and fs_split != split:
        pool_loader = lambda: spec.loader(fs_split, data_root)[0]  # noqa: E731
    return Task(spec, records, split, source, pool_loader)
