"""Arguments shared by several subcommands."""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import TYPE_CHECKING
from lens_heads.data.corpora import default_corpus
from lens_heads.models import attention
from lens_heads.errors import LensHeadsError
from lens_heads.files.atomic import atomic_write_text
from lens_heads.models.load import check_revision, model_provenance, peek_geometry
from lens_heads.evaluation.protocol import BOS_CHOICES, resolve_protocol
from lens_heads.interventions.thresholds import THRESHOLD_RULES
from lens_heads import models

if TYPE_CHECKING:
    from lens_heads.models.load import LoadedModel


def add_model_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("model", help="zoo name (smollm2-135m, qwen2.5-coder-0.5b, gemma-3-270m), "
                                 ".gguf file, HF model folder or hub id")
    p.add_argument("--dtype", default="float32",
                   help="float32 (default), bfloat16, or auto (bfloat16 where the hardware runs it natively)")
    p.add_argument("--device", default="cpu", help="cpu (default) or cuda")
    p.add_argument("--revision", default=None, help="a hub id's branch, tag or commit (resolved to its commit, "
                                                    "recorded in results and store keys)")
    p.add_argument("--device-map", default=None,
                   help="place layers with accelerate instead of --device: auto, balanced, sequential, or a JSON "
                        "{module: device} (devices: 0, 1, cuda:0, cpu, disk)")
    p.add_argument("--max-memory", default=None, help="with --device-map: per device, e.g. 0=20GiB,1=20GiB,cpu=60GiB")
    p.add_argument("--offload-folder", default=None, help="with --device-map: where disk-offloaded weights go")
    add_attention_arg(p)


def add_attention_arg(p: argparse.ArgumentParser) -> None:
    """``--attention``: every command that loads a model has it."""
    p.add_argument("--attention", default="auto", choices=attention.CHOICES,
                   help="attention backend: auto (default: a fused kernel in every layer whose pattern nothing "
                        "reads, where the architecture allows it), fused (every layer; pattern-based scores from "
                        "the kernel's per-row statistics; refused with the reason where a layer cannot run it or "
                        "something reads its pattern), or eager (TransformerLens' own, materialising the "
                        "pattern); results agree to float rounding")


def placement_from_args(args) -> dict:
    """``load_model``'s placement keywords from ``--device-map`` / ``--max-memory`` /
    ``--offload-folder`` / ``--revision`` (checked before anything loads)."""
    import json

    device_map = getattr(args, "device_map", None)
    out = {"revision": getattr(args, "revision", None)}
    check_revision(str(args.model), out["revision"])
    if device_map is None:
        if getattr(args, "max_memory", None) or getattr(args, "offload_folder", None):
            raise LensHeadsError("--max-memory and --offload-folder go with --device-map")
        return out
    if device_map.strip().startswith("{"):
        try:
            device_map = json.loads(device_map)
        except ValueError as exc:
            raise LensHeadsError(f"--device-map: not JSON: {exc}") from None
        if not isinstance(device_map, dict) or not device_map:
            raise LensHeadsError("--device-map: a JSON object {module: device}")
    elif device_map not in ("auto", "balanced", "balanced_low_0", "sequential"):
        raise LensHeadsError(f"--device-map {device_map!r}: auto, balanced, balanced_low_0, sequential or a JSON "
                             f"{{module: device}}")
    memory = None
    if args.max_memory:
        memory = {}
        for item in args.max_memory.split(","):
            dev, _, size = item.partition("=")
            if not dev.strip() or not size.strip():
                raise LensHeadsError(f"--max-memory {args.max_memory!r}: write DEVICE=SIZE,... "
                                     "(e.g. 0=20GiB,cpu=60GiB)")
            dev = dev.strip()
            memory[int(dev) if dev.isdigit() else dev] = size.strip()
    needs_disk = device_map == "auto" or (isinstance(device_map, dict) and "disk" in map(str, device_map.values()))
    if isinstance(device_map, dict) and "disk" in map(str, device_map.values()) and not args.offload_folder:
        raise LensHeadsError("--device-map places modules on disk: give --offload-folder")
    return {**out, "device_map": device_map, "max_memory": memory,
            "offload_folder": args.offload_folder if needs_disk or args.offload_folder else None}


def config_geometry(args):
    """The model's head geometry from its config alone, before any weights load
    (``models.load.peek_geometry``): head ranges are checked against it; None where reading
    it would need the weights (then they are checked once the model is loaded)."""

    return peek_geometry(args.model, getattr(args, "revision", None))


def model_from_args(args):
    """The model the arguments name, placed as they say."""
    return models.load_model(args.model, dtype=args.dtype, device=args.device,
                             attention=getattr(args, "attention", "auto"), **placement_from_args(args))


def meta_path(out) -> Path:
    """The ``OUT.meta.json`` sidecar of an output file (what computed it)."""
    out = Path(out)
    return out.with_name(out.name + ".meta.json")


def write_meta(out, model: LoadedModel, **run) -> Path:
    """Write ``OUT.meta.json`` atomically: the model's provenance (weights digest, dtype,
    attention backend, versions) and what the run was given (``run``)."""
    meta = {**model_provenance(model), **run}
    return atomic_write_text(meta_path(out), json.dumps(meta, indent=2, default=str) + "\n")


def check_positive(args, *names: str, minimum: int = 1) -> None:
    """``--NAME >= minimum`` for each given option that is set (before anything loads)."""

    for name in names:
        value = getattr(args, name, None)
        if isinstance(value, (int, float)) and value < minimum:  # ("auto" batch sizes pass)
            raise LensHeadsError(f"--{name.replace('_', '-')} must be >= {minimum}, got {value}")


def no_texts(spec) -> "LensHeadsError":
    """The one message for data that yields no text."""

    return LensHeadsError(f"no texts in {spec!r} (empty data: an empty file, or its text field holds no strings)")


class DefaultCorpus(str):
    """A ``--data`` the user did not give: ``resolve_default_data`` turns it into ``c4`` when a
    local copy exists, else into the shipped ``c4-sample`` (lens_heads.data.corpora.default_corpus)."""


DATA_HELP = ("corpus name (c4, c4-train, wikitext2, c4-sample: 48 shipped C4 texts) or a local "
             ".txt/.jsonl/.parquet file; named corpora are read from $LENS_HEADS_DATA, else the hub")


def add_data_args(p: argparse.ArgumentParser, default: str | None = "c4", required: bool | None = None) -> None:
    p.add_argument("--data", default=None if default is None else DefaultCorpus(default),
                   required=default is None if required is None else required,
                   help=DATA_HELP + (f" (default {default}, or c4-sample without a local copy)" if default else ""))
    p.add_argument("--n-inputs", type=int, default=32, help="number of inputs (default 32)")
    p.add_argument("--max-len", type=int, default=256, help="tokens per input (default 256)")
    p.add_argument("--batch-size", default="8", help="inputs per forward, or auto (default 8)")


def parse_batch_size(text: str) -> int | str:
    """``--batch-size``: a positive integer or ``auto`` (checked with the other arguments, before
    anything loads: ``cli.main`` applies it)."""

    if str(text).strip().lower() == "auto":
        return "auto"
    try:
        value = int(text)
    except (TypeError, ValueError):
        raise LensHeadsError(f"--batch-size must be >= 1 or auto, got {text!r}") from None
    if value < 1:
        raise LensHeadsError(f"--batch-size must be >= 1 or auto, got {value}")
    return value


def add_protocol_args(p: argparse.ArgumentParser, thresholds: bool = True) -> None:
    """lm-eval's prompt settings, the threshold rule and the paper's preset
    (``lens_heads.evaluation.protocol``); ``thresholds`` adds the authors' thresholds file."""

    g = p.add_argument_group("protocol", "how prompts are built and thresholds taken; lens_heads' default "
                                         "is lm-eval 0.4.13's defaults and the quantile rule")
    g.add_argument("--paper-protocol", action="store_true",
                   help="as the paper ran it: lm-eval 0.4.5's BOS rule (Gemma only), the chat template as "
                        "multi-turn few-shot for -Instruct/-chat/-SFT/-DPO models, CDF thresholds with strict "
                        "zeroing; the options below override single settings")
    g.add_argument("--add-bos-token", choices=BOS_CHOICES, default=None,
                   help="lm-eval's add_bos_token: auto = the tokenizer's default (lm-eval 0.4.13), "
                        "true / false = encode with / without special tokens")
    g.add_argument("--apply-chat-template", action=argparse.BooleanOptionalAction, default=None,
                   help="format prompts with the tokenizer's chat template (lm-eval --apply_chat_template)")
    g.add_argument("--fewshot-as-multiturn", action=argparse.BooleanOptionalAction, default=None,
                   help="with the chat template, each shot its own user/assistant turn (lm-eval's option)")
    if thresholds:
        g.add_argument("--threshold-rule", choices=THRESHOLD_RULES, default=None,
                       help="quantile (default: order statistic, zero <= / >= tau) or cdf (the authors': "
                            "interpolated CDF, zero strictly < / > tau)")
        g.add_argument("--thresholds-file", default=None, metavar="JSON",
                       help="take thresholds from the authors' thresholds.json instead of a scoring pass "
                            "(fractions 0, 0.05, ..., 0.3); needs --thresholds-model")
        g.add_argument("--thresholds-model", default=None, metavar="ID",
                       help="the model key in --thresholds-file, e.g. Qwen/Qwen2.5-0.5B")


def check_protocol_args(args) -> None:
    """What can be checked before the model loads: the thresholds file pairs with its model key
    and is readable."""
    from pathlib import Path


    file, key = getattr(args, "thresholds_file", None), getattr(args, "thresholds_model", None)
    if (file is None) != (key is None):
        raise LensHeadsError("--thresholds-file and --thresholds-model go together")
    if file is not None and Path(file).is_dir():
        raise LensHeadsError(f"--thresholds-file {file} is a folder, not a thresholds.json file")
    if file is not None and not Path(file).is_file():
        raise LensHeadsError(f"--thresholds-file {file}: no such file")
    if args.fewshot_as_multiturn and args.apply_chat_template is False:
        raise LensHeadsError("--fewshot-as-multiturn needs the chat template (drop --no-apply-chat-template)")
    if args.fewshot_as_multiturn and not args.apply_chat_template and not args.paper_protocol:
        raise LensHeadsError("--fewshot-as-multiturn needs --apply-chat-template (as in lm-eval)")


def protocol_from_args(args, model: LoadedModel):
    """The run's ``Protocol``: the paper's preset or the default, overridden by each given option."""

    return resolve_protocol(model, paper=args.paper_protocol, add_bos_token=args.add_bos_token,
                            apply_chat_template=args.apply_chat_template,
                            fewshot_as_multiturn=args.fewshot_as_multiturn,
                            threshold_rule=getattr(args, "threshold_rule", None))


def resolve_default_data(args) -> None:
    """``--data`` left at its default: the default corpus, or its shipped sample when no local
    copy exists (said in one line on stderr); a ``--data`` the user gave stays as given."""
    if not isinstance(getattr(args, "data", None), DefaultCorpus):
        return
    import sys


    args.data, note = default_corpus(str(args.data))
    if note:
        print(f"lens-heads {args.command}: {note}", file=sys.stderr)
