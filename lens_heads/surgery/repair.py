"""The two-pass repair protocol: diagnose -> select -> re-initialise -> train -> re-diagnose.

Pass 1 operates on the heads the selector picks on the original model. After training, a
TransformerLens bridge is booted on a *copy* of the trained plain HF model and the model is
re-diagnosed; pass 2 re-applies the selector there (heads still or newly sick), and so on for
``passes`` passes. All edits happen on the plain HF model (never the bridge's wrapped modules:
for BLOOM the bridge computes Q/K/V from its own split copies).

``repair`` writes into ``out_dir``: ``checkpoints/pass{k}/`` (resumable), the exported model
(``save_pretrained`` + tokenizer) and ``report.json`` (a :class:`RepairReport`, atomically).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Callable

import copy
import json
import time
from dataclasses import asdict, dataclass, field, replace


from lens_heads.data import tokenize_texts
from lens_heads.surgery.diagnose import DiagnosisThresholds, diagnose
from lens_heads.errors import LensHeadsError

from lens_heads.models.load import boot, model_digest
from lens_heads.surgery.export import check_out_dir, export_model
from lens_heads.surgery.reinit import plan_surgery, reinitialise
from lens_heads.surgery.report import RepairPass, RepairReport
from lens_heads.models.heads import Head
from lens_heads.surgery.targets import HealthyPick, TargetSelector
from lens_heads.surgery.train import TrainConfig, perplexity, train_surgery
from lens_heads.files.hashing import sha256_token_groups

if TYPE_CHECKING:
    from lens_heads.models.load import LoadedModel


@dataclass(frozen=True)
class RepairConfig:
    """The repair protocol's settings (docs/methods.md), checked at construction."""

    passes: int = 2
    init: str = "xavier_uniform"
    gqa_policy: str = "q_only"
    chunk_len: int = 512
    eval_len: int = 512  # tokens per held-out document
    seed: int = 0
    thresholds: DiagnosisThresholds = field(default_factory=DiagnosisThresholds)
    train: TrainConfig = field(default_factory=TrainConfig)

    def __post_init__(self) -> None:
        if self.passes < 1:
            raise LensHeadsError(f"passes must be >= 1, got {self.passes}")
        if self.chunk_len < 2 or self.eval_len < 2:
            raise LensHeadsError(f"chunk and held-out lengths must be >= 2 tokens, got {self.chunk_len} / {self.eval_len}")


def _tokens_digest(*groups) -> str:
    """sha256 over the token ids of the training chunks and held-out inputs (the layout of
    ``lens_heads.files.hashing.sha256_token_groups``)."""

    return sha256_token_groups(*groups)


def prepare_data(tokenizer, train_texts, eval_texts, config: RepairConfig):
    chunks = tokenize_texts(tokenizer, train_texts, config.chunk_len, mode="chunks")
    if not chunks:
        raise LensHeadsError(f"the training data is shorter than one chunk of {config.chunk_len} tokens "
                             f"({len(train_texts)} texts); give more text or a smaller chunk length")
    eval_inputs = [t for t in tokenize_texts(tokenizer, eval_texts, config.eval_len) if len(t) > 1]
    if not eval_inputs:
        raise LensHeadsError("no held-out documents with 2 or more tokens for perplexity")
    return chunks, eval_inputs


def repair(model: LoadedModel, selector: TargetSelector, train_texts: list[str], eval_texts: list[str], diag_inputs,
           out_dir, config: RepairConfig = RepairConfig(), resume: bool = True,
           progress: bool = True, *, train_data: str | None = None, eval_data: str | None = None,
           reinit_healthy: HealthyPick | None = None,
           on_step: Callable[[int, int, float], None] | None = None) -> RepairReport:
    """Run the protocol on ``model`` (a LoadedModel; left unchanged); return the report it saved.

    ``train_data`` / ``eval_data`` name the corpora in the report. ``reinit_healthy`` re-initialises
    the healthy heads it picks beside pass 1's targets (extended surgery, docs/methods.md §7).
    ``on_step(pass, step, loss)`` runs after every optimisation step (after its checkpoint, so
    a callback that raises to stop the run loses nothing checkpointed)."""
    t0 = time.perf_counter()
    if model.sharded:
        raise LensHeadsError("repair trains a full copy of the model on one device: load it without a device map "
                             "(--device-map); diagnosis, scores and evaluation run on a placed model")
    model.geometry.arch.require_table("repair (surgery)")
    if model.geometry.pruned:
        raise LensHeadsError("repair of a pruned model is not supported: repair the original, then prune it")
    out = check_out_dir(out_dir, model.source)
    g, tok = model.geometry, model.tokenizer
    pad = tok.pad_token_id or 0
    chunks, eval_inputs = prepare_data(tok, train_texts, eval_texts, config)
    # validate the first selection before any file is written
    diag = diagnose(model, diag_inputs, config.thresholds)
    targets = selector.resolve(model, diag, diag_inputs)
    if not targets:
        raise LensHeadsError(f"no heads selected by {selector.describe()}: nothing to repair")
    healthy_extra: list[Head] = []
    if reinit_healthy is not None:
        reinit_healthy.check(g)
        healthy_extra = reinit_healthy.resolve(diag, exclude=targets)
        targets = sorted(set(targets) | set(healthy_extra))
    plan_surgery(g, targets, config.gqa_policy)

    hf = model.load_hf_model()
    # what a checkpoint must share with this run to be resumed (besides the training settings)
    identity = {"init": config.init, "gqa_policy": config.gqa_policy, "chunk_len": config.chunk_len,
                "eval_len": config.eval_len, "repair_seed": config.seed,
                "model_digest": model_digest(model), "data_sha256": _tokens_digest(chunks, eval_inputs)}
    config_json = json.loads(json.dumps(asdict(config), default=str))  # as report.json keeps it (lists, not tuples)
    names = {k: v for k, v in (("train_data", train_data), ("eval_data", eval_data),
                               ("reinit_healthy", None if reinit_healthy is None else str(reinit_healthy)))
             if v is not None}
    before = dict(model=model.name, selector=selector.describe(), config=config_json,
                  n_train_chunks=len(chunks), n_eval_docs=len(eval_inputs),
                  n_eval_tokens=int(sum(len(t) - 1 for t in eval_inputs)),
                  n_diag_inputs=diag.n_inputs, healthy_before=diag.healthy_count, classes_before=diag.counts(),
                  band_before=diag.band(), ppl_before=perplexity(hf, eval_inputs, config.train.eval_batch_size, pad))
    passes: list[RepairPass] = []
    if progress:
        print(f"before: {diag.summary()}; held-out perplexity {before['ppl_before']:.3f}", flush=True)
    current = model
    for k in range(1, config.passes + 1):
        if k > 1:
            targets = selector.reselect(current, targets, diag, diag_inputs)
            if not targets:
                passes.append(RepairPass(index=k, targets=(), note="no heads left to repair"))
                break
        plan = plan_surgery(g, targets, config.gqa_policy)
        reinitialise(hf, plan, config.init, seed=config.seed + k)
        if progress:
            print(f"pass {k}: {len(targets)} target heads, {plan.gqa_policy}", flush=True)
        tcfg = replace(config.train, seed=config.train.seed + k)
        step_hook = None if on_step is None else (lambda step, loss, k=k: on_step(k, step, loss))
        result = train_surgery(hf, plan, chunks, eval_inputs, tcfg, out / "checkpoints" / f"pass{k}",
                               resume=resume, pad_id=pad, progress=progress, identity=identity, on_step=step_hook)
        current = boot(copy.deepcopy(hf), tok, model.source, model.dtype, model.device)
        diag = diagnose(current, diag_inputs, config.thresholds)
        passes.append(RepairPass(
            index=k, targets=tuple(f"{L}.{h}" for L, h in targets), n_targets=len(targets),
            edits=plan.describe()["edits"], ppl_after_reinit=result.history[0]["ppl"],
            history=result.history, ppl_final=perplexity(hf, eval_inputs, config.train.eval_batch_size, pad),
            steps=result.steps, epochs=result.epochs_run, stopped_early=result.stopped_early,
            healthy_after=diag.healthy_count, classes_after=diag.counts(), band_after=diag.band(),
            train_wall_s=round(result.wall_s, 2),
            healthy_targets=(tuple(f"{L}.{h}" for L, h in healthy_extra)
                             if reinit_healthy is not None and k == 1 else None)))
        if progress:
            print(f"after pass {k}: {diag.summary()}; held-out perplexity {passes[-1].ppl_final:.3f}", flush=True)
    export_model(hf, tok, out)
    report = RepairReport(**before, passes=tuple(passes), wall_s=round(time.perf_counter() - t0, 2), **names)
    report.save(out / "report.json")
    return report
