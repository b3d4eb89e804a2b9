"""`python -m engine bench --shapes TARGET:DRAFT --random-weights`: time the decode shapes of real
architectures on random weights, and project ms per token for a given acceptance rate.

No checkpoint can be downloaded on the GPU machines, and timing does not need trained weights: a forward
costs the same whatever the numbers are. The draft's one-token step and the target's verify of n tokens
(n = 1..max_gamma + 1) are timed as the engine runs them (static shapes, CUDA graphs on a GPU) over a
context of `--context` tokens. With acceptance rate a, a block of gamma drafts commits on average
(1 - a^(gamma+1)) / (1 - a) tokens, so

    ms/token = (gamma * draft_ms + verify_ms(gamma + 1)) / expected_tokens(a, gamma)

and plain decoding costs verify_ms(1) per token. The model is built layer by layer (fp8 layers are
quantised as they are made), so a 70B target fits beside its draft on one 141 GB H200 in fp8.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import torch
from torch import nn

from engine.config import NAMED_SHAPES, ModelArgs
from engine.graphs import StaticForward
from engine.model import Transformer, rope_tables
from engine.quant import QuantMode, check_device, quantized_linear

ACCEPTANCE_RATES = (0.5, 0.6, 0.7, 0.8, 0.9)
INIT_STD = 0.02


def parse_shapes(text: str) -> tuple[ModelArgs, ModelArgs]:
    names = text.split(":")
    unknown = [n for n in names if n not in NAMED_SHAPES]
    if len(names) != 2 or unknown:
        raise ValueError(f"--shapes wants TARGET:DRAFT from {', '.join(NAMED_SHAPES)}; got {text!r}")
    return NAMED_SHAPES[names[0]], NAMED_SHAPES[names[1]]


def random_model(args: ModelArgs, max_seq_len: int, weights: QuantMode, device: str) -> Transformer:
    """A model of `args`' shapes with random bf16 (weights 'none') or fp8 weights, built layer by layer."""
    target = torch.device(device)
    check_device(weights, target)
    with torch.device("meta"):
        model = Transformer(args, max_seq_len)

    def linear(old: nn.Module) -> nn.Module:
        assert isinstance(old, nn.Linear)
        weight = torch.randn(old.weight.shape, dtype=torch.bfloat16, device=target) * INIT_STD
        bias = None if old.bias is None else torch.zeros(old.bias.shape, dtype=torch.bfloat16, device=target)
        if weights == "none":
            new = nn.Linear(weight.shape[1], weight.shape[0], bias=bias is not None, device="meta")
            new.weight = nn.Parameter(weight, requires_grad=False)
            new.bias = None if bias is None else nn.Parameter(bias, requires_grad=False)
            return new
        return quantized_linear(weights, weight, bias, torch.bfloat16)

    for block in model.blocks:
        for owner, name in (
            (block.attention, "wqkv"),
            (block.attention, "wo"),
            (block.feed_forward, "w13"),
            (block.feed_forward, "w2"),
        ):
            setattr(owner, name, linear(getattr(owner, name)))
        for norm in (block.attention_norm, block.ffn_norm):
            norm.weight = nn.Parameter(torch.ones(args.dim, dtype=torch.bfloat16, device=target), False)
    model.norm.weight = nn.Parameter(torch.ones(args.dim, dtype=torch.bfloat16, device=target), False)
    embedding = torch.randn(args.vocab_size, args.dim, dtype=torch.bfloat16, device=target) * INIT_STD
    model.tok_embeddings.weight = nn.Parameter(embedding, requires_grad=False)
    model.output = linear(nn.Linear(args.dim, args.vocab_size, bias=False, device="meta"))
    cos, sin = rope_tables(args, max_seq_len)
    model.rope_cos, model.rope_sin = cos.to(target), sin.to(target)
    model.quantization = weights
    return model.eval()


def time_ms(run: Callable[[], Any], device: torch.device, repeats: int) -> float:
    """Median milliseconds of `run()` (CUDA events on a GPU, a wall clock elsewhere)."""
    for _ in range(2):
        run()
    samples = []
    for _ in range(repeats):
        if device.type == "cuda":
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            run()
            end.record()
            end.synchronize()
            samples.append(start.elapsed_time(end))
        else:
            began = time.perf_counter()
            run()
            samples.append(1000 * (time.perf_counter() - began))
    return sorted(samples)[len(samples) // 2]


def decode_step_ms(model: Transformer, n_tokens: int, context: int, repeats: int) -> float:
    """One static forward of `n_tokens` after `context` cached tokens (a CUDA graph on a GPU)."""
    cache = model.new_cache()
    device = model.device
    prompt = torch.randint(0, model.args.vocab_size, (context,), device=device)
    with torch.inference_mode():
        model(prompt, torch.arange(context, device=device), cache, context, logits="none")
    step = StaticForward(model, cache, n_tokens, "all" if n_tokens > 1 else "last", device.type == "cuda")
    tokens = torch.randint(0, model.args.vocab_size, (n_tokens,), device=device)
    return time_ms(lambda: step(tokens, context), device, repeats)


def expected_tokens(acceptance: float, gamma: int) -> float:
    return float(gamma + 1) if acceptance >= 1.0 else (1 - acceptance ** (gamma + 1)) / (1 - acceptance)


def project(draft_ms: float, verify_ms: dict[int, float], max_gamma: int) -> list[dict[str, Any]]:
    """Best gamma and ms/token for each acceptance rate, from the measured step costs."""
    rows = []
    for acceptance in ACCEPTANCE_RATES:
        options = {
            gamma: (gamma * draft_ms + verify_ms[gamma + 1]) / expected_tokens(acceptance, gamma)
            for gamma in range(1, max_gamma + 1)
        }
        gamma = min(options, key=lambda g: options[g])
        rows.append(
            {
                "acceptance": acceptance,
                "best_gamma": gamma,
                "ms_per_token": options[gamma],
                "plain_ms_per_token": verify_ms[1],
                "speedup": verify_ms[1] / options[gamma],
                "ms_per_token_by_gamma": options,
            }
        )
    return rows


def run_shapes(
    shapes: str,
    weights: QuantMode,
    device: str,
    max_gamma: int,
    context: int,
    repeats: int,
    log: Callable[[str], None],
) -> dict[str, Any]:
    target_args, draft_args = parse_shapes(shapes)
    max_seq_len = context + max_gamma + 8
    log(f"building random {shapes} ({weights if weights != 'none' else 'bf16'} weights) on {device}")
    draft = random_model(draft_args, max_seq_len, weights, device)
    draft_ms = decode_step_ms(draft, 1, context, repeats)
    del draft
    target = random_model(target_args, max_seq_len, weights, device)
    verify_ms = {n: decode_step_ms(target, n, context, repeats) for n in range(1, max_gamma + 2)}
    log(f"draft step {draft_ms:.2f} ms; verify " + ", ".join(f"{n}: {ms:.2f}" for n, ms in verify_ms.items()))
    return {
        "shapes": shapes,
        "weights": "bf16" if weights == "none" else weights,
        "device": device,
        "gpu": torch.cuda.get_device_name() if torch.device(device).type == "cuda" else None,
        "context": context,
        "draft_ms": draft_ms,
        "verify_ms": verify_ms,
        "target_params_b": target_args.n_params / 1e9,
        "draft_params_b": draft_args.n_params / 1e9,
        "projection": project(draft_ms, verify_ms, max_gamma),
    }
