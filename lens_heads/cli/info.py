"""``lens-heads info MODEL``: geometry, BOS behaviour and per-layer first-token attention (the
dataset-level AWFT score, docs/methods.md §1, averaged over each layer's heads)."""

from __future__ import annotations

from lens_heads.cli.common import DATA_HELP, DefaultCorpus, add_model_args, check_positive, model_from_args, no_texts
from lens_heads.data import load_texts, tokenize_texts
from lens_heads import scores as scoring


def register(sub) -> None:
    p = sub.add_parser("info", help="describe a model's heads and its first-token attention")
    add_model_args(p)
    p.add_argument("--data", default=DefaultCorpus("c4"), help="corpus for the attention summary: " + DATA_HELP
                   + " (default c4, or c4-sample without a local copy)")
    p.add_argument("--n-inputs", type=int, default=8)
    p.add_argument("--max-len", type=int, default=128)
    p.set_defaults(func=run)


def run(args) -> int:
    check_positive(args, "n_inputs")
    check_positive(args, "max_len", minimum=2)
    texts = load_texts(args.data, n=args.n_inputs)  # before the model: a bad --data fails at once
    if not texts:
        raise no_texts(args.data)
    model = model_from_args(args)
    g = model.geometry
    print(f"model        {model.name}")
    print(f"architecture {g.arch.name}")
    if g.pruned:
        print(f"heads        {g.n_layers} layers, {g.n_units} heads (pruned: {list(g.heads_per_layer)} per layer, "
              f"{list(g.kv_per_layer)} KV heads), d_head {g.d_head}")
    else:
        print(f"heads        {g.n_layers} layers x {g.n_heads} heads ({g.n_kv_heads} KV heads), d_head {g.d_head}")
    print(f"BOS          tokenizer {'prepends' if model.prepends_bos else 'does not prepend'} a BOS token")
    if g.arch.alibi:
        for L in range(g.n_layers) if g.pruned else [None]:
            print(("ALiBi slopes " if L is None else f"ALiBi slopes (layer {L}) ")
                  + " ".join(f"{s:.4g}" for s in g.alibi_slopes(L).tolist()))
    inputs = tokenize_texts(model.tokenizer, texts, args.max_len)
    # mean attention on the first token = the dataset-level AWFT score (one pattern statistic, one place)
    per_layer = scoring.score_heads(model, inputs, "awft", progress=False).mean["awft"]
    print(f"mean attention on the first token, {len(inputs)} {args.data} texts x <= {args.max_len} tokens:")
    for layer, row in enumerate(per_layer):
        value = row[:g.heads_in(layer)].mean().item()  # a pruned layer: its own heads only
        bar = "#" * int(round(value * 40)) if value == value else ""
        print(f"  layer {layer:>2}  {value:.3f}  {bar}")
    return 0
