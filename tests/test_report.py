"""The self-contained HTML report: content, reuse of saved results, bad input, the CLI, and
a headless-Chromium check that it renders offline (no console errors, circuitsvis widgets
present, a non-blank screenshot)."""

from __future__ import annotations

import base64
import io
import json
import os
import re
import shutil
import subprocess
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from lens_heads.errors import LensHeadsError
from lens_heads.viz.study import ReportConfig, build_report
from lens_heads.scores.functions import input_level

from conftest import SAMPLE_TEXTS

TEXTS = SAMPLE_TEXTS
MC_ROWS = [("The capital of France is", ["Paris", "Rome"], 0), ("The capital of Italy is", ["Paris", "Rome"], 1),
           ("Heads that do nothing are", ["dormant", "capital"], 0), ("How do I boil an egg?", ["in water", "Paris"], 0),
           ("A B C D Answer:", ["A", "B"], 0), ("Attention heads that do", ["nothing", "France"], 0)]
ARCH = "bloom"  # ALiBi: the diagnosis map gets its slope axis


@pytest.fixture(scope="module")
def inputs(tiny_model, tmp_path_factory):
    """Real results of the tiny model: a sweep folder and a diagnosis CSV (lowered sink bar)."""
    from lens_heads.surgery.diagnose import Diagnosis, DiagnosisThresholds, diagnose
    from lens_heads.sweep import SweepConfig, run_sweep

    folder = tmp_path_factory.mktemp("report_inputs")
    model = tiny_model(ARCH)
    mc = folder / "mc.jsonl"
    mc.write_text("".join(json.dumps({"question": q, "choices": c, "answer": a}) + "\n" for q, c, a in MC_ROWS))
    run_sweep(model, SweepConfig(task=f"file:{mc}", score_ids=["ahon_ln", "awft"], fractions=[0, 0.25, 0.5],
                                 random_seeds=[0, 1], limit=6, n_boot=50), folder / "sweep", progress=False)
    d = diagnose(model, TEXTS)
    sink_bar = float(d.bos_mass.median())  # a random tiny model has no real sinks: lower the bar
    Diagnosis(d.bos_mass, d.entropy, d.local_mass, d.alibi_slopes, DiagnosisThresholds(bos_sink=sink_bar),
              d.n_inputs).save(folder / "diag.csv")
    (folder / "texts.txt").write_text("\n".join(TEXTS) + "\n")
    return folder


@pytest.fixture(scope="module")
def report(tiny_model, inputs, tmp_path_factory):
    out = tmp_path_factory.mktemp("report") / "report.html"
    cfg = ReportConfig(model=ARCH, out=str(out), data="texts", sweep=str(inputs / "sweep"),
                       diagnosis=str(inputs / "diag.csv"), top_k=2, heads="1.2,0.3", max_sink_views=3,
                       progress=False)
    path = build_report(cfg, model=tiny_model(ARCH), texts=TEXTS)
    return path, path.read_text(encoding="utf-8")


def section(page: str, anchor: str) -> str:
    return page.split(f'<section id="{anchor}">')[1].split("</section>")[0]


def view_heads(page: str, heading: str) -> list[str]:
    """Head names listed in the table above the view whose <h3> starts with ``heading``."""
    part = page.split(f"<h3>{heading}")[1].split("</table>")[0]
    return re.findall(r"<tr><td>(L\d+\.H\d+)</td>", part)


# --- content --------------------------------------------------------------------------------

def test_report_is_self_contained(report):
    path, page = report
    assert page.startswith("<!DOCTYPE html>") and page.rstrip().endswith("</html>")
    assert page.count("var CircuitsVis=") == 1  # the ~1.3 MB bundle inlined once
    assert page.count("CircuitsVis.render(") == 4  # inactive, active, BOS-sink, requested
    assert page.index("var CircuitsVis=") < page.index("CircuitsVis.render(")
    assert not re.search(r"""(src|href)\s*=\s*["']?(https?:)?//""", page)  # nothing fetched from a network
    assert "unpkg.com" not in page
    assert len(page) < 4_000_000
    pngs = re.findall(r'src="data:image/png;base64,([^"]+)"', page)
    assert len(pngs) == 5  # 2 heatmaps, distributions, sweep curves, diagnosis map
    from PIL import Image

    for data in pngs:
        im = Image.open(io.BytesIO(base64.b64decode(data)))
        assert im.format == "PNG" and im.size[0] > 300 and len(im.convert("RGB").getcolors(1 << 20)) > 20
    assert [p.name for p in path.parent.iterdir()] == ["report.html"]  # no temp files left
    umask = os.umask(0)
    os.umask(umask)
    assert path.stat().st_mode & 0o777 == 0o666 & ~umask  # an ordinary file, not mkstemp's 0600


def test_report_header_and_tables(report, tiny_model, inputs):
    _, page = report
    run = section(page, "run")
    assert "wall time" not in run  # the build's own time, not the run's: labelled as such
    for needle in ("bloom, 2 layers x 4 heads", "float32 / cpu", "circuitsvis 1.43", "torch 2.", "report built in",
                   "transformer_lens 4.", f"file {inputs / 'diag.csv'}", f"folder {inputs / 'sweep'}",
                   "scores: computed on 4 texts inputs"):
        assert needle in run, needle
    within = pd.read_csv(inputs / "sweep" / "within_1pt.csv")
    sweep = section(page, "sweep")
    for fn in ("ahon_ln", "awft", "random"):
        assert f"<td>{fn}</td>" in sweep
    value = within.set_index("score_fn").loc["ahon_ln", "max_pct_zeroed_within_1pt"]
    assert f"{value:.4g}" in sweep
    diag = pd.read_csv(inputs / "diag.csv")
    counts = diag["class"].value_counts()
    d = section(page, "diagnosis")
    assert f"<td>BOS-sink</td><td>{counts['bos_sink']}</td>" in d and counts["bos_sink"] > 0
    scores = section(page, "scores")
    assert scores.count("<tr><td>") == len(input_level())  # one row per registered score function


def test_report_views_pick_the_right_heads(report, tiny_model, inputs):
    from lens_heads.scores import score_heads

    _, page = report
    hs = score_heads(tiny_model(ARCH), TEXTS, ["ahon_ln"], progress=False)  # independent recomputation
    order = np.argsort(hs["ahon_ln"].numpy().ravel(), kind="stable")
    names = [f"L{i // 4}.H{i % 4}" for i in order]
    assert view_heads(page, "2 most inactive heads by ahon_ln") == names[:2]
    assert view_heads(page, "2 most active heads by ahon_ln") == names[::-1][:2]
    diag = pd.read_csv(inputs / "diag.csv")
    sinks = diag[diag["class"] == "bos_sink"].sort_values("bos_mass", ascending=False).head(3)
    assert view_heads(page, "BOS-sink and DEAD heads") == [f"L{r.layer}.H{r.head}" for r in sinks.itertuples()]
    assert view_heads(page, "Requested heads") == ["L1.H2", "L0.H3"]


def test_report_reuses_saved_scores(tiny_model, inputs, tmp_path):
    from lens_heads.scores import score_heads

    hs = score_heads(tiny_model(ARCH), TEXTS, ["ahon_ln", "awft"], progress=False)
    frame = hs.to_frame()
    frame.loc[(frame["score_fn"] == "ahon_ln") & (frame["layer"] == 1) & (frame["head"] == 3), "value"] = -1.0
    frame.to_csv(tmp_path / "scores.csv", index=False)
    out = tmp_path / "r.html"
    build_report(ReportConfig(model=ARCH, out=str(out), scores=str(tmp_path / "scores.csv"),
                              diagnosis=str(inputs / "diag.csv"), top_k=1, max_sink_views=0, progress=False),
                 model=tiny_model(ARCH), texts=TEXTS)
    page = out.read_text()
    assert f"scores: file {tmp_path / 'scores.csv'}" in page
    assert view_heads(page, "1 most inactive heads by ahon_ln") == ["L1.H3"]  # the edited value was used
    assert section(page, "scores").count("<tr><td>") == 2
    assert "No sweep" in section(page, "sweep")
    assert page.count("CircuitsVis.render(") == 2


def test_report_runs_a_sweep_when_given_a_task(tiny_model, inputs, tmp_path):
    out = tmp_path / "r.html"
    cfg = ReportConfig(model=ARCH, out=str(out), task=f"file:{inputs / 'mc.jsonl'}", limit=4, sweep_scores="ahon_ln",
                       sweep_fractions=[0, 0.5], sweep_seeds=1, diagnosis=str(inputs / "diag.csv"),
                       heatmaps=(), top_k=1, max_sink_views=0, progress=False)
    build_report(cfg, model=tiny_model(ARCH), texts=TEXTS[:2])
    summary = pd.read_csv(tmp_path / "r_sweep" / "summary.csv")  # stored beside the report, resumable
    assert sorted(summary["score_fn"].unique()) == ["ahon_ln", "random"] and summary["n_questions"].iloc[0] == 4
    sweep = section(out.read_text(), "sweep")
    assert "computed on file:" in sweep and "<td>ahon_ln</td>" in sweep and "data:image/png" in sweep


# --- bad input ------------------------------------------------------------------------------

@pytest.mark.parametrize("change, message", [
    (dict(heads="7.0"), "layer"),
    (dict(heads="1.9"), "head"),
    (dict(out="missing/report.html"), "does not exist"),
    (dict(out="report.txt"), ".html"),
    (dict(sweep="empty"), "empty"),
    (dict(sweep="nope"), "not found"),
    (dict(scores="wrong.csv"), "2 x 4"),
    (dict(diagnosis="bad.csv"), "not a diagnosis table"),
    (dict(top_k=0), "top-k"),
    (dict(task="no-such-task"), "no-such-task"),
    (dict(task="piqa", sweep_scores="nope"), "nope"),
])
def test_report_bad_input(tiny_model, tmp_path, change, message):
    (tmp_path / "empty").mkdir()
    pd.DataFrame({"layer": [0, 5], "head": [0, 0], "score_fn": "ahon_ln", "value": [1.0, 2.0]}).to_csv(
        tmp_path / "wrong.csv", index=False)
    (tmp_path / "bad.csv").write_text("a,b\n1,2\n")
    cfg = dict(model=ARCH, out="report.html", progress=False)
    cfg.update(change)
    for key in ("out", "sweep", "scores", "diagnosis"):
        if key in cfg:
            cfg[key] = str(tmp_path / cfg[key])
    before = sorted(p.name for p in tmp_path.iterdir())
    with pytest.raises(LensHeadsError, match=re.escape(message)):
        build_report(ReportConfig(**cfg), model=tiny_model(ARCH), texts=TEXTS)
    assert sorted(p.name for p in tmp_path.iterdir()) == before  # no partial or temp file


def test_cli_report(tiny_model_dir, inputs, tmp_path, capsys):
    from lens_heads.cli import main

    model_dir = str(tiny_model_dir(ARCH))
    rc = main(["report", model_dir, "--data", str(inputs / "texts.txt"), "--out", str(tmp_path / "no" / "r.html")])
    err = capsys.readouterr().err
    assert rc == 2 and err.count("\n") == 1 and "does not exist" in err
    rc = main(["report", model_dir, "--data", str(inputs / "texts.txt"), "--n-inputs", "3", "--max-len", "24",
               "--diagnosis", str(inputs / "diag.csv"), "--sweep", str(inputs / "sweep"), "--top-k", "1",
               "--out", str(tmp_path / "r.html")])
    assert rc == 0 and "wrote" in capsys.readouterr().out
    page = (tmp_path / "r.html").read_text()
    assert "3 inputs, up to 24 tokens" in page and page.count("var CircuitsVis=") == 1


def test_cli_demo_end_to_end(tiny_model_dir, tiny_model, tmp_path, capsys):
    """The README's demo command, shrunk to a tiny model: every stage writes its file, and the
    scores and the sweep's baseline equal what the API computes on the same shipped data."""
    from lens_heads.cli import main
    from lens_heads.cli.demo import C4_SAMPLE, DEMO_DATA, piqa_sample_spec
    from lens_heads.data import load_texts, tokenize_texts
    from lens_heads.evaluation.evaluate import evaluate_task
    from lens_heads.scores import score_heads

    model_dir, out = str(tiny_model_dir(ARCH)), tmp_path / "demo"  # ALiBi: no 256-token cap on PIQA's answers
    assert main(["demo", "--model", "nosuchmodel", "--out", str(out)]) == 2
    assert not out.exists(), "a bad --model leaves no output folder"
    capsys.readouterr()
    args = ["demo", "--model", model_dir, "--out", str(out), "--dtype", "float32", "--n-inputs", "3", "--max-len", "32",
            "--limit", "4", "--fractions", "0,0.5", "--random-seeds", "1"]
    assert main(args) == 0
    printed = capsys.readouterr().out
    assert "[5/5" in printed and "report.html" in printed
    for name in ("scores.csv", "diagnosis.csv", "sweep/summary.csv", "sweep/within_1pt.csv", "report.html"):
        assert (out / name).is_file(), name

    model = tiny_model(ARCH)
    texts = load_texts(str(DEMO_DATA / C4_SAMPLE), n=3)
    direct = score_heads(model, tokenize_texts(model.tokenizer, texts, 32), "all", progress=False).to_frame()
    written = pd.read_csv(out / "scores.csv")
    assert len(written) == len(direct) == len(input_level()) * model.geometry.n_layers * model.geometry.n_heads
    assert json.loads((out / "scores.csv.meta.json").read_text())["max_len"] == 32
    np.testing.assert_allclose(written["value"], direct["value"], rtol=1e-5, equal_nan=True)

    summary = pd.read_csv(out / "sweep" / "summary.csv")
    base = evaluate_task(model, piqa_sample_spec(), limit=4, progress=False)
    assert summary.loc[summary.spec == "none", "accuracy"].iloc[0] == pytest.approx(base.metrics["acc"])
    assert set(summary.score_fn) == {"ahon_ln", "awft", "random"}
    page = (out / "report.html").read_text()
    assert "3 inputs, up to 32 tokens" in page and page.count("var CircuitsVis=") == 1

    points = {q.name: q.stat().st_mtime_ns for q in (out / "sweep" / "points").glob("*.json")}
    assert main(args) == 0  # a rerun resumes: the sweep's points are read back, not recomputed
    assert {q.name: q.stat().st_mtime_ns for q in (out / "sweep" / "points").glob("*.json")} == points
    assert pd.read_csv(out / "sweep" / "summary.csv").equals(summary)


# --- the browser ----------------------------------------------------------------------------

def chromium() -> str:
    """A headless browser on PATH; the tests install nothing (.ci/run apt-installs chromium as root)."""
    for name in ("chromium", "chromium-browser", "google-chrome"):
        if path := shutil.which(name):
            return path
    pytest.skip("no chromium on PATH (chromium, chromium-browser or google-chrome): install one, as .ci/run "
                "does with 'apt-get install chromium' when root, to run the browser tests")


def run_chromium(tmp_path: Path, url: str, *args: str) -> subprocess.CompletedProcess:
    profile = tmp_path / f"profile-{len(list(tmp_path.glob('profile-*')))}"
    cmd = [chromium(), "--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
           f"--user-data-dir={profile}", "--proxy-server=127.0.0.1:9", "--host-resolver-rules=MAP * ~NOTFOUND",
           "--enable-logging=stderr", "--v=0", "--virtual-time-budget=10000", "--hide-scrollbars", *args, url]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=180)


@pytest.mark.browser
def test_report_renders_offline_in_chromium(report, tmp_path):
    path, page = report
    url = path.resolve().as_uri()
    dom = run_chromium(tmp_path, url, "--dump-dom")
    assert dom.returncode == 0, dom.stderr[-2000:]
    console = [line for line in dom.stderr.splitlines() if ":CONSOLE" in line]
    assert console == [], console
    # circuitsvis rendered every view: its head selector and one canvas per thumbnail + the zoomed one
    n_views = page.count("CircuitsVis.render(")
    assert page.count(">Head Selector") == 0 and dom.stdout.count(">Head Selector") == n_views
    mounts = re.findall(r'<div id="lh-cv-[0-9a-f]+" class="lh-circuitsvis">(.*?)</div>\s*<script>', dom.stdout, re.S)
    assert len(mounts) == n_views and all(m.count("<canvas") >= 2 for m in mounts)
    shot = tmp_path / "shot.png"
    res = run_chromium(tmp_path, url, f"--screenshot={shot}", "--window-size=1200,2000")
    assert res.returncode == 0 and shot.is_file(), res.stderr[-2000:]
    assert [line for line in res.stderr.splitlines() if ":CONSOLE" in line] == []
    from PIL import Image

    im = Image.open(shot).convert("RGB")
    assert im.size == (1200, 2000)
    colours = im.getcolors(1 << 22)
    assert len(colours) > 200  # figures and tables, not a blank page
    assert max(n for n, _ in colours) < 0.8 * im.size[0] * im.size[1]


@pytest.mark.browser
def test_wide_tables_fit_their_section(tmp_path):
    """The within-1-point table (long snake_case headers, a free-text note) fits a 1200-px window:
    its note column lies inside the section, none of it hidden in the table's scroll box."""
    from lens_heads.viz.report import WITHIN_COLUMNS, Section, render_page, table_html
    from lens_heads.sweep.stats import TIED_NOTE

    row = {c: 12.3456 for c in WITHIN_COLUMNS} | {"score_fn": "lthon_ln_text", "note": TIED_NOTE}
    body = table_html(pd.DataFrame([row, row | {"note": ""}])[list(WITHIN_COLUMNS)])
    probe = """<script>window.onload = () => {
      const box = document.querySelector("div.scroll").getBoundingClientRect();
      const th = [...document.querySelectorAll("div.scroll th")].pop().getBoundingClientRect();
      const td = document.querySelector("div.scroll td.text").getBoundingClientRect();
      document.body.setAttribute("data-fits", String(th.right <= box.right + 0.5 && td.right <= box.right + 0.5
                                                    && td.width > 100));
    };</script>"""
    page = render_page("t", {}, [Section("Ablation sweep", body + probe, "sweep")], with_bundle=False)
    path = tmp_path / "wide.html"
    path.write_text(page)
    dom = run_chromium(tmp_path, path.resolve().as_uri(), "--dump-dom", "--window-size=1200,800")
    assert dom.returncode == 0, dom.stderr[-2000:]
    assert 'data-fits="true"' in dom.stdout, re.findall(r"<body[^>]*>", dom.stdout)


@pytest.mark.browser
def test_drift_report_renders_offline_in_chromium(drift_run, tmp_path):
    """The surgery-drift page (maps, curves, generation probes) of a real tiny repair renders with
    no console message, shows each of its sections and figures, and is not blank."""
    from lens_heads.surgery.drift import drift_tables
    from lens_heads.viz.surgery import write_drift_report

    _model, run_dir, store, probes = drift_run
    tables = drift_tables(store, run_dir)
    path = write_drift_report(tables, {"title": "drift", "model": "tiny llama"}, tmp_path / "drift.html")
    page = path.read_text(encoding="utf-8")
    assert "http://" not in page and "https://" not in page  # nothing to fetch
    probe = """<script>window.onload = () => {
      const imgs = [...document.querySelectorAll("figure img")];
      document.body.setAttribute("data-figures", String(imgs.filter(i => i.complete && i.naturalWidth > 0).length));
      document.body.setAttribute("data-rows", String(document.querySelectorAll("table.generations tbody tr").length));
    };</script>"""
    (tmp_path / "probe.html").write_text(page.replace("</body>", probe + "</body>"))
    dom = run_chromium(tmp_path, (tmp_path / "probe.html").resolve().as_uri(), "--dump-dom")
    assert dom.returncode == 0, dom.stderr[-2000:]
    assert [line for line in dom.stderr.splitlines() if ":CONSOLE" in line] == []
    assert 'data-figures="2"' in dom.stdout  # the curves and the maps, decoded
    assert f'data-rows="{len(tables["curves"])}"' in dom.stdout  # one row of continuations per state
    for anchor in ("curves", "maps", "probes"):
        assert f'<section id="{anchor}">' in dom.stdout
    shot = tmp_path / "drift.png"
    res = run_chromium(tmp_path, path.resolve().as_uri(), f"--screenshot={shot}", "--window-size=1200,1600")
    assert res.returncode == 0 and shot.is_file(), res.stderr[-2000:]
    assert [line for line in res.stderr.splitlines() if ":CONSOLE" in line] == []
    from PIL import Image

    im = Image.open(shot).convert("RGB")
    colours = im.getcolors(1 << 22)
    assert len(colours) > 200 and max(n for n, _ in colours) < 0.8 * im.size[0] * im.size[1]
