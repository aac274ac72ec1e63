"""On a CUDA device (``pytest -m gpu --device cuda``; ``benchmarks/gpu_check.py`` runs them): the
same logits, scores, ablated evaluation and diagnosis as on the CPU, and a bf16 forward close to
fp32. They skip where no CUDA device is visible."""

from __future__ import annotations

import json

import pytest
import torch

pytestmark = pytest.mark.gpu

TEXTS = ["The capital of France is Paris. The capital of Italy is Rome.",
         "Attention heads that do nothing are called dormant heads.", "A B C D", "dormant"]


@pytest.fixture(scope="module")
def on_gpu(tiny_model_dir, request):
    from lens_heads import load_model

    dev = request.getfixturevalue("device")
    return load_model(str(tiny_model_dir("llama")), device=dev)


def test_logits_and_scores_equal_the_cpu(on_gpu, tiny_model):
    from lens_heads.models.hooks import run_with_hooks
    from lens_heads.scores import score_heads

    cpu = tiny_model("llama")
    ids = torch.tensor([cpu.tokenizer(TEXTS[0])["input_ids"]])
    a = run_with_hooks(cpu, ids, None, [])
    b = run_with_hooks(on_gpu, ids, None, []).cpu()
    assert (a - b).abs().max() < 1e-4
    sa, sb = score_heads(cpu, TEXTS, "all", progress=False), score_heads(on_gpu, TEXTS, "all", progress=False)
    for sid in sa.score_ids:
        torch.testing.assert_close(sb.mean[sid], sa.mean[sid], atol=1e-4, rtol=1e-4, equal_nan=True, msg=sid)


def test_ablated_evaluation_and_diagnosis_equal_the_cpu(on_gpu, tiny_model, tmp_path):
    from test_sweep import TASK_ROWS

    from lens_heads.interventions.ablation import parse_ablation
    from lens_heads.data import load_task
    from lens_heads.surgery.diagnose import diagnose
    from lens_heads.evaluation.evaluate import evaluate_task

    cpu = tiny_model("llama")
    rows = tmp_path / "mini.jsonl"
    rows.write_text("".join(json.dumps({"question": q, "choices": c, "answer": a}) + "\n" for q, c, a in TASK_ROWS))
    task = load_task(f"file:{rows}")
    for spec in ("none", "static:0.1,1.2", "score:ahon_ln@0.9", "random:0.5@0"):
        ra = evaluate_task(cpu, task, ablation=parse_ablation(spec, cpu.geometry), progress=False)
        rb = evaluate_task(on_gpu, task, ablation=parse_ablation(spec, on_gpu.geometry), batch_size="auto",
                           progress=False)
        assert [q.pred for q in ra.questions] == [q.pred for q in rb.questions], spec
    assert diagnose(cpu, cpu.to_tokens(TEXTS)).classes == diagnose(on_gpu, on_gpu.to_tokens(TEXTS)).classes


def test_packed_rows_equal_padded_rows_on_the_gpu(on_gpu, tiny_model, shared_data):
    """Packing (docs/methods.md §4) on the GPU: the same log-likelihoods as padded rows there and
    as packed rows on the CPU (the CUDA kernels take the boolean mask)."""
    from test_evaluate import _packing_requests

    from lens_heads.forward.engine import loglikelihoods_tokens

    encoded = _packing_requests(on_gpu.tokenizer, shared_data)
    packed = loglikelihoods_tokens(on_gpu, encoded, progress=False, batch_size=5)
    padded = loglikelihoods_tokens(on_gpu, encoded, progress=False, batch_size=5, pack=False)
    on_cpu = loglikelihoods_tokens(tiny_model("llama"), encoded, progress=False, batch_size=5)
    assert packed == pytest.approx(padded, abs=1e-4)
    assert packed == pytest.approx(on_cpu, abs=1e-4)


def test_bf16_forward_is_close_to_fp32(device):
    from lens_heads import load_model
    from lens_heads.models.hooks import run_with_hooks

    fp32, bf16 = load_model("smollm2-135m", device=device), load_model("smollm2-135m", "bfloat16", device=device)
    ids = torch.tensor([fp32.tokenizer(" ".join(TEXTS))["input_ids"]])
    a = run_with_hooks(fp32, ids, None, []).float().log_softmax(-1)
    b = run_with_hooks(bf16, ids, None, []).float().log_softmax(-1)
    agree = (a.argmax(-1) == b.argmax(-1)).float().mean().item()
    assert agree >= 0.9 and (a - b).abs().max().item() < 1.0


def test_fused_attention_equals_eager_on_the_gpu(on_gpu):
    """The fused path on CUDA (SDPA's kernels; row statistics in blocks): logits and the
    pattern-free scores against eager on the same device."""
    from lens_heads.models.hooks import run_with_hooks
    from lens_heads.scores import score_heads

    ids = torch.tensor([on_gpu.tokenizer(TEXTS[0])["input_ids"]])
    out = {}
    for backend in ("eager", "fused"):
        on_gpu.attention = backend
        out[backend] = (run_with_hooks(on_gpu, ids, None, []).cpu(),
                        score_heads(on_gpu, TEXTS, "all", progress=False))
    on_gpu.attention = "auto"
    assert (out["eager"][0] - out["fused"][0]).abs().max() < 1e-4
    for sid in out["eager"][1].score_ids:
        torch.testing.assert_close(out["fused"][1].mean[sid], out["eager"][1].mean[sid], atol=1e-5, rtol=1e-4,
                                   equal_nan=True, msg=sid)


@pytest.mark.parametrize("left", [False, True], ids=["right-padded", "left-padded"])
def test_fused_bloom_runs_a_memory_efficient_kernel_on_the_gpu(tiny_model_dir, device, left):
    """BLOOM's fused forward (ALiBi in an added head column, padded to a multiple of 8 on the
    GPU) runs under SDPA's fused kernels alone -- the math fallback, which builds [b, h, q, k],
    is switched off -- with or without a padding mask, and equals eager."""
    from torch.nn.attention import SDPBackend, sdpa_kernel

    from lens_heads import load_model
    from lens_heads.forward.engine import forward

    model = load_model(str(tiny_model_dir("bloom")), device=device)
    ids = torch.randint(3, 200, (3, 40), generator=torch.Generator().manual_seed(0))
    mask = torch.ones_like(ids)
    mask[1, :7] = 0 if left else 1
    mask[2, 30:] = 1 if left else 0
    out = {}
    model.attention = "eager"
    out["eager"] = forward(model, ids, mask, []).cpu()
    model.attention = "fused"
    with sdpa_kernel([SDPBackend.EFFICIENT_ATTENTION, SDPBackend.FLASH_ATTENTION, SDPBackend.CUDNN_ATTENTION]):
        out["fused"] = forward(model, ids, mask, []).cpu()
    real = mask.bool()
    assert (out["fused"] - out["eager"])[real].abs().max() < 1e-4
