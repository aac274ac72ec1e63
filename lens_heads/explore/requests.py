"""The explorer's requests as typed values, with one parser (docs/methods.md §11).

Every field of every endpoint is checked here, before any computation: its type (a boolean is
not an integer, ``1.9`` is not an index, ``1e999`` and ``NaN`` are not numbers a request may
carry), its range where it has one, and unknown fields. A bad field is a ``LensHeadsError``
naming it (the server answers 400).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from lens_heads.errors import LensHeadsError

MAX_FIELD = 16_384  # characters of a spec, replacement or task name (a prompt is capped by the body size)


@dataclass(frozen=True)
class Input:
    """What the model reads: a prompt, or question ``index`` of ``task``."""

    prompt: str | None = None
    task: str | None = None
    index: int = 0


@dataclass(frozen=True)
class RunRequest:
    input: Input
    ablation: str | None = None
    replacement: str | None = None


@dataclass(frozen=True)
class HeadRequest:
    input: Input
    layer: int
    head: int


INPUT_FIELDS = ("prompt", "task", "index")
FIELDS = {"run": (*INPUT_FIELDS, "ablation", "replacement"), "head": (*INPUT_FIELDS, "layer", "head"),
          "question": ("task", "index"), "info": ()}


def parse(kind: str, body) -> RunRequest | HeadRequest | Input | None:
    """The typed request of endpoint ``kind`` (run, head, question, info) from a decoded JSON body
    (or a query string's {name: text}); a ``LensHeadsError`` naming the first bad field."""
    if not isinstance(body, dict):
        raise LensHeadsError("the request body must be a JSON object")
    unknown = sorted(str(k) for k in body if k not in FIELDS[kind])
    if unknown:
        raise LensHeadsError(f"unknown field {unknown[0]!r}: this endpoint takes "
                             f"{', '.join(FIELDS[kind]) or 'no field'}")
    if kind == "info":
        return None
    if kind == "question":
        task = _text(body, "task")
        if task is None:
            raise LensHeadsError("give a task")
        return Input(task=task, index=_integer(body, "index", 0, minimum=0))
    inp = _input(body)
    if kind == "run":
        return RunRequest(inp, _text(body, "ablation"), _text(body, "replacement"))
    layer, head = _integer(body, "layer"), _integer(body, "head")
    return HeadRequest(inp, layer, head)


def _input(body: dict) -> Input:
    task, prompt = _text(body, "task"), body.get("prompt")
    if task:
        if prompt is not None:
            raise LensHeadsError("give a prompt or a task question, not both")
        return Input(task=task, index=_integer(body, "index", 0, minimum=0))
    if "index" in body:
        raise LensHeadsError("index goes with a task")
    if not isinstance(prompt, str):
        raise LensHeadsError("give a prompt (text) or a task question" if prompt is None
                             else f"prompt must be text, not {_kind(prompt)}")
    return Input(prompt=_unicode("prompt", prompt))


def _unicode(name: str, value: str) -> str:
    """``value``, refused if it holds a lone surrogate (JSON allows ``\\ud800``; no tokenizer does)."""
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        raise LensHeadsError(f"{name} holds a lone surrogate (an unpaired \\ud800-\\udfff escape): not text") from None
    return value


def _text(body: dict, name: str) -> str | None:
    value = body.get(name)
    if value is None:
        return None
    if not isinstance(value, str):
        raise LensHeadsError(f"{name} must be text, not {_kind(value)}")
    if len(value) > MAX_FIELD:
        raise LensHeadsError(f"{name} is over {MAX_FIELD} characters")
    return _unicode(name, value)


def _integer(body: dict, name: str, default: int | None = None, minimum: int | None = None) -> int:
    """An integer field: a JSON integer (a query string's digits); never a boolean, a fraction,
    ±Infinity or NaN."""
    value = body.get(name, default)
    if value is None:
        raise LensHeadsError(f"give {name} (an integer)")
    if isinstance(value, str) and re.fullmatch(r"-?[0-9]{1,18}", value):  # a query string's (ASCII digits only)
        value = int(value)
    if isinstance(value, bool) or not isinstance(value, int):
        raise LensHeadsError(f"{name} must be an integer, not {_kind(value)}")
    if minimum is not None and value < minimum:
        raise LensHeadsError(f"{name} must be >= {minimum}, got {value}")
    return value


def _kind(value) -> str:
    if isinstance(value, bool):
        return f"a boolean ({str(value).lower()})"
    if isinstance(value, float):
        return f"{value!r}"
    if isinstance(value, str):
        return f"the text {value[:40]!r}"
    return {list: "a list", dict: "an object", int: "an integer"}.get(type(value), type(value).__name__)
