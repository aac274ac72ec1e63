"""The README runs as pasted: its Python walk-through and every command of its shell blocks.

Python block substitutions, each of which must match exactly once (so a README edit that drops
them fails here): smaller question counts (the sweep's 31 points dominate otherwise), the zoo
model becomes the tiny llama (with a 2,048-token window: PIQA's longest solutions exceed its 256
in the tiny tokenizer; RoPE, so the weights are the same), and the repair targets become one
explicit head, since a random tiny model has no DEAD or BOS-sink head to repair.

Shell blocks: every command of every ```bash block is either run, in a fresh folder holding the
repository's ``examples/`` (a fresh clone's working directory), or listed in ``NOT_RUN`` with
the reason; the zoo model names become the same tiny llama, and ``SPEED`` lists the only other
changes (question counts, where the pasted size would take many minutes on a tiny model).
"""

from __future__ import annotations

import json
import re
import shlex
import shutil
import subprocess
import textwrap
from pathlib import Path

import pandas as pd
import pytest

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
ZOO_NAMES = ("smollm2-135m", "qwen2.5-coder-0.5b", "gemma-3-270m")


def python_block() -> str:
    text = README.read_text()
    section = text[text.index("## Python\n"):text.index("## Command line")]
    blocks = re.findall(r"```python\n(.*?)```", section, flags=re.S)
    assert len(blocks) == 1, "the README's Python section holds one code block"
    return blocks[0]


def test_readme_python_walkthrough(tiny_llama_2k, shared_data, tmp_path, monkeypatch, capsys):
    code = python_block()
    folder = tiny_llama_2k
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




# --- the shell blocks ------------------------------------------------------------------------

def shell_blocks() -> list[tuple[str, str]]:
    """(section title, block) for every ```bash block of the README, list indentation removed."""
    text = README.read_text()
    out = []
    for m in re.finditer(r"^( *)```bash\n(.*?)^\1```", text, flags=re.M | re.S):
        titles = re.findall(r"^## (.+)$", text[:m.start()], flags=re.M)
        out.append((titles[-1] if titles else "", textwrap.dedent(m.group(2))))
    return out


def shell_commands(block: str) -> list[str]:
    """A block's commands: continuation lines joined, a heredoc whole, comments and `&&` chains
    split into their parts."""
    lines, cmds, i = block.splitlines(), [], 0
    while i < len(lines):
        line = lines[i]
        if not line.strip() or line.lstrip().startswith("#"):
            i += 1
            continue
        heredoc = re.search(r"<<'?(\w+)'?", line)
        if heredoc:
            end = lines.index(heredoc.group(1), i + 1)
            cmds.append("\n".join(lines[i:end + 1]) + "\n")
            i = end + 1
            continue
        while line.endswith("\\"):
            i += 1
            line = line[:-1].rstrip() + " " + lines[i].strip()
        cmds += [part.strip() for part in line.split(" && ")]
        i += 1
    return cmds


# commands not run here, each with its reason; every entry must match a command of the README
NOT_RUN = {
    "python3 -m venv .venv": "creates a virtual environment for the install (tests/test_install.py)",
    ".venv/bin/pip install -e . -c constraints.txt": "the install (tests/test_install.py)",
    "source .venv/bin/activate": "puts lens-heads on the reader's PATH; this test runs it in-process",
    '.venv/bin/pip install -q -e ".[test]" -c constraints.txt': "the install (tests/test_install.py)",
    ".venv/bin/python -m pytest": "the test suite itself, of which this test is part",
    "--executor ray --ray-address auto": "needs a running Ray cluster (tests/test_scaleout.py runs a local one)",
    "--executor slurm": "needs a Slurm cluster (tests/test_scaleout.py runs a one-node one when slurm-wlm is there)",
    "CUDA_VISIBLE_DEVICES=$i": "needs two CUDA devices (--device cuda); tests/test_scaleout.py runs --shard on CPU",
    "--out runs/qwen-mmlu --status": "reads the sweep the cluster commands above fill (tests/test_sweep.py "
                                     "covers --status)",
    '.venv/bin/pip install -e ".[notebooks]"': "installs the notebook tools (the test command's [test] extra has them)",
    "examples/build.py": "reruns the three notebooks on SmolLM2 (tests/test_notebooks.py runs each source)",
    '.venv/bin/pip install -e ".[docs]"': "installs the site's tools (the test command's [test] extra has them)",
    ".venv/bin/mkdocs build": "builds the site (tests/test_docs_site.py builds the same site, strictly, and reads it)",
    "lens-heads explore": "a server that runs until stopped, on files made elsewhere (tests/test_explore.py "
                          "serves the same app and drives the page in a browser)",
}
# the only changes besides the model, for speed on a tiny model (each must match its command)
SPEED = {
    "--task mmlu --limit 500 --paper-protocol": ("--limit 500", "--limit 4 --n-shot 1 --fractions 0,0.3"),
    "--eval piqa --limit 200": ("--limit 200", "--limit 40"),
    "--search crossing": ("--limit 200", "--limit 40"),
}
# pytest -m slow: the demo as pasted (100 PIQA questions x 20 points; tests/test_report.py runs it
# shrunk by default) and the paper's protocol (MMLU's 57 subjects, 16 sweep points)
SLOW = {"demo", "The paper's protocol"}
NEEDS_DATA = {"Make it smaller", "The paper's protocol", "Command line",
              "After surgery: what the untouched heads did"}  # named corpora and tasks: $LENS_HEADS_DATA
REQUIRES = {"--tasks my_mc.yaml": "cat > my_mc.yaml"}  # route 3 reads route 1's YAML


def skipped(cmd: str) -> str | None:
    return next((reason for key, reason in NOT_RUN.items() if key in cmd), None)


def runnable_blocks() -> list:
    params = []
    for n, (title, block) in enumerate(shell_blocks()):
        cmds = [c for c in shell_commands(block) if skipped(c) is None]
        if not cmds:
            continue
        subs = [re.search(r"lens-heads (\S+)", c).group(1) for c in cmds if not c.startswith("cat ")]
        marks = [pytest.mark.slow] if title in SLOW or "demo" in subs else []
        params.append(pytest.param(title, cmds, id=f"{n}-" + "-".join(dict.fromkeys(subs)), marks=marks))
    return params


def test_every_shell_command_is_run_or_listed_with_a_reason():
    cmds = [c for _, block in shell_blocks() for c in shell_commands(block)]
    assert len(cmds) >= 15
    for key in NOT_RUN:  # no stale entry: each names one command of today's README
        assert sum(key in c and skipped(c) is not None for c in cmds) >= 1, key
    for key in list(SPEED) + list(REQUIRES.values()):
        assert sum(key in c for c in cmds) == 1, key
    run = [c for c in cmds if skipped(c) is None]
    assert all(c.startswith(("lens-heads ", "cat > ", "HF_HUB_OFFLINE=1 ")) for c in run), run
    assert sum(c.startswith(("lens-heads ", "HF_HUB_OFFLINE=1 ")) for c in run) >= 8  # most of them run


def expected_outputs(argv: list[str]) -> list[str]:
    """What a command writes, by subcommand, under its --out."""
    out = argv[argv.index("--out") + 1] if "--out" in argv else None
    sub = argv[0]
    if sub == "demo":
        return [f"{out}/{f}" for f in ("report.html", "scores.csv", "diagnosis.csv", "sweep/within_1pt.csv")]
    if sub == "sweep" and "--search" in argv:
        return [f"{out}/within_1pt.csv", f"{out}/probes.csv"]
    if sub == "sweep":
        return [f"{out}/summary.csv", f"{out}/within_1pt.csv"]
    if sub == "prune":
        return [f"{out}/config.json", f"{out}/prune_report.json"]
    if sub == "lm-eval":
        return [f"{out}/results.json"]
    if sub == "report":
        return [out]
    if sub == "drift":
        folder = out or f"{argv[1]}/drift"
        return [f"{folder}/{f}" for f in ("heads.csv", "curves.csv", "generations.csv", "epochs.csv", "report.html")]
    return [] if out is None else [out]


def run_command(cmd: str, model: Path, monkeypatch, capsys) -> str:
    """Run one README command in the working directory; return what it printed."""
    from lens_heads.cli import main

    if cmd.startswith("cat > "):  # a heredoc: the shell itself
        res = subprocess.run(["bash", "-c", cmd], capture_output=True, text=True)
        assert res.returncode == 0, res.stderr
        assert Path(cmd.split()[2]).is_file()
        return res.stdout
    for key, (old, new) in SPEED.items():
        if key in cmd:
            cmd = cmd.replace(old, new)
    tokens = shlex.split(cmd, comments=True)
    while re.fullmatch(r"[A-Z_]+=.*", tokens[0]):  # VAR=value prefixes
        name, _, value = tokens.pop(0).partition("=")
        monkeypatch.setenv(name, value)
    assert tokens[0] in ("lens-heads", ".venv/bin/lens-heads"), cmd
    argv = [str(model) if t in ZOO_NAMES else t for t in tokens[1:]]
    if argv[0] == "demo":
        argv += ["--model", str(model)]  # the demo names no model: its default is the zoo's SmolLM2
    capsys.readouterr()
    code = main(argv)
    printed = capsys.readouterr()
    assert code == 0, f"{cmd}\n{printed.err[-3000:]}"
    for path in expected_outputs(argv):
        assert Path(path).exists(), f"{cmd}: no {path}"
    return printed.out


@pytest.mark.parametrize("title, cmds", runnable_blocks())
def test_readme_shell_block_runs_as_pasted(title, cmds, tiny_llama_2k, request, tmp_path, monkeypatch, capsys,
                                           own_cache):
    if title in NEEDS_DATA:
        request.getfixturevalue("shared_data")
    if any("my_mc.yaml" in c for c in cmds):
        pytest.importorskip("lm_eval")  # routes 1 and 3 need the lm-eval extra (the test extra has it)
    monkeypatch.chdir(tmp_path)
    (tmp_path / "examples").symlink_to(ROOT / "examples")  # a fresh clone's working directory
    every = [c for _, block in shell_blocks() for c in shell_commands(block)]
    for cmd in cmds:
        for needs, before in REQUIRES.items():
            if needs in cmd and before not in " ".join(cmds):
                run_command(next(c for c in every if c.startswith(before)), tiny_llama_2k, monkeypatch, capsys)
        printed = run_command(cmd, tiny_llama_2k, monkeypatch, capsys)
        argv = shlex.split(cmd, comments=True)
        out = Path(argv[argv.index("--out") + 1]) if "--out" in argv else None
        if " evaluate " in cmd:
            assert re.search(r"n=(\d+)  acc [01]\.\d{4}", printed), printed
        if " sweep " in cmd:
            assert {"random", "ahon_ln"} <= set(pd.read_csv(out / "within_1pt.csv").score_fn)
        if "--prune-run" in cmd:
            assert 'id="pruning"' in out.read_text()


def test_own_benchmark_routes_score_the_same_prompts(tmp_path, monkeypatch):
    """Route 1 (lm-eval YAML) and route 2 (file: with the README's prompt=) build the same
    requests on the shipped example, as written out independently from its rows; without
    prompt= the file route's prompt is the bare question (what the README warns of)."""
    pytest.importorskip("lm_eval")
    from lens_heads.data import load_task

    cmds = [c for _, block in shell_blocks() for c in shell_commands(block)]
    monkeypatch.chdir(tmp_path)
    (tmp_path / "examples").symlink_to(ROOT / "examples")
    heredoc = next(c for c in cmds if c.startswith("cat > my_mc.yaml"))
    assert subprocess.run(["bash", "-c", heredoc]).returncode == 0
    file_cmd = next(c for c in cmds if "--task \"file:examples/my_mc/test.jsonl" in c)
    spec = next(t for t in shlex.split(file_cmd) if t.startswith("file:"))
    rows = [json.loads(line) for line in (ROOT / "examples/my_mc/test.jsonl").read_text().splitlines()]
    assert len(rows) == 12 and len((ROOT / "examples/my_mc/train.jsonl").read_text().splitlines()) >= 5

    yaml_task, file_task = load_task("my_mc.yaml"), load_task(spec)
    assert len(yaml_task.records) == len(file_task.records) == len(rows)
    for row, a, b in zip(rows, yaml_task.records, file_task.records):
        want = [(f"Question: {row['question']}\nAnswer:", f" {c}") for c in row["choices"]["text"]]
        assert yaml_task.build(a, 0) == file_task.build(b, 0) == want
        assert a.gold == b.gold == row["choices"]["label"].index(row["answerKey"])
    bare = load_task(spec[:spec.index("&prompt=")])
    assert [ctx for ctx, _ in bare.build(bare.records[0], 0)][0] == rows[0]["question"]
