"""The package's design rules, checked on its source: modules import along the wings' directions
(docs/architecture.md) and in no cycle, views import nothing that computes, no module imports from
the package root, typed identities round-trip through their one parser."""

from __future__ import annotations

import ast
import importlib.util
import math
import random
from pathlib import Path

import pytest

from lens_heads.errors import LensHeadsError
from lens_heads.sweep import PointId

PACKAGE = Path(__file__).resolve().parent.parent / "lens_heads"
COMPUTING = ("lens_heads.models", "lens_heads.forward", "lens_heads.scores", "lens_heads.interventions.ablation",
             "lens_heads.interventions.thresholds", "lens_heads.evaluation", "lens_heads.surgery", "lens_heads.sweep",
             "lens_heads.viz.study")


def _imports(path: Path, skip_type_checking: bool = True) -> list[str]:
    """Every module ``path`` imports (at any depth), leaving out ``if TYPE_CHECKING:`` blocks."""
    tree = ast.parse(path.read_text())
    skipped = set()
    if skip_type_checking:
        for node in ast.walk(tree):
            if isinstance(node, ast.If) and getattr(node.test, "id", None) == "TYPE_CHECKING":
                skipped |= {id(n) for child in node.body for n in ast.walk(child)}
    out = []
    for node in ast.walk(tree):
        if id(node) in skipped:
            continue
        if isinstance(node, ast.Import):
            out += [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0:
            # ``from lens_heads.sweep import run`` imports the module lens_heads.sweep.run
            subs = [f"{node.module}.{a.name}" for a in node.names if _is_module(f"{node.module}.{a.name}")]
            out += subs if len(subs) == len(node.names) else [node.module or ""] + subs
    return out


def _is_module(name: str) -> bool:
    path = PACKAGE.parent.joinpath(*name.split("."))
    return path.with_suffix(".py").is_file() or (path / "__init__.py").is_file()


def test_the_report_imports_nothing_that_computes():
    imported = _imports(PACKAGE / "viz" / "report.py")
    assert "lens_heads.viz" in imported  # the test reads the real imports
    reads = {"lens_heads.surgery.head_classes"}  # the names of the head classes, no computation
    assert [m for m in imported if m.startswith(COMPUTING) and m not in reads] == []


@pytest.mark.parametrize("view", sorted(p.name for p in (PACKAGE / "viz").glob("*.py") if p.name != "study.py"))
def test_the_views_import_nothing_that_computes(view):
    """viz/ renders captured patterns and stored results; the model runs in forward/activations.py.
    study.py, the wing's one orchestrator, gathers what the report shows (reading or computing it)."""
    imported = _imports(PACKAGE / "viz" / view)
    assert imported  # the test reads the real imports
    reads = {"lens_heads.scores.functions",  # the score registry: which way is inactive, no computation
             "lens_heads.surgery.head_classes"}  # the names of the head classes
    assert [m for m in imported if (m.startswith(COMPUTING) or m == "torch") and m not in reads] == []


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(PACKAGE.parent).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def import_graph() -> dict[str, set[str]]:
    """module -> the package modules it imports, at module level or inside functions (only
    ``if TYPE_CHECKING:`` blocks left out). ``from P import name`` counts as importing
    ``P.name`` when that is a module; importing ``P.Q.R`` also runs the packages ``P.Q``
    (``__init__``), an edge unless the importer sits inside that package itself."""
    modules = {_module_name(p): p for p in PACKAGE.rglob("*.py")}
    graph: dict[str, set[str]] = {}
    for name, path in modules.items():
        tree = ast.parse(path.read_text())
        skipped = {id(n) for node in ast.walk(tree) if isinstance(node, ast.If)
                   and getattr(node.test, "id", None) == "TYPE_CHECKING" for child in node.body for n in ast.walk(child)}
        targets = set()
        for node in ast.walk(tree):
            if id(node) in skipped:
                continue
            if isinstance(node, ast.Import):
                targets |= {a.name for a in node.names}
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    pkg = name.split(".") if path.name == "__init__.py" else name.split(".")[:-1]
                    base = ".".join(pkg[:len(pkg) - node.level + 1] + ([node.module] if node.module else []))
                targets |= {f"{base}.{a.name}" if f"{base}.{a.name}" in modules else base for a in node.names}
        edges = set()
        for t in targets & modules.keys():
            parts = t.split(".")
            edges |= {".".join(parts[:i]) for i in range(2, len(parts)) if ".".join(parts[:i]) in modules
                      and not (name + ".").startswith(".".join(parts[:i]) + ".")}
            edges.add(t)
        graph[name] = edges - {name}
    return graph


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan's algorithm)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    out: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        for w in sorted(graph[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return out


def test_the_package_has_no_import_cycle():
    """No module reaches itself through imports, in-function ones included (docs/architecture.md)."""
    graph = import_graph()
    assert "lens_heads.forward.engine" in graph["lens_heads.evaluation.evaluate"]  # the test reads the real imports
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]  # and finds one
    assert cycles(graph) == []


def architecture_wings() -> list[tuple[int, str, list[str]]]:
    """(floor, wing, its top-level names under lens_heads/) from docs/architecture.md's table, one
    row per wing: a package (``files/``), the root modules (``errors``, ...) or ``__init__``."""
    import re

    text = (PACKAGE.parent / "docs" / "architecture.md").read_text()
    wings = []
    for line in text.splitlines():
        m = re.match(r"^\| (\d+) \| ([^|]+) \| [^|]+ \|$", line)
        if m:
            names = re.findall(r"`([^`]+)`", m.group(2))
            wing = names[0] if len(names) == 1 else "the root modules"
            wings.append((int(m.group(1)), wing, ["" if n == "__init__" else n.rstrip("/") for n in names]))
    return wings


def wing_check(graph: dict[str, set[str]], wings: list[tuple[int, str, list[str]]]) -> list[str]:
    """Each import of ``graph`` that leaves its wing for one on the same floor or above, as
    'module (wing, floor N) imports module (wing, floor M)'."""
    where = {name: i for i, (_, _, names) in enumerate(wings) for name in names}

    def wing_of(module: str) -> int:
        top = module.removeprefix("lens_heads").removeprefix(".").split(".")[0]
        assert top in where, f"{module} is in no wing of docs/architecture.md"
        return where[top]

    def label(i: int) -> str:
        return f"{wings[i][1]}, floor {wings[i][0]}"

    return [f"{m} ({label(wing_of(m))}) imports {t} ({label(wing_of(t))})"
            for m, targets in sorted(graph.items()) for t in sorted(targets)
            if wing_of(t) != wing_of(m) and wings[wing_of(t)][0] >= wings[wing_of(m)][0]]


def test_imports_follow_the_wings():
    """docs/architecture.md's table puts every top-level module and package of lens_heads in one
    wing on one floor; a module imports only its own wing and wings on lower floors (in-function
    imports included), so the folder tree is the data flow's diagram."""
    wings = architecture_wings()
    floors = {wing: floor for floor, wing, _ in wings}
    named = [n for _, _, names in wings for n in names]
    assert len(named) == len(set(named)), "a module is named in two wings"
    tree = {p.stem if p.suffix == ".py" else p.name for p in PACKAGE.iterdir()
            if p.suffix == ".py" or (p / "__init__.py").is_file()}
    assert tree == {n or "__init__" for n in named}, "docs/architecture.md's wings and lens_heads/ differ"
    # the data flow, bottom to top
    flow = ["files/", "models/", "forward/", "scores/", "interventions/", "evaluation/", "results/", "sweep/",
            "viz/", "explore/", "cli/", "__init__"]
    assert all(floors[low] < floors[high] for low, high in zip(flow, flow[1:]))
    assert floors["the root modules"] == 0 and floors["data/"] == floors["files/"] and floors["surgery/"] == floors["evaluation/"]
    graph = import_graph()
    assert wing_check({"lens_heads.files.atomic": {"lens_heads.forward.engine"}}, wings)  # and finds one
    against = wing_check(graph, wings)
    assert against == [], "imports against the wings' direction (docs/architecture.md):\n" + "\n".join(against)


def test_the_root_holds_the_api_and_what_every_wing_shares():
    """lens_heads/ holds the public API and the floor-0 modules as files (six at most); every
    other module lives in a wing."""
    files = sorted(p.stem for p in PACKAGE.glob("*.py"))
    root = next(names for floor, _, names in architecture_wings() if floor == 0)
    assert len(files) <= 6 and files == sorted(["__init__", *root])


def test_every_wing_says_its_role():
    """Each wing's __init__.py opens with a docstring: what the wing does, what it may import, what
    imports it."""
    silent = []
    for init in sorted(PACKAGE.glob("*/__init__.py")):
        doc = " ".join((ast.get_docstring(ast.parse(init.read_text())) or "").split())
        if not ("May import:" in doc and "Imported by:" in doc):
            silent.append(init.parent.name)
    assert silent == []


def test_every_name_imported_from_the_package_exists():
    """Each ``from lens_heads.X import name`` in the package -- in-function ones too, which only
    fail when called -- names something X has (a module moved or a name renamed shows here)."""
    import importlib

    missing = []
    for path in PACKAGE.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and node.level == 0 and (node.module or "").startswith("lens_heads"):
                module = importlib.import_module(node.module)
                for alias in node.names:
                    if not hasattr(module, alias.name) and importlib.util.find_spec(
                            f"{node.module}.{alias.name}") is None:
                        missing.append(f"{path.relative_to(PACKAGE.parent)}:{node.lineno} {node.module}.{alias.name}")
    assert missing == []


def test_every_model_parameter_says_what_model_it_is():
    """A parameter named ``model`` is annotated (``LoadedModel``, or transformers'
    ``PreTrainedModel`` where a plain HF model is meant), so a reader never guesses which."""
    bare = [f"{p.relative_to(PACKAGE.parent)}:{node.lineno} {node.name}"
            for p in PACKAGE.rglob("*.py") if p.name != "pruned_model.py"  # remote code: no lens_heads types
            for node in ast.walk(ast.parse(p.read_text())) if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef))
            for a in node.args.args + node.args.kwonlyargs if a.arg == "model" and a.annotation is None]
    assert bare == []


def test_no_module_imports_from_the_package_root():
    offenders = [(str(p.relative_to(PACKAGE)), m) for p in PACKAGE.rglob("*.py") if p.name != "__init__.py"
                 or p.parent != PACKAGE for m in _imports(p, skip_type_checking=False) if m == "lens_heads"]
    assert offenders == []


def test_point_ids_round_trip_through_their_one_parser():
    rnd = random.Random(0)
    for _ in range(500):
        fn = rnd.choice(["ahon_ln", "awft", "random", "lthon_ln_text"])
        fraction = rnd.choice([rnd.random(), 0.05, 0.1, 0.3, 1.0, rnd.random() * 1e-4])
        pid = PointId(fn, fraction, rnd.randint(0, 99) if fn == "random" else None)
        again = PointId.parse(str(pid))
        assert str(again) == str(pid) and again.score_fn == fn and again.seed == pid.seed
        assert math.isclose(again.fraction, float(f"{fraction:g}"))
    extra = PointId.parse("static:0.1,1.2", extras=["static:0.1,1.2"])
    assert extra.extra == "static:0.1,1.2" and str(extra) == "static:0.1,1.2"
    for bad in ("ahon_ln", "ahon_ln@x", "random@0.1", "ahon_ln@0.1@2", "random@0.1@x"):
        with pytest.raises(LensHeadsError, match="ID@FRACTION, random@FRACTION@SEED, static:ID"):
            PointId.parse(bad)


def test_store_keys_are_built_in_one_place():
    """No module but keys.py writes a key's ``kind`` field or hashes a configuration itself."""
    offenders = []
    for p in PACKAGE.rglob("*.py"):
        if p.name in ("keys.py",):
            continue
        text = p.read_text()
        if '"kind": "point"' in text or '"kind": "thresholds"' in text or "def config_key" in text:
            offenders.append(str(p.relative_to(PACKAGE)))
    assert offenders == []


def test_the_readme_layout_table_matches_the_tree():
    """Every module and subpackage of lens_heads/ is named in the README's layout table, and
    every path the table names exists."""
    import re

    readme = (PACKAGE.parent / "README.md").read_text()
    table = readme.split("## Layout", 1)[1].split("\n## ", 1)[0]
    rows = [line for line in table.splitlines() if line.startswith("| `lens_heads/")]
    named: set[str] = set()
    for row in rows:
        first = row.split("|")[1]
        paths = re.findall(r"`([^`]+)`", first)
        folder = ""
        for i, path in enumerate(paths):
            if i == 0:
                folder = path.rsplit("/", 1)[0] if not path.endswith("/") else path.rstrip("/").rsplit("/", 1)[0]
                full = path
            else:
                full = f"{folder}/{path}"
            assert (PACKAGE.parent / full.rstrip("/")).exists(), full
            named.add(full.rstrip("/").removeprefix("lens_heads/"))
    tree = {p.name for p in PACKAGE.iterdir() if not p.name.startswith(("__", ".")) and p.name != "demo_data"
            and (p.suffix == ".py" or p.is_dir())}
    assert tree - named == set(), f"modules missing from the README layout: {sorted(tree - named)}"


def test_every_name_keyed_registry_is_one_registry_idiom():
    """Scores, tasks, ablation kinds, corpora, executors and architectures are each a Registry:
    an entry is added once, and a lookup that misses names the valid entries and a close one."""
    from lens_heads.data.corpora import CORPORA
    from lens_heads.data.tasks import TASKS
    from lens_heads.interventions.specs import SPEC_KINDS
    from lens_heads.models.geometry import ARCHITECTURES
    from lens_heads.registry import Registry
    from lens_heads.scores.functions import SCORES
    from lens_heads.sweep.executors import EXECUTORS

    for reg in (SCORES, TASKS, SPEC_KINDS, CORPORA, EXECUTORS, ARCHITECTURES):
        assert isinstance(reg, Registry) and len(reg) >= 3, reg.what
    assert SCORES.lookup("awft") is SCORES["awft"]
    with pytest.raises(LensHeadsError, match=r"unknown executor 'rayy'; valid: local, ray, slurm. Did you mean 'ray'\?"):
        EXECUTORS.lookup("rayy")
    with pytest.raises(LensHeadsError, match="corpus 'c4' is already registered"):
        CORPORA.register("c4", CORPORA["c4"])
    local = Registry("thing", {"a": 1})
    assert local.register("a", 2, overwrite=True) == 2 and local["a"] == 2


def test_scores_declare_their_needs_and_no_module_special_cases_one():
    """What a score needs is its registry entry's (level, task, gradient, shardable, replacement);
    keys, executors, config checks and the CLI read those flags, so attribution patching is
    named only in its own module (and the registry entry there)."""
    import re

    from lens_heads.scores.functions import SCORES, input_level, question_level

    named = sorted(str(p.relative_to(PACKAGE)) for p in PACKAGE.rglob("*.py")
                   if re.search(r"\batp\b", p.read_text(), re.IGNORECASE))
    assert named == ["scores/attribution.py"]
    atp = SCORES["atp"]
    assert (atp.level, atp.needs_task, atp.gradient, atp.shardable, atp.replacements) == \
        ("question", True, True, False, ("zero", "mean"))
    assert question_level(list(SCORES)) == ["atp"] and "atp" not in input_level()
    assert all(not SCORES[s].needs_task and SCORES[s].shardable for s in input_level())


def test_every_forward_goes_through_the_engine():
    """Evaluation, perplexity, the lm-eval adapter, scores, diagnosis, patterns, head means and
    attribution patching all run ``engine.forward``: only the engine calls ``hooks.run_with_hooks``
    (where attention backends plug in), and nothing calls the bridge's own forward."""
    import re

    callers = sorted(str(p.relative_to(PACKAGE)) for p in PACKAGE.rglob("*.py") if p.name != "hooks.py"
                     and re.search(r"\brun_with_hooks\(", p.read_text()))
    assert callers == ["forward/engine.py"]
    direct = sorted(str(p.relative_to(PACKAGE)) for p in PACKAGE.rglob("*.py") if p.name != "hooks.py"
                    and re.search(r"\.bridge(\.run_with_hooks)?\(", p.read_text()))
    assert direct == []


def test_project_imports_sit_at_the_top_but_for_optional_lm_eval():
    """Project imports sit at the top of their modules (docs/architecture.md). The only ones inside
    a function keep lm-eval optional, and say so; a seam a test replaces (``load_model``,
    ``score_heads``, ``evaluate_task``, ...) is reached through its home module
    (``models.load_model``), so a replacement there is seen by every caller."""
    inside = []
    for p in PACKAGE.rglob("*.py"):
        lines = p.read_text().splitlines()
        for f in ast.walk(ast.parse(p.read_text())):
            if isinstance(f, (ast.FunctionDef, ast.AsyncFunctionDef)):
                for n in ast.walk(f):
                    names = ([n.module or ""] if isinstance(n, ast.ImportFrom) and n.level == 0
                             else [a.name for a in n.names] if isinstance(n, ast.Import) else [])
                    if any(m.startswith("lens_heads") for m in names):
                        inside.append((f"{p.relative_to(PACKAGE)}:{n.lineno}", lines[n.end_lineno - 1]))
    assert inside, "the lm-eval adapter is imported when used: this test must see it"
    assert [at for at, line in inside if "lm-eval is optional" not in line] == []
    assert {line.split(" import ")[0].strip() for _, line in inside} == {"from lens_heads.evaluation.lm_eval_model"}
