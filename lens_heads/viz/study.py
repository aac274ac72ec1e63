"""The thin orchestration layer: a model by reference, and sweeps run or read from a store.

``ModelRef`` names a model (zoo name, .gguf, HF folder or hub id) with its dtype and device and
loads it only when something must be computed: a store's results are identified by the weights'
digest and the dtype, both known without loading (``keys.RunIdentity``), so tabulating stored
sweeps (``ModelRef.sweep(..., compute=False)``) needs no weights in memory. Analyses, the CLI
and ``build_report`` use it; views never do. ``build_report`` gathers what the HTML report
shows (reading saved results, computing the missing ones) and hands it to ``report.py``, which
only renders.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path
from typing import TYPE_CHECKING, Mapping, Sequence

from lens_heads.models.heads import Head
from lens_heads.forward.activations import head_patterns
from lens_heads.data import load_task, load_texts, tokenize_texts
from lens_heads.surgery.diagnose import Diagnosis, diagnose
from lens_heads.errors import LensHeadsError
from lens_heads.interventions.specs import parse_heads
from lens_heads.models.load import dtype_name, model_digest, spec_digest
from lens_heads.evaluation.protocol import resolve_protocol
from lens_heads.files.provenance import package_versions
from lens_heads.viz.report import KEY_SCORE, ReportData, ViewGroup, head_titles, pick_views, write_report
from lens_heads.scores import resolve_score_ids
from lens_heads.sweep import SweepConfig, SweepResult, run_sweep, tabulate
from lens_heads.sweep.adaptive import SearchResult
from lens_heads.viz import AttentionView
from lens_heads.surgery.prune import read_prune_report
from lens_heads import models
from lens_heads import scores as scoring
from lens_heads.scores import HeadScores

if TYPE_CHECKING:
    from lens_heads.models.load import LoadedModel


@dataclass
class ModelRef:
    """A model named by its ``spec`` (zoo name, folder or hub id) and loaded only when something
    needs it (``.model``), so a report built from stored results loads no model at all."""

    spec: str
    dtype: str = "float32"  # or "auto": bfloat16 where native
    device: str = "cpu"
    loaded: object | None = field(default=None, repr=False)  # the LoadedModel, once loaded
    revision: str | None = None  # a hub id's branch, tag or commit
    placement: dict = field(default_factory=dict)  # load_model's device_map / max_memory / offload_folder

    @classmethod
    def of(cls, model: LoadedModel) -> "ModelRef":
        """A reference to an already loaded model."""
        return cls(model.name, str(model.dtype).removeprefix("torch."), str(model.device), model)

    @property
    def model(self):
        """The loaded model (loaded on first use)."""
        if self.loaded is None:
            self.loaded = models.load_model(self.spec, dtype=self.dtype, device=self.device, revision=self.revision,
                                     **self.placement)
        return self.loaded

    @cached_property
    def digest(self) -> str:
        """The weights' digest (``models.load.source_digest``), without loading them."""

        if self.loaded is not None:
            return model_digest(self.loaded)
        return spec_digest(self.spec, self.revision)

    @cached_property
    def dtype_name(self) -> str:
        """The dtype a load gives ("auto" resolved for this device), without loading."""
        if self.loaded is not None:
            return str(self.loaded.dtype).removeprefix("torch.")

        return dtype_name(self.dtype, self.device)

    def identity(self, cfg, task):
        """The ``RunIdentity`` of sweep config ``cfg`` on ``task`` with this model."""
        return cfg.identity_for(self.digest, self.dtype_name, task)

    def sweep(self, cfg, out_dir, task, compute: bool = True, partial: bool = False, progress: bool = False):
        """Run (or resume) the sweep when ``compute``; else its tables from the store alone
        (None when it lacks them; ``partial``: what a sweep still running holds), no model loaded."""

        if compute:
            return run_sweep(self.model, cfg, out_dir, task=task, progress=progress)
        return tabulate(out_dir, self.identity(cfg, task), cfg, task, partial=partial, model=self.spec)


# -----------------------------------------------------------------------------
# Patterns as a view (computed by activations, rendered by viz)


def attention_heads(model: LoadedModel, text: str, heads: Sequence[Head] | None = None,
                    titles: Mapping[Head, str] | Sequence[str] | None = None, max_tokens: int = 64):
    """``head_patterns`` rendered as a circuitsvis view (``viz.AttentionView``); ``titles`` adds
    text to each head's name ("L3.H1 | ahon_ln 0.41 | BOS-sink"): a mapping from (layer, head),
    or a list parallel to ``heads``."""

    if titles is not None and not isinstance(titles, Mapping) and heads is not None and len(titles) != len(heads):
        raise LensHeadsError(f"{len(titles)} titles for {len(heads)} heads")  # before the forward
    return AttentionView.of(head_patterns(model, text, heads, max_tokens), titles)


# -----------------------------------------------------------------------------
# The report: gather (read or compute) the results, then render them


@dataclass(frozen=True)
class ReportConfig:
    """What ``build_report`` gathers and shows; its values are checked at construction (the
    files it names, before any model work, by ``check_report_config``)."""

    model: str
    out: str = "report.html"
    data: str = "c4"
    n_inputs: int = 16
    max_len: int = 128
    task: str | None = None  # run a sweep on this task when no --sweep folder is given
    limit: int | None = None  # questions of the task for that sweep
    sweep_scores: str = "awft,ahon_ln,lthon_ln"  # score functions of that sweep
    sweep_fractions: Sequence[float] | None = None  # its target fractions (None: the sweep's default)
    sweep_seeds: int = 3  # its random-head seeds 0..N-1
    sweep: str | None = None  # folder with summary.csv (+ within_1pt.csv)
    diagnosis: str | None = None  # diagnosis CSV
    scores: str | None = None  # scores table (.csv/.parquet)
    top_k: int = 4  # heads per view: k most inactive, k most active by the report's key score
    heads: str | None = None  # extra heads to show, "3.1,4.2"
    max_sink_views: int = 8  # cap on BOS-sink / DEAD heads shown
    view_tokens: int = 40  # tokens of the text the attention views show
    heatmaps: Sequence[str] = ("ahon_ln", "awft")
    dtype: str = "float32"
    device: str = "cpu"
    batch_size: int = 8
    progress: bool = True
    protocol: dict = field(default_factory=dict)  # resolve_protocol settings for that sweep (paper=..., ...)
    prune_run: str | None = None  # a 'lens-heads prune' --out folder: the report's pruning section

    def __post_init__(self) -> None:
        for name in ("top_k", "n_inputs", "max_len", "batch_size", "view_tokens"):
            if isinstance(getattr(self, name), int) and getattr(self, name) < 1:  # ("auto" batch sizes pass)
                raise LensHeadsError(f"{name.replace('_', '-')} must be >= 1, got {getattr(self, name)}")
        if self.max_sink_views < 0:
            raise LensHeadsError(f"max-sink-views must be >= 0, got {self.max_sink_views}")
        if self.limit is not None and self.limit < 1:
            raise LensHeadsError(f"limit must be >= 1, got {self.limit}")
        if self.limit is not None and not self.task:
            raise LensHeadsError("--limit needs --task")


VERSION_PACKAGES = ("lens_heads", "torch", "transformer_lens", "transformers", "circuitsvis", "matplotlib",
                    "pandas", "numpy")


def check_report_config(cfg: ReportConfig) -> None:
    """Every setting and named file, before any model work."""

    out = Path(cfg.out)
    if out.is_dir():
        raise LensHeadsError(f"--out {out} is a folder; give a file name such as {out / 'report.html'}")
    if not out.parent.is_dir():
        raise LensHeadsError(f"cannot write {out}: folder {out.parent} does not exist")
    if out.suffix.lower() not in (".html", ".htm"):
        raise LensHeadsError(f"--out must end in .html, got {out.name!r}")
    if cfg.task and not cfg.sweep:
        resolve_score_ids(cfg.sweep_scores)
        load_task(cfg.task)  # an unknown task fails here, before the model is loaded
    if cfg.prune_run is not None:
        read_prune_report(cfg.prune_run)
    if cfg.sweep is not None:
        sweep = Path(cfg.sweep)
        if not sweep.exists():
            raise LensHeadsError(f"sweep folder not found: {sweep}")
        if sweep.is_dir() and not any(sweep.iterdir()):
            raise LensHeadsError(f"sweep folder {sweep} is empty (expected summary.csv from 'lens-heads sweep')")


def report_sweep_dir(cfg: ReportConfig) -> Path:
    """Where a sweep run for the report is stored (beside the report; rerunning resumes it)."""
    out = Path(cfg.out)
    return out.with_name(out.stem + "_sweep")


def _check_shape(n_layers: int, n_heads: int, geometry, what: str) -> None:

    if (n_layers, n_heads) != (geometry.n_layers, geometry.n_heads):
        raise LensHeadsError(f"{what} covers {n_layers} layers x {n_heads} heads but the model has "
                             f"{geometry.n_layers} x {geometry.n_heads}: is it for another model?")


def build_report(cfg: ReportConfig, model: LoadedModel=None, texts: list[str] | None = None) -> Path:
    """Read the results ``cfg`` names, compute the missing ones (scores, diagnosis and, with a
    task, a sweep), run the model for the attention views, and write the report to ``cfg.out``.

    ``model``: an already loaded LoadedModel (else ``cfg.model`` is loaded). ``texts``: the
    inputs (else ``cfg.n_inputs`` texts of ``cfg.data``)."""
    import time
    from datetime import datetime, timezone

    t0 = time.time()
    check_report_config(cfg)
    saved_scores = HeadScores.load(cfg.scores) if cfg.scores else None  # a bad file fails before the model loads
    saved_diag = Diagnosis.load(cfg.diagnosis) if cfg.diagnosis else None
    saved_search = SearchResult.load_tables(cfg.sweep) if cfg.sweep and Path(cfg.sweep).is_dir() else None
    saved_sweep = SweepResult.load(cfg.sweep) if cfg.sweep and (saved_search is None or (
        Path(cfg.sweep) / "summary.csv").is_file()) else None
    ref = ModelRef.of(model) if model is not None else ModelRef(cfg.model, cfg.dtype, cfg.device)
    model = ref.model
    g = model.geometry
    extra_heads = parse_heads(cfg.heads, g) if cfg.heads else []
    if texts is None:
        texts = load_texts(cfg.data, n=cfg.n_inputs)
    inputs = tokenize_texts(model.tokenizer, texts, cfg.max_len)
    if not inputs:
        raise LensHeadsError(f"no usable inputs in {cfg.data!r}")
    computed = f"computed on {len(inputs)} {cfg.data} inputs"
    sources: dict[str, str] = {}

    scores = saved_scores or scoring.score_heads(model, inputs, "all", batch_size=cfg.batch_size, progress=cfg.progress)
    sources["scores"] = f"file {cfg.scores}" if saved_scores else computed
    _check_shape(scores.n_layers, scores.n_heads, g, "the scores table")
    diagnosis = saved_diag or diagnose(model, inputs, batch_size=cfg.batch_size)
    sources["diagnosis"] = f"file {cfg.diagnosis}" if saved_diag else computed
    _check_shape(diagnosis.n_layers, diagnosis.n_heads, g, "the diagnosis table")
    sweep = saved_sweep
    if saved_sweep is not None or saved_search is not None:
        sources["sweep"] = f"folder {cfg.sweep}"
    elif cfg.task and saved_search is None:
        sweep = _report_sweep(cfg, ref)
        sources["sweep"] = f"computed on {cfg.task}" + (f", {cfg.limit} questions" if cfg.limit else "")


    text = model.tokenizer.decode(inputs[0][: cfg.view_tokens].tolist(), skip_special_tokens=True)
    titles = head_titles(scores, diagnosis, KEY_SCORE)
    views = [ViewGroup(caption, attention_heads(model, text, heads, titles, max_tokens=cfg.view_tokens))
             for caption, heads in pick_views(scores, diagnosis, KEY_SCORE, cfg.top_k, cfg.max_sink_views,
                                              extra_heads)]
    v = {k: val or "-" for k, val in package_versions(VERSION_PACKAGES).items()}
    meta = {
        "model": f"{model.name} ({g.arch.name}, {g.n_layers} layers x {g.n_heads} heads, {g.n_kv_heads} KV heads)",
        "data": f"{cfg.data}: {len(inputs)} inputs, up to {cfg.max_len} tokens",
        "dtype / device": f"{str(model.dtype).removeprefix('torch.')} / {model.device}",
        "results": "; ".join(f"{k}: {s}" for k, s in sources.items()),
        "versions": ", ".join(f"{k} {val}" for k, val in v.items()),
        "report built in": f"{time.time() - t0:.1f} s",  # this build only, not the runs whose results it reads
        "generated": datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
    }
    pruning = None
    if cfg.prune_run is not None:

        pruning = read_prune_report(cfg.prune_run)
    data = ReportData(model.name, scores, diagnosis, sweep, views, text,
                      min(len(model.to_tokens(text)[0]), cfg.view_tokens), sources, meta, tuple(cfg.heatmaps),
                      pruning=pruning, search=saved_search)
    return write_report(data, cfg.out)


def _report_sweep(cfg: ReportConfig, ref: ModelRef):
    """Run (or resume) the report's sweep into ``report_sweep_dir(cfg)``."""

    fractions = {} if cfg.sweep_fractions is None else {"fractions": list(cfg.sweep_fractions)}
    scfg = SweepConfig(task=cfg.task, score_ids=resolve_score_ids(cfg.sweep_scores), limit=cfg.limit,
                       random_seeds=list(range(cfg.sweep_seeds)), batch_size=max(cfg.batch_size, 1),
                       protocol=resolve_protocol(ref.model, **cfg.protocol), **fractions)
    return ref.sweep(scfg, report_sweep_dir(cfg), load_task(cfg.task), progress=cfg.progress)
