"""Take the README's picture of the explorer (docs/explorer.png) on the real SmolLM2-135M.

    HF_HUB_OFFLINE=1 .venv/bin/python docs/explorer_screenshot.py [--out docs/explorer.png]

It starts ``lens-heads explore smollm2-135m`` in this process (loopback, a free port), finds the
first PIQA question whose answer flips when a few heads are switched off (the heads of one of
a few fixed candidate sets, chosen in that order), and then drives the page as a reader would in
headless Chromium: load that question, shift-click the heads, "ablate the selected heads",
run, open one of them, and take the screenshot. Needs chromium and chromedriver on PATH (Debian's
``chromium`` and ``chromium-driver``) and PIQA under ``$LENS_HEADS_DATA`` (or the hub).
"""

from __future__ import annotations

import argparse
import shutil
import sys
from pathlib import Path

import lens_heads as lh
from lens_heads.data import load_task
from lens_heads.explore import Explorer, Server, session

HERE = Path(__file__).resolve().parent
# heads to switch off, tried in order on each question: a layer's first KV group, then wider sets
CANDIDATES = [[(0, 0), (0, 1), (0, 2)], [(1, 0), (1, 1), (1, 2)], [(0, 3), (0, 4), (0, 5), (2, 1)],
              [(L, 0) for L in range(6)], [(L, 4) for L in range(0, 12, 2)]]


def find_flip(model, task, n_questions: int = 60) -> tuple[int, list[tuple[int, int]]]:
    """(question index, heads) of the first question whose prediction flips with those heads zeroed."""
    for index, rec in enumerate(task.records[:n_questions]):
        for heads in CANDIDATES:
            spec = "static:" + ",".join(f"{L}.{h}" for L, h in heads)
            got = session.question(model, task, rec.doc_id, ablation=session.ablation_of(model, spec))
            if got["ablated"]["flipped"]:
                return index, heads
    raise SystemExit(f"no flip in the first {n_questions} questions with the candidate heads")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default=str(HERE / "explorer.png"))
    ap.add_argument("--model", default="smollm2-135m")
    args = ap.parse_args(argv)
    if not (shutil.which("chromedriver") and shutil.which("chromium")):
        print("needs chromium and chromedriver on PATH (apt-get install chromium chromium-driver)", file=sys.stderr)
        return 2
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service
    from selenium.webdriver.common.action_chains import ActionChains
    from selenium.webdriver.common.by import By
    from selenium.webdriver.common.keys import Keys
    from selenium.webdriver.support.ui import Select, WebDriverWait

    model = lh.load_model(args.model, dtype="float32")
    piqa = load_task("piqa")
    index, heads = find_flip(model, piqa)
    print(f"piqa #{index}: switching off {heads} flips the answer")
    server = Server(Explorer.open(model), "127.0.0.1", 0).start()
    opts = webdriver.ChromeOptions()
    opts.binary_location = shutil.which("chromium")
    for a in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage", "--window-size=1400,1250",
              "--hide-scrollbars", "--proxy-server=127.0.0.1:9", "--proxy-bypass-list=127.0.0.1"):
        opts.add_argument(a)
    driver = webdriver.Chrome(service=Service(shutil.which("chromedriver")), options=opts)
    try:
        wait = WebDriverWait(driver, 120)
        driver.get(server.url)
        wait.until(lambda d: d.find_element(By.TAG_NAME, "body").get_attribute("data-ready") == "1")
        Select(driver.find_element(By.ID, "task")).select_by_value("piqa")
        box = driver.find_element(By.ID, "qindex")
        box.clear()
        box.send_keys(str(index))
        driver.find_element(By.ID, "load-question").click()
        wait.until(lambda d: f"piqa #{index}" in d.find_element(By.ID, "question-box").text)
        for L, h in heads:
            cell = driver.find_element(By.CSS_SELECTOR, f'#heads td[data-l="{L}"][data-h="{h}"]')
            ActionChains(driver).key_down(Keys.SHIFT).click(cell).key_up(Keys.SHIFT).perform()
        driver.find_element(By.ID, "use-selected").click()
        driver.find_element(By.ID, "run").click()
        wait.until(lambda d: d.find_element(By.TAG_NAME, "body").get_attribute("data-runs") == "1")
        L, h = heads[0]
        driver.find_element(By.CSS_SELECTOR, f'#heads td[data-l="{L}"][data-h="{h}"]').click()
        wait.until(lambda d: d.find_elements(By.CSS_SELECTOR, "#cv-pattern canvas"))
        if driver.find_element(By.ID, "error").text:
            raise SystemExit(f"the page shows an error: {driver.find_element(By.ID, 'error').text}")
        if "flipped" not in driver.find_element(By.ID, "result").text.lower():
            raise SystemExit("the page does not show the flip")
        driver.save_screenshot(args.out)
        print(f"wrote {args.out}")
    finally:
        driver.quit()
        server.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
