"""Local multiple-choice files (.jsonl, .json, .csv, .parquet) as lm-eval-style Tasks.

``load_mc_file(path, question=..., choices=..., answer=...)`` maps a file's fields onto
``MCRecord``s and builds a ``TaskSpec`` around them, so a user's own benchmark is evaluated,
ablated and swept exactly like the registered tasks. Its string form, for the command line, is
``file:PATH?question=goal&choices=sol1,sol2&answer=label`` (``parse_mc_spec``);
``load_task`` accepts it wherever a task name is accepted.
"""

from __future__ import annotations

import json
import os
import string
from pathlib import Path
from typing import Any, Sequence
from urllib.parse import unquote

from lens_heads.data.corpora import iter_rows
from lens_heads.data.tasks import MCRecord, Task, TaskSpec
from lens_heads.errors import LensHeadsError

MC_SUFFIXES = {".jsonl", ".json", ".csv", ".parquet"}


class _Fields(dict):
    def __missing__(self, key):
        raise LensHeadsError(f"template names {{{key}}} but the row has no such field; available: {sorted(self)}")


def load_mc_file(
    path: str | os.PathLike,
    question: str = "question",
    choices: str | Sequence[str] = "choices",
    answer: str = "answer",
    answer_type: str = "index",
    subject: str | None = None,
    prompt_template: str = "{question}",
    choice_template: str = "{choice}",
    *,
    labels: Sequence[str] | str = string.ascii_uppercase,
    description: str = "",
    target_delimiter: str = " ",
    fewshot_delimiter: str = "\n\n",
    n_shot: int = 0,
    name: str | None = None,
) -> Task:
    """Load a local multiple-choice file (.jsonl, .json, .csv, .parquet) as a Task.

    Field mapping:
      question        field holding the question text;
      choices         a list of fields, one per choice (``["sol1", "sol2"]``), or one field
                      holding a list (in a .csv: a JSON list such as ``["a", "b"]``);
      answer          field holding the correct answer, read per ``answer_type``:
                      "index" 0-based integer (``"2"`` is fine), "label" one of ``labels``
                      (default A, B, C, ...; e.g. ``labels="12"`` for 1-based), "text" the
                      correct choice's text;
      subject         optional field used as the record's subject.

    Prompt: ``prompt_template`` is a ``str.format`` template over the row's fields plus
    ``{question}`` (the question field's value), ``{choices}`` and ``{subject}``, e.g.
    ``"Question: {question}\\nAnswer:"``. Each choice is scored as the continuation
    ``target_delimiter + choice_template`` with ``{choice}`` (text), ``{label}``
    (``labels[i]``) and ``{index}``; e.g. ``choice_template="{label}"`` for MMLU-style letters.
    ``description`` is prepended once. Default 0-shot; with ``n_shot=k`` (or
    ``task.fewshot(rec, k)``) shots are drawn from the same file minus the item, with
    lm-eval's seeded sampler.

    String form (CLI): ``file:PATH?key=value&key=value`` with keys question, choices
    (comma-separated field names; one name = a list-valued field), answer, answer_type,
    subject, prompt (or prompt_template), choice (or choice_template), labels, description,
    n_shot, name. Values are URL-decoded and ``\\n`` / ``\\t`` escapes are expanded, e.g.
    ``file:piqa.jsonl?question=goal&choices=sol1,sol2&answer=label&prompt=Question: {goal}\\nAnswer:``.
    """
    path = Path(path).expanduser()
    if not path.exists():
        raise LensHeadsError(f"Multiple-choice file not found: {path}")
    if path.suffix.lower() not in MC_SUFFIXES:
        raise LensHeadsError(f"{path}: unsupported file type {path.suffix!r}; use .jsonl, .json, .csv or .parquet")
    if answer_type not in ("index", "label", "text"):
        raise LensHeadsError(f"answer_type must be 'index', 'label' or 'text', got {answer_type!r}")
    labels = list(labels)
    rows = list(iter_rows(path))
    if not rows:
        raise LensHeadsError(f"{path} is empty: no rows to load")

    records = []
    for i, row in enumerate(rows):
        def get(fname: str, role: str):
            if fname not in row:
                raise LensHeadsError(f"{path}: row {i} has no field {fname!r} (given as {role}); "
                                     f"fields available: {', '.join(map(repr, row))}")
            return row[fname]

        q = get(question, "question")
        if isinstance(choices, str):
            ch = get(choices, "choices")
            if isinstance(ch, str):
                try:
                    ch = json.loads(ch)
                except json.JSONDecodeError:
                    ch = None
            if not isinstance(ch, list):
                raise LensHeadsError(f"{path}: row {i}: field {choices!r} should hold a list of choices; "
                                     f"to use several fields give a list (or 'a,b' in a file: spec)")
        else:
            ch = [get(c, "a choice") for c in choices]
        ch = ["" if c is None else str(c) for c in ch]
        if len(ch) < 2:
            raise LensHeadsError(f"{path}: row {i} has {len(ch)} choice(s); need at least 2")
        gold = _parse_answer(get(answer, "answer"), answer_type, ch, labels, f"{path}: row {i}")
        subj = None if subject is None else str(get(subject, "subject"))
        records.append(MCRecord(i, "" if q is None else str(q), ch, gold, subj, dict(row)))

    def doc_to_text(rec: MCRecord) -> str:
        return prompt_template.format_map(_Fields({**rec.raw, "question": rec.question, "choices": rec.choices,
                                                   "subject": rec.subject}))

    def doc_to_choice(rec: MCRecord) -> list[str]:
        if len(rec.choices) > len(labels) and "{label}" in choice_template:
            raise LensHeadsError(f"doc {rec.doc_id}: {len(rec.choices)} choices but only {len(labels)} labels")
        return [choice_template.format_map(_Fields({"choice": c, "index": j, "label": labels[j] if j < len(labels) else ""}))
                for j, c in enumerate(rec.choices)]

    # Fail now, not in the middle of an evaluation, if a template names a missing field or is malformed.
    try:
        doc_to_text(records[0])
        doc_to_choice(records[0])
    except (ValueError, IndexError) as exc:  # str.format: "expected '}' before end of string", ...
        raise LensHeadsError(f"{path}: bad prompt or choice template ({exc}); fields are written {{name}}, "
                             f"a literal brace as {{{{ or }}}}") from None

    spec = TaskSpec(
        name=name or path.stem, loader=_fixed_loader(records, f"local:{path}"), splits=("file",),
        default_split="file", n_shot=n_shot, fewshot_split=None, sampler="random",
        description=lambda rec: description, doc_to_text=doc_to_text, doc_to_choice=doc_to_choice,
        target_delimiter=target_delimiter, fewshot_delimiter=fewshot_delimiter, metrics=("acc", "acc_norm"),
        about=f"local multiple-choice file {path}",
    )
    return Task(spec, records, "file", f"local:{path}")


def _fixed_loader(records: list[MCRecord], source: str):
    def loader(split: str, data_root=None):
        return records, source

    return loader


def _parse_answer(value: Any, answer_type: str, choices: list[str], labels: list[str], where: str) -> int:
    if answer_type == "index":
        if isinstance(value, bool) or isinstance(value, float) and not float(value).is_integer():
            raise LensHeadsError(f"{where}: answer {value!r} is not an integer index "
                                 f"(use answer_type='label' or 'text' for other forms)")
        try:
            gold = int(str(value).strip()) if not isinstance(value, int) else value
        except ValueError:
            raise LensHeadsError(f"{where}: answer {value!r} is not an integer index "
                                 f"(use answer_type='label' or 'text' for other forms)") from None
    elif answer_type == "label":
        v = str(value).strip()
        matches = [j for j, lab in enumerate(labels) if lab == v] or [j for j, lab in enumerate(labels) if lab.lower() == v.lower()]
        if not matches:
            raise LensHeadsError(f"{where}: answer {value!r} is not one of the labels {labels[: len(choices)]}")
        gold = matches[0]
    else:
        v = str(value).strip()
        matches = [j for j, c in enumerate(choices) if c.strip() == v]
        if not matches:
            raise LensHeadsError(f"{where}: answer text {value!r} matches none of the choices {choices}")
        gold = matches[0]
    if not 0 <= gold < len(choices):
        raise LensHeadsError(f"{where}: answer {value!r} gives index {gold}, outside 0..{len(choices) - 1}")
    return gold


_SPEC_KEYS = {
    "question": "question", "choices": "choices", "answer": "answer", "answer_type": "answer_type",
    "subject": "subject", "prompt": "prompt_template", "prompt_template": "prompt_template",
    "choice": "choice_template", "choice_template": "choice_template", "labels": "labels",
    "description": "description", "n_shot": "n_shot", "name": "name",
    "target_delimiter": "target_delimiter", "fewshot_delimiter": "fewshot_delimiter",
}


def parse_mc_spec(spec: str) -> tuple[str, dict[str, Any]]:
    """Split ``"file:PATH?k=v&..."`` into ``(PATH, load_mc_file kwargs)``."""
    s = spec[len("file:"):] if spec.startswith("file:") else spec
    path, _, query = s.partition("?")
    kwargs: dict[str, Any] = {}
    # Split by hand rather than parse_qsl: "+" stays "+" (templates may contain it).
    for item in filter(None, query.split("&")):
        key, _, value = item.partition("=")
        key, value = unquote(key).strip(), unquote(value)
        if key not in _SPEC_KEYS:
            raise LensHeadsError(f"Unknown option {key!r} in {spec!r}; valid options: {', '.join(sorted(_SPEC_KEYS))}")
        value = _unescape(value)
        arg = _SPEC_KEYS[key]
        if arg == "choices":
            parts = [p.strip() for p in value.split(",") if p.strip()]
            value = parts if len(parts) > 1 else (parts[0] if parts else "")
        elif arg == "n_shot":
            try:
                value = int(value)
            except ValueError:
                raise LensHeadsError(f"n_shot must be an integer in {spec!r}, got {value!r}") from None
        elif arg == "labels" and "," in value:
            value = [p.strip() for p in value.split(",")]
        kwargs[arg] = value
    return unquote(path), kwargs


def _unescape(s: str) -> str:
    return s.replace("\\\\", "\0").replace("\\n", "\n").replace("\\t", "\t").replace("\0", "\\")


def load_mc_spec(spec: str) -> Task:
    """``load_mc_file`` from its string form (see ``load_mc_file``)."""
    path, kwargs = parse_mc_spec(spec)
    return load_mc_file(path, **kwargs)
