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
# # Repairing collapsed heads
#
# arXiv 2603.09616 repairs collapsed heads surgically: re-initialise only the sick heads' weights,
# then train with every other parameter frozen (a gradient mask), and re-diagnose. `lh.repair`
# runs that protocol (`docs/methods.md` §6 diagnosis, §7 surgery) and exports the repaired model
# as a Hugging Face folder. This notebook runs it on SmolLM2-135M for a few steps — enough to see
# the mechanics on a laptop, not the paper's 15 epochs — and looks at what changed.

# %%
# %matplotlib inline
import tempfile
from pathlib import Path

import matplotlib.pyplot as plt
import pandas as pd

import lens_heads as lh
from lens_heads.data import load_texts, tokenize_texts
from lens_heads.viz.figures import diagnosis_map

model = lh.load_model("smollm2-135m", dtype="float32")  # training runs in float32
print(f"{model.name}: {model.geometry.n_layers} layers x {model.geometry.n_heads} query heads = "
      f"{model.geometry.n_layers * model.geometry.n_heads} heads, dtype {str(model.dtype).removeprefix('torch.')}")
texts = load_texts("c4-sample")  # the 48 C4 validation documents the package ships
train_texts, eval_texts = texts[:32], texts[32:]
diag_inputs = tokenize_texts(model.tokenizer, eval_texts, max_len=128)

# %% [markdown]
# ## Before: which heads are sick
#
# Each cell is a head, coloured by its class; the repair below targets the dead heads and the
# BOS sinks.

# %%
before = lh.diagnose(model, diag_inputs)
print(before.summary())
display(diagnosis_map(before.to_frame()))

# %% [markdown]
# ## The surgery
#
# Targets: every head diagnosed `dead` or `bos_sink`. One pass, 12 optimiser steps of 8 chunks of
# 256 tokens from the training documents, held-out perplexity on the other documents before, right
# after re-initialisation and after training. The run folder holds checkpoints (a rerun resumes),
# `report.json` and the exported model.

# %%
run = tempfile.TemporaryDirectory()
report = lh.repair(model, lh.TargetSelector(classes=("dead", "bos_sink")), train_texts, eval_texts, diag_inputs,
                   run.name, lh.RepairConfig(passes=1, train=lh.TrainConfig(max_steps=12, checkpoint_every=4)),
                   progress=False)
step = report.passes[0]
print(f"{step.n_targets} heads re-initialised: {', '.join(step.targets[:8])}{' ...' if step.n_targets > 8 else ''}")
print(f"held-out perplexity: before {report.ppl_before:.2f}, after re-initialisation {step.ppl_after_reinit:.2f}, "
      f"after {step.steps} steps {step.ppl_final:.2f}")

# %% [markdown]
# ## Training, step by step
#
# The held-out perplexity at each evaluation of the masked training (step 0: right after
# re-initialisation). Re-initialising the heads costs perplexity at once; training only those heads
# wins part of it back within these few steps (the paper trains for 15 epochs).

# %%
history = pd.DataFrame(step.history)
fig, ax = plt.subplots(figsize=(5, 3))
ax.plot(history["step"], history["ppl"], marker="o", label="re-initialised heads, training")
ax.axhline(report.ppl_before, color="grey", linestyle="--", label="before surgery")
ax.set_xlabel("optimiser step")
ax.set_ylabel("held-out perplexity")
ax.legend()
fig.tight_layout()
plt.show()
history

# %% [markdown]
# ## After: the classes again
#
# The same diagnosis on the exported model, and the class counts side by side.

# %%
repaired = lh.load_model(run.name, dtype="float32")
after = lh.diagnose(repaired, diag_inputs)
print(after.summary())
display(diagnosis_map(after.to_frame()))
pd.DataFrame({"before": before.counts(), "after": after.counts()})

# %% [markdown]
# What a target head attends to before and after (mean attention on the first token, over the
# held-out documents' query positions):

# %%
heads = [tuple(int(x) for x in t.split(".")) for t in step.targets[:4]]
text = eval_texts[0][:300]
rows = []
for name, m in (("before", model), ("after", repaired)):
    patterns = lh.head_patterns(m, text, heads, max_tokens=40)
    for (layer, head), p in zip(heads, patterns.patterns):
        rows.append({"head": f"L{layer}.H{head}", "model": name, "first-token mass": round(float(p[1:, 0].mean()), 3)})
pd.DataFrame(rows).pivot(index="head", columns="model", values="first-token mass")[["before", "after"]]

# %%
run.cleanup()
