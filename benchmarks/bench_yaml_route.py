"""Benchmark: a task run from an lm-eval task YAML vs the same task through its registered name.

PIQA on SmolLM2 (fp32): lm-eval's own piqa.yaml pointed at the shipped validation rows, against
lens_heads' registered ``piqa`` (identical prompts, the same stratified questions). Each side's
time includes building the task (load_task: for the YAML, lm-eval's TaskManager and its prompts
for the whole split) and evaluating ``--limit`` questions; the two are timed alternately
``--repeats`` times in one process, and the ratio of the medians is reported (compare ratios
measured in one run, not absolute times). Writes benchmarks/results/bench_yaml_route.md.

    LENS_HEADS_DATA=/path/to/data python benchmarks/bench_yaml_route.py [--limit 200] [--repeats 3]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import tempfile
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")


def piqa_yaml(folder: Path) -> str:
    import lm_eval
    import yaml

    from lens_heads.data import load_task

    rows = folder / "piqa_valid.jsonl"
    rows.write_text("".join(json.dumps(r.raw) + "\n" for r in load_task("piqa").records))
    with open(os.path.join(os.path.dirname(lm_eval.__file__), "tasks", "piqa", "piqa.yaml")) as f:
        cfg = yaml.safe_load(f)
    cfg.update(task="bench_piqa", dataset_path="json", dataset_name=None, training_split=None,
               dataset_kwargs={"data_files": {"validation": str(rows)}})
    path = folder / "bench_piqa.yaml"
    path.write_text(yaml.safe_dump(cfg))
    return str(path)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", default="smollm2-135m")
    p.add_argument("--limit", type=int, default=200)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--batch-size", type=int, default=16)
    p.add_argument("--out", default=str(Path(__file__).parent / "results" / "bench_yaml_route.md"))
    args = p.parse_args()

    import lens_heads as lh
    from lens_heads.data import load_task

    model = lh.load_model(args.model, dtype="float32")
    folder = Path(tempfile.mkdtemp(prefix="bench_yaml_"))
    routes = {"registered piqa": "piqa", "piqa.yaml (lm-eval)": piqa_yaml(folder)}
    times: dict[str, list[float]] = {k: [] for k in routes}
    preds: dict[str, list] = {}
    lm_eval_build = []
    for _ in range(args.repeats):
        for name, spec in routes.items():
            t0 = time.perf_counter()
            task = load_task(spec)
            t1 = time.perf_counter()
            res = lh.evaluate_task(model, task, limit=args.limit, batch_size=args.batch_size, progress=False)
            times[name].append(time.perf_counter() - t0)
            if name != "registered piqa":
                lm_eval_build.append(t1 - t0)
            preds[name] = [(q.doc_id, q.pred, round(max(q.lls), 4)) for q in res.questions]
    med = {k: statistics.median(v) for k, v in times.items()}
    ratio = med["piqa.yaml (lm-eval)"] / med["registered piqa"]
    same = preds["registered piqa"] == preds["piqa.yaml (lm-eval)"]
    lines = ["# The YAML route vs the registered task", "",
             f"`python benchmarks/bench_yaml_route.py --limit {args.limit} --repeats {args.repeats}` on "
             f"{args.model} (fp32, batch {args.batch_size}), PIQA, {args.limit} stratified questions; "
             "load_task + evaluate_task, timed alternately, medians.", "",
             "| route | median s | runs (s) |", "|---|---|---|"]
    for k, v in times.items():
        lines.append(f"| {k} | {med[k]:.1f} | {', '.join(f'{x:.1f}' for x in v)} |")
    lines += ["", f"YAML / registered = **{ratio:.3f}** (target <= 1.05); lm-eval task build (TaskManager + "
              f"prompts for all 1,838 documents) median {statistics.median(lm_eval_build):.1f} s of it; "
              f"identical predictions and log-likelihoods: {same}.", ""]
    Path(args.out).write_text("\n".join(lines))
    print("\n".join(lines))


if __name__ == "__main__":
    main()
