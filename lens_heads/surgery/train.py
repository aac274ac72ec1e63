"""Masked training of the surgery slices, with held-out perplexity, early stopping and resume.

Defaults follow docs/methods.md §7: AdamW lr 5e-5, weight decay 0, linear warm-up over
w = min(100, total/4) steps (step k uses lr * (k+1)/(w+1), so no step is wasted at lr 0) then
cosine decay to 0 at the last step, micro-batch 1 x 8 accumulation, clip 1.0,
non-overlapping chunks (512 tokens), up to 15 epochs with early-stopping patience 6.
One optimisation step = ``grad_accum`` micro-batches; an epoch = one pass over the chunks in a
seeded order (the last step of an epoch may hold fewer micro-batches). Perplexity on held-out
documents is measured before the first step (right after re-initialisation) and after every
epoch; at the end the best-perplexity weights are restored (``keep_best``).

Weights train in the model's own dtype (bf16 weights as in the paper when the model is loaded
in bfloat16); ``autocast_bf16`` instead keeps float32 weights and runs the forward in bf16.
"""

from __future__ import annotations

import math
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Callable

import torch
import torch.nn.functional as F
from jaxtyping import Int
from torch import Tensor

from lens_heads.errors import LensHeadsError
from lens_heads.models.attention import plain_fused
from lens_heads.forward.engine import token_nll
from lens_heads.surgery.checkpoint import load_checkpoint, save_checkpoint
from lens_heads.surgery.masks import freeze_and_mask
from lens_heads.surgery.reinit import SurgeryPlan


@dataclass(frozen=True)
class TrainConfig:
    """Masked training's settings (docs/methods.md), checked at construction."""

    lr: float = 5e-5
    weight_decay: float = 0.0
    betas: tuple[float, float] = (0.9, 0.999)
    micro_batch: int = 1
    grad_accum: int = 8
    clip: float = 1.0
    epochs: int = 15
    max_steps: int | None = None  # overrides epochs when given
    patience: int = 6  # epochs without a better held-out perplexity before stopping
    warmup: int | None = None  # None: min(100, total_steps // 4)
    gradient_checkpointing: bool = False
    autocast_bf16: bool = False
    checkpoint_every: int = 0  # steps between checkpoints (0: only at epoch ends)
    keep_checkpoints: bool = False  # keep every checkpoint's trainable tensors (for drift), not only the newest
    keep_best: bool = True
    eval_batch_size: int = 4
    seed: int = 0

    def __post_init__(self) -> None:
        self.check()

    def check(self) -> None:
        if self.lr <= 0 or self.micro_batch < 1 or self.grad_accum < 1 or self.epochs < 1:
            raise LensHeadsError("lr must be > 0 and micro_batch, grad_accum, epochs >= 1")
        if self.max_steps is not None and self.max_steps < 1:
            raise LensHeadsError(f"steps must be >= 1, got {self.max_steps}")


@dataclass
class TrainResult:
    steps: int
    epochs_run: int
    history: list[dict] = field(default_factory=list)  # {"epoch", "step", "train_loss", "ppl"}
    stopped_early: bool = False
    best_ppl: float = float("nan")
    wall_s: float = 0.0


def perplexity(hf_model, inputs: list[Tensor], batch_size: int = 4, pad_id: int = 0) -> float:
    """Token-weighted perplexity of a plain HF model on documents (each predicts tokens 1..T-1),
    in eval mode; the same computation as ``lens_heads.evaluation.evaluate.perplexity`` (``token_nll``,
    docs/methods.md §7). Documents of one token score nothing."""
    if not inputs:
        raise LensHeadsError("no held-out documents for perplexity")
    was_training = hf_model.training
    hf_model.eval()
    device = next(hf_model.parameters()).device

    def logits(ids: Tensor, mask: Tensor, _rows: list[int]) -> Tensor:
        return hf_model(input_ids=ids.to(device), attention_mask=mask.to(device)).logits

    try:
        with plain_fused(hf_model):  # no pattern is read: the fused kernel (docs/methods.md §10)
            nll, count = token_nll(logits, inputs, batch_size, pad_id)
    finally:
        hf_model.train(was_training)
    if count == 0:
        raise LensHeadsError("held-out documents have fewer than 2 tokens each: no perplexity")
    return math.exp(nll / count)


def _schedule(total: int, warmup: int) -> Callable[[int], float]:
    def factor(step: int) -> float:
        if step < warmup:
            return (step + 1) / (warmup + 1)
        progress = (step - warmup) / max(1, total - warmup)
        return 0.5 * (1.0 + math.cos(math.pi * min(1.0, progress)))
    return factor


def _epoch_steps(n_chunks: int, cfg: TrainConfig, epoch: int) -> list[list[list[int]]]:
    """Chunk indices of every step of ``epoch``: steps -> micro-batches -> chunk ids (seeded)."""
    order = torch.randperm(n_chunks, generator=torch.Generator().manual_seed(cfg.seed * 1000003 + epoch)).tolist()
    micro = [order[i:i + cfg.micro_batch] for i in range(0, n_chunks, cfg.micro_batch)]
    return [micro[i:i + cfg.grad_accum] for i in range(0, len(micro), cfg.grad_accum)]


def train_surgery(
    hf_model,
    plan: SurgeryPlan,
    chunks: list[Int[Tensor, "pos"]],
    eval_inputs: list[Tensor],
    config: TrainConfig = TrainConfig(),
    checkpoint_dir: str | Path | None = None,
    resume: bool = True,
    pad_id: int = 0,
    on_step: Callable[[int, float], None] | None = None,
    progress: bool = False,
    identity: dict | None = None,
) -> TrainResult:
    """Train the plan's slices of ``hf_model`` (already re-initialised) in place.

    A resume continues a checkpoint only when it was made with the same training settings and
    ``identity`` (what else decides the run: the caller's configuration, a data fingerprint);
    otherwise it refuses, naming the settings that differ. ``wall_s`` adds up every segment of
    a resumed run."""
    config.check()
    if not chunks:
        raise LensHeadsError("no training chunks: the training data is shorter than one chunk")
    t0 = time.perf_counter()
    masked = freeze_and_mask(hf_model, plan)
    device = masked.params[0].device
    per_epoch = len(_epoch_steps(len(chunks), config, 0))
    total = config.max_steps if config.max_steps is not None else config.epochs * per_epoch
    warmup = config.warmup if config.warmup is not None else min(100, total // 4)
    opt = torch.optim.AdamW(masked.params, lr=config.lr, betas=config.betas, weight_decay=config.weight_decay)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, _schedule(total, warmup))
    if config.gradient_checkpointing:
        kwargs = {"use_reentrant": False}  # frozen inputs: the reentrant variant would drop the gradients
        if hasattr(hf_model, "activation_checkpointing_enable"):
            hf_model.activation_checkpointing_enable(activation_checkpointing_kwargs=kwargs)
        else:
            hf_model.gradient_checkpointing_enable(gradient_checkpointing_kwargs=kwargs)
    by_name = dict(zip(masked.names, masked.params))

    step, epoch, history, best, best_ppl, bad, stopped = 0, 0, [], None, float("inf"), 0, False
    losses: list[float] = []
    wall_before = 0.0  # training time of the segments before a resume
    settings = {**_resume_settings(asdict(config)), **(identity or {})}
    torch.manual_seed(config.seed)
    ckpt = load_checkpoint(Path(checkpoint_dir)) if (checkpoint_dir and resume) else None
    if ckpt is not None:
        trainable, best, state = ckpt
        if state["plan"] != plan.describe() or state["total"] != total:
            raise LensHeadsError(f"checkpoint in {checkpoint_dir} belongs to another run (targets or steps differ); "
                                 "use a new output folder or turn resume off")
        # a checkpoint from before identities were recorded is judged by its training settings
        theirs = {**_resume_settings(state.get("config", {})), **state.get("identity", identity or {})}
        differ = sorted(k for k in settings.keys() | theirs.keys() if settings.get(k) != theirs.get(k))
        if differ:
            said = "; ".join(f"{k}: checkpoint {theirs.get(k)!r}, now {settings.get(k)!r}" for k in differ)
            raise LensHeadsError(f"checkpoint in {checkpoint_dir} was made with other settings ({said}); "
                                 "rerun with the checkpoint's settings, use a new output folder, or turn "
                                 "resume off (--no-resume)")
        wall_before = float(state.get("wall_s", 0.0))
        with torch.no_grad():
            for name, t in trainable.items():
                by_name[name].copy_(t.to(device))
        opt.load_state_dict(state["optimizer"])
        sched.load_state_dict(state["scheduler"])
        step, epoch, history = state["step"], state["epoch"], state["history"]
        best_ppl, bad, stopped = state["best_ppl"], state["bad"], state["stopped"]
        torch.set_rng_state(state["rng"])
        losses[:] = state["losses"]
    else:
        history.append({"epoch": 0, "step": 0, "train_loss": None,
                        "ppl": perplexity(hf_model, eval_inputs, config.eval_batch_size, pad_id)})

    def snapshot() -> dict[str, Tensor]:
        return {n: p.detach().clone() for n, p in by_name.items()}

    def checkpoint() -> None:
        if checkpoint_dir is None:
            return
        state = dict(plan=plan.describe(), total=total, optimizer=opt.state_dict(), scheduler=sched.state_dict(),
                     step=step, epoch=epoch, history=history, best_ppl=best_ppl, bad=bad, stopped=stopped,
                     rng=torch.get_rng_state(), losses=losses, config=asdict(config), identity=identity or {},
                     wall_s=wall_before + time.perf_counter() - t0)
        save_checkpoint(Path(checkpoint_dir), step, snapshot(), best, state, keep_history=config.keep_checkpoints)

    hf_model.train()
    try:
        while step < total and not stopped:
            steps = _epoch_steps(len(chunks), config, epoch)
            done_in_epoch = step - epoch * per_epoch
            for micro_batches in steps[done_in_epoch:]:
                if step >= total:
                    break
                step_loss = 0.0
                for idx in micro_batches:
                    ids = torch.stack([chunks[i] for i in idx]).to(device)
                    with torch.autocast(device.type, dtype=torch.bfloat16, enabled=config.autocast_bf16):
                        logits = hf_model(input_ids=ids).logits[:, :-1]
                    loss = F.cross_entropy(logits.float().reshape(-1, logits.shape[-1]), ids[:, 1:].reshape(-1))
                    (loss / len(micro_batches)).backward()
                    step_loss += loss.item() / len(micro_batches)
                if config.clip:
                    torch.nn.utils.clip_grad_norm_(masked.params, config.clip)
                opt.step()
                opt.zero_grad(set_to_none=True)
                sched.step()
                step += 1
                losses.append(step_loss)
                if progress:
                    print(f"  step {step}/{total}  loss {step_loss:.4f}  lr {sched.get_last_lr()[0]:.3g}", flush=True)
                if config.checkpoint_every and step % config.checkpoint_every == 0 and step < total \
                        and step != (epoch + 1) * per_epoch:
                    checkpoint()
                if on_step is not None:  # after the checkpoint: a callback that stops the run loses nothing
                    on_step(step, step_loss)
            epoch += 1
            ppl = perplexity(hf_model, eval_inputs, config.eval_batch_size, pad_id)
            hf_model.train()
            recent = losses[-per_epoch:]
            history.append({"epoch": epoch, "step": step, "ppl": ppl,
                            "train_loss": sum(recent) / len(recent) if recent else None})
            if progress:
                print(f"  epoch {epoch}: held-out perplexity {ppl:.3f}", flush=True)
            if ppl < best_ppl:
                best_ppl, bad, best = ppl, 0, snapshot()
            else:
                bad += 1
                stopped = bad >= config.patience
            checkpoint()
    finally:
        masked.remove()
        if config.gradient_checkpointing:
            (getattr(hf_model, "activation_checkpointing_disable", None) or hf_model.gradient_checkpointing_disable)()
        hf_model.eval()
        for p in hf_model.parameters():
            p.requires_grad_(False)
    if config.keep_best and best is not None and history[-1]["ppl"] > best_ppl:
        with torch.no_grad():
            for name, t in best.items():
                by_name[name].copy_(t.to(device))
    return TrainResult(step, epoch, history, stopped, best_ppl, wall_before + time.perf_counter() - t0)


def _resume_settings(config: dict) -> dict:
    """The training settings a resumed run must share with its checkpoint: all but how often
    checkpoints are written, whether old ones are kept and the evaluation batch size, which change
    no trained value."""
    return {k: (list(v) if isinstance(v, tuple) else v) for k, v in config.items()
            if k not in ("checkpoint_every", "keep_checkpoints", "eval_batch_size")}
