"""Arguments shared by several subcommands."""

from __future__ import annotations

import argparse


def add_model_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("model", help="zoo name (smollm2-135m, qwen2.5-coder-0.5b, gemma-3-270m), "
                                 ".gguf file, HF model folder or hub id")
    p.add_argument("--dtype", default="float32",
                   help="float32 (default), bfloat16, or auto (bfloat16 where the hardware runs it natively)")
    p.add_argument("--device", default="cpu", help="cpu (default) or cuda")


def add_data_args(p: argparse.ArgumentParser, default: str | None = "c4") -> None:
    p.add_argument("--data", default=default, required=default is None,
                   help="corpus name (c4, c4-train, wikitext2) or a local .txt/.jsonl/.parquet file")
    p.add_argument("--n-inputs", type=int, default=32, help="number of inputs (default 32)")
    p.add_argument("--max-len", type=int, default=256, help="tokens per input (default 256)")
    p.add_argument("--batch-size", type=int, default=8)
