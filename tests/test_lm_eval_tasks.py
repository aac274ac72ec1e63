"""lm-eval tasks as lens_heads tasks: YAML and registry routes against lm-eval's own HF backend."""

from __future__ import annotations

import csv
import json
import os

import pytest

from lens_heads.data import load_task
from lens_heads.errors import LensHeadsError
from lens_heads.evaluation.evaluate import evaluate_task

pytest.importorskip("lm_eval")

N_PIQA = 24
ARCH = "llama"


@pytest.fixture(scope="module")
def yaml_tasks(shared_data, tmp_path_factory):
    """Two task YAMLs over shipped data: lm-eval's own piqa.yaml on local rows, and a 4-choice
    task in the hub's nested schema (``choices: {text, label}``, ``answerKey``) built from MMLU
    rows, half of them labelled A-D and half 1-4, with a train split for its shots."""
    import lm_eval
    import yaml

    folder = tmp_path_factory.mktemp("lm_eval_tasks")
    piqa = load_task("piqa")
    pfile = folder / "piqa.jsonl"
    short = [r for r in piqa.records if len(r.question) + max(map(len, r.choices)) < 90][:N_PIQA]  # the tiny
    pfile.write_text("".join(json.dumps(r.raw) + "\n" for r in short))  # model reads 256 tokens, shots included
    with open(os.path.join(os.path.dirname(lm_eval.__file__), "tasks", "piqa", "piqa.yaml")) as f:
        cfg = yaml.safe_load(f)
    cfg.update(task="lh_piqa_yaml", dataset_path="json", dataset_name=None, training_split=None,
               dataset_kwargs={"data_files": {"validation": str(pfile)}})
    (folder / "lh_piqa_yaml.yaml").write_text(yaml.safe_dump(cfg))

    def nested(rows, start):
        out = []
        for i, r in enumerate(rows):
            labels = ["A", "B", "C", "D"] if (start + i) % 2 == 0 else ["1", "2", "3", "4"]
            out.append({"id": f"q{start + i}", "question": r["question"],
                        "choices": {"text": [r[f"choice{j}"] for j in range(4)], "label": labels},
                        "answerKey": labels[int(r["answer"])]})
        return out

    def short_rows(path, n):
        with open(path, newline="", encoding="utf-8") as f:
            rows = [r for r in csv.DictReader(f) if len(r["question"]) + sum(len(r[f"choice{j}"]) for j in range(4)) < 70]
        return rows[:n]

    train = short_rows(shared_data / "mmlu" / "test" / "elementary_mathematics_test.csv", 6)
    test = short_rows(shared_data / "mmlu" / "test" / "high_school_mathematics_test.csv", 12)
    assert len(train) >= 3 and len(test) == 12
    (folder / "arc_train.jsonl").write_text("".join(json.dumps(r) + "\n" for r in nested(train, 100)))
    (folder / "arc_test.jsonl").write_text("".join(json.dumps(r) + "\n" for r in nested(test, 0)))
    arc = {"task": "lh_arc_style", "dataset_path": "json",
           "dataset_kwargs": {"data_files": {"train": str(folder / "arc_train.jsonl"),
                                             "test": str(folder / "arc_test.jsonl")}},
           "output_type": "multiple_choice", "training_split": "train", "test_split": "test",
           "doc_to_text": "Question: {{question}}\nAnswer:", "doc_to_choice": "{{choices.text}}",
           "doc_to_target": "{{choices.label.index(answerKey)}}", "description": "Maths.\n\n",
           "metric_list": [{"metric": "acc", "aggregation": "mean", "higher_is_better": True},
                           {"metric": "acc_norm", "aggregation": "mean", "higher_is_better": True}]}
    (folder / "lh_arc_style.yaml").write_text(yaml.safe_dump(arc))
    return folder, test


@pytest.fixture(scope="module")
def theirs(tiny_model, yaml_tasks):
    """Per-doc samples of lm-eval's ``simple_evaluate`` with its HF backend on the tiny model."""
    from lm_eval import simple_evaluate
    from lm_eval.models.huggingface import HFLM
    from lm_eval.tasks import TaskManager

    model = tiny_model(ARCH)
    lm = HFLM(pretrained=model.hf_model, tokenizer=model.tokenizer, batch_size=4)
    tm = TaskManager(include_path=str(yaml_tasks[0]))

    def run(task: str, k: int):
        out = simple_evaluate(model=lm, tasks=[task], num_fewshot=k, task_manager=tm, log_samples=True,
                              bootstrap_iters=0, fewshot_random_seed=1234, random_seed=0, numpy_random_seed=0,
                              torch_random_seed=0)
        return sorted(out["samples"][task], key=lambda s: s["doc_id"])

    return run


@pytest.mark.parametrize("name,k", [("lh_piqa_yaml", 0), ("lh_piqa_yaml", 2), ("lh_arc_style", 0),
                                    ("lh_arc_style", 2)])
def test_yaml_task_predictions_and_lls_equal_lm_eval(tiny_model, yaml_tasks, theirs, name, k):
    folder, _ = yaml_tasks
    model = tiny_model(ARCH)
    ours = evaluate_task(model, str(folder / f"{name}.yaml"), n_shot=k, progress=False, batch_size=4)
    samples = theirs(name, k)
    assert [q.doc_id for q in ours.questions] == [s["doc_id"] for s in samples]
    dll = 0.0
    for q, s in zip(ours.questions, samples):
        lls = [float(x[0]) for x in s["filtered_resps"]]
        assert lls.index(max(lls)) == q.pred, (name, k, q.doc_id)
        assert float(s["acc"]) == float(q.correct) and float(s["acc_norm"]) == float(q.pred_norm == q.gold)
        dll = max(dll, max(abs(a - b) for a, b in zip(q.lls, lls)))
    assert dll <= 1e-4, dll
    assert ours.metrics["acc"] == pytest.approx(sum(float(s["acc"]) for s in samples) / len(samples))


def test_nested_schema_golds_follow_the_per_row_labels(yaml_tasks):
    folder, rows = yaml_tasks
    task = load_task(str(folder / "lh_arc_style.yaml"))
    assert [r.gold for r in task.records] == [int(r["answer"]) for r in rows]  # "B" / "2" -> 1 alike
    assert [r.choices for r in task.records] == [[r[f"choice{j}"] for j in range(4)] for r in rows]
    assert task.spec.metrics == ("acc", "acc_norm") and [r.doc_id for r in task.records] == list(range(len(rows)))


def test_a_yaml_task_prompts_equal_the_registered_task(yaml_tasks):
    """lm-eval's piqa.yaml over the shipped rows gives exactly the registered piqa's prompts."""
    folder, _ = yaml_tasks
    ours, registered = load_task(str(folder / "lh_piqa_yaml.yaml")), load_task("piqa")
    by_goal = {(r.raw["goal"], r.raw["sol1"]): r for r in registered.records}
    assert len(ours.records) == N_PIQA
    for r in ours.records:
        same = by_goal[(r.raw["goal"], r.raw["sol1"])]
        assert ours.build(r) == registered.build(same) and r.gold == same.gold


def test_a_sweep_on_a_yaml_task_resumes_and_tabulates(tiny_model, yaml_tasks, tmp_path, monkeypatch):
    import lens_heads.evaluation.evaluate as ev
    from lens_heads.sweep import SweepConfig, run_sweep, tabulate

    folder, _ = yaml_tasks
    spec = str(folder / "lh_arc_style.yaml")
    model, task = tiny_model(ARCH), load_task(spec)
    cfg = lambda: SweepConfig(task=spec, score_ids=["ahon_ln"], fractions=[0.0, 0.5], random_seeds=[0],  # noqa: E731
                              batch_size=4, n_boot=50, chunk_questions=5)
    first = run_sweep(model, cfg(), tmp_path / "s", task=task, progress=False)
    monkeypatch.setattr(ev, "evaluate_task", lambda *a, **k: pytest.fail("recomputed a stored part"))
    again = run_sweep(model, cfg(), tmp_path / "s", task=load_task(spec), progress=False)
    stored = tabulate(tmp_path / "s", cfg().identity(model, task), cfg(), task, model=model.name)
    assert first.summary.equals(again.summary) and first.summary.equals(stored.summary)
    assert first.within["score_fn"].tolist() == ["ahon_ln", "random"]


def test_bad_lm_eval_tasks_fail_with_one_message(tmp_path, yaml_tasks):
    broken = tmp_path / "broken.yaml"
    broken.write_text("task: [unclosed\n")
    with pytest.raises(LensHeadsError, match="not a task YAML"):
        load_task(str(broken))
    with pytest.raises(LensHeadsError, match="task YAML not found"):
        load_task(str(tmp_path / "none.yaml"))
    gen = tmp_path / "gen.yaml"
    gen.write_text(f"task: lh_gen\ndataset_path: json\ndataset_kwargs:\n  data_files:\n    test: "
                   f"{yaml_tasks[0] / 'arc_test.jsonl'}\ntest_split: test\noutput_type: generate_until\n"
                   "doc_to_text: '{{question}}'\ndoc_to_target: '{{answerKey}}'\n")
    with pytest.raises(LensHeadsError, match="generate_until task.*lens-heads lm-eval"):
        load_task(str(gen))
    with pytest.raises(LensHeadsError, match="could not be built.*local HF datasets cache"):
        load_task("lm-eval:arc_easy")  # offline, and no local copy of its dataset
    with pytest.raises(LensHeadsError, match="no task 'arc_eazy'.*arc_easy"):
        load_task("lm-eval:arc_eazy")


def _mc_yaml(folder, name: str, data_files, labels=None):
    """A two-choice task YAML over rows labelled ``labels`` (written to ``folder/data/NAME.jsonl``)."""
    import yaml

    if labels is not None:
        (folder / "data").mkdir(parents=True, exist_ok=True)
        (folder / "data" / f"{name}.jsonl").write_text("".join(
            json.dumps({"q": f"Question {i}?", "a": "yes", "b": "no", "label": lab}) + "\n"
            for i, lab in enumerate(labels)))
    cfg = {"task": name, "dataset_path": "json", "dataset_kwargs": {"data_files": {"test": data_files}},
           "output_type": "multiple_choice", "test_split": "test", "doc_to_text": "{{q}}",
           "doc_to_choice": "{{[a, b]}}", "doc_to_target": "{{label}}"}
    path = folder / f"{name}.yaml"
    path.write_text(yaml.safe_dump(cfg))
    return str(path)


def test_relative_data_files_are_read_from_the_yaml_folder(tmp_path, monkeypatch):
    """As lm_eval --include_path users write them: data_files relative to the YAML, whatever the
    current folder (they were read from the current folder)."""
    folder = tmp_path / "tasks"
    spec = _mc_yaml(folder, "lh_relative", "data/lh_relative.jsonl", labels=[1, 0, 1])
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)
    task = load_task(spec)
    assert [r.gold for r in task.records] == [1, 0, 1] and task.records[2].question == "Question 2?"


def test_answers_outside_their_choices_are_refused_naming_rows_and_field(tmp_path):
    folder = tmp_path / "tasks"
    # only later rows: they were scored wrong, silently
    later = _mc_yaml(folder, "lh_later_rows", str(folder / "data" / "lh_later_rows.jsonl"), labels=[0, 1, 5, 1, 2])
    with pytest.raises(LensHeadsError, match=r"doc_to_target .* in 2 row\(s\).*row 2: index 5, outside 0\.\.1.*"
                                             r"row 4: index 2"):
        load_task(later)
    # row 0: lm-eval's own check while building gave "list index out of range" and the HF cache hint
    first = _mc_yaml(folder, "lh_first_row", str(folder / "data" / "lh_first_row.jsonl"), labels=[3, 1])
    with pytest.raises(LensHeadsError, match=r"row 0 of its evaluation split: doc_to_target gives index 3, "
                                             r"outside 0\.\.1") as exc:
        load_task(first)
    assert "HF datasets cache" not in str(exc.value) and "list index" not in str(exc.value)
    # a local file that is not there: lm-eval's message, without the hint about the hub's cache
    missing = _mc_yaml(folder, "lh_no_file", str(folder / "data" / "none.jsonl"))
    with pytest.raises(LensHeadsError, match="could not be built.*none.jsonl") as exc:
        load_task(missing)
    assert "HF datasets cache" not in str(exc.value)
