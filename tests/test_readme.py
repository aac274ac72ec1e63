"""The README's Python walk-through runs, on a tiny model, and each step does what it says.

Substitutions, each of which must match exactly once (so a README edit that drops them fails
here): smaller question counts (the sweep's 31 points dominate otherwise), the zoo model becomes
the tiny llama (with a 2,048-token window: PIQA's longest
solutions exceed its 256 in the tiny tokenizer; RoPE, so the weights are the same), and the
repair targets become one explicit head, since a random tiny model has no DEAD or BOS-sink
head to repair.
"""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import pandas as pd

README = Path(__file__).resolve().parents[1] / "README.md"


def python_block() -> str:
    text = README.read_text()
    section = text[text.index("## Python\n"):text.index("## Command line")]
    blocks = re.findall(r"```python\n(.*?)```", section, flags=re.S)
    assert len(blocks) == 1, "the README's Python section holds one code block"
    return blocks[0]


def test_readme_python_walkthrough(tiny_model_dir, shared_data, tmp_path, monkeypatch, capsys):
    code = python_block()
    folder = tmp_path / "tiny-llama-2k"
    shutil.copytree(tiny_model_dir("llama"), folder)
    config = json.loads((folder / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps({**config, "max_position_embeddings": 2048}))
    subs = {'"smollm2-135m"': repr(str(folder)),
            'classes=("dead", "bos_sink")': "heads=((0, 1),)",
            "limit=200": "limit=40", "limit=100": "limit=12", "n=64": "n=16"}
    for old, new in subs.items():
        assert code.count(old) == 1, old
        code = code.replace(old, new)
    monkeypatch.chdir(tmp_path)
    ns: dict = {}
    exec(compile(code, str(README), "exec"), ns)
    capsys.readouterr()

    import lens_heads as lh

    model, scores = ns["model"], ns["scores"]
    # least_active = the k lowest AHON(LN) means (low is inactive), by an independent sort
    frame = scores.to_frame().query("score_fn == 'ahon_ln'").sort_values(["value", "layer", "head"])
    assert ns["quiet"] == [(int(r.layer), int(r.head)) for r in frame.head(len(ns["quiet"])).itertuples()]
    assert len(ns["quiet"]) == min(10, model.geometry.n_layers * model.geometry.n_heads)

    # the static evaluation zeroed exactly those heads
    res = ns["res"]
    assert len(res.questions) == 40 and 0 <= res.metrics["acc"] <= 1
    same = lh.evaluate_task(model, "piqa", limit=40, ablation=lh.parse_ablation(
        "static:" + ",".join(f"{L}.{h}" for L, h in ns["quiet"]), model.geometry), progress=False)
    assert [q.pred for q in same.questions] == [q.pred for q in res.questions]

    # the sweep is stored under runs/piqa and tabulates both functions and random heads
    within = ns["sweep"].within
    assert set(within.score_fn) == {"ahon_ln", "awft", "random"}
    assert pd.read_csv(tmp_path / "runs" / "piqa" / "within_1pt.csv").shape[0] == 3

    # the repair touched the chosen head only and exported a model that loads
    report = ns["report"]
    assert report.passes[0].targets == ("0.1",) and report.passes[0].steps == 20
    assert report.ppl_before > 1 and report.passes[0].ppl_final > 1
    from lens_heads.surgery import RepairReport

    assert RepairReport.load(tmp_path / "runs" / "repaired") == report  # what it returned is what it saved
    repaired = lh.load_model(str(tmp_path / "runs" / "repaired"))
    assert repaired.geometry == model.geometry
    assert ns["diag"].n_inputs == 16

