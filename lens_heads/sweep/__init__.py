"""Ablation sweeps: accuracy vs % of heads zeroed, per score function and for random heads.

One sweep, for one model and task::

    cfg = SweepConfig(task="mmlu", score_ids=["awft", "ahon_ln"], limit=200)
    result = run_sweep(model, cfg, out_dir="runs/smollm2-mmlu")
    result.summary        # one row per (score_fn, fraction[, seed]) point
    result.within         # per function: max % zeroed within 1 point, normalised AUC
    SweepResult.load("runs/smollm2-mmlu")   # the same tables, later, from disk

The package, in the order data flows through it:

* ``config``: ``SweepConfig`` and ``PointId`` (the typed name of a point, ``ahon_ln@0.1``,
  ``random@0.1@0``, for ``SweepConfig.first``);
* ``plan``: the points (baseline ``none``; ``score:ID@tau`` per function x fraction > 0 from
  thresholds on the task's unablated request sequences; ``random:p@s`` per seed x fraction;
  ``extra_ablations``), their order (``compute_order``: the baseline, the ``first`` points, the
  random reference, then each function's curve whole, then the static curves
  (``static:ID@p``, ``static:random@p@s``: the ceil(p x heads) least active heads by a stored
  dataset-level score, on every input), then the extras, so a sweep stopped
  part-way can already be tabulated) and the work units (``SweepPlan.units``: each point's
  parts of ``chunk_questions`` questions), all from the run identity without a model;
* ``run``: the thresholds' scoring pass, the units, merging parts into points, resume;
  ``tabulate`` reads a store into tables with no model;
* ``stats``: pure functions of the question x point correctness matrix (bootstrap intervals,
  within-1-point, AUC; see its docstring and docs/methods.md §5);
* ``curves``: accuracy-vs-%-zeroed curves, on plain numbers (the within-1-point value, the
  normalised area, bootstrap indices and intervals), which ``stats`` and the analyses share;
* ``confseq``: an anytime-valid confidence sequence for a mean over N items read in a random
  order (without replacement), and the within / outside decision on it (docs/methods.md §12);
* ``adaptive``: ``--search crossing``: each curve's within-margin crossing by bisection over a
  fine grid, every probe decided sequentially on the confidence sequence, its questions read
  from and stored in the same store under the grid's point keys (docs/methods.md §13);
* ``ledger``: a search's per-item results in compact form (one bit an item and point, the
  units zeroed, the seconds spent): what a campaign commits and a fresh machine resumes from;
* ``records`` / ``result``: the typed stored records and ``SweepResult`` (save / load).

Every record is one JSON file in a ``ResultStore`` (``DIR/points``, ``DIR/parts``,
``DIR/thresholds``), keyed by a ``keys.StoreKey`` built from the ``RunIdentity`` (model digest,
task fingerprint, n_shot, limit, few-shot seed, dtype, package version, the non-default
protocol settings) plus the ablation spec and a score function's definition revision where it
changed; the batch size is deliberately not part of the key. A sweep killed at any moment
resumes by computing only the missing units, and its tables are computed from the stored
records alone, so they equal those of an uninterrupted run.

Floor 8 of docs/architecture.md. May import: the wings below it (up to ``results``). Imported
by: ``viz`` and every wing above it.
"""

from lens_heads.sweep.config import BASELINE, RANDOM, STATIC_RANDOM, PointId, SweepConfig, static_name
from lens_heads.sweep.plan import (PartUnit, SweepPlan, SweepPoint, compute_order, partial_config, plan_points,
                                   point_label, put_thresholds, static_heads, stored_static, stored_thresholds,
                                   thresholds_key)
from lens_heads.sweep.records import PointRecord, StaticScoresRecord, ThresholdsRecord
from lens_heads.sweep.result import SweepResult
from lens_heads.sweep.executors import run_sweep
from lens_heads.sweep.run import CLAIM_POLL_S, merge_point, run_unit, sweep_status, tabulate
from lens_heads.sweep.stats import TIED_NOTE, point_summary, tables, thresholds_tie

__all__ = ["BASELINE", "RANDOM", "STATIC_RANDOM", "static_name", "PointId", "SweepConfig", "PartUnit", "SweepPlan", "SweepPoint", "compute_order",
           "partial_config", "plan_points", "point_label", "put_thresholds", "static_heads", "stored_static", "stored_thresholds", "thresholds_key",
           "PointRecord", "StaticScoresRecord", "ThresholdsRecord", "SweepResult", "CLAIM_POLL_S", "merge_point",
           "run_sweep", "run_unit", "sweep_status", "tabulate", "TIED_NOTE", "point_summary", "tables",
           "thresholds_tie"]
