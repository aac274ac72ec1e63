"""RepairReport: report.json in the exact bytes the repair protocol always wrote, committed
reports round-trip byte-identically, unknown keys survive, and bad files fail cleanly."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest

from lens_heads import LensHeadsError
from lens_heads.surgery import RepairPass, RepairReport

RESULTS = Path(__file__).resolve().parents[1] / "analyses" / "results"
COMMITTED = sorted(p for p in RESULTS.rglob("*.json") if p.name == "report.json" or p.name.endswith("_report.json"))


def test_committed_reports_are_found():
    assert len(COMMITTED) >= 2, COMMITTED  # analyses/results/repair_smollm2/{sinks,low_output}_report.json


@pytest.mark.parametrize("path", COMMITTED, ids=lambda p: str(p.relative_to(RESULTS)))
def test_committed_report_round_trips_byte_identically(path, tmp_path):
    report = RepairReport.load(path)
    assert report.extra == {} and all(p.extra == {} for p in report.passes)  # every key is a known field
    assert report.passes and report.passes[0].index == 1 and report.passes[0].trained
    assert report.ppl_before == json.loads(path.read_text())["ppl_before"]
    saved = report.save(tmp_path)  # a folder: saved as report.json in it
    assert saved == tmp_path / "report.json"
    assert saved.read_bytes() == path.read_bytes()
    assert RepairReport.load(tmp_path) == report


def _old_report_json(trained: dict, skipped_pass: int) -> str:
    """What repair() wrote before RepairReport existed (the dict it built, verbatim)."""
    report = dict(model="m", selector="classes dead", config={"passes": 2, "train": {"betas": (0.9, 0.999)}},
                  n_train_chunks=3, n_eval_docs=2, n_eval_tokens=40, n_diag_inputs=4, healthy_before=5,
                  classes_before={"dead": 3, "healthy": 5}, band_before=[1, 2], ppl_before=12.5, passes=[])
    report["passes"].append({"pass": 1, **dict(trained)})
    report["passes"].append({"pass": skipped_pass, **dict(targets=[], note="no heads left to repair")})
    report["wall_s"] = 7.25
    return json.dumps(report, indent=2, default=str)


def test_new_report_writes_the_old_bytes(tmp_path):
    trained = dict(targets=["0.1", "1.2"], n_targets=2, edits=["0.1 q weight rows 16:32"], ppl_after_reinit=20.0,
                   history=[{"epoch": 0, "step": 0, "train_loss": None, "ppl": 20.0}], ppl_final=13.0,
                   steps=4, epochs=1, stopped_early=False, healthy_after=7, classes_after={"dead": 1, "healthy": 7},
                   band_after=[], train_wall_s=1.5)
    report = RepairReport(
        model="m", selector="classes dead", config={"passes": 2, "train": {"betas": (0.9, 0.999)}},
        n_train_chunks=3, n_eval_docs=2, n_eval_tokens=40, n_diag_inputs=4, healthy_before=5,
        classes_before={"dead": 3, "healthy": 5}, band_before=[1, 2], ppl_before=12.5,
        passes=[RepairPass(index=1, **trained), RepairPass(index=2, targets=(), note="no heads left to repair")],
        wall_s=7.25)
    assert report.to_json() == _old_report_json(trained, 2)
    assert report.save(tmp_path / "r.json").read_text() == _old_report_json(trained, 2)
    assert [p.trained for p in report.passes] == [True, False]
    assert report.trained_passes == report.passes[:1]
    with pytest.raises(dataclasses.FrozenInstanceError):
        report.ppl_before = 1.0  # type: ignore[misc]


def test_unknown_and_null_keys_survive_in_place(tmp_path):
    data = json.loads(COMMITTED[0].read_text())
    # an unknown key in the middle, a known optional key with null, an unknown key in a pass
    top = {}
    for k, v in data.items():
        top[k] = v
        if k == "n_eval_docs":
            top["from_a_later_version"] = {"x": [1, 2]}
    top["passes"] = [{**data["passes"][0], "note": None, "lr_used": 5e-5}]
    text = json.dumps(top, indent=2, default=str)
    (tmp_path / "report.json").write_text(text)

    report = RepairReport.load(tmp_path / "report.json")
    assert report.extra == {"from_a_later_version": {"x": [1, 2]}}
    assert report.passes[0].extra == {"lr_used": 5e-5} and report.passes[0].note is None
    assert report.to_json() == text
    # a changed report keeps the unknown keys where they were
    changed = dataclasses.replace(report, ppl_before=1.5)
    assert json.loads(changed.to_json()) == {**top, "ppl_before": 1.5}
    assert list(json.loads(changed.to_json())) == list(top)


def test_bad_report_files(tmp_path):
    with pytest.raises(LensHeadsError, match="cannot read"):
        RepairReport.load(tmp_path / "missing.json")
    (tmp_path / "report.json").write_text("{not json")
    with pytest.raises(LensHeadsError, match="cannot read"):
        RepairReport.load(tmp_path)
    data = json.loads(COMMITTED[0].read_text())
    del data["ppl_before"], data["passes"][0]["targets"]
    (tmp_path / "report.json").write_text(json.dumps(data))
    with pytest.raises(LensHeadsError, match="missing keys ppl_before"):
        RepairReport.load(tmp_path)
    data["ppl_before"] = 1.0
    (tmp_path / "report.json").write_text(json.dumps(data))
    with pytest.raises(LensHeadsError, match="repair pass: missing keys targets"):
        RepairReport.load(tmp_path)
    with pytest.raises(LensHeadsError, match="would overwrite"):
        RepairPass(index=1, targets=(), extra={"pass": 3}).to_dict()
