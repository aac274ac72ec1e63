"""lens_heads: find, test and repair dormant attention heads, on TransformerLens.

The notebook API, one name per step of the data flow
(model -> scores -> head selections -> interventions -> results)::

    load_model -> score_heads (HeadScores.least_active) -> parse_ablation / StaticAblation
    -> evaluate_task, run_sweep(SweepConfig) ; diagnose -> repair(TargetSelector, RepairConfig)
"""

from lens_heads.errors import LensHeadsError
from lens_heads.models import ARCHITECTURES, ZOO, HeadGeometry, LoadedModel, load_model

__version__ = "0.1.0"

from lens_heads.scores import SCORES, HeadScores, score_heads  # noqa: E402
from lens_heads.ablation import StaticAblation, parse_ablation  # noqa: E402
from lens_heads.evaluate import evaluate_task  # noqa: E402
from lens_heads.sweep import SweepConfig, run_sweep  # noqa: E402
from lens_heads.diagnose import diagnose  # noqa: E402
from lens_heads.surgery import RepairConfig, TargetSelector, TrainConfig, repair  # noqa: E402

__all__ = ["ARCHITECTURES", "ZOO", "HeadGeometry", "LensHeadsError", "LoadedModel", "load_model",
           "SCORES", "HeadScores", "score_heads", "StaticAblation", "parse_ablation", "evaluate_task",
           "SweepConfig", "run_sweep", "diagnose", "RepairConfig", "TargetSelector", "TrainConfig", "repair"]
