"""Views of lens_heads results: circuitsvis attention patterns (``patterns``) and matplotlib
figures (``figures``). Views only read results: the patterns they show are captured by
``lens_heads.forward.activations`` (``attention_heads`` there captures and wraps in one call)."""

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
    distance_heatmap,
)
from lens_heads.viz.patterns import (
    AttentionView,
    bundle_script,
    head_label,
    parse_heads,
)

__all__ = [
    "AttentionView", "bundle_script", "head_label", "parse_heads",
    "score_heatmap", "score_grid", "sweep_curves", "point_changes", "base_accuracy", "random_baseline",
    "score_distributions", "distance_heatmap", "diagnosis_map", "DIAGNOSIS_COLOURS",
]
