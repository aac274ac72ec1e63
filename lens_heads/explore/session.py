"""What the explorer computes, as plain functions a notebook can call too (docs/methods.md §11).

Each function takes a loaded model and one input (a prompt, or one question of a task) and
returns JSON-ready results; the server (``explore.server``) only routes requests to them, one at
a time, and the page only shows what they return.

- ``input_scores``: every input-level score of every head on this input, and its collapse class.
- ``next_token``: the next-token top-k, unablated and under an ablation (and, for a per-input
  rule, which heads it zeroed on this input).
- ``question``: a task question's choice log-likelihoods, unablated and ablated, the
  predictions and whether the prediction flipped (the numbers ``evaluate_task`` gives).
- ``head_view``: one head's pattern on the input (eager attention, that layer only), its value
  and output norms per position.
"""

from __future__ import annotations

import math
from functools import partial
from typing import TYPE_CHECKING, Callable

import torch
import torch.nn.functional as F

from lens_heads.interventions.ablation import Ablation, parse_ablation
from lens_heads.surgery.diagnose import LOCAL_MASS, DiagnosisThresholds, classify
from lens_heads.forward.engine import forward
from lens_heads.errors import LensHeadsError
from lens_heads.evaluation.evaluate import evaluate_task
from lens_heads.models.hooks import hook_name
from lens_heads.data import load_texts, tokenize_texts
from lens_heads.interventions.specs import ScoreFraction, parse_spec, with_replacement
from lens_heads.interventions.thresholds import calibrated_spec
from lens_heads.scores.collector import ScoreCollector
from lens_heads.scores.functions import SCORES, input_level

if TYPE_CHECKING:
    from lens_heads.models.load import LoadedModel

MAX_TOKENS = 512  # the longest input the explorer runs (a request over it gets a 413)


def tokenize(model: LoadedModel, prompt: str, max_tokens: int = MAX_TOKENS) -> torch.Tensor:
    """The prompt's token ids [pos], refused over ``max_tokens``."""
    if not isinstance(prompt, str) or not prompt.strip():
        raise LensHeadsError("the prompt is empty")
    ids = model.to_tokens(prompt)[0]  # the tokenizer's own rule (Gemma's adds <bos>), as a plain HF call
    if len(ids) > max_tokens:
        raise TooLong(f"the prompt has {len(ids)} tokens; the explorer runs at most {max_tokens}")
    if len(ids) == 0:
        raise LensHeadsError("the prompt has no tokens")
    return ids


class TooLong(LensHeadsError):
    """An input over the explorer's length limit."""


def token_strings(model: LoadedModel, ids: torch.Tensor) -> list[str]:
    return [model.tokenizer.decode([int(t)]) for t in ids]


SHIPPED_CORPORA = ("c4-sample", "self")  # what a replacement may read unless the command line names more
CALIBRATION = ("c4-sample", 48, 128)  # a percentage spec's threshold: from the shipped texts (name, n, tokens)


def calibrate(model: LoadedModel, score_id: str, fraction: float) -> str:
    """``score:ID@P%`` as a threshold spec: the threshold that takes ``fraction`` of the pooled
    unablated scores on the shipped C4 sample (``CALIBRATION``), as ``lens-heads evaluate``
    calibrates on its own inputs (docs/methods.md §3)."""
    name, n, max_len = CALIBRATION
    inputs = tokenize_texts(model.tokenizer, load_texts(name, n=n), max_len)
    return calibrated_spec(model, inputs, score_id, fraction, progress=False)[0]


def ablation_of(model: LoadedModel, spec: str | None, replacement: str | None = None,
                corpora: tuple[str, ...] = SHIPPED_CORPORA, calibrated: Callable[[str, float], str] | None = None,
                ) -> Ablation | None:
    """The ablation a spec names (None: none), its heads replaced as ``replacement`` says; a
    replacement may read only ``corpora`` (a request names no other path or dataset). A
    percentage (``score:ID@P%``) becomes its threshold through ``calibrated`` (default
    ``calibrate``)."""
    if spec is None or not str(spec).strip() or str(spec).strip() == "none":
        return None
    typed = parse_spec(str(spec))
    inner = getattr(typed, "spec", typed)
    if isinstance(inner, ScoreFraction):
        resolved = parse_spec((calibrated or partial(calibrate, model))(inner.score_id, inner.fraction))
        typed = resolved if inner is typed else with_replacement(resolved, typed.replacement)
    if replacement and replacement.strip() not in ("", "zero"):
        typed = with_replacement(typed, replacement.strip())
    corpus = getattr(getattr(typed, "replacement", None), "corpus", None)
    if corpus is not None and corpus not in corpora:
        raise LensHeadsError(f"replacement corpus {corpus!r}: the explorer reads only {', '.join(corpora)} "
                             f"(the shipped texts, or the row itself)")
    abl = parse_ablation(str(typed), model.geometry)
    if abl.needs_task:
        raise LensHeadsError(f"{abl.name} is decided per task question: pick a task question to run it")
    return abl


def input_scores(model: LoadedModel, ids: torch.Tensor) -> dict:
    """Every input-level score of every head on ``ids`` ({id: [[layer][head]]}), the collapse class
    of each head on this input, and the tokens."""
    ids = ids.to(torch.long)
    mask = torch.ones(1, len(ids), dtype=torch.long)
    score_ids = input_level()
    col = ScoreCollector(model, score_ids, extra=[LOCAL_MASS])
    forward(model, ids[None], mask, col.hooks(mask), logits=False)
    got = col.batch_scores()
    scores = {s: _rows(got[s][0]) for s in score_ids}
    classes = classify(got["awft"][0], got["aeqd"][0], got["local_mass"][0], DiagnosisThresholds())
    return {"tokens": token_strings(model, ids), "scores": scores, "classes": classes}


def next_token(model: LoadedModel, ids: torch.Tensor, ablation: Ablation | None = None, k: int = 10,
               base: list[dict] | None = None) -> dict:
    """Top-``k`` next tokens with probabilities after ``ids``, unablated (``base``: already known)
    and under ``ablation``; with a per-input rule, the heads it zeroed on this input."""
    ids = ids.to(torch.long)
    mask = torch.ones(1, len(ids), dtype=torch.long)
    keep = torch.tensor([len(ids) - 1])
    out = {"base": base if base is not None else _top(model, forward(model, ids[None], mask, [], keep)[0, -1], k)}
    if ablation is not None:
        with ablation.counting() as counts:
            logits = forward(model, ids[None], mask, ablation.hooks(model, mask, [0]), keep)
        out["ablated"] = _top(model, logits[0, -1], k)
        out["zeroed"] = _zeroed(counts.last_zeroed)
        out["ablation"] = ablation.name
    return out


def question(model: LoadedModel, task, doc_id: int, n_shot: int | None = None,
             ablation: Ablation | None = None, base: dict | None = None) -> dict:
    """One task question, as ``evaluate_task`` scores it, unablated (``base``: already known,
    ``{"lls", "pred", "gold"}``) and under ``ablation``."""
    if base is None:
        q = evaluate_task(model, task, n_shot=n_shot, doc_ids=[doc_id], progress=False, batch_size=1).questions[0]
        base = {"lls": q.lls, "pred": q.pred, "gold": q.gold}
    out = {"doc_id": doc_id, "gold": base["gold"], "base": {"lls": base["lls"], "pred": base["pred"]}}
    if ablation is not None:
        res = evaluate_task(model, task, n_shot=n_shot, doc_ids=[doc_id], ablation=ablation, progress=False,
                            batch_size=len(base["lls"]))  # one forward: every choice's zeroed heads are in it
        q1 = res.questions[0]
        out["ablated"] = {"lls": q1.lls, "pred": q1.pred, "flipped": q1.pred != base["pred"],
                          "zeroed_fraction": res.zeroed_fraction}
        out["zeroed"] = _zeroed(ablation.last_zeroed)  # on any of the question's inputs
        out["ablation"] = ablation.name
    return out


def head_view(model: LoadedModel, ids: torch.Tensor, layer: int, head: int) -> dict:
    """Head (``layer``, ``head``)'s pattern [q][k] on ``ids`` (this layer runs eager, to read it),
    its value-vector norm (its K/V head's) and head-output norm (before W_O) per position."""
    g = model.geometry
    g.check_head(layer, head)
    ids = ids.to(torch.long)
    mask = torch.ones(1, len(ids), dtype=torch.long)
    got = {}

    def grab(kind):
        def fn(x, hook):
            got[kind] = x[0].detach().float().cpu()
        return fn

    forward(model, ids[None], mask, [(hook_name(k, layer), grab(k)) for k in ("pattern", "v", "z")], logits=False)
    kv = head // g.group_size_of(layer)
    return {"layer": layer, "head": head, "kv_head": kv, "tokens": token_strings(model, ids),
            "pattern": got["pattern"][head].tolist(),
            "value_norm": torch.linalg.vector_norm(got["v"][:, kv], dim=-1).tolist(),
            "output_norm": torch.linalg.vector_norm(got["z"][:, head], dim=-1).tolist()}


def describe_scores() -> list[dict]:
    """The input-level scores the page can colour heads by."""
    return [{"id": s, "description": SCORES[s].description, "inactive_when": SCORES[s].inactive_when}
            for s in input_level()]


def _rows(x: torch.Tensor) -> list[list[float | None]]:
    return [[None if math.isnan(v) else round(float(v), 6) for v in row] for row in x.tolist()]


def _top(model: LoadedModel, logits: torch.Tensor, k: int) -> list[dict]:
    p = F.softmax(logits.float(), -1)
    vals, idx = p.topk(k)
    return [{"token": model.tokenizer.decode([int(i)]), "id": int(i), "p": round(float(v), 6)}
            for v, i in zip(vals, idx)]


def _zeroed(mask) -> list[list[int]]:
    """(layer, head) zeroed in any row of the last forward's [batch, layer, head] mask."""
    if mask is None:
        return []
    return [[int(L), int(h)] for L, h in mask.any(0).nonzero().tolist()]
