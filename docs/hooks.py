"""MkDocs hooks that make the site from what the repository already holds (``mkdocs.yml``).

- ``index.md`` is the README, its links into ``docs/`` made relative to the site and its links to
  other files of the repository written as plain paths (the site holds only ``docs/``);
- ``examples/*.ipynb`` (built by ``examples/build.py``, outputs included) become pages under
  ``examples/``, rendered by mkdocs-jupyter;
- ``reference.md`` is generated from ``lens_heads.__all__``: one mkdocstrings entry per public
  name, grouped by the step of the data flow it belongs to. A public name without a docstring
  stops the build (``missing_docstrings``), as a broken link does in strict mode.
"""

from __future__ import annotations

import re
from pathlib import Path

from mkdocs.exceptions import PluginError
from mkdocs.plugins import event_priority
from mkdocs.structure.files import File, Files

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = "lens_heads"

# The reference page's sections, in the order of the data flow; a public name not listed lands
# in "Other" (never dropped).
GROUPS = {
    "Models": ["load_model", "LoadedModel", "HeadGeometry", "ZOO", "ARCHITECTURES"],
    "Scores": ["SCORES", "score_heads", "HeadScores"],
    "Ablations": ["parse_ablation", "StaticAblation"],
    "Evaluation": ["evaluate_task", "Protocol", "paper_protocol", "load_authors_thresholds", "LensHeadsLM"],
    "Sweeps": ["SweepConfig", "run_sweep", "SweepResult", "tabulate"],
    "Diagnosis and surgery": ["diagnose", "repair", "TargetSelector", "HealthyPick", "RepairConfig", "TrainConfig",
                              "RepairReport", "ProbeSet", "measure_run", "drift_tables"],
    "Views": ["head_patterns", "HeadPatterns", "attention_heads", "build_report", "ReportConfig", "ModelRef", "explore"],
    "Errors": ["LensHeadsError"],
}

LINK = re.compile(r"(!?\[[^\]]*\])\(([^)\s]+)\)")


def public_names(package: str = PACKAGE) -> list[str]:
    """``package.__all__``, read without importing the package (griffe's static view)."""
    import griffe

    pkg = griffe.load(package, search_paths=[str(ROOT)], resolve_aliases=False)
    names = pkg.exports
    if not names:
        raise PluginError(f"{package} declares no __all__")
    return [str(n) for n in names]


def reference_paths(package: str = PACKAGE, search_paths: list[str] | None = None) -> dict[str, str]:
    """Each public name's defining path (``lens_heads.surgery.repair.repair``), for mkdocstrings.

    A function or class is found where it was defined (``__module__.__qualname__``: a package
    that re-exports ``repair`` beside its submodule ``repair`` would otherwise point at the
    module); any other value (a registry, a dict) where the package's imports lead (griffe)."""
    import importlib
    import sys

    import griffe

    roots = search_paths or [str(ROOT)]
    saved = list(sys.path)
    sys.path[:0] = [p for p in roots if p not in sys.path]
    try:
        module = importlib.import_module(package)
    finally:
        sys.path[:] = saved
    loader = griffe.GriffeLoader(search_paths=roots)
    pkg = loader.load(package)
    loader.resolve_aliases(implicit=False, external=False)
    out = {}
    for name in (str(n) for n in (pkg.exports or [])):
        value = getattr(module, name)
        if isinstance(value, type) or callable(value) and hasattr(value, "__qualname__"):
            out[name] = f"{value.__module__}.{value.__qualname__}"
        else:
            obj = pkg.members[name]
            out[name] = obj.final_target.path if obj.is_alias else obj.path
    return out


def missing_docstrings(package: str = PACKAGE, search_paths: list[str] | None = None) -> list[str]:
    """Public names whose object has no docstring of its own (a dataclass's generated
    ``Name(field, ...)`` signature and a dict's type docstring do not count)."""
    import griffe

    paths = reference_paths(package, search_paths)
    loader = griffe.GriffeLoader(search_paths=search_paths or [str(ROOT)])
    loader.load(package)
    for target in {p.split(".")[0] for p in paths.values()} - {package}:
        loader.load(target)
    missing = []
    for name, path in paths.items():
        try:
            obj = loader.modules_collection.get_member(path)
        except KeyError:
            missing.append(name)
            continue
        if obj.docstring is None or not obj.docstring.value.strip():
            missing.append(name)
    return missing


def fix_links(text: str) -> str:
    """Markdown written for the repository, made right for a site built from ``docs/``: a link
    into ``docs/`` becomes relative to the site, a link to another file of the repository its
    plain path (the site does not hold it); URLs, anchors and links to nothing stay as they are
    (strict mode reports the last)."""

    def fix(m: re.Match) -> str:
        label, target = m.group(1), m.group(2)
        if re.match(r"^[a-z]+:|^#", target):
            return m.group(0)
        path, _, anchor = target.partition("#")
        if path.startswith("docs/"):
            return f"{label}({path.removeprefix('docs/')}{'#' + anchor if anchor else ''})"
        if path and (ROOT / path).exists():
            return f"{label.lstrip('!')[1:-1]} (`{path}`)"
        return m.group(0)

    return LINK.sub(fix, text)


def readme_page() -> str:
    """The home page: the README, its links fixed (``fix_links``)."""
    return fix_links((ROOT / "README.md").read_text(encoding="utf-8"))


@event_priority(100)  # before mkdocs-jupyter claims the notebooks
def on_files(files: Files, config) -> Files:
    files.append(File.generated(config, "index.md", content=readme_page()))
    for nb in sorted((ROOT / "examples").glob("[0-9][0-9]_*.ipynb")):
        # a file of the repository (src_dir: its root), not a generated one: mkdocs-jupyter reads it by path
        files.append(File(f"examples/{nb.name}", str(ROOT), config.site_dir, config.use_directory_urls))
    missing = missing_docstrings()
    if missing:
        raise PluginError(f"public names of {PACKAGE} without a docstring: {', '.join(missing)}")
    paths = reference_paths()
    listed = [n for names in GROUPS.values() for n in names]
    groups = {title: [n for n in names if n in paths] for title, names in GROUPS.items()}
    other = [n for n in paths if n not in listed]
    if other:
        groups["Other"] = other
    lines = ["# API reference", "",
             f"Every public name of `{PACKAGE}` (its `__all__`), grouped by the step of the data flow it "
             "belongs to; each entry is the name's own docstring. The methods they cite are in "
             "[Methods](methods.md).", ""]
    for title, names in groups.items():
        if not names:
            continue
        lines += [f"## {title}", ""]
        for name in names:
            lines += [f"::: {paths[name]}", "    options:", f"      heading: \"{PACKAGE}.{name}\"",
                      "      show_root_heading: true", "      show_root_full_path: false", ""]
    files.append(File.generated(config, "reference.md", content="\n".join(lines)))
    return files
