"""Diagnosis and surgery of heads: which class each head is in, surgical repair of collapsed
heads (docs/methods.md §7, as edits on a plain HF model) and physical pruning.

    head_classes.py  the diagnosis classes, in order, with their display names
    diagnose.py    which class each head is in (and the band)
    targets.py     which heads: classes / explicit list / band / score threshold; healthy heads too
    reinit.py      the plan of slice edits and the Xavier re-initialisation
    masks.py       freezing and 0/1 gradient masks
    train.py       masked AdamW training, held-out perplexity, early stopping, resume
    checkpoint.py  safetensors + state checkpoints (every one kept on request)
    export.py      save_pretrained (+ tokenizer)
    repair.py      the two-pass protocol that ties them together
    report.py      its report.json: RepairReport / RepairPass
    drift.py       after surgery: every head's drift per checkpoint, probes, its store and tables
    prune.py       physical head pruning: the plan, the pruned model, its export

Floor 6 of docs/architecture.md. May import: the wings below it (the root modules, ``files``,
``data``, ``models``, ``forward``, ``scores``, ``interventions``), not ``evaluation`` on its
floor. Imported by: ``results`` and every wing above it.
"""

from lens_heads.surgery.drift import ProbeSet, drift_tables, measure_run
from lens_heads.surgery.export import export_model
from lens_heads.surgery.masks import MaskedParams, freeze_and_mask
from lens_heads.surgery.reinit import GQA_POLICIES, INITS, SliceEdit, SurgeryPlan, plan_surgery, reinitialise
from lens_heads.surgery.repair import RepairConfig, repair
from lens_heads.surgery.report import RepairPass, RepairReport
from lens_heads.surgery.targets import HealthyPick, TargetSelector, parse_heads, parse_select
from lens_heads.surgery.train import TrainConfig, TrainResult, perplexity, train_surgery

__all__ = ["GQA_POLICIES", "HealthyPick", "INITS", "MaskedParams", "ProbeSet", "drift_tables", "measure_run", "RepairConfig", "RepairPass",
           "RepairReport", "SliceEdit", "SurgeryPlan", "TargetSelector",
           "TrainConfig", "TrainResult", "export_model", "freeze_and_mask", "parse_heads", "parse_select",
           "perplexity", "plan_surgery", "reinitialise", "repair", "train_surgery"]
