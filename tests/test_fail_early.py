"""Fail before the work, never after it: bad outputs and inputs are rejected before the model
loads (one line, exit 2, nothing written), writes are all or nothing, a resumed repair must
match its checkpoint, temp files of a killed run go, and two processes on one sweep folder do
each unit once."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from lens_heads import LensHeadsError
from lens_heads.files.atomic import atomic_write_all, check_output_dir, check_output_file
from lens_heads.cli import main as cli_main

# -----------------------------------------------------------------------------
# fixtures: an immutable folder, bad data files, a model loader that must not be reached


@pytest.fixture
def immutable(tmp_path):
    """A folder nobody may write in, root included (``chattr +i``)."""
    folder = tmp_path / "locked"
    folder.mkdir()
    if subprocess.run(["chattr", "+i", str(folder)], capture_output=True).returncode != 0:
        pytest.skip("chattr +i is not supported on this filesystem")
    yield folder
    subprocess.run(["chattr", "-i", str(folder)], check=True)


@pytest.fixture
def bad_files(tmp_path) -> dict[str, Path]:
    files = {"not_utf8.txt": b"\xff\xfeh\x00i\x00\n", "garbage.jsonl": os.urandom(2048),
             "corrupt.parquet": b"PAR1" + os.urandom(1024), "empty.txt": b"\n\n",
             "mc.jsonl": b'{"q": "Which?", "c1": "a", "c2": "b", "a": 0}\n{"q": "Other?", "c1": "c", "c2": "d", "a": 1}\n',
             "mc_bool.jsonl": b'{"q": "Which?", "c1": "a", "c2": "b", "a": true}\n',
             "th_int.json": b'{"piqa": 5}', "th_list.json": b'{"piqa": {"X_Y": [1, 2]}}'}
    for name, data in files.items():
        (tmp_path / name).write_bytes(data)
    return {name: tmp_path / name for name in files}


@pytest.fixture
def no_model(monkeypatch):
    """Every CLI imports load_model at call time: reaching it here is the defect."""
    import lens_heads.models

    def refuse(*a, **k):
        raise AssertionError("the model was loaded before the bad input was rejected")

    monkeypatch.setattr(lens_heads.models, "load_model", refuse)


def _rejected(argv, capsys, *needles, folder: Path | None = None):
    before = sorted(p.name for p in folder.iterdir()) if folder is not None and folder.is_dir() else None
    capsys.readouterr()  # only this call's output
    assert cli_main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "Traceback" not in err, err
    for needle in needles:
        assert needle in err, (needle, err)
    if folder is not None and folder.is_dir():
        assert sorted(p.name for p in folder.iterdir()) == before  # nothing written, no temp left
    return err


# -----------------------------------------------------------------------------
# 2 + 7 + 8: a table of bad inputs, each rejected before the model loads


def _cases(tmp_path, bad, model):
    a_dir = tmp_path / "a_dir.csv"
    a_dir.mkdir()
    a_file = tmp_path / "a_file"
    a_file.write_text("x")
    return [
        # outputs of every subcommand that writes one
        (["score", model, "--data", "c4", "--out", str(a_dir)], ["a_dir.csv is a folder"]),
        (["evaluate", model, "--task", "piqa", "--out", str(a_dir)], ["is a folder"]),
        (["diagnose", model, "--data", "c4", "--out", str(a_dir)], ["is a folder"]),
        (["sweep", model, "--task", "piqa", "--out", str(a_file)], ["exists and is not a folder"]),
        (["repair", model, "--heads", "0.1", "--data", "c4-train", "--out", str(a_file)], ["exists and is not a folder"]),
        (["report", model, "--out", str(a_dir)], ["is a folder"]),
        (["demo", "--model", model, "--out", str(a_file)], ["exists and is not a folder"]),
        (["score", model, "--data", "c4", "--out", str(a_file / "x.csv")], ["is a file, not a folder"]),
        # specs, ranges, names
        (["repair", model, "--select", "nosuch<0.5", "--data", "c4-train", "--out", str(tmp_path / "r")],
         ["unknown score id", "'nosuch'"]),
        (["repair", model, "--heads", "1.x", "--data", "c4-train", "--out", str(tmp_path / "r")], ["bad head '1.x'"]),
        (["evaluate", model, "--task", "piqa", "--ablate", "static:1.x"], ["bad head"]),
        (["evaluate", model, "--task", "piqa", "--ablate", "score:nope@0.3"], ["unknown score", "'nope'"]),
        (["evaluate", model, "--task", "piqa", "--ablate", "random:2@0"], ["probability must be in [0, 1]"]),
        (["evaluate", model, "--task", "piqa", "--limit", "0"], ["--limit must be >= 1"]),
        (["evaluate", model, "--task", "piqa", "--batch-size", "0"], ["--batch-size must be >= 1 or auto"]),
        (["evaluate", model, "--task", "piqa", "--n-shot", "-1"], ["--n-shot must be >= 0"]),
        (["sweep", model, "--task", "piqa", "--ablate", "static:a.b", "--out", str(tmp_path / "s")], ["bad head"]),
        (["sweep", model, "--task", "piqa", "--limit", "0", "--out", str(tmp_path / "s")], ["limit must be >= 1"]),
        (["diagnose", model, "--dead", "2.0", "--out", str(tmp_path / "d.csv")], ["dead = 2.0 must lie in [0, 1)"]),
        (["diagnose", model, "--low-entropy", "-1", "--out", str(tmp_path / "d.csv")], ["low_entropy"]),
        (["diagnose", model, "--bos-sink", "0.97", "--out", str(tmp_path / "d.csv")], ["bos_sink (0.97) above dead"]),
        (["score", model, "--batch-size", "0", "--data", "c4", "--out", str(tmp_path / "s.csv")], ["--batch-size"]),
        # data
        (["score", model, "--data", "c4train", "--out", str(tmp_path / "s.csv")], ["Did you mean 'c4-train'?"]),
        (["score", model, "--data", str(tmp_path / "missing.txt"), "--out", str(tmp_path / "s.csv")],
         ["Text file not found"]),
        (["score", model, "--data", str(bad["not_utf8.txt"]), "--out", str(tmp_path / "s.csv")],
         ["not_utf8.txt: not UTF-8"]),
        (["score", model, "--data", str(bad["garbage.jsonl"]), "--out", str(tmp_path / "s.csv")], ["garbage.jsonl"]),
        (["score", model, "--data", str(bad["corrupt.parquet"]), "--out", str(tmp_path / "s.csv")],
         ["corrupt.parquet: cannot be read as a parquet file"]),
        (["score", model, "--data", str(bad["empty.txt"]), "--out", str(tmp_path / "s.csv")], ["no texts"]),
        (["diagnose", model, "--data", str(bad["not_utf8.txt"]), "--out", str(tmp_path / "d.csv")], ["not UTF-8"]),
        (["repair", model, "--heads", "0.1", "--data", str(bad["corrupt.parquet"]), "--out", str(tmp_path / "r")],
         ["corrupt.parquet"]),
        (["report", model, "--data", "c4train", "--out", str(tmp_path / "r.html")], ["Did you mean"]),
        (["report", model, "--sweep", str(tmp_path / "nosweep"), "--out", str(tmp_path / "r.html")], ["no such folder"]),
        # found by a hostile run of 263 cases (each was a traceback or came after the model loaded)
        (["info", model, "--n-inputs", "0"], ["--n-inputs must be >= 1"]),
        (["info", model, "--data", str(bad["empty.txt"])], ["no texts in"]),
        (["info", model, "--data", "c4x"], ["Did you mean 'c4'?"]),
        (["evaluate", model, "--task", f"file:{bad['mc.jsonl']}?question=q&choices=c1,c2&answer=a&prompt={{q"],
         ["bad prompt or choice template"]),
        (["evaluate", model, "--task", f"file:{bad['mc_bool.jsonl']}?question=q&choices=c1,c2&answer=a"],
         ["answer True is not an integer index"]),
        (["evaluate", model, "--task", "piqa", "--n-shot", "5000"], ["5000-shot needs a few-shot pool"]),
        (["evaluate", model, "--task", "piqa", "--ablate", "score:ahon_ln@inf"], ["finite number"]),
        (["evaluate", model, "--task", "piqa", "--ablate", "score:awft@10%", "--thresholds-file", str(bad["th_int.json"]),
          "--thresholds-model", "X/Y"], ["'piqa' must map model keys"]),
        (["evaluate", model, "--task", "piqa", "--ablate", "score:awft@10%", "--thresholds-file", str(bad["th_list.json"]),
          "--thresholds-model", "X/Y"], ["must map head types to lists"]),
        (["repair", model, "--heads", "0.1", "--data", "c4-train", "--lr", "nan", "--out", str(tmp_path / "r")],
         ["--lr must be a positive number"]),
        (["repair", model, "--heads", "0.1", "--data", "c4-train", "--patience", "-1", "--out", str(tmp_path / "r")],
         ["--patience must be >= 1"]),
        (["repair", model, "--heads", "0.1", "--data", "c4-train", "--chunk-len", "1", "--out", str(tmp_path / "r")],
         ["--chunk-len must be >= 2"]),
        (["repair", model, "--heads", "0.1", "--data", "c4-train", "--eval-data", str(bad["empty.txt"]),
          "--out", str(tmp_path / "r")], ["no texts in"]),
        (["sweep", model, "--task", "piqa", "--status", "--out", str(tmp_path / "nosweep")], ["holds no baseline", "no folder"]),
        (["diagnose", model, "--prompt", "", "--out", str(tmp_path / "d.csv")], ["--prompt is empty"]),
        (["diagnose", model, "--out", str(tmp_path / "nope" / "d.csv")], ["does not exist"]),
        (["report", model, "--heads", "1.x", "--out", str(tmp_path / "r.html")], ["bad head '1.x'"]),
        (["demo", "--model", model, "--limit", "500", "--out", str(tmp_path / "dm")], ["the demo ships 200"]),
        (["demo", "--model", model, "--random-seeds", "-1", "--out", str(tmp_path / "dm")], ["--random-seeds must be >= 0"]),
        # issue 38: a dash-led value is the option's value (argparse took it for an option); options
        # that would be ignored are refused
        (["sweep", model, "--task", "piqa", "--shard", "-1/2", "--out", str(tmp_path / "s")],
         ["--shard '-1/2'", "0 <= I < N"]),
        (["sweep", model, "--task", "piqa", "--fractions", "-0.1,0.2", "--out", str(tmp_path / "s")], ["-0.1"]),
        (["sweep", model, "--task", "piqa", "--shard", "0/2", "--workers", "2", "--out", str(tmp_path / "s")],
         ["--workers N launches N local processes", "give one of them"]),
        (["sweep", model, "--task", "piqa", "--ray-address", "auto", "--out", str(tmp_path / "s")],
         ["--ray-address goes with --executor ray"]),
        # issue 38: a Ray address that is none
        (["sweep", model, "--task", "piqa", "--executor", "ray", "--ray-address", "nohost", "--out", str(tmp_path / "s")],
         ["--ray-address 'nohost': write auto, HOST:PORT or ray://HOST:PORT"]),
        # a second hostile run: prune options that only --eval reads were ignored without it
        (["prune", model, "--heads", "0.1", "--limit", "3", "--out", str(tmp_path / "p")], ["--limit goes with --eval"]),
        (["prune", model, "--heads", "0.1", "--n-boot", "50", "--out", str(tmp_path / "p")],
         ["--n-boot goes with --eval"]),
    ]


def test_bad_inputs_rejected_before_the_model_loads(tmp_path, bad_files, no_model, capsys, shared_data, monkeypatch):
    monkeypatch.setenv("LENS_HEADS_DATA", str(shared_data))
    work = tmp_path / "work"
    work.mkdir()
    for argv, needles in _cases(work, bad_files, "smollm2-135m"):
        _rejected(argv, capsys, *needles, folder=work)
    assert not any((work / name).exists() for name in ("r", "s", "dm", "p"))


def test_head_ranges_are_checked_from_the_config_before_the_model_loads(tiny_model_dir, no_model, capsys,
                                                                       tmp_path, shared_data, monkeypatch):
    """A head outside the model, or a prune emptying a layer, is rejected from the config alone
    (2 layers x 4 heads here), before any weights load."""
    monkeypatch.setenv("LENS_HEADS_DATA", str(shared_data))
    model = str(tiny_model_dir("llama"))
    work = tmp_path / "work"
    work.mkdir()
    out = ["--out", str(work / "o")]
    earlier = work / "earlier"  # an earlier lm-eval run's folder is never overwritten
    pruned = tmp_path / "pruned"  # a pruned model's config says so: no weights needed to refuse pruning it again
    pruned.mkdir()
    config = json.loads((Path(model) / "config.json").read_text())
    (pruned / "config.json").write_text(json.dumps({**config, "lens_heads_pruned": {  # 0.1 removed (a padding head)
        "attn": "self_attn", "d_head": 16, "k": "k_proj", "keep_kv": [[0, 1], [0, 1]],
        "keep_q": [[0, 1, 2, 3], [0, 1, 2, 3]], "layers": "model.layers", "layout": "separate", "out": "o_proj",
        "pad_q": [[1], []], "q": "q_proj", "v": "v_proj"}}))
    earlier.mkdir()
    (earlier / "results.json").write_text("{}")
    for argv, needles in [
        (["prune", model, "--heads", "99.0", *out], ["head 99.0 out of range", "2 layers x 4 heads"]),
        (["prune", model, "--heads", "1.9", *out], ["head 1.9 out of range"]),
        (["prune", model, "--heads", "0.0,0.1,0.2,0.3", *out], ["every head of layer 0", "--allow-empty-layers"]),
        (["prune", str(pruned), "--heads", "0.1", *out], ["pruned already"]),  # was found after the load
        (["lm-eval", model, "--tasks", "arc_easy", "--ablate", "static:99.0", *out], ["head 99.0 out of range"]),
        (["lm-eval", model, "--tasks", "arc_easy", "--out", str(earlier)], ["holds an earlier run (results.json)"]),
        (["evaluate", model, "--task", "piqa", "--ablate", "static:0.7"], ["head 0.7 out of range"]),
        (["sweep", model, "--task", "piqa", "--ablate", "static:5.0", *out], ["head 5.0 out of range"]),
        (["repair", model, "--heads", "3.1", "--data", "c4-train", *out], ["head 3.1 out of range"]),
    ]:
        _rejected(argv, capsys, *needles, folder=work)


def test_a_sweep_folder_of_other_weights_is_refused_before_the_model_loads(tiny_model_dir, no_model, capsys,
                                                                         tmp_path, shared_data, monkeypatch):
    """The in-process sweep refused another model's folder only after loading its own weights
    (26 s for SmolLM2; the launcher and --shard: 2 s): the weights' digest is compared first
    (hostile run)."""
    monkeypatch.setenv("LENS_HEADS_DATA", str(shared_data))
    out = tmp_path / "sweep"
    out.mkdir()
    (out / "summary.csv").write_text("model,model_digest,score_fn,fraction,accuracy\nother,"
                                     + "ab" * 32 + ",none,0.0,0.5\n")
    for extra in ([], ["--paper-protocol"]):
        _rejected(["sweep", str(tiny_model_dir("llama")), "--task", "piqa", "--scores", "awft", "--limit", "4",
                   "--no-progress", "--out", str(out), *extra], capsys, "from other weights (abababab", folder=out)


def test_unwritable_output_folder_for_every_subcommand(immutable, no_model, capsys, shared_data, monkeypatch):
    monkeypatch.setenv("LENS_HEADS_DATA", str(shared_data))
    m = "smollm2-135m"
    for argv in (["score", m, "--data", "c4", "--out", str(immutable / "s.csv")],
                 ["evaluate", m, "--task", "piqa", "--out", str(immutable / "e.jsonl")],
                 ["diagnose", m, "--data", "c4", "--out", str(immutable / "d.csv")],
                 ["sweep", m, "--task", "piqa", "--out", str(immutable / "sweep")],
                 ["repair", m, "--heads", "0.1", "--data", "c4-train", "--out", str(immutable / "rep")],
                 ["report", m, "--out", str(immutable / "r.html")],
                 ["demo", "--model", m, "--out", str(immutable / "demo")]):
        _rejected(argv, capsys, "cannot write in", str(immutable), folder=immutable)


def test_unreplaceable_output_file(tmp_path, no_model, capsys, shared_data, monkeypatch):
    monkeypatch.setenv("LENS_HEADS_DATA", str(shared_data))
    target = tmp_path / "old.csv"
    target.write_text("kept")
    if subprocess.run(["chattr", "+i", str(target)], capture_output=True).returncode != 0:
        pytest.skip("chattr +i is not supported on this filesystem")
    try:
        for argv in (["score", "smollm2-135m", "--data", "c4", "--out", str(target)],
                     ["diagnose", "smollm2-135m", "--data", "c4", "--out", str(target)]):
            _rejected(argv, capsys, "cannot replace", "old.csv", folder=tmp_path)
    finally:
        subprocess.run(["chattr", "-i", str(target)], check=True)
    assert target.read_text() == "kept"


def test_output_checks_api(tmp_path):
    (tmp_path / "f").write_text("x")
    with pytest.raises(LensHeadsError, match="folder .* does not exist"):
        check_output_file(tmp_path / "nope" / "x.csv")
    assert check_output_file(tmp_path / "nope" / "x.csv", make_parents=True)
    assert not (tmp_path / "nope").exists()  # checking creates nothing
    with pytest.raises(LensHeadsError, match="sidecar.json is a folder"):
        (tmp_path / "sidecar.json").mkdir()
        check_output_file(tmp_path / "t.csv", sidecars=[tmp_path / "sidecar.json"])
    with pytest.raises(LensHeadsError, match="is a file, not a folder"):
        check_output_dir(tmp_path / "f" / "deeper" / "out")
    assert check_output_dir(tmp_path / "a" / "b" / "c") and not (tmp_path / "a").exists()


def test_head_scores_least_active_names_what_was_scored(tiny_model):
    from lens_heads.scores import score_heads

    hs = score_heads(tiny_model("llama"), ["The capital of France is Paris."], scores="ahon_ln", progress=False)
    with pytest.raises(LensHeadsError, match="'awft' was not scored; these scores hold: ahon_ln"):
        hs.least_active("awft")


# -----------------------------------------------------------------------------
# 3: all-or-nothing writes


def test_atomic_write_all_undoes_a_failed_rename(tmp_path, monkeypatch):
    a, b, c = tmp_path / "a.csv", tmp_path / "a.csv.meta.json", tmp_path / "a.csv.per_input"
    a.write_text("old a")
    b.write_text("old b")  # c does not exist yet
    real = os.replace
    calls = {"n": 0}

    def flaky(src, dst):
        if str(dst) == str(c):  # the third file's commit fails, after a and b are in place
            raise OSError(28, "No space left on device")
        calls["n"] += 1
        return real(src, dst)

    monkeypatch.setattr(os, "replace", flaky)
    with pytest.raises(OSError, match="No space"):
        atomic_write_all([(a, lambda f: Path(f).write_text("new a")), (b, lambda f: Path(f).write_text("new b")),
                          (c, lambda f: Path(f).write_text("new c"))])
    monkeypatch.setattr(os, "replace", real)
    assert a.read_text() == "old a" and b.read_text() == "old b" and not c.exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a.csv", "a.csv.meta.json"]  # no temp or kept file
    assert calls["n"] > 0  # the failure came after some renames had happened


def test_atomic_write_all_refuses_a_folder_target_before_writing(tmp_path):
    (tmp_path / "d.csv").mkdir()
    meta = tmp_path / "d.csv.meta.json"
    with pytest.raises(LensHeadsError, match="is a folder"):
        atomic_write_all([(meta, lambda f: Path(f).write_text("m")), (tmp_path / "d.csv", lambda f: None)])
    assert not meta.exists()  # the sidecar was not renamed into place (the defect: an orphan)


# -----------------------------------------------------------------------------
# 1: a resumed repair must match its checkpoint; its wall time counts every segment


def test_resume_with_other_settings_is_refused_and_wall_time_adds_up(tiny_model, tmp_path):
    from lens_heads.surgery import TrainConfig, plan_surgery, reinitialise, train_surgery

    model = tiny_model("llama")
    plan = plan_surgery(model.geometry, [(0, 1), (1, 2)], "q_only")
    g = torch.Generator().manual_seed(0)
    chunks = [torch.randint(4, 300, (12,), generator=g) for _ in range(6)]
    held = [torch.randint(4, 300, (12,), generator=g) for _ in range(2)]
    cfg = TrainConfig(max_steps=5, grad_accum=2, lr=1e-3, checkpoint_every=1, epochs=1, seed=3)
    ident = {"data_sha256": "abc", "repair_seed": 0}

    def fresh():
        hf = model.load_hf_model()
        reinitialise(hf, plan, seed=0)
        return hf

    class Stop(Exception):
        pass

    def stop_at_2(step, loss):
        if step == 2:
            raise Stop

    with pytest.raises(Stop):
        train_surgery(fresh(), plan, chunks, held, cfg, tmp_path / "ck", on_step=stop_at_2, identity=ident)
    state = torch.load(tmp_path / "ck" / "step-000002" / "state.pt", weights_only=False)
    first = state["wall_s"]
    assert first > 0
    from dataclasses import replace

    with pytest.raises(LensHeadsError, match=r"other settings \(lr: checkpoint 0.001, now 0.01; seed: checkpoint 3, now 7\)"):
        train_surgery(fresh(), plan, chunks, held, replace(cfg, lr=1e-2, seed=7), tmp_path / "ck", identity=ident)
    with pytest.raises(LensHeadsError, match="data_sha256: checkpoint 'abc', now 'xyz'"):
        train_surgery(fresh(), plan, chunks, held, cfg, tmp_path / "ck", identity={**ident, "data_sha256": "xyz"})
    res = train_surgery(fresh(), plan, chunks, held, replace(cfg, checkpoint_every=2), tmp_path / "ck", identity=ident)
    assert res.steps == 5 and res.wall_s > first  # checkpoint frequency may change; the segments add up


def test_cli_repair_resume_with_other_lr_is_refused(tiny_model_dir, tmp_path, capsys):
    data = tmp_path / "train.txt"
    data.write_text("\n".join(["The capital of France is Paris.", "Dormant heads attend to the first token."] * 40))
    out = tmp_path / "rep"
    base = ["repair", str(tiny_model_dir("llama")), "--heads", "0.1,1.2", "--data", str(data), "--n-eval", "4",
            "--eval-len", "32", "--diag-n", "4", "--diag-len", "32", "--chunk-len", "32", "--steps", "2",
            "--grad-accum", "2", "--passes", "1", "--checkpoint-every", "1", "--out", str(out), "--quiet"]
    assert cli_main(base + ["--lr", "1e-3"]) == 0
    report = json.loads((out / "report.json").read_text())
    err = _rejected(base + ["--lr", "5e-3", "--seed", "7"], capsys, "lr: checkpoint 0.001, now 0.005", "--no-resume")
    assert "seed" in err
    assert json.loads((out / "report.json").read_text()) == report  # not rewritten with the new settings


# -----------------------------------------------------------------------------
# 5: a killed export's temp folder goes with the next run


def _dead_pid() -> int:
    p = subprocess.Popen([sys.executable, "-c", "pass"])
    p.wait()
    return p.pid


def _aged(path: Path, seconds: float = 600) -> Path:
    t = time.time() - seconds
    os.utime(path, (t, t))
    return path


def test_stale_export_temp_is_removed(tiny_model, tmp_path):
    """A killed export's staging folder goes (this host's dead pid; an unowned one from an older
    version once it is a minute old); a live export's stays; the files get plain permissions."""
    from lens_heads.surgery import export_model

    out = tmp_path / "exported"
    host = socket.gethostname()
    stale = [out / f".export.lh-{host}-{_dead_pid()}-k1ll3d_x", out / ".export.abc123"]
    live = out / f".export.lh-{host}-{os.getppid()}-l1ve0000"
    for d in (*stale, live):
        d.mkdir(parents=True)
        (d / "model.safetensors").write_bytes(b"\0" * 1024)
    _aged(stale[1])
    model = tiny_model("llama")
    export_model(model.load_hf_model(), model.tokenizer, out)
    assert not any(d.exists() for d in stale) and live.is_dir() and (out / "config.json").is_file()
    assert [p.name for p in out.iterdir() if p.name.startswith(".")] == [live.name]
    umask = os.umask(0)
    os.umask(umask)
    assert {f.name: oct(f.stat().st_mode & 0o777) for f in out.iterdir() if f.is_file()} == \
           {f.name: oct(0o666 & ~umask) for f in out.iterdir() if f.is_file()}


def test_a_killed_prune_does_not_block_its_rerun(tiny_model_dir, tmp_path, capsys):
    """The only thing in --out is a killed prune's staging folder: the rerun removes it and
    prunes; a live prune's staging folder still makes the folder 'not empty'."""
    out = tmp_path / "pruned"
    killed = out / f".export.lh-{socket.gethostname()}-{_dead_pid()}-k1ll3d_x"
    killed.mkdir(parents=True)
    (killed / "model.safetensors").write_bytes(b"\0" * 4096)
    assert cli_main(["prune", str(tiny_model_dir("llama")), "--heads", "0.1", "--out", str(out)]) == 0
    assert not killed.exists() and (out / "model.safetensors").is_file()
    live_out = tmp_path / "busy"
    (live_out / f".export.lh-{socket.gethostname()}-{os.getppid()}-l1ve0000").mkdir(parents=True)
    _rejected(["prune", str(tiny_model_dir("llama")), "--heads", "0.1", "--out", str(live_out)], capsys,
              "is not empty", folder=live_out)


def test_a_killed_writers_temp_files_are_removed_by_the_next_write(tiny_model_dir, tmp_path, shared_data,
                                                                  monkeypatch):
    """``score --out`` killed just before its rename leaves a temp file beside the CSV; the next
    write of that file removes it (a dead writer of this host, an unowned temp a minute old),
    never a live writer's."""
    monkeypatch.setenv("LENS_HEADS_DATA", str(shared_data))
    out = tmp_path / "scores.csv"
    host = socket.gethostname()
    dead = tmp_path / f".scores.csv.lh-{host}-{_dead_pid()}-abcd1234.tmp"
    unowned = tmp_path / ".scores.csv.x1y2z3w4.tmp"
    kept_aside = tmp_path / f".scores.csv.lh-{host}-{_dead_pid()}-efgh5678.old"
    live = tmp_path / f".scores.csv.lh-{host}-{os.getppid()}-l1ve0000.tmp"
    fresh_unowned = tmp_path / ".scores.csv.q9r8s7t6.tmp"
    for f in (dead, unowned, kept_aside, live, fresh_unowned):
        f.write_text("half")
    _aged(unowned)
    assert cli_main(["score", str(tiny_model_dir("llama")), "--data", "c4", "--n-inputs", "2", "--max-len", "16",
                     "--scores", "ahon_ln", "--out", str(out)]) == 0
    assert out.is_file() and not dead.exists() and not unowned.exists() and not kept_aside.exists()
    assert live.exists() and fresh_unowned.exists()


# -----------------------------------------------------------------------------
# 6: two processes on one sweep folder do each unit once

_WORKER = r"""
import json, os, sys, time
import lens_heads.evaluation.evaluate as ev
from lens_heads import load_model
from lens_heads.sweep import SweepConfig, run_sweep

real = ev.evaluate_task
def counted(*a, **k):
    res = real(*a, **k)
    time.sleep(0.3)  # a unit that takes a while, so the two processes overlap
    with open(sys.argv[3], "a") as f:
        f.write(json.dumps({"pid": os.getpid(), "ablation": res.config["ablation"], "n": len(res.questions)}) + "\n")
    return res
ev.evaluate_task = counted
model = load_model(sys.argv[1])
cfg = SweepConfig(task=sys.argv[4], score_ids=["ahon_ln", "awft"], fractions=[0, 0.1, 0.3], random_seeds=[0],
                  chunk_questions=2, batch_size=4, n_boot=50)
run_sweep(model, cfg, sys.argv[2], progress=False)
"""


def test_two_processes_on_one_sweep_folder_share_the_work(tiny_model_dir, tmp_path, shared_data):
    script = tmp_path / "worker.py"
    script.write_text(_WORKER)
    rows = [{"goal": f"How do I fix thing number {i}?", "sol1": "Use water and soap." if i % 3 else "Ask a friend.",
             "sol2": "Hit it with a big hammer.", "label": i % 2} for i in range(8)]
    (tmp_path / "mc.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    task = f"file:{tmp_path / 'mc.jsonl'}?question=goal&choices=sol1,sol2&answer=label"
    model = str(tiny_model_dir("llama"))
    env = {**os.environ, "LENS_HEADS_DATA": str(shared_data), "OMP_NUM_THREADS": "1"}

    def run(out, log, n):
        procs = [subprocess.Popen([sys.executable, str(script), model, str(out), str(log), task], env=env,
                                  stderr=subprocess.PIPE, text=True) for _ in range(n)]
        for p in procs:
            _, err = p.communicate(timeout=600)
            assert p.returncode == 0, err
        return [json.loads(line) for line in Path(log).read_text().splitlines()]

    alone = run(tmp_path / "alone", tmp_path / "alone.log", 1)
    both = run(tmp_path / "shared", tmp_path / "shared.log", 2)
    assert len(both) == len(alone) == 4 * 7  # 7 distinct points (baseline, 2 x 2 scores, 2 random) x 4 parts
    assert sorted((r["ablation"], r["n"]) for r in both) == sorted((r["ablation"], r["n"]) for r in alone)
    for name in ("summary.csv", "within_1pt.csv"):
        assert (tmp_path / "shared" / name).read_bytes() == (tmp_path / "alone" / name).read_bytes()
    assert not list((tmp_path / "shared").rglob("*.claim"))
    assert len({r["pid"] for r in both}) == 2  # both took units


def test_claims_stale_rules(tmp_path, monkeypatch):
    """A claim is stale when its owner is gone: a dead pid on this host, this process's own pid
    without holding it (a reused pid after a restart), an untouched claim past STALE_S, or a
    garbled file past STALE_S; a live holder's claim is not."""
    import json
    import socket
    import time

    from lens_heads.files import claims

    rec = tmp_path / "unit.json"
    c = claims.claim_path(rec)
    me = {"host": socket.gethostname(), "pid": os.getpid(), "since": time.time()}
    c.write_text(json.dumps(me))
    assert claims.is_stale(rec)  # our pid, not held by us: left by an earlier process with our pid
    assert claims.try_claim(rec) and claims.owner(rec)["pid"] == os.getpid()
    c.unlink()
    with claims.claim(rec) as mine:
        assert mine and not claims.is_stale(rec) and not claims.try_claim(rec)  # held here: live
    assert not c.exists()
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    c.write_text(json.dumps({**me, "pid": int(dead.stdout)}))
    assert claims.is_stale(rec)  # that process has exited
    c.write_text(json.dumps({**me, "host": "elsewhere"}))
    assert not claims.is_stale(rec)
    old = time.time() - claims.STALE_S - 5
    os.utime(c, (old, old))
    assert claims.is_stale(rec)  # no heartbeat for STALE_S
    c.write_text("[1, 2")  # garbled: judged by age
    assert not claims.is_stale(rec)
    os.utime(c, (old, old))
    assert claims.is_stale(rec) and claims.try_claim(rec)
    claims.release(rec)


def test_store_get_tolerates_a_record_removed_meanwhile(tmp_path, monkeypatch):
    from lens_heads.results.keys import Kind, StoreKey
    from lens_heads.results.store import ResultStore

    store, key = ResultStore(tmp_path), StoreKey(Kind.PART, {"a": 1})
    store.put(key, {"x": 1})
    path = store.path(key)
    real = Path.read_text

    def vanish(self, *a, **k):
        if self == path:
            path.unlink()
        return real(self, *a, **k)

    monkeypatch.setattr(Path, "read_text", vanish)
    assert store.get(key) is None  # another process merged and discarded it


@pytest.mark.parametrize("kind,files,msg", [
    ("diagnosis", {"d.csv": "layer,head,bos_mass,entropy,class\n0,0,abc,1.0,healthy\n"}, "not numbers"),
    ("diagnosis", {"d.csv": "layer,head,bos_mass,entropy\nx,0,0.5,1.0\n"}, "must hold integers"),
    ("scores", {"s.csv": "layer,head,score_fn,value\n0,0,foo,1.0\n"}, "unknown score function"),
    ("scores", {"s.csv": "layer,head,score_fn,value\n0,0,awft,1.0\n", "s.csv.meta.json": "{trunc"}, "corrupt scores"),
    ("sweep", {"summary.csv": "score_fn,fraction,pct_zeroed,accuracy,seed\nnone,0,0,0.5,x\n"}, "non-numbers"),
    ("sweep", {"summary.csv": "score_fn,fraction,pct_zeroed,accuracy,threshold\nawft,0.1,5,0.5,high\n"}, "non-numbers"),
])
def test_saved_results_that_cannot_be_read_give_one_message(tmp_path, kind, files, msg):
    """The readers the report (and notebooks) use: a bad file is one LensHeadsError, never a traceback."""
    from lens_heads.surgery.diagnose import Diagnosis
    from lens_heads.scores import HeadScores
    from lens_heads.sweep import SweepResult

    for name, text in files.items():
        (tmp_path / name).write_text(text)
    reader, target = {"diagnosis": (Diagnosis.load, tmp_path / "d.csv"), "scores": (HeadScores.load, tmp_path / "s.csv"),
                      "sweep": (SweepResult.load, tmp_path)}[kind]
    with pytest.raises(LensHeadsError, match=msg):
        reader(target)
