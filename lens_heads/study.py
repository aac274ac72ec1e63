"""The thin orchestration layer: a model by reference, and sweeps run or read from a store.

``ModelRef`` names a model (zoo name, .gguf, HF folder or hub id) with its dtype and device and
loads it only when something must be computed: a store's results are identified by the weights'
digest and the dtype, both known without loading (``keys.RunIdentity``), so tabulating stored
sweeps (``ModelRef.sweep(..., compute=False)``) needs no weights in memory. Analyses, the CLI
and the report's gathering step use it; views never do.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import cached_property


@dataclass
class ModelRef:
    spec: str
    dtype: str = "float32"  # or "auto": bfloat16 where native
    device: str = "cpu"
    loaded: object | None = field(default=None, repr=False)  # the LoadedModel, once loaded

    @classmethod
    def of(cls, model) -> "ModelRef":
        """A reference to an already loaded model."""
        return cls(model.name, str(model.dtype).removeprefix("torch."), str(model.device), model)

    @property
    def model(self):
        """The loaded model (loaded on first use)."""
        if self.loaded is None:
            from lens_heads.models import load_model

            self.loaded = load_model(self.spec, dtype=self.dtype, device=self.device)
        return self.loaded

    @cached_property
    def digest(self) -> str:
        """The weights' digest (``models.load.source_digest``), without loading them."""
        from lens_heads.models import zoo
        from lens_heads.models.load import model_digest, resolve_source, source_digest

        if self.loaded is not None:
            return model_digest(self.loaded)
        if self.spec in zoo.ZOO:  # the digest its file is verified against: no download needed
            return zoo.ZOO[self.spec].sha256
        return source_digest(resolve_source(self.spec))

    @cached_property
    def dtype_name(self) -> str:
        """The dtype a load gives ("auto" resolved for this device), without loading."""
        if self.loaded is not None:
            return str(self.loaded.dtype).removeprefix("torch.")
        from lens_heads.models.load import resolve_dtype

        return str(resolve_dtype(self.dtype, self.device)).removeprefix("torch.")

    def identity(self, cfg, task):
        """The ``RunIdentity`` of sweep config ``cfg`` on ``task`` with this model."""
        return cfg.identity_for(self.digest, self.dtype_name, task)

    def sweep(self, cfg, out_dir, task, compute: bool = True, partial: bool = False, progress: bool = False):
        """Run (or resume) the sweep when ``compute``; else its tables from the store alone
        (None when it lacks them; ``partial``: what a sweep still running holds), no model loaded."""
        from lens_heads.sweep import run_sweep, tabulate

        if compute:
            return run_sweep(self.model, cfg, out_dir, task=task, progress=progress)
        return tabulate(out_dir, self.identity(cfg, task), cfg, task, partial=partial)
