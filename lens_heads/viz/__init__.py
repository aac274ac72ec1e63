"""Views of lens_heads results: circuitsvis attention patterns (``patterns``) and matplotlib
figures (``figures``). Views read results; only ``attention_heads`` runs the model (one
forward of one text, for its patterns)."""

from lens_heads.viz.figures import (
    DIAGNOSIS_COLOURS,
    base_accuracy,
    diagnosis_map,
    point_changes,
    random_baseline,
    score_distributions,
    score_grid,
    score_heatmap,
    sweep_curves,
    wasserstein_matrix,
)
from lens_heads.viz.patterns import (
    AttentionView,
    attention_heads,
    bundle_script,
    head_label,
    parse_heads,
)

__all__ = [
    "AttentionView", "attention_heads", "bundle_script", "head_label", "parse_heads",
    "score_heatmap", "score_grid", "sweep_curves", "point_changes", "base_accuracy", "random_baseline",
    "score_distributions", "wasserstein_matrix", "diagnosis_map", "DIAGNOSIS_COLOURS",
]
