"""lens_heads as an lm-evaluation-harness model: ``LensHeadsLM``, registered as ``lens_heads``.

Any lm-eval task (multiple choice, perplexity, generation) runs on the TransformerLens bridge
of a ``LoadedModel``, optionally with heads ablated::

    from lm_eval import simple_evaluate
    from lens_heads.evaluation.lm_eval_model import LensHeadsLM

    lm = LensHeadsLM(load_model("smollm2-135m"), ablation="static:3.1,4.2")
    out = simple_evaluate(model=lm, tasks=["arc_easy"])

    # or by name (importing this module registers it), as lm-eval's --model route does:
    simple_evaluate(model="lens_heads", model_args="pretrained=smollm2-135m,ablation=static:3.1,4.2,dtype=float32")

In a ``model_args`` string a piece without ``=`` continues the previous value, so the commas
of ``static:3.1,4.2`` need no quoting (``create_from_arg_string``).

Scoring is lens_heads' engine (``lens_heads.evaluation.evaluate``), which reproduces lm-eval's HF backend
(HFLM) tokenisation, truncation and log-softmax; with no ablation the numbers are HFLM's.

Row keys (what a ``random:`` ablation's draw depends on, docs of ``lens_heads.interventions.ablation``): one
stable integer per lm-eval request, ``doc_id * 1000 + idx`` (``Instance.doc_id`` is the
document's index in the task's evaluation split, ``Instance.idx`` the request's index within
its document: the choice of a multiple-choice question). These are the keys
``evaluate_task`` uses (``doc_id * 1000 + choice``), so a random ablation zeroes the same heads
for an item here as in ``lens-heads evaluate``, whatever ``--limit``, batching or order. When
some request has no ``doc_id`` (hand-made requests) or an ``idx`` outside [0, 1000), every
request of that call is keyed by its position in the list instead. Every forward that serves
one request (all windows of a rolling log-likelihood, every step of a generation) uses that
request's key, so a random ablation zeroes the same heads throughout a request.
"""

from __future__ import annotations

import contextlib
import math
import os
from typing import Any, Sequence

import torch
from lm_eval.api.model import LM
from lm_eval.api.registry import register_model
from torch import Tensor

from lens_heads.forward.engine import Observer, RowKey, encode_pair, forward, loglikelihoods_tokens, max_length, \
    prefix_token_id, tok_encode
from lens_heads.errors import LensHeadsError
from lens_heads.interventions.ablation import Ablation, NoAblation, RandomAblation, parse_ablation
from lens_heads.progress import progress_bar
from lens_heads.files.provenance import lens_heads_version
from lens_heads import models

DEFAULT_MAX_GEN_TOKS = 256  # lm-eval HFLM's default
_RAW_ARGS = ("pretrained", "ablation")  # model_args kept as the strings given


def request_keys(requests: Sequence[Any]) -> list[int]:
    """One stable row key per request: ``RowKey(doc_id, idx)``, or the position in the list when
    some request lacks a usable ``doc_id`` / ``idx`` (module docstring)."""
    keys = []
    for req in requests:
        doc, idx = getattr(req, "doc_id", None), getattr(req, "idx", 0)
        if not RowKey.fits(doc, idx):
            return list(range(len(requests)))
        keys.append(int(RowKey(doc, idx)))
    return keys


def greedy_observer(flags: list[bool | None]) -> Observer:
    """An engine observer filling ``flags[request]`` with lm-eval's ``is_greedy``: each
    continuation token is the argmax of the float32 log-softmax at the position that predicts
    it, from the very log-probabilities the engine sums."""
    def observe(request: int, logprobs: Tensor, continuation: list[int]) -> None:
        top = logprobs.argmax(dim=-1).cpu()  # [len(continuation)]
        flags[request] = bool(torch.equal(top, torch.tensor(continuation, dtype=top.dtype)))
    return observe


def _parse_model_args(arg_string: str) -> dict[str, Any]:
    """lm-eval's ``key=value,key=value`` with two changes: a piece without ``=`` continues the
    previous value (``ablation=static:3.1,4.2``), and ``pretrained`` / ``ablation`` stay strings
    (lm-eval's typing would make ``ablation=none`` None, which means the same here)."""
    from lm_eval.utils import handle_arg_string

    pairs: list[list[str]] = []
    for piece in (arg_string or "").split(","):
        if "=" in piece:
            key, _, value = piece.partition("=")
            pairs.append([key.strip(), value])
        elif pairs:
            pairs[-1][1] += "," + piece
        elif piece.strip():
            raise LensHeadsError(f"bad model_args {arg_string!r}: {piece.strip()!r} has no key (write key=value)")
    return {k: (v.strip() if k in _RAW_ARGS else handle_arg_string(v)) for k, v in pairs}


def _batch_size(value) -> int:
    if value is None:
        return 16
    if isinstance(value, str):
        if value.strip().startswith("auto"):
            return 16  # no automatic batch-size search; the engine's default
        try:
            value = int(value)
        except ValueError:
            raise LensHeadsError(f"batch_size must be a positive integer, got {value!r}") from None
    if not isinstance(value, int) or value < 1:
        raise LensHeadsError(f"batch_size must be a positive integer, got {value!r}")
    return value


NEEDS_TASK = ("a question-level score is computed per question from its gold answer, which lm-eval's "
              "requests do not carry; use 'lens-heads evaluate' or a sweep, or a static set of heads here")


@register_model("lens_heads")
class LensHeadsLM(LM):
    """An lm-eval ``LM`` on a lens_heads ``LoadedModel``, with an optional head ablation.

    ``pretrained``: a ``LoadedModel`` or a model spec for ``load_model`` (zoo name, .gguf,
    HF folder, hub id; then ``dtype`` and ``device`` apply). ``ablation``: a spec string
    (``none``, ``static:L.H,...``, ``score:ID@TAU[:strict]``, ``random:P@SEED``; parsed with
    ``parse_ablation(spec, model.geometry)``), an ``Ablation``, or None. ``add_bos_token`` is
    lm-eval's (None: the tokenizer's default). ``batch_size`` is the engine's ("auto" means its
    default, 16; ``max_batch_size`` is accepted and ignored); generation runs one request at a
    time. ``max_gen_toks``: the generation default when a request sets none (lm-eval's 256).
    ``kv_cache``: let generation reuse keys/values when the zeroed heads cannot change within a
    request (``generate_until``).

    After the calls, ``zeroed_fraction`` is the realised fraction of (forward row, layer, head)
    zeroed over all of them (0.0 with no ablation); ``get_model_info`` reports it with the spec.
    """

    def __init__(self, pretrained, ablation=None, dtype: str = "float32", device: str | None = None,
                 batch_size: int | str | None = 16, add_bos_token: bool | None = None,
                 max_gen_toks: int = DEFAULT_MAX_GEN_TOKS, progress: bool = True, kv_cache: bool = True,
                 max_batch_size: int | None = None):
        super().__init__()

        probe = parse_ablation(ablation, None) if isinstance(ablation, str) else ablation
        if getattr(getattr(probe, "spec", None), "needs_calibration", False):
            raise LensHeadsError(f"ablation {probe.name}: a percentage needs a threshold calibrated on the "
                                 f"questions; give score:ID@THRESHOLD (evaluate_task with this ablation, or "
                                 f"'lens-heads evaluate --ablate {probe.name}', sets and prints it)")
        if getattr(probe, "needs_task", False):
            raise LensHeadsError(f"ablation {probe.name}: {NEEDS_TASK}")
        if isinstance(pretrained, (str, os.PathLike)):
            pretrained = models.load_model(pretrained, dtype=dtype or "float32", device=device or "cpu")
        elif not hasattr(pretrained, "bridge") or not hasattr(pretrained, "geometry"):
            raise LensHeadsError(f"pretrained must be a LoadedModel or a model spec, got {type(pretrained).__name__}")
        self.model = pretrained
        self.tokenizer = pretrained.tokenizer
        self._device = pretrained.device
        if ablation is None or isinstance(ablation, NoAblation):
            self.ablation = None
        elif isinstance(ablation, Ablation):
            self.ablation = ablation
        elif isinstance(ablation, str):
            bound = parse_ablation(ablation, pretrained.geometry)
            self.ablation = None if isinstance(bound, NoAblation) else bound
        else:
            raise LensHeadsError(f"ablation must be a spec string or an Ablation, got {type(ablation).__name__}")
        self.batch_size_per_gpu = _batch_size(batch_size)
        if add_bos_token is not None and not isinstance(add_bos_token, bool):
            raise LensHeadsError(f"add_bos_token must be true, false or None, got {add_bos_token!r}")
        self.add_bos_token = add_bos_token
        if not isinstance(max_gen_toks, int) or max_gen_toks < 1:
            raise LensHeadsError(f"max_gen_toks must be a positive integer, got {max_gen_toks!r}")
        self._max_gen_toks = max_gen_toks
        self.progress = bool(progress)
        self.kv_cache = bool(kv_cache)
        self._zeroed, self._units = 0, 0

    # -- lm-eval's model properties ----------------------------------------------------------

    @classmethod
    def create_from_arg_string(cls, arg_string: str, additional_config: dict | None = None) -> "LensHeadsLM":
        """``pretrained=SPEC,ablation=SPEC,dtype=...`` (module docstring: commas inside a value)."""
        args = _parse_model_args(arg_string)
        extra = {k: v for k, v in (additional_config or {}).items() if v is not None}
        return cls._checked({**extra, **args})

    @classmethod
    def create_from_arg_obj(cls, arg_dict: dict, additional_config: dict | None = None) -> "LensHeadsLM":
        extra = {k: v for k, v in (additional_config or {}).items() if v is not None}
        return cls._checked({**extra, **arg_dict})

    @classmethod
    def _checked(cls, kwargs: dict) -> "LensHeadsLM":
        import inspect

        known = set(inspect.signature(cls.__init__).parameters) - {"self"}
        unknown = sorted(set(kwargs) - known)
        if unknown:
            raise LensHeadsError(f"LensHeadsLM has no argument {unknown[0]!r}; model_args take: {', '.join(sorted(known))}")
        if "pretrained" not in kwargs:
            raise LensHeadsError("model_args need pretrained=MODEL (zoo name, .gguf, HF folder or hub id)")
        return cls(**kwargs)

    @property
    def eot_token_id(self) -> int:
        return self.tokenizer.eos_token_id

    @property
    def prefix_token_id(self) -> int:
        return prefix_token_id(self.tokenizer)

    @property
    def max_length(self) -> int:
        return max_length(self.model)

    @property
    def max_gen_toks(self) -> int:
        return self._max_gen_toks

    @property
    def batch_size(self) -> int:
        return self.batch_size_per_gpu

    @property
    def tokenizer_name(self) -> str:
        return self.tokenizer.name_or_path.replace("/", "__")

    @property
    def ablation_spec(self) -> str:
        return "none" if self.ablation is None else self.ablation.name

    @property
    def zeroed_fraction(self) -> float:
        if self.ablation is None:
            return 0.0
        return self._zeroed / self._units if self._units else math.nan

    def apply_chat_template(self, chat_history: list[dict[str, str]], add_generation_prompt: bool = True) -> str:
        return self.tokenizer.apply_chat_template(chat_history, tokenize=False,
                                                  add_generation_prompt=add_generation_prompt,
                                                  continue_final_message=not add_generation_prompt)

    def get_model_info(self) -> dict:

        return {"model_name": self.model.name, "model_dtype": str(self.model.dtype).replace("torch.", ""),
                "model_num_parameters": self.model.parameter_count(),  # offloaded too, unread
                "lens_heads_version": lens_heads_version(), "ablation": self.ablation_spec,
                "zeroed_fraction": self.zeroed_fraction}

    @contextlib.contextmanager
    def _counting(self):
        if self.ablation is None:
            yield
            return
        with self.ablation.counting() as counts:
            try:
                yield
            finally:
                totals = counts.totals()
                if totals is not None:
                    self._zeroed += totals[0]
                    self._units += totals[1]

    # -- loglikelihood -----------------------------------------------------------------------

    def loglikelihood(self, requests, disable_tqdm: bool = False) -> list[tuple[float, bool]]:
        """``(sum log p(continuation | context), is_greedy)`` per request, as lm-eval's HFLM.

        Tokenisation is ``engine.encode_pair`` (HFLM's ``loglikelihood`` + ``_encode_pair``,
        empty context -> the prefix token); the sums come from lens_heads' engine
        (``engine.loglikelihoods_tokens``: left truncation to ``max_length``, float32
        log-softmax, shared-input dedup and prefix K/V reuse where the ablation allows it), with
        the ablation's hooks on every forward and ``request_keys`` as row keys.

        ``is_greedy``: taken inside the engine's own scoring step by an observer
        (``greedy_observer``): from the same logits, at the same positions, each continuation token must equal the argmax of the
        float32 log-softmax -- lm-eval's ``greedy_tokens == cont_toks`` on its log-softmax (ties:
        the first index, as ``argmax``). No second forward, so the flag and the sum can never
        come from different logits.
        """
        if not requests:
            return []
        memo: dict[str, list[int]] = {}
        encoded = [encode_pair(self.tokenizer, *req.args, memo=memo, add_bos=self.add_bos_token)
                   for req in requests]
        flags: list[bool | None] = [None] * len(requests)
        with self._counting():
            lls = loglikelihoods_tokens(self.model, encoded, self.ablation, self.batch_size,
                                        self.progress and not disable_tqdm, keys=request_keys(requests),
                                        observer=greedy_observer(flags))
        if any(f is None for f in flags):  # every scored request is observed
            raise LensHeadsError("internal: the engine scored a request without observing it")
        out = [(float(ll), bool(g)) for ll, g in zip(lls, flags)]
        for req, answer in zip(requests, out):
            self.cache_hook.add_partial("loglikelihood", req.args, answer)
        return out

    def loglikelihood_rolling(self, requests, disable_tqdm: bool = False) -> list[float]:
        """Full log-likelihood of each string, as lm-eval's HFLM computes it.

        The string is encoded as HFLM's ``tok_encode`` (``add_bos_token``; a string starting
        with the BOS text gets no special tokens), cut into lm-eval's rolling windows
        (``utils.get_rolling_token_windows(tokens, prefix_token_id, max_length, context_len=1)``
        then ``make_disjoint_window``): the first window reads the prefix token (BOS, else EOS)
        and the first ``max_length - 1`` tokens and scores the first ``max_length``; each later
        window scores the next ``max_length`` tokens (the last one fewer) with as much preceding
        text as fits. Each window is a (context, continuation) request of the engine; the result
        is the sum over windows (summed in window order, as HFLM). Every token is scored once;
        an empty string gives 0.0.

        Against ``evaluate.perplexity``: for a string that fits one window (``len(tokens) <=
        max_length``) this is exactly its per-token log-likelihood on the input ``[prefix] +
        tokens`` (every position t >= 1 scored, ``-token_nll``). They part only where the
        definitions do: perplexity's inputs are independent windows whose first token is never
        scored, while here later windows carry context over and the first token is scored after
        the prefix token.

        Ablation: all windows of a string use the string's row key; a ``score:`` ablation
        decides per window forward.
        """
        from lm_eval.utils import get_rolling_token_windows, make_disjoint_window

        if not requests:
            return []
        keys = request_keys(requests)
        encoded, owner = [], []
        for i, req in enumerate(requests):
            (string,) = req.args
            tokens = tok_encode(self.tokenizer, string, add_bos=self.add_bos_token)
            for window in get_rolling_token_windows(token_list=tokens, prefix_token=self.prefix_token_id,
                                                    max_seq_len=self.max_length, context_len=1):
                encoded.append(make_disjoint_window(window))
                owner.append(i)
        lls: list[float] = []
        if encoded:
            with self._counting():
                lls = loglikelihoods_tokens(self.model, encoded, self.ablation, self.batch_size,
                                            self.progress and not disable_tqdm, keys=[keys[i] for i in owner])
        per_window: list[list[float]] = [[] for _ in requests]
        for i, ll in zip(owner, lls):
            per_window[i].append(float(ll))
        out = [sum(v) for v in per_window]
        for req, total in zip(requests, out):
            self.cache_hook.add_partial("loglikelihood_rolling", req.args, total)
        return out

    # -- generation --------------------------------------------------------------------------

    def _input_dependent(self) -> bool:
        """Whether the zeroed heads can change between forwards of one request (score ablations:
        decided from each forward's own scores). None / static / random (one row key per
        request) zero the same heads at every step, so keys/values can be reused."""

        a = self.ablation
        return not (a is None or a.reuses_prefix or isinstance(a, RandomAblation))

    def _encode_prompt(self, context: str, max_ctx_len: int) -> list[int]:
        """HFLM ``tok_batch_encode`` for one string: no special tokens when it starts with the BOS
        text, else ``add_bos_token`` (None: the tokenizer's default); left-truncated."""
        bos = getattr(self.tokenizer, "bos_token", None)
        if bos is not None and context.startswith(bos):
            kwargs = {"add_special_tokens": False}
        elif self.add_bos_token is not None:
            kwargs = {"add_special_tokens": self.add_bos_token}
        else:
            kwargs = {}
        ids = self.tokenizer(context, **kwargs)["input_ids"]
        ids = ids[-max_ctx_len:]
        return ids if ids else [self.prefix_token_id]

    def _logits(self, ids: list[int], key: int, cache=None, n_new: int | None = None):
        """Next-token logits (float, [vocab]) after ``ids`` under the ablation, one row with key
        ``key``; with ``cache`` only the last ``n_new`` tokens are fed. Returns (logits, cache)."""
        full = torch.ones(1, len(ids), dtype=torch.long)
        if cache is None:
            inp, hook_mask = torch.tensor([ids]), full
        else:
            inp, hook_mask = torch.tensor([ids[-n_new:]]), torch.ones(1, n_new, dtype=torch.long)
        hooks = self.ablation.hooks(self.model, hook_mask, [key]) if self.ablation is not None else []
        want = self.kv_cache and not self._input_dependent()
        out = forward(self.model, inp, full, hooks, keep=torch.tensor([inp.shape[1] - 1]), cache=cache,
                      want_cache=want)
        logits, cache = (out[0], out[1]) if want else (out, None)
        return logits[0, -1].float(), cache

    def _eos_ids(self) -> set[int]:
        """What HF ``generate`` stops on: the generation config's EOS id(s)."""
        cfg = getattr(self.model.hf_model, "generation_config", None)
        eos = getattr(cfg, "eos_token_id", None)
        if eos is None:
            eos = getattr(self.model.hf_model.config, "eos_token_id", None)
        if eos is None:
            return set()
        return {int(e) for e in (eos if isinstance(eos, (list, tuple)) else [eos])}

    def generate_until(self, requests, disable_tqdm: bool = False) -> list[str]:
        """Greedy continuation of each context under the ablation, as lm-eval's HFLM with
        ``do_sample=False`` (``generate``), one request at a time.

        Per request: ``gen_kwargs`` are normalised by lm-eval (``normalize_gen_kwargs``:
        ``until``, ``max_gen_toks`` and its aliases, default ``max_gen_toks`` = 256); the EOS text
        joins the stop strings; the prompt is encoded as HFLM's ``tok_batch_encode`` (for this
        one string: HFLM looks at the first string of a batch for a leading BOS text) and
        left-truncated to ``max_length - max_gen_toks`` tokens (``max_length`` in gen_kwargs
        overrides the total length, as HFLM; a prompt that encodes to nothing reads the prefix
        token). Each step appends ``argmax`` of the next-token
        logits (plain argmax: the model's generation-config logits processors, e.g. a repetition
        penalty, are not applied -- none are for lm-eval's greedy defaults on the models here).
        It stops after a generated token that is an EOS id of the model's generation config,
        when a stop string appears in the decoded last ``len(tokens(stop)) + 2`` generated
        tokens (lm-eval's ``MultiTokenEOSCriteria``), or at the total length. The text is the
        generated tokens decoded without special tokens, cut at the first occurrence of each
        stop string (``postprocess_generated_text``). Sampling (``do_sample=True``) is refused.

        Ablation during generation (the row key of the request at every step):

        * none / ``static:`` / ``random:``: the same heads are zeroed at every step (random: drawn
          once from the request's row key); the prompt is run once and its keys/values, computed
          under the ablation, are reused for each new token (``kv_cache=True``; False reruns the
          whole sequence each step, with the same result up to float rounding).
        * ``score:ID@TAU``: per input, where the input of step t is the whole sequence read at
          that step -- the prompt plus the t tokens generated so far. Each step is one full
          forward of that sequence without a K/V cache; at layer L a head is zeroed when its
          score on that sequence (all its positions, after the ablations of layers < L in the
          same forward) crosses TAU, exactly as for a log-likelihood input. The zeroed set may
          therefore change from one step to the next, and token t+1 is exactly the greedy token
          that ``loglikelihood`` reads for the request (prompt + generated[:t], next token).
        """
        from lm_eval.models.utils import handle_stop_sequences, normalize_gen_kwargs, postprocess_generated_text

        if not requests:
            return []

        keys = request_keys(requests)
        eos_text = self.tokenizer.decode([self.eot_token_id], skip_special_tokens=False) \
            if self.eot_token_id is not None else None
        eos_ids = self._eos_ids()
        out: list[str] = []
        with self._counting(), progress_bar(len(requests), "generate_until",
                                            enabled=self.progress and not disable_tqdm) as pbar:
            for req, key in zip(requests, keys):
                context, gen_kwargs = req.args
                kwargs = normalize_gen_kwargs(dict(gen_kwargs or {}), self.max_gen_toks)
                if kwargs.get("do_sample"):
                    raise LensHeadsError("LensHeadsLM decodes greedily only; this request asks for sampling "
                                         f"(gen_kwargs {dict(gen_kwargs)})")
                until = handle_stop_sequences(kwargs.pop("until", None), eos=eos_text)
                max_gen = int(kwargs.pop("max_gen_toks"))
                max_ctx_len = self.max_length - max_gen
                if max_ctx_len <= 0:
                    raise LensHeadsError(f"max_gen_toks {max_gen} leaves no room for the prompt in the "
                                         f"model's maximum length {self.max_length}")
                ids = self._encode_prompt(context, max_ctx_len)
                total = int(kwargs.pop("max_length", len(ids) + max_gen))
                text = self._generate_one(ids, key, total, until, eos_ids)
                text = postprocess_generated_text(generation=text, stop=until, think_end_token=None)
                out.append(text)
                self.cache_hook.add_partial("generate_until", (context, gen_kwargs), text)
                pbar.update(1)
        return out

    def _generate_one(self, ids: list[int], key: int, total: int, until: list[str], eos_ids: set[int]) -> str:
        start = len(ids)
        seq = list(ids)
        stops = [(s, len(self.tokenizer.encode(s, add_special_tokens=False)) + 2) for s in until]
        cache, n_new = None, None
        while len(seq) < total:
            logits, cache = self._logits(seq, key, cache, n_new)
            seq.append(int(logits.argmax()))
            n_new = 1
            new = seq[start:]
            if new[-1] in eos_ids:
                break
            if any(s in self.tokenizer.decode(new[-n:]) for s, n in stops):
                break
        return self.tokenizer.decode(seq[start:], skip_special_tokens=True)
