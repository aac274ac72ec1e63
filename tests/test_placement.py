"""Models placed by a device map (accelerate): split over the CPU and disk offload, the same
scores, ablated accuracies and diagnosis as the model on one device; surgery refuses a placed
model; ``--revision`` pins a hub id from a snapshot-style local cache, and two revisions never
share a store key."""

from __future__ import annotations

import json
import shutil

import pytest
import torch

from lens_heads import LensHeadsError, load_model

TEXTS = ["The capital of France is Paris. The capital of Italy is Rome.",
         "Attention heads that do nothing are called dormant heads.", "A B C D", "dormant"]


@pytest.fixture(scope="module")
def placed(tiny_model_dir, tmp_path_factory):
    """The tiny llama with layer 1 offloaded to disk and the rest on the CPU."""
    folder = tmp_path_factory.mktemp("offload")
    dm = {"model.embed_tokens": "cpu", "model.rotary_emb": "cpu", "model.layers.0": "cpu",
          "model.layers.1": "disk", "model.norm": "cpu", "lm_head": "cpu"}
    return load_model(str(tiny_model_dir("llama")), device_map=dm, offload_folder=folder)


def test_the_offloaded_layer_is_really_on_disk(placed):
    p = dict(placed.hf_model.named_parameters())
    offloaded = [n for n, t in p.items() if t.device.type == "meta"]
    assert offloaded and all(".layers.1." in n for n in offloaded) and placed.sharded
    w = placed.params()["model.layers.1.self_attn.o_proj.weight"]
    assert w.device.type == "cpu" and w.abs().sum() > 0  # read from the offload


def test_scores_ablation_and_diagnosis_equal_the_model_on_one_device(placed, tiny_model, tmp_path):
    from test_sweep import TASK_ROWS

    from lens_heads.data import load_task
    from lens_heads.surgery.diagnose import diagnose
    from lens_heads.evaluation.evaluate import evaluate_task
    from lens_heads.scores import score_heads

    whole = tiny_model("llama")
    a = score_heads(whole, TEXTS, "all", progress=False)
    b = score_heads(placed, TEXTS, "all", progress=False)
    for sid in a.score_ids:
        torch.testing.assert_close(b.mean[sid], a.mean[sid], atol=1e-5, rtol=1e-5, equal_nan=True, msg=sid)
    rows = tmp_path / "mini.jsonl"
    rows.write_text("".join(json.dumps({"question": q, "choices": c, "answer": a}) + "\n" for q, c, a in TASK_ROWS))
    task = load_task(f"file:{rows}")
    for spec in ("static:0.1,1.2,1.3", "score:ahon_ln@0.9", "random:0.5@1"):
        from lens_heads.interventions.ablation import parse_ablation

        ra = evaluate_task(whole, task, limit=12, ablation=parse_ablation(spec, whole.geometry), progress=False)
        rb = evaluate_task(placed, task, limit=12, ablation=parse_ablation(spec, placed.geometry), progress=False)
        assert [q.pred for q in rb.questions] == [q.pred for q in ra.questions], spec
        assert max(abs(x - y) for qa, qb in zip(ra.questions, rb.questions) for x, y in zip(qa.lls, qb.lls)) < 1e-4
        assert rb.zeroed_fraction == pytest.approx(ra.zeroed_fraction)
    da, db = diagnose(whole, whole.to_tokens(TEXTS)), diagnose(placed, placed.to_tokens(TEXTS))
    assert da.classes == db.classes


def test_surgery_refuses_a_placed_model(placed):
    from lens_heads.surgery.repair import repair

    with pytest.raises(LensHeadsError, match="without a device map"):
        repair(placed, None, TEXTS, TEXTS, None, "/nonexistent/out")


@pytest.mark.parametrize("argv, message", [
    (["--device-map", "everywhere"], "auto, balanced"),
    (["--device-map", "{bad json"], "not JSON"),
    (["--device-map", '{"model.layers.1": "disk"}'], "give --offload-folder"),
    (["--max-memory", "0=1GiB"], "go with --device-map"),
    (["--device-map", "auto", "--max-memory", "lots"], "DEVICE=SIZE"),
    (["--revision", "main"], "pins a hub id"),
])
def test_placement_flags_fail_before_anything_loads(argv, message, tiny_model_dir, capsys, monkeypatch):
    import lens_heads.models as models
    from lens_heads.cli import main

    monkeypatch.setattr(models, "load_model", lambda *a, **k: pytest.fail("loaded"))
    code = main(["info", str(tiny_model_dir("llama")), "--data", "/nonexistent.txt", *argv])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1 and message in err[0], err


# -----------------------------------------------------------------------------
# --revision


@pytest.fixture
def hub_cache(tiny_model_dir, tmp_path, monkeypatch):
    """A snapshot-style HF cache holding owner/tiny at two commits (different weights), main -> A."""
    from safetensors.torch import load_file, save_file

    repo = tmp_path / "hub" / "models--owner--tiny"
    commits = {"a" * 40: 0.0, "b" * 40: 1e-3}
    for commit, bump in commits.items():
        snap = repo / "snapshots" / commit
        shutil.copytree(tiny_model_dir("llama"), snap)
        w = load_file(str(snap / "model.safetensors"))
        save_file({k: v + bump for k, v in w.items()}, str(snap / "model.safetensors"), metadata={"format": "pt"})
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text("a" * 40)
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hub"))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    import huggingface_hub.constants as c

    monkeypatch.setattr(c, "HF_HUB_CACHE", str(tmp_path / "hub"))
    monkeypatch.setattr(c, "HF_HUB_OFFLINE", True)
    return commits


def test_revision_is_resolved_recorded_and_keyed(hub_cache):
    from lens_heads.data import load_task
    from lens_heads.models.load import model_digest
    from lens_heads.viz.study import ModelRef
    from lens_heads.sweep import SweepConfig

    main = load_model("owner/tiny")  # main -> commit a
    b = load_model("owner/tiny", revision="b" * 40)
    assert main.source.revision == "a" * 40 and b.source.revision == "b" * 40
    assert model_digest(main) == f"hub:owner/tiny@{'a' * 40}" and model_digest(b) != model_digest(main)
    assert ModelRef("owner/tiny", revision="b" * 40).digest == model_digest(b)  # no load needed
    task = load_task("piqa")
    cfg = SweepConfig(task="piqa", score_ids=["ahon_ln"], limit=4)
    ka, kb = cfg.identity(main, task).point("none"), cfg.identity(b, task).point("none")
    assert ka.digest != kb.digest
    with pytest.raises(LensHeadsError, match="not in the local HF cache"):
        load_model("owner/tiny", revision="c" * 40)
    assert json.loads(json.dumps(ka.config))["model_digest"].endswith("a" * 40)
