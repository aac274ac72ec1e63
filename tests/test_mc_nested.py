"""The local multiple-choice loader on the hub's nested schemas (ARC / OpenBookQA / CommonsenseQA):
dotted field paths, per-row label lists (``labels_field``), their errors, and the CLI.

The files are built from real MMLU rows (shared data), relabelled per row; every loaded
question, choice list and gold index is checked against the MMLU CSV read here directly.
"""

from __future__ import annotations

import csv
import json
from pathlib import Path

import pytest

from lens_heads.data import data_root, load_mc_file, load_task, parse_mc_spec
from lens_heads.errors import LensHeadsError

SUBJECTS = ["astronomy", "virology"]
# label schemes cycled over rows: letters, digits, and a permuted order (gold = position of answerKey)
SCHEMES = [list("ABCD"), list("1234"), list("BADC"), ["4", "3", "2", "1"]]


def mmlu_rows() -> list[dict]:
    """10 MMLU test rows (5 per subject) as read by the csv module: question, choices, gold, subject."""
    root = data_root()
    if root is None or not all((root / f"mmlu/test/{s}_test.csv").exists() for s in SUBJECTS):
        pytest.skip("shared MMLU test files not found (set LENS_HEADS_DATA)")
    out = []
    for s in SUBJECTS:
        with open(root / f"mmlu/test/{s}_test.csv", encoding="utf-8", newline="") as f:
            for row in list(csv.DictReader(f))[:5]:
                out.append({"question": row["question"], "choices": [row[f"choice{j}"] for j in range(4)],
                            "gold": int(row["answer"]), "subject": s})
    assert len(out) == 10 and len({r["gold"] for r in out}) > 1
    return out


def arc_rows(src: list[dict], nested_question: bool = False) -> list[dict]:
    """ARC-style rows (CommonsenseQA-style ``question.stem`` with ``nested_question``)."""
    rows = []
    for i, r in enumerate(src):
        labels = SCHEMES[i % len(SCHEMES)]
        q = {"stem": r["question"], "meta": {"subject": r["subject"]}} if nested_question else r["question"]
        rows.append({"id": f"q{i}", "question": q, "choices": {"text": r["choices"], "label": labels},
                     "answerKey": labels[r["gold"]]})
    return rows


def write_jsonl(path: Path, rows: list[dict]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def check_against_mmlu(task, src: list[dict]) -> None:
    assert len(task) == len(src)
    for rec, r in zip(task.records, src):
        assert rec.question == r["question"]
        assert rec.choices == r["choices"]
        assert rec.gold == r["gold"]


# -----------------------------------------------------------------------------
# Loading


def test_arc_schema_kwargs_and_file_spec(tmp_path):
    src = mmlu_rows()
    rows = arc_rows(src)
    # the file really mixes label schemes, and letter order != gold order in some rows
    assert {r["choices"]["label"][0] for r in rows} == {"A", "1", "B", "4"}
    p = write_jsonl(tmp_path / "arc.jsonl", rows)
    kw = load_mc_file(p, question="question", choices="choices.text", labels_field="choices.label",
                      answer="answerKey", answer_type="label")
    check_against_mmlu(kw, src)
    spec = load_task(f"file:{p}?question=question&choices=choices.text&labels_field=choices.label"
                     f"&answer=answerKey&answer_type=label")
    check_against_mmlu(spec, src)
    # answer_type defaults to "label" once labels_field is given
    implicit = load_task(f"file:{p}?question=question&choices=choices.text&labels_field=choices.label&answer=answerKey")
    assert [r.gold for r in implicit] == [r["gold"] for r in src]
    assert parse_mc_spec(f"file:{p}?choices=choices.text&labels_field=choices.label")[1] == {
        "choices": "choices.text", "labels_field": "choices.label"}


def test_nested_question_subject_and_row_labels_in_choices(tmp_path):
    src = mmlu_rows()
    p = write_jsonl(tmp_path / "csqa.jsonl", arc_rows(src, nested_question=True))
    task = load_task(f"file:{p}?question=question.stem&subject=question.meta.subject&choices=choices.text"
                     f"&labels_field=choices.label&answer=answerKey&choice={{label}}"
                     f"&prompt={{question}}\\nAnswer:")
    check_against_mmlu(task, src)
    assert [r.subject for r in task] == [r["subject"] for r in src]
    for i, rec in enumerate(task.records):  # {label} is the row's own label
        assert task.build(rec) == [(src[i]["question"] + "\nAnswer:", " " + lab) for lab in SCHEMES[i % len(SCHEMES)]]
    # list indices: one field per choice, by position
    by_index = load_mc_file(p, question="question.stem", choices=[f"choices.text.{j}" for j in range(4)],
                            labels_field="choices.label", answer="answerKey")
    check_against_mmlu(by_index, src)


def test_nested_csv_cell_and_parquet_struct(tmp_path):
    src = mmlu_rows()
    rows = arc_rows(src)
    c = tmp_path / "arc.csv"
    with open(c, "w", newline="", encoding="utf-8") as f:
        w = csv.DictWriter(f, fieldnames=["question", "choices", "answerKey"])
        w.writeheader()
        for r in rows:
            w.writerow({"question": r["question"], "choices": json.dumps(r["choices"]), "answerKey": r["answerKey"]})
    check_against_mmlu(load_mc_file(c, choices="choices.text", labels_field="choices.label", answer="answerKey"), src)
    pa = pytest.importorskip("pyarrow")
    import pyarrow.parquet as pq

    pq_path = tmp_path / "arc.parquet"
    pq.write_table(pa.Table.from_pylist(rows), pq_path)
    spec = f"file:{pq_path}?choices=choices.text&labels_field=choices.label&answer=answerKey"
    check_against_mmlu(load_task(spec), src)


def test_literal_dotted_key_wins(tmp_path):
    p = write_jsonl(tmp_path / "dots.jsonl", [
        {"q.text": "lit", "q": {"text": "nested"}, "o": {"a.b": ["x", "y"]}, "ans": 1},
        {"q.text": "lit2", "q": {"text": "nested2"}, "o": {"a.b": ["u", "v"]}, "ans": 0},
    ])
    t = load_mc_file(p, question="q.text", choices="o.a.b", answer="ans")
    assert [r.question for r in t] == ["lit", "lit2"] and t.records[1].choices == ["u", "v"]
    assert [r.gold for r in t] == [1, 0]


# -----------------------------------------------------------------------------
# Errors: one LensHeadsError naming the file, the row and the field


@pytest.fixture
def arc_file(tmp_path) -> Path:
    rows = [{"question": f"q{i}", "choices": {"text": ["a", "b", "c"], "label": ["A", "B", "C"]}, "answerKey": "B"}
            for i in range(3)]
    rows[2]["choices"]["label"] = ["1", "2", "3"]
    rows[2]["answerKey"] = "3"
    return write_jsonl(tmp_path / "arc.jsonl", rows)


def _error(path: Path, rows: list[dict] | None = None, **kw) -> str:
    if rows is not None:
        write_jsonl(path, rows)
    with pytest.raises(LensHeadsError) as e:
        load_mc_file(path, **kw)
    msg = str(e.value)
    assert str(path) in msg and "\n" not in msg
    return msg


def test_bad_dotted_path(arc_file):
    ok = dict(choices="choices.text", labels_field="choices.label", answer="answerKey")
    assert [r.gold for r in load_mc_file(arc_file, **ok)] == [1, 1, 2]
    msg = _error(arc_file, **{**ok, "choices": "choices.txt"})
    assert "row 0" in msg and "'choices.txt'" in msg and "'choices' has no key 'txt'" in msg
    assert "'text', 'label'" in msg
    msg = _error(arc_file, **{**ok, "question": "question.stem"})
    assert "row 0" in msg and "'question.stem'" in msg and "'question' holds str" in msg and "'stem'" in msg
    msg = _error(arc_file, **{**ok, "question": "query.stem"})
    assert "no field 'query'" in msg and "'question', 'choices', 'answerKey'" in msg
    msg = _error(arc_file, **{**ok, "choices": [f"choices.text.{j}" for j in range(4)]})
    assert "'choices.text.3'" in msg and "list of 3" in msg and "0..2" in msg
    # only one row lacks the key: the message names that row
    rows = [json.loads(x) for x in arc_file.read_text().splitlines()]
    del rows[1]["choices"]["label"]
    msg = _error(arc_file, rows, **ok)
    assert "row 1" in msg and "'choices.label'" in msg and "labels_field" in msg and "keys there: 'text'" in msg


def test_bad_labels(arc_file):
    ok = dict(choices="choices.text", labels_field="choices.label", answer="answerKey")
    rows = [json.loads(x) for x in arc_file.read_text().splitlines()]
    rows[2]["answerKey"] = "C"  # a letter, but row 2 is labelled 1..3
    msg = _error(arc_file, rows, **ok)
    assert "row 2" in msg and "'answerKey'" in msg and "'C'" in msg and "['1', '2', '3']" in msg
    assert "'choices.label'" in msg
    rows[2]["answerKey"] = "3"
    rows[1]["choices"]["label"] = ["A", "B"]
    msg = _error(arc_file, rows, **ok)
    assert "row 1" in msg and "2 labels" in msg and "3 choices" in msg and "'choices.label'" in msg
    rows[1]["choices"]["label"] = "A"
    msg = _error(arc_file, rows, **ok)
    assert "row 1" in msg and "'choices.label'" in msg and "list of labels" in msg
    rows[1]["choices"]["label"] = ["A", "A", "B"]
    assert "repeats a label" in _error(arc_file, rows, **ok)
    assert "not both" in _error(arc_file, None, **ok, labels="ABC")


# -----------------------------------------------------------------------------
# CLI


def test_cli_evaluate_arc_file(tiny_model_dir, tmp_path, capsys):
    from lens_heads.cli import main

    src = mmlu_rows()[:6]
    p = write_jsonl(tmp_path / "arc.jsonl", arc_rows(src))
    out = tmp_path / "res.jsonl"
    task = (f"file:{p}?question=question&choices=choices.text&labels_field=choices.label&answer=answerKey"
            f"&answer_type=label&prompt=Question: {{question}}\\nAnswer:")
    rc = main(["evaluate", str(tiny_model_dir("llama")), "--task", task, "--out", str(out), "--quiet"])
    assert rc == 0
    lines = [json.loads(x) for x in out.read_text().splitlines()]
    assert sorted(r["doc_id"] for r in lines) == list(range(6))
    for row in lines:
        assert row["gold"] == src[row["doc_id"]]["gold"] and len(row["lls"]) == 4


def test_cli_bad_dotted_path_fails_before_model(tmp_path, capsys, monkeypatch):
    import lens_heads.models
    from lens_heads.cli import main

    def no_load(*a, **k):
        raise AssertionError("the model was loaded before the task was checked")

    monkeypatch.setattr(lens_heads.models, "load_model", no_load)
    p = write_jsonl(tmp_path / "arc.jsonl", arc_rows(mmlu_rows()))
    out = tmp_path / "res.jsonl"
    task = f"file:{p}?question=question&choices=choices.txt&labels_field=choices.label&answer=answerKey"
    rc = main(["evaluate", str(tmp_path / "no-model"), "--task", task, "--out", str(out), "--quiet"])
    err = capsys.readouterr().err
    assert rc == 2 and not out.exists()
    assert len(err.strip().splitlines()) == 1
    assert "'choices' has no key 'txt'" in err and "row 0" in err and str(p) in err
