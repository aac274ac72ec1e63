"""Per-head inactivity scores, computed in one streaming forward pass.

A *score function* maps one layer's activations on a batch to one number per (input, head).
docs/methods.md §1 defines the paper's twelve (six base scores and their layer-normalised ``_ln``
versions); ``lthon_hn``, ``fhon`` and ``fhon_ln`` come from the authors' code, and
``lthon_ln_text`` is the paper text's reading of LTHON(LN), which its tables did not use:

    awft      mean_t A[t, first]                       pattern  inactive when high
    aeqd      mean_t -sum_j A[t, j] ln A[t, j]         pattern  low
    ftvvn     ||V_first||                              v        low
    avvn      mean_j ||V_j||                           v        low
    lthon     ||O_last||                               z        low
    ahon      mean_t ||O_t||                           z        low
    lthon_hn  ||O_last|| / mean_t ||O_t||              z        low
    fhon      mean_t ||O_t W_O^h||                     z        low
    <id>_ln   score / mean over the layer's heads      (same)   (same)
    lthon_ln  ||O_last|| / layer mean of ahon          z        low   (the authors' code)
    lthon_ln_text  ||O_last|| / layer mean of lthon    z        low   (the text's reading)

Means run over real tokens only (padding excluded); "first" is the first real token, "last"
the last real one; under grouped-query attention a value score is repeated over the query
heads that read that KV head.

Modules, in the order data flows through them:

    functions.py  ``Acts`` (what a function sees), ``ScoreFn``, the registry ``SCORES`` and
                  the definitions above; adding a score function is one call there
    collector.py  ``ScoreCollector``: score ids -> hooks for one forward of a batch; each hook
                  reduces its activation to ``[batch, head]`` at once and keeps nothing else;
                  at ``hook_z`` an optional ``z_transform`` may replace z (per-input ablation)
    dataset.py    ``score_heads`` over a dataset -> ``HeadScores`` (mean / std / count per
                  head, optional per-input scores; CSV or Parquet with sidecars)
    shared_prefix.py  a scoring pass's order and forwards: a prefix shared by several inputs
                  (few-shot prompts) runs once, its keys/values and per-position values cached
    attribution.py  attribution patching: a head's first-order effect on a task's gold
                  answers, one forward and one backward per question (a question-level score)

Floor 4 of docs/architecture.md. May import: the root modules, ``files``, ``data``, ``models``
and ``forward``. Imported by: ``interventions`` and every wing above it.
"""

from lens_heads.scores.functions import (
    PAPER_SCORES,
    SCORES,
    Acts,
    BatchGeometry,
    ScoreFn,
    base,
    derived,
    layer_normalised,
    register_score,
    resolve_score_ids,
    revision_key,
)
from lens_heads.scores.collector import ScoreCollector, ZTransform
from lens_heads.scores import attribution  # noqa: F401,E402  (registers the question-level score)
from lens_heads.scores.dataset import (
    HeadScores,
    context_length,
    least_active,
    pooled_mean,
    prepare_inputs,
    score_heads,
    score_metadata,
    wasserstein_distances,
)
from lens_heads.scores.shared_prefix import pass_prefixes, scoring_batches  # noqa: E402

__all__ = [
    "PAPER_SCORES", "SCORES", "Acts", "BatchGeometry", "ScoreFn", "base", "derived", "layer_normalised",
    "register_score", "resolve_score_ids", "revision_key", "ScoreCollector", "ZTransform", "wasserstein_distances",
    "HeadScores", "context_length", "least_active", "pooled_mean", "prepare_inputs", "score_heads", "score_metadata",
    "pass_prefixes", "scoring_batches",
]
