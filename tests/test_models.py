"""Foundation: loading, bridge parity with HF eager, hook shapes, and the geometry map."""

from __future__ import annotations


import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from lens_heads import LensHeadsError, load_model
from lens_heads.models.hooks import hook_name, run_with_hooks
from lens_heads.models import zoo
from conftest import TABLE_ARCHS, TINY_ARCHS

TEXT = "The capital of France is Paris. Attention heads that do nothing are dormant."


def _ids(model, text=TEXT):
    return torch.tensor([model.tokenizer(text)["input_ids"]])


@pytest.mark.parametrize("arch", TINY_ARCHS)
def test_bridge_matches_hf_eager(arch, tiny_model, tiny_model_dir):
    model = tiny_model(arch)
    assert model.geometry.arch.name == arch
    ids = _ids(model)
    hf = AutoModelForCausalLM.from_pretrained(tiny_model_dir(arch), attn_implementation="eager").eval()
    with torch.no_grad():
        expected = hf(ids).logits
    got = run_with_hooks(model, ids, None, [])
    diff = (got - expected).abs().max().item()
    print(f"{arch}: max |bridge - HF eager| = {diff:.3g}")
    assert diff <= 1e-5


@pytest.mark.parametrize("arch", TINY_ARCHS)
def test_hook_shapes(arch, tiny_model):
    model = tiny_model(arch)
    g = model.geometry
    ids = _ids(model)
    T = ids.shape[1]
    shapes = {}

    def grab(name):
        def fn(x, hook):
            shapes[name] = tuple(x.shape)
        return fn

    names = [hook_name(k, L) for L in range(g.n_layers) for k in ("pattern", "v", "z")]
    hooks = [(n, grab(n)) for n in names]
    run_with_hooks(model, ids, None, hooks)
    for L in range(g.n_layers):
        assert shapes[hook_name("pattern", L)] == (1, g.n_heads, T, T)
        assert shapes[hook_name("v", L)] == (1, T, g.n_kv_heads, g.d_head)
        assert shapes[hook_name("z", L)] == (1, T, g.n_heads, g.d_head)


@pytest.mark.parametrize("arch", TABLE_ARCHS)
def test_out_slice_zeroing_equals_hook_z_zeroing(arch, tiny_model, tiny_model_dir):
    """Proves the geometry map: zeroing W_O^h in the HF weights == zeroing head h in hook_z."""
    model = tiny_model(arch)
    g = model.geometry
    ids = _ids(model)
    hf = AutoModelForCausalLM.from_pretrained(tiny_model_dir(arch), attn_implementation="eager").eval()
    hf_params = dict(hf.named_parameters())
    base = run_with_hooks(model, ids, None, [])
    for layer in range(g.n_layers):
        for head in range(g.n_heads):
            def zero(z, hook, head=head):
                z = z.clone()
                z[:, :, head] = 0
                return z

            via_hook = run_with_hooks(model, ids, None, [(hook_name("z", layer), zero)])
            sl = g.out_slice(layer, head)
            w = hf_params[sl.name]
            saved = w.detach().clone()
            with torch.no_grad():
                w.index_fill_(sl.dim, sl.index, 0.0)
                via_weights = hf(ids).logits
                w.copy_(saved)
            assert (via_hook - base).abs().max() > 1e-6, "ablation had no effect"
            assert (via_hook - via_weights).abs().max().item() <= 1e-5, (layer, head)


@pytest.mark.parametrize("arch", TABLE_ARCHS)
def test_qkv_slices_address_the_heads_projection(arch, tiny_model, tiny_model_dir):
    """Q/K/V slices: perturbing head h's V slice changes only hook_z of heads reading that KV head."""
    model = tiny_model(arch)
    g = model.geometry
    ids = _ids(model)
    hf = AutoModelForCausalLM.from_pretrained(tiny_model_dir(arch), attn_implementation="eager").eval()
    params = dict(hf.named_parameters())
    z_out = {}

    def capture(module, args, kwargs, output):
        z_out["z"] = (args[0] if args else kwargs["hidden_states"]).detach().clone()

    attn = hf.get_submodule(f"{g.arch.layers}.0.{g.arch.attn}")
    handle = getattr(attn, g.arch.out).register_forward_hook(capture, with_kwargs=True)
    with torch.no_grad():
        hf(ids)
        before = z_out["z"].reshape(1, ids.shape[1], g.n_heads, g.d_head)
        head = g.n_heads - 1
        sl = g.qkv_slices(0, head, "v")
        w = params[sl.name]
        w.index_add_(sl.dim, sl.index, torch.ones_like(w.index_select(sl.dim, sl.index)))
        hf(ids)
        after = z_out["z"].reshape(1, ids.shape[1], g.n_heads, g.d_head)
    handle.remove()
    changed = {h for h in range(g.n_heads) if (after[..., h, :] - before[..., h, :]).abs().max() > 1e-6}
    assert changed == {h for h in range(g.n_heads) if g.kv_head(h) == g.kv_head(head)}


def test_bloom_alibi_slopes(tiny_model):
    g = tiny_model("bloom").geometry
    slopes = g.alibi_slopes()
    assert torch.allclose(slopes, torch.tensor([2 ** (-8 * (h + 1) / 4) for h in range(4)], dtype=torch.float64))
    assert tiny_model("llama").geometry.alibi_slopes() is None


def test_bloom_16_head_slopes_match_paper():
    from lens_heads.models.geometry import alibi_slopes

    s = alibi_slopes(16)
    assert abs(s[0].item() - 0.7071) < 1e-4 and abs(s[15].item() - 0.0039) < 1e-4


# --- the real model ---------------------------------------------------------------------

def test_smollm2_real_model(smollm2):
    model = smollm2
    g = model.geometry
    assert (g.arch.name, g.n_layers, g.n_heads, g.n_kv_heads, g.d_head) == ("llama", 30, 9, 3, 64)
    assert model.prepends_bos is False
    ids = _ids(model, "The capital of France is")
    logits = run_with_hooks(model, ids, None, [])  # fused attention (the default, auto)
    model.attention = "eager"
    try:
        eager_logits = run_with_hooks(model, ids, None, [])
    finally:
        model.attention = "auto"
    with torch.no_grad():
        hf_logits = model.hf_model(ids).logits  # the bridged model called as HF: TransformerLens' attention
    assert (eager_logits - hf_logits).abs().max().item() == 0.0
    assert (logits - hf_logits).abs().max().item() <= 1e-4  # a fused kernel: float rounding only
    out = ids
    for _ in range(6):
        nxt = run_with_hooks(model, out, None, [])[0, -1].argmax()
        out = torch.cat([out, nxt.view(1, 1)], dim=1)
    text = model.tokenizer.decode(out[0, ids.shape[1]:])
    assert "Paris" in text, text


def test_zoo_cache_is_reused(smollm2):
    path = zoo.fetch("smollm2-135m")
    assert path.stat().st_size == zoo.ZOO["smollm2-135m"].size


# --- bad input --------------------------------------------------------------------------

def test_unknown_spec():
    with pytest.raises(LensHeadsError, match="unknown model spec"):
        load_model("definitely not a model")


def test_unknown_dtype(tiny_model_dir):
    with pytest.raises(LensHeadsError, match="unknown dtype"):
        load_model(str(tiny_model_dir("llama")), dtype="float8")


def test_device_is_checked_before_anything_loads(tiny_model_dir, capsys):
    from lens_heads.cli import main
    from lens_heads.models import check_device

    assert check_device("cpu") == "cpu"
    with pytest.raises(LensHeadsError, match="unknown device 'gpu'"):
        check_device("gpu")
    if not torch.cuda.is_available():
        with pytest.raises(LensHeadsError, match="requested but"):
            load_model(str(tiny_model_dir("llama")), device="cuda")
        assert main(["info", str(tiny_model_dir("llama")), "--device", "cuda:0"]) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and "use --device cpu" in err[0], err


def test_directory_without_config(tmp_path):
    with pytest.raises(LensHeadsError, match="without config.json"):
        load_model(str(tmp_path))


def test_an_architecture_the_bridge_cannot_boot(tmp_path, tiny_tokenizer_dir):
    import transformers as T

    cfg = T.BioGptConfig(vocab_size=400, hidden_size=32, num_hidden_layers=1, num_attention_heads=2,
                         intermediate_size=64)
    AutoModelForCausalLM.from_config(cfg).save_pretrained(tmp_path)
    AutoTokenizer.from_pretrained(tiny_tokenizer_dir).save_pretrained(tmp_path)
    with pytest.raises(LensHeadsError, match="bridge cannot boot .*'biogpt'"):
        load_model(str(tmp_path))


def test_an_architecture_without_attention_heads(tmp_path, tiny_tokenizer_dir):
    """Mamba boots on the bridge but has no attention hooks: refused at load, before any scoring."""
    import transformers as T

    AutoModelForCausalLM.from_config(T.MambaConfig(vocab_size=400, hidden_size=32,
                                                   num_hidden_layers=1)).save_pretrained(tmp_path)
    AutoTokenizer.from_pretrained(tiny_tokenizer_dir).save_pretrained(tmp_path)
    with pytest.raises(LensHeadsError, match="head geometry|hook_pattern has shape"):
        load_model(str(tmp_path))


def test_truncated_and_wrong_digest_gguf(tmp_path, smollm2):
    src = zoo.fetch("smollm2-135m")
    truncated = tmp_path / "smollm2-135m.gguf"
    with open(src, "rb") as f, open(truncated, "wb") as g:
        g.write(f.read(1 << 20))
    with pytest.raises(LensHeadsError, match=r"truncated or corrupt: the header is cut off at byte 1048576.*sha256 .* does not match"):
        load_model(str(truncated))  # a zoo file: what is wrong with it, and its digest
    garbage = tmp_path / "other.gguf"
    garbage.write_bytes(b"not a gguf at all")
    with pytest.raises(LensHeadsError, match="not a GGUF"):
        load_model(str(garbage))
    unknown = tmp_path / "unknown.gguf"
    with open(src, "rb") as f, open(unknown, "wb") as g:
        g.write(f.read(1 << 16))
    with pytest.raises(LensHeadsError, match="truncated or corrupt: the header is cut off") as err:
        load_model(str(unknown))  # 64 kB: the header's own records end beyond the file
    assert "HF_HUB_OFFLINE" not in str(err.value)  # a local file: no word about hub ids
    cut = tmp_path / "cut.gguf"
    with open(src, "rb") as f, open(cut, "wb") as g:
        g.write(f.read(20_000_000))
    with pytest.raises(LensHeadsError, match="cut.gguf is truncated: 20,000,000 bytes, but its header declares 98,362,432"):
        load_model(str(cut))


def test_corrupted_cache_is_detected(tmp_path, monkeypatch):
    monkeypatch.setenv("LENS_HEADS_CACHE", str(tmp_path))
    entry = zoo.ZOO["smollm2-135m"]
    (tmp_path / entry.filename).write_bytes(b"GGUF" + b"\0" * 100)
    with pytest.raises(LensHeadsError, match="does not match"):
        zoo.fetch("smollm2-135m")


@pytest.mark.slow
def test_converted_cache_equals_direct_gguf_load(smollm2):
    """The float32 HF conversion kept in the cache gives the same logits as parsing the GGUF."""
    from transformers import AutoModelForCausalLM

    path = zoo.fetch("smollm2-135m")
    direct = AutoModelForCausalLM.from_pretrained(path.parent, gguf_file=path.name, dtype=torch.float32,
                                                  attn_implementation="eager").eval()
    ids = _ids(smollm2)
    with torch.no_grad():
        assert torch.equal(direct(ids).logits, run_with_hooks(smollm2, ids, None, []))


@pytest.mark.slow
def test_gguf_conversion_is_announced_once(smollm2, tmp_path, monkeypatch, capfd):
    """A GGUF is parsed (transformers' de-quantisation bar) only when its conversion is not
    cached yet; a later load reads the cached float32 folder and prints nothing."""
    cache = tmp_path / "cache"
    monkeypatch.setenv("LENS_HEADS_CACHE", str(cache))
    gguf = tmp_path / "copy.gguf"
    gguf.symlink_to(zoo.fetch("smollm2-135m", progress=False))  # zoo.fetch before the cache moves
    capfd.readouterr()
    first = load_model(str(gguf))
    err = capfd.readouterr().err
    assert err.count("lens_heads: converting copy.gguf to float32 once") == 1 and "de-quantizing" in err
    assert (cache / f"hf-{zoo.ZOO['smollm2-135m'].sha256[:16]}" / "CONVERTED_FROM").is_file()
    again = load_model(str(gguf))
    err = capfd.readouterr().err
    assert "converting" not in err and "de-quantizing" not in err, err
    ids = _ids(first)
    assert torch.equal(run_with_hooks(first, ids, None, []), run_with_hooks(again, ids, None, []))


@pytest.mark.parametrize("arch", ["llama", "bloom", "gpt2"])
def test_kv_cache_continuation_without_deprecated_keyword(arch, tiny_model):
    """A cached prefix continues through the keyword the HF forward takes (``cache`` where
    transformers deprecates ``past_key_values``): no FutureWarning, the same logits as the
    deprecated keyword gave, and the logits of the whole sequence run at once."""
    import warnings

    model = tiny_model(arch)
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(4, len(model.tokenizer), (2, 12), generator=g)
    mask = torch.ones_like(ids)

    def zero_head(z, hook):  # an ablation hook, so hooks on the cached path are covered too
        z[:, :, 1] = 0
        return z

    hooks = [(hook_name("z", L), zero_head) for L in range(model.geometry.n_layers)]
    model.attention = "eager"  # bitwise against TransformerLens' own call below
    try:
        _continue_from_cache(model, ids, mask, hooks)
    finally:
        model.attention = "auto"
    with warnings.catch_warnings():  # and fused (the default), to float rounding
        warnings.simplefilter("error", FutureWarning)
        _, cache = run_with_hooks(model, ids[:, :8], mask[:, :8], hooks, return_cache=True)
        new = run_with_hooks(model, ids[:, 8:], mask, hooks, past_key_values=cache)
    torch.testing.assert_close(new, run_with_hooks(model, ids, mask, hooks)[:, 8:], rtol=1e-5, atol=1e-5)


def _continue_from_cache(model, ids, mask, hooks):
    import warnings

    from lens_heads.models.hooks import _kv_cache_compat

    with warnings.catch_warnings():
        warnings.simplefilter("error", FutureWarning)
        _, cache = run_with_hooks(model, ids[:, :8], mask[:, :8], hooks, return_cache=True)
        new = run_with_hooks(model, ids[:, 8:], mask, hooks, past_key_values=cache)
    _, cache = run_with_hooks(model, ids[:, :8], mask[:, :8], hooks, return_cache=True)
    with warnings.catch_warnings(), torch.inference_mode(), _kv_cache_compat(model.bridge, True, [False] * model.geometry.n_layers):
        warnings.simplefilter("ignore", FutureWarning)
        old = model.bridge.run_with_hooks(ids[:, 8:], fwd_hooks=hooks, attention_mask=mask, past_key_values=cache)
    assert torch.equal(new, old)
    full = run_with_hooks(model, ids, mask, hooks)
    torch.testing.assert_close(new, full[:, 8:], rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("arch", ["qwen3", "phi3", "gpt_neox"])
def test_an_architecture_outside_the_table_loads_and_fails_only_where_slices_are_needed(arch, tiny_model):
    """Head counts come from the config (checked against the bridge's hooks at load); parameter
    slicing (surgery) says which table entry to add."""
    from lens_heads.surgery.reinit import plan_surgery

    model = tiny_model(arch)
    g = model.geometry
    assert not g.arch.in_table and g.arch.name == arch
    assert (g.n_layers, g.n_heads, g.d_head) == (2, 4, 16) and g.n_kv_heads == (4 if arch == "gpt_neox" else 2)
    with pytest.raises(LensHeadsError, match=f"add an ArchSpec entry for model_type '{arch}'"):
        plan_surgery(g, [(0, 1)])
    with pytest.raises(LensHeadsError, match="ARCHITECTURES in lens_heads/models/geometry.py"):
        g.out_slice(0, 1)


def test_a_geometry_the_bridge_contradicts_is_refused(tiny_model):
    g = tiny_model("llama").geometry
    with pytest.raises(LensHeadsError, match="hook_v has shape"):
        g.check_shapes((1, g.n_heads, 3, 3), (1, 3, g.n_heads, g.d_head), (1, 3, g.n_heads, g.d_head))


@pytest.mark.parametrize("arch", TINY_ARCHS)
def test_lean_norms_return_the_bridge_norms_bit_for_bit(arch, tiny_model, monkeypatch):
    """A forward whose norms have no inner hook skips the values only those hooks read
    (hooks.lean_norms): the logits are the same tensor, bit for bit, as the bridge's full path."""
    from lens_heads.models import hooks

    model = tiny_model(arch)
    ids = _ids(model)
    lean = run_with_hooks(model, ids, None, [])
    norms = hooks._native_norms(model.bridge)
    from transformer_lens.model_bridge.generalized_components.normalization import NormalizationBridge

    native = [m for m in model.bridge.modules()
              if isinstance(m, NormalizationBridge) and m.use_native_layernorm_autograd]
    assert len(norms) == len(native)  # every norm that returns the model's own norm (not GPT-2's, BLOOM's)
    monkeypatch.setattr(hooks, "_native_norms", lambda bridge: [])
    assert torch.equal(lean, run_with_hooks(model, ids, None, []))
    assert all("forward" not in n.__dict__ for n in norms)  # restored after the forward


@pytest.mark.parametrize("arch", TINY_ARCHS)
@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_a_zero_lm_head_bias_is_left_out_bit_for_bit(arch, dtype, tiny_model, tiny_model_dir, monkeypatch):
    """The bridge's zero bias on a bias-free LM head is left out of the product (hooks._unembed):
    the logits are the same tensor, bit for bit, as with it."""
    from lens_heads.models import hooks

    model = tiny_model(arch) if dtype == "float32" else load_model(str(tiny_model_dir(arch)), dtype=dtype)
    ids = _ids(model)
    head = hooks._zero_bias_head(model.bridge)
    if arch == "llama":
        assert head is not None  # the case this is for: TransformerLens gives Llama's head a zero bias
    lean = run_with_hooks(model, ids, None, [])
    monkeypatch.setattr(hooks, "_zero_bias_head", lambda bridge: None)
    assert torch.equal(lean, run_with_hooks(model, ids, None, []))
    assert head is None or "forward" not in head.__dict__  # restored after the forward


def test_a_nonzero_lm_head_bias_is_added(tiny_model):
    model = tiny_model("llama")
    ids = _ids(model)
    bias = model.bridge.unembed.original_component.bias
    before = run_with_hooks(model, ids, None, [])
    try:
        bias.fill_(0.5)
        after = run_with_hooks(model, ids, None, [])
    finally:
        bias.zero_()
    assert (after - before - 0.5).abs().max() <= 1e-5


def test_a_hook_inside_a_norm_still_fires_and_its_edit_propagates(tiny_model):
    model = tiny_model("llama")
    ids = _ids(model)
    seen = []

    def double(x, hook):
        seen.append(hook.name)
        return 2 * x

    base = run_with_hooks(model, ids, None, [])
    with pytest.warns(UserWarning):  # TransformerLens warns that an edit leaves HF's native norm
        edited = run_with_hooks(model, ids, None, [("blocks.0.ln1.hook_normalized", double)])
    assert seen == ["blocks.0.ln1.hook_normalized"]
    assert (edited - base).abs().max() > 1e-3
    scale = []
    run_with_hooks(model, ids, None, [("blocks.1.ln2.hook_scale", lambda x, hook: scale.append(x.shape))])
    assert scale == [(1, ids.shape[1], 1)]


@pytest.mark.parametrize("arch", ["llama", "gemma3", "gpt2"])
def test_logits_at_chosen_rows_equal_the_full_logits_there(arch, tiny_model):
    """logit_rows: the unembedding runs on the (batch row, kept position) pairs alone."""
    from lens_heads.forward.engine import Row, scored_positions

    model = tiny_model(arch)
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(3, 200, (3, 12), generator=g)
    full = run_with_hooks(model, ids, None, [])
    rows = [Row(list(range(12)), 0, [(0, [1, 2, 3])]), Row(list(range(9)), 1, [(1, [1])]),
            Row(list(range(12)), 2, [(2, [1] * 6)])]
    keep, pick = scored_positions(rows, [12, 9, 12])
    assert keep.tolist() == [6, 7, 8, 9, 10, 11] and len(pick) == 3 + 1 + 6
    got = run_with_hooks(model, ids, None, [], logits_to_keep=keep, logit_rows=pick)
    want = torch.cat([full[0, 9:12], full[1, 8:9], full[2, 6:12]])
    assert got.shape == want.shape
    assert (got - want).abs().max() <= 1e-5


def test_lean_norms_in_bfloat16_are_the_bridge_norms_bit_for_bit(tiny_model_dir, monkeypatch):
    from lens_heads.models import hooks

    model = load_model(str(tiny_model_dir("llama")), dtype="bfloat16")
    ids = _ids(model)
    lean = run_with_hooks(model, ids, None, [])
    assert hooks._native_norms(model.bridge)
    monkeypatch.setattr(hooks, "_native_norms", lambda bridge: [])
    assert torch.equal(lean, run_with_hooks(model, ids, None, []))


@pytest.mark.parametrize("arch", TINY_ARCHS)
def test_a_forward_resumed_at_a_layer_is_the_whole_forward(arch, tiny_model):
    """``resumed_at``: blocks from ``layer`` on, fed the residual stream the whole forward has
    there, give the whole forward's logits bit for bit -- with padding, an ablation hook on every
    layer (those before ``layer`` do not fire), past a sliding window (Gemma 3's layer types are
    read by block index) -- and the model is whole again afterwards, also after an error."""
    from lens_heads.models.hooks import _block_list, resumed_at

    model = tiny_model(arch)
    n = model.geometry.n_layers
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(4, len(model.tokenizer), (2, 20), generator=g)
    mask = torch.ones_like(ids)
    mask[1, 15:] = 0  # right padding
    fired: list[int] = []

    def zero_head(z, hook):
        fired.append(int(hook.name.split(".")[1]))
        z[:, :, 1] = 0
        return z

    seen: dict[int, torch.Tensor] = {}

    def keep(z, hook):
        seen[int(hook.name.split(".")[1])] = z.clone()
        return z

    ablate = [(hook_name("z", L), zero_head) for L in range(n)]
    whole = run_with_hooks(model, ids, mask, ablate + [(f"blocks.{L}.hook_resid_pre", keep) for L in range(n)])
    parent, attr = _block_list(model)
    blocks, kinds = getattr(parent, attr), getattr(getattr(parent, "config", None), "layer_types", None)
    for layer in range(n):
        fired.clear()
        with resumed_at(model, layer, seen[layer]) as put:
            resumed = run_with_hooks(model, ids, mask, ablate + put)
        assert fired == list(range(layer, n))
        assert torch.equal(resumed, whole), (arch, layer, (resumed - whole).abs().max())
        assert getattr(parent, attr) is blocks and getattr(getattr(parent, "config", None), "layer_types", None) == kinds
    with pytest.raises(LensHeadsError, match="residual stream of shape"):
        with resumed_at(model, n - 1, seen[n - 1][:1]) as put:
            run_with_hooks(model, ids, mask, put)
    assert getattr(parent, attr) is blocks and len(getattr(parent, attr)) == n
    with pytest.raises(LensHeadsError, match="layers 0"):
        with resumed_at(model, n, seen[0]):
            pass
