"""Attribution patching (``atp``): a head's first-order effect on the task (docs/methods.md §1).

For one question, let ``ll`` be the log-likelihood of its gold answer's continuation given the
prompt (as ``evaluate`` scores it). Ablating head h changes its output ``z_h`` (``hook_z``,
[pos, d_head]) by ``dz_h`` (zero ablation: ``-z_h``; mean ablation: ``mean_h - z_h``), and to
first order changes ``ll`` by

    atp_h = sum over positions and d_head of  (d ll / d z_h) * dz_h

-- one forward and one backward per question, all heads at once. ``atp`` is the per-input
signed estimate; as a score its value is ``|atp_h|`` (``inactive_when="low"``: a head whose
ablation would change nothing is inactive). Dataset-level values are means over questions, so
heads rank like any score's (``HeadScores.least_active``) for static ablation and pruning.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import json

import torch
from torch import Tensor

from lens_heads.data.tasks import DEFAULT_SEED
from lens_heads.errors import LensHeadsError
from lens_heads.forward.engine import forward
from lens_heads.models.hooks import hook_name
from lens_heads.scores.functions import ScoreFn, register_score
from lens_heads.files.cache import cache_dir, cached_tensors
from lens_heads.data import load_task
from lens_heads.forward.engine import encode_pair
from lens_heads.files.hashing import sha256_bytes
from lens_heads.models.load import model_digest
from lens_heads.progress import progress_bar
from lens_heads.forward.replacement import Mean, MeanValues, Zero, parse_replacement
from lens_heads.scores.dataset import HeadScores
from lens_heads.forward.task_requests import chat_format, select_records, task_requests

if TYPE_CHECKING:
    from lens_heads.models.load import LoadedModel

SCORE_ID = "atp"
INACTIVE_WHEN = "low"  # |effect|: small means ablating the head changes little


def atp_effects(model: LoadedModel, context_ids: list[int], continuation_ids: list[int], replacement=None) -> Tensor:
    """[layer, head] signed first-order change of the continuation's log-likelihood when each
    head is ablated (zeroed, or replaced by ``replacement``: a ``lens_heads.forward.replacement`` mean)."""
    g = model.geometry
    ids = torch.tensor([context_ids + continuation_ids])
    zs: dict[int, Tensor] = {}

    def keep(L):
        def fn(z, hook=None):
            z.retain_grad()
            zs[L] = z
            return z
        return fn

    hooks = [(hook_name("z", L), keep(L)) for L in range(g.n_layers)]
    logits = forward(model, ids, None, hooks, grad=True)  # the engine's forward, with autograd
    n_ctx, n_cont = len(context_ids), len(continuation_ids)
    logp = torch.log_softmax(logits[0, n_ctx - 1:n_ctx - 1 + n_cont].float(), dim=-1)
    ll = logp.gather(1, torch.tensor(continuation_ids, device=logp.device)[:, None]).sum()
    ll.backward()
    out = torch.full((g.n_layers, g.n_heads), float("nan"))
    for L, z in zs.items():
        if z.grad is None:
            raise LensHeadsError(f"atp: no gradient reached layer {L}'s hook_z")
        target = torch.zeros_like(z) if replacement is None else replacement.values(L, z.detach())
        dz = (target - z.detach()).float()
        out[L, :z.shape[2]] = (z.grad.float() * dz).sum(dim=(0, 1, 3)).cpu()
    model.bridge.zero_grad(set_to_none=True)
    return out


def _runtime(replacement):
    """The replacement runtime atp's Δz uses: None for zero, a mean's values (computed now);
    a resample source differs per input, so it has no first-order table."""

    if replacement is None or isinstance(replacement, MeanValues):
        return replacement
    rep = parse_replacement(replacement) if isinstance(replacement, str) else replacement
    if isinstance(rep, Zero):
        return None
    if not isinstance(rep, Mean):
        raise LensHeadsError(f"atp takes zero or mean replacements, not {rep} (a resample source differs per input)")
    return rep.runtime()


def atp_table(model: LoadedModel, task, records, n_shot: int, seed: int, replacement=None, protocol=None,
              progress: bool = False) -> dict[int, Tensor]:
    """``{doc_id: [layer, head] signed atp}`` of each record's gold request, built exactly as
    ``evaluate_task`` builds it (few-shot context, chat template, BOS), with ablated heads
    zeroed or replaced by ``replacement`` (a mean spec or runtime). One forward + backward per
    question, cached on disk per question (``lens_heads.files.cache``, ``atp/``): the key is the
    weights' digest, the dtype, the exact context and continuation, and the replacement."""

    runtime = _runtime(replacement)
    if runtime is not None:
        runtime.means(model)
    add_bos = None if protocol is None else protocol.add_bos_token
    reqs, _, spans = task_requests(task, records, n_shot, seed, chat_format(model, protocol))
    digest, rep_name = model_digest(model), "zero" if runtime is None else str(runtime.spec)
    out: dict[int, Tensor] = {}
    bar = progress_bar(len(records), "attribution patching", enabled=progress, unit="question")
    try:
        for rec, (a, _) in zip(records, spans):
            ctx, cont = reqs[a + rec.gold]
            c_ids, x_ids = encode_pair(model.tokenizer, ctx, cont, add_bos=add_bos)
            key = sha256_bytes([json.dumps([digest, str(model.dtype), c_ids, x_ids, rep_name]).encode()])[:32]
            made = cached_tensors(cache_dir("atp") / f"{key}.safetensors",
                                  lambda: {"atp": atp_effects(model, c_ids, x_ids, runtime)})
            out[rec.doc_id] = made["atp"]
            bar.update(1)
    finally:
        bar.close()
    return out


def atp_scores(model: LoadedModel, task, n_shot: int | None = None, limit: int | None = None, seed: int = DEFAULT_SEED,
               replacement: str | None = None, progress: bool = True, protocol=None):
    """``HeadScores`` of ``atp`` on ``task``'s questions (the gold answer's log-likelihood): per
    input (question, in ``select_records`` order) the score ``|atp|``, dataset-level its mean;
    ``meta["signed_mean"]`` is the mean of the signed estimate."""

    task = load_task(task) if isinstance(task, str) else task
    k = task.spec.n_shot if n_shot is None else n_shot
    records = select_records(task, limit, seed)
    table = atp_table(model, task, records, k, seed, replacement, protocol, progress)
    signed = torch.stack([table[r.doc_id] for r in records])  # [question, layer, head]
    score = signed.abs()
    mean = score.double().nanmean(0)
    std = score.double().std(0)
    count = (~score.isnan()).sum(0)
    meta = {"model": model.source.spec, "model_digest": model_digest(model), "task": task.name, "n_shot": k,
            "limit": limit, "seed": seed, "replacement": str(replacement or "zero"),
            "signed_mean": signed.mean(0).tolist()}
    return HeadScores([SCORE_ID], {SCORE_ID: mean}, {SCORE_ID: std}, {SCORE_ID: count}, len(records),
                      {SCORE_ID: score}, meta)


# The registry entry: what atp needs, read by keys, executors, config checks and the CLI.
register_score(ScoreFn(
    SCORE_ID, (), INACTIVE_WHEN, "attribution patching: |first-order effect of ablating the head on the gold "
    "answer's log-likelihood| (lens_heads.scores.attribution)",
    level="question", needs_task=True, gradient=True,
    shardable=False,  # the executors' scoring shards do not split its per-question pass (yet)
    replacement_dependent=True, replacements=("zero", "mean"),  # a resample source differs per input
    table=atp_table, on_task=atp_scores))
