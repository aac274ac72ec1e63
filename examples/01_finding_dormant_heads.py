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
# # Finding dormant heads
#
# A dormant attention head looks at almost nothing but the first token (the *attention sink*) and
# writes almost nothing into the residual stream. arXiv 2504.03889 scores every head with twelve
# *inactivity functions* and zeroes the heads they call inactive; this notebook computes those
# scores on SmolLM2-135M (real weights, from the lens_heads zoo, no hub needed), looks at their
# distribution, finds the least active heads, draws their attention patterns next to a busy head's,
# and sorts every head into the collapse classes of arXiv 2603.09616.
#
# Every definition used here is in `docs/methods.md` (§1 scores, §6 diagnosis).

# %%
# %matplotlib inline
import matplotlib.pyplot as plt

import lens_heads as lh
from lens_heads.data import load_texts, tokenize_texts

model = lh.load_model("smollm2-135m", dtype="auto")  # bf16 where the CPU runs it natively, else fp32
g = model.geometry
print(f"{model.name}: {g.n_layers} layers x {g.n_heads} query heads = {g.n_layers * g.n_heads} heads, "
      f"{g.n_kv_heads} key/value heads per layer, dtype {str(model.dtype).removeprefix('torch.')}")

# %% [markdown]
# ## Score every head
#
# `score_heads` runs one forward per batch and keeps, per function and head, the mean over inputs
# (and the standard deviation and count). The inputs here are the 48 C4 validation documents the
# package ships (`"c4-sample"`), cut to 128 tokens; with `$LENS_HEADS_DATA` set, `"c4"` reads more.

# %%
texts = load_texts("c4-sample", n=32)
inputs = tokenize_texts(model.tokenizer, texts, max_len=128)
scores = lh.score_heads(model, inputs, scores="paper", progress=False)
print("scored:", ", ".join(scores.score_ids))
frame = scores.to_frame()
frame[frame.score_fn.isin(["ahon_ln", "awft", "lthon_ln"])].groupby("score_fn")["value"].describe().round(3)

# %% [markdown]
# ## The distribution of one score
#
# AHON(LN) is the head's average output norm divided by its layer's mean (a layer-normalised
# output norm: 1 is an average head of its layer). Dormant heads sit far to the left.

# %%
ahon = frame[frame.score_fn == "ahon_ln"]
fig, ax = plt.subplots(figsize=(6, 3))
ax.hist(ahon["value"], bins=40, color="#4c72b0")
ax.set_xlabel("AHON(LN): head output norm / layer mean")
ax.set_ylabel("heads")
ax.set_title(f"{model.name}: {len(ahon)} heads, {len(texts)} C4 documents")
fig.tight_layout()
plt.show()

# %% [markdown]
# ## The least active heads
#
# `least_active` orders heads from least to most active by a function's dataset mean (low values
# are inactive for output norms; for the BOS-mass functions high ones are). These are the heads a
# static ablation by that score would zero first.

# %%
quiet = scores.least_active("ahon_ln", k=5)
busy = scores.least_active("ahon_ln")[-1]  # the most active head by the same score
table = ahon.set_index(["layer", "head"])["value"]
for layer, head in quiet + [busy]:
    print(f"L{layer}.H{head}: AHON(LN) {table[(layer, head)]:.3f}" + ("   <- the busiest head" if (layer, head) == busy else ""))

# %% [markdown]
# ## Their attention patterns, next to a busy head's
#
# `attention_heads` captures the patterns of chosen heads on one text and wraps them in a
# circuitsvis view (it renders in the notebook with no network: the JavaScript is inlined). Hover a
# thumbnail to enlarge it. The quiet heads put nearly all their attention on the first token.

# %%
text = texts[0][:300]
view = lh.attention_heads(model, text, heads=quiet[:3] + [busy], max_tokens=40)
view

# %% [markdown]
# The same patterns as a static figure (a repository page does not run the view's JavaScript):

# %%
fig, axes = plt.subplots(1, len(view.heads), figsize=(3 * len(view.heads), 3.2))
for ax, pattern, name in zip(axes, view.patterns, view.names):
    ax.imshow(pattern, cmap="Blues", vmin=0, vmax=1)
    ax.set_title(name, fontsize=9)
    ax.set_xlabel("key position")
axes[0].set_ylabel("query position")
fig.tight_layout()
plt.show()
print("attention on the first token, averaged over query positions:",
      {name: round(float(p[:, 0].mean()), 3) for p, name in zip(view.patterns, view.names)})

# %% [markdown]
# ## Collapse classes
#
# `diagnose` sorts every head into the classes of arXiv 2603.09616 from its BOS mass, entropy and
# local mass (`docs/methods.md` §6): healthy, a BOS sink, dead, local (attends only to its
# neighbourhood) and so on, and reports the *band* of head indices that are sick in most layers.

# %%
diag = lh.diagnose(model, inputs[:16])
print(diag.summary())
classes = diag.to_frame()
classes.pivot(index="layer", columns="head", values="class")

# %% [markdown]
# How the least active heads by AHON(LN) are classed:

# %%
classes.set_index(["layer", "head"]).loc[quiet, ["bos_mass", "entropy", "local_mass", "class"]].round(3)
