"""``load_model(spec)``: one object holding the TransformerLens bridge, tokenizer and geometry.

``spec`` may be a zoo name (``smollm2-135m``), a path to a ``.gguf`` file, a local Hugging
Face directory, or a hub id (for users who are online). Attention is always eager, so the
bridge's ``hook_pattern`` sees real attention probabilities.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import contextlib
import io
import logging
import os
import re
import sys
import warnings
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

import torch

from lens_heads.models import allocator
from lens_heads.errors import LensHeadsError
from lens_heads.models import zoo
from lens_heads.models.geometry import HeadGeometry
from lens_heads.data.paths import hub_offline
from lens_heads.models.hooks import booting_pruned, bridge_made_parameters, pin_rotary_dtype, probe_shapes
from lens_heads.models.gguf_size import Truncated, declared_size
from lens_heads.models.pruned_model import pruned_class, shrink
from lens_heads.models.attention import blockers, check_choice, check_model
from lens_heads.files.provenance import package_versions

if TYPE_CHECKING:
    from transformers import PreTrainedModel

DTYPES = {"float32": torch.float32, "fp32": torch.float32, "bfloat16": torch.bfloat16,
          "bf16": torch.bfloat16, "float16": torch.float16, "fp16": torch.float16}


def native_bf16(device: str = "cpu") -> bool:
    """Whether bfloat16 matmuls run natively on ``device``.

    On CPUs without AVX512-BF16 or AMX, torch emulates bf16 and it is *slower* than float32
    (measured here on an AMD EPYC with AVX2 only: 1.4 vs 34 GFLOP/s for 512x512 matmuls);
    with them it is ~4x faster.
    """
    if str(device).startswith("cuda"):
        return torch.cuda.is_available() and torch.cuda.is_bf16_supported()
    try:
        with open("/proc/cpuinfo") as f:
            flags = f.read()
    except OSError:
        return False
    return "avx512_bf16" in flags or "amx_bf16" in flags


def check_device(device: str | torch.device) -> str:
    """``device`` as a string, if torch can use it here; one clear error otherwise."""
    try:
        dev = torch.device(device)
    except (RuntimeError, TypeError):
        raise LensHeadsError(f"unknown device {device!r}; use cpu, cuda or cuda:N") from None
    if dev.type == "cuda":
        if not torch.cuda.is_available():
            why = "this torch build has no CUDA" if torch.version.cuda is None else "no CUDA GPU is visible"
            raise LensHeadsError(f"device {str(device)!r} requested but {why} (torch {torch.__version__}); "
                                 f"use --device cpu, or install a CUDA build of torch")
        if dev.index is not None and dev.index >= torch.cuda.device_count():
            raise LensHeadsError(f"device {str(device)!r}: only {torch.cuda.device_count()} CUDA device(s) visible")
    elif dev.type == "mps" and not torch.backends.mps.is_available():
        raise LensHeadsError(f"device {str(device)!r} requested but MPS is not available here")
    return str(device)


def resolve_dtype(dtype: str | torch.dtype, device: str = "cpu") -> torch.dtype:
    """A torch dtype from a name; ``"auto"`` is bfloat16 where it runs natively, else float32."""
    if isinstance(dtype, torch.dtype):
        return dtype
    if dtype == "auto":
        return torch.bfloat16 if native_bf16(device) else torch.float32
    if dtype not in DTYPES:
        raise LensHeadsError(f"unknown dtype {dtype!r}; choose one of: auto, {', '.join(DTYPES)}")
    chosen = DTYPES[dtype]
    if chosen == torch.bfloat16 and not native_bf16(device):
        warnings.warn(f"bfloat16 on {device} without native bf16 support is emulated and much slower "
                      "than float32 here; use dtype='auto' or 'float32'", stacklevel=3)
    return chosen


@dataclass
class ModelSource:
    """Where weights come from, enough to load the plain HF model again (e.g. for surgery)."""

    spec: str
    path: str  # directory, gguf file or hub id given to transformers
    gguf_file: str | None = None
    digest: str | None = None  # sha256 of the GGUF when known; "hub:ID@COMMIT" for a hub id
    revision: str | None = None  # a hub id's commit (resolved from a branch, tag or commit)

    def hf_kwargs(self) -> tuple[str, dict]:
        if self.gguf_file:
            return str(Path(self.gguf_file).parent), {"gguf_file": Path(self.gguf_file).name}
        return self.path, ({"revision": self.revision} if self.revision else {})


@dataclass(frozen=True)
class Placement:
    """Where a model's weights go: one device, or an accelerate device map (``"auto"``,
    ``"balanced"``, ``"sequential"`` or ``{module: device}``, devices including ``"cpu"`` and
    ``"disk"``), with per-device ``max_memory`` and the ``offload_folder`` for disk."""

    device: str = "cpu"
    device_map: str | dict | None = None
    max_memory: dict | None = None
    offload_folder: str | None = None

    def hf_kwargs(self) -> dict:
        if self.device_map is None:
            return {}
        out = {"device_map": self.device_map}
        if self.max_memory:
            out["max_memory"] = self.max_memory
        if self.offload_folder:
            out["offload_folder"] = str(self.offload_folder)
        return out


@dataclass
class LoadedModel:
    """A model as ``load_model`` returns it: the TransformerLens ``bridge`` over the Hugging Face
    model, its ``tokenizer``, its head ``geometry``, where it came from (``source``), its dtype,
    device and attention backend. Every lens_heads step takes one."""

    bridge: object  # transformer_lens.model_bridge.TransformerBridge
    tokenizer: object
    geometry: HeadGeometry
    source: ModelSource
    dtype: torch.dtype
    device: str
    prepends_bos: bool = field(default=False)
    weights_digest: str | None = field(default=None, repr=False)  # model_digest of a folder, once computed
    attention: str = field(default="auto")  # the attention backend: auto / fused / eager (lens_heads.models.attention)

    @property
    def hf_model(self):
        """The Hugging Face model the bridge wraps (its parameters are the model's)."""
        return self.bridge.original_model

    @property
    def name(self) -> str:
        return self.source.spec

    def parameter_count(self) -> int:
        """The model's own parameters (offloaded ones too), not the copies the bridge makes."""

        made = bridge_made_parameters(self.bridge)
        return sum(p.numel() for p in self.hf_model.parameters() if id(p) not in made)

    def params(self) -> "Params":
        """HF-named parameters (TransformerLens wrapper segments stripped); a parameter offloaded
        by a device map (to disk or CPU RAM) is read from its offload when looked up."""
        return Params(self.hf_model)

    @property
    def sharded(self) -> bool:
        """Whether a device map spreads the model over devices or offloads part of it."""
        return len(set(map(str, (getattr(self.hf_model, "hf_device_map", None) or {}).values()))) > 1 or \
            any(str(d) in ("disk", "meta") for d in (getattr(self.hf_model, "hf_device_map", None) or {}).values())

    def load_hf_model(self):
        """A fresh, unwrapped copy of the HF model from the same source (for editing); a model
        pruned in memory (``lens_heads.surgery.prune``) gives a copy pruned the same way."""
        hf = load_hf(self.source, self.dtype, self.device)[0]
        plan = getattr(self.hf_model.config, "lens_heads_pruned", None)
        if plan and not getattr(hf.config, "lens_heads_pruned", None):

            shrink(hf, plan)
            hf.config.lens_heads_pruned = plan
        return hf

    def to_tokens(self, texts: list[str] | str) -> list[torch.Tensor]:
        texts = [texts] if isinstance(texts, str) else texts
        return [torch.tensor(self.tokenizer(t)["input_ids"], dtype=torch.long) for t in texts]


class Params(Mapping):
    """A model's HF-named parameters, looked up lazily; offloaded ones (meta tensors, their values
    kept by accelerate's hooks) come from the offload."""

    def __init__(self, hf_model):
        self.hf_model = hf_model
        self.raw = {}
        for name, p in hf_model.named_parameters(remove_duplicate=False):
            self.raw.setdefault(name.replace("._original_component", ""), (name, p))

    def __getitem__(self, key: str) -> torch.Tensor:
        name, p = self.raw[key]
        return p if p.device.type != "meta" else _offloaded(self.hf_model, name)

    def __iter__(self):
        return iter(self.raw)

    def __len__(self) -> int:
        return len(self.raw)


def _offloaded(hf_model, name: str) -> torch.Tensor:
    """The value of offloaded parameter ``name``: from the weights map of the nearest enclosing
    module that accelerate hooked (the map's keys are relative to that module)."""
    parts = name.split(".")
    for i in range(len(parts) - 1, -1, -1):
        module = hf_model.get_submodule(".".join(parts[:i])) if i else hf_model
        hook = getattr(module, "_hf_hook", None)
        for h in getattr(hook, "hooks", [hook]):
            weights = getattr(h, "weights_map", None)
            if weights is not None:
                key = ".".join(x for x in parts[i:] if x != "_original_component")
                try:
                    return weights[key]
                except KeyError:
                    continue
    raise LensHeadsError(f"parameter {name} is on the meta device and no offload holds it")


@contextlib.contextmanager
def _quiet():
    """Silence the chatty loaders (GGUF dequantisation bars, bridge banners)."""
    logger = logging.getLogger("transformers")
    level = logger.level
    logger.setLevel(logging.ERROR)
    from transformers.utils import logging as hf_logging

    bars = hf_logging.is_progress_bar_enabled()
    hf_logging.disable_progress_bar()
    with warnings.catch_warnings(), contextlib.redirect_stdout(io.StringIO()):
        warnings.simplefilter("ignore")
        try:
            yield
        finally:
            logger.setLevel(level)
            if bars:
                hf_logging.enable_progress_bar()


def _gguf_shortfall(path: Path) -> str | None:
    """A message when the GGUF file is shorter than its header declares (or its header is cut)."""

    size = path.stat().st_size
    try:
        need = declared_size(path)
    except Truncated as exc:
        return f"GGUF file {path} is truncated or corrupt: {exc} ({size:,} bytes)"
    if size < need:
        return (f"GGUF file {path} is truncated: {size:,} bytes, but its header declares "
                f"{need:,} (tensor data end); fetch or copy it again")
    return None


def check_revision(spec: str, revision: str | None) -> None:
    """A revision pins a hub id only (local files, folders and zoo models have content digests)."""
    if revision is None:
        return
    if spec in zoo.ZOO or Path(spec).expanduser().exists() or not re.fullmatch(r"[\w.-]+/[\w.-]+", spec):
        raise LensHeadsError(f"--revision pins a hub id (owner/name); {spec!r} is a local file, folder or zoo "
                             f"name, pinned by its content digest already")


def resolve_source(spec: str | os.PathLike, revision: str | None = None) -> ModelSource:
    """Turn a user spec into a ModelSource, checking local files on the way; ``revision`` only
    for hub ids (resolved to a commit, ``resolve_revision``)."""
    spec = str(spec)
    check_revision(spec, revision)
    if spec in zoo.ZOO:
        path = zoo.fetch(spec)
        return ModelSource(spec, str(path), str(path), zoo.ZOO[spec].sha256)
    path = Path(spec).expanduser()
    if spec.endswith(".gguf"):
        if not path.is_file():
            raise LensHeadsError(f"GGUF file not found: {spec}")
        with open(path, "rb") as f:
            if f.read(4) != b"GGUF":
                raise LensHeadsError(f"{spec} is not a GGUF file (bad magic bytes)")
        short = _gguf_shortfall(path)  # a truncated file, said before anything parses it
        for entry in zoo.ZOO.values():  # a known model's file is verified against its digest
            if path.stat().st_size == entry.size or path.name == entry.filename:
                try:
                    zoo.verify(path, entry.sha256)
                except LensHeadsError as exc:
                    raise LensHeadsError(f"{short + '; ' if short else ''}{exc}") from None
                return ModelSource(spec, str(path), str(path), entry.sha256)
        if short:
            raise LensHeadsError(short)
        return ModelSource(spec, str(path), str(path), zoo.sha256_file(path))
    if path.is_dir():
        if not (path / "config.json").is_file():
            raise LensHeadsError(f"{spec} is a directory without config.json: not a HF model folder")
        return ModelSource(spec, str(path))
    if path.exists():
        raise LensHeadsError(f"{spec}: expected a .gguf file or a model directory")
    if re.fullmatch(r"[\w.-]+/[\w.-]+", spec):  # a hub id, pinned to a commit
        path, commit = resolve_revision(spec, revision)
        digest = f"hub:{spec}@{commit}" if commit else None
        return ModelSource(spec, path, None, digest, commit)
    raise LensHeadsError(
        f"unknown model spec {spec!r}: not a zoo name ({', '.join(zoo.ZOO)}), an existing "
        f".gguf file or model directory, or a hub id of the form owner/name"
    )


def converted_dir(source: ModelSource) -> Path | None:
    """Cache folder of the HF conversion of a verified GGUF (None for other sources).

    Parsing GGUF metadata is slow (tens of seconds for a 49k vocabulary, three times: config,
    tokenizer, weights), so the dequantised model is saved once as a float32 HF folder keyed
    by the GGUF's sha256 and loaded from there afterwards.
    """
    if not source.gguf_file or not source.digest:
        return None
    return zoo.cache_dir() / f"hf-{source.digest[:16]}"


def _save_conversion(model: PreTrainedModel, tokenizer, target: Path) -> None:
    import shutil
    import tempfile

    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(dir=target.parent, prefix=".convert-"))
    try:
        with _quiet():
            model.save_pretrained(tmp)
            tokenizer.save_pretrained(tmp)
        (tmp / "CONVERTED_FROM").write_text(model.config._name_or_path + "\n")
        os.replace(tmp, target)
    except OSError as exc:
        shutil.rmtree(tmp, ignore_errors=True)  # a cache miss next time, never a broken cache
        print(f"lens_heads: could not cache the conversion in {target} ({exc.strerror or exc}); "
              "the next load converts again", file=sys.stderr)


def _forget_gguf_quantizer(model: PreTrainedModel) -> None:
    """GGUF weights arrive dequantised to float; drop the nominal quantizer so the model is
    an ordinary float model that ``save_pretrained`` can write (surgery exports need it)."""
    model.hf_quantizer = None
    for obj in (model, model.config):
        for attr in ("is_quantized", "quantization_config", "quantization_method"):
            if attr in vars(obj):
                delattr(obj, attr)


def peek_geometry(spec: str | os.PathLike, revision: str | None = None) -> HeadGeometry | None:
    """The head geometry of ``spec`` read from its config alone, no weights loaded (so head
    ranges are checked before a model loads), or None where that needs more than a config: a
    zoo model or GGUF file not converted yet, a hub id not in the local cache. Errors in the
    spec itself (a missing file, a folder without config.json) are raised as ``load_model``
    would raise them."""
    from transformers import AutoConfig

    spec = str(spec)
    check_revision(spec, revision)
    if spec in zoo.ZOO:
        folder = zoo.cache_dir() / f"hf-{zoo.ZOO[spec].sha256[:16]}"  # converted_dir of the zoo's GGUF
        path = str(folder) if (folder / "CONVERTED_FROM").is_file() else None
    elif spec.endswith(".gguf"):
        converted = converted_dir(resolve_source(spec))
        path = str(converted) if converted is not None and (converted / "CONVERTED_FROM").is_file() else None
    elif Path(spec).expanduser().is_dir():
        path = str(resolve_source(spec).path)
    else:
        path = spec if re.fullmatch(r"[\w.-]+/[\w.-]+", spec) else None
    if path is None:
        return None
    try:
        with _quiet():
            config = AutoConfig.from_pretrained(path, **({"revision": revision} if revision else {}),
                                                **({} if Path(path).is_dir() else {"local_files_only": True}))
    except (OSError, ValueError):  # not cached, or not a config transformers reads: load_model will say
        return None
    return HeadGeometry.from_config(config)


def load_hf(source: ModelSource, dtype: torch.dtype, device: str = "cpu", placement: Placement | None = None):
    """Load the plain HF model and tokenizer (eager attention) from a ModelSource, on ``device``
    or placed by ``placement``'s device map."""
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

    placement = placement or Placement(device)
    path, kwargs = source.hf_kwargs()
    converted = converted_dir(source)
    if converted is not None and (converted / "CONVERTED_FROM").is_file():
        path, kwargs = str(converted), {}
    convert = converted is not None and "gguf_file" in kwargs
    if convert:  # the only time the GGUF is parsed (and transformers shows its de-quantisation bar)
        print(f"lens_heads: converting {Path(source.gguf_file).name} to float32 once, cached in {converted}",
              file=sys.stderr, flush=True)
    try:
        with _quiet():
            config = AutoConfig.from_pretrained(path, **kwargs)
            HeadGeometry.from_config(config)  # a config without head counts fails here, early
            auto = AutoModelForCausalLM
            if getattr(config, "lens_heads_pruned", None):  # an exported pruned model: shrunk by our code
                import transformers

                auto = pruned_class(getattr(transformers, config.architectures[0].removeprefix("LensHeadsPruned")))
            model = auto.from_pretrained(  # a conversion is kept in float32
                path, dtype=torch.float32 if convert else dtype, attn_implementation="eager", **kwargs,
                **({} if convert else placement.hf_kwargs()))
            tokenizer = AutoTokenizer.from_pretrained(path, **kwargs)
    except LensHeadsError:
        raise
    except Exception as exc:  # noqa: BLE001 -- any loader failure becomes one clear message
        offline = os.environ.get("HF_HUB_OFFLINE") == "1"
        local = source.gguf_file is not None or Path(source.path).exists()
        hint = " (HF_HUB_OFFLINE=1: hub ids cannot be fetched)" if offline and not local else ""
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise LensHeadsError(f"could not load model {source.spec!r}{hint}: {first}") from None
    if not getattr(model.config, "architectures", None):  # GGUF configs may lack it
        model.config.architectures = [type(model).__name__]
    if "gguf_file" in kwargs:
        _forget_gguf_quantizer(model)
    if convert:
        _save_conversion(model, tokenizer, converted)
        if placement.device_map is not None and (converted / "CONVERTED_FROM").is_file():
            del model  # placed from the conversion, as every later load is
            return load_hf(source, dtype, device, placement)
        model = model.to(dtype)
    if tokenizer.pad_token_id is None:
        tokenizer.pad_token = tokenizer.eos_token
    if placement.device_map is not None:
        return model.eval(), tokenizer  # accelerate placed (and hooks) every module
    return model.to(device).eval(), tokenizer


def boot(model: PreTrainedModel, tokenizer, source: ModelSource, dtype, device) -> LoadedModel:
    """Wrap an HF model in a TransformerLens bridge (in place: the bridge owns its modules)."""
    from transformer_lens.model_bridge import TransformerBridge


    geometry = HeadGeometry.from_config(model.config)
    try:
        with _quiet(), booting_pruned(getattr(model.config, "lens_heads_pruned", None), geometry.arch.conv1d):
            bridge = TransformerBridge.boot_transformers(
                source.path,
                hf_model=model, tokenizer=tokenizer, device=device, dtype=dtype)
    except Exception as exc:  # noqa: BLE001 -- the bridge's own refusal, as one message
        first = str(exc).strip().splitlines()[0][:200] if str(exc).strip() else type(exc).__name__
        raise LensHeadsError(f"TransformerLens' bridge cannot boot {source.spec!r} (model_type "
                             f"{getattr(model.config, 'model_type', '?')!r}, {type(model).__name__}): {first}") from None
    bridge.eval()
    pin_rotary_dtype(bridge, dtype)
    geometry.check_shapes(*probe_shapes(bridge, torch.tensor([tokenizer("a b")["input_ids"][:2] or [0, 0]],
                                                             device=device)))
    probe = tokenizer("a")["input_ids"]
    prepends = tokenizer.bos_token_id is not None and len(probe) > 0 and probe[0] == tokenizer.bos_token_id
    return LoadedModel(bridge, tokenizer, geometry, source, dtype, device, prepends)


def resolve_revision(repo_id: str, revision: str | None) -> tuple[str, str | None]:
    """(snapshot folder or repo id, commit) of a hub id at ``revision`` (a branch, tag or commit;
    None: ``main``): from the local HF cache when it holds that snapshot (offline too), else from
    the hub. The commit pins the weights: it is recorded in results and in store keys."""
    from huggingface_hub import snapshot_download
    from huggingface_hub.errors import LocalEntryNotFoundError

    try:
        folder = snapshot_download(repo_id, revision=revision, local_files_only=True)
        return folder, Path(folder).name
    except (LocalEntryNotFoundError, FileNotFoundError, OSError, ValueError):
        pass

    if hub_offline():
        raise LensHeadsError(f"{repo_id}@{revision or 'main'} is not in the local HF cache and HF_HUB_OFFLINE=1: "
                             "fetch it online once (huggingface-cli download) or give a local folder")
    try:
        from huggingface_hub import HfApi

        commit = HfApi().model_info(repo_id, revision=revision).sha
    except Exception as exc:  # noqa: BLE001 -- the hub's many errors, as one message
        raise LensHeadsError(f"cannot resolve {repo_id}@{revision or 'main'} on the hub: "
                             f"{str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__}") from None
    return repo_id, commit


def source_digest(src: "ModelSource") -> str:
    """sha256 of the weights behind a source, without loading them: the GGUF digest, else the
    model folder's weight files and config.json, else (hub ids) the commit that pins them."""
    if src.digest:
        return src.digest
    folder = Path(src.path)
    if not folder.is_dir():
        return f"spec:{src.spec}"
    files = [p for p in sorted(folder.iterdir())
             if p.is_file() and (p.suffix in (".safetensors", ".bin") or p.name == "config.json")]
    return zoo.sha256_files(files)


def model_digest(model: LoadedModel) -> str:
    """``source_digest`` of a loaded model's source (computed once and kept on the model)."""
    if model.weights_digest is None:
        model.weights_digest = source_digest(model.source)
    return model.weights_digest


def model_provenance(model: LoadedModel) -> dict:
    """What computed a result, for its metadata: the model and its weights' digest, dtype, the
    attention backend (``auto`` runs the fused kernel in every layer whose pattern nothing reads;
    ``attention_eager_layers`` names the layers that cannot run it at all, with the reason), and
    the package versions (docs/methods.md §10)."""
    eager = {} if model.attention == "eager" else {str(L): why for L, why in enumerate(blockers(model)) if why}
    return {"model": model.source.spec, "model_digest": model_digest(model), "architecture": model.geometry.arch.name,
            "dtype": str(model.dtype).removeprefix("torch."), "attention": model.attention,
            "attention_eager_layers": eager, "versions": package_versions()}


def spec_digest(spec: str | os.PathLike, revision: str | None = None) -> str:
    """The weights' digest of a model spec without loading them (``source_digest``; a zoo
    model's is the digest its file is verified against: nothing is downloaded)."""
    if str(spec) in zoo.ZOO:
        return zoo.ZOO[str(spec)].sha256
    return source_digest(resolve_source(spec, revision))


def dtype_name(dtype: str | torch.dtype, device: str = "cpu") -> str:
    """The dtype a load with ``dtype`` gives on ``device`` ("auto" resolved), e.g. "bfloat16"."""
    return str(resolve_dtype(dtype, device)).removeprefix("torch.")


def load_model(spec, dtype: str | torch.dtype = "float32", device: str = "cpu", *,
               device_map: str | dict | None = None, max_memory: dict | None = None,
               offload_folder: str | os.PathLike | None = None, revision: str | None = None,
               attention: str = "auto") -> LoadedModel:
    """Load ``spec`` (zoo name, .gguf, HF directory or hub id) onto the TransformerLens bridge.

    ``device_map`` (with ``max_memory``, ``offload_folder``) places the layers with accelerate
    instead of moving the whole model to ``device``: across GPUs, or partly in CPU RAM or on
    disk; everything but surgery runs unchanged on such a model. ``revision`` pins a hub id
    (branch, tag or commit; resolved to its commit, recorded in the model's digest).
    ``attention``: the attention backend (``lens_heads.models.attention``: auto, fused, eager); the
    model's ``attention`` attribute, which can be changed later. On the CPU it tunes the process'
    malloc once (``lens_heads.models.allocator``; ``LENS_HEADS_KEEP_FREED_MEMORY=0`` turns that off)."""
    check_choice(attention)
    device = check_device(device)
    torch_dtype = resolve_dtype(dtype, device)
    source = resolve_source(spec, revision)
    placement = Placement(device, device_map, max_memory, None if offload_folder is None else str(offload_folder))
    if torch.device(device).type == "cpu" or device_map is not None:
        allocator.keep_freed_memory()  # activations reuse freed heap, not fresh pages: same results, faster
    model, tokenizer = load_hf(source, torch_dtype, device, placement)
    if device_map is not None:
        device = _embedding_device(model)
    loaded = boot(model, tokenizer, source, torch_dtype, device)
    loaded.attention = attention
    check_model(loaded, attention)  # 'fused' on a model that cannot run it: one message, before any work
    return loaded


def _embedding_device(model: PreTrainedModel) -> str:
    """Where a placed model's inputs go: its input embedding's device (CPU for disk offload)."""
    w = model.get_input_embeddings().weight
    return "cpu" if w.device.type == "meta" else str(w.device)
