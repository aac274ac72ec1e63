"""Shared plumbing for the scripts in ``analyses/``: arguments, result folders, atomic
writers, model labels and the auto-generated ``summary.md`` (exact command, versions, wall time).

Every script follows the same shape::

    run = Run.start(args, out)            # remembers the command line and the start time
    ...                                   # work, each result written atomically
    run.write_summary(title, sections)    # OUT/summary.md: command, versions, wall time, sections

The scripts are run as ``python analyses/NAME.py`` (this folder is then on ``sys.path``);
tests import them with this folder put on ``sys.path`` first.
"""

from __future__ import annotations

import argparse
import math
import os
import platform
import shlex
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterable, Sequence

from lens_heads.files.atomic import atomic_path, atomic_write_csv, atomic_write_text
from lens_heads.errors import LensHeadsError
from lens_heads.files.provenance import package_versions

ZOO_MODELS = "smollm2-135m,qwen2.5-coder-0.5b,gemma-3-270m"


# -----------------------------------------------------------------------------
# Arguments


def base_parser(description: str, default_out: str) -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=description, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--models", default=ZOO_MODELS,
                   help=f"comma list of zoo names, HF model folders or .gguf files (default {ZOO_MODELS})")
    p.add_argument("--out", default=default_out, help=f"output folder (default {default_out})")
    p.add_argument("--device", default="cpu", help="cpu (default) or cuda")
    p.add_argument("--dtype", default="auto",
                   help="auto (default: bfloat16 where the device runs it natively, else float32), float32, bfloat16")
    p.add_argument("--batch-size", type=int, default=8)
    return p


def split_list(text: str, what: str) -> list[str]:
    """``"a, b,,c"`` -> ["a", "b", "c"] (order kept, duplicates dropped); empty is an error."""
    items = list(dict.fromkeys(s.strip() for s in str(text).split(",") if s.strip()))
    if not items:
        raise LensHeadsError(f"no {what} given")
    return items


def split_tasks(text: str) -> list[str]:
    """Comma list of task names / ``file:`` specs; commas inside a ``file:`` spec (``choices=a,b``)
    stay with it: a piece that starts neither a known task name nor ``file:`` joins the previous one."""
    from lens_heads.data import TASKS

    out: list[str] = []
    for piece in str(text).split(","):
        name = piece.strip()
        if out and out[-1].startswith("file:") and name not in TASKS and not name.startswith("file:"):
            out[-1] += "," + piece
        elif name:
            out.append(name)
    if not out:
        raise LensHeadsError("no tasks given")
    return list(dict.fromkeys(out))


def check_positive(args, *names: str) -> None:
    for name in names:
        value = getattr(args, name)
        if value is not None and value < 1:
            raise LensHeadsError(f"--{name.replace('_', '-')} must be >= 1, got {value}")


def model_label(spec: str) -> str:
    """A short, file-name-safe label: the zoo name, or the folder / file name of a path."""
    p = Path(spec)
    name = p.stem if p.suffix == ".gguf" else p.name if (os.sep in spec or p.exists()) else spec
    return "".join(c if c.isalnum() or c in "-_." else "_" for c in name) or "model"


def out_folder(path: str | os.PathLike) -> Path:
    out = Path(path)
    if out.exists() and not out.is_dir():
        raise LensHeadsError(f"--out {out} exists and is not a folder")
    out.mkdir(parents=True, exist_ok=True)
    return out


# -----------------------------------------------------------------------------
# Atomic writers


def write_csv(frame, path: str | os.PathLike, **to_csv) -> Path:
    return atomic_write_csv(frame, path, make_parents=True, **to_csv)


def write_figure(fig, path: str | os.PathLike, dpi: int = 120) -> Path:
    with atomic_path(path, make_parents=True) as tmp:
        fig.savefig(tmp, format=Path(path).suffix.lstrip(".") or "png", dpi=dpi)
    return Path(path)


def fmt(x, digits: int = 3) -> str:
    """A number for a markdown table: blank for None/NaN, else ``digits`` significant-ish decimals."""
    if x is None:
        return ""
    if isinstance(x, float):
        if math.isnan(x):
            return ""
        if x.is_integer() and abs(x) >= 1:
            return str(int(x))
        return f"{x:.{digits}f}"
    return str(x)


def markdown_table(frame, digits: int = 3, columns: Sequence[str] | None = None) -> str:
    """A plain markdown table (no tabulate dependency)."""
    cols = list(columns) if columns is not None else list(frame.columns)
    lines = ["| " + " | ".join(cols) + " |", "|" + "|".join("---" for _ in cols) + "|"]
    for row in frame[cols].itertuples(index=False):
        lines.append("| " + " | ".join(fmt(v, digits) for v in row) + " |")
    return "\n".join(lines)


# -----------------------------------------------------------------------------
# Provenance and the summary file


def hardware(device: str) -> str:
    import torch

    cpu = platform.processor() or platform.machine()
    text = f"{os.cpu_count()} CPU cores ({cpu}), torch threads {torch.get_num_threads()}"
    if str(device).startswith("cuda") and torch.cuda.is_available():
        text += f"; GPU {torch.cuda.get_device_name(0)}"
    return text


@dataclass
class Run:
    """One invocation of a script: its command, start time and output folder."""

    out: Path
    device: str
    command: str
    t0: float
    notes: list[str] = field(default_factory=list)

    @classmethod
    def start(cls, out: Path, device: str, script: str, argv: Sequence[str] | None) -> "Run":
        """``script``: the script's ``__file__``; ``argv``: its arguments (None: ``sys.argv[1:]``)."""
        args = list(sys.argv[1:] if argv is None else argv)
        env = " ".join(f"{k}={os.environ[k]}" for k in ("HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE", "OMP_NUM_THREADS")
                       if k in os.environ)
        cmd = shlex.join(["python", f"analyses/{Path(script).name}", *args])
        return cls(out, device, (env + " " if env else "") + cmd, time.time())

    def elapsed(self) -> float:
        return time.time() - self.t0

    def keep_section(self, key: str, title: str, text: str) -> None:
        """Store one part's section under OUT/sections/<key>.md, stamped with the command that
        measured it, so that a later run of *other* parts still shows it (``kept_sections``)."""
        stamp = f"_Measured by `{self.command}` (finished {time.strftime('%Y-%m-%d %H:%M %Z')}, {self.elapsed():.0f} s in)._"
        body = f"{stamp}\n\n{text.rstrip()}\n"
        atomic_write_text(self.out / "sections" / f"{key}.md", f"{title}\n{body}", make_parents=True)

    def kept_sections(self, keys: Sequence[str]) -> list[tuple[str, str]]:
        """The stored sections of ``keys`` that exist, in that order (see ``keep_section``)."""
        out = []
        for key in keys:
            path = self.out / "sections" / f"{key}.md"
            if path.is_file():
                title, _, body = path.read_text(encoding="utf-8").partition("\n")
                out.append((title, body))
        return out

    #: The summary's rows that record where and how a run happened (the command, versions, machine,
    #: times), not what it measured: a rebuild from the store on another machine changes only these.
    PROVENANCE_ROWS = ("command", "lens_heads", "versions", "hardware", "wall time", "finished")

    def write_summary(self, title: str, sections: Iterable[tuple[str, str]]) -> Path:
        v = package_versions(("lens_heads", "transformer_lens", "transformers", "torch", "numpy", "pandas", "scipy"))
        head = [f"# {title}", "",
                "_Generated by the script from the numbers it measured; do not edit by hand._", "",
                "| | |", "|---|---|",
                f"| command | `{self.command}` |",
                f"| lens_heads | {v['lens_heads']} |",
                "| versions | " + ", ".join(f"{k} {x}" for k, x in v.items() if k != "lens_heads") + " |",
                f"| hardware | {hardware(self.device)} |",
                f"| wall time | {self.elapsed():.0f} s ({self.elapsed() / 60:.1f} min) |",
                f"| finished | {time.strftime('%Y-%m-%d %H:%M:%S %Z')} |", ""]
        body = []
        for name, text in sections:
            body += [f"## {name}", "", text.rstrip(), ""]
        return atomic_write_text(self.out / "summary.md", "\n".join(head + body) + "\n", make_parents=True)


def script_main(main) -> None:
    """Run ``main()`` as a command: a LensHeadsError becomes one line on stderr and exit code 2."""
    try:
        sys.exit(main())
    except LensHeadsError as exc:
        print(f"error: {exc}", file=sys.stderr)
        sys.exit(2)
