"""Multiple-choice tasks with lm-evaluation-harness 0.4.x prompts, reproduced exactly.

One record type (``MCRecord``), one declarative spec per task (``TaskSpec``, kept in the
name-keyed registry ``TASKS``), and ``Task`` = spec + records + few-shot pool:

    task = load_task("mmlu")                      # local copy under the data root, else the hub
    rec = task.records[0]
    shots = task.fewshot(rec)                     # MMLU: first 5 dev items of rec's subject
    reqs = task.requests(rec, shots)              # [(context, continuation)] one per choice
    # score sum log p(continuation | context) per request, then:
    task.score(rec, lls)                          # {"acc": ..., "acc_norm": ...} as lm-eval does

Prompt construction follows lm-eval 0.4.x ``ConfigurableTask.fewshot_context`` /
``construct_requests``; with a ``ChatFormat`` (lm-eval's ``apply_chat_template``) the same
parts become chat turns (``TaskSpec._chat_requests``). Plain-text prompts::

    context = description + sum(shot_q + target_delimiter + shot_answer + fewshot_delimiter) + q
    continuation = target_delimiter + choice

with ``target_delimiter=" "``, ``fewshot_delimiter="\\n\\n"``. For "multiple input" tasks
(WinoGrande, partial scoring) each *choice* yields a different context and all share one
continuation; a WinoGrande shot is ``prefix-with-gold-option + " " + suffix + "\\n\\n"``.

acc_norm divides each choice's log-likelihood by ``len(choice)`` in characters, where
``choice`` is the string from ``doc_to_choice`` *without* the leading delimiter (see
``Task.choice_lengths``), exactly as lm-eval's ``process_results``.

Tasks here (``TASKS``):

* ``mmlu``: 57 subjects, eval split ``test`` (14,042), 5-shot from ``dev`` with the
  ``first_n`` sampler (the first k dev items of the same subject, in file order).
  Local: ``<data root>/mmlu/{dev,test}/<subject>_{dev,test}.csv``; hub: ``cais/mmlu`` "all".
* ``piqa``: ``validation`` (1,838), 0-shot, metrics acc and acc_norm.
  Local: ``piqa/valid.jsonl`` + ``valid-labels.lst``; hub: ``baber/piqa``.
* ``winogrande``: ``validation`` (1,267, WinoGrande 1.1 dev), 5-shot, partial scoring.
  Local: ``winogrande/dev.jsonl``; hub: ``allenai/winogrande`` ``winogrande_xl``.

Few-shot sampling (``Task.fewshot``) mirrors lm-eval's ``ContextSampler``: one
``random.Random(seed)`` (lm-eval's default seed is 1234) is advanced through the records in
task order, each record drawing ``rnd.sample(pool, k + 1)`` and dropping the record itself;
results are computed once for the whole task and cached, so a record gets the same shots
whichever subset or order you evaluate in (lm-eval's ``--limit N`` is a prefix, and matches).

Deviation (WinoGrande): lm-eval draws WinoGrande shots from the *train* split, which is not
available offline. By default the pool here is the evaluated split itself minus the item
(an item is never its own shot). Pass ``load_task("winogrande", fewshot_split="train")``
online to use lm-eval's pool; with it the draws are identical to lm-eval's.
"""

from __future__ import annotations

import csv
import os
import random
from dataclasses import dataclass, field
from typing import Callable, Sequence

from lens_heads.data.corpora import iter_rows
from lens_heads.data.paths import load_hub_dataset, local_file
from lens_heads.errors import LensHeadsError
from lens_heads.registry import Registry

DEFAULT_SEED = 1234  # lm-eval's default --fewshot_seed / fewshot_random_seed

# -----------------------------------------------------------------------------
# Records and specs


@dataclass
class MCRecord:
    """One multiple-choice item.

    ``question`` is the item's main text (MMLU question, PIQA goal, WinoGrande sentence
    with its ``_``); ``choices`` the answer options as plain text (WinoGrande: the two
    names); ``gold`` the 0-based correct index; ``raw`` the source row, in the hub
    dataset's schema for the built-in tasks.
    """

    doc_id: int
    question: str
    choices: list[str]
    gold: int
    subject: str | None = None
    raw: dict = field(default_factory=dict, repr=False)


def _no_description(rec: MCRecord) -> str:
    return ""


def _question_text(rec: MCRecord) -> str:
    return rec.question


def _plain_choices(rec: MCRecord) -> list[str]:
    return list(rec.choices)


@dataclass
class TaskSpec:
    """Declarative description of a multiple-choice task (like an lm-eval task YAML).

    loader(split, data_root) -> (records, source) loads one split, local copy first;
    ``fewshot_split=None`` means shots come from the evaluated split itself (minus the item).
    ``sampler`` is ``"first_n"`` (first k of the pool, in order) or ``"random"``
    (lm-eval's default ContextSampler). ``fewshot_by_subject`` restricts the pool to the
    record's subject. The four ``doc_to_*`` / ``description`` callables take an MCRecord
    and play the role of lm-eval's fields of the same names; ``doc_to_target`` is only used
    by ``multiple_input`` tasks (for the others the target is ``doc_to_choice[gold]``).
    """

    name: str
    loader: Callable[[str, str | os.PathLike | None], tuple[list[MCRecord], str]]
    splits: tuple[str, ...] = ("validation",)
    default_split: str = "validation"
    n_shot: int = 0
    fewshot_split: str | None = None
    sampler: str = "random"
    fewshot_by_subject: bool = False
    description: Callable[[MCRecord], str] = _no_description
    doc_to_text: Callable[[MCRecord], str] = _question_text
    doc_to_choice: Callable[[MCRecord], list[str]] = _plain_choices
    doc_to_target: Callable[[MCRecord], str] | None = None
    multiple_input: bool = False
    target_delimiter: str = " "
    fewshot_delimiter: str = "\n\n"
    metrics: tuple[str, ...] = ("acc",)
    about: str = ""

    def format_shot(self, rec: MCRecord) -> str:
        """One solved few-shot example, delimiters included (lm-eval ``build_qa_turn``)."""
        if self.multiple_input:
            q, a = self.doc_to_choice(rec)[rec.gold], self.doc_to_target(rec)
        else:
            q, a = self.doc_to_text(rec), self.doc_to_choice(rec)[rec.gold]
        if self.multiple_input and a == "":  # lm-eval: an empty target text is no answer; a choice index is
            return q
        return q + self.target_delimiter + a + self.fewshot_delimiter

    def requests(self, rec: MCRecord, fewshot: Sequence[MCRecord] = (),
                 chat: "ChatFormat | None" = None) -> list[tuple[str, str]]:
        """One ``(context, continuation)`` per choice, in choice order; ``chat`` renders the
        prompt through a chat template as lm-eval's ``apply_chat_template`` does."""
        if chat is not None:
            return self._chat_requests(rec, fewshot, chat)
        prefix = self.description(rec) + "".join(self.format_shot(fs) for fs in fewshot)
        if self.multiple_input:
            cont = self.target_delimiter + self.doc_to_target(rec)
            return [(prefix + c, cont) for c in self.doc_to_choice(rec)]
        ctx = prefix + self.doc_to_text(rec)
        return [(ctx, self.target_delimiter + c) for c in self.doc_to_choice(rec)]


    def _chat_requests(self, rec: MCRecord, fewshot: Sequence[MCRecord], chat: "ChatFormat"):
        """lm-eval 0.4 ``fewshot_context(apply_chat_template=True)`` + ``construct_requests``:
        description -> system message, each shot -> user (question) + assistant (answer), the
        item -> a last user message; choices are scored with no target delimiter."""
        turns: list[Turn] = []
        if self.description(rec):
            turns.append(Turn("system", self.description(rec)))
        for fs in fewshot:
            if self.multiple_input:
                q, a = self.doc_to_choice(fs)[fs.gold], self.doc_to_target(fs)
            else:
                q, a = self.doc_to_text(fs), self.doc_to_choice(fs)[fs.gold]
            if self.multiple_input and a == "":  # lm-eval: a target text "" is no answer; a choice index always is
                turns.append(Turn("user", q))
            else:
                turns += [Turn("user", q, self.target_delimiter), Turn("assistant", a, self.fewshot_delimiter)]
        if self.multiple_input:
            target = self.doc_to_target(rec)
            return [(chat.render(turns + [Turn("user", c)]), target) for c in self.doc_to_choice(rec)]
        ctx = chat.render(turns + [Turn("user", self.doc_to_text(rec))])
        return [(ctx, c) for c in self.doc_to_choice(rec)]


@dataclass(frozen=True)
class Turn:
    """One chat message; ``delimiter`` follows it when turns are joined into one message."""

    role: str  # "system" | "user" | "assistant"
    content: str
    delimiter: str = ""


@dataclass(frozen=True)
class ChatFormat:
    """Renders turns into a prompt with a tokenizer's chat template, as lm-eval's HFLM
    (``apply_chat_template``, generation prompt added). ``multiturn`` keeps each turn a
    message (lm-eval ``fewshot_as_multiturn``); otherwise everything after the system message
    is joined, delimiters included, into one user message."""

    tokenizer: object
    multiturn: bool = False

    def messages(self, turns: Sequence[Turn]) -> list[dict[str, str]]:
        if self.multiturn:
            return [{"role": t.role, "content": t.content} for t in turns]
        system = [t for t in turns[:1] if t.role == "system"]
        rest = list(turns[len(system):])
        text = "".join(t.content + t.delimiter for t in rest[:-1]) + rest[-1].content
        return [{"role": "system", "content": t.content} for t in system] + [{"role": "user", "content": text}]

    def render(self, turns: Sequence[Turn]) -> str:
        import jinja2

        msgs = self.messages(turns)
        try:
            return self._apply(msgs)
        except jinja2.exceptions.TemplateError:  # lm-eval's fallback: templates without a system role
            return self._apply([m for m in msgs if m["role"] != "system"])

    def _apply(self, msgs: list[dict[str, str]]) -> str:
        return self.tokenizer.apply_chat_template(msgs, tokenize=False, add_generation_prompt=True,
                                                  continue_final_message=False)

    @classmethod
    def for_tokenizer(cls, tokenizer, multiturn: bool = False) -> "ChatFormat":
        if not getattr(tokenizer, "chat_template", None):
            raise LensHeadsError("apply_chat_template: this model's tokenizer has no chat template")
        return cls(tokenizer, multiturn)


TASKS: Registry[TaskSpec] = Registry("task")


def register_task(spec: TaskSpec | Callable[[], TaskSpec], *, overwrite: bool = False):
    """Add a task to ``TASKS``. Use as ``register_task(spec)`` or as a decorator on a
    zero-argument function returning a TaskSpec. Returns its argument."""
    s = spec if isinstance(spec, TaskSpec) else spec()
    if not isinstance(s, TaskSpec):
        raise LensHeadsError(f"register_task needs a TaskSpec (or a function returning one), got {type(s).__name__}")
    TASKS.register(s.name, s, overwrite=overwrite)
    return spec


# -----------------------------------------------------------------------------
# Task = spec + records + few-shot pool


@dataclass
class Task:
    """A loaded task. ``records`` are the items to evaluate, in lm-eval's order."""

    spec: TaskSpec
    records: list[MCRecord]
    split: str
    source: str = ""
    _pool_loader: Callable[[], list[MCRecord]] | None = field(default=None, repr=False)
    _pool: list[MCRecord] | None = field(default=None, repr=False)
    _cache: dict = field(default_factory=dict, repr=False)

    @property
    def name(self) -> str:
        return self.spec.name

    def __len__(self) -> int:
        return len(self.records)

    def __iter__(self):
        return iter(self.records)

    def __repr__(self) -> str:
        return f"Task({self.name!r}, split={self.split!r}, n={len(self.records)}, n_shot={self.spec.n_shot}, source={self.source!r})"

    def prompt_settings(self) -> str:
        """What shapes the prompts beyond the records and the code's version, for the task's
        fingerprint (``keys.task_fingerprint``); "" for the built-in tasks, whose prompts are code."""
        return ""

    @property
    def pool_is_eval_split(self) -> bool:
        return self._pool_loader is None

    @property
    def fewshot_pool(self) -> list[MCRecord]:
        """The records few-shot examples are drawn from (loaded on first use)."""
        if self._pool is None:
            self._pool = self.records if self._pool_loader is None else self._pool_loader()
        return self._pool

    def requests(self, record: MCRecord, fewshot: Sequence[MCRecord] = (),
                 chat: ChatFormat | None = None) -> list[tuple[str, str]]:
        """One ``(context, continuation)`` per choice (see TaskSpec.requests)."""
        return self.spec.requests(record, fewshot, chat)

    def build(self, record: MCRecord, n_shot: int | None = None, seed: int = DEFAULT_SEED,
              chat: ChatFormat | None = None) -> list[tuple[str, str]]:
        """``requests(record, fewshot(record, n_shot, seed), chat)``."""
        return self.requests(record, self.fewshot(record, n_shot, seed), chat)

    def choice_lengths(self, record: MCRecord) -> list[int]:
        """acc_norm denominators: character length of each ``doc_to_choice`` string."""
        return [len(c) for c in self.spec.doc_to_choice(record)]

    def predictions(self, record: MCRecord, loglikelihoods: Sequence[float]) -> tuple[int, int]:
        """(pred, pred_norm) as lm-eval: the first maximum of the per-choice log-likelihoods, and
        of them divided by each choice's length in characters (``acc_norm``)."""
        lls = [float(x) for x in loglikelihoods]
        if len(lls) != len(record.choices):
            raise LensHeadsError(f"{self.name} doc {record.doc_id}: got {len(lls)} log-likelihoods for {len(record.choices)} choices")
        norm = [ll / n for ll, n in zip(lls, self.choice_lengths(record))]
        return argmax_first(lls), argmax_first(norm)  # first maximum, like np.argmax

    def score(self, record: MCRecord, loglikelihoods: Sequence[float]) -> dict[str, float]:
        """lm-eval's multiple-choice metrics for one record from per-request log-likelihoods."""
        pred, pred_norm = self.predictions(record, loglikelihoods)
        return {"acc": float(pred == record.gold), "acc_norm": float(pred_norm == record.gold)}

    def fewshot(self, record: MCRecord, n_shot: int | None = None, seed: int = DEFAULT_SEED) -> list[MCRecord]:
        """The few-shot examples lm-eval would put before ``record`` (see module docstring)."""
        k = self.spec.n_shot if n_shot is None else int(n_shot)
        if k < 0:
            raise LensHeadsError(f"n_shot must be >= 0, got {k}")
        if k == 0:
            return []
        if self.spec.sampler == "first_n":
            pool = self._subject_pool(record)
            if self.pool_is_eval_split:  # lm-eval passes eval_doc only when fewshot split == eval split
                pool = [x for x in pool if x.raw != record.raw]
            if k > len(pool):
                raise LensHeadsError(f"{self.name}: {k}-shot requested but the few-shot pool for "
                                     f"{record.subject or 'this task'} has only {len(pool)} items")
            return pool[:k]
        if self.spec.sampler != "random":
            raise LensHeadsError(f"{self.name}: unknown sampler {self.spec.sampler!r} (use 'random' or 'first_n')")
        key = (k, seed)
        if key not in self._cache:
            self._cache[key] = self._draw_all(k, seed)
        try:
            return list(self._cache[key][id(record)])
        except KeyError:
            raise LensHeadsError(f"{self.name}: record doc_id={record.doc_id} is not one of this task's records; "
                                 f"few-shot draws are defined for task.records only") from None

    def check_fewshot(self, n_shot: int | None = None, seed: int = DEFAULT_SEED) -> None:
        """Raise now (before any model work) when ``n_shot`` shots cannot be drawn for every
        record: the pool is known from the data alone."""
        k = self.spec.n_shot if n_shot is None else int(n_shot)
        if k < 0:
            raise LensHeadsError(f"n_shot must be >= 0, got {k}")
        if k == 0 or not self.records:
            return
        if self.spec.sampler == "first_n":  # per-subject pools: one record of each subject
            for rec in {r.subject: r for r in self.records}.values():
                self.fewshot(rec, k, seed)
        else:
            self.fewshot(self.records[0], k, seed)  # draws every record's shots at once

    def _subject_pool(self, record: MCRecord) -> list[MCRecord]:
        pool = self.fewshot_pool
        if self.spec.fewshot_by_subject:
            pool = [x for x in pool if x.subject == record.subject]
        return pool

    def _draw_all(self, k: int, seed: int) -> dict[int, list[MCRecord]]:
        """lm-eval ContextSampler.sample(k, eval_doc) run over all records with one RNG."""
        rnd = random.Random(seed)
        draws: dict[int, list[MCRecord]] = {}
        for rec in self.records:
            pool = self._subject_pool(rec)
            if k + 1 > len(pool):
                raise LensHeadsError(f"{self.name}: {k}-shot needs a few-shot pool of at least {k + 1} items, "
                                     f"got {len(pool)}")
            res = [x for x in rnd.sample(pool, k + 1) if x.raw != rec.raw][:k]
            if len(res) < k:  # duplicates of the item in the pool (lm-eval 0.4.13 resamples)
                res = rnd.sample([x for x in pool if x.raw != rec.raw], k)
            draws[id(rec)] = res
        return draws


def argmax_first(xs: Sequence[float]) -> int:
    """Index of the largest value, the first one on ties (numpy.argmax, as lm-eval uses)."""
    best = 0
    for i, x in enumerate(xs):
        if x > xs[best]:
            best = i
    return best


def _check_split(name: str, split: str, splits: Sequence[str]) -> None:
    if split not in splits:
        raise LensHeadsError(f"{name}: unknown split {split!r}; valid splits: {', '.join(splits)}")


# --- MMLU --------------------------------------------------------------------

_MMLU_SPLIT_DIR = {"test": "test", "dev": "dev", "validation": "val"}


def _mmlu_loader(split: str, data_root=None) -> tuple[list[MCRecord], str]:
    """Records ordered by subject file name then row; doc_id = index in that order."""
    _check_split("mmlu", split, tuple(_MMLU_SPLIT_DIR))
    sub = _MMLU_SPLIT_DIR[split]
    folder = local_file(f"mmlu/{sub}", data_root)
    suffix = f"_{sub}.csv"
    files = sorted(folder.glob(f"*{suffix}")) if folder is not None else []
    if files:
        recs: list[MCRecord] = []
        for path in files:
            subject = path.name[: -len(suffix)]
            with open(path, encoding="utf-8", newline="") as f:
                for row in csv.DictReader(f):
                    choices = [row[f"choice{i}"] for i in range(4)]
                    raw = {"question": row["question"], "subject": subject, "choices": choices, "answer": int(row["answer"])}
                    recs.append(MCRecord(len(recs), raw["question"], choices, raw["answer"], subject, raw))
        return recs, f"local:{folder}"
    ds = load_hub_dataset("cais/mmlu", "all", split, what="task 'mmlu'")
    recs = [MCRecord(i, r["question"], list(r["choices"]), int(r["answer"]), r["subject"], dict(r)) for i, r in enumerate(ds)]
    return recs, "hub:cais/mmlu/all"


def mmlu_description(rec: MCRecord) -> str:
    """lm-eval's per-subject description (``_generate_configs.py``: underscores -> spaces)."""
    return f"The following are multiple choice questions (with answers) about {rec.subject.replace('_', ' ')}.\n\n"


def _mmlu_text(rec: MCRecord) -> str:
    c = rec.choices
    return f"{rec.question.strip()}\nA. {c[0]}\nB. {c[1]}\nC. {c[2]}\nD. {c[3]}\nAnswer:"


def _mmlu_choices(rec: MCRecord) -> list[str]:
    return ["A", "B", "C", "D"]


register_task(TaskSpec(
    name="mmlu", loader=_mmlu_loader, splits=("test", "dev", "validation"), default_split="test",
    n_shot=5, fewshot_split="dev", sampler="first_n", fewshot_by_subject=True,
    description=mmlu_description, doc_to_text=_mmlu_text, doc_to_choice=_mmlu_choices,
    metrics=("acc",), about="MMLU, 57 subjects; lm-eval 'mmlu' (acc, subjects weighted by size)",
))


# --- PIQA --------------------------------------------------------------------


def _piqa_loader(split: str, data_root=None) -> tuple[list[MCRecord], str]:
    _check_split("piqa", split, ("validation", "train"))
    data = local_file("piqa/valid.jsonl", data_root) if split == "validation" else None
    labels = local_file("piqa/valid-labels.lst", data_root) if split == "validation" else None
    if data is not None and labels is not None:
        rows = list(iter_rows(data))
        with open(labels, encoding="utf-8") as f:
            gold = [int(x) for x in f.read().split()]
        if len(gold) != len(rows):
            raise LensHeadsError(f"{data}: {len(rows)} rows but {labels} has {len(gold)} labels")
        rows = [{**r, "label": g} for r, g in zip(rows, gold)]
        source = f"local:{data}"
    else:
        rows = [dict(r) for r in load_hub_dataset("baber/piqa", None, split, what="task 'piqa'")]
        source = "hub:baber/piqa"
    recs = [MCRecord(i, r["goal"], [r["sol1"], r["sol2"]], int(r["label"]), None, r) for i, r in enumerate(rows)]
    return recs, source


def _piqa_text(rec: MCRecord) -> str:
    return f"Question: {rec.question}\nAnswer:"


register_task(TaskSpec(
    name="piqa", loader=_piqa_loader, splits=("validation", "train"), default_split="validation",
    n_shot=0, doc_to_text=_piqa_text, metrics=("acc", "acc_norm"),
    about="PIQA validation, 0-shot; lm-eval 'piqa' (acc, acc_norm)",
))


# --- WinoGrande ---------------------------------------------------------------


def _winogrande_loader(split: str, data_root=None) -> tuple[list[MCRecord], str]:
    _check_split("winogrande", split, ("validation", "train"))
    data = local_file("winogrande/dev.jsonl", data_root) if split == "validation" else None
    if data is not None:
        rows, source = list(iter_rows(data)), f"local:{data}"
    else:
        rows = [dict(r) for r in load_hub_dataset("allenai/winogrande", "winogrande_xl", split, what="task 'winogrande'")]
        source = "hub:allenai/winogrande/winogrande_xl"
    recs = []
    for i, r in enumerate(rows):
        if r["answer"] not in ("1", "2"):
            raise LensHeadsError(f"winogrande {source} row {i}: answer {r['answer']!r} is not '1' or '2'")
        recs.append(MCRecord(i, r["sentence"], [r["option1"], r["option2"]], int(r["answer"]) - 1, None, r))
    return recs, source


def _winogrande_choices(rec: MCRecord) -> list[str]:
    """Sentence prefix up to the blank with each option substituted (the contexts)."""
    idx = rec.question.index("_")
    return [rec.question[:idx] + opt for opt in rec.choices]


def _winogrande_target(rec: MCRecord) -> str:
    """The shared text after the blank (scored)."""
    idx = rec.question.index("_") + 1
    return rec.question[idx:].strip()


register_task(TaskSpec(
    name="winogrande", loader=_winogrande_loader, splits=("validation", "train"), default_split="validation",
    n_shot=5, fewshot_split=None, sampler="random",
    doc_to_choice=_winogrande_choices, doc_to_target=_winogrande_target, multiple_input=True,
    metrics=("acc",),
    about="WinoGrande (xl) validation, 5-shot, partial scoring; lm-eval 'winogrande' (acc). "
          "Shots from the same split minus the item unless fewshot_split='train'",
))

