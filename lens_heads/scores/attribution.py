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

import torch
from torch import Tensor

from lens_heads.errors import LensHeadsError
from lens_heads.hooks import hook_name

SCORE_ID = "atp"
INACTIVE_WHEN = "low"  # |effect|: small means ablating the head changes little


def _forward_with_grad(model, ids: Tensor, hooks):
    """One bridge forward with hooks and autograd on (the engine's forwards run without)."""
    with torch.enable_grad():
        return model.bridge.run_with_hooks(ids.to(model.device), fwd_hooks=hooks)


def atp_effects(model, context_ids: list[int], continuation_ids: list[int], replacement=None) -> Tensor:
    """[layer, head] signed first-order change of the continuation's log-likelihood when each
    head is ablated (zeroed, or replaced by ``replacement``: a ``lens_heads.replacement`` mean)."""
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
    logits = _forward_with_grad(model, ids, hooks)
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


def atp_scores(model, task, n_shot: int | None = None, limit: int | None = None, seed: int = 1234,
               replacement: str | None = None, progress: bool = True):
    """``HeadScores`` of ``atp`` on ``task``'s questions (the gold answer's log-likelihood): per
    input the signed estimate, dataset-level the mean of ``|atp|`` (the score)."""
    from lens_heads.data import load_task
    from lens_heads.evaluate import encode_pair, select_records
    from lens_heads.models.load import model_digest
    from lens_heads.progress import progress_bar
    from lens_heads.scores.dataset import HeadScores

    task = load_task(task) if isinstance(task, str) else task
    k = task.spec.n_shot if n_shot is None else n_shot
    runtime = None
    if replacement is not None:
        from lens_heads.replacement import Zero, parse_replacement

        rep = parse_replacement(replacement)
        runtime = None if isinstance(rep, Zero) else rep.runtime()
        if runtime is not None and not hasattr(runtime, "means"):
            raise LensHeadsError("atp takes zero or mean replacements (a resample source differs per input)")
        if runtime is not None:
            runtime.means(model)
    records = select_records(task, limit, seed)
    per = []
    bar = progress_bar(len(records), "attribution patching", enabled=progress, unit="question")
    try:
        for rec in records:
            ctx, cont = task.build(rec, k, seed)[rec.gold]
            c_ids, x_ids = encode_pair(model.tokenizer, ctx, cont)
            per.append(atp_effects(model, c_ids, x_ids, runtime))
            bar.update(1)
    finally:
        bar.close()
    signed = torch.stack(per)  # [question, layer, head]
    score = signed.abs()
    mean = score.double().nanmean(0)
    std = score.double().std(0)
    count = (~score.isnan()).sum(0)
    meta = {"model": model.source.spec, "model_digest": model_digest(model), "task": task.name, "n_shot": k,
            "limit": limit, "seed": seed, "replacement": replacement or "zero", "signed_mean": signed.mean(0).tolist()}
    return HeadScores([SCORE_ID], {SCORE_ID: mean}, {SCORE_ID: std}, {SCORE_ID: count}, len(records),
                      {SCORE_ID: score}, meta)
