"""Evaluation protocol: how prompts are tokenised and formatted, and how thresholds are taken.

Four settings decide whether a run reproduces the paper's numbers or today's lm-eval's:

* ``add_bos_token``: lm-eval's model argument of that name. ``None`` ("auto") is lm-eval
  0.4.13's default, the tokenizer's own special tokens (Llama-3-style tokenizers add a BOS);
  ``True`` / ``False`` pass ``add_special_tokens=True`` / ``False`` to every encode. In both
  versions a string that already starts with the BOS text is encoded without special tokens.
  lm-eval 0.4.5, which the paper used, encoded with ``False`` unless the argument was set,
  and forced ``True`` for Gemma models. Known difference: lm-eval 0.4.13 also hands
  ``add_bos_token=True`` to ``AutoTokenizer.from_pretrained``, which switches the BOS on for
  Llama-type tokenizers whose own config turns it off; lens_heads, given a loaded tokenizer,
  only passes ``add_special_tokens=True``.
* ``apply_chat_template`` / ``fewshot_as_multiturn``: lm-eval's options of those names. The
  task's description becomes a system message, each shot a user turn (question) and an
  assistant turn (answer), the item a final user turn; with ``fewshot_as_multiturn=False``
  everything but the system message is collapsed into one user message. The tokenizer's chat
  template renders it with the generation prompt, and the answer choices are scored with no
  target delimiter in front. The authors applied both to -Instruct / -chat / -SFT / -DPO models.
* ``threshold_rule``: ``"quantile"`` (lens_heads: order statistic, inclusive comparison) or
  ``"cdf"`` (the authors': interpolated empirical CDF, strict comparison); see ``thresholds``.

``Protocol()`` is lens_heads' default; ``paper_protocol(model)`` resolves the paper's settings
for a model. ``Protocol.key()`` holds only the settings that differ from the default, so store
keys of default runs are what they were before these settings existed.

The authors' ``thresholds.json`` (``{task: {model: {HeadType: [tau at 0, 5, ..., 30 %]}}}``)
loads with ``load_authors_thresholds``, their class names mapped to score ids.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import json
import math
import os
from dataclasses import asdict, dataclass, fields
from pathlib import Path

from lens_heads.errors import LensHeadsError
from lens_heads.interventions.thresholds import DEFAULT_FRACTIONS, DEFAULT_RULE, check_rule
from lens_heads.models.zoo import ZOO

if TYPE_CHECKING:
    from lens_heads.models.load import LoadedModel

BOS_CHOICES = ("auto", "true", "false")
CHAT_MARKERS = ("-Instruct", "-chat", "-SFT", "-DPO")  # the authors' should_apply_chat_template


def parse_add_bos(text: str | bool | None) -> bool | None:
    """``"auto"`` -> None, ``"true"`` -> True, ``"false"`` -> False (bools and None pass)."""
    if text is None or isinstance(text, bool):
        return text
    value = str(text).strip().lower()
    if value not in BOS_CHOICES:
        raise LensHeadsError(f"add_bos_token must be one of {', '.join(BOS_CHOICES)}, got {text!r}")
    return None if value == "auto" else value == "true"


@dataclass(frozen=True)
class Protocol:
    """How a run tokenises, formats and thresholds (see module docstring)."""

    add_bos_token: bool | None = None  # None: the tokenizer's default (lm-eval 0.4.13)
    apply_chat_template: bool = False
    fewshot_as_multiturn: bool = False
    threshold_rule: str = DEFAULT_RULE

    def __post_init__(self):
        parse_add_bos(self.add_bos_token)
        check_rule(self.threshold_rule)
        if self.fewshot_as_multiturn and not self.apply_chat_template:
            raise LensHeadsError("fewshot_as_multiturn needs apply_chat_template (as in lm-eval)")

    @property
    def strict(self) -> bool:
        """Heads are zeroed strictly beyond a threshold (the authors' rule)."""
        return self.threshold_rule == "cdf"

    def key(self) -> dict:
        """The settings that differ from ``Protocol()`` (empty for the default)."""
        default = Protocol()
        return {f.name: getattr(self, f.name) for f in fields(self)
                if getattr(self, f.name) != getattr(default, f.name)}

    def prompt_key(self) -> dict:
        """``key()`` without the threshold rule: what changes the prompts the model reads."""
        return {k: v for k, v in self.key().items() if k != "threshold_rule"}

    def __str__(self) -> str:
        bos = {None: "auto", True: "true", False: "false"}[self.add_bos_token]
        chat = ("multiturn" if self.fewshot_as_multiturn else "on") if self.apply_chat_template else "off"
        return f"add_bos_token={bos}, chat_template={chat}, threshold_rule={self.threshold_rule}"

    def to_dict(self) -> dict:
        return asdict(self)


def model_id(model: LoadedModel) -> str:
    """The model's hub-style id: the zoo entry's original id, else the name it was loaded by."""

    name = model.name
    return ZOO[name].hf_id if name in ZOO else str(name)


def paper_protocol(model: LoadedModel) -> Protocol:
    """The paper's settings for ``model``: lm-eval 0.4.5's BOS rule (only Gemma gets one),
    the chat template (as multi-turn few-shot) for -Instruct / -chat / -SFT / -DPO models,
    and the authors' CDF thresholds with strict zeroing."""
    model_type = getattr(model.hf_model.config, "model_type", "") or ""
    chat = any(m in model_id(model) for m in CHAT_MARKERS)
    return Protocol(add_bos_token="gemma" in model_type, apply_chat_template=chat,
                    fewshot_as_multiturn=chat, threshold_rule="cdf")


def resolve_protocol(model: LoadedModel, *, paper: bool = False, add_bos_token: str | bool | None = None,
                     apply_chat_template: bool | None = None, fewshot_as_multiturn: bool | None = None,
                     threshold_rule: str | None = None) -> Protocol:
    """A protocol from CLI-style settings: the paper's (``paper``) or the default, with every
    setting that is given (not None) overriding it."""
    values = asdict(paper_protocol(model) if paper else Protocol())
    given = {"apply_chat_template": apply_chat_template, "fewshot_as_multiturn": fewshot_as_multiturn,
             "threshold_rule": threshold_rule}
    values.update({k: v for k, v in given.items() if v is not None})
    if add_bos_token is not None:  # "auto" is a setting too (None after parsing)
        values["add_bos_token"] = parse_add_bos(add_bos_token)
    if not values["apply_chat_template"] and fewshot_as_multiturn is None:
        values["fewshot_as_multiturn"] = False  # e.g. --paper-protocol --no-apply-chat-template
    return Protocol(**values)


# -----------------------------------------------------------------------------
# The authors' thresholds.json

AUTHORS_SCORE_IDS = {  # their HeadType names (and class names) -> score ids
    "Dormant": "awft", "DormantHeads": "awft",
    "NormalizedDormant": "awft_ln", "NormalizedDormantHeads": "awft_ln",
    "Entropy": "aeqd", "EntropyHeads": "aeqd",
    "NormalizedEntropy": "aeqd_ln", "NormalizedEntropyHeads": "aeqd_ln",
    "ValueVectorMagnitudeFirstToken": "ftvvn",
    "ValueVectorMagnitudeNormalizedFirstToken": "ftvvn_ln",
    "ValueVectorAvgMagnitude": "avvn",
    "ValueVectorAvgNormalizedMagnitude": "avvn_ln",
    "HeadOutputMagnitudeLastToken": "lthon",
    "HeadOutputMagnitudeNormalizedLastToken": "lthon_ln",
    "HeadOutputMagnitudeNormalizedHeadLastToken": "lthon_hn",
    "UnnormalizedHONOR": "ahon", "UnnormalizedHonorHeads": "ahon",
    "HONOR": "ahon_ln", "HonorHeads": "ahon_ln",
    "FullHeadOutput": "fhon", "FullHeadOutputNormalized": "fhon_ln",
}
AUTHORS_FRACTIONS: tuple[float, ...] = DEFAULT_FRACTIONS  # their grid: 0, 5, ..., 30 %


def load_authors_thresholds(path: str | os.PathLike, task: str, model: str) -> dict[str, dict[float, float | None]]:
    """``{score_id: {fraction: tau}}`` for ``task`` and ``model`` from the authors'
    ``thresholds.json``. ``model`` is a hub id (``Qwen/Qwen2.5-0.5B``) or their key for it
    (``Qwen_Qwen2.5-0.5B``). Fraction 0 maps to None (no ablation), as for computed thresholds."""
    path = Path(path)
    if path.is_dir():
        raise LensHeadsError(f"thresholds file {path} is a folder")
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except OSError as exc:
        raise LensHeadsError(f"cannot read thresholds file {path}: {exc.strerror or exc}") from None
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise LensHeadsError(f"thresholds file {path} is not JSON: {exc}") from None
    if not isinstance(data, dict) or task not in data:
        tasks = ", ".join(data) if isinstance(data, dict) else "none"
        raise LensHeadsError(f"thresholds file {path} has no task {task!r} (it has: {tasks})")
    models = data[task]
    if not isinstance(models, dict):
        raise LensHeadsError(f"thresholds file {path}: {task!r} must map model keys to their thresholds "
                             f"({{task: {{model: {{HeadType: [tau, ...]}}}}}})")
    key = model if model in models else model.replace("/", "_")
    if key not in models:
        raise LensHeadsError(f"thresholds file {path} has no model {model!r} for {task!r} "
                             f"(it has: {', '.join(models)})")
    out: dict[str, dict[float, float | None]] = {}
    if not isinstance(models[key], dict):
        raise LensHeadsError(f"thresholds file {path}: {task}/{key} must map head types to lists of "
                             f"thresholds ({{HeadType: [tau at 0, 5, ..., 30 %]}})")
    for name, taus in models[key].items():
        sid = AUTHORS_SCORE_IDS.get(name)
        if sid is None:
            raise LensHeadsError(f"thresholds file {path}: unknown head type {name!r} "
                                 f"(known: {', '.join(sorted(set(AUTHORS_SCORE_IDS)))})")
        if (not isinstance(taus, list) or len(taus) != len(AUTHORS_FRACTIONS)
                or not all(isinstance(t, (int, float)) and not isinstance(t, bool) and math.isfinite(t)
                           for t in taus)):
            raise LensHeadsError(f"thresholds file {path}: {key}/{name} must list {len(AUTHORS_FRACTIONS)} "
                                 f"numbers (tau at {', '.join(f'{p:g}' for p in AUTHORS_FRACTIONS)})")
        out[sid] = {p: (None if p == 0 else float(t)) for p, t in zip(AUTHORS_FRACTIONS, taus)}
    return out


def thresholds_for_sweep(table: dict[str, dict[float, float | None]], score_ids, fractions,
                         source: str) -> dict[str, dict[float, float | None]]:
    """``table`` narrowed to a sweep's functions and fractions; one message for what it lacks."""
    missing = [s for s in score_ids if s not in table]
    if missing:
        raise LensHeadsError(f"{source} has no thresholds for {', '.join(missing)} "
                             f"(it has: {', '.join(table)})")
    off = [p for p in fractions if float(p) not in AUTHORS_FRACTIONS]
    if off:
        raise LensHeadsError(f"{source} gives thresholds at {', '.join(f'{p:g}' for p in AUTHORS_FRACTIONS)} "
                             f"only, not at {', '.join(f'{p:g}' for p in off)}")
    return {s: {float(p): table[s][float(p)] for p in fractions} for s in score_ids}
