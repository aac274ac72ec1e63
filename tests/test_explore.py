"""The explorer (docs/methods.md §11): its API against the library's own computations, its
refusals, and the page in a real headless browser."""

from __future__ import annotations

import os
import re
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
    ("api/head", {"prompt": "hi", "layer": "a", "head": 0}, 400, "layer must be an integer"),
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


def _run_prompt(driver, wait, text: str) -> None:
    """Once the page is ready: type ``text`` as the prompt, run it, wait for the answer."""
    from selenium.webdriver.common.by import By

    wait.until(lambda d: d.find_element(By.TAG_NAME, "body").get_attribute("data-ready") == "1")
    box = driver.find_element(By.ID, "prompt")
    box.clear()
    box.send_keys(text)
    runs = int(driver.find_element(By.TAG_NAME, "body").get_attribute("data-runs") or 0)
    driver.find_element(By.ID, "run").click()
    wait.until(lambda d: d.find_element(By.TAG_NAME, "body").get_attribute("data-runs") == str(runs + 1))


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
        _run_prompt(driver, wait, "The capital of France is")
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
        assert shot.stat().st_size > 20_000  # (the README's picture: docs/explorer_screenshot.py, on SmolLM2)
    finally:
        driver.quit()


@pytest.mark.browser
def test_the_page_works_with_a_token(served_with_token):
    """A server that needs its token: the printed URL opens the page, whose own requests (same
    origin, JSON, the token as a header) all pass the guard; the bare URL's page says so."""
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import WebDriverWait

    server = served_with_token
    driver = _driver()
    try:
        wait = WebDriverWait(driver, 60)
        driver.get(server.base_url)  # without the token: the page, and one message where its answers would be
        wait.until(lambda d: "needs its token" in d.find_element(By.ID, "error").text)
        driver.get_log("browser")  # that refusal's own console line
        driver.get(server.url)
        assert "token=" not in driver.current_url  # taken out of the address bar (and the history)
        _run_prompt(driver, wait, "The capital of France is")
        assert len(driver.find_elements(By.CSS_SELECTOR, "#topk tr")) == 11
        driver.find_element(By.CSS_SELECTOR, '#heads td[data-l="0"][data-h="1"]').click()
        wait.until(lambda d: d.find_elements(By.CSS_SELECTOR, "#cv-pattern canvas"))
        assert driver.find_element(By.ID, "error").text == ""
        driver.get(server.base_url)  # the tab keeps it: the bare URL works now too
        wait.until(lambda d: d.find_element(By.TAG_NAME, "body").get_attribute("data-ready") == "1")
        logs = [e for e in driver.get_log("browser") if e["level"] == "SEVERE" and "favicon" not in e["message"]]
        assert logs == [], logs
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
    public = lh.explore(tiny_model("llama"), host="0.0.0.0", port=0, show=False)  # says: reachable by others
    public.stop()
    assert "the explorer listens on 0.0.0.0" in capsys.readouterr().err


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
    q = post(url, "api/run", {"task": "piqa", "index": 2, "ablation": "score:ahon_ln@25%"}).json()
    assert f"--ablate '{want}'" in q["code"]["cli"] and f"parse_ablation({want!r}" in q["code"]["python"]  # its τ


# --- who may call it (docs/methods.md §11, threat model) ----------------------------------------


def raw(url, path, content: bytes | str, content_type="application/json", headers=None, method="POST"):
    """A request as a hostile page or client would send it: the body as given, any headers."""
    h = {"content-type": content_type, **(headers or {})} if content_type else dict(headers or {})
    return httpx.request(method, url + path, content=content, headers=h, timeout=60)


def port_of(url: str) -> int:
    return int(url.split(":")[2].split("/")[0])


@pytest.mark.parametrize("host", ["evil.example.com", "evil.example.com:{port}", "127.0.0.1:1", "localhost:1",
                                  "127.0.0.2:{port}", "192.168.1.5:{port}", "[::2]:{port}", "", "%%%"])
@pytest.mark.parametrize("method, path", [("GET", "api/info"), ("POST", "api/run"), ("GET", "")])
def test_a_foreign_host_is_refused(served, host, method, path):
    """DNS rebinding: a page whose name resolves to 127.0.0.1 sends its own Host; the loopback
    server answers only its own names on its own port."""
    model, url = served
    host = host.format(port=port_of(url))
    r = raw(url, path, '{"prompt": "hi"}' if method == "POST" else b"", headers={"host": host}, method=method)
    assert r.status_code == 400 and "this explorer answers only" in r.json()["error"] or \
        (host in ("", "%%%") and r.status_code == 400), r.text


@pytest.mark.parametrize("name", ["127.0.0.1", "localhost", "LOCALHOST", "[::1]"])
def test_its_own_host_names_are_served(served, name):
    model, url = served
    r = httpx.get(url + "api/info", headers={"host": f"{name}:{port_of(url)}"}, timeout=30)
    assert r.status_code == 200 and r.json()["n_layers"] == 2


@pytest.mark.parametrize("headers", [{"origin": "http://evil.example.com"}, {"origin": "null"},
                                     {"origin": "http://127.0.0.1:1"}, {"origin": "https://127.0.0.1:{port}"},
                                     {"sec-fetch-site": "cross-site"}, {"sec-fetch-site": "same-site"}])
@pytest.mark.parametrize("method, path", [("POST", "api/run"), ("POST", "api/head"), ("GET", "api/info")])
def test_a_cross_site_request_is_refused(served, headers, method, path, monkeypatch):
    model, url = served
    calls = []
    monkeypatch.setattr(session, "tokenize", lambda *a, **k: calls.append(1) or pytest.fail("computed"))
    headers = {k: v.format(port=port_of(url)) for k, v in headers.items()}
    body = '{"prompt": "hi", "layer": 0, "head": 0}' if path == "api/head" else '{"prompt": "hi"}'
    r = raw(url, path, body if method == "POST" else b"", headers=headers, method=method)
    assert r.status_code == 403 and "cross-site request refused" in r.json()["error"], r.text
    assert calls == []


@pytest.mark.parametrize("path, body, field", [
    ("api/run", '{"prompt": "The \\ud800 cat"}', "prompt"),
    ("api/run", b'{"prompt": "The \xed\xa0\x80 cat"}', "JSON"),
    ("api/run", '{"prompt": "hi", "ablation": "static:' + "9" * 5000 + '.0"}', "bad head"),
    ("api/run", '{"prompt": "hi", "ablation": "static:0.0", "replacement": "resample:self@\u00b2"}', "replacement"),
    ("api/run", '{"prompt": "hi", "ablation": "static:0.0", "replacement": "resample:self@--1"}', "replacement"),
    ("api/run", '{"prompt": "hi", "ablation": "static:0.0", "replacement": "mean:c4-sample@\u00b2"}', "corpus"),
    ("api/run", '{"prompt": "hi", "ablation": "static:0.0", "replacement": "resample:self@' + "1" * 5000 + '"}',
     "replacement"),
    ("api/run", '{"prompt": "hi", "ablation": "\\ud800"}', "ablation"),
    ("api/run", b'\xef\xbb\xbf{"prompt": "hi"}', "JSON"),
])
def test_what_a_hostile_review_found_is_a_400(served, path, body, field):
    """Lone surrogates, Unicode digits, 5,000-digit numbers, a BOM: each a 400, never a 500."""
    model, url = served
    r = raw(url, path, body)
    assert r.status_code == 400 and field in r.json()["error"], r.text


def test_a_malformed_token_or_host_is_refused_not_a_500(served, served_with_token):
    model, url = served
    port = port_of(url)
    for host in (f"evil@127.0.0.1:{port}", f"127.0.0.1:{port}/x", f"127.0.0.1:{port}#x", "127.0.0.1"):
        assert httpx.get(url + "api/info", headers={"host": host}, timeout=30).status_code == 400, host
    base = served_with_token.base_url
    for header in (b"token \xc3\xa9", b"token \xff", b"Bearer \xe9\xe9"):
        assert httpx.get(base + "api/info", headers={"authorization": header}, timeout=30).status_code == 403


def test_no_other_site_may_frame_it(served):
    """A page on another site cannot frame the explorer (and trick a click into it)."""
    model, url = served
    for path in ("", "api/info", "circuitsvis.js"):
        csp = httpx.get(url + path, timeout=30).headers["content-security-policy"]
        assert csp.startswith("frame-ancestors 'self' http://127.0.0.1:* http://localhost:*")
    assert "frame-ancestors" in raw(url, "api/run", "{}", content_type="text/plain").headers["content-security-policy"]


def test_the_same_origin_is_served(served):
    """What the page itself sends: Origin = the server's own, Sec-Fetch-Site: same-origin."""
    model, url = served
    origin = url.rstrip("/")
    r = raw(url, "api/run", '{"prompt": "hi"}', headers={"origin": origin, "sec-fetch-site": "same-origin"})
    assert r.status_code == 200 and r.json()["tokens"]
    assert httpx.get(url, headers={"sec-fetch-site": "cross-site"}, timeout=30).status_code == 200  # a link to it


@pytest.mark.parametrize("content_type", ["text/plain", "application/x-www-form-urlencoded", "multipart/form-data",
                                          "text/plain; charset=utf-8", None, "application/jsonx"])
def test_a_post_that_is_not_json_is_refused(served, content_type, monkeypatch):
    """A plain HTML form or a no-cors fetch can send these without a preflight: 415, not parsed."""
    model, url = served
    monkeypatch.setattr(session, "tokenize", lambda *a, **k: pytest.fail("computed"))
    r = raw(url, "api/run", '{"prompt": "hi"}', content_type=content_type)
    assert r.status_code == 415 and "application/json" in r.json()["error"], r.text


def test_json_with_a_charset_is_json(served):
    model, url = served
    r = raw(url, "api/run", '{"prompt": "hi"}', content_type="application/json; charset=utf-8")
    assert r.status_code == 200


@pytest.mark.parametrize("chunked", [False, True])
def test_an_oversized_body_is_refused_before_it_is_read(served, chunked, monkeypatch):
    """5 MB: refused by its Content-Length (or, sent in chunks without one, as it grows past the
    cap), never tokenized, in well under a second; the server stays up."""
    import time

    model, url = served
    calls = []
    monkeypatch.setattr(session, "tokenize", lambda *a, **k: calls.append(1))
    body = ('{"prompt": "' + "word " * 1_000_000 + '"}').encode()
    t0 = time.monotonic()
    content = (body[i:i + 65536] for i in range(0, len(body), 65536)) if chunked else body
    r = httpx.post(url + "api/run", content=content, headers={"content-type": "application/json"}, timeout=60)
    took = time.monotonic() - t0
    assert r.status_code == 413 and "64 KiB" in r.json()["error"], r.text
    assert calls == [] and took < 2.0
    assert httpx.get(url + "api/info", timeout=30).status_code == 200


@pytest.mark.parametrize("path, body, field", [
    ("api/run", '{"prompt": "hi", "ablation": "static:0.1", "replacement": 5}', "replacement"),
    ("api/run", '{"prompt": "hi", "ablation": "static:0.1", "replacement": ["mean:self"]}', "replacement"),
    ("api/run", '{"prompt": "hi", "ablation": {"a": 1}}', "ablation"),
    ("api/run", '{"prompt": 12}', "prompt"),
    ("api/run", '{"task": "piqa", "index": 1e999}', "index"),
    ("api/run", '{"task": "piqa", "index": -Infinity}', "index"),
    ("api/run", '{"task": "piqa", "index": Infinity}', "index"),
    ("api/run", '{"task": "piqa", "index": NaN}', "index"),
    ("api/run", '{"task": "piqa", "index": 1.9}', "index"),
    ("api/run", '{"task": "piqa", "index": 1.0}', "index"),
    ("api/run", '{"task": "piqa", "index": true}', "index"),
    ("api/run", '{"task": "piqa", "index": -1}', "index"),
    ("api/run", '{"task": 3}', "task"),
    ("api/run", '{"prompt": "hi", "index": 2}', "index"),
    ("api/run", '{"prompt": "hi", "layer": 2}', "layer"),
    ("api/head", '{"prompt": "hi", "layer": 1e999, "head": 0}', "layer"),
    ("api/head", '{"prompt": "hi", "layer": 2.7, "head": 0.5}', "layer"),
    ("api/head", '{"prompt": "hi", "layer": 1, "head": 0.5}', "head"),
    ("api/head", '{"prompt": "hi", "layer": false, "head": 0}', "layer"),
    ("api/head", '{"prompt": "hi", "layer": 1, "head": true}', "head"),
    ("api/head", '{"prompt": "hi", "layer": 1}', "head"),
    ("api/head", '{"prompt": "hi", "layer": 100000000000000000000000000000000, "head": 0}', "layer"),
])
def test_a_wrong_type_is_a_400_naming_the_field(served, path, body, field):
    model, url = served
    r = raw(url, path, body)
    error = r.json()["error"]
    assert r.status_code == 400 and re.match(rf"(unknown field '|give )?{field}\b", error), r.text
    assert "\n" not in error


@pytest.mark.parametrize("query, field", [("task=piqa&index=1.5", "index"), ("task=piqa&index=abc", "index"),
                                          ("task=piqa&index=-3", "index"), ("index=2", "task"),
                                          ("task=piqa&bogus=1", "bogus")])
def test_a_question_query_is_checked_too(served, query, field):
    model, url = served
    r = httpx.get(url + "api/question?" + query, timeout=30)
    assert r.status_code == 400 and field in r.json()["error"], r.text


def test_a_question_by_query(served):
    model, url = served
    r = httpx.get(url + "api/question?task=piqa&index=2", timeout=60).json()
    assert r["index"] == 2 and r["doc_id"] == load_task("piqa").records[2].doc_id


@pytest.fixture(scope="module")
def served_with_token(tiny_model):
    server = Server(Explorer.open(tiny_model("llama"), max_tokens=200), "127.0.0.1", 0, token=True).start()
    yield server
    server.stop()


def test_a_token_is_required_when_set(served_with_token):
    """Without the token no /api/ request is served; with it (``Authorization: token``, what the
    page sends once it read the printed URL's ?token=) everything is. The page and circuitsvis'
    bundle are static and need none, and no cookie is ever set (cookies reach every port)."""
    server = served_with_token
    base, token = server.base_url, server.policy.token
    assert server.url == f"{base}?token={token}" and len(token) >= 24
    page = httpx.get(server.url, timeout=30)
    assert page.status_code == 200 and "<html" in page.text.lower() and "set-cookie" not in page.headers
    assert httpx.get(base + "circuitsvis.js", timeout=30).status_code == 200
    assert httpx.get(base + "api/info", timeout=30).status_code == 403
    assert raw(base, "api/run", '{"prompt": "hi"}').status_code == 403
    for wrong in ("token wrong", f"token {token[:-1]}", f"Basic {token}", "token", "token \u00e9\u00e9",
                  f"token {token}\u00e9"):
        r = httpx.get(base + "api/info", headers={"authorization": wrong.encode("utf-8")}, timeout=30)
        assert r.status_code == 403, (wrong, r.text)
    assert httpx.get(base + "api/info", params={"token": token}, timeout=30).status_code == 403  # not in a URL
    r = httpx.post(base + "api/run", json={"prompt": "hi"}, headers={"authorization": f"token {token}"}, timeout=60)
    assert r.status_code == 200 and r.json()["tokens"]
    assert httpx.get(base + "api/info", headers={"authorization": f"Bearer {token}"}, timeout=30).status_code == 200


def test_beyond_loopback_a_token_is_the_default(tiny_model, capsys):
    import lens_heads as lh

    server = lh.explore(tiny_model("llama"), host="0.0.0.0", port=0, show=False)
    try:
        assert server.policy.token and "?token=" in server.url
        base = server.base_url
        assert httpx.get(base + "api/info", timeout=30).status_code == 403
        # reached by a name it cannot know (a cluster node's), the token still lets you in
        r = httpx.get(base + "api/info", headers={"host": f"node-7:{port_of(base)}",
                                                  "authorization": f"token {server.policy.token}"}, timeout=30)
        assert r.status_code == 200
        assert "note: the explorer listens on 0.0.0.0" in capsys.readouterr().err
    finally:
        server.stop()
    open_server = lh.explore(tiny_model("llama"), host="0.0.0.0", port=0, show=False, token=False)
    try:
        assert open_server.policy.token is None
        assert httpx.get(open_server.url + "api/info", timeout=30).status_code == 200
        assert "warning: the explorer listens on 0.0.0.0 without a token" in capsys.readouterr().err
    finally:
        open_server.stop()


def _json_values():
    """Any JSON value, scalars of every type most often (±Infinity, NaN, huge integers, long text)."""
    from hypothesis import strategies as st

    scalars = [st.booleans(), st.integers(), st.integers(min_value=-10**40, max_value=10**40),
               st.floats(allow_nan=True, allow_infinity=True), st.sampled_from([float("inf"), float("-inf"),
                                                                                float("nan"), 1e308, -0.0, 0.5]),
               st.text(max_size=300),
               st.sampled_from(["", "none", "piqa", "mmlu", "static:0.1", "score:ahon_ln@0.5", "score:ahon_ln@10%",
                                "random:0.1@0", "zero", "mean:self", "mean:c4-sample", "resample:self@1",
                                "static:0.1|mean:self", "0", "-1", "1e999", "x" * 20000, "\x00", "static:",
                                "score:nope@1", "random:2@0", "file:/etc/passwd", "static:0.1,0.1", "static:-1.0",
                                "score:ahon_ln@150%", "score:ahon_ln@nan", "random:nan@0", "random:0.5@-1"])]
    nested = st.recursive(st.one_of(st.none(), *scalars), lambda inner: st.lists(inner, max_size=4)
                          | st.dictionaries(st.text(max_size=8), inner, max_size=4), max_leaves=8)
    return st.one_of(st.none(), *scalars, nested)


VALID = {"api/run": [{"prompt": "The capital of France is", "ablation": "static:0.1", "replacement": "zero"},
                     {"task": "piqa", "index": 1, "ablation": "score:ahon_ln@0.5", "replacement": "mean:self"}],
         "api/head": [{"prompt": "The capital of France is", "layer": 1, "head": 2},
                      {"task": "piqa", "index": 0, "layer": 0, "head": 3}],
         "api/question": [{"task": "piqa", "index": 2}], "api/info": [{}]}


def test_no_body_is_a_500(served):
    """Fuzz: a valid body of every endpoint with one to three of its fields (or a new one) set to
    random JSON values of every type (±Infinity, NaN, huge numbers, nested objects, long strings),
    and wholly random bodies: never a 500, always one message."""
    from hypothesis import HealthCheck, given, settings
    from hypothesis import strategies as st

    model, url = served
    fields = st.sampled_from(["prompt", "task", "index", "ablation", "replacement", "layer", "head", "extra"])
    mutated = st.tuples(st.sampled_from(sorted(VALID)), st.integers(0, 1),
                        st.lists(st.tuples(fields, _json_values()), min_size=1, max_size=3))

    def body_of(draw):
        path, which, changes = draw
        body = dict(VALID[path][which % len(VALID[path])])
        for name, value in changes:
            body[name] = value
        return path, body

    cases = mutated.map(body_of) | st.tuples(st.sampled_from(sorted(VALID)), _json_values())

    @settings(max_examples=int(os.environ.get("LENS_HEADS_FUZZ_EXAMPLES", "300")), deadline=None, derandomize=True,
              suppress_health_check=list(HealthCheck))
    @given(case=cases)
    def check(case):
        import json

        path, body = case
        if path in ("api/run", "api/head"):
            r = raw(url, path, json.dumps(body, allow_nan=True))
        else:
            params = body if isinstance(body, dict) else {"index": body}
            r = httpx.get(url + path, params={str(k): v if isinstance(v, str) else json.dumps(v)
                                              for k, v in params.items()}, timeout=60)
        assert r.status_code < 500, (path, body, r.text)
        if r.status_code >= 400:
            error = r.json()["error"]
            assert error and "Traceback" not in error

    check()
