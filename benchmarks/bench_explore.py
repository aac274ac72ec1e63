"""Latency of the explorer (``lens-heads explore``) on a real model, as a researcher feels it.

    HF_HUB_OFFLINE=1 .venv/bin/python benchmarks/bench_explore.py              # SmolLM2, 64-token prompt

- **toggle**: an ablation switched on a 64-token prompt already shown (the page's "run" after a
  head is shift-clicked): ``POST /api/run`` with a new ``static:`` set each time, 50 toggles,
  median and p95 (goal: <= 1 s on 2 CPU cores; the model stays loaded, one forward each).
- **first run**: the same prompt's first run (its scores, unablated and ablated answers).
- **first paint**: headless chromium loads the page once the server is up; the page's own
  ``first-contentful-paint`` and the time until it has read ``/api/info`` (goal: <= 2 s).

Results: benchmarks/results/bench_explore.md.
"""

from __future__ import annotations

import argparse
import os
import random
import shutil
import statistics
import sys
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
ROOT = Path(__file__).resolve().parents[1]


def first_paint(url: str) -> dict | None:
    """(first-contentful-paint ms, ms until the page had its info) in headless chromium."""
    if not (shutil.which("chromedriver") and shutil.which("chromium")):
        return None
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import WebDriverWait

    opts = webdriver.ChromeOptions()
    opts.binary_location = shutil.which("chromium")
    for a in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage"):
        opts.add_argument(a)
    driver = webdriver.Chrome(service=Service(shutil.which("chromedriver")), options=opts)
    try:
        t0 = time.perf_counter()
        driver.get(url)
        WebDriverWait(driver, 60).until(lambda d: d.find_element(By.TAG_NAME, "body").get_attribute("data-ready") == "1")
        ready = 1000 * (time.perf_counter() - t0)
        fcp = driver.execute_script(
            "const e = performance.getEntriesByName('first-contentful-paint')[0]; return e ? e.startTime : null;")
        return {"fcp_ms": fcp, "ready_ms": ready}
    finally:
        driver.quit()


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default="smollm2-135m")
    ap.add_argument("--dtype", default="auto")
    ap.add_argument("--tokens", type=int, default=64)
    ap.add_argument("--toggles", type=int, default=50)
    ap.add_argument("--out", default=str(ROOT / "benchmarks" / "results" / "bench_explore.md"))
    args = ap.parse_args()

    import httpx
    import torch

    from lens_heads import load_model
    from lens_heads.files.atomic import atomic_write_text
    from lens_heads.data import load_texts
    from lens_heads.explore import Explorer, Server

    model = load_model(args.model, dtype=args.dtype)
    text = " ".join(load_texts("c4-sample", n=4))
    ids = model.tokenizer(text)["input_ids"][: args.tokens]
    prompt = model.tokenizer.decode(ids)
    t0 = time.perf_counter()
    server = Server(Explorer.open(model), "127.0.0.1", 0).start()
    up = time.perf_counter() - t0
    try:
        paint = first_paint(server.url)
        g = model.geometry
        heads = [(L, h) for L in range(g.n_layers) for h in range(g.n_heads)]
        rng = random.Random(0)
        t = time.perf_counter()
        r = httpx.post(server.url + "api/run", json={"prompt": prompt, "ablation": "static:0.0"}, timeout=600)
        first = time.perf_counter() - t
        assert r.status_code == 200, r.text
        n_tokens = len(r.json()["tokens"])
        times = []
        for _ in range(args.toggles):
            picked = rng.sample(heads, 2)
            spec = "static:" + ",".join(f"{L}.{h}" for L, h in picked)
            t = time.perf_counter()
            r = httpx.post(server.url + "api/run", json={"prompt": prompt, "ablation": spec}, timeout=600)
            times.append(time.perf_counter() - t)
            assert r.status_code == 200, r.text
    finally:
        server.stop()
    times.sort()
    p95 = times[min(len(times) - 1, int(round(0.95 * (len(times) - 1))))]
    lines = [f"# bench_explore ({args.model}, {model.dtype}, torch threads {torch.get_num_threads()}, "
             f"load avg {os.getloadavg()[0]:.1f})", "",
             f"- prompt: {n_tokens} tokens (C4 sample text); server up in {up:.2f} s after the model loaded",
             f"- first run of the prompt (scores, unablated and ablated answers): {first:.2f} s",
             f"- ablation toggles (2 random heads each, {args.toggles}): median {statistics.median(times):.3f} s, "
             f"p95 {p95:.3f} s, max {times[-1]:.3f} s (goal: <= 1 s)"]
    if paint:
        lines.append(f"- page in headless chromium: first contentful paint {paint['fcp_ms']:.0f} ms, ready (info "
                     f"read, map drawn) {paint['ready_ms']:.0f} ms after navigation (goal: <= 2 s)")
    else:
        lines.append("- page paint: not measured (no chromium + chromedriver on PATH)")
    lines += ["", f"Command: `{' '.join(['python', 'benchmarks/bench_explore.py'] + sys.argv[1:])}`", ""]
    atomic_write_text(args.out, "\n".join(lines))
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
