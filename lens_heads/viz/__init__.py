"""What a person reads: circuitsvis attention patterns (``patterns``), matplotlib figures
(``figures``), the HTML report (``report``) and the surgery-drift page (``surgery``). These
views only read results: the patterns they show are captured by
``lens_heads.forward.activations``. ``study`` is the wing's one
orchestrator: ``build_report`` reads or computes what the report shows, ``attention_heads``
captures patterns and wraps them in a view, ``ModelRef`` loads a model only when needed.

Floor 9 of docs/architecture.md. May import: the wings below it (up to ``sweep``); the views
(``figures``, ``patterns``, ``report``, ``surgery``) only what computes nothing: ``files``, the
ablation specs (``interventions.specs``), the score registry and the head classes. Imported by: ``explore``,
``cli`` and the public API.
"""

from lens_heads.viz.figures import (
    DIAGNOSIS_COLOURS,
    base_accuracy,
    crossing_overview,
    crossing_probes,
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
    "score_heatmap", "score_grid", "sweep_curves", "crossing_probes", "crossing_overview", "point_changes", "base_accuracy", "random_baseline",
    "score_distributions", "distance_heatmap", "diagnosis_map", "DIAGNOSIS_COLOURS",
]
