"""Local multiple-choice files (.jsonl, .json, .csv, .parquet) as lm-eval-style Tasks.

``load_mc_file(path, question=..., choices=..., answer=...)`` maps a file's fields onto
``MCRecord``s and builds a ``TaskSpec`` around them, so a user's own benchmark is evaluated,
ablated and swept exactly like the registered tasks. Its string form, for the command line, is
``file:PATH?question=goal&choices=sol1,sol2&answer=label`` (``parse_mc_spec``);
``load_task`` accepts it wherever a task name is accepted. Field names may be dotted paths
into nested rows, and ``labels_field`` reads per-row labels, so hub schemas such as ARC's
load directly: ``file:arc.jsonl?question=question&choices=choices.text&labels_field=choices.label&answer=answerKey``.
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
    answer_type: str | None = None,
    subject: str | None = None,
    prompt_template: str = "{question}",
    choice_template: str = "{choice}",
    *,
    labels: Sequence[str] | str | None = None,
    labels_field: str | None = None,
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
                      correct choice's text; default "index", or "label" with ``labels_field``;
      labels_field    field holding each row's own list of labels, one per choice (ARC's
                      ``choices.label``: "A".."D" in some rows, "1".."4" in others); used
                      instead of ``labels`` for that row's "label" answer and ``{label}``;
      subject         optional field used as the record's subject.

    Every field name may be a dotted path into nested rows: ``question.stem`` is
    ``row["question"]["stem"]``; a whole-number part indexes a list (``choices.text.0``); a
    key that itself contains dots is matched whole first; a JSON string met on the way (a
    .csv cell) is decoded. Templates see the row as read (nested: ``{choices[text]}``).

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
    subject, prompt (or prompt_template), choice (or choice_template), labels, labels_field,
    description, n_shot, name. Values are URL-decoded and ``\\n`` / ``\\t`` escapes are expanded, e.g.
    ``file:piqa.jsonl?question=goal&choices=sol1,sol2&answer=label&prompt=Question: {goal}\\nAnswer:``
    or ``file:arc.jsonl?question=question&choices=choices.text&labels_field=choices.label&answer=answerKey``.
    """
    path = Path(path).expanduser()
    if not path.exists():
        raise LensHeadsError(f"Multiple-choice file not found: {path}")
    if path.suffix.lower() not in MC_SUFFIXES:
        raise LensHeadsError(f"{path}: unsupported file type {path.suffix!r}; use .jsonl, .json, .csv or .parquet")
    if answer_type is None:
        answer_type = "label" if labels_field else "index"
    if answer_type not in ("index", "label", "text"):
        raise LensHeadsError(f"answer_type must be 'index', 'label' or 'text', got {answer_type!r}")
    if labels is not None and labels_field:
        raise LensHeadsError(f"{path}: give labels (one list for every row) or labels_field (a list per row), not both")
    labels = list(string.ascii_uppercase if labels is None else labels)
    rows = list(iter_rows(path))
    if not rows:
        raise LensHeadsError(f"{path} is empty: no rows to load")

    records = []
    row_labels: dict[int, list[str]] = {}  # doc_id -> that row's labels (labels_field)
    for i, row in enumerate(rows):
        where = f"{path}: row {i}"

        def get(fname: str, role: str):
            return _lookup(row, fname, role, where)

        q = get(question, "question")
        if isinstance(choices, str):
            ch = _as_list(get(choices, "choices"))
            if ch is None:
                raise LensHeadsError(f"{path}: row {i}: field {choices!r} should hold a list of choices; "
                                     f"to use several fields give a list (or 'a,b' in a file: spec)")
        else:
            ch = [get(c, "a choice") for c in choices]
        ch = ["" if c is None else str(c) for c in ch]
        if len(ch) < 2:
            raise LensHeadsError(f"{path}: row {i} has {len(ch)} choice(s); need at least 2")
        labs = labels
        if labels_field:
            labs = _as_list(get(labels_field, "labels_field"))
            if labs is None:
                raise LensHeadsError(f"{where}: field {labels_field!r} (given as labels_field) should hold a list "
                                     f"of labels, one per choice")
            labs = [str(x).strip() for x in labs]
            if len(labs) != len(ch):
                raise LensHeadsError(f"{where}: {len(labs)} labels in field {labels_field!r} but {len(ch)} "
                                     f"choices in {choices if isinstance(choices, str) else ','.join(choices)!r}")
            if len(set(labs)) != len(labs):
                raise LensHeadsError(f"{where}: field {labels_field!r} repeats a label: {labs}")
            row_labels[i] = labs
        gold = _parse_answer(get(answer, "answer"), answer_type, ch, labs,
                             f"{where}, field {answer!r}" if labels_field else where,
                             f"the row's labels (field {labels_field!r})" if labels_field else "the labels")
        subj = None if subject is None else str(get(subject, "subject"))
        records.append(MCRecord(i, "" if q is None else str(q), ch, gold, subj, dict(row)))

    def doc_to_text(rec: MCRecord) -> str:
        return prompt_template.format_map(_Fields({**rec.raw, "question": rec.question, "choices": rec.choices,
                                                   "subject": rec.subject}))

    def doc_to_choice(rec: MCRecord) -> list[str]:
        labs = row_labels.get(rec.doc_id, labels)
        if len(rec.choices) > len(labs) and "{label}" in choice_template:
            raise LensHeadsError(f"doc {rec.doc_id}: {len(rec.choices)} choices but only {len(labs)} labels")
        return [choice_template.format_map(_Fields({"choice": c, "index": j, "label": labs[j] if j < len(labs) else ""}))
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


def _lookup(row: dict, name: str, role: str, where: str) -> Any:
    """The value of field ``name`` in ``row``: a key, or a dotted path into nested dicts / lists
    (longest dotted key first at each level; JSON strings on the way are decoded)."""
    if name in row:
        return row[name]
    if "." not in name:
        raise LensHeadsError(f"{where} has no field {name!r} (given as {role}); "
                             f"fields available: {', '.join(map(repr, row))}")
    parts, done, cur = name.split("."), [], row
    while len(done) < len(parts):
        rest = parts[len(done):]
        if isinstance(cur, str) and done:
            cur = _json_container(cur)
        if isinstance(cur, dict):
            for j in range(len(rest), 0, -1):
                key = ".".join(rest[:j])
                if key in cur:
                    cur, done = cur[key], done + rest[:j]
                    break
            else:
                keys = ", ".join(map(repr, cur)) or "none"
                if not done:
                    raise LensHeadsError(f"{where} has no field {rest[0]!r} (from {name!r}, given as {role}); "
                                         f"fields available: {keys}")
                raise LensHeadsError(f"{where}: field {name!r} (given as {role}): {'.'.join(done)!r} has no key "
                                     f"{rest[0]!r}; keys there: {keys}")
            continue
        if isinstance(cur, (list, tuple)):
            if rest[0].isdigit() and int(rest[0]) < len(cur):
                cur, done = cur[int(rest[0])], done + rest[:1]
                continue
            raise LensHeadsError(f"{where}: field {name!r} (given as {role}): {'.'.join(done)!r} is a list of "
                                 f"{len(cur)}; {rest[0]!r} is not an index in 0..{len(cur) - 1}")
        shown = repr(cur) if len(repr(cur)) <= 40 else repr(cur)[:37] + "..."
        raise LensHeadsError(f"{where}: field {name!r} (given as {role}): {'.'.join(done)!r} holds "
                             f"{type(cur).__name__} {shown}, not an object with key {rest[0]!r}")
    return cur


def _json_container(s: str) -> Any:
    """``s`` decoded if it is a JSON object or list, else ``s`` unchanged."""
    if s.lstrip()[:1] in ("{", "["):
        try:
            return json.loads(s)
        except json.JSONDecodeError:
            pass
    return s


def _as_list(value: Any) -> list | None:
    """``value`` if a list, a JSON list string decoded (a .csv cell), else None."""
    if isinstance(value, str):
        try:
            value = json.loads(value)
        except json.JSONDecodeError:
            return None
    return value if isinstance(value, list) else None


def _parse_answer(value: Any, answer_type: str, choices: list[str], labels: list[str], where: str,
                  labels_are: str = "the labels") -> int:
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
            raise LensHeadsError(f"{where}: answer {value!r} is not one of {labels_are} {labels[: len(choices)]}")
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
    "labels_field": "labels_field",
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
