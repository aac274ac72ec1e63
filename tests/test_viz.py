"""lens_heads.viz: circuitsvis attention views and matplotlib figures, on real results of tiny models.

Patterns are checked against HF ``output_attentions``; figures are checked by what they
draw (image data, line coordinates, violins, bars) against independent computations.
"""

from __future__ import annotations

import html
import json
import re

import numpy as np
import pandas as pd
import pytest
import torch

from lens_heads.viz.study import attention_heads
from lens_heads.errors import LensHeadsError
from lens_heads.sweep import SweepResult
from lens_heads.viz import (
    AttentionView,
    diagnosis_map,
    parse_heads,
    point_changes,
    score_distributions,
    score_heatmap,
    sweep_curves,
    distance_heatmap,
)

from conftest import SAMPLE_TEXTS

TEXTS = SAMPLE_TEXTS
MC_ROWS = [("The capital of France is", ["Paris", "Rome"], 0), ("The capital of Italy is", ["Paris", "Rome"], 1),
           ("Heads that do nothing are", ["dormant", "capital"], 0), ("How do I boil an egg?", ["in water", "Paris"], 0),
           ("A B C D Answer:", ["A", "B"], 0), ("Attention heads that do", ["nothing", "France"], 0),
           ("The following are multiple", ["choice", "egg"], 0), ("Question: the capital of", ["France", "water"], 0)]


def write_mc(path) -> str:
    path.write_text("".join(json.dumps({"question": q, "choices": c, "answer": a}) + "\n" for q, c, a in MC_ROWS))
    return f"file:{path}"


@pytest.fixture(scope="module")
def scores_of(tiny_model):
    from lens_heads.scores import score_heads

    cache = {}

    def get(arch: str, keep_per_input: bool = False):
        if (arch, keep_per_input) not in cache:
            cache[arch, keep_per_input] = score_heads(tiny_model(arch), TEXTS, "all", batch_size=4,
                                                      keep_per_input=keep_per_input, progress=False)
        return cache[arch, keep_per_input]

    return get


@pytest.fixture(scope="module")
def sweep_dir(tiny_model, tmp_path_factory):
    """A small but real sweep of the tiny llama on a local multiple-choice file."""
    from lens_heads.sweep import SweepConfig, run_sweep

    folder = tmp_path_factory.mktemp("sweep")
    task = write_mc(folder / "mc.jsonl")
    run_sweep(tiny_model("llama"), SweepConfig(task=task, score_ids=["ahon_ln", "awft"], fractions=[0, 0.25, 0.5],
                                               random_seeds=[0, 1], limit=8, n_boot=50),
              folder / "out", progress=False)
    return folder / "out"


# --- attention views ------------------------------------------------------------------------

@pytest.mark.parametrize("arch", ["llama", "bloom"])
def test_attention_heads_match_hf_attentions(tiny_model, tiny_model_dir, arch):
    from transformers import AutoModelForCausalLM

    model = tiny_model(arch)
    heads = [(1, 2), (0, 0), (1, 0)]
    view = attention_heads(model, TEXTS[0], heads, titles={(1, 2): "ahon_ln 0.41 | BOS-sink"})
    ids = model.to_tokens(TEXTS[0])[0]
    hf = AutoModelForCausalLM.from_pretrained(tiny_model_dir(arch), attn_implementation="eager").eval()
    with torch.no_grad():
        ref = hf(ids[None], output_attentions=True).attentions  # independent path: a plain HF model
    assert view.patterns.shape == (3, len(ids), len(ids))
    for i, (L, h) in enumerate(heads):
        np.testing.assert_allclose(view.patterns[i], ref[L][0, h].float().numpy(), atol=1e-5)
    assert view.names == ["L1.H2 | ahon_ln 0.41 | BOS-sink", "L0.H0", "L1.H0"]
    assert len(view.tokens) == len(ids) and "".join(view.tokens) == model.tokenizer.decode(ids.tolist())


def test_attention_heads_default_all_heads_and_truncation(tiny_model):
    model = tiny_model("llama")
    g = model.geometry
    view = attention_heads(model, TEXTS[2], max_tokens=7, titles=[str(i) for i in range(g.n_layers * g.n_heads)])
    assert view.patterns.shape == (g.n_layers * g.n_heads, 7, 7)
    assert view.heads[-1] == (g.n_layers - 1, g.n_heads - 1) and view.names[5] == "L1.H1 | 5"
    np.testing.assert_allclose(view.patterns.sum(-1), 1.0, atol=1e-5)  # rows are distributions
    assert np.allclose(np.triu(view.patterns, 1), 0.0)  # causal


def test_view_html_is_offline_and_saved_atomically(tiny_model, tmp_path):
    view = attention_heads(tiny_model("llama"), TEXTS[1], [(0, 1), (1, 3)])
    src = view.local_src
    assert "var CircuitsVis=" in src and "CircuitsVis.render(" in src and "AttentionHeads" in src
    assert "unpkg.com" not in src and "cdn" not in src.split("var CircuitsVis=")[0]
    assert src.count("var CircuitsVis=") == 1
    props = json.loads(re.search(r"CircuitsVis\.AttentionHeads,\s*(\{.*\})\s*\)", src, re.S).group(1))
    np.testing.assert_allclose(props["attention"], view.patterns, atol=1e-4)  # rounded to 4 places
    assert props["tokens"] == view.tokens and props["attentionHeadNames"] == ["L0.H1", "L1.H3"]
    assert view.local_src == src  # deterministic
    out = view.save(tmp_path / "view.html")
    text = out.read_text()
    assert text.startswith("<!DOCTYPE html>") and "var CircuitsVis=" in text
    assert [p.name for p in tmp_path.iterdir()] == ["view.html"]  # no temp file left
    frame = view._repr_html_()
    assert frame.startswith("<iframe srcdoc=") and html.unescape(frame.split('srcdoc="')[1].split('" style')[0]) == view.to_html()
    # the mount-only HTML (for pages with one shared bundle) carries no bundle
    mount = view.mount_html()
    assert "var CircuitsVis=" not in mount and view.dom_id in mount and len(mount) < 20_000
    with pytest.raises(LensHeadsError, match="does not exist"):
        view.save(tmp_path / "missing" / "view.html")


def test_view_props_cannot_break_out_of_the_script():
    tokens = ["a</script><script>alert(1)</script>", "<!--b"]
    view = AttentionView(tokens, np.array([[[1.0, 0.0], [0.4, 0.6]]]), [(0, 0)], ["L0.H0 </script>"])
    for src in (view.local_src, view.mount_html()):
        assert "</script><script>alert" not in src and "<!--b" not in src
        call = re.search(r"CircuitsVis\.AttentionHeads,\s*(\{.*\})\s*\)", src, re.S).group(1)
        props = json.loads(call.replace("<\\/", "</").replace("<\\!--", "<!--"))
        assert props["tokens"] == tokens and props["attentionHeadNames"] == ["L0.H0 </script>"]
        assert props["attention"] == [[[1.0, 0.0], [0.4, 0.6]]] and props["maskUpperTri"] is True


def test_attention_heads_bad_input(tiny_model):
    model = tiny_model("llama")
    with pytest.raises(LensHeadsError, match="layer"):
        attention_heads(model, TEXTS[0], [(0, 0), (5, 0)])
    with pytest.raises(LensHeadsError, match="head"):
        attention_heads(model, TEXTS[0], [(0, 9)])
    with pytest.raises(LensHeadsError, match="titles"):
        attention_heads(model, TEXTS[0], [(0, 0)], titles=["a", "b"])
    assert parse_heads("L1.H2, 0.3", model.geometry) == [(1, 2), (0, 3)]
    for bad in ("1.x", "1", ""):
        with pytest.raises(LensHeadsError):
            parse_heads(bad, model.geometry)


# --- figures --------------------------------------------------------------------------------

def test_score_heatmap_draws_the_scores(scores_of):
    hs = scores_of("qwen2")
    frame = hs.to_frame()
    fig = score_heatmap(frame, "ahon_ln")
    assert len(fig.axes) == 2  # heatmap + colorbar
    img = fig.axes[0].images[0].get_array()
    np.testing.assert_allclose(np.asarray(img), hs["ahon_ln"].numpy(), rtol=1e-6)
    assert "ahon_ln" in fig.axes[0].get_title() and "low" in fig.axes[0].get_title()
    assert len(fig.axes[0].texts) == hs.n_layers * hs.n_heads  # annotated cells
    with pytest.raises(LensHeadsError, match="not in the scores frame"):
        score_heatmap(frame, "nope")
    with pytest.raises(LensHeadsError, match="lacks column"):
        score_heatmap(frame.drop(columns=["value"]), "ahon_ln")


def test_sweep_curves_from_a_real_sweep(sweep_dir):
    saved = SweepResult.load(sweep_dir)
    summary, within = saved.summary, saved.within
    fig = sweep_curves(summary, within)
    ax = fig.axes[0]
    lines = {ln.get_label(): ln for ln in ax.get_lines()}
    fn_lines = [k for k in lines if k.startswith(("ahon_ln", "awft"))]
    assert len(fn_lines) == 2 and all("%" in k for k in fn_lines)  # labelled with the within-1-point value
    ahon = lines[next(k for k in fn_lines if k.startswith("ahon_ln"))]
    rows = summary[summary["score_fn"] == "ahon_ln"].sort_values("pct_zeroed")
    np.testing.assert_allclose(ahon.get_xdata(), rows["pct_zeroed"])
    np.testing.assert_allclose(ahon.get_ydata(), rows["accuracy"])
    rnd = lines[next(k for k in lines if k.startswith("random (mean of 2 seeds"))]
    rr = summary[summary["score_fn"] == "random"]
    mean = rr.groupby("fraction")["accuracy"].mean().sort_index()
    np.testing.assert_allclose(rnd.get_ydata(), mean.to_numpy())  # mean over seeds, computed independently
    base = summary.loc[summary["spec"] == "none", "accuracy"].iloc[0]
    b = next(v for k, v in lines.items() if k.startswith("base "))
    m1 = lines["base - 1 point"]
    assert b.get_ydata()[0] == pytest.approx(base) and m1.get_ydata()[0] == pytest.approx(base - 0.01)
    band = [c for c in ax.collections if c.get_label() == "random band"]
    assert len(band) == 1
    ys = band[0].get_paths()[0].vertices[:, 1]
    lo = rr.groupby("fraction")["ci_low"].mean().min()
    hi = rr.groupby("fraction")["ci_high"].mean().max()
    assert ys.min() == pytest.approx(lo) and ys.max() == pytest.approx(hi)


def test_point_changes_draw_each_point_with_its_interval():
    points = pd.DataFrame([{"score_fn": f, "pct_zeroed": x, "delta_pt": d, "delta_ci_low": lo, "delta_ci_high": hi}
                           for f, x, d, lo, hi in [("random", 4.9, -2.4, -5.4, 0.6), ("random", 10.1, -5.0, -8.0, -2.0),
                                                   ("ahon_ln", 9.7, -0.6, -2.6, 1.2)]])
    ax = point_changes(points).axes[0]
    bars = {c.get_label(): c for c in ax.containers}
    assert set(bars) == {"random", "ahon_ln"}
    line, _, (vlines,) = bars["random"].lines
    np.testing.assert_allclose(line.get_xdata(), [4.9, 10.1])
    np.testing.assert_allclose(line.get_ydata(), [-2.4, -5.0])
    segs = vlines.get_segments()  # one vertical bar per point, from ci_low to ci_high
    np.testing.assert_allclose([(s[0][1], s[1][1]) for s in segs], [(-5.4, 0.6), (-8.0, -2.0)])
    assert line.get_marker() == "s" and bars["ahon_ln"].lines[0].get_marker() == "o"
    assert [ln.get_ydata()[0] for ln in ax.get_lines() if ln.get_label() in ("baseline", "-1 point")] == [0.0, -1.0]
    with pytest.raises(LensHeadsError, match="lacks column"):
        point_changes(points.drop(columns=["delta_ci_low"]))


def test_sweep_curves_pair_raw_and_ln_by_colour():
    fns = [f"{b}{s}" for b in ("awft", "aeqd", "ftvvn", "avvn", "lthon", "ahon") for s in ("", "_ln")]
    summary = pd.DataFrame([{"score_fn": f, "fraction": p, "pct_zeroed": 100 * p, "accuracy": 0.6 - p}
                            for f in fns + ["static ahon_ln"] for p in (0.0, 0.1)])
    lines = {ln.get_label(): ln for ln in sweep_curves(summary).axes[0].get_lines()}
    for b in ("awft", "aeqd", "ftvvn", "avvn", "lthon", "ahon"):
        raw, ln = lines[b], lines[f"{b}_ln"]
        assert raw.get_color() == ln.get_color() and (raw.get_linestyle(), ln.get_linestyle()) == ("-", "-.")
    colours = {lines[b].get_color() for b in ("awft", "aeqd", "ftvvn", "avvn", "lthon", "ahon", "static ahon_ln")}
    assert len(colours) == 7  # 7 families, 7 distinct colours


def test_sweep_curves_leave_out_a_score_that_ties_across_heads():
    summary = pd.DataFrame([{"score_fn": f, "fraction": p, "pct_zeroed": x, "accuracy": y}
                            for f, pts in {"ahon_ln": [(0.0, 0, 0.7), (0.1, 10, 0.69)],
                                           "ftvvn_ln": [(0.0, 0, 0.7), (0.1, 100, 0.52)]}.items()
                            for p, x, y in pts])
    within = pd.DataFrame([{"score_fn": "ahon_ln", "max_pct_zeroed_within_1pt": 10.0, "note": float("nan")},
                           {"score_fn": "ftvvn_ln", "max_pct_zeroed_within_1pt": float("nan"),
                            "note": "ties: one threshold for every fraction, so no curve"}])
    ax = sweep_curves(summary, within).axes[0]
    lines = {ln.get_label(): ln for ln in ax.get_lines()}
    assert len(lines["ahon_ln (10.0 %)"].get_xdata()) == 2
    assert len(lines["ftvvn_ln: ties across heads, no curve"].get_xdata()) == 0  # named, not drawn
    assert ax.get_xlim()[1] < 50  # the tied point at 100 % does not stretch the axis


def test_read_sweep_bad_input(tmp_path):
    with pytest.raises(LensHeadsError, match="no sweep summary"):
        SweepResult.load(tmp_path)
    (tmp_path / "summary.csv").write_text("")
    with pytest.raises(LensHeadsError, match="empty"):
        SweepResult.load(tmp_path)
    with pytest.raises(LensHeadsError, match="not found"):
        SweepResult.load(tmp_path / "nope")


def test_score_distributions_one_violin_per_model(scores_of):
    frames = {"llama": scores_of("llama").to_frame(), "qwen2": scores_of("qwen2").to_frame()}
    fig = score_distributions(frames, ["ahon_ln", "awft", "lthon"])
    visible = [ax for ax in fig.axes if ax.get_visible()]
    assert [ax.get_title() for ax in visible] == ["ahon_ln", "awft", "lthon"]
    for ax, fn in zip(visible, ["ahon_ln", "awft", "lthon"]):
        bodies = [c for c in ax.collections if c.__class__.__name__ in ("PolyCollection", "FillBetweenPolyCollection")]
        assert len(bodies) == 2  # one violin per model
        for body, label in zip(bodies, frames):
            v = frames[label].query("score_fn == @fn")["value"]
            ys = body.get_paths()[0].vertices[:, 1]
            assert ys.min() == pytest.approx(v.min()) and ys.max() == pytest.approx(v.max())
    fig_all = score_distributions({"llama": frames["llama"]})
    assert sum(ax.get_visible() for ax in fig_all.axes) == frames["llama"]["score_fn"].nunique()
    hist = score_distributions(frames, "ahon_ln", kind="hist")
    assert len(hist.axes[0].patches) == 2 * 30
    with pytest.raises(LensHeadsError):
        score_distributions({}, "ahon_ln")


def test_wasserstein_distances_against_sorted_differences(scores_of):
    from lens_heads.scores import wasserstein_distances

    per = scores_of("llama", keep_per_input=True).per_input
    samples = {sid: per[sid].reshape(-1).numpy() for sid in ("ahon_ln", "lthon_ln", "awft_ln")}
    matrix = wasserstein_distances(samples)
    fig = distance_heatmap(matrix)
    labels = list(samples)
    assert list(matrix.index) == labels and list(matrix.columns) == labels
    for a in labels:  # equal-size samples: W1 = mean |sorted(a) - sorted(b)|
        for b in labels:
            ref = np.abs(np.sort(samples[a]) - np.sort(samples[b])).mean()
            assert matrix.loc[a, b] == pytest.approx(ref, rel=1e-6, abs=1e-9)
    assert np.asarray(fig.axes[0].images[0].get_array()).shape == (3, 3)
    with pytest.raises(LensHeadsError, match="two"):
        wasserstein_distances({"a": [1.0]})
    with pytest.raises(LensHeadsError, match="finite"):
        wasserstein_distances({"a": [1.0], "b": [np.nan]})


@pytest.mark.parametrize("arch", ["bloom", "llama"])
def test_diagnosis_map_classes_and_slopes(tiny_model, arch):
    from lens_heads.surgery.diagnose import diagnose

    model = tiny_model(arch)
    diag = diagnose(model, TEXTS).to_frame()
    fig = diagnosis_map(diag)
    slopes = model.geometry.alibi_slopes()
    grid_ax = fig.axes[-1]
    grid = np.asarray(grid_ax.images[0].get_array())
    assert grid.shape == (model.geometry.n_layers, model.geometry.n_heads)
    labels = [t.get_text() for t in fig.legends[0].get_texts()]
    # heads sharing a class share a colour code, and the legend counts them
    for label in labels:
        name, count = label.rsplit(" (", 1)
        assert int(count.rstrip(")")) == int((diag["class"].map(lambda c: c.replace("_", "-")).str.lower()
                                              == name.lower()).sum())
    codes = {c: grid[L, h] for L, h, c in zip(diag["layer"], diag["head"], diag["class"])}
    for L, h, c in zip(diag["layer"], diag["head"], diag["class"]):
        assert grid[L, h] == codes[c]
    if slopes is None:
        assert len(fig.axes) == 1
    else:
        assert len(fig.axes) == 2
        heights = [p.get_height() for p in fig.axes[0].patches]
        np.testing.assert_allclose(heights, slopes.numpy(), rtol=1e-6)


def test_diagnosis_map_accepts_report_spellings():
    diag = pd.DataFrame({"layer": [0, 0, 1, 1], "head": [0, 1, 0, 1], "bos_mass": [0.99, 0.7, 0.1, 0.2],
                         "class": ["DEAD", "BOS-sink", "healthy", "low-entropy"], "alibi_slope": [np.nan] * 4})
    fig = diagnosis_map(diag)
    assert len(fig.axes) == 1  # NaN slopes: no slope axis
    labels = [t.get_text() for t in fig.legends[0].get_texts()]
    assert labels == ["DEAD (1)", "BOS-sink (1)", "low-entropy (1)", "healthy (1)"]
    np.testing.assert_array_equal(np.asarray(fig.axes[0].images[0].get_array()), [[0, 1], [3, 2]])
    with pytest.raises(LensHeadsError, match="class"):
        diagnosis_map(diag.drop(columns=["class"]))


def test_crossing_probes_sets_another_searchs_probes_beside_each_curves_own():
    """One panel per curve either search holds, in the table's order; each probe of ``other``
    a hollow marker at its interval's middle, each of the search's own a filled one."""
    from lens_heads.viz.figures import crossing_probes

    def probe(fn, pct, lo, hi, decision, step=1, n=64):
        return {"score_fn": fn, "pct": pct, "delta_lo": lo, "delta_hi": hi, "decision": decision, "step": step,
                "n_items": n}

    mine = pd.DataFrame([probe("awft", 30.0, -0.05, -0.02, "outside"), probe("awft", 15.0, -0.004, 0.01, "within", 2, 1838)])
    other = pd.DataFrame([probe("awft", 30.0, -0.06, -0.03, "outside"), probe("ahon", 2.0, -0.002, 0.0, "within"),
                          probe("ahon", 3.0, -0.03, -0.02, "outside", 2), probe("ahon", 1.0, -0.001, 0.0, "within", 3)])
    within = pd.DataFrame({"score_fn": ["ahon", "awft"], "crossing_pct": [2.0, float("nan")],
                           "crossing_status": ["resolved", "pending"], "margin_pts": [1.0, 1.0],
                           "range_pct": [60.0, 60.0]})
    fig = crossing_probes(mine, within, other, "bfloat16")
    axes = fig.get_axes()
    assert [ax.get_title() for ax in axes] == ["ahon: 2 % (resolved)", "awft"]

    def markers(ax, hollow: bool):
        return sorted(round(float(line.get_ydata()[0]), 6) for line in ax.get_lines()
                      if line.get_marker() == "o" and len(line.get_xdata())
                      and (line.get_markerfacecolor() == "none") == hollow)

    assert markers(axes[0], hollow=True) == sorted([-0.1, -2.5, -0.05]) and markers(axes[0], hollow=False) == []
    assert markers(axes[1], hollow=True) == [-4.5] and markers(axes[1], hollow=False) == sorted([-3.5, 0.3])
    assert axes[0].get_legend().get_texts()[0].get_text() == "bfloat16"
    # the search's own probes: the step alone where a probe read the whole population (here the
    # most any probe read), its questions too where it stopped early
    assert sorted(t.get_text() for t in axes[1].texts) == ["1: n=64", "2"]
    assert axes[1].get_yscale() == "symlog"
    alone = crossing_probes(mine, within)  # without it: the search's own curves only
    assert [ax.get_title() for ax in alone.get_axes()] == ["awft"]
    before = crossing_probes(mine.iloc[0:0], within, other, "bfloat16")  # none of the search's own yet
    assert [ax.get_title() for ax in before.get_axes()] == ["ahon: 2 % (resolved)", "awft"]
    assert markers(before.get_axes()[1], hollow=False) == [] and markers(before.get_axes()[1], hollow=True) == [-4.5]


def test_crossing_overview_draws_each_curves_bracket_where_the_table_says():
    """Table 2 as a figure: a panel per pair, a row per curve in the table's order; a resolved
    bracket is a bar from its low to its high end, a lower bound an arrow to the range's end, a
    running search a pale bar over its bracket so far, a curve with no bracket a word; random
    heads' bracket a band; the reference a cross; a panel with nothing begun one word."""
    import math

    from matplotlib.colors import to_hex

    from lens_heads.viz.figures import FAMILY_COLOUR, crossing_overview

    def row(model, fn, status, lo=math.nan, hi=math.nan):
        return {"model": model, "task": "piqa", "score_fn": fn, "status": status, "bracket_low_pct": lo,
                "bracket_high_pct": hi, "range_pct": 60.0}

    cross = pd.DataFrame([row("a", "random", "resolved", 1.0, 2.0), row("a", "awft", "resolved", 37.0, 38.0),
                          row("a", "ahon_ln", "lower bound", 40.0, math.inf), row("a", "lthon", "pending", 3.0, 15.0),
                          row("a", "ftvvn_ln", "constant scores"), row("b", "random", "not started"),
                          row("b", "awft", "not started")])
    paper = pd.DataFrame([{"model": "a", "task": "piqa", "score_fn": "awft", "pct": 7.4}])
    fig = crossing_overview(cross, by=["model", "task"], reference=paper, reference_label="paper")
    a, b = fig.get_axes()
    assert [a.get_title(), b.get_title()] == ["a / piqa", "b / piqa"]
    assert [t.get_text() for t in a.get_yticklabels()] == ["random", "awft", "ahon_ln", "lthon", "ftvvn_ln"]

    def bars(ax):  # (x from, x to, y, colour, alpha) of the thick segments
        return sorted((float(ln.get_xdata()[0]), float(ln.get_xdata()[1]), float(ln.get_ydata()[0]),
                       to_hex(ln.get_color()), ln.get_alpha()) for ln in ax.get_lines() if len(ln.get_xdata()) == 2)

    assert bars(a) == [(1.0, 2.0, 0.0, to_hex(FAMILY_COLOUR["random heads"]), None),
                       (3.0, 15.0, 3.0, to_hex(FAMILY_COLOUR["output norm"]), 0.3),
                       (37.0, 38.0, 1.0, to_hex(FAMILY_COLOUR["attention weights"]), None)]
    arrow = next(t for t in a.texts if getattr(t, "arrow_patch", None) is not None)
    assert arrow.xy == (60.0, 2.0) and tuple(arrow.xyann) == (40.0, 2.0)
    spans = [p.get_path().transformed(p.get_patch_transform()).get_extents() for p in a.patches]
    assert [(s.x0, s.x1) for s in spans] == [(1.0, 2.0)]  # random heads' bracket across the panel
    words = {t.get_text().strip(): t.get_position()[1] for t in a.texts if t.get_text()}
    assert words["constant scores"] == 4.0 and words["running"] == 3.0 and words["37"] == 1.0
    crosses = [ln for ln in a.get_lines() if ln.get_marker() == "x"]
    assert [(float(c.get_xdata()[0]), float(c.get_ydata()[0])) for c in crosses] == [(7.4, 1.0)]
    assert [t.get_text() for t in b.texts] == ["not started"] and bars(b) == []
    assert "paper" in [t.get_text() for t in fig.legends[0].get_texts()]
    # a table whose rows have no bracket yet may lack the columns; one lacking a curve's name is refused
    early = crossing_overview(cross[cross.status.isin(["not started", "constant scores"])].drop(
        columns=["bracket_low_pct", "bracket_high_pct"]), by=["model", "task"])
    assert [t.get_text() for t in early.get_axes()[0].texts] == ["constant scores"]
    with pytest.raises(LensHeadsError, match="score_fn"):
        crossing_overview(cross.drop(columns=["score_fn"]), by=["model", "task"])
