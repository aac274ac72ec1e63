"""The example notebooks (examples/NN_*.py, jupytext py:percent; examples/build.py builds the
.ipynb with outputs): the committed notebooks match their sources and show real SmolLM2 outputs,
and each source runs top to bottom in a fresh kernel with non-empty figures and views."""

from __future__ import annotations

import importlib.util
import json
import re
import tempfile
from pathlib import Path

import pytest

jupytext = pytest.importorskip("jupytext")
nbclient = pytest.importorskip("nbclient")

EXAMPLES = Path(__file__).resolve().parents[1] / "examples"
SOURCES = sorted(EXAMPLES.glob("[0-9][0-9]_*.py"))
SLOW = {"03_repairing_heads"}  # trains a model: runs under -m slow


def _build_module():
    spec = importlib.util.spec_from_file_location("examples_build", EXAMPLES / "build.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def _cells(nb) -> list[tuple[str, str]]:
    return [(c.cell_type, c.source.strip()) for c in nb.cells]


def _text(output) -> str:
    if output.get("output_type") == "stream":
        text = output.get("text", "")
        return "".join(text) if isinstance(text, list) else text  # a saved notebook keeps lines as a list
    return json.dumps(output.get("data", {}))


def test_three_notebooks_exist():
    assert [p.stem for p in SOURCES] == ["01_finding_dormant_heads", "02_zeroing_heads", "03_repairing_heads"]


@pytest.mark.parametrize("source", SOURCES, ids=lambda p: p.stem)
def test_committed_notebook_matches_its_source(source):
    """Editing a .py without rebuilding its .ipynb (examples/build.py) fails here."""
    built = source.with_suffix(".ipynb")
    assert built.is_file(), f"{built.name} is missing: run examples/build.py {source.stem}"
    nb = jupytext.read(built)
    assert _cells(nb) == _cells(jupytext.read(source)), f"{built.name} is stale: run examples/build.py {source.stem}"


@pytest.mark.parametrize("source", SOURCES, ids=lambda p: p.stem)
def test_committed_outputs_are_a_real_run(source):
    """Every code cell ran, in order, without error, on SmolLM2, and no output shows a machine path."""
    nb = json.loads(source.with_suffix(".ipynb").read_text(encoding="utf-8"))
    code = [c for c in nb["cells"] if c["cell_type"] == "code"]
    assert [c["execution_count"] for c in code] == list(range(1, len(code) + 1))
    outputs = [o for c in code for o in c["outputs"]]
    assert not [o for o in outputs if o["output_type"] == "error"]
    assert not [o for o in outputs if o.get("name") == "stderr"]
    text = "\n".join(_text(o) for o in outputs)
    m = re.search(r"smollm2-135m: (\d+) layers x (\d+) query heads = (\d+) heads", text)  # the real model, loaded
    assert m and int(m[1]) * int(m[2]) == int(m[3]) and int(m[3]) > 100, text[:300]
    for pattern in (r"/tmp/", r"/home/", r"/root/", r"/work/", r"site-packages"):
        assert not re.search(pattern, text), f"{source.name}: an output shows {pattern!r}"
    images = [o for o in outputs if "image/png" in o.get("data", {})]
    assert images and all(len(o["data"]["image/png"]) > 2000 for o in images)  # a drawn figure, not a blank one


def test_committed_outputs_hold_the_analysis():
    """The numbers the notebooks' text promises are in their outputs."""
    first = json.loads((EXAMPLES / "01_finding_dormant_heads.ipynb").read_text(encoding="utf-8"))
    text = "\n".join(_text(o) for c in first["cells"] if c["cell_type"] == "code" for o in c["outputs"])
    assert "CircuitsVis" in text  # the inline view, bundle included
    second = json.loads((EXAMPLES / "02_zeroing_heads.ipynb").read_text(encoding="utf-8"))
    text = "\n".join(_text(o) for c in second["cells"] if c["cell_type"] == "code" for o in c["outputs"])
    flip = re.search(r"answer (\d) -> (\d)", text)
    assert flip and flip[1] != flip[2]
    assert "max_pct_zeroed_within_1pt" in text
    third = json.loads((EXAMPLES / "03_repairing_heads.ipynb").read_text(encoding="utf-8"))
    text = "\n".join(_text(o) for c in third["cells"] if c["cell_type"] == "code" for o in c["outputs"])
    ppl = re.search(r"before ([\d.]+), after re-initialisation ([\d.]+), after (\d+) steps ([\d.]+)", text)
    assert ppl, "the repair's perplexities"
    before, reinit, final = float(ppl[1]), float(ppl[2]), float(ppl[4])
    assert reinit > before and final < reinit  # re-initialising costs perplexity; masked training wins some back


def test_build_refuses_machine_paths():
    """A notebook whose output shows the checkout's path is refused, and stderr is dropped."""
    build = _build_module()
    nbformat = pytest.importorskip("nbformat")
    nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell("x")])
    nb.cells[0].outputs = [nbformat.v4.new_output("stream", name="stderr", text="a warning\n"),
                           nbformat.v4.new_output("stream", name="stdout", text=f"saved {EXAMPLES.parent}/out\n")]
    assert build.clean(nb) == [str(EXAMPLES.parent)]
    assert [o.name for o in nb.cells[0].outputs] == ["stdout"]
    nb.cells[0].outputs = [nbformat.v4.new_output("stream", name="stdout", text="saved out\n")]
    assert build.clean(nb) == []


def test_build_rejects_an_unknown_name(capsys):
    assert _build_module().main(["04_nothing"]) == 2
    assert "no example named 04_nothing" in capsys.readouterr().err


@pytest.mark.parametrize("source", [pytest.param(p, marks=[pytest.mark.slow] if p.stem in SLOW else [], id=p.stem)
                                    for p in SOURCES])
def test_notebook_runs_top_to_bottom(source, smollm2, shared_data):
    """A fresh kernel runs the source; each cell that draws or shows a view has non-empty output."""
    nb = jupytext.read(source)
    with tempfile.TemporaryDirectory() as cwd:
        nbclient.NotebookClient(nb, timeout=1800, kernel_name="python3", resources={"metadata": {"path": cwd}}).execute()
    for cell in nb.cells:
        if cell.cell_type != "code":
            continue
        assert not [o for o in cell.outputs if o.output_type == "error"]
        if "plt.show()" in cell.source or "display(" in cell.source:
            assert any(len(o.get("data", {}).get("image/png", "")) > 2000 for o in cell.outputs), cell.source[:80]
        if cell.source.rstrip().endswith("\nview"):
            html = "".join(o.get("data", {}).get("text/html", "") for o in cell.outputs)
            assert "CircuitsVis" in html and len(html) > 100_000  # the view with its bundle inlined
