"""The explorer (docs/methods.md §11): its API against the library's own computations, its
refusals, and the page in a real headless browser."""

from __future__ import annotations

import os
import shutil
import threading
from pathlib import Path

import httpx
import pytest
import torch

from lens_heads.interventions.ablation import parse_ablation
from lens_heads.data import load_task
from lens_heads.forward.engine import forward
from lens_heads.evaluation.evaluate import evaluate_task
from lens_heads.explore import Explorer, Server, session

ROOT = Path(__file__).resolve().parents[1]


SWEEP = """score_fn,fraction,seed,threshold,spec,pct_zeroed,accuracy,ci_low,ci_high
ahon_ln,0.0,,,none,0.0,0.60,0.50,0.70
ahon_ln,0.25,,1.0,score:ahon_ln@1.0,25.0,0.55,0.45,0.65
random,0.25,0,,random:0.25@0,25.0,0.50,0.40,0.60
"""


@pytest.fixture(scope="module")
def served(tiny_model, shared_data, tmp_path_factory):
    from lens_heads.scores import score_heads

    model = tiny_model("llama")
    folder = tmp_path_factory.mktemp("explore")
    (folder / "sweep").mkdir()
    (folder / "sweep" / "summary.csv").write_text(SWEEP)
    score_heads(model, ["The capital of France is Paris.", "Heads that do nothing"], "all",
                progress=False).save(folder / "scores.csv")
    server = Server(Explorer.open(model, sweep=str(folder / "sweep"), scores=str(folder / "scores.csv"),
                                  max_tokens=200), "127.0.0.1", 0).start()
    yield model, server.url
    server.stop()


def post(url, path, body):
    return httpx.post(url + path, json=body, timeout=120)


def test_info_describes_the_model(served):
    model, url = served
    info = httpx.get(url + "api/info", timeout=30).json()
    assert (info["n_layers"], info["n_heads"], info["n_kv_heads"]) == (2, 4, 2)
    assert info["group_size"] == [2, 2] and "ahon_ln" in {s["id"] for s in info["scores"]}
    assert {"piqa", "mmlu", "winogrande"} <= set(info["tasks"])
    assert [p["spec"] for p in info["sweep"]] == ["none", "score:ahon_ln@1.0", "random:0.25@0"]
    assert len(info["dataset_scores"]["ahon_ln"]) == 2 and len(info["dataset_scores"]["ahon_ln"][0]) == 4


def test_a_prompt_gets_its_scores_and_next_tokens(served):
    model, url = served
    r = post(url, "api/run", {"prompt": "The capital of France is", "ablation": "static:0.1,1.2"}).json()
    ids = session.tokenize(model, "The capital of France is")
    assert r["tokens"] == session.token_strings(model, ids)
    # the unablated top-k: a plain forward's softmax
    p = torch.softmax(forward(model, ids[None], torch.ones(1, len(ids), dtype=torch.long), [])[0, -1].float(), -1)
    top = p.topk(10)
    assert [t["id"] for t in r["next"]["base"]] == top.indices.tolist()
    assert [t["p"] for t in r["next"]["base"]] == pytest.approx(top.values.tolist(), abs=1e-6)
    # ablated: the two heads zeroed, and the distribution moved
    assert r["next"]["zeroed"] == [[0, 1], [1, 2]]
    assert [t["p"] for t in r["next"]["ablated"]] != pytest.approx([t["p"] for t in r["next"]["base"]], abs=1e-6)
    # per-input scores: the library's score pass on this input
    from lens_heads.scores import score_heads

    hs = score_heads(model, [ids], "all", keep_per_input=True, progress=False)
    got = torch.tensor(r["scores"]["ahon_ln"])
    assert torch.allclose(got, hs.per_input["ahon_ln"][0].float(), atol=1e-5)
    assert len(r["classes"]) == 2 and len(r["classes"][0]) == 4
    assert "lens_heads.explore import session" in r["code"]["python"]


def test_a_per_input_rule_says_which_heads_it_zeroed(served):
    model, url = served
    r = post(url, "api/run", {"prompt": "The capital of France is Paris, and of Italy", "ablation": "score:ahon_ln@1.0"})
    r = r.json()
    scores = torch.tensor(r["scores"]["ahon_ln"])
    want = sorted([L, h] for L, h in (scores < 1.0).nonzero().tolist())
    assert r["next"]["zeroed"] == want and want  # the rule's own heads on this input


def test_a_task_question_equals_evaluate(served):
    model, url = served
    piqa = load_task("piqa")
    r = post(url, "api/run", {"task": "piqa", "index": 3, "ablation": "static:0.1,1.2"}).json()
    q = r["question"]
    doc = piqa.records[3].doc_id
    base = evaluate_task(model, piqa, doc_ids=[doc], progress=False).questions[0]
    abl = evaluate_task(model, piqa, doc_ids=[doc], progress=False,
                        ablation=parse_ablation("static:0.1,1.2", model.geometry)).questions[0]
    assert q["base"]["lls"] == pytest.approx(base.lls, abs=1e-6)
    assert q["ablated"]["lls"] == pytest.approx(abl.lls, abs=1e-6)
    assert q["ablated"]["flipped"] == (abl.pred != base.pred)
    assert q["zeroed"] == [[0, 1], [1, 2]]
    assert q["choices"] == list(piqa.records[3].choices)


def test_a_head_view_is_its_pattern(served):
    model, url = served
    r = post(url, "api/head", {"prompt": "The capital of France is", "layer": 1, "head": 3}).json()
    A = torch.tensor(r["pattern"])
    n = len(r["tokens"])
    assert A.shape == (n, n) and torch.allclose(A.sum(-1), torch.ones(n), atol=1e-5)
    assert torch.equal(A.triu(1), torch.zeros(n, n))  # causal
    assert r["kv_head"] == 1 and len(r["value_norm"]) == len(r["output_norm"]) == n


@pytest.mark.parametrize("path, body, status, message", [
    ("api/run", {"prompt": ""}, 400, "empty"),
    ("api/run", {"prompt": "x " * 400}, 413, "at most 200"),
    ("api/run", {"prompt": "hi", "ablation": "static:9.9"}, 400, "layer"),
    ("api/run", {"prompt": "hi", "ablation": "bogus:1"}, 400, "unknown ablation kind"),
    ("api/run", {"prompt": "hi", "ablation": "static:0.1", "replacement": "mean:nowhere"}, 400, "corpus"),
    ("api/run", {"task": "/etc/passwd"}, 400, "unknown task"),
    ("api/run", {"task": "file:/etc/passwd?question=a&choices=b&answer=c"}, 400, "unknown task"),
    ("api/run", {"task": "piqa", "index": 10**9}, 400, "questions 0.."),
    ("api/head", {"prompt": "hi", "layer": 5, "head": 0}, 400, "layer"),
    ("api/head", {"prompt": "hi", "layer": "a", "head": 0}, 400, "integers"),
    ("api/run", [1, 2], 400, "JSON object"),
])
def test_bad_requests_get_one_message_and_the_server_stays_up(served, path, body, status, message):
    model, url = served
    r = post(url, path, body)
    assert r.status_code == status and message in r.json()["error"], r.text
    assert httpx.get(url + "api/info", timeout=30).status_code == 200


def test_a_toggle_on_the_same_input_reuses_its_unablated_results(served, monkeypatch):
    """After the first run of an input, a new ablation costs one forward (its scores and the
    unablated answer are kept), and the answers are those of a fresh run."""
    model, url = served
    body = {"prompt": "Toggle me: the capital of Italy is", "ablation": "static:0.0"}
    first = post(url, "api/run", body).json()
    calls = []
    real = session.input_scores
    monkeypatch.setattr(session, "input_scores", lambda *a, **k: calls.append(1) or real(*a, **k))
    again = post(url, "api/run", {**body, "ablation": "static:1.3"}).json()
    assert calls == [] and again["scores"] == first["scores"] and again["next"]["base"] == first["next"]["base"]
    assert again["next"]["zeroed"] == [[1, 3]]


def test_two_tabs_at_once_get_consistent_answers(served):
    model, url = served
    bodies = [{"prompt": "The capital of France is", "ablation": "random:0.3@1"},
              {"prompt": "Attention heads that do nothing", "ablation": "static:1.1"}] * 3
    want = [post(url, "api/run", b).json()["next"] for b in bodies[:2]]
    got = [None] * len(bodies)

    def go(i):
        got[i] = post(url, "api/run", bodies[i]).json()["next"]

    threads = [threading.Thread(target=go, args=(i,)) for i in range(len(bodies))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    for i, g in enumerate(got):
        assert g == want[i % 2]


def test_the_cli_checks_before_loading(tiny_model_dir, tmp_path, capsys, monkeypatch):
    from lens_heads import models
    from lens_heads.cli import main

    monkeypatch.setattr(models, "load_model", lambda *a, **k: pytest.fail("loaded the model"))
    assert main(["explore", str(tiny_model_dir("llama")), "--sweep", str(tmp_path / "none")]) == 2
    assert "no summary.csv" in capsys.readouterr().err
    assert main(["explore", str(tiny_model_dir("llama")), "--port", "70000"]) == 2
    assert "--port" in capsys.readouterr().err


# --- the page, in a real browser -------------------------------------------------------------


def _driver():
    if not (shutil.which("chromedriver") and (shutil.which("chromium") or shutil.which("chromium-browser"))):
        pytest.skip("no chromium + chromedriver on PATH: .ci/run apt-installs chromium and chromium-driver as root")
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    opts = webdriver.ChromeOptions()
    opts.binary_location = shutil.which("chromium") or shutil.which("chromium-browser")
    for a in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage", "--window-size=1400,1000",
              "--proxy-server=127.0.0.1:9", "--proxy-bypass-list=127.0.0.1"):
        opts.add_argument(a)
    return webdriver.Chrome(service=Service(shutil.which("chromedriver")), options=opts)


@pytest.mark.browser
def test_the_page_in_a_browser(served, tmp_path):
    """Load the page, run a prompt, open a head's pattern (circuitsvis renders), ablate two heads
    on a task question: the shown log-likelihoods are evaluate_task's."""
    from selenium.webdriver.common.action_chains import ActionChains
    from selenium.webdriver.common.by import By
    from selenium.webdriver.common.keys import Keys
    from selenium.webdriver.support.ui import WebDriverWait

    model, url = served
    driver = _driver()
    try:
        wait = WebDriverWait(driver, 60)
        driver.get(url)
        wait.until(lambda d: d.find_element(By.TAG_NAME, "body").get_attribute("data-ready") == "1")
        box = driver.find_element(By.ID, "prompt")
        box.clear()
        box.send_keys("The capital of France is")
        driver.find_element(By.ID, "run").click()
        wait.until(lambda d: d.find_element(By.TAG_NAME, "body").get_attribute("data-runs") == "1")
        assert len(driver.find_elements(By.CSS_SELECTOR, "#tokens span")) == len(session.tokenize(model, "The capital of France is"))
        assert len(driver.find_elements(By.CSS_SELECTOR, "#topk tr")) == 11
        # a head's pattern: circuitsvis draws it
        driver.find_element(By.CSS_SELECTOR, '#heads td[data-l="1"][data-h="2"]').click()
        wait.until(lambda d: d.find_elements(By.CSS_SELECTOR, "#cv-pattern canvas"))
        assert "L1.H2" in driver.find_element(By.ID, "head-title").text
        # a task question with two heads ablated (shift-click selects them)
        driver.find_element(By.ID, "load-question").click()
        wait.until(lambda d: "piqa #0" in d.find_element(By.ID, "question-box").text)
        for L, h in ((0, 1), (1, 2)):
            cell = driver.find_element(By.CSS_SELECTOR, f'#heads td[data-l="{L}"][data-h="{h}"]')
            ActionChains(driver).key_down(Keys.SHIFT).click(cell).key_up(Keys.SHIFT).perform()
        driver.find_element(By.ID, "use-selected").click()
        assert driver.find_element(By.ID, "spec").get_attribute("value") == "static:0.1,1.2"
        driver.find_element(By.ID, "run").click()
        wait.until(lambda d: d.find_element(By.TAG_NAME, "body").get_attribute("data-runs") == "2")
        shown = [float(e.text.split()[0]) for e in driver.find_elements(By.CSS_SELECTOR, "#choices td.ll-ablated")]
        piqa = load_task("piqa")
        want = evaluate_task(model, piqa, doc_ids=[piqa.records[0].doc_id], progress=False,
                             ablation=parse_ablation("static:0.1,1.2", model.geometry)).questions[0].lls
        assert shown == pytest.approx(want, abs=1e-4)  # shown to 4 decimals
        assert driver.find_element(By.ID, "error").text == ""
        # the sweep's curves: a click on a point loads its ablation
        driver.find_element(By.CSS_SELECTOR, 'circle.pt[data-spec="score:ahon_ln@1.0"]').click()
        assert driver.find_element(By.ID, "spec").get_attribute("value") == "score:ahon_ln@1.0"
        shot = tmp_path / "explorer.png"
        driver.save_screenshot(str(shot))
        assert shot.stat().st_size > 20_000
        if os.environ.get("LENS_HEADS_UPDATE_SCREENSHOT"):  # the README's screenshot comes from this test
            shutil.copyfile(shot, ROOT / "docs" / "explorer.png")
    finally:
        driver.quit()


def test_the_python_api_starts_and_stops_it(tiny_model, capsys):
    import lens_heads as lh

    server = lh.explore(tiny_model("llama"), port=0, show=False)
    try:
        assert httpx.get(server.url + "api/info", timeout=30).json()["n_layers"] == 2
        assert server.url.startswith("http://127.0.0.1:")
        assert f"explorer: {server.url}" in capsys.readouterr().out
    finally:
        server.stop()
    with pytest.raises(httpx.ConnectError):
        httpx.get(server.url + "api/info", timeout=5)
    public = lh.explore(tiny_model("llama"), host="0.0.0.0", port=0, show=False)  # warns: reachable by others
    public.stop()
    assert "warning: the explorer listens on 0.0.0.0" in capsys.readouterr().err


def test_a_percentage_spec_is_calibrated_on_the_shipped_sample(served):
    """score:ID@P% zeroes the heads under the threshold that takes P % of the pooled unablated
    scores on the shipped C4 sample (as 'lens-heads evaluate' calibrates on its inputs)."""
    from lens_heads.data import load_texts, tokenize_texts
    from lens_heads.interventions.thresholds import calibrated_spec

    model, url = served
    r = post(url, "api/run", {"prompt": "The capital of France is", "ablation": "score:ahon_ln@25%"}).json()
    inputs = tokenize_texts(model.tokenizer, load_texts("c4-sample", n=48), 128)
    want = calibrated_spec(model, inputs, "ahon_ln", 0.25, progress=False)[0]
    assert r["next"]["ablation"] == want and want.startswith("score:ahon_ln@")
