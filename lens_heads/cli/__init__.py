"""``lens-heads`` command line: argument parsing that calls the public API, nothing else.

Each subcommand lives in its own module here and exposes ``register(subparsers)``, which
adds its parser and sets ``func`` to a function taking the parsed arguments. A
``LensHeadsError`` anywhere becomes one clear message on stderr and exit status 2.

Floor 11 of docs/architecture.md. May import: every wing, but not the package root (the public
API). Imported by: nothing of the package: ``lens-heads`` (pyproject's script) runs ``main``.
"""

from __future__ import annotations

import argparse
import importlib
import sys

from lens_heads.cli.common import parse_batch_size, placement_from_args, resolve_default_data
from lens_heads.errors import LensHeadsError

COMMANDS = ["info", "score", "evaluate", "sweep", "diagnose", "repair", "drift", "prune", "report", "demo", "lm-eval", "explore"]


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="lens-heads", description="Find, test and repair dormant attention heads.")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for name in COMMANDS:
        importlib.import_module(f"lens_heads.cli.{name.replace('-', '_')}").register(sub)
    return parser


def join_dash_values(argv: list[str]) -> list[str]:
    """``--opt -1/2`` as ``--opt=-1/2``: argparse takes a value starting with a dash and a digit
    (but for a plain negative number) for an option and answers "expected one argument"; joined,
    the option's own check gives its message. No lens-heads option is named -DIGIT."""
    import re

    out: list[str] = []
    for arg in argv:
        if (out and re.match(r"-\d", arg) and out[-1].startswith("--") and "=" not in out[-1]
                and out[-1] != "--"):
            out[-1] = f"{out[-1]}={arg}"
        else:
            out.append(arg)
    return out


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(join_dash_values(sys.argv[1:] if argv is None else list(argv)))
    try:
        if isinstance(getattr(args, "batch_size", None), str):  # "auto" or a number, before any work
            args.batch_size = parse_batch_size(args.batch_size)
        resolve_default_data(args)  # --data left at c4: the shipped sample when no local copy exists
        if hasattr(args, "device_map"):  # the model's placement flags, checked before any work
            placement_from_args(args)
        return int(args.func(args) or 0)
    except LensHeadsError as exc:
        print(f"lens-heads {args.command}: error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print(f"lens-heads {args.command}: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
