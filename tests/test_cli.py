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
SCRIPTS = sorted(p for folder in ("analyses", "benchmarks") for p in (ROOT / folder).glob("*.py")
                 if p.name != "common.py")


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
