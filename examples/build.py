"""Build the example notebooks: each ``examples/NN_*.py`` (jupytext ``py:percent``) is run top to
bottom in a fresh kernel and written beside it as ``.ipynb``, outputs included.

    LENS_HEADS_DATA=../shared/data HF_HUB_OFFLINE=1 .venv/bin/python examples/build.py [NAME ...]

The ``.py`` files are the source (reviewable diffs); the ``.ipynb`` files are what a repository page
and the documentation site show. A notebook is written only when every cell ran; what the
committed outputs must not hold (machine paths, stderr noise such as warnings) is removed or
refused here, so a rebuild on another machine differs only in its numbers.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import sys
import time
from pathlib import Path

import jupytext
import nbformat
from nbclient import NotebookClient
from nbclient.exceptions import CellExecutionError

from lens_heads.files.atomic import atomic_write_text

EXAMPLES = Path(__file__).resolve().parent
CELL_TIMEOUT = 3600


def sources() -> list[Path]:
    """The notebooks' sources, in reading order."""
    return sorted(EXAMPLES.glob("[0-9][0-9]_*.py"))


def machine_paths() -> list[str]:
    """Paths of this machine an output must not show (the checkout, the home folder, temp, the
    environment, the data folder)."""
    import tempfile

    found = {str(EXAMPLES.parent), str(Path.home()), tempfile.gettempdir(), sys.prefix,
             os.environ.get("LENS_HEADS_DATA", "")}
    found |= {str(Path(p).resolve()) for p in found if p}
    return sorted((p for p in found if len(p) > 1), key=len, reverse=True)


def clean(nb: nbformat.NotebookNode) -> list[str]:
    """Drop stderr streams and per-run metadata; return the machine paths still in an output."""
    leaks = []
    paths = machine_paths()
    for cell in nb.cells:
        cell.metadata.pop("execution", None)
        if cell.cell_type != "code":
            continue
        cell.outputs = [o for o in cell.outputs if not (o.output_type == "stream" and o.name == "stderr")]
        for out in cell.outputs:
            text = out.text if out.output_type == "stream" else json.dumps(out)
            leaks += [p for p in paths if re.search(re.escape(p) + r"(?=[/\\\"' ]|$)", text)]
    return sorted(set(leaks))


def build(source: Path) -> Path:
    """Run one notebook source; write its ``.ipynb`` (atomically) only when every cell ran."""
    nb = jupytext.read(source)
    nb.metadata.pop("jupytext", None)  # the pairing is in the .py header; the .ipynb stays plain
    client = NotebookClient(nb, timeout=CELL_TIMEOUT, kernel_name="python3", resources={"metadata": {"path": str(EXAMPLES)}})
    client.execute()
    leaks = clean(nb)
    if leaks:
        raise SystemExit(f"{source.name}: an output shows a path of this machine ({', '.join(leaks)}); "
                         "print names, not paths")
    nb.metadata.pop("widgets", None)
    target = source.with_suffix(".ipynb")
    atomic_write_text(target, nbformat.writes(nb) + "\n")
    return target


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("names", nargs="*", help="notebooks to build (e.g. 01_finding_dormant_heads); default all")
    args = ap.parse_args(argv)
    chosen = sources()
    if args.names:
        known = {p.stem: p for p in chosen}
        unknown = [n for n in args.names if Path(n).stem not in known]
        if unknown:
            print(f"error: no example named {', '.join(unknown)}; choose from {', '.join(known)}", file=sys.stderr)
            return 2
        chosen = [known[Path(n).stem] for n in args.names]
    if not os.environ.get("LENS_HEADS_DATA"):
        print("note: LENS_HEADS_DATA is not set; a notebook that reads a task needs it offline", file=sys.stderr)
    for source in chosen:
        t0 = time.perf_counter()
        try:
            target = build(source)
        except CellExecutionError as exc:
            print(f"error: {source.name} failed; nothing written:\n{exc}", file=sys.stderr)
            return 1
        print(f"{target.name}: {time.perf_counter() - t0:.0f} s", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
