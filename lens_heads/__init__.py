"""lens_heads: find, test and repair dormant attention heads, on TransformerLens.

The notebook API, one name per step of the data flow
(model -> scores -> head selections -> interventions -> results)::

    load_model -> score_heads (HeadScores.least_active) -> parse_ablation / StaticAblation
    -> evaluate_task, run_sweep(SweepConfig) -> SweepResult (.save / .load; tabulate: no model)
    ; diagnose -> repair(TargetSelector, RepairConfig) ; build_report(ReportConfig) -> one HTML page

``Protocol`` / ``paper_protocol(model)`` set lm-eval's ``add_bos_token`` and chat template and
the threshold rule (the paper's settings, or lens_heads' defaults) for evaluate_task / run_sweep.
"""

from lens_heads.errors import LensHeadsError
from lens_heads.models import ARCHITECTURES, ZOO, HeadGeometry, LoadedModel, load_model

from lens_heads.files.provenance import lens_heads_version  # noqa: E402

__version__ = lens_heads_version()

from lens_heads.scores import SCORES, HeadScores, score_heads  # noqa: E402
from lens_heads.interventions.ablation import StaticAblation, parse_ablation  # noqa: E402
from lens_heads.evaluation.protocol import Protocol, load_authors_thresholds, paper_protocol  # noqa: E402
from lens_heads.evaluation.evaluate import evaluate_task  # noqa: E402
from lens_heads.sweep import SweepConfig, SweepResult, run_sweep, tabulate  # noqa: E402
from lens_heads.surgery.diagnose import diagnose  # noqa: E402
from lens_heads.surgery import (HealthyPick, ProbeSet, RepairConfig, RepairReport, TargetSelector,  # noqa: E402
                                TrainConfig, drift_tables, measure_run, repair)
from lens_heads.viz.study import ModelRef, ReportConfig, attention_heads, build_report  # noqa: E402
from lens_heads.forward.activations import HeadPatterns, head_patterns  # noqa: E402
from lens_heads.explore import explore  # noqa: E402  (the function: lh.explore(model) starts the explorer)



def __getattr__(name):
    """``lens_heads.LensHeadsLM`` on first use: it needs lm-eval, an optional dependency."""
    if name == "LensHeadsLM":
        from lens_heads.evaluation.lm_eval_model import LensHeadsLM  # lm-eval is optional: imported when used

        return LensHeadsLM
    raise AttributeError(f"module 'lens_heads' has no attribute {name!r}")


__all__ = ["ARCHITECTURES", "ZOO", "HeadGeometry", "LensHeadsError", "LoadedModel", "load_model",
           "SCORES", "HeadScores", "score_heads", "StaticAblation", "parse_ablation", "Protocol",
           "paper_protocol", "load_authors_thresholds", "evaluate_task",
           "SweepConfig", "SweepResult", "run_sweep", "tabulate", "diagnose", "RepairConfig", "TargetSelector", "TrainConfig", "repair", "RepairReport",
           "HealthyPick", "ProbeSet", "measure_run", "drift_tables", "ModelRef",
           "ReportConfig", "build_report", "HeadPatterns", "head_patterns", "attention_heads", "LensHeadsLM",
           "explore"]
