"""Tests for lens_heads.data: corpora, tokenisation/batching, tasks, lm-eval prompt parity.

Shared data (MMLU/PIQA/WinoGrande/C4/WikiText copies) is located with the package's own
data-root logic; tests that need it skip with a reason when it is absent. The lm-eval
parity tests build the same docs through lm-evaluation-harness's own TaskManager (local
JSON files + a YAML that includes lm-eval's shipped task YAML) and compare every request.
"""

from __future__ import annotations

import csv
import json
import re
from pathlib import Path

import pytest
import torch

from lens_heads.data import (
    TASKS,
    MCRecord,
    Task,
    TaskSpec,
    data_root,
    iter_batches,
    load_mc_file,
    load_task,
    load_texts,
    mmlu_description,
    pad_batch,
    parse_mc_spec,
    register_task,
    tokenize_texts,
    wikitext_articles,
)
from lens_heads.errors import LensHeadsError

ROOT = data_root()


def need(*relpaths: str) -> Path:
    """The data root, or skip the test when the shared files are not there."""
    if ROOT is None:
        pytest.skip("shared data not found (set LENS_HEADS_DATA)")
    for rel in relpaths:
        if not (ROOT / rel).exists():
            pytest.skip(f"shared data file missing: {ROOT / rel}")
    return ROOT


def read_csv(path: Path) -> list[dict]:
    with open(path, encoding="utf-8", newline="") as f:
        return list(csv.DictReader(f))


# -----------------------------------------------------------------------------
# Built-in tasks: sizes and gold labels


def test_mmlu_counts_and_gold():
    root = need("mmlu/test", "mmlu/dev")
    task = load_task("mmlu")
    assert len(task) == 14042
    assert len(task.fewshot_pool) == 285
    expected = []
    for path in sorted((root / "mmlu/test").glob("*_test.csv")):
        expected += [(path.name[: -len("_test.csv")], int(r["answer"])) for r in read_csv(path)]
    assert [(r.subject, r.gold) for r in task.records] == expected
    assert [r.doc_id for r in task.records] == list(range(14042))
    assert len({r.subject for r in task.records}) == 57
    dev = load_task("mmlu", split="dev")
    assert len(dev) == 285 and all(len(r.choices) == 4 for r in dev.records)


def test_piqa_counts_and_gold():
    root = need("piqa/valid.jsonl", "piqa/valid-labels.lst")
    task = load_task("piqa")
    labels = [int(x) for x in (root / "piqa/valid-labels.lst").read_text().split()]
    assert len(task) == 1838 and [r.gold for r in task.records] == labels
    assert task.spec.n_shot == 0 and task.fewshot(task.records[0]) == []


def test_winogrande_counts_and_gold():
    root = need("winogrande/dev.jsonl", "winogrande/dev-labels.lst")
    task = load_task("winogrande")
    labels = [int(x) - 1 for x in (root / "winogrande/dev-labels.lst").read_text().split()]
    assert len(task) == 1267 and [r.gold for r in task.records] == labels


def test_unknown_task_lists_names():
    with pytest.raises(LensHeadsError) as e:
        load_task("hellaswag")
    msg = str(e.value)
    assert "hellaswag" in msg and all(name in msg for name in ("mmlu", "piqa", "winogrande"))
    with pytest.raises(LensHeadsError, match="split"):
        load_task("piqa", split="bogus")


# -----------------------------------------------------------------------------
# Prompt formats, written out independently of the implementation


def test_mmlu_prompt_template_by_hand():
    need("mmlu/test", "mmlu/dev")
    task = load_task("mmlu")
    rec = next(r for r in task.records if r.subject == "college_physics")
    shots = task.fewshot(rec, 1)
    dev0 = read_csv(ROOT / "mmlu/dev/college_physics_dev.csv")[0]
    letters = "ABCD"
    shot = (f"{dev0['question'].strip()}\nA. {dev0['choice0']}\nB. {dev0['choice1']}\nC. {dev0['choice2']}\n"
            f"D. {dev0['choice3']}\nAnswer: {letters[int(dev0['answer'])]}\n\n")
    q = (f"{rec.question.strip()}\nA. {rec.choices[0]}\nB. {rec.choices[1]}\nC. {rec.choices[2]}\n"
         f"D. {rec.choices[3]}\nAnswer:")
    ctx = "The following are multiple choice questions (with answers) about college physics.\n\n" + shot + q
    assert task.requests(rec, shots) == [(ctx, f" {x}") for x in letters]
    assert [s.raw["question"] for s in task.fewshot(rec, 5)] == [
        r["question"] for r in read_csv(ROOT / "mmlu/dev/college_physics_dev.csv")
    ]


def test_piqa_and_winogrande_templates_by_hand():
    need("piqa/valid.jsonl", "winogrande/dev.jsonl")
    piqa = load_task("piqa")
    r = piqa.records[0]
    assert piqa.build(r) == [(f"Question: {r.question}\nAnswer:", " " + c) for c in r.choices]
    assert piqa.choice_lengths(r) == [len(c) for c in r.choices]  # acc_norm: no leading space
    wg = load_task("winogrande")
    r = wg.records[0]  # "Sarah was a much better surgeon than Maria so _ always got the easier cases."
    reqs = wg.requests(r, [])
    assert reqs == [
        ("Sarah was a much better surgeon than Maria so Sarah", " always got the easier cases."),
        ("Sarah was a much better surgeon than Maria so Maria", " always got the easier cases."),
    ]
    shot = wg.records[1]
    ctx, cont = wg.requests(r, [shot])[0]
    filled = shot.question.replace("_", shot.choices[shot.gold])
    assert ctx == filled + "\n\n" + "Sarah was a much better surgeon than Maria so Sarah"


def test_fewshot_sampling_properties():
    need("winogrande/dev.jsonl")
    wg = load_task("winogrande")
    a = wg.fewshot(wg.records[10])
    assert len(a) == 5 and wg.records[10] not in a
    assert wg.fewshot(wg.records[10]) == a  # cached, order independent
    assert wg.fewshot(wg.records[10], seed=7) != a
    fresh = load_task("winogrande")
    assert [x.doc_id for x in fresh.fewshot(fresh.records[10])] == [x.doc_id for x in a]
    outsider = MCRecord(99999, "A _ b.", ["x", "y"], 0)
    with pytest.raises(LensHeadsError, match="not one of this task's records"):
        wg.fewshot(outsider)


def test_score_matches_lm_eval_rules():
    need("piqa/valid.jsonl")
    piqa = load_task("piqa")
    r = piqa.records[0]
    n0, n1 = piqa.choice_lengths(r)
    lls = [-1.0 * n0 * 1.0, -1.0 * n0 * 1.01]  # choice 0 better raw
    s = piqa.score(r, lls)
    assert s["acc"] == float(r.gold == 0)
    assert s["acc_norm"] == float(r.gold == (0 if lls[0] / n0 >= lls[1] / n1 else 1))


def test_mmlu_descriptions_match_lm_eval_yaml():
    need("mmlu/test")
    lm_eval = pytest.importorskip("lm_eval")
    import yaml

    folder = Path(lm_eval.__file__).parent / "tasks/mmlu/default"
    task = load_task("mmlu")
    for subject in sorted({r.subject for r in task.records}):
        cfg = yaml.safe_load((folder / f"mmlu_{subject}.yaml").read_text())
        rec = MCRecord(0, "q", ["a", "b", "c", "d"], 0, subject)
        assert mmlu_description(rec) == cfg["description"], subject


# -----------------------------------------------------------------------------
# lm-eval parity: the harness builds requests from the same docs; compare all of them


@pytest.fixture(scope="module")
def lm_tasks(tmp_path_factory):
    lm_eval = pytest.importorskip("lm_eval")
    root = need("mmlu/test", "mmlu/dev", "piqa/valid.jsonl", "piqa/valid-labels.lst", "winogrande/dev.jsonl")
    from lm_eval.tasks import TaskManager

    lm_dir = Path(lm_eval.__file__).parent / "tasks"
    w = tmp_path_factory.mktemp("lm_eval_tasks")
    cache = w / "hf_cache"

    def write_jsonl(name, rows):
        (w / name).write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
        return w / name

    def write_yaml(name, include, files, extra=""):
        data_files = "".join(f"\n    {k}: {v}" for k, v in files.items())
        (w / f"{name}.yaml").write_text(
            f"include: {include}\ntask: {name}\ndataset_path: json\ndataset_name: null\n"
            f"dataset_kwargs:\n  cache_dir: {cache}\n  data_files:{data_files}\n{extra}"
        )

    # PIQA: all validation docs (labels joined in, as on the hub)
    labels = (root / "piqa/valid-labels.lst").read_text().split()
    rows = [json.loads(line) for line in open(root / "piqa/valid.jsonl", encoding="utf-8")]
    piqa = write_jsonl("piqa.jsonl", [{**r, "label": int(g)} for r, g in zip(rows, labels)])
    write_yaml("lh_piqa", lm_dir / "piqa/piqa.yaml", {"validation": piqa}, "training_split: null\n")
    # WinoGrande: all dev docs; the "train" split (few-shot pool) is the same file, as in our default
    wg = root / "winogrande/dev.jsonl"
    write_yaml("lh_winogrande", lm_dir / "winogrande/default.yaml", {"train": wg, "validation": wg}, "num_fewshot: 5\n")
    # MMLU: two subjects, first 4 test docs each, in cais/mmlu's schema
    subjects = ["abstract_algebra", "high_school_us_history"]
    for s in subjects:
        def conv(split, n=None):
            out = []
            for r in read_csv(root / f"mmlu/{split}/{s}_{split}.csv")[:n]:
                out.append({"question": r["question"], "subject": s,
                            "choices": [r[f"choice{i}"] for i in range(4)], "answer": int(r["answer"])})
            return out
        files = {"test": write_jsonl(f"{s}_test.jsonl", conv("test", 4)), "dev": write_jsonl(f"{s}_dev.jsonl", conv("dev"))}
        write_yaml(f"lh_mmlu_{s}", lm_dir / f"mmlu/default/mmlu_{s}.yaml", files, "num_fewshot: 5\n")

    tm = TaskManager(include_path=str(w), include_defaults=False)
    names = ["lh_piqa", "lh_winogrande"] + [f"lh_mmlu_{s}" for s in subjects]
    loaded = tm.load(names)["tasks"] if hasattr(tm, "load") else tm.load_task_or_group(names)
    out = {}
    for name in names:
        t = loaded[name]
        t.set_fewshot_seed(1234)  # lm-eval's default fewshot seed
        t.build_all_requests()
        by_doc: dict[int, list] = {}
        for inst in t.instances:
            by_doc.setdefault(inst.doc_id, []).append(inst.arguments)
        out[name] = (t, [by_doc[i] for i in range(len(by_doc))])
    return out


def test_lm_eval_parity_piqa(lm_tasks):
    lm_task, lm_reqs = lm_tasks["lh_piqa"]
    task = load_task("piqa")
    assert len(lm_reqs) == len(task) == 1838
    for rec, theirs in zip(task.records, lm_reqs):
        assert task.build(rec) == [tuple(a) for a in theirs]
    docs = list(lm_task.eval_docs)
    for rec in task.records[:50]:  # acc_norm denominators
        assert task.choice_lengths(rec) == [len(c) for c in lm_task.doc_to_choice(docs[rec.doc_id])]


def test_lm_eval_parity_winogrande_5shot(lm_tasks):
    _, lm_reqs = lm_tasks["lh_winogrande"]
    task = load_task("winogrande")
    assert len(lm_reqs) == len(task) == 1267
    for rec, theirs in zip(task.records, lm_reqs):
        assert task.build(rec) == [tuple(a) for a in theirs], rec.doc_id


@pytest.mark.parametrize("subject", ["abstract_algebra", "high_school_us_history"])
def test_lm_eval_parity_mmlu_5shot(lm_tasks, subject):
    _, lm_reqs = lm_tasks[f"lh_mmlu_{subject}"]
    task = load_task("mmlu")
    recs = [r for r in task.records if r.subject == subject][: len(lm_reqs)]
    assert len(recs) == 4
    for rec, theirs in zip(recs, lm_reqs):
        assert task.build(rec) == [tuple(a) for a in theirs]


# -----------------------------------------------------------------------------
# Generic multiple-choice files


def _rows():
    return [
        {"goal": "Open a jar.", "sol1": "Twist the lid.", "sol2": "Eat the lid.", "label": 0, "topic": "home"},
        {"goal": "Dry a towel.", "sol1": "Put it in water.", "sol2": "Hang it in the sun.", "label": 1, "topic": "home"},
        {"goal": "Cool soup.", "sol1": "Wait a bit.", "sol2": "Heat it more.", "label": 0, "topic": "food"},
    ]


def test_mc_file_jsonl_roundtrip(tmp_path):
    p = tmp_path / "mini.jsonl"
    p.write_text("".join(json.dumps(r) + "\n" for r in _rows()))
    task = load_mc_file(p, question="goal", choices=["sol1", "sol2"], answer="label", subject="topic",
                        prompt_template="Question: {goal}\nAnswer:")
    assert task.name == "mini" and len(task) == 3 and task.spec.n_shot == 0
    assert [r.gold for r in task] == [0, 1, 0] and task.records[2].subject == "food"
    r = task.records[1]
    assert task.build(r) == [("Question: Dry a towel.\nAnswer:", " Put it in water."),
                             ("Question: Dry a towel.\nAnswer:", " Hang it in the sun.")]
    shots = task.fewshot(r, 2)
    assert len(shots) == 2 and r not in shots
    ctx = task.requests(r, shots)[0][0]
    assert ctx.startswith("Question: ") and ctx.count("\n\n") == 2
    # string form gives the same task
    same = load_task(f"file:{p}?question=goal&choices=sol1,sol2&answer=label&subject=topic"
                     f"&prompt=Question: {{goal}}\\nAnswer:")
    assert [same.build(x) for x in same] == [task.build(x) for x in task]


def test_mc_file_csv_labels_and_text(tmp_path):
    p = tmp_path / "mini.csv"
    with open(p, "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=["q", "opts", "ans", "ans_text"])
        w.writeheader()
        w.writerow({"q": "2+2?", "opts": json.dumps(["3", "4", "5"]), "ans": "B", "ans_text": "4"})
        w.writerow({"q": "1+2?", "opts": json.dumps(["3", "4", "5"]), "ans": "a", "ans_text": "3"})
    t = load_mc_file(p, question="q", choices="opts", answer="ans", answer_type="label",
                     prompt_template="{question}\nAnswer:", choice_template="{label}")
    assert [r.gold for r in t] == [1, 0] and t.records[0].choices == ["3", "4", "5"]
    assert t.build(t.records[0]) == [("2+2?\nAnswer:", " A"), ("2+2?\nAnswer:", " B"), ("2+2?\nAnswer:", " C")]
    t2 = load_task(f"file:{p}?question=q&choices=opts&answer=ans_text&answer_type=text")
    assert [r.gold for r in t2] == [1, 0]


def test_mc_file_errors(tmp_path):
    p = tmp_path / "mini.jsonl"
    p.write_text("".join(json.dumps(r) + "\n" for r in _rows()))
    with pytest.raises(LensHeadsError) as e:
        load_mc_file(p, question="question", choices=["sol1", "sol2"], answer="label")
    assert "'question'" in str(e.value) and "goal" in str(e.value) and "sol1" in str(e.value)
    with pytest.raises(LensHeadsError, match="no field 'sol3'"):
        load_task(f"file:{p}?question=goal&choices=sol1,sol3&answer=label")
    with pytest.raises(LensHeadsError, match="template names"):
        load_mc_file(p, question="goal", choices=["sol1", "sol2"], answer="label", prompt_template="{nope}")
    with pytest.raises(LensHeadsError, match="Unknown option"):
        parse_mc_spec(f"file:{p}?question=goal&colour=red")
    empty = tmp_path / "empty.jsonl"
    empty.write_text("")
    with pytest.raises(LensHeadsError, match="empty"):
        load_mc_file(empty)
    with pytest.raises(LensHeadsError, match="not found"):
        load_mc_file(tmp_path / "missing.jsonl")
    with pytest.raises(LensHeadsError, match="not an integer"):
        load_mc_file(p, question="goal", choices=["sol1", "sol2"], answer="topic")


def test_parse_mc_spec_escapes_and_plus(tmp_path):
    path, kw = parse_mc_spec("file:/x/y.jsonl?question=goal&choices=sol1,sol2&answer=label"
                             "&prompt=Q: {goal}\\nA+B%26C:&n_shot=3")
    assert path == "/x/y.jsonl"
    assert kw == {"question": "goal", "choices": ["sol1", "sol2"], "answer": "label",
                  "prompt_template": "Q: {goal}\nA+B&C:", "n_shot": 3}


def test_register_task_and_duplicates():
    spec = TaskSpec(name="lh_test_tiny", loader=lambda split, root: ([MCRecord(0, "q", ["a", "b"], 1)], "mem"))
    register_task(spec)
    try:
        t = load_task("lh_test_tiny")
        assert isinstance(t, Task) and t.build(t.records[0]) == [("q", " a"), ("q", " b")]
        with pytest.raises(LensHeadsError, match="already registered"):
            register_task(spec)
    finally:
        TASKS.pop("lh_test_tiny", None)


def test_data_root_env_and_hub_fallback(tmp_path, monkeypatch):
    (tmp_path / "piqa").mkdir()
    (tmp_path / "piqa/valid.jsonl").write_text(json.dumps({"goal": "g", "sol1": "a", "sol2": "b"}) + "\n")
    (tmp_path / "piqa/valid-labels.lst").write_text("1\n")
    monkeypatch.setenv("LENS_HEADS_DATA", str(tmp_path))
    t = load_task("piqa")
    assert len(t) == 1 and t.records[0].gold == 1 and str(tmp_path) in t.source
    # nothing local -> the hub; a failing hub gives one clear LensHeadsError
    import datasets

    def offline(*a, **k):
        raise ConnectionError("no network")

    monkeypatch.setattr(datasets, "load_dataset", offline)
    with pytest.raises(LensHeadsError, match="allenai/winogrande"):
        load_task("winogrande")
    with pytest.raises(LensHeadsError, match="allenai/c4"):
        load_texts("c4", n=3)


# -----------------------------------------------------------------------------
# Corpora


def test_named_corpora():
    need("c4/c4_validation_2k.jsonl", "c4/c4_train_1k.jsonl", "wikitext2/test_raw.txt")
    assert len(load_texts("c4")) == 2000
    five = load_texts("c4", n=5)
    assert len(five) == 5 and five == load_texts("c4")[:5]
    assert load_texts("c4", split="train", n=1)[0].startswith("Beginners BBQ Class")
    arts = load_texts("wikitext2")
    assert arts[0].startswith("= Robert Boulter =\n") and all(a.startswith("= ") for a in arts)
    assert len(arts) == 62  # 60 articles; two formula fragments in "Constant k filter" look like titles
    paras = load_texts(ROOT / "wikitext2/test_raw.txt")
    assert len(paras) == 2891 and all(p == p.strip() and p for p in paras)


def test_local_text_files(tmp_path):
    (tmp_path / "a.txt").write_text("  first line \n\n   \nsecond\n")
    assert load_texts(tmp_path / "a.txt") == ["first line", "second"]
    (tmp_path / "b.jsonl").write_text(json.dumps({"body": "x"}) + "\n" + json.dumps({"body": ""}) + "\n"
                                      + json.dumps({"body": "y"}) + "\n")
    assert load_texts(tmp_path / "b.jsonl", text_field="body") == ["x", "y"]
    assert load_texts(tmp_path / "b.jsonl", n=1, text_field="body") == ["x"]
    with pytest.raises(LensHeadsError, match="no field 'text'.*body"):
        load_texts(tmp_path / "b.jsonl")
    import pyarrow as pa
    import pyarrow.parquet as pq

    pq.write_table(pa.table({"text": ["p", "q"]}), tmp_path / "c.parquet")
    assert load_texts(tmp_path / "c.parquet") == ["p", "q"]
    with pytest.raises(LensHeadsError, match="not found"):
        load_texts(tmp_path / "nope.jsonl")
    with pytest.raises(LensHeadsError, match="Unknown corpus"):
        load_texts("not a corpus!")


def test_wikitext2_train_reads_the_data_root_as_articles(tmp_path, monkeypatch):
    """WikiText-2 train, a training corpus for repair: its local copy under LENS_HEADS_DATA, one
    input per article, also reached as wikitext2 with split train; without a copy, the hub's train split."""
    (tmp_path / "wikitext2").mkdir()
    (tmp_path / "wikitext2/train_raw.txt").write_text(" = A = \n\n text a \n = = Sec = = \n more \n\n = B = \n b \n")
    monkeypatch.setenv("LENS_HEADS_DATA", str(tmp_path))
    want = ["= A =\ntext a\n= = Sec = =\nmore", "= B =\nb"]
    assert load_texts("wikitext2-train") == want
    assert load_texts("wikitext2", split="train") == want
    monkeypatch.setenv("LENS_HEADS_DATA", str(tmp_path / "elsewhere"))
    with pytest.raises(LensHeadsError, match="Salesforce/wikitext"):  # no local copy: the hub's, named
        load_texts("wikitext2-train")


def test_wikitext_articles_grouping():
    lines = [" = A = ", "", " text a ", " = = Sec = = ", " more ", "", " = B = ", " b "]
    assert wikitext_articles(lines) == ["= A =\ntext a\n= = Sec = =\nmore", "= B =\nb"]


# -----------------------------------------------------------------------------
# Tokenisation and batching, on tiny offline tokenizers

WORDS = "the cat sat on mat a dog ran hello world".split()


def make_tokenizer(bos: bool):
    from tokenizers import Tokenizer, models, pre_tokenizers, processors
    from transformers import PreTrainedTokenizerFast

    vocab = {w: i for i, w in enumerate(["<pad>", "<unk>", "<bos>", "<eos>"] + WORDS)}
    tk = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    tk.pre_tokenizer = pre_tokenizers.Whitespace()
    if bos:
        tk.post_processor = processors.TemplateProcessing(single="<bos> $A", special_tokens=[("<bos>", 2)])
        return PreTrainedTokenizerFast(tokenizer_object=tk, bos_token="<bos>", eos_token="<eos>",
                                       pad_token="<pad>", unk_token="<unk>")
    return PreTrainedTokenizerFast(tokenizer_object=tk, eos_token="<eos>", pad_token="<pad>", unk_token="<unk>")


def ids(words: str) -> list[int]:
    return [4 + WORDS.index(w) for w in words.split()]


TEXTS = ["the cat sat on the mat", "", "   ", "a dog ran", "hello world hello world the cat"]


def test_tokenize_documents():
    tok = make_tokenizer(bos=True)
    seqs = tokenize_texts(tok, TEXTS, max_len=5)
    assert [s.tolist() for s in seqs] == [[2] + ids("the cat sat on"), [2] + ids("a dog ran"),
                                          [2] + ids("hello world hello world")]
    assert all(s.dtype == torch.long and s.ndim == 1 for s in seqs)
    assert len(tokenize_texts(tok, TEXTS, max_len=5, n_inputs=2)) == 2
    no_bos = tokenize_texts(tok, TEXTS, max_len=5, add_bos=False)
    assert no_bos[0].tolist() == ids("the cat sat on the")
    plain = make_tokenizer(bos=False)
    assert tokenize_texts(plain, TEXTS, max_len=3)[1].tolist() == ids("a dog ran")
    with pytest.raises(LensHeadsError, match="no BOS"):
        tokenize_texts(plain, TEXTS, max_len=3, add_bos=True)
    with pytest.raises(LensHeadsError, match="mode"):
        tokenize_texts(plain, TEXTS, max_len=3, mode="sentences")


def test_tokenize_chunks():
    tok = make_tokenizer(bos=True)
    seqs = tokenize_texts(tok, TEXTS, max_len=4, mode="chunks")
    stream = ids("the cat sat on the mat") + [3] + ids("a dog ran") + [3] + ids("hello world hello world the cat")
    bodies = [s.tolist()[1:] for s in seqs]
    assert all(s.tolist()[0] == 2 and len(s) == 4 for s in seqs)
    assert sum(bodies, []) == stream[: 3 * len(seqs)] and len(stream) - 3 * len(seqs) < 3
    plain = make_tokenizer(bos=False)
    chunks = tokenize_texts(plain, TEXTS, max_len=4, mode="chunks", n_inputs=2)
    assert [c.tolist() for c in chunks] == [stream[:4], stream[4:8]]


def test_pad_batch_right_and_left():
    seqs = [torch.tensor([5, 6, 7]), torch.tensor([8])]
    ids_r, m_r = pad_batch(seqs, pad_id=0, side="right")
    assert ids_r.tolist() == [[5, 6, 7], [8, 0, 0]] and m_r.tolist() == [[1, 1, 1], [1, 0, 0]]
    ids_l, m_l = pad_batch(seqs, pad_id=9, side="left")
    assert ids_l.tolist() == [[5, 6, 7], [9, 9, 8]] and m_l.tolist() == [[1, 1, 1], [0, 0, 1]]
    assert m_l.dtype == torch.long and ids_l.shape == (2, 3)
    with pytest.raises(LensHeadsError):
        pad_batch(seqs, 0, side="middle")


def test_iter_batches_restores_order():
    seqs = [torch.arange(n) for n in (2, 5, 1, 4, 3)]
    out = [None] * len(seqs)
    sizes = []
    for idx, ids_b, mask in iter_batches(seqs, batch_size=2, pad_id=-1):
        sizes.append(ids_b.shape[1])
        for row, i in enumerate(idx):
            out[i] = ids_b[row][mask[row].bool()]
    assert sizes == [5, 3, 1]  # longest first
    assert all(torch.equal(a, b) for a, b in zip(out, seqs))
    unsorted = [idx for idx, _, _ in iter_batches(seqs, 2, sort_by_length=False)]
    assert unsorted == [[0, 1], [2, 3], [4]]


@pytest.mark.slow
def test_lm_eval_parity_mmlu_all_subjects_5shot(tmp_path):
    """Every MMLU test item (14,042), 5-shot, against lm-eval's own requests (~1 min)."""
    lm_eval = pytest.importorskip("lm_eval")
    root = need("mmlu/test", "mmlu/dev")
    from lm_eval.tasks import TaskManager

    lm_dir = Path(lm_eval.__file__).parent / "tasks/mmlu/default"
    task = load_task("mmlu")
    subjects = sorted({r.subject for r in task.records})
    for s in subjects:
        for split in ("test", "dev"):
            rows = [{"question": r["question"], "subject": s, "choices": [r[f"choice{i}"] for i in range(4)],
                     "answer": int(r["answer"])} for r in read_csv(root / f"mmlu/{split}/{s}_{split}.csv")]
            (tmp_path / f"{s}_{split}.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
        (tmp_path / f"lh_mmlu_{s}.yaml").write_text(
            f"include: {lm_dir / f'mmlu_{s}.yaml'}\ntask: lh_mmlu_{s}\ndataset_path: json\ndataset_name: null\n"
            f"dataset_kwargs:\n  cache_dir: {tmp_path / 'hf_cache'}\n  data_files:\n"
            f"    test: {tmp_path / f'{s}_test.jsonl'}\n    dev: {tmp_path / f'{s}_dev.jsonl'}\nnum_fewshot: 5\n"
        )
    tm = TaskManager(include_path=str(tmp_path), include_defaults=False)
    loaded = tm.load([f"lh_mmlu_{s}" for s in subjects])["tasks"]
    ours = iter(task.records)
    n = 0
    for s in subjects:
        t = loaded[f"lh_mmlu_{s}"]
        t.build_all_requests()
        by_doc: dict[int, list] = {}
        for inst in t.instances:
            by_doc.setdefault(inst.doc_id, []).append(tuple(inst.arguments))
        for i in range(len(by_doc)):
            rec = next(ours)
            assert rec.subject == s and task.build(rec) == by_doc[i], (s, i)
            n += 1
    assert n == 14042


def test_no_data_root_without_the_variable(monkeypatch, tmp_path):
    """The library has no deployment default (no folder beside the repository, none under the
    working directory): without LENS_HEADS_DATA the named corpora and tasks come from the hub."""
    from lens_heads.data import candidate_data_roots

    monkeypatch.delenv("LENS_HEADS_DATA", raising=False)
    (tmp_path / "shared" / "data").mkdir(parents=True)
    monkeypatch.chdir(tmp_path)
    assert data_root() is None and candidate_data_roots() == []
    monkeypatch.setenv("LENS_HEADS_DATA", str(tmp_path / "elsewhere"))
    assert data_root() == tmp_path / "elsewhere"


# -----------------------------------------------------------------------------
# The shipped C4 sample: what a default --data reads without a local copy

SHIPPED_C4 = Path(__file__).resolve().parents[1] / "lens_heads" / "demo_data" / "c4_validation_sample.jsonl"


def shipped_texts() -> list[str]:
    return [json.loads(line)["text"] for line in SHIPPED_C4.read_text(encoding="utf-8").splitlines()]


def test_c4_sample_is_the_shipped_file_whatever_the_data_root(tmp_path, monkeypatch):
    monkeypatch.delenv("LENS_HEADS_DATA", raising=False)
    assert load_texts("c4-sample") == shipped_texts() and len(shipped_texts()) == 48
    monkeypatch.setenv("LENS_HEADS_DATA", str(tmp_path))  # a data root never shadows the package's copy
    assert load_texts("c4-sample", n=5) == shipped_texts()[:5]


def test_default_corpus_falls_back_to_the_sample_only_without_a_local_copy(tmp_path, monkeypatch):
    from lens_heads.data.corpora import default_corpus

    monkeypatch.delenv("LENS_HEADS_DATA", raising=False)
    name, note = default_corpus("c4")
    assert name == "c4-sample" and "LENS_HEADS_DATA is unset" in note and "\n" not in note
    monkeypatch.setenv("LENS_HEADS_DATA", str(tmp_path))
    name, note = default_corpus("c4")
    assert name == "c4-sample" and f"{tmp_path} has no c4/c4_validation_2k.jsonl" in note
    (tmp_path / "c4").mkdir()
    (tmp_path / "c4" / "c4_validation_2k.jsonl").write_text(json.dumps({"text": "a local text"}) + "\n")
    assert default_corpus("c4") == ("c4", None)
    assert load_texts("c4") == ["a local text"]
    assert default_corpus("wikitext2") == ("wikitext2", None)  # no sample: it stays (and may use the hub)


def test_an_explicit_c4_offline_without_a_copy_says_how_to_fix_it(tmp_path, monkeypatch, capsys, tiny_model_dir):
    from lens_heads.cli import main

    monkeypatch.delenv("LENS_HEADS_DATA", raising=False)
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with pytest.raises(LensHeadsError) as err:
        load_texts("c4", n=3)
    msg = str(err.value)
    assert "\n" not in msg and "set LENS_HEADS_DATA to a folder holding c4/c4_validation_2k.jsonl" in msg
    assert "'c4-sample'" in msg
    out, folder = tmp_path / "scores.csv", tiny_model_dir("llama")
    capsys.readouterr()
    assert main(["score", str(folder), "--data", "c4", "--out", str(out)]) == 2
    printed = capsys.readouterr()
    assert printed.err.count("\n") == 1 and printed.err.startswith("lens-heads score: error: corpus 'c4'")
    assert "Traceback" not in printed.err and not out.exists()


def test_info_without_a_data_root_reads_the_shipped_sample(tiny_model_dir, tiny_model, monkeypatch, capsys):
    """``lens-heads info MODEL`` offline with no LENS_HEADS_DATA: one stderr line says the shipped
    sample stands in, and the per-layer first-token attention is AWFT on those texts."""
    from lens_heads.cli import main
    from lens_heads.scores import score_heads

    monkeypatch.delenv("LENS_HEADS_DATA", raising=False)
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    folder = tiny_model_dir("llama")
    capsys.readouterr()
    assert main(["info", str(folder)]) == 0
    printed = capsys.readouterr()
    lines = printed.err.strip().splitlines()
    assert len(lines) == 1 and "using 'c4-sample'" in lines[0] and "LENS_HEADS_DATA is unset" in lines[0]
    assert "8 c4-sample texts x <= 128 tokens" in printed.out
    model = tiny_model("llama")
    awft = score_heads(model, tokenize_texts(model.tokenizer, shipped_texts()[:8], 128), "awft",
                       progress=False).mean["awft"].mean(dim=1)
    shown = [float(m) for m in re.findall(r"layer +\d+ +([0-9.]+)", printed.out)]
    assert shown == [round(float(v), 3) for v in awft]


def test_info_with_a_data_root_reads_c4_and_says_nothing(tiny_model_dir, shared_data, monkeypatch, capsys):
    from lens_heads.cli import main

    monkeypatch.setenv("LENS_HEADS_DATA", str(shared_data))
    assert main(["info", str(tiny_model_dir("llama")), "--n-inputs", "2"]) == 0
    printed = capsys.readouterr()
    assert "2 c4 texts" in printed.out and "c4-sample" not in printed.err
