"""Every --help renders: the top-level command, each subcommand, and each script's parser.

argparse formats help strings with ``%``; one unescaped ``%`` in a help text turns
``lens-heads --help`` into a traceback, which no test that runs a command would notice.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from lens_heads.cli import COMMANDS, main

ROOT = Path(__file__).resolve().parents[1]
SCRIPTS = sorted(p for folder in ("analyses", "benchmarks", "docs", "examples") for p in (ROOT / folder).glob("*.py")
                 if p.name not in ("common.py", "hooks.py")  # modules the scripts / mkdocs import
                 and not p.name[:3].rstrip("_").isdigit())  # examples/NN_*.py: notebook sources


def test_top_level_help_lists_every_command(capsys):
    with pytest.raises(SystemExit) as exc:
        main(["--help"])
    assert exc.value.code == 0
    out = capsys.readouterr().out
    for name in COMMANDS:
        assert f"\n    {name}" in out, name


@pytest.mark.parametrize("command", COMMANDS)
def test_subcommand_help(command, capsys):
    with pytest.raises(SystemExit) as exc:
        main([command, "--help"])
    assert exc.value.code == 0
    assert capsys.readouterr().out.startswith(f"usage: lens-heads {command}")


def test_there_are_scripts_to_check():
    assert {"inactive_heads.py", "distributions.py", "collapse_repair.py"} <= {p.name for p in SCRIPTS}


@pytest.mark.parametrize("script", SCRIPTS, ids=lambda p: f"{p.parent.name}/{p.name}")
def test_script_help(script):
    env = dict(os.environ, HF_HUB_OFFLINE="1", HF_DATASETS_OFFLINE="1")
    res = subprocess.run([sys.executable, str(script), "--help"], capture_output=True, text=True, env=env,
                         cwd=ROOT, timeout=300)
    assert res.returncode == 0, res.stderr[-2000:]
    assert res.stdout.startswith("usage:")


def test_info_first_token_attention_is_the_awft_score(tiny_model_dir, tiny_model, tmp_path, capsys):
    """info's per-layer first-token attention is the layer mean of the dataset-level AWFT score."""
    import json

    from lens_heads.cli import main
    from lens_heads.data import load_texts, tokenize_texts
    from lens_heads.scores import score_heads

    data = tmp_path / "t.jsonl"
    data.write_text("".join(json.dumps({"text": t}) + "\n" for t in
                            ["The capital of France is Paris.", "Attention heads that do nothing", "Dormant heads"]))
    assert main(["info", str(tiny_model_dir("llama")), "--data", str(data), "--n-inputs", "3", "--max-len", "16"]) == 0
    rows = [line.split() for line in capsys.readouterr().out.splitlines() if line.strip().startswith("layer ")]
    model = tiny_model("llama")
    seqs = tokenize_texts(model.tokenizer, load_texts(str(data), n=3), 16)
    want = score_heads(model, seqs, "awft", progress=False).mean["awft"].mean(-1)
    assert [float(r[2]) for r in rows] == pytest.approx(want.tolist(), abs=5e-4)


def test_every_command_that_loads_a_model_takes_attention():
    """The commands whose run loads a model (they call model_from_args) all parse --attention."""
    import inspect
    import importlib

    from lens_heads.cli import build_parser

    sub = next(a for a in build_parser()._actions if a.dest == "command")
    loads = [c for c in COMMANDS if "model_from_args(" in inspect.getsource(
        importlib.import_module(f"lens_heads.cli.{c.replace('-', '_')}"))]
    assert {"demo", "score", "diagnose", "evaluate", "explore"} <= set(loads)
    for command in loads:
        options = {o for a in sub.choices[command]._actions for o in a.option_strings}
        assert "--attention" in options, command


@pytest.mark.parametrize("attention", ["eager", "auto"])
def test_outputs_record_the_attention_backend(attention, tiny_model_dir, shared_data, tmp_path, capsys):
    """score's, diagnose's and evaluate's .meta.json sidecars name the backend that computed them
    (fused and eager agree to float rounding, not bit for bit), with the model's digest."""
    import json

    from lens_heads.models.load import spec_digest

    model = str(tiny_model_dir("llama"))
    runs = {"scores.csv": ["score", model, "--data", "c4-sample", "--n-inputs", "2", "--max-len", "16",
                           "--scores", "ahon_ln", "--out"],
            "diag.csv": ["diagnose", model, "--data", "c4-sample", "--n-inputs", "2", "--max-len", "16", "--out"],
            "piqa.jsonl": ["evaluate", model, "--task", "piqa", "--limit", "3", "--quiet", "--out"]}
    for name, argv in runs.items():
        out = tmp_path / name
        assert main([*argv, str(out), "--attention", attention]) == 0, capsys.readouterr().err
        meta = json.loads((tmp_path / f"{name}.meta.json").read_text())
        assert meta["attention"] == attention and meta["model_digest"] == spec_digest(model), name
        assert isinstance(meta["attention_eager_layers"], dict) and meta["versions"]["torch"]
    assert json.loads((tmp_path / "piqa.jsonl.meta.json").read_text())["task"] == "piqa"
