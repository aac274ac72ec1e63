"""Any lm-evaluation-harness multiple-choice task as a lens_heads ``Task`` (docs/methods.md §4).

``load_lm_eval_task("lm-eval:arc_easy")`` (a registry name) or
``load_lm_eval_task("path/to/task.yaml")`` (a task YAML; ``include_path`` adds a folder of
them, as ``lm_eval --include_path`` does) builds the task with lm-eval's own ``TaskManager``.
Nothing of lm-eval's templating is re-implemented: the documents, ``doc_to_text`` /
``doc_to_choice`` / ``doc_to_target`` (Jinja or Python), delimiters, description, few-shot
split and seeded sampler all stay lm-eval's. The prompts come from lm-eval's
``build_all_requests`` over the whole evaluated split in document order -- the order in which
its sampler draws shots -- once per (n-shot, seed), and are cached; lens_heads then scores the
requests with its own engine (prefix reuse, last-position logits, per-input ablation).

``MCRecord.doc_id`` is the document's index in the evaluated split; ``gold`` follows lm-eval's
``process_results`` (an index, or the position of a target string among the choices).
``output_type: multiple_choice`` tasks are ``Task``s. A perplexity task (``loglikelihood_rolling``)
loads as a ``RollingTask`` where the caller asks for one (``load_task(..., rolling=True)``:
``lens-heads evaluate``, scored by ``lens_heads.evaluation.rolling``); everywhere else, and for a generation
task, one clear error (run those through ``lens_heads.LensHeadsLM`` under lm-eval).
"""

from __future__ import annotations

import contextlib
import functools
import json
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Sequence

from lens_heads.data.tasks import DEFAULT_SEED, ChatFormat, MCRecord, Task, TaskSpec
from lens_heads.errors import LensHeadsError

PREFIX = "lm-eval:"
YAML_SUFFIXES = (".yaml", ".yml")


def is_lm_eval_spec(spec: str) -> bool:
    """A registry name written ``lm-eval:NAME``, or a path ending in .yaml / .yml."""
    return spec.startswith(PREFIX) or spec.lower().endswith(YAML_SUFFIXES)


def _yaml_task_name(path: Path) -> str:
    import yaml

    try:
        doc = yaml.safe_load(path.read_text(encoding="utf-8"))
    except (yaml.YAMLError, UnicodeDecodeError) as exc:
        raise LensHeadsError(f"{path}: not a task YAML lm-eval can read ({str(exc).splitlines()[0]})") from None
    except yaml.constructor.ConstructorError:  # !function tags: lm-eval resolves them itself
        doc = None
    name = doc.get("task") if isinstance(doc, dict) else None
    if not isinstance(name, str) or not name:
        import re

        m = re.search(r"^task:\s*['\"]?([^'\"\n#]+)", path.read_text(encoding="utf-8"), re.M)
        if not m:
            raise LensHeadsError(f"{path}: a task YAML needs a 'task: NAME' line")
        name = m.group(1).strip()
    return name


def quiet_lm_eval() -> None:
    """Silence lm-eval's per-task notes; its errors still come through as exceptions."""
    import logging

    for logger in ("lm-eval", "lm_eval"):
        logging.getLogger(logger).setLevel(logging.ERROR)


@contextlib.contextmanager
def lm_eval_silenced():
    """lm-eval's error log off while tasks are built: what it logs there ("X not found in the
    evaluate library!") comes back as our one message (``build_error``, ``check_metric_names``)."""
    import logging

    loggers = [logging.getLogger(name) for name in ("lm-eval", "lm_eval")]
    levels = [lg.level for lg in loggers]
    for lg in loggers:
        lg.setLevel(logging.CRITICAL)
    try:
        yield
    finally:
        for lg, level in zip(loggers, levels):
            lg.setLevel(level)


def unknown_task(manager, name: str) -> LensHeadsError:
    """The one message for a task name lm-eval does not know (with the closest names)."""
    import difflib

    close = difflib.get_close_matches(name, manager.all_tasks, n=3)
    return LensHeadsError(f"lm-eval has no task {name!r}" + (f"; did you mean {', '.join(close)}?" if close else ""))


def build_error(name: str, exc: Exception) -> LensHeadsError:
    """The one message for a task lm-eval cannot build: its first row's answer outside its
    choices (lm-eval checks row 0 while building), else lm-eval's own message, with a hint about
    the HF datasets cache unless the task reads local files."""
    frame = _failed_task_frame(exc)
    task = frame.f_locals["self"] if frame is not None else None
    if isinstance(exc, IndexError) and frame is not None:
        target, choices = frame.f_locals.get("test_target"), frame.f_locals.get("test_choice")
        if isinstance(target, int) and isinstance(choices, list):
            return LensHeadsError(f"lm-eval task {name!r} could not be built: row 0 of its evaluation split: "
                                  f"doc_to_target gives {_answer_problem(target, choices)}")
    metric = frame.f_locals.get("metric_name") if frame is not None else None
    if isinstance(exc, KeyError) and isinstance(metric, str) and task._metric_fn_list.get(metric, 0) is None:
        return LensHeadsError(f"lm-eval task {name!r}: metric_list: {_no_metric(metric)}")  # lm-eval: KeyError None
    msg = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
    if task is not None and reads_local_files(task.config):
        return LensHeadsError(f"lm-eval task {name!r} could not be built: {msg}")
    return LensHeadsError(f"lm-eval task {name!r} could not be built: {msg} (its dataset must be in the local HF "
                          f"datasets cache, or the YAML must point at local files)")


def _failed_task_frame(exc: Exception):
    """The innermost frame of ``exc``'s traceback that belongs to an lm-eval task object (its
    ``__init__`` or ``download``), or None."""
    from lm_eval.api.task import Task as LmTask

    tb, found = exc.__traceback__, None
    while tb is not None:
        if isinstance(tb.tb_frame.f_locals.get("self"), LmTask):
            found = tb.tb_frame
        tb = tb.tb_next
    return found


def reads_local_files(config) -> bool:
    """Whether an lm-eval task config reads local files (``dataset_kwargs.data_files``, or a
    ``dataset_path`` that is a local file or folder) rather than a hub dataset."""
    kwargs = getattr(config, "dataset_kwargs", None) or {}
    files = kwargs.get("data_files") if isinstance(kwargs, dict) else None
    if files:
        return not any("://" in f for f in _file_names(files))
    path = getattr(config, "dataset_path", None)
    return isinstance(path, str) and Path(path).expanduser().exists()


def _file_names(files) -> list[str]:
    """The paths in a ``data_files`` value (a path, a list, or a split -> path(s) mapping)."""
    if isinstance(files, dict):
        return [f for v in files.values() for f in _file_names(v)]
    return [str(f) for f in files] if isinstance(files, (list, tuple)) else [str(files)]


def _from_yaml_folder(files, folder: Path):
    """``data_files`` with each relative path (or glob) taken from ``folder`` (the task YAML's),
    as ``--include_path`` users write them; a path only the current folder holds stays as given."""
    import glob

    if isinstance(files, dict):
        return {k: _from_yaml_folder(v, folder) for k, v in files.items()}
    if isinstance(files, (list, tuple)):
        return [_from_yaml_folder(f, folder) for f in files]
    if not isinstance(files, str) or "://" in files or Path(files).expanduser().is_absolute():
        return files
    near = str(folder / files)
    return near if glob.glob(near) or not glob.glob(files) else files


def yaml_relative_files(manager):
    """``manager`` (lm-eval's ``TaskManager``) building its YAML tasks with relative
    ``dataset_kwargs.data_files`` taken from the YAML's folder (lm-eval passes them to
    ``datasets.load_dataset``, which reads them from the current folder; docs/methods.md §4). An
    lm-eval whose ``TaskManager`` has no ``TaskFactory`` (older 0.4 releases) is left as it is."""
    factory = getattr(manager, "_factory", None)
    if factory is None or isinstance(factory, _yaml_folder_factory()):
        return manager
    manager._factory = _yaml_folder_factory()(meta=getattr(factory, "_meta", None))
    return manager


@functools.cache
def _yaml_folder_factory():
    """lm-eval's ``TaskFactory``, with relative ``data_files`` taken from each task's YAML folder."""
    from lm_eval.tasks._factory import TaskFactory

    class YamlFolderFactory(TaskFactory):
        def _load_full_config(self, entry, overrides=None):
            cfg = super()._load_full_config(entry, overrides)
            kwargs = cfg.get("dataset_kwargs")
            if getattr(entry, "yaml_path", None) and isinstance(kwargs, dict) and kwargs.get("data_files"):
                folder = Path(entry.yaml_path).expanduser().resolve().parent
                cfg["dataset_kwargs"] = {**kwargs, "data_files": _from_yaml_folder(kwargs["data_files"], folder)}
            return cfg

    return YamlFolderFactory


def _no_metric(metric: str) -> str:
    return f"no metric {metric!r} (neither lm-eval's nor an HF evaluate metric found here)"


def check_metric_names(task, name: str) -> None:
    """Every metric and aggregation a task's metric_list names exists: lm-eval logs an unknown
    one and goes on, to an empty results table (a metric) or a traceback after the whole run (an
    aggregation)."""
    from lm_eval.api.registry import AGGREGATION_REGISTRY

    aggregations = {m.get("metric"): m.get("aggregation") for m in (task.config.metric_list or [])
                    if isinstance(m, dict)}
    for metric, fn in getattr(task, "_metric_fn_list", {}).items():
        if fn is None and task.config.process_results is None:
            raise LensHeadsError(f"lm-eval task {name!r}: metric_list: {_no_metric(metric)}")
    for metric, agg in getattr(task, "_aggregation_list", {}).items():
        if agg is None:
            raise LensHeadsError(f"lm-eval task {name!r}: metric_list: metric {metric!r} has aggregation "
                                 f"{aggregations.get(metric)!r}, not one of lm-eval's "
                                 f"({', '.join(sorted(AGGREGATION_REGISTRY))})")


def check_metrics(task, name: str) -> None:
    """A generation task's metrics, run on an empty answer to its first document (lm-eval's own
    ``process_results``), so that an option its metric does not take (``exact_match`` with
    ``ignore_whitespace``) fails now rather than after the whole generation run."""
    config = task.config
    if config.output_type != "generate_until" or callable(config.process_results):
        return
    docs = task.eval_docs
    if not len(docs):
        return
    try:
        task.process_results(docs[0], [""])
    except Exception as exc:  # noqa: BLE001 -- whatever the metric raises, it would raise after generating
        if isinstance(exc, TypeError) and isinstance(exc.__context__, TypeError):
            exc = exc.__context__  # lm-eval retried the metric positionally: the first error says why
        msg = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        options = "; ".join(f"{m}: {', '.join(kw)}" for m, kw in getattr(task, "_metric_fn_kwargs", {}).items() if kw)
        raise LensHeadsError(f"lm-eval task {name!r}: its metric_list fails on a made-up answer: {msg}"
                             + (f" (options given: {options})" if options else "")) from None


def _build(spec: str, include_path: str | os.PathLike | None):
    """(lm-eval task object, its name) for ``spec``."""
    try:
        from lm_eval.tasks import TaskManager, get_task_dict
    except ImportError:
        raise LensHeadsError("lm-eval tasks need lm-eval: pip install 'lens_heads[lm-eval]'") from None

    paths = [str(include_path)] if include_path is not None else []
    if spec.startswith(PREFIX):
        name = spec[len(PREFIX):].strip()
    else:
        path = Path(spec).expanduser()
        if not path.is_file():
            raise LensHeadsError(f"task YAML not found: {path}")
        name = _yaml_task_name(path)
        paths.insert(0, str(path.resolve().parent))
    for p in paths:
        if not Path(p).is_dir():
            raise LensHeadsError(f"--include-path {p}: no such folder")
    quiet_lm_eval()
    manager = None
    if not spec.startswith(PREFIX):  # a YAML: index only its folders first (lm-eval's ~10k defaults take ~9 s)
        manager = TaskManager(include_path=paths, include_defaults=False)
    if manager is None or name not in manager.all_tasks:  # a registry name, or a YAML that builds on one
        manager = TaskManager(include_path=paths or None)
    yaml_relative_files(manager)
    if name not in manager.all_tasks:
        raise unknown_task(manager, name)
    try:
        with lm_eval_silenced():
            tasks = get_task_dict([name], manager)
    except Exception as exc:  # lm-eval raises many kinds for a dataset it cannot load offline
        raise build_error(name, exc) from None
    task = next(iter(_leaves(tasks)))
    return task, name


def _leaves(tasks: dict):
    for v in tasks.values():
        if isinstance(v, dict):
            yield from _leaves(v)
        else:
            yield v


def _gold(task, doc, choices: list[str]) -> tuple[int, str | None]:
    """lm-eval ``process_results``' gold index (multiple_input tasks: doc_to_text is the index),
    and what is wrong with it (None: nothing): an index outside the choices, or a string none of
    them is (lm-eval scores such a row wrong whatever the model answers)."""
    gold = task.doc_to_text(doc) if task.multiple_input else task.doc_to_target(doc)
    if isinstance(gold, list):
        raise LensHeadsError(f"lm-eval task {task.config.task!r}: several gold answers per document are "
                             "not supported (multiple_target)")
    if isinstance(gold, str) and gold in choices:
        return choices.index(gold), None
    if isinstance(gold, str) or not 0 <= int(gold) < len(choices):
        return -1, _answer_problem(gold, choices)
    return int(gold), None


def _answer_problem(gold, choices: list) -> str:
    if isinstance(gold, str):
        return f"{gold!r}, none of its {len(choices)} choices"
    return f"index {gold}, outside 0..{len(choices) - 1} (its {len(choices)} choices)"


def refuse_bad_answers(task, name: str, problems: list[tuple[int, str]]) -> None:
    """One error naming the rows (``(row, problem)``) whose answer is not one of their choices,
    as the ``file:`` route refuses them."""
    if not problems:
        return
    field = "doc_to_text" if task.multiple_input else "doc_to_target"
    shown = "; ".join(f"row {i}: {what}" for i, what in problems[:5])
    more = f"; and {len(problems) - 5} more" if len(problems) > 5 else ""
    raise LensHeadsError(f"lm-eval task {name!r}: {field} gives no answer among the choices in {len(problems)} "
                         f"row(s) of its evaluation split (rows from 0): {shown}{more}")


def check_answers(task, name: str, limit: int | None = None) -> None:
    """A multiple-choice lm-eval task's answers (its first ``limit`` rows): each one of its row's
    choices, else ``refuse_bad_answers``."""
    if task.config.output_type != "multiple_choice":
        return
    problems = []
    for i, doc in enumerate(task.eval_docs):
        if limit is not None and i >= limit:
            break
        problem = _gold(task, doc, [str(c) for c in task.doc_to_choice(doc)])[1]
        if problem is not None:
            problems.append((i, problem))
    refuse_bad_answers(task, name, problems)


@dataclass(repr=False)
class LmEvalTask(Task):
    """A ``Task`` whose prompts are lm-eval's (``build``); everything else is lens_heads'."""

    lm_task: object = field(default=None, repr=False)
    _built: dict = field(default_factory=dict, repr=False)

    def build(self, record: MCRecord, n_shot: int | None = None, seed: int = DEFAULT_SEED,
              chat: ChatFormat | None = None) -> list[tuple[str, str]]:
        if chat is not None:
            raise LensHeadsError(f"{self.name}: the chat template is not supported for lm-eval tasks yet; "
                                 "run it under lm-eval with lens_heads.LensHeadsLM instead")
        k = self.spec.n_shot if n_shot is None else int(n_shot)
        if (k, seed) not in self._built:
            self._built[(k, seed)] = self._requests(k, seed)
        return self._built[(k, seed)][record.doc_id]

    def _requests(self, k: int, seed: int) -> dict[int, list[tuple[str, str]]]:
        t = self.lm_task
        t.set_config(key="num_fewshot", value=k)
        t.set_fewshot_seed(seed=seed)
        try:
            t.build_all_requests(limit=None)
        except (ValueError, IndexError) as exc:
            raise LensHeadsError(f"{self.name}: lm-eval cannot build {k}-shot prompts: {exc}") from None
        out: dict[int, list[tuple[str, str]]] = {}
        for inst in sorted(t.instances, key=lambda i: (i.doc_id, i.idx)):
            out.setdefault(inst.doc_id, []).append(tuple(inst.arguments))
        return out

    def prompt_settings(self) -> str:
        """The lm-eval config fields that shape a prompt beyond its document: the description,
        the delimiters and the split the shots come from."""
        c = getattr(self.lm_task, "config", None)
        if c is None:
            return ""
        return json.dumps([c.description, c.target_delimiter, c.fewshot_delimiter, c.fewshot_split], default=str)

    def fewshot(self, record: MCRecord, n_shot: int | None = None, seed: int = DEFAULT_SEED) -> list[MCRecord]:
        return []  # the shots are inside lm-eval's prompts (``build``)

    def check_fewshot(self, n_shot: int | None = None, seed: int = DEFAULT_SEED) -> None:
        k = self.spec.n_shot if n_shot is None else int(n_shot)
        if k < 0:
            raise LensHeadsError(f"n_shot must be >= 0, got {k}")
        if self.records:
            self.build(self.records[0], k, seed)  # lm-eval's own check of its few-shot pool


@dataclass
class RollingTask:
    """An lm-eval perplexity task (``output_type: loglikelihood_rolling``): its documents are
    scored whole, by lm-eval's rolling windows (docs/methods.md §4)."""

    name: str
    lm_task: object = field(repr=False)
    n_docs: int
    source: str

    def docs(self, limit: int | None = None) -> list:
        """The evaluated documents, in order; ``limit``: the first N, as ``lm_eval --limit``."""
        docs = list(self.lm_task.eval_docs)
        return docs if limit is None else docs[:limit]


def load_lm_eval_task(spec: str, include_path: str | os.PathLike | None = None,
                      n_shot: int | None = None, rolling: bool = False) -> "LmEvalTask | RollingTask":
    """The lm-eval task ``spec`` (``lm-eval:NAME`` or a YAML path) as a lens_heads task;
    ``rolling``: a perplexity task is welcome (a ``RollingTask``), else it is an error."""
    task, name = _build(spec, include_path)
    kind = task.config.output_type
    source = f"lm-eval:{name}:{spec}" if not spec.startswith(PREFIX) else f"lm-eval:{name}"
    if kind == "loglikelihood_rolling" and rolling:
        if n_shot:
            raise LensHeadsError(f"lm-eval task {name!r} is a perplexity task: it takes no few-shot examples")
        n_docs = len(list(task.eval_docs))
        if not n_docs:
            raise LensHeadsError(f"lm-eval task {name!r}: its evaluation split has no documents")
        return RollingTask(name, task, n_docs, source)
    if kind == "loglikelihood_rolling":
        raise LensHeadsError(f"lm-eval task {name!r} is a perplexity task (loglikelihood_rolling): "
                             "'lens-heads evaluate' scores it (word and byte perplexity, bits per byte) under "
                             "any fixed ablation; sweeps and scoring passes need multiple-choice questions")
    if kind != "multiple_choice":
        raise LensHeadsError(f"lm-eval task {name!r} is a {kind} task: evaluate and sweep score multiple-choice "
                             f"and perplexity tasks; run it with 'lens-heads lm-eval' (lens_heads.LensHeadsLM) "
                             f"instead")
    docs = list(task.eval_docs)
    records, problems = [], []
    for i, doc in enumerate(docs):
        choices = [str(c) for c in task.doc_to_choice(doc)]
        text = task.doc_to_text(doc)
        gold, problem = _gold(task, doc, choices)
        if problem is not None:
            problems.append((i, problem))
        records.append(MCRecord(i, text if isinstance(text, str) else "", choices, gold, None, dict(doc)))
    refuse_bad_answers(task, name, problems)
    if not records:
        raise LensHeadsError(f"lm-eval task {name!r}: its evaluation split has no documents")
    metrics = tuple(m for m in ("acc", "acc_norm") if m in getattr(task, "_metric_fn_list", {"acc": 0}))
    default_k = task.config.num_fewshot or 0
    tspec = TaskSpec(name=name, loader=_no_loader, n_shot=default_k if n_shot is None else n_shot,
                     doc_to_choice=lambda rec: list(rec.choices), target_delimiter=task.config.target_delimiter,
                     fewshot_delimiter=task.config.fewshot_delimiter, metrics=metrics or ("acc",),
                     multiple_input=bool(task.multiple_input), about=f"lm-eval task {name}")
    split = task.config.test_split or task.config.validation_split or ""
    return LmEvalTask(tspec, records, split, source, lm_task=task)


def _no_loader(split: str, data_root=None):
    raise LensHeadsError("an lm-eval task is loaded by load_lm_eval_task, not by split")


__all__: Sequence[str] = ("PREFIX", "LmEvalTask", "is_lm_eval_spec", "load_lm_eval_task")
