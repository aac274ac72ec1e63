# ---
# jupyter:
#   jupytext:
#     formats: py:percent,ipynb
#     text_representation:
#       extension: .py
#       format_name: percent
#   kernelspec:
#     display_name: Python 3
#     language: python
#     name: python3
# ---

# %% [markdown]
# # Zeroing heads and watching answers change
#
# The test of a dormant head is what happens when it is switched off. lens_heads zeroes a head's
# output (its `hook_z`) and scores multiple-choice questions exactly as lm-evaluation-harness does
# (`docs/methods.md` §2 ablation, §4 evaluation). This notebook takes SmolLM2-135M and PIQA:
# one question, its answer with all heads on, with heads zeroed per input by a score threshold and
# with a fixed set zeroed; then accuracy on a hundred questions, and a small sweep curve against
# random heads (§5: how many heads can go within one accuracy point).
#
# PIQA is read from the folder `$LENS_HEADS_DATA` names (or the hub, online).

# %%
# %matplotlib inline
import tempfile

import matplotlib.pyplot as plt
import pandas as pd

import lens_heads as lh
from lens_heads.data import load_task, load_texts, tokenize_texts
from lens_heads.viz.figures import sweep_curves

model = lh.load_model("smollm2-135m", dtype="auto")
print(f"{model.name}: {model.geometry.n_layers} layers x {model.geometry.n_heads} query heads = "
      f"{model.geometry.n_layers * model.geometry.n_heads} heads, dtype {str(model.dtype).removeprefix('torch.')}")
piqa = load_task("piqa")
print(f"PIQA {piqa.split}: {len(piqa)} questions, {piqa.spec.n_shot}-shot")

# %% [markdown]
# ## One question, all heads on
#
# The model's answer is the choice with the highest log-likelihood of its text after the goal.

# %%
record = piqa.records[5]
base = lh.evaluate_task(model, piqa, doc_ids=[record.doc_id], progress=False).questions[0]
print("goal:", record.question)
for i, choice in enumerate(record.choices):
    marks = ("  <- answer" if i == base.pred else "") + ("  (gold)" if i == record.gold else "")
    print(f"  {i}: log p = {base.lls[i]:8.3f}  {choice}{marks}")

# %% [markdown]
# ## Three ways to switch heads off
#
# An ablation is a typed value with one text form (`lh.parse_ablation`):
# - `score:ahon_ln@TAU` zeroes, **per input**, every head whose AHON(LN) on that input falls below
#   `TAU` (the paper's method). `score:ahon_ln@30%` leaves `TAU` open: `evaluate_task` sets it to
#   zero 30 % of (input, head) pairs over the unablated inputs of the questions it evaluates
#   (`docs/methods.md` §3), as `lens-heads evaluate --ablate score:ahon_ln@30%` does;
# - `static:L.H,...` zeroes the same heads on every input;
# - `random:0.3@0` zeroes 30 % of heads at random (seed 0), per input: the baseline any score must beat.

# %%
per_input = lh.parse_ablation("score:ahon_ln@30%", model.geometry)  # its threshold is set when evaluated
quiet = lh.score_heads(model, tokenize_texts(model.tokenizer, load_texts("c4-sample", n=32), max_len=128),
                       scores="ahon_ln", progress=False).least_active("ahon_ln", k=27)  # 10 % of 270 heads
static = lh.StaticAblation(quiet, model.geometry)
random_heads = lh.parse_ablation("random:0.3@0", model.geometry)
print(per_input, "|", static, "|", random_heads, sep="\n")

# %% [markdown]
# ## Accuracy on a hundred questions
#
# The same hundred questions (a seeded sample) under each ablation; `zeroed_fraction` is the share
# of (input, head) pairs actually zeroed.

# %%
runs = {"none": None, "per-input AHON(LN) 30 %": per_input, "static AHON(LN) 27 heads": static,
        "random 30 %": random_heads}
results = {name: lh.evaluate_task(model, piqa, limit=100, ablation=abl, progress=False) for name, abl in runs.items()}
print(f"{per_input} on these questions: {per_input.calibrated}")
pd.DataFrame([{"ablation": name, "accuracy %": round(100 * r.metrics["acc"], 1),
               "heads zeroed %": None if r.zeroed_fraction is None else round(100 * r.zeroed_fraction, 1)}
              for name, r in results.items()])

# %% [markdown]
# ## An answer that flips
#
# The first of those questions whose answer the per-input ablation changes, with the
# log-likelihoods before and after:

# %%
flips = [(a, b) for a, b in zip(results["none"].questions, results["per-input AHON(LN) 30 %"].questions)
         if a.pred != b.pred]
print(f"{len(flips)} of 100 answers change under per-input AHON(LN) at 30 %; "
      f"{sum(b.correct for a, b in flips)} of those become right, {sum(a.correct for a, b in flips)} become wrong")
before, after = flips[0]
rec = next(r for r in piqa.records if r.doc_id == before.doc_id)
print("\ngoal:", rec.question)
for i, choice in enumerate(rec.choices):
    print(f"  {i}: all heads {before.lls[i]:8.3f} -> ablated {after.lls[i]:8.3f}  {choice}"
          + ("  (gold)" if i == rec.gold else ""))
print(f"answer {before.pred} -> {after.pred}")

# %% [markdown]
# ## A small sweep against random heads
#
# `run_sweep` evaluates every (function, fraction) point on the same questions and stores each
# one, so an interrupted sweep resumes; `within` reads the largest % of heads zeroed still within
# one point of the unablated accuracy (interpolated between grid points, `docs/methods.md` §5).
# On a hundred questions one point is one question, so read the curve, not the crossing: the
# full-size answer is what `lens-heads sweep --search crossing` is for (§13).

# %%
with tempfile.TemporaryDirectory() as folder:
    sweep = lh.run_sweep(model, lh.SweepConfig(task="piqa", score_ids=["ahon_ln", "awft"], fractions=[0, 0.1, 0.2, 0.3],
                                               random_seeds=[0], limit=100), folder, progress=False)
fig = sweep_curves(sweep.summary, sweep.within, title="SmolLM2-135M, 100 PIQA questions")
display(fig)
sweep.within[["score_fn", "max_pct_zeroed_within_1pt", "auc"]]
