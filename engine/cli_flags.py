"""Command-line flags shared by `generate`, `chat` and `bench`: speculation length and weight formats."""

from __future__ import annotations

import argparse

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
        "--gamma", type=gamma_arg, default=4, help="drafted tokens per verification, or 'auto' (adaptive)"
    )
    for flag, model in (("--quant", "target"), ("--draft-quant", "draft")):
        parser.add_argument(
            flag, choices=QUANT_MODES, default="none", help=f"{model} weights: int8/int4 on CPU, fp8 on GPU"
        )
