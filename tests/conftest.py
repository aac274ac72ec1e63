"""Shared fixtures: a tokenizer built offline, tiny random models of every supported
architecture (built once per session, saved as HF folders), and the real SmolLM2."""

from __future__ import annotations

import os
import warnings
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")

import pytest
import torch

SHARED_DATA = Path(__file__).resolve().parents[1].parent / "shared" / "data"
if not SHARED_DATA.is_dir() and os.environ.get("LENS_HEADS_DATA"):  # a checkout elsewhere (a git worktree)
    SHARED_DATA = Path(os.environ["LENS_HEADS_DATA"])
if SHARED_DATA.is_dir():  # tests (and CI) point the library at the project's copy; it has no default
    os.environ.setdefault("LENS_HEADS_DATA", str(SHARED_DATA))

SAMPLE_TEXTS = [
    "The capital of France is Paris. The capital of Italy is Rome.",
    "Attention heads that do nothing are called dormant heads.",
    "Question: How do I boil an egg? Answer: put it in boiling water.",
    "A B C D Answer: the following are multiple choice questions",
]
_CORPUS = SAMPLE_TEXTS * 20


def build_tokenizer(folder: Path):
    """A small byte-level BPE tokenizer, trained offline, saved and re-loaded."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers
    from transformers import AutoTokenizer, PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE(unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=400, special_tokens=["<unk>", "<s>", "</s>", "<pad>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(_CORPUS, trainer)
    tok.post_processor = processors.ByteLevel(trim_offsets=False)
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<s>", eos_token="</s>",
                                   unk_token="<unk>", pad_token="<pad>")
    fast.save_pretrained(folder)
    return AutoTokenizer.from_pretrained(folder)


def tiny_config(arch: str, vocab: int):
    import transformers as T

    common = dict(vocab_size=vocab, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                  max_position_embeddings=256)
    if arch == "llama":
        return T.LlamaConfig(num_attention_heads=4, num_key_value_heads=2, **common)
    if arch == "qwen2":
        return T.Qwen2Config(num_attention_heads=4, num_key_value_heads=2, **common)
    if arch == "olmo2":
        return T.Olmo2Config(num_attention_heads=4, num_key_value_heads=2, **common)
    if arch == "gemma3":
        return T.Gemma3TextConfig(num_attention_heads=4, num_key_value_heads=1, head_dim=16,
                                  sliding_window=8, layer_types=["sliding_attention", "full_attention"],
                                  **common)
    if arch == "bloom":
        return T.BloomConfig(vocab_size=vocab, hidden_size=64, n_layer=2, n_head=4)
    if arch == "gpt2":
        return T.GPT2Config(vocab_size=vocab, n_embd=64, n_layer=2, n_head=4, n_positions=256)
    # not in lens_heads' architecture table: the bridge boots them, geometry comes from the config
    if arch == "qwen3":  # per-head q/k norms, GQA
        return T.Qwen3Config(num_attention_heads=4, num_key_value_heads=2, head_dim=16, **common)
    if arch == "phi3":  # fused qkv_proj [q | k | v], GQA
        return T.Phi3Config(num_attention_heads=4, num_key_value_heads=2, pad_token_id=0, **common)
    if arch == "gpt_neox":  # fused query_key_value per head, partial rotary
        return T.GPTNeoXConfig(vocab_size=vocab, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                               num_attention_heads=4, max_position_embeddings=256)
    # only for the packing test: one that packs (within its window), and three that must not
    if arch == "mistral":
        return T.MistralConfig(num_attention_heads=4, num_key_value_heads=2, sliding_window=64, **common)
    if arch == "opt":  # its attention adds the mask to the scores
        return T.OPTConfig(vocab_size=vocab, hidden_size=64, ffn_dim=128, num_hidden_layers=2, num_attention_heads=4,
                           max_position_embeddings=256, word_embed_proj_dim=64)
    if arch == "gpt_neo":  # the same, and a local-attention layer
        return T.GPTNeoConfig(vocab_size=vocab, hidden_size=64, num_layers=2, num_heads=4, max_position_embeddings=256,
                              attention_types=[[["local", "global"], 1]], window_size=8)
    if arch == "falcon":  # ALiBi positions from the padding mask
        return T.FalconConfig(vocab_size=vocab, hidden_size=64, num_hidden_layers=2, num_attention_heads=4, alibi=True,
                              new_decoder_architecture=False, multi_query=False, parallel_attn=False, bias=True)
    raise KeyError(arch)


TABLE_ARCHS = ["llama", "qwen2", "olmo2", "gemma3", "bloom", "gpt2"]  # in the ArchSpec table (surgery)
BRIDGE_ARCHS = ["qwen3", "phi3", "gpt_neox"]  # only the bridge and the config know them
TINY_ARCHS = TABLE_ARCHS + BRIDGE_ARCHS


@pytest.fixture(scope="session")
def tiny_tokenizer_dir(tmp_path_factory) -> Path:
    folder = tmp_path_factory.mktemp("tok")
    build_tokenizer(folder)
    return folder


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory, tiny_tokenizer_dir):
    """Factory: arch -> folder holding a tiny random HF model of that architecture."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    cache: dict[str, Path] = {}

    def make(arch: str) -> Path:
        if arch not in cache:
            tok = AutoTokenizer.from_pretrained(tiny_tokenizer_dir)
            torch.manual_seed(0)
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                model = AutoModelForCausalLM.from_config(tiny_config(arch, len(tok)),
                                                         attn_implementation="eager")
                _randomise(model)
            folder = tmp_path_factory.mktemp(f"tiny-{arch}")
            from transformers.utils import logging as hf_logging

            hf_logging.disable_progress_bar()  # built inside whichever test asks first: its stderr stays its own
            try:
                model.save_pretrained(folder)
            finally:
                hf_logging.enable_progress_bar()
            tok.save_pretrained(folder)
            cache[arch] = folder
        return cache[arch]

    return make


def _randomise(model) -> None:
    """Give biases and norm gains random values so no slice is trivially zero or one."""
    g = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("bias") or "norm" in name or "ln_" in name:
                p.add_(0.1 * torch.randn(p.shape, generator=g))


@pytest.fixture(scope="session")
def tiny_model(tiny_model_dir):
    """Factory: arch -> LoadedModel (fp32) of the tiny random model, cached per session."""
    from lens_heads import load_model

    cache = {}

    def make(arch: str):
        if arch not in cache:
            cache[arch] = load_model(str(tiny_model_dir(arch)))
        return cache[arch]

    return make


@pytest.fixture(scope="session")
def smollm2():
    """The real SmolLM2-135M-Instruct from the offline zoo (fp32)."""
    from lens_heads import load_model

    return load_model("smollm2-135m")


@pytest.fixture(scope="session")
def shared_data() -> Path:
    if not SHARED_DATA.is_dir():
        pytest.skip(f"shared evaluation data not found at {SHARED_DATA}")
    return SHARED_DATA


@pytest.fixture(scope="session")
def tiny_llama_2k(tiny_model_dir, tmp_path_factory) -> Path:
    """The tiny llama with a 2,048-token window (RoPE: the same weights), for long prompts
    (PIQA's longest solutions exceed 256 tokens in the tiny tokenizer)."""
    import json
    import shutil

    folder = tmp_path_factory.mktemp("tiny-llama-2k")
    shutil.copytree(tiny_model_dir("llama"), folder, dirs_exist_ok=True)
    config = json.loads((folder / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps({**config, "max_position_embeddings": 2048}))
    return folder


DRIFT_TARGET = (1, 2)  # the tiny llama's repair target in ``drift_run``: every head of layer 0 lies before it
DRIFT_PROBES = ["The capital of France is Paris, and the capital of Italy is Rome.",
                "Attention heads that do nothing are called dormant heads.",
                "Question: How do I boil an egg? Answer: put it in boiling water."]


@pytest.fixture(scope="session")
def drift_run(tiny_model, tmp_path_factory):
    """A finished repair of the tiny llama (target 1.2, 3 steps, every checkpoint kept) and its
    measured drift store: (model, run folder, store, probe set)."""
    from lens_heads.surgery import RepairConfig, TargetSelector, TrainConfig, repair
    from lens_heads.surgery.drift import ProbeSet, measure_run

    model = tiny_model("llama")
    run_dir = tmp_path_factory.mktemp("drift-run") / "run"
    config = RepairConfig(passes=1, chunk_len=16, eval_len=32,
                          train=TrainConfig(max_steps=3, grad_accum=1, lr=1e-2, checkpoint_every=1,
                                            keep_checkpoints=True))
    repair(model, TargetSelector(heads=(DRIFT_TARGET,)), SAMPLE_TEXTS * 8, SAMPLE_TEXTS[:2],
           model.to_tokens(SAMPLE_TEXTS), run_dir, config, progress=False, train_data="sample texts x 8")
    prompts = ("The capital of", "Heads that")
    probes = ProbeSet(tuple(t[:32] for t in model.to_tokens(DRIFT_PROBES)), prompts, tuple(model.to_tokens(list(prompts))),
                      4, "three probe texts", 32)
    store = measure_run(model, run_dir, probes, progress=False)
    return model, run_dir, store, probes


@pytest.fixture
def own_cache(tmp_path, monkeypatch):
    """A fresh ``LENS_HEADS_CACHE`` per test, so cached tables never leak between tests."""
    monkeypatch.setenv("LENS_HEADS_CACHE", str(tmp_path / "cache"))


def pytest_addoption(parser):
    parser.addoption("--device", default="cpu",
                     help="device for the tests marked gpu (cuda, cuda:1, ...); benchmarks/gpu_check.py passes cuda")


@pytest.fixture(scope="session")
def device(request) -> str:
    """The device the ``gpu`` tests run on; they skip where it is not a visible CUDA device."""
    dev = request.config.getoption("--device")
    if not dev.startswith("cuda") or not torch.cuda.is_available():
        pytest.skip(f"needs a CUDA device (--device cuda on a GPU machine; here: {dev}, "
                    f"CUDA {'available' if torch.cuda.is_available() else 'not available'})")
    return dev


@pytest.fixture(scope="module")
def one_torch_thread():
    """Tiny models: one torch thread is 7x faster than two on a busy 2-core machine (measured);
    a module takes it with ``pytestmark = pytest.mark.usefixtures("one_torch_thread")``."""
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)


@pytest.fixture
def counted(monkeypatch):
    """Every question the evaluation runs, by (ablation, doc_id)."""
    from lens_heads.evaluation import evaluate as evaluation

    seen: list[tuple[str, int]] = []
    real = evaluation.evaluate_task

    def wrapped(model, task, *a, doc_ids=None, ablation=None, **k):
        res = real(model, task, *a, doc_ids=doc_ids, ablation=ablation, **k)
        seen.extend((ablation.name if ablation is not None else "none", q.doc_id) for q in res.questions)
        return res

    monkeypatch.setattr(evaluation, "evaluate_task", wrapped)
    return seen
