"""Command-line flags shared by `generate`, `chat` and `bench`: models, speculation length, weight formats."""

from __future__ import annotations

import argparse

from engine.options import BACKENDS, DEFAULT_OPTIONS, DTYPES
from engine.quant import QUANT_MODES


def gamma_arg(value: str) -> int | str:
    """argparse type for --gamma: an integer or 'auto'."""
    if value == "auto":
        return value
    try:
        return int(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected an integer or 'auto', got {value!r}") from None


def add_speculation_flags(parser: argparse.ArgumentParser) -> None:
    """--gamma, --quant and --draft-quant."""
    parser.add_argument(
        "--gamma",
        type=gamma_arg,
        default=DEFAULT_OPTIONS.gamma,
        help="drafted tokens per verification, or 'auto' (adaptive)",
    )
    for flag, model in (("--quant", "target"), ("--draft-quant", "draft")):
        parser.add_argument(
            flag,
            choices=QUANT_MODES,
            default="none",
            help=f"{model} weights: int8/int4 on CPU, fp8 on GPU; gguf-int4: the GGUF's own Q4_K weights "
            "as int4 (CPU, torch backend)",
        )


def add_backend_flag(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--backend",
        choices=BACKENDS,
        default=DEFAULT_OPTIONS.backend,
        help="torch, or ggml: the GGUF files on llama.cpp's CPU kernels (the fastest on a CPU)",
    )


def add_engine_flags(parser: argparse.ArgumentParser) -> None:
    """A flag per `EngineOptions` field, for `EngineOptions.from_attributes(args)` (static shapes follow the
    device); the defaults are the bundled pair's."""
    parser.add_argument(
        "--target", default=DEFAULT_OPTIONS.target, help="bundled name, checkpoint dir or .gguf"
    )
    parser.add_argument(
        "--draft", default=DEFAULT_OPTIONS.draft, help="draft model, or 'none' for plain decoding"
    )
    add_speculation_flags(parser)
    parser.add_argument("--dtype", choices=list(DTYPES), default=DEFAULT_OPTIONS.dtype)
    parser.add_argument("--device", default=DEFAULT_OPTIONS.device)
    add_backend_flag(parser)
    parser.add_argument(
        "--max-seq-len", type=int, default=DEFAULT_OPTIONS.max_seq_len, help="KV cache length in tokens"
    )
